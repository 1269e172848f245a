// main() for GPU test executables: without a usable CUDA device it prints one TESSERA-GPU-SKIP
// line (CTest turns that into "skipped") instead of failing, so CI without a GPU stays green while
// still building every GPU test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("TESSERA-GPU-SKIP: no CUDA device (%s); %s skipped\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices", argv[0]);
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
