// Copies of small int32 index arrays (page tables, indptr arrays) into device buffers, several in
// one launch: a CUDA-graph plan refreshes the fixed buffers its captured runs read at every step,
// and one launch costs the host less than a cudaMemcpyAsync per array. Values that come from host
// memory travel inside the kernel's parameters (IndexCopyParams::host), so nothing is staged and
// the caller's host arrays are free as soon as the launch is enqueued; device sources are read
// when the kernel runs.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

struct IndexCopyTraits {
  static constexpr int kMaxCopies = 4;
  /// Host entries in the parameters: with the copy table the struct stays under the 4 KB every
  /// architecture and driver accepts as kernel parameters.
  static constexpr int kMaxHostEntries = 896;
  static constexpr int kThreadsPerBlock = 256;
};

struct IndexCopyParams {
  int32_t* dst[IndexCopyTraits::kMaxCopies];
  const int32_t* src[IndexCopyTraits::kMaxCopies];  // null: the copy's values are in `host`
  int32_t count[IndexCopyTraits::kMaxCopies];
  int32_t host_offset[IndexCopyTraits::kMaxCopies];  // where a host copy's values start in `host`
  int32_t num_copies;
  int32_t host[IndexCopyTraits::kMaxHostEntries];
};
static_assert(sizeof(IndexCopyParams) <= 4096, "kernel parameters beyond 4 KB need newer drivers");

/// Grid-stride over every copy's entries.
__global__ void __launch_bounds__(IndexCopyTraits::kThreadsPerBlock)
    copy_index_arrays_kernel(const __grid_constant__ IndexCopyParams p) {
  const int32_t stride = static_cast<int32_t>(gridDim.x * blockDim.x);
  const int32_t first = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  for (int c = 0; c < p.num_copies; ++c) {
    int32_t* dst = p.dst[c];
    const int32_t* src = p.src[c];
    const int32_t count = p.count[c];
    if (src == nullptr) {
      const int32_t* host = p.host + p.host_offset[c];
      for (int32_t i = first; i < count; i += stride) dst[i] = host[i];
    } else {
      for (int32_t i = first; i < count; i += stride) dst[i] = src[i];
    }
  }
}

}  // namespace kernels
}  // namespace tessera
