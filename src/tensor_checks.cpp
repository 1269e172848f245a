#include "src/tensor_checks.h"

#include <cstdint>

#include "src/check.h"
#include "tessera/error.h"

namespace tessera {
namespace detail {

void check_vector_aligned(const TensorView& t, const char* name) {
  constexpr int64_t kVecBytes = 16;
  const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
  const int64_t vec = kVecBytes / elem;
  if (reinterpret_cast<uintptr_t>(t.data) % kVecBytes != 0) {
    throw_error(StatusCode::kInvalidArgument, std::string(name) + ".data = " + std::to_string(reinterpret_cast<uintptr_t>(t.data)) +
                  " is not 16-byte aligned");
  }
  if (t.ndim == 0) return;
  if (t.shape[t.ndim - 1] % vec != 0) {
    throw_error(StatusCode::kInvalidArgument, std::string(name) + ".shape[" + std::to_string(t.ndim - 1) + "] = " +
                  std::to_string(t.shape[t.ndim - 1]) + ", expected a multiple of " + std::to_string(vec) +
                  " (16 bytes of " + dtype_name(t.dtype) + ")");
  }
  for (int d = 0; d + 1 < t.ndim; ++d) {
    if (t.shape[d] > 1 && t.strides[d] % vec != 0) {
      throw_error(StatusCode::kInvalidArgument, std::string(name) + ".strides[" + std::to_string(d) + "] = " + std::to_string(t.strides[d]) +
                    ", expected a multiple of " + std::to_string(vec) + " elements (16 bytes)");
    }
  }
}

}  // namespace detail
}  // namespace tessera
