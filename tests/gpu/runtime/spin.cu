#include "gpu/runtime/spin.h"

#include <cstdint>

namespace tessera_test {
namespace {

__device__ unsigned long long global_time_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(unsigned long long nanoseconds) {
  const unsigned long long start = global_time_ns();
  while (global_time_ns() - start < nanoseconds) {
  }
}

}  // namespace

void spin_on_stream(cudaStream_t stream, double microseconds) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(microseconds * 1000.0));
}

}  // namespace tessera_test
