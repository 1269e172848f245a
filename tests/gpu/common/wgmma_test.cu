// GPU tests of the wgmma wrappers (kernels/common/wgmma.cuh) on their own, before any attention
// kernel relies on them: the swizzled operand layouts (WgmmaTile: 128-byte, and 64-byte for head
// dim 96's 192-byte rows), the K-major and MN-major descriptors, A from shared memory and from
// registers (B K-major and MN-major), and the accumulator layout of m64nNk16 for N = 64, 96, 128
// and 256, each against an fp64 product computed here.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "kernels/common/mma.cuh"
#include "kernels/common/smem_layout.cuh"
#include "kernels/common/wgmma.cuh"

namespace {

using namespace tessera::kernels;
using tessera::DType;
using namespace tessera_test;

constexpr int kM = 64;  // one warpgroup's rows

template <int ROWS, int COLS>
using TileOf = WgmmaTile<ROWS, COLS * 2 / 16>;  // COLS 16-bit elements: COLS / 8 chunks per row

/// Copies a [ROWS][COLS] row-major matrix into its WgmmaTile layout (128 threads).
template <int ROWS, int COLS, typename T>
__device__ void store_swizzled(T* tile, const T* rows) {
  constexpr int kRowChunks = COLS * 2 / 16;  // 16-byte chunks per row
  using Tile = TileOf<ROWS, COLS>;
  for (int i = threadIdx.x; i < ROWS * kRowChunks; i += blockDim.x) {
    const int row = i / kRowChunks, chunk = i % kRowChunks;
    *reinterpret_cast<uint4*>(tile + Tile::chunk_offset(row, chunk) * 8) =
        *reinterpret_cast<const uint4*>(rows + row * COLS + chunk * 8);
  }
}

/// Writes the warpgroup's accumulators d[N / 2] to c [64][N] through the m16n8 C layout.
template <int N>
__device__ void store_accumulators(const float (&d)[N / 2], float* c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int n = 0; n < N / 8; ++n)
    for (int i = 0; i < 4; ++i) {
      const int row = 16 * warp + lane / 4 + 8 * (i / 2), col = 8 * n + 2 * (lane % 4) + (i % 2);
      c[row * N + col] = d[4 * n + i];
    }
}

/// c = a * b^T: a [64][K] and b [N][K] row-major (both K-major), A and B from shared memory (the
/// attention tile's Q K^T: K the head dim, N the KV tile).
template <typename T, int N, int K>
__global__ void wgmma_ss_kernel(const T* a, const T* b, float* c) {
  __shared__ __align__(1024) T a_tile[kM * K];  // [64][K], WgmmaTile
  __shared__ __align__(1024) T b_tile[N * K];   // [N][K], WgmmaTile
  store_swizzled<kM, K>(a_tile, a);
  store_swizzled<N, K>(b_tile, b);
  fence_proxy_async_shared();
  __syncthreads();
  float d[N / 2];  // [n8 block][fragment]
  wgmma_fence();
  for (int kd = 0; kd < K / 16; ++kd) {
    wgmma_m64nNk16_ss<T, N>(d, wgmma_k_major_desc<TileOf<kM, K>>(smem_addr(a_tile), 0, kd),
                            wgmma_k_major_desc<TileOf<N, K>>(smem_addr(b_tile), 0, kd), kd > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(d);
  store_accumulators<N>(d, c);
}

/// c = p * v: p [64][K] row-major from registers (the m16n8k16 A fragments), v [K][N] row-major
/// (K rows, N contiguous: MN-major) from shared memory; c starts as c_init (the attention tile's
/// P V: K the KV tile, N the head dim).
template <typename T, int N, int K>
__global__ void wgmma_rs_kernel(const T* p, const T* v, const float* c_init, float* c) {
  __shared__ __align__(1024) T v_tile[K * N];  // [K][N], WgmmaTile
  store_swizzled<K, N>(v_tile, v);
  fence_proxy_async_shared();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float d[N / 2];  // [n8 block][fragment]
  for (int n = 0; n < N / 8; ++n)
    for (int i = 0; i < 4; ++i) d[4 * n + i] = c_init[(16 * warp + g + 8 * (i / 2)) * N + 8 * n + 2 * t + (i % 2)];
  auto at = [&](int row, int col) { return static_cast<float>(p[row * K + col]); };
  const int r0 = 16 * warp + g;
  wgmma_fence_operands(d);
  for (int kk = 0; kk < K / 16; ++kk) {
    const int c0 = 16 * kk + 2 * t;
    const uint32_t a[4] = {pack_pair<T>(at(r0, c0), at(r0, c0 + 1)), pack_pair<T>(at(r0 + 8, c0), at(r0 + 8, c0 + 1)),
                           pack_pair<T>(at(r0, c0 + 8), at(r0, c0 + 9)),
                           pack_pair<T>(at(r0 + 8, c0 + 8), at(r0 + 8, c0 + 9))};
    wgmma_fence();
    wgmma_m64nNk16_rs<T, N>(d, a, wgmma_mn_major_desc<TileOf<K, N>>(smem_addr(v_tile), kk), true);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(d);
  store_accumulators<N>(d, c);
}

/// The same product with p from shared memory (K-major, as a published P tile) instead of registers.
template <typename T, int N, int K>
__global__ void wgmma_ss_mn_b_kernel(const T* p, const T* v, const float* c_init, float* c) {
  __shared__ __align__(1024) T p_tile[kM * K];  // [64][K], WgmmaTile
  __shared__ __align__(1024) T v_tile[K * N];   // [K][N], WgmmaTile
  store_swizzled<kM, K>(p_tile, p);
  store_swizzled<K, N>(v_tile, v);
  fence_proxy_async_shared();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float d[N / 2];  // [n8 block][fragment]
  for (int n = 0; n < N / 8; ++n)
    for (int i = 0; i < 4; ++i) d[4 * n + i] = c_init[(16 * warp + g + 8 * (i / 2)) * N + 8 * n + 2 * t + (i % 2)];
  wgmma_fence_operands(d);
  wgmma_fence();
  for (int kk = 0; kk < K / 16; ++kk) {
    wgmma_m64nNk16_ss_mn_b<T, N>(d, wgmma_k_major_desc<TileOf<kM, K>>(smem_addr(p_tile), 0, kk),
                                 wgmma_mn_major_desc<TileOf<K, N>>(smem_addr(v_tile), kk), true);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(d);
  store_accumulators<N>(d, c);
}

bool device_has_wgmma() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
}

// The shapes the attention tiles use: Q K^T with the head dim (64, 96, 128) as K and the 128-row KV
// tile as N; P V with the KV tile as K and the head dim as N.
struct WgmmaShape {
  DType dtype;
  int n, k;
};

class WgmmaTest : public ::testing::TestWithParam<WgmmaShape> {};

// Products of 16-bit inputs are exact in fp32; 128-term fp32 sums of N(0,1) products stay within
// ~1e-5 of the fp64 sum, far inside this bound, while a wrong layout moves entries by O(1).
constexpr double kMaxAbsError = 1e-3;

/// Largest |reference(i, j) - c[i][j]| over the 64 x n result (infinity if any entry is NaN).
template <typename F>
double max_abs_error(const std::vector<float>& c, int n, F reference) {
  double worst = 0;
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < n; ++j) {
      const double err = std::fabs(reference(i, j) - c[i * n + j]);
      worst = std::isnan(err) ? INFINITY : std::max(worst, err);
    }
  return worst;
}

template <typename T, int N, int K>
void run_ss(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const DType dtype = std::is_same<T, __half>::value ? DType::kF16 : DType::kBF16;
  const std::vector<double> a = round_to(dtype, random_normal(kM * K, rng));
  const std::vector<double> b = round_to(dtype, random_normal(N * K, rng));
  DeviceBuffer da = upload_as(dtype, a), db = upload_as(dtype, b), dc(kM * N * sizeof(float));
  dc.poison();
  wgmma_ss_kernel<T, N, K><<<1, 128>>>(static_cast<const T*>(da.get()), static_cast<const T*>(db.get()),
                                       static_cast<float*>(dc.get()));
  ASSERT_CUDA_OK(cudaGetLastError());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> c(kM * N);
  dc.download(c.data(), c.size() * sizeof(float));
  const double worst = max_abs_error(c, N, [&](int i, int j) {
    double ref = 0;
    for (int k = 0; k < K; ++k) ref += a[i * K + k] * b[j * K + k];
    return ref;
  });
  EXPECT_LE(worst, kMaxAbsError) << "seed " << seed;
}

template <typename T, int N, int K, bool kShared = false>
void run_rs(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const DType dtype = std::is_same<T, __half>::value ? DType::kF16 : DType::kBF16;
  const std::vector<double> p = round_to(dtype, random_normal(kM * K, rng));
  const std::vector<double> v = round_to(dtype, random_normal(K * N, rng));
  std::vector<float> c_init(kM * N);
  for (auto& x : c_init) x = static_cast<float>(std::normal_distribution<double>(0, 1)(rng));
  DeviceBuffer dp = upload_as(dtype, p), dv = upload_as(dtype, v), dc(kM * N * sizeof(float)),
               dinit(kM * N * sizeof(float));
  dinit.upload(c_init.data(), c_init.size() * sizeof(float));
  dc.poison();
  auto kernel = kShared ? wgmma_ss_mn_b_kernel<T, N, K> : wgmma_rs_kernel<T, N, K>;
  kernel<<<1, 128>>>(static_cast<const T*>(dp.get()), static_cast<const T*>(dv.get()),
                     static_cast<const float*>(dinit.get()), static_cast<float*>(dc.get()));
  ASSERT_CUDA_OK(cudaGetLastError());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> c(kM * N);
  dc.download(c.data(), c.size() * sizeof(float));
  const double worst = max_abs_error(c, N, [&](int i, int j) {
    double ref = c_init[i * N + j];
    for (int k = 0; k < K; ++k) ref += p[i * K + k] * v[k * N + j];
    return ref;
  });
  EXPECT_LE(worst, kMaxAbsError) << "seed " << seed;
}

// One instantiation per (dtype, N, K) the parameter list names.
template <template <typename, int, int> class Run>
void dispatch(const WgmmaShape& s, uint64_t seed) {
  const bool f16 = s.dtype == DType::kF16;
  if (s.n == 128 && s.k == 128) f16 ? Run<__half, 128, 128>::go(seed) : Run<__nv_bfloat16, 128, 128>::go(seed);
  else if (s.n == 128 && s.k == 64) f16 ? Run<__half, 128, 64>::go(seed) : Run<__nv_bfloat16, 128, 64>::go(seed);
  else if (s.n == 64 && s.k == 128) f16 ? Run<__half, 64, 128>::go(seed) : Run<__nv_bfloat16, 64, 128>::go(seed);
  else if (s.n == 256 && s.k == 64) f16 ? Run<__half, 256, 64>::go(seed) : Run<__nv_bfloat16, 256, 64>::go(seed);
  else if (s.n == 128 && s.k == 96) f16 ? Run<__half, 128, 96>::go(seed) : Run<__nv_bfloat16, 128, 96>::go(seed);
  else if (s.n == 96 && s.k == 128) f16 ? Run<__half, 96, 128>::go(seed) : Run<__nv_bfloat16, 96, 128>::go(seed);
  else FAIL() << "no instantiation for n " << s.n << ", k " << s.k;
}
template <typename T, int N, int K>
struct RunSs {
  static void go(uint64_t seed) { run_ss<T, N, K>(seed); }
};
template <typename T, int N, int K>
struct RunRs {
  static void go(uint64_t seed) { run_rs<T, N, K>(seed); }
};
template <typename T, int N, int K>
struct RunSsMnB {
  static void go(uint64_t seed) { run_rs<T, N, K, true>(seed); }
};

TEST_P(WgmmaTest, SharedOperandsKMajor) {
  if (!device_has_wgmma()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  dispatch<RunSs>(GetParam(), test_seed());
}

TEST_P(WgmmaTest, RegisterAMnMajorB) {
  if (!device_has_wgmma()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  dispatch<RunRs>(GetParam(), test_seed());
}

// The MLA kernel's value warpgroup: P from shared memory, V MN-major.
TEST_P(WgmmaTest, SharedAMnMajorB) {
  if (!device_has_wgmma()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  dispatch<RunSsMnB>(GetParam(), test_seed());
}

// Q K^T shapes (n = the KV tile, k = head dim) and P V shapes (k = the KV tile, n = head dim):
// head dims 64, 96 and 128 over 128-row KV tiles, 256 over 64-row ones (n 64 x k 128 stands in for
// head_dim 256's Q K^T, whose 64 KB of operands exceed a static shared array). Head dim 96 takes
// the 64-byte swizzle: k 96 (Q K^T, K-major) and n 96 (P V, MN-major).
INSTANTIATE_TEST_SUITE_P(Shapes, WgmmaTest,
                         ::testing::Values(WgmmaShape{DType::kF16, 128, 128}, WgmmaShape{DType::kBF16, 128, 128},
                                           WgmmaShape{DType::kF16, 128, 64}, WgmmaShape{DType::kBF16, 128, 64},
                                           WgmmaShape{DType::kF16, 64, 128}, WgmmaShape{DType::kBF16, 64, 128},
                                           WgmmaShape{DType::kF16, 256, 64}, WgmmaShape{DType::kBF16, 256, 64},
                                           WgmmaShape{DType::kF16, 128, 96}, WgmmaShape{DType::kBF16, 128, 96},
                                           WgmmaShape{DType::kF16, 96, 128}, WgmmaShape{DType::kBF16, 96, 128}),
                         [](const ::testing::TestParamInfo<WgmmaShape>& info) {
                           return std::string(tessera::dtype_name(info.param.dtype)) + "_n" +
                                  std::to_string(info.param.n) + "_k" + std::to_string(info.param.k);
                         });

}  // namespace
