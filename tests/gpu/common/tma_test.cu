// GPU tests of the TMA copies of KV tiles on their own (kernels/common/tma.cuh with the host's
// descriptors, src/kv_tma.h), before the prefill tiles rely on them: a box of CTA_TILE_KV rows of
// one KV head, copied one swizzled column block at a time, lands in exactly the layout the wgmma
// descriptors read (WgmmaTile: 128-byte swizzle for head dims 64, 128, 256; 64-byte for 96), rows
// past the tensor arrive as zeros, NHD and HND tensors alike; and the host declines (cp.async
// instead) tensors TMA cannot describe.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/smem_layout.cuh"
#include "kernels/common/tma.cuh"
#include "src/kv_tma.h"

namespace {

using namespace tessera::kernels;
using tessera::detail::encode_kv_tma;
using tessera::detail::KVRowTensors;
using tessera::detail::KVTmaBox;

/// Copies the [ROWS][ROW_CHUNKS * 8] box of `map` at (row, head) into shared memory as the prefill
/// producer does (one box per column block, the bytes expected on one mbarrier), then writes the
/// shared tile to `out` as it is.
template <int ROWS, int ROW_CHUNKS>
__global__ void tma_tile_kernel(const __grid_constant__ KVTmaDescriptors maps, int row, int head, uint16_t* out) {
  using Tile = WgmmaTile<ROWS, ROW_CHUNKS>;
  constexpr int kBytes = ROWS * ROW_CHUNKS * 16;
  extern __shared__ __align__(1024) uint16_t tile[];  // [ROWS][ROW_CHUNKS * 8], WgmmaTile; then the barrier
  uint64_t* const full = reinterpret_cast<uint64_t*>(tile + kBytes / 2);
  if (threadIdx.x == 0) mbarrier_init(full, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_expect_tx(full, kBytes);
    for (int blk = 0; blk < ROW_CHUNKS / Tile::kAtomChunks; ++blk) {
      tma_load_3d(smem_addr(tile) + blk * Tile::kBlockBytes, &maps.k, blk * Tile::kAtomChunks * 8, row, head, full);
    }
    mbarrier_arrive(full);
  }
  mbarrier_wait(full, 0);
  for (int i = threadIdx.x; i < kBytes / 2; i += blockDim.x) out[i] = tile[i];
}

bool device_has_tma() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major >= 9;
}

/// Device memory of `count` 16-bit elements.
struct Elems16 {
  tessera_test::DeviceBuffer buffer;
  explicit Elems16(size_t count) : buffer(count * 2) {}
  uint16_t* data() const { return static_cast<uint16_t*>(buffer.get()); }
};

struct TmaCase {
  int head_dim;
  int rows;       // the tensor's rows
  int heads;
  bool hnd;       // [heads, rows, D] instead of [rows, heads, D]
  int box_rows;   // CTA_TILE_KV
  int first_row;  // the box's first row (past rows - box_rows: zero-filled rows)
  int head;
};

template <int ROWS, int ROW_CHUNKS>
void run_case(const TmaCase& c) {
  using Tile = WgmmaTile<ROWS, ROW_CHUNKS>;
  const int d = c.head_dim;
  std::vector<uint16_t> host(static_cast<size_t>(c.rows) * c.heads * d);
  std::mt19937 rng(1234 + d + c.rows);
  for (auto& x : host) x = static_cast<uint16_t>(rng() & 0xFFFF);
  const int64_t row_stride = c.hnd ? d : int64_t{c.heads} * d, head_stride = c.hnd ? int64_t{c.rows} * d : d;
  Elems16 k(host.size());
  k.buffer.upload(host.data(), host.size() * 2);
  KVTmaDescriptors maps{};
  const KVRowTensors kv{k.data(), k.data(), c.rows, c.heads, row_stride, head_stride, row_stride, head_stride};
  const KVTmaBox box{ROWS, d, Tile::kAtomChunks * 8};
  encode_kv_tma(maps, kv, box, box);
  ASSERT_EQ(maps.enabled, 1) << "aligned tensors take TMA";
  constexpr int kElems = ROWS * ROW_CHUNKS * 8;
  Elems16 out(kElems);
  out.buffer.poison();
  const int smem = kElems * 2 + 8;
  ASSERT_EQ(cudaFuncSetAttribute(tma_tile_kernel<ROWS, ROW_CHUNKS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
            cudaSuccess);
  tma_tile_kernel<ROWS, ROW_CHUNKS><<<1, 128, smem>>>(maps, c.first_row, c.head, out.data());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> got(kElems);
  out.buffer.download(got.data(), got.size() * 2);
  int mismatches = 0;
  for (int r = 0; r < ROWS; ++r) {
    const int src_row = c.first_row + r;
    for (int ch = 0; ch < ROW_CHUNKS; ++ch) {
      for (int e = 0; e < 8; ++e) {
        const uint16_t want = src_row < c.rows ? host[src_row * row_stride + c.head * head_stride + ch * 8 + e] : 0;
        const uint16_t have = got[Tile::chunk_offset(r, ch) * 8 + e];
        if (have != want && ++mismatches <= 5) {
          ADD_FAILURE() << "row " << r << " chunk " << ch << " element " << e << ": " << have << ", expected " << want;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(TmaTile, BoxesLandInTheWgmmaLayout) {
  if (!device_has_tma()) GTEST_SKIP() << "TMA needs an sm_90 device";
  for (const bool hnd : {false, true}) {
    SCOPED_TRACE(hnd ? "HND" : "NHD");
    run_case<128, 8>({64, 300, 3, hnd, 128, 37, 2});    // head dim 64: one 128-byte block
    run_case<128, 12>({96, 300, 2, hnd, 128, 5, 1});    // 96: three 64-byte blocks
    run_case<128, 16>({128, 257, 4, hnd, 128, 129, 3});  // 128: two blocks
    run_case<64, 32>({256, 70, 1, hnd, 64, 0, 0});       // 256: four blocks, 64-row tiles
    run_case<128, 16>({128, 140, 2, hnd, 128, 100, 1});  // rows 100 .. 227 of 140: the rest zero
  }
}

TEST(TmaTile, HostDeclinesWhatTmaCannotDescribe) {
  if (!device_has_tma()) GTEST_SKIP() << "TMA needs an sm_90 device";
  Elems16 k(64 * 4 * 128 + 64);
  const KVTmaBox box{128, 128, 64};
  const auto enabled = [&](const void* base, int64_t row_stride) {
    KVTmaDescriptors maps{};
    maps.enabled = 7;
    encode_kv_tma(maps, KVRowTensors{base, base, 64, 4, row_stride, 128, row_stride, 128}, box, box);
    return maps.enabled;
  };
  EXPECT_EQ(enabled(k.data(), 512), 1);
  EXPECT_EQ(enabled(k.data() + 4, 512), 0) << "a base 8 bytes past 16-byte alignment";
  EXPECT_EQ(enabled(k.data(), 516), 0) << "rows 1032 bytes apart";
  EXPECT_EQ(enabled(k.data(), 0), 0) << "every row at one address";
}

}  // namespace
