// TensorView, the small name tables of the public enums, and PagedKV::from_combined.
#include <string>

#include "check.h"
#include "tensor_checks.h"
#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/formats.h"
#include "tessera/tensor.h"
#include "tessera/version.h"

namespace tessera {

namespace {

void check_shape(std::initializer_list<int64_t> shape) {
  TESSERA_CHECK_ARG(shape.size() <= static_cast<size_t>(TensorView::kMaxDims))
      << "TensorView shape has " << shape.size() << " dimensions, expected at most "
      << TensorView::kMaxDims;
  int i = 0;
  for (int64_t s : shape) {
    TESSERA_CHECK_ARG(s >= 0) << "TensorView shape[" << i << "] = " << s << ", expected >= 0";
    ++i;
  }
}

// Negative strides are rejected (tensor.h promises non-negative ones): kernels and planners take a
// view's first element as its lowest address. A flipped view must be made contiguous first.
void check_strides(std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides) {
  TESSERA_CHECK_ARG(strides.size() == shape.size())
      << "TensorView strides has " << strides.size() << " entries, expected " << shape.size()
      << " (one per dimension of shape " << detail::join_dims(shape.begin(), int(shape.size()))
      << ")";
  int i = 0;
  for (int64_t s : strides) {
    TESSERA_CHECK_ARG(s >= 0) << "TensorView strides[" << i << "] = " << s << ", expected >= 0";
    ++i;
  }
}

}  // namespace

TensorView::TensorView(void* data_, DType dtype_, std::initializer_list<int64_t> shape_,
                       Device device_)
    : data(data_), dtype(dtype_), device(device_) {
  check_shape(shape_);
  ndim = static_cast<int>(shape_.size());
  int i = 0;
  for (int64_t s : shape_) shape[i++] = s;
  detail::row_major_strides(shape, ndim, strides, "TensorView");
  detail::check_extent(shape, strides, ndim, dtype, "TensorView");
}

TensorView::TensorView(void* data_, DType dtype_, std::initializer_list<int64_t> shape_,
                       std::initializer_list<int64_t> strides_, Device device_)
    : data(data_), dtype(dtype_), device(device_) {
  check_shape(shape_);
  check_strides(shape_, strides_);
  ndim = static_cast<int>(shape_.size());
  int i = 0;
  for (int64_t s : shape_) shape[i++] = s;
  i = 0;
  for (int64_t s : strides_) strides[i++] = s;
  detail::check_extent(shape, strides, ndim, dtype, "TensorView");
}

int64_t TensorView::numel() const {
  int64_t n = 0;
  // Clamped like describe(): a corrupt hand-built ndim is reported by the validators, by name.
  const int dims = ndim < 0 ? 0 : (ndim > kMaxDims ? kMaxDims : ndim);
  TESSERA_CHECK_ARG(detail::element_count(shape, dims, &n))
      << "TensorView.shape = " << detail::join_dims(shape, dims) << ": the element count overflows int64 ("
      << describe() << ")";
  return n;
}

int64_t TensorView::nbytes() const {
  int64_t bytes = 0;
  TESSERA_CHECK_ARG(!__builtin_mul_overflow(numel(), static_cast<int64_t>(dtype_size(dtype)), &bytes))
      << "TensorView " << describe() << ": its size in bytes overflows int64";
  return bytes;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // no element is ever addressed, as in PyTorch
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;  // the stride of a size-1 dim never moves the pointer
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

TensorView TensorView::select(int dim, int64_t index) const {
  TESSERA_CHECK_ARG(ndim >= 1 && dim >= -ndim && dim < ndim)
      << "select: dim = " << dim << " is out of range [" << -ndim << ", " << ndim << ") for "
      << describe();
  const int d = dim < 0 ? dim + ndim : dim;
  TESSERA_CHECK_ARG(index >= 0 && index < shape[d])
      << "select: index = " << index << " is out of range [0, " << shape[d] << ") for dimension "
      << d << " of " << describe();
  // The offset below is in range for any view whose extent fits in int64.
  detail::check_extent(shape, strides, ndim, dtype, "select: the view");
  TensorView out = *this;
  if (data != nullptr) {
    out.data = static_cast<char*>(data) +
               index * strides[d] * static_cast<int64_t>(dtype_size(dtype));
  }
  for (int i = d; i + 1 < ndim; ++i) {
    out.shape[i] = shape[i + 1];
    out.strides[i] = strides[i + 1];
  }
  out.ndim = ndim - 1;
  out.shape[out.ndim] = 0;
  out.strides[out.ndim] = 0;
  return out;
}

std::string TensorView::describe() const {
  // Clamped so that describing a corrupt hand-built view (in an error message) stays in bounds.
  const int n = ndim < 0 ? 0 : (ndim > kMaxDims ? kMaxDims : ndim);
  return str_cat(dtype, detail::join_dims(shape, n), " strides ", detail::join_dims(strides, n),
                 " on ", device);
}

std::string to_string(const Device& d) {
  switch (d.type) {
    case DeviceType::kCPU: return "cpu";
    case DeviceType::kCUDA: return "cuda:" + std::to_string(d.id);
    case DeviceType::kCUDAHost: return "cuda_host";
  }
  return "unknown_device(" + std::to_string(static_cast<int>(d.type)) + ")";
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF32: return "f32";
    case DType::kE4M3: return "e4m3";
    case DType::kE5M2: return "e5m2";
    case DType::kI32: return "i32";
    case DType::kU8: return "u8";
    case DType::kI64: return "i64";
  }
  return "unknown_dtype";
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kNHD: return "NHD";
    case Layout::kHND: return "HND";
  }
  return "unknown_layout";
}

Status call_catching(void (*fn)(void* context), void* context) noexcept {
  try {
    fn(context);
    return Status::Ok();
  } catch (const Error& e) {
    return e.status();
  } catch (const std::exception& e) {
    return Status{StatusCode::kInternal, e.what()};
  } catch (...) {
    return Status{StatusCode::kInternal, "unknown C++ exception"};
  }
}

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kCudaError: return "cuda_error";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown_status";
}

#define TESSERA_STRINGIFY_IMPL(x) #x
#define TESSERA_STRINGIFY(x) TESSERA_STRINGIFY_IMPL(x)

const char* version_string() {
  return TESSERA_STRINGIFY(TESSERA_VERSION_MAJOR) "." TESSERA_STRINGIFY(
      TESSERA_VERSION_MINOR) "." TESSERA_STRINGIFY(TESSERA_VERSION_PATCH);
}

PagedKV PagedKV::from_combined(const TensorView& kv, Layout layout, const TensorView& indptr,
                               const TensorView& indices, const TensorView& last_page_len) {
  const char* expected_shape = layout == Layout::kHND
                                   ? "HND [num_pages, 2, num_kv_heads, page_size, head_dim]"
                                   : "NHD [num_pages, 2, page_size, num_kv_heads, head_dim]";
  TESSERA_CHECK_ARG(kv.ndim == 5) << "kv.ndim = " << kv.ndim << ", expected 5 (" << expected_shape
                                  << "); kv is " << kv.describe();
  TESSERA_CHECK_ARG(kv.shape[1] == 2)
      << "kv.shape[1] = " << kv.shape[1] << ", expected 2 (index 0 is K, 1 is V; " << expected_shape
      << ")";
  PagedKV out;
  out.k = kv.select(1, 0);
  out.v = kv.select(1, 1);
  out.layout = layout;
  out.indptr = indptr;
  out.indices = indices;
  out.last_page_len = last_page_len;
  return out;
}

}  // namespace tessera
