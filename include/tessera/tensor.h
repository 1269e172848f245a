// TensorView: a non-owning view of a strided tensor in host or device memory. Tessera never
// allocates or frees user tensors; the caller keeps the memory alive for the duration of a call
// (and, for asynchronous GPU work, until the stream has finished with it).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "tessera/export.h"
#include "tessera/dtype.h"

namespace tessera {

enum class DeviceType : int32_t {
  kCPU = 0,       ///< pageable host memory
  kCUDA = 1,      ///< device memory of GPU `Device::id`
  kCUDAHost = 2,  ///< pinned host memory (readable by the host)
};

struct Device {
  DeviceType type = DeviceType::kCPU;
  int id = 0;
  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int id = 0) { return {DeviceType::kCUDA, id}; }
  bool is_host() const { return type != DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && id == o.id; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

TESSERA_API std::string to_string(const Device& d);

/// A view of `data` with `ndim` dimensions. Shape and strides are in elements (not bytes);
/// strides may be any non-negative values; most kernels require the last stride to be 1.
///
/// Extents: the element count, the size in bytes and the byte extent (from the first element to
/// one past the last, through the strides) must fit in int64. The constructors, from_dlpack and
/// every validator throw tessera::Error naming the tensor otherwise; numel() and nbytes() throw
/// for a hand-built view whose count or size overflows.
///
/// Sharing: a TensorView is a plain value (a pointer and sizes); copies may be used from any
/// thread. It does not own or synchronise the memory it views (docs/threading.md).
struct TESSERA_API TensorView {
  static constexpr int kMaxDims = 6;

  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  Device device;

  TensorView() = default;
  /// Row-major contiguous view. Throws tessera::Error if more than kMaxDims dims, a negative size,
  /// or an element count, byte size or stride beyond int64.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device);
  /// Explicit strides (elements). `shape` and `strides` must have the same length; a negative
  /// stride or an extent beyond int64 (see above) throws tessera::Error.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides, Device device);

  bool defined() const { return data != nullptr || numel() == 0; }
  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  int64_t stride(int dim) const { return strides[dim < 0 ? dim + ndim : dim]; }
  /// Product of the sizes (1 for ndim 0, 0 when any size is 0); throws tessera::Error when it
  /// overflows int64.
  int64_t numel() const;
  /// numel() x the element size; throws tessera::Error when it overflows int64.
  int64_t nbytes() const;
  /// True when the strides are those of a row-major packed tensor (size-1 dims ignored).
  bool is_contiguous() const;
  /// The view with `dim` fixed at `index` (one fewer dimension), e.g. K out of a combined KV tensor.
  TensorView select(int dim, int64_t index) const;
  /// Typed element pointer; no checks beyond the dtype's size.
  template <typename T>
  T* data_as() const { return static_cast<T*>(data); }
  /// "bf16[4, 16, 8, 128] strides [16384, 1024, 128, 1] on cuda:0"
  std::string describe() const;
};

}  // namespace tessera
