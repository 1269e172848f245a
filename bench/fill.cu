// Random normal fill for benchmark inputs: a counter-based hash (splitmix64) gives two uniforms
// per pair of elements, Box-Muller turns them into two independent normal(0, 1) values.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "harness.h"

namespace tessera_bench {
namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float v) { return __nv_fp8_e4m3(v); }
template <>
__device__ __forceinline__ __nv_fp8_e5m2 from_float<__nv_fp8_e5m2>(float v) { return __nv_fp8_e5m2(v); }

template <typename T>
__global__ void fill_normal_kernel(T* __restrict__ out, int64_t n, uint64_t seed) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i >> 1)));
    const float u1 = static_cast<float>((h >> 40) + 1) * (1.0f / 16777216.0f);       // (0, 1]
    const float u2 = static_cast<float>(h & 0xffffffull) * (1.0f / 16777216.0f);      // [0, 1)
    const float r = sqrtf(-2.0f * logf(u1));
    float s, c;
    sincospif(2.0f * u2, &s, &c);
    out[i] = from_float<T>((i & 1) ? r * s : r * c);
  }
}

template <typename T>
void launch(void* data, int64_t count, uint64_t seed, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks_needed = (count + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(blocks_needed < 65536 ? blocks_needed : 65536);
  fill_normal_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(data), count, seed);
  BENCH_CUDA(cudaGetLastError());
}

}  // namespace

void fill_random_normal(void* data, tessera::DType dtype, int64_t count, uint64_t seed,
                        cudaStream_t stream) {
  if (count <= 0) return;
  switch (dtype) {
    case tessera::DType::kF32: launch<float>(data, count, seed, stream); return;
    case tessera::DType::kF16: launch<__half>(data, count, seed, stream); return;
    case tessera::DType::kBF16: launch<__nv_bfloat16>(data, count, seed, stream); return;
    case tessera::DType::kE4M3: launch<__nv_fp8_e4m3>(data, count, seed, stream); return;
    case tessera::DType::kE5M2: launch<__nv_fp8_e5m2>(data, count, seed, stream); return;
    default:
      throw FatalError("fill_random_normal: dtype " + std::to_string(static_cast<int>(dtype)) +
                       " is not f16, bf16, f32, e4m3 or e5m2");
  }
}

namespace {
// Reads every 16-byte word; the sum goes to *sink only when it is a value no input produces, so
// the loads cannot be removed and nothing is written.
__global__ void read_all_kernel(const uint4* __restrict__ data, int64_t words, unsigned* sink) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += step) {
    const uint4 v = data[i];
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}
}  // namespace

void read_all(const void* data, size_t bytes, unsigned* sink, cudaStream_t stream) {
  constexpr int kThreads = 256;
  read_all_kernel<<<1024, kThreads, 0, stream>>>(static_cast<const uint4*>(data),
                                                  static_cast<int64_t>(bytes / sizeof(uint4)), sink);
  BENCH_CUDA(cudaGetLastError());
}

}  // namespace tessera_bench
