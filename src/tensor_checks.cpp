#include "src/tensor_checks.h"

#include <cmath>
#include <string>
#include <utility>
#include <cstdint>

#include "src/check.h"
#include "tessera/error.h"
#include "tessera/validate.h"

namespace tessera {
namespace detail {

bool element_count(const int64_t* shape, int ndim, int64_t* count) {
  int64_t n = 1;
  bool overflow = false;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) {
      *count = 0;
      return true;
    }
    overflow |= __builtin_mul_overflow(n, shape[d], &n);
  }
  *count = n;
  return !overflow;
}

void row_major_strides(const int64_t* shape, int ndim, int64_t* strides, const std::string& name) {
  int64_t running = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = running;
    // The stride of dimension d - 1; the last product (dimension 0's size) is no stride.
    if (d > 0 && __builtin_mul_overflow(running, shape[d], &running)) {
      TESSERA_FAIL(StatusCode::kInvalidArgument)
          << name << ".shape = " << join_dims(shape, ndim) << ": the row-major stride of dimension " << d - 1
          << " overflows int64";
    }
  }
}

void check_extent(const int64_t* shape, const int64_t* strides, int ndim, DType dtype, const std::string& name) {
  int64_t count = 0;
  TESSERA_CHECK_ARG(element_count(shape, ndim, &count))
      << name << ".shape = " << join_dims(shape, ndim) << ": the element count overflows int64";
  if (count == 0) return;
  const int64_t element_bytes = static_cast<int64_t>(dtype_size(dtype));
  // The last element's offset (elements), then one past it in bytes; the byte size separately,
  // as zero strides (broadcast views) make it larger than the extent.
  int64_t last = 0;
  bool overflow = false;
  for (int d = 0; d < ndim; ++d) {
    int64_t step = 0;
    overflow |= __builtin_mul_overflow(shape[d] - 1, strides[d], &step);
    overflow |= __builtin_add_overflow(last, step, &last);
  }
  int64_t extent_bytes = 0, size_bytes = 0;
  overflow |= __builtin_add_overflow(last, int64_t{1}, &last);
  overflow |= __builtin_mul_overflow(last, element_bytes, &extent_bytes);
  overflow |= __builtin_mul_overflow(count, element_bytes, &size_bytes);
  TESSERA_CHECK_ARG(!overflow) << name << " (shape " << join_dims(shape, ndim) << " strides "
                               << join_dims(strides, ndim) << ", " << dtype
                               << ") spans more than 2^63 - 1 bytes, which overflows int64";
}

void check_view(const TensorView& t, const std::string& name) {
  TESSERA_CHECK_ARG(t.ndim >= 0 && t.ndim <= TensorView::kMaxDims)
      << name << ".ndim = " << t.ndim << " is out of range [0, " << TensorView::kMaxDims << "]";
  for (int d = 0; d < t.ndim; ++d) {
    TESSERA_CHECK_ARG(t.shape[d] >= 0) << name << ".shape[" << d << "] = " << t.shape[d] << ", expected >= 0";
    TESSERA_CHECK_ARG(t.strides[d] >= 0) << name << ".strides[" << d << "] = " << t.strides[d] << ", expected >= 0";
  }
  check_extent(t.shape, t.strides, t.ndim, t.dtype, name);
}

void check_rows_tensor(const TensorView& t, const char* name, int ndim, const char* shape) {
  check_view(t, name);
  TESSERA_CHECK_ARG(t.ndim == ndim) << name << ".ndim = " << t.ndim << ", expected " << ndim << " (" << shape
                                    << "); " << name << " is " << t.describe();
  TESSERA_CHECK_ARG(t.defined()) << name << ".data = null, expected a pointer to " << t.numel() << " elements ("
                                 << t.describe() << ")";
  check_last_dim_contiguous(t, name);
}

void check_vector_aligned(const TensorView& t, const char* name) {
  check_view(t, name);
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

void check_kv_scales(const KVScales& scales, const char* name, DType kv_dtype, int64_t num_kv_heads,
                     const Device& device, bool fp8_query) {
  TESSERA_CHECK_ARG(fp8_query || !scales.has_query_scale())
      << name << ".q = " << scales.q << (scales.q_device.defined() ? " with q_device" : "")
      << ": a query scale applies to FP8 attention only (q of dtype e4m3 or e5m2); leave it at 1, no q_device";
  if (!is_fp8(kv_dtype)) {
    TESSERA_CHECK_ARG(scales.is_identity())
        << name << ": scales apply to fp8 (e4m3, e5m2) KV caches only; this cache is " << dtype_name(kv_dtype)
        << " (leave " << name << " at its defaults: k = v = 1, no device tensors)";
    return;
  }
  for (const auto& [factor, which] :
       {std::pair<double, const char*>{scales.k, "k"}, {scales.v, "v"}, {scales.q, "q"}}) {
    TESSERA_CHECK_ARG(std::isfinite(factor) && factor > 0.0 && std::isfinite(static_cast<float>(factor)) &&
                      static_cast<float>(factor) > 0.0f)
        << name << "." << which << " = " << factor << ", expected a finite scale > 0 (representable as f32)";
  }
  for (const auto& [t, which] : {std::pair<const TensorView&, const char*>{scales.k_device, "k_device"},
                                 {scales.v_device, "v_device"}, {scales.q_device, "q_device"}}) {
    if (!t.defined()) continue;
    const std::string tname = std::string(name) + "." + which;
    check_view(t, tname);
    check_dtype(t, tname.c_str(), {DType::kF32});
    check_on_cuda(t, tname.c_str());
    TESSERA_CHECK_ARG(t.device == device)
        << tname << " is on " << to_string(t.device) << ", expected the KV cache's device " << to_string(device);
    TESSERA_CHECK_ARG(t.ndim <= 1) << tname << ".ndim = " << t.ndim << ", expected 0 or 1 ([], [1] or [H_kv])";
    const int64_t n = t.numel();
    TESSERA_CHECK_ARG(n == 1 || n == num_kv_heads)
        << tname << " has " << n << " elements, expected 1 (per tensor) or num_kv_heads = " << num_kv_heads
        << " (per KV head)";
    TESSERA_CHECK_ARG(t.ndim == 0 || t.strides[0] == 1 || n == 1)
        << tname << ".strides[0] = " << t.strides[0] << ", expected 1";
  }
}

}  // namespace detail
}  // namespace tessera
