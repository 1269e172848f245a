// Tests of FastDivisor (kernels/common/fast_divisor.cuh): n / d and n % d on the device and on the
// host against C++'s integer division, for every divisor up to 4100, powers of two and their
// neighbours up to 2^31 - 1, and dividends at both ends of [0, 2^31) and around multiples of d.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "kernels/common/fast_divisor.cuh"

namespace {

using tessera::kernels::FastDivisor;

/// Block b divides its `per` dividends (from b * per on) by divisor b.
__global__ void divide_kernel(const FastDivisor* divisors, const int32_t* dividends, int per, int32_t* quotients,
                              int32_t* remainders) {
  const FastDivisor d = divisors[blockIdx.x];
  for (int i = blockIdx.x * per + threadIdx.x; i < (blockIdx.x + 1) * per; i += blockDim.x) {
    const int32_t q = d.div(dividends[i]);
    quotients[i] = q;
    remainders[i] = d.mod(dividends[i], q);
  }
}

std::vector<int64_t> test_divisors() {
  std::vector<int64_t> d;
  for (int64_t x = 1; x <= 4100; ++x) d.push_back(x);
  for (int b = 12; b <= 31; ++b) {
    for (int64_t delta : {-1, 0, 1}) {
      const int64_t x = (int64_t{1} << b) + delta;
      if (x >= 1 && x < (int64_t{1} << 31)) d.push_back(x);
    }
  }
  d.push_back(1000003);
  d.push_back(2147483647);
  return d;
}

std::vector<int32_t> test_dividends(int64_t d, std::mt19937& rng) {
  std::vector<int32_t> n = {0, 1, 2, 2147483646, 2147483647};
  for (int64_t k : {1, 2, 3, 1000, 1 << 20}) {
    for (int64_t delta : {-1, 0, 1}) {
      const int64_t x = k * d + delta;
      if (x >= 0 && x < (int64_t{1} << 31)) n.push_back(static_cast<int32_t>(x));
    }
  }
  std::uniform_int_distribution<int32_t> any(0, 2147483647);
  while (n.size() < 64) n.push_back(any(rng));
  return n;
}

TEST(FastDivisor, HostMatchesIntegerDivision) {
  std::mt19937 rng(7);
  for (int64_t d : test_divisors()) {
    const FastDivisor f = FastDivisor::make(d);
    for (int32_t n : test_dividends(d, rng)) {
      const int32_t q = f.div(n);
      ASSERT_EQ(q, static_cast<int32_t>(n / d)) << n << " / " << d;
      ASSERT_EQ(f.mod(n, q), static_cast<int32_t>(n % d)) << n << " % " << d;
    }
  }
}

TEST(FastDivisor, DeviceMatchesIntegerDivision) {
  std::mt19937 rng(11);
  const std::vector<int64_t> ds = test_divisors();
  std::vector<FastDivisor> divisors;
  std::vector<int32_t> dividends;
  const int per = 64;
  for (int64_t d : ds) {
    divisors.push_back(FastDivisor::make(d));
    const std::vector<int32_t> n = test_dividends(d, rng);
    dividends.insert(dividends.end(), n.begin(), n.begin() + per);
  }
  // One block per divisor, each over its own `per` dividends.
  const int blocks = static_cast<int>(divisors.size());
  const size_t total = dividends.size();
  FastDivisor* d_div = nullptr;
  int32_t *d_n = nullptr, *d_q = nullptr, *d_r = nullptr;
  ASSERT_EQ(cudaMalloc(&d_div, sizeof(FastDivisor) * blocks), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_n, sizeof(int32_t) * total), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_q, sizeof(int32_t) * total), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_r, sizeof(int32_t) * total), cudaSuccess);
  cudaMemcpy(d_div, divisors.data(), sizeof(FastDivisor) * blocks, cudaMemcpyHostToDevice);
  cudaMemcpy(d_n, dividends.data(), sizeof(int32_t) * total, cudaMemcpyHostToDevice);
  cudaMemset(d_q, 0xff, sizeof(int32_t) * total);  // poisoned
  cudaMemset(d_r, 0xff, sizeof(int32_t) * total);
  divide_kernel<<<blocks, 64>>>(d_div, d_n, per, d_q, d_r);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int32_t> q(total), r(total);
  cudaMemcpy(q.data(), d_q, sizeof(int32_t) * total, cudaMemcpyDeviceToHost);
  cudaMemcpy(r.data(), d_r, sizeof(int32_t) * total, cudaMemcpyDeviceToHost);
  for (int b = 0; b < blocks; ++b) {
    const int64_t d = ds[b];
    for (int i = b * per; i < (b + 1) * per; ++i) {
      const int64_t n = dividends[i];
      ASSERT_EQ(q[i], n / d) << n << " / " << d;
      ASSERT_EQ(r[i], n % d) << n << " % " << d;
    }
  }
  cudaFree(d_div);
  cudaFree(d_n);
  cudaFree(d_q);
  cudaFree(d_r);
}

}  // namespace
