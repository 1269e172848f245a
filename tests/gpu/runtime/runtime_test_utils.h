// Small pieces shared by the plan/run runtime's GPU tests (runtime_test.cpp, streams_test.cpp,
// checks_test.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "tessera/tensor.h"

namespace tessera_test {

/// A view of a host i32 vector (the plan's index arrays).
inline tessera::TensorView host_i32(const std::vector<int32_t>& v) {
  return tessera::TensorView(const_cast<int32_t*>(v.data()), tessera::DType::kI32, {static_cast<int64_t>(v.size())},
                             tessera::Device::cpu());
}

/// A device workspace for one wrapper.
struct Workspace {
  DeviceBuffer buf;
  tessera::TensorView view;
  explicit Workspace(int64_t bytes) : buf(static_cast<size_t>(bytes)) {
    view = tessera::TensorView(buf.get(), tessera::DType::kU8, {bytes}, tessera::Device::cuda(0));
  }
};

/// A non-blocking stream (no implicit synchronisation with the legacy default stream).
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

}  // namespace tessera_test
