// Element types Tessera understands. This is the only list of dtypes in the project: kernels'
// dispatch tables and validators derive from it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessera/export.h"

namespace tessera {

enum class DType : int32_t {
  kF16 = 0,    ///< IEEE half
  kBF16 = 1,   ///< bfloat16
  kF32 = 2,    ///< IEEE single
  kE4M3 = 3,   ///< fp8 e4m3 (finite-only "fn" flavour, as CUDA's __nv_fp8_e4m3)
  kE5M2 = 4,   ///< fp8 e5m2
  kI32 = 5,    ///< int32 (index arrays)
  kU8 = 6,     ///< uint8 (packed bit masks)
  kI64 = 7,    ///< int64 (position ids, as PyTorch hands them over)
};

/// Size of one element in bytes.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kE4M3:
    case DType::kE5M2:
    case DType::kU8: return 1;
    case DType::kI64: return 8;
  }
  return 0;
}

/// Short lowercase name ("f16", "bf16", ...), used in error messages and benchmark output.
TESSERA_API const char* dtype_name(DType t);

/// True for the 16-bit floating types attention inputs may use (f16, bf16).
constexpr bool is_half_precision(DType t) { return t == DType::kF16 || t == DType::kBF16; }

/// True for the 8-bit floating types a KV cache may be stored in (e4m3, e5m2).
constexpr bool is_fp8(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }

}  // namespace tessera
