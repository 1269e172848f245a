// The one mapping from tessera::DType to the device element types kernels are instantiated for.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "tessera/dtype.h"
#include "tessera/error.h"

namespace tessera {
namespace detail {
/// The DType of a 16-bit element type.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<__half>() { return DType::kF16; }
template <>
constexpr DType dtype_of<__nv_bfloat16>() { return DType::kBF16; }
}  // namespace detail
}  // namespace tessera

/// Runs the statement list with `T` bound to the element type of a floating `dtype` (f16, bf16,
/// f32); any other dtype is an error naming `arg_name`.
#define TESSERA_DISPATCH_FLOAT_DTYPE(dtype, arg_name, T, ...)                                   \
  [&] {                                                                                         \
    switch (dtype) {                                                                            \
      case ::tessera::DType::kF16: { using T = __half; return __VA_ARGS__(); }                  \
      case ::tessera::DType::kBF16: { using T = __nv_bfloat16; return __VA_ARGS__(); }          \
      case ::tessera::DType::kF32: { using T = float; return __VA_ARGS__(); }                   \
      default:                                                                                  \
        throw ::tessera::Error(::tessera::StatusCode::kUnsupported,                             \
                               std::string(arg_name) + ".dtype = " + ::tessera::dtype_name(dtype) + \
                                   ", expected one of {f16, bf16, f32}");                       \
    }                                                                                           \
  }()

/// The same for the 16-bit types attention operands use (f16, bf16).
#define TESSERA_DISPATCH_HALF_DTYPE(dtype, arg_name, T, ...)                                    \
  [&] {                                                                                         \
    switch (dtype) {                                                                            \
      case ::tessera::DType::kF16: { using T = __half; return __VA_ARGS__(); }                  \
      case ::tessera::DType::kBF16: { using T = __nv_bfloat16; return __VA_ARGS__(); }          \
      default:                                                                                  \
        throw ::tessera::Error(::tessera::StatusCode::kUnsupported,                             \
                               std::string(arg_name) + ".dtype = " + ::tessera::dtype_name(dtype) + \
                                   ", expected one of {f16, bf16}");                            \
    }                                                                                           \
  }()

/// Runs the statement list with `KVT` bound to the element type of a K/V dtype under 16-bit
/// operands of type `T`: T itself when kv_dtype is T's dtype, __nv_fp8_e4m3 / __nv_fp8_e5m2 for
/// e4m3 / e5m2; anything else is an error naming `arg_name` (callers have checked the pair).
#define TESSERA_DISPATCH_KV_DTYPE(kv_dtype, T, arg_name, KVT, ...)                               \
  [&] {                                                                                         \
    switch (kv_dtype) {                                                                         \
      case ::tessera::DType::kE4M3: { using KVT = __nv_fp8_e4m3; return __VA_ARGS__(); }        \
      case ::tessera::DType::kE5M2: { using KVT = __nv_fp8_e5m2; return __VA_ARGS__(); }        \
      default:                                                                                  \
        if (kv_dtype == ::tessera::detail::dtype_of<T>()) { using KVT = T; return __VA_ARGS__(); } \
        throw ::tessera::Error(::tessera::StatusCode::kUnsupported,                             \
                               std::string(arg_name) + ".dtype = " + ::tessera::dtype_name(kv_dtype) + \
                                   ", expected q's dtype " + ::tessera::dtype_name(::tessera::detail::dtype_of<T>()) + \
                                   ", e4m3 or e5m2");                                           \
    }                                                                                           \
  }()
