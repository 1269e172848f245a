#include "src/jit/arch.h"

#include <cuda_runtime_api.h>

#include "src/check.h"

namespace tessera {
namespace jit {

std::string arch_for_compute_capability(int major, int minor) {
  TESSERA_CHECK_ARG(major >= 1 && minor >= 0 && minor <= 9)
      << "compute capability " << major << "." << minor << " is not valid";
  const std::string arch = str_cat(major, minor);
  return major == 9 && minor == 0 ? arch + "a" : arch;
}

std::string current_device_arch() {
  int device = 0, major = 0, minor = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device)) << " while choosing the JIT architecture";
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return arch_for_compute_capability(major, minor);
}

}  // namespace jit
}  // namespace tessera
