// Small pieces shared by the plan/run runtime's GPU tests (runtime_test.cpp, streams_test.cpp,
// checks_test.cpp, block_sparse_paged_test.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
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

/// i32 values in pinned host memory, which the kernels read through its mapping (run()'s index
/// arrays may live there; the runtime checks them on the host at every run()).
struct PinnedI32 {
  int32_t* ptr = nullptr;
  int64_t count = 0;
  explicit PinnedI32(const std::vector<int32_t>& values) : count(static_cast<int64_t>(values.size())) {
    cudaHostAlloc(reinterpret_cast<void**>(&ptr), values.size() * sizeof(int32_t), cudaHostAllocDefault);
    std::memcpy(ptr, values.data(), values.size() * sizeof(int32_t));
  }
  ~PinnedI32() { cudaFreeHost(ptr); }
  PinnedI32(const PinnedI32&) = delete;
  PinnedI32& operator=(const PinnedI32&) = delete;
  tessera::TensorView view() const {
    return tessera::TensorView(ptr, tessera::DType::kI32, {count}, tessera::Device{tessera::DeviceType::kCUDAHost, 0});
  }
};

}  // namespace tessera_test
