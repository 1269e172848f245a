// GPU tests of the TMA copies of KV tiles on their own (kernels/common/tma.cuh with the host's
// descriptors, src/kv_tma.h), before the prefill tiles rely on them: a box of CTA_TILE_KV rows of
// one KV head of one block (ragged KV: one block of all rows; paged KV: a page), copied one
// swizzled column block at a time, lands in exactly the layout the wgmma descriptors read
// (WgmmaTile: 128-byte swizzle for head dims 64, 128, 256; 64-byte for 96), rows past the block
// and pages past the tensor arrive as zeros, NHD and HND tensors alike; a tile of pages smaller
// than a tile, one box a page issued by several threads on one mbarrier, lands the same way; and
// the host declines (cp.async instead) tensors TMA cannot describe and pages that do not fill a
// tile evenly or are under 16 slots. Query tiles
// likewise, in their packed order (query-major, the KV head's group of query heads inside), and
// output rows stored in that order.
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
#include "kernels/common/wgmma.cuh"
#include "src/kv_tma.h"

namespace {

using namespace tessera::kernels;
using tessera::detail::encode_kv_tma;
using tessera::detail::encode_query_rows_tma;
using tessera::detail::KVRowTensors;
using tessera::detail::KVTmaBox;
using tessera::detail::QueryRows;

/// Copies the [ROWS][ROW_CHUNKS * 8] box of `map` at (column block, c1, c2, c3) into shared memory
/// as the prefill producer does (one box per column block, the bytes expected on one mbarrier),
/// then writes the shared tile to `out` as it is.
template <int ROWS, int ROW_CHUNKS>
__global__ void tma_tile_kernel(const __grid_constant__ TmaDescriptor map, int c1, int c2, int c3, uint16_t* out) {
  using Tile = WgmmaTile<ROWS, ROW_CHUNKS>;
  constexpr int kBytes = ROWS * ROW_CHUNKS * 16;
  extern __shared__ __align__(1024) uint16_t tile[];  // [ROWS][ROW_CHUNKS * 8], WgmmaTile; then the barrier
  uint64_t* const full = reinterpret_cast<uint64_t*>(tile + kBytes / 2);
  if (threadIdx.x == 0) mbarrier_init(full, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_expect_tx(full, kBytes);
    for (int blk = 0; blk < ROW_CHUNKS / Tile::kAtomChunks; ++blk) {
      tma_load_4d(smem_addr(tile) + blk * Tile::kBlockBytes, &map, blk * Tile::kAtomChunks * 8, c1, c2, c3, full);
    }
    mbarrier_arrive(full);
  }
  mbarrier_wait(full, 0);
  for (int i = threadIdx.x; i < kBytes / 2; i += blockDim.x) out[i] = tile[i];
}

/// Copies a [ROWS][ROW_CHUNKS * 8] tile made of ROWS / BOX_ROWS pages of BOX_ROWS slots (page ids
/// `pages`, KV head `head`) as the prefill producer does for pages smaller than a tile: the thread
/// of each page's first row expects its page's bytes on the one mbarrier, issues a box per column
/// block at its rows of each block, and arrives; then writes the shared tile to `out` as it is.
template <int ROWS, int ROW_CHUNKS, int BOX_ROWS>
__global__ void tma_paged_tile_kernel(const __grid_constant__ TmaDescriptor map, int head, const int* pages,
                                      uint16_t* out) {
  using Tile = WgmmaTile<ROWS, ROW_CHUNKS>;
  constexpr int kBytes = ROWS * ROW_CHUNKS * 16, kPages = ROWS / BOX_ROWS;
  extern __shared__ __align__(1024) uint16_t tile[];  // [ROWS][ROW_CHUNKS * 8], WgmmaTile; then the barrier
  uint64_t* const full = reinterpret_cast<uint64_t*>(tile + kBytes / 2);
  if (threadIdx.x == 0) mbarrier_init(full, kPages);
  __syncthreads();
  const int first = static_cast<int>(threadIdx.x) * BOX_ROWS;  // this thread's page's first row in the tile
  if (first < ROWS) {
    mbarrier_expect_tx(full, kBytes / kPages);
    for (int blk = 0; blk < ROW_CHUNKS / Tile::kAtomChunks; ++blk) {
      tma_load_4d(smem_addr(tile) + blk * Tile::kBlockBytes + first * Tile::kRowBytes, &map,
                  blk * Tile::kAtomChunks * 8, 0, head, pages[threadIdx.x], full);
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

/// Fills `host` with random 16-bit patterns (seeded) and returns a device copy of it.
Elems16 random_device_copy(std::vector<uint16_t>& host, uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto& x : host) x = static_cast<uint16_t>(rng() & 0xFFFF);
  Elems16 dev(host.size());
  dev.buffer.upload(host.data(), host.size() * 2);
  return dev;
}

/// The shared tile tma_tile_kernel copies with `map` at (c1, c2, c3), as it lands.
template <int ROWS, int ROW_CHUNKS>
std::vector<uint16_t> load_box(const TmaDescriptor& map, int c1, int c2, int c3) {
  constexpr int kElems = ROWS * ROW_CHUNKS * 8;
  Elems16 out(kElems);
  out.buffer.poison();
  const int smem = kElems * 2 + 8;
  EXPECT_EQ(cudaFuncSetAttribute(tma_tile_kernel<ROWS, ROW_CHUNKS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
            cudaSuccess);
  tma_tile_kernel<ROWS, ROW_CHUNKS><<<1, 128, smem>>>(map, c1, c2, c3, out.data());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> got(kElems);
  out.buffer.download(got.data(), got.size() * 2);
  return got;
}

/// Expects element (row r, column col) of the [ROWS][ROW_CHUNKS * 8] tile, found in `got` where
/// the WgmmaTile layout puts it, to equal want(r, col) (0: a zero-filled row).
template <int ROWS, int ROW_CHUNKS, typename Want>
void expect_tile(const std::vector<uint16_t>& got, Want&& want) {
  using Tile = WgmmaTile<ROWS, ROW_CHUNKS>;
  int mismatches = 0;
  for (int r = 0; r < ROWS; ++r) {
    for (int col = 0; col < ROW_CHUNKS * 8; ++col) {
      const uint16_t have = got[Tile::chunk_offset(r, col / 8) * 8 + col % 8], expected = want(r, col);
      if (have != expected && ++mismatches <= 5) {
        ADD_FAILURE() << "row " << r << " column " << col << ": " << have << ", expected " << expected;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

struct TmaCase {
  int head_dim;
  int rows;       // rows of a block (ragged: the tensor's; paged: a page's slots)
  int heads;
  int blocks;     // 1 (ragged) or pages
  bool hnd;       // a block is [heads, rows, D] instead of [rows, heads, D]
  int first_row;  // the box's first row in its block (past rows - CTA_TILE_KV: zero-filled rows)
  int head;
  int block;      // the box's block (>= blocks: every row zero-filled)
};

template <int ROWS, int ROW_CHUNKS>
void run_case(const TmaCase& c) {
  using Tile = WgmmaTile<ROWS, ROW_CHUNKS>;
  const int d = c.head_dim;
  const int64_t block_elems = int64_t{c.rows} * c.heads * d;
  std::vector<uint16_t> host(static_cast<size_t>(block_elems * c.blocks));
  const int64_t row_stride = c.hnd ? d : int64_t{c.heads} * d, head_stride = c.hnd ? int64_t{c.rows} * d : d;
  const Elems16 k = random_device_copy(host, 1234 + d + c.rows);
  KVTmaDescriptors maps{};
  const KVRowTensors kv{k.data(),    k.data(),    c.rows,     c.heads,     c.blocks,    row_stride,
                        head_stride, block_elems, row_stride, head_stride, block_elems, /*paged=*/c.blocks > 1};
  const KVTmaBox box{ROWS, d, Tile::kAtomChunks * 8};
  encode_kv_tma(maps, kv, box, box);
  ASSERT_EQ(maps.enabled, 1) << "aligned tensors take TMA";
  const std::vector<uint16_t> got = load_box<ROWS, ROW_CHUNKS>(maps.k, c.first_row, c.head, c.block);
  expect_tile<ROWS, ROW_CHUNKS>(got, [&](int r, int col) -> uint16_t {
    const int src_row = c.first_row + r;
    const bool exists = src_row < c.rows && c.block < c.blocks;
    return exists ? host[c.block * block_elems + src_row * row_stride + c.head * head_stride + col] : 0;
  });
}

TEST(TmaTile, BoxesLandInTheWgmmaLayout) {
  if (!device_has_tma()) GTEST_SKIP() << "TMA needs an sm_90 device";
  for (const bool hnd : {false, true}) {
    SCOPED_TRACE(hnd ? "HND" : "NHD");
    // One block of rows (ragged and dense KV)
    run_case<128, 8>({64, 300, 3, 1, hnd, 37, 2, 0});     // head dim 64: one 128-byte column block
    run_case<128, 12>({96, 300, 2, 1, hnd, 5, 1, 0});     // 96: three 64-byte blocks
    run_case<128, 16>({128, 257, 4, 1, hnd, 129, 3, 0});  // 128: two blocks
    run_case<64, 32>({256, 70, 1, 1, hnd, 0, 0, 0});      // 256: four blocks, 64-row tiles
    run_case<128, 16>({128, 140, 2, 1, hnd, 100, 1, 0});  // rows 100 .. 227 of 140: the rest zero
    // Pages (paged KV whose pages hold whole tiles)
    run_case<128, 16>({128, 256, 2, 5, hnd, 128, 1, 3});  // the second tile of page 3 of 5
    run_case<64, 32>({256, 64, 3, 4, hnd, 0, 2, 1});      // 64-slot pages of head dim 256
    run_case<128, 8>({64, 128, 1, 3, hnd, 0, 0, 7});      // page 7 of 3: zeros
  }
}

/// A query tile in packed order (row r: query first_query + r / group, head kv_head * group + r %
/// group) from q [rows, Hkv * group, D], or [Hkv * group, rows, D] with `hnd`.
template <int ROWS, int ROW_CHUNKS>
void run_query_case(int group, int num_rows, int kv_heads, bool hnd, int first_query, int kv_head) {
  using Tile = WgmmaTile<ROWS, ROW_CHUNKS>;
  const int d = ROW_CHUNKS * 8, heads = kv_heads * group;
  std::vector<uint16_t> host(static_cast<size_t>(num_rows) * heads * d);
  const int64_t row_stride = hnd ? d : int64_t{heads} * d, head_stride = hnd ? int64_t{num_rows} * d : d;
  const Elems16 q = random_device_copy(host, 99 + group + d);
  QueryRowsTma map{};
  encode_query_rows_tma(map, QueryRows{q.data(), num_rows, group, kv_heads, row_stride, head_stride}, ROWS, d,
                        Tile::kAtomChunks * 8, "q");
  ASSERT_EQ(map.enabled, 1);
  const std::vector<uint16_t> got = load_box<ROWS, ROW_CHUNKS>(map.map, 0, first_query, kv_head);
  expect_tile<ROWS, ROW_CHUNKS>(got, [&](int r, int col) -> uint16_t {
    const int query = first_query + r / group, head = kv_head * group + r % group;
    return query < num_rows ? host[query * row_stride + head * head_stride + col] : 0;
  });
}

TEST(TmaTile, QueryTilesInPackedOrder) {
  if (!device_has_tma()) GTEST_SKIP() << "TMA needs an sm_90 device";
  for (const bool hnd : {false, true}) {
    SCOPED_TRACE(hnd ? "HND" : "NHD");
    run_query_case<128, 16>(4, 100, 2, hnd, 7, 1);   // D128, GQA 4: 32 queries x 4 heads
    run_query_case<192, 8>(8, 50, 3, hnd, 30, 2);    // D64's 192-row tile, GQA 8, past the last query
    run_query_case<128, 12>(1, 300, 2, hnd, 129, 0);  // D96, one head per group
  }
  QueryRowsTma map{};
  map.enabled = 7;
  Elems16 q(64 * 5 * 128);
  encode_query_rows_tma(map, QueryRows{q.data(), 64, 5, 1, 5 * 128, 128}, 128, 128, 64, "q");
  EXPECT_EQ(map.enabled, 0) << "a group of 5 does not divide a 128-row tile";
}

/// The store direction (the epilogue's output tiles): a warpgroup's 64 packed rows written into
/// shared memory in the WgmmaTile layout, one bulk store per column block into o at (first_query,
/// kv_head), every other element of o left as it was.
template <int ROW_CHUNKS>
__global__ void tma_store_kernel(const __grid_constant__ TmaDescriptor map, const uint16_t* rows, int first_query,
                                 int kv_head) {
  using Tile = WgmmaTile<64, ROW_CHUNKS>;
  extern __shared__ __align__(1024) uint16_t tile[];  // [64][ROW_CHUNKS * 8], WgmmaTile
  for (int i = threadIdx.x; i < 64 * ROW_CHUNKS; i += blockDim.x) {
    const int r = i / ROW_CHUNKS, ch = i % ROW_CHUNKS;
    *reinterpret_cast<uint4*>(tile + Tile::chunk_offset(r, ch) * 8) =
        *reinterpret_cast<const uint4*>(rows + (r * ROW_CHUNKS + ch) * 8);
  }
  fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int blk = 0; blk < ROW_CHUNKS / Tile::kAtomChunks; ++blk) {
      tma_store_4d(&map, smem_addr(tile) + blk * Tile::kBlockBytes, blk * Tile::kAtomChunks * 8, 0, first_query, kv_head);
    }
    tma_store_commit();
    tma_store_wait_read<0>();
  }
}

template <int ROW_CHUNKS>
void run_store_case(int group, int num_rows, int kv_heads, int first_query, int kv_head) {
  using Tile = WgmmaTile<64, ROW_CHUNKS>;
  const int d = ROW_CHUNKS * 8, heads = kv_heads * group;
  std::vector<uint16_t> rows(64 * d), before(static_cast<size_t>(num_rows) * heads * d);
  std::mt19937 rng(7 + group + d);
  for (auto& x : rows) x = static_cast<uint16_t>(rng() & 0xFFFF);
  for (auto& x : before) x = static_cast<uint16_t>(rng() & 0xFFFF);
  Elems16 o(before.size()), src(rows.size());
  o.buffer.upload(before.data(), before.size() * 2);
  src.buffer.upload(rows.data(), rows.size() * 2);
  QueryRowsTma map{};
  encode_query_rows_tma(map, QueryRows{o.data(), num_rows, group, kv_heads, int64_t{heads} * d, d}, 64, d,
                        Tile::kAtomChunks * 8, "o");
  ASSERT_EQ(map.enabled, 1);
  const int smem = 64 * d * 2;
  ASSERT_EQ(cudaFuncSetAttribute(tma_store_kernel<ROW_CHUNKS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
            cudaSuccess);
  tma_store_kernel<ROW_CHUNKS><<<1, 128, smem>>>(map.map, src.data(), first_query, kv_head);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> after(before.size());
  o.buffer.download(after.data(), after.size() * 2);
  int mismatches = 0;
  for (int q = 0; q < num_rows; ++q) {
    for (int h = 0; h < heads; ++h) {
      const int packed = (q - first_query) * group + (h - kv_head * group);  // the box's row, if inside it
      const bool stored = h / group == kv_head && packed >= 0 && packed < 64;
      for (int col = 0; col < d; ++col) {
        const size_t at = (static_cast<size_t>(q) * heads + h) * d + col;
        const uint16_t want = stored ? rows[packed * d + col] : before[at];
        if (after[at] != want && ++mismatches <= 5) {
          ADD_FAILURE() << "query " << q << " head " << h << " column " << col << ": " << after[at] << ", expected "
                        << want;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(TmaTile, OutputRowsStoredInPackedOrder) {
  if (!device_has_tma()) GTEST_SKIP() << "TMA needs an sm_90 device";
  run_store_case<16>(4, 40, 2, 3, 1);  // D128, GQA 4: 16 queries x 4 heads of KV head 1
  run_store_case<12>(1, 100, 3, 30, 2);  // D96 (three 64-byte blocks), one head per group
  run_store_case<16>(8, 10, 1, 4, 0);  // rows past the tensor (queries 10, 11) are not written
}

/// A ROWS-row tile of pages of PAGE slots (pages smaller than a tile: one box a page), KV head
/// `head` of `heads`, from the pages `pages` of a paged tensor of `num_pages` pages (ids past it:
/// zeros), NHD or HND.
template <int ROWS, int ROW_CHUNKS, int PAGE>
void run_paged_case(int heads, int head, int num_pages, const std::vector<int>& pages, bool hnd) {
  using Tile = WgmmaTile<ROWS, ROW_CHUNKS>;
  const int d = ROW_CHUNKS * 8;
  ASSERT_EQ(static_cast<int>(pages.size()), ROWS / PAGE);
  const int64_t page_elems = int64_t{PAGE} * heads * d;
  std::vector<uint16_t> host(static_cast<size_t>(page_elems * num_pages));
  const int64_t row_stride = hnd ? d : int64_t{heads} * d, head_stride = hnd ? int64_t{PAGE} * d : d;
  const Elems16 k = random_device_copy(host, 77 + d + PAGE);
  KVTmaDescriptors maps{};
  const KVRowTensors kv{k.data(),    k.data(),   PAGE,       heads,       num_pages,  row_stride,
                        head_stride, page_elems, row_stride, head_stride, page_elems, /*paged=*/true};
  const KVTmaBox box{ROWS, d, Tile::kAtomChunks * 8};
  encode_kv_tma(maps, kv, box, box);
  ASSERT_EQ(maps.enabled, 1) << "pages of " << PAGE << " slots under " << ROWS << "-row tiles take TMA";
  ASSERT_EQ(maps.box_rows, PAGE) << "one box a page";
  tessera_test::DeviceBuffer page_ids(pages.size() * sizeof(int));
  page_ids.upload(pages.data(), pages.size() * sizeof(int));
  constexpr int kElems = ROWS * ROW_CHUNKS * 8;
  Elems16 out(kElems);
  out.buffer.poison();
  const int smem = kElems * 2 + 8;
  auto kernel = tma_paged_tile_kernel<ROWS, ROW_CHUNKS, PAGE>;
  ASSERT_EQ(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  kernel<<<1, 128, smem>>>(maps.k, head, static_cast<const int*>(page_ids.get()), out.data());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> got(kElems);
  out.buffer.download(got.data(), got.size() * 2);
  expect_tile<ROWS, ROW_CHUNKS>(got, [&](int r, int col) -> uint16_t {
    const int page = pages[r / PAGE], slot = r % PAGE;
    return page < num_pages ? host[page * page_elems + slot * row_stride + head * head_stride + col] : 0;
  });
}

TEST(TmaTile, PagesSmallerThanATileLandAsOneBoxEach) {
  if (!device_has_tma()) GTEST_SKIP() << "TMA needs an sm_90 device";
  for (bool hnd : {false, true}) {
    SCOPED_TRACE(hnd ? "HND" : "NHD");
    run_paged_case<128, 16, 16>(8, 5, 23, {7, 0, 22, 3, 3, 11, 19, 1}, hnd);  // D128, page 16, a page twice
    run_paged_case<128, 16, 32>(2, 1, 6, {5, 2, 0, 4}, hnd);                  // page 32
    run_paged_case<128, 16, 64>(1, 0, 3, {2, 9}, hnd);                        // page 64; page 9 of 3: zeros
    run_paged_case<64, 32, 16>(3, 2, 9, {8, 1, 4, 6}, hnd);                   // D256 (64-row tiles), page 16
    run_paged_case<128, 12, 16>(4, 3, 10, {9, 2, 2, 5, 0, 8, 7, 1}, hnd);     // D96 (64-byte swizzle)
  }
}

TEST(TmaTile, HostDeclinesWhatTmaCannotDescribe) {
  if (!device_has_tma()) GTEST_SKIP() << "TMA needs an sm_90 device";
  Elems16 k(64 * 4 * 128 * 2 + 64);
  const KVTmaBox box{128, 128, 64};
  // encode_kv_tma's verdict: 0 (cp.async), else the rows of a box (enabled).
  const auto box_rows = [&](const void* base, int64_t row_stride, int64_t block_rows, int64_t blocks, bool paged) {
    KVTmaDescriptors maps{};
    maps.enabled = 7;
    maps.box_rows = 7;
    const int64_t block_stride = block_rows * 512;
    encode_kv_tma(maps,
                  KVRowTensors{base, base, block_rows, 4, blocks, row_stride, 128, block_stride, row_stride, 128,
                               block_stride, paged},
                  box, box);
    EXPECT_TRUE(maps.enabled == 1 || maps.box_rows == 0) << "box_rows 0 when disabled";
    return maps.enabled == 1 ? maps.box_rows : 0;
  };
  EXPECT_EQ(box_rows(k.data(), 512, 128, 2, true), 128);
  EXPECT_EQ(box_rows(k.data(), 512, 256, 1, false), 128) << "ragged rows";
  EXPECT_EQ(box_rows(k.data() + 4, 512, 128, 2, true), 0) << "a base 8 bytes past 16-byte alignment";
  EXPECT_EQ(box_rows(k.data(), 516, 128, 2, true), 0) << "rows 1032 bytes apart";
  EXPECT_EQ(box_rows(k.data(), 0, 128, 2, true), 0) << "every row at one address";
  EXPECT_EQ(box_rows(k.data(), 512, 64, 4, true), 64) << "pages of 64 slots under 128-row tiles: one box a page";
  EXPECT_EQ(box_rows(k.data(), 512, 16, 16, true), 16) << "pages of 16 slots";
  EXPECT_EQ(box_rows(k.data(), 512, 64, 1, false), 0) << "ragged KV of fewer rows than a tile";
  EXPECT_EQ(box_rows(k.data(), 512, 8, 32, true), 0) << "pages of 8 slots: 1 KiB boxes, kept on cp.async";
  EXPECT_EQ(box_rows(k.data(), 512, 48, 4, true), 0) << "pages of 48 slots do not fill a 128-row tile evenly";
}

}  // namespace
