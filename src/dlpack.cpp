// DLPack interop. Written against DLPack 0.6 (Debian's libdlpack-dev), which predates the fp8
// type codes, so those are spelled out below by value; the layout of DLTensor is the same in 1.x.
#include "tessera/dlpack.h"

#include <cstdint>
#include <string>

#include "check.h"
#include "tensor_checks.h"

namespace tessera {
namespace {

// DLPack >= 1.0's kDLFloat8_e4m3fn and kDLFloat8_e5m2 (what PyTorch exports for
// torch.float8_e4m3fn and torch.float8_e5m2). Not named after the enumerators so that building
// against a newer dlpack.h, which defines them, does not shadow anything.
constexpr uint8_t kDLPackCodeFloat8E4M3FN = 10;
constexpr uint8_t kDLPackCodeFloat8E5M2 = 12;

struct DTypeMapping {
  DType dtype;
  uint8_t code;
  uint8_t bits;
};

constexpr DTypeMapping kDTypeMappings[] = {
    {DType::kF16, kDLFloat, 16},
    {DType::kBF16, kDLBfloat, 16},
    {DType::kF32, kDLFloat, 32},
    {DType::kE4M3, kDLPackCodeFloat8E4M3FN, 8},
    {DType::kE5M2, kDLPackCodeFloat8E5M2, 8},
    {DType::kI32, kDLInt, 32},
    {DType::kU8, kDLUInt, 8},
    {DType::kI64, kDLInt, 64},
};

const char* dl_device_type_name(int type) {
  switch (type) {
    case 1: return "kDLCPU";
    case 2: return "kDLCUDA";
    case 3: return "kDLCUDAHost";
    case 4: return "kDLOpenCL";
    case 7: return "kDLVulkan";
    case 8: return "kDLMetal";
    case 9: return "kDLVPI";
    case 10: return "kDLROCM";
    case 11: return "kDLROCMHost";
    case 12: return "kDLExtDev";
    case 13: return "kDLCUDAManaged";
    case 14: return "kDLOneAPI";
    case 15: return "kDLWebGPU";
    case 16: return "kDLHexagon";
    case 17: return "kDLMAIA";
  }
  return "unknown";
}

std::string supported_dtypes() {
  std::string s;
  for (const DTypeMapping& m : kDTypeMappings) {
    if (!s.empty()) s += ", ";
    s += str_cat(dtype_name(m.dtype), " (code ", int(m.code), ", bits ", int(m.bits), ")");
  }
  return s;
}

DType dtype_from_dlpack(const DLDataType& t) {
  TESSERA_CHECK_ARG(t.lanes == 1) << "DLTensor.dtype.lanes = " << t.lanes
                                  << ", expected 1 (vector types are not supported)";
  for (const DTypeMapping& m : kDTypeMappings) {
    if (m.code == t.code && m.bits == t.bits) return m.dtype;
  }
  TESSERA_FAIL(StatusCode::kInvalidArgument)
      << "DLTensor.dtype = (code " << int(t.code) << ", bits " << int(t.bits)
      << ") is not supported, expected one of " << supported_dtypes();
}

Device device_from_dlpack(const DLDevice& d) {
  switch (static_cast<int>(d.device_type)) {
    case kDLCPU: return {DeviceType::kCPU, d.device_id};
    case kDLCUDA: return {DeviceType::kCUDA, d.device_id};
    case kDLCUDAHost: return {DeviceType::kCUDAHost, d.device_id};
  }
  TESSERA_FAIL(StatusCode::kInvalidArgument)
      << "DLTensor.device.device_type = " << static_cast<int>(d.device_type) << " ("
      << dl_device_type_name(static_cast<int>(d.device_type))
      << ") is not supported, expected kDLCPU (1), kDLCUDA (2) or kDLCUDAHost (3)";
}

}  // namespace

TensorView from_dlpack(const DLTensor& t) {
  TensorView view;
  view.dtype = dtype_from_dlpack(t.dtype);
  view.device = device_from_dlpack(t.device);
  TESSERA_CHECK_ARG(t.ndim >= 0 && t.ndim <= TensorView::kMaxDims)
      << "DLTensor.ndim = " << t.ndim << " is out of range [0, " << TensorView::kMaxDims << "]";
  TESSERA_CHECK_ARG(t.ndim == 0 || t.shape != nullptr)
      << "DLTensor.shape = null, expected " << t.ndim << " sizes";
  view.ndim = t.ndim;
  for (int d = 0; d < t.ndim; ++d) {
    TESSERA_CHECK_ARG(t.shape[d] >= 0)
        << "DLTensor.shape[" << d << "] = " << t.shape[d] << ", expected >= 0";
    view.shape[d] = t.shape[d];
  }
  if (t.strides == nullptr) {
    // DLPack: null strides mean compact row-major.
    detail::row_major_strides(view.shape, view.ndim, view.strides, "DLTensor");
  } else {
    for (int d = 0; d < t.ndim; ++d) {
      TESSERA_CHECK_ARG(t.strides[d] >= 0)
          << "DLTensor.strides[" << d << "] = " << t.strides[d]
          << ", expected >= 0 (negative strides are not supported)";
      view.strides[d] = t.strides[d];
    }
  }
  // Before the view is used for anything: kernels compute offsets and sizes in int64.
  detail::check_extent(view.shape, view.strides, view.ndim, view.dtype, "DLTensor");
  const uint64_t element_size = dtype_size(view.dtype);
  TESSERA_CHECK_ARG(t.byte_offset % element_size == 0)
      << "DLTensor.byte_offset = " << t.byte_offset << ", expected a multiple of "
      << element_size << " (the size of " << view.dtype << ")";
  // Folded in so that every consumer sees the first element at `data`.
  view.data = t.byte_offset == 0
                  ? t.data
                  : reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(t.data) + t.byte_offset);
  return view;
}

DLTensor to_dlpack(TensorView& view) {
  TESSERA_CHECK_ARG(view.ndim >= 0 && view.ndim <= TensorView::kMaxDims)
      << "view.ndim = " << view.ndim << " is out of range [0, " << TensorView::kMaxDims << "]";
  DLTensor t{};
  t.data = view.data;
  switch (view.device.type) {
    case DeviceType::kCPU: t.device.device_type = kDLCPU; break;
    case DeviceType::kCUDA: t.device.device_type = kDLCUDA; break;
    case DeviceType::kCUDAHost: t.device.device_type = kDLCUDAHost; break;
    default:
      TESSERA_FAIL(StatusCode::kInvalidArgument)
          << "view.device = " << view.device << ", expected cpu, cuda:N or cuda_host";
  }
  t.device.device_id = view.device.id;
  t.ndim = view.ndim;
  bool mapped = false;
  for (const DTypeMapping& m : kDTypeMappings) {
    if (m.dtype == view.dtype) {
      t.dtype.code = m.code;
      t.dtype.bits = m.bits;
      t.dtype.lanes = 1;
      mapped = true;
    }
  }
  TESSERA_CHECK_ARG(mapped) << "view.dtype = " << static_cast<int>(view.dtype)
                            << ", expected a tessera::DType";
  t.shape = view.shape;
  t.strides = view.strides;
  t.byte_offset = 0;
  return t;
}

}  // namespace tessera
