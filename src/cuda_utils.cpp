#include "src/cuda_utils.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "tessera/device.h"

namespace tessera {
namespace detail {

namespace {
/// `attr` of the current device, read once per (device, attribute): launch paths ask per call.
int cached_device_attribute(cudaDeviceAttr attr) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> values;  // (device, attribute) -> value
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  const std::pair<int, int> key{device, static_cast<int>(attr)};
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = values.find(key);
  if (it != values.end()) return it->second;
  int value = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  values.emplace(key, value);
  return value;
}
}  // namespace

ErrorBuilder cuda_error(int status, const char* expr) {
  const auto error = static_cast<cudaError_t>(status);
  ErrorBuilder builder(StatusCode::kCudaError);
  switch (error) {
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary: {  // the toolkit's stub libcuda.so was loaded in place of a driver
      int runtime = 0;
      if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = CUDART_VERSION;
      builder << "no CUDA driver: " << expr << " failed (" << cudaGetErrorName(error) << ")";
      builder.set_suffix(str_cat(
          ". Tessera runs its kernels on an NVIDIA GPU, and this process found no NVIDIA driver or one older "
          "than the CUDA ",
          runtime / 1000, ".", (runtime % 1000) / 10,
          " runtime it uses: install or update the NVIDIA driver (nvidia-smi prints the CUDA version the "
          "driver supports)"));
      return builder;
    }
    case cudaErrorNoDevice:
      builder << "no CUDA device: " << expr << " failed (" << cudaGetErrorName(error) << ")";
      builder.set_suffix(
          ". The NVIDIA driver is installed but this process sees no GPU: run on a machine with an NVIDIA GPU "
          "(sm_80 or newer), and check nvidia-smi and CUDA_VISIBLE_DEVICES");
      return builder;
    default:
      builder << expr << " failed: " << cudaGetErrorName(error) << " (" << cudaGetErrorString(error) << ")";
      return builder;
  }
}

int current_device_sm_count() { return cached_device_attribute(cudaDevAttrMultiProcessorCount); }

bool current_device_has_dependent_launch() {
  return cached_device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
}

bool current_device_has_wgmma() {
#ifdef TESSERA_HAS_SM90A_KERNELS
  return cached_device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
         cached_device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
#else
  return false;
#endif
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

std::string cuda_unavailable_reason() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  if (status == cudaSuccess && count > 0) return "";
  if (status == cudaSuccess) status = cudaErrorNoDevice;  // runtimes that report 0 devices as success
  return detail::cuda_error(status, "cudaGetDeviceCount(&count)").message();
}

}  // namespace tessera
