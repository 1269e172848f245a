#include "src/cuda_utils.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

namespace tessera {
namespace detail {

int current_device_sm_count() {
  static std::mutex mutex;
  static std::vector<int> sm_counts;  // by device ordinal; 0 = not read yet
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(sm_counts.size()) <= device) sm_counts.resize(device + 1, 0);
  if (sm_counts[device] == 0) {
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_counts[device], cudaDevAttrMultiProcessorCount, device));
  }
  return sm_counts[device];
}

bool current_device_has_dependent_launch() {
  static std::mutex mutex;
  static std::vector<int> majors;  // compute capability major by device ordinal; 0 = not read yet
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(majors.size()) <= device) majors.resize(device + 1, 0);
  if (majors[device] == 0) {
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&majors[device], cudaDevAttrComputeCapabilityMajor, device));
  }
  return majors[device] >= 9;
}

void ensure_dynamic_smem(const void* kernel, int bytes) {
  constexpr int kDefaultLimit = 48 * 1024;
  if (bytes <= kDefaultLimit) return;
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> configured;  // (kernel, device)
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (configured.count({kernel, device}) != 0) return;
  TESSERA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  configured.insert({kernel, device});
}

int grid_stride_blocks(long long total_threads, int threads_per_block) {
  // 2048 resident threads per SM on sm_80/sm_90; four waves' worth lets the grid-stride loop
  // absorb tail effects while keeping launch cost flat for huge inputs.
  const long long max_blocks = 4LL * current_device_sm_count() * (2048 / threads_per_block);
  const long long needed = (total_threads + threads_per_block - 1) / threads_per_block;
  return static_cast<int>(std::max(1LL, std::min(needed, max_blocks)));
}

}  // namespace detail
}  // namespace tessera
