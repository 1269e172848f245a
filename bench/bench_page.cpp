// Appending to a paged KV cache (tessera/page.h). Memory-bound: bytes = appended rows read + rows
// written into the cache (K and V; fp8 caches write one byte per element); reported in GB/s
// against the copy ceiling.
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "harness.h"
#include "tessera/formats.h"
#include "tessera/page.h"

namespace tessera_bench {
namespace {

using tessera::DType;
using tessera::Layout;

constexpr DType kDType = DType::kBF16;  // the appended rows
constexpr int64_t kBatch = 64;
constexpr int64_t kAppendLen = 1024;  // new tokens per request; also its KV length afterwards
constexpr int64_t kKvHeads = 8;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kPageSize = 16;
constexpr uint64_t kPermutationSeed = 20261122;


// 64 requests each append 1024 new rows of [H_kv=8, D=128] bf16 (K + V = 256 MiB) to a fresh
// cache (KV length 1024 after the append), page size 16, pages in a random order. A cache of
// cache_dtype: bf16 (a copy) or fp8 (quantized with a per-tensor host scale).
void run_append(BenchContext& ctx, Layout layout, DType cache_dtype = kDType) {
  constexpr int64_t kRows = kBatch * kAppendLen;
  constexpr int64_t kPagesPerRequest = (kAppendLen + kPageSize - 1) / kPageSize;
  constexpr int64_t kNumPages = kBatch * kPagesPerRequest;
  constexpr int32_t kLastPageLen = static_cast<int32_t>(kAppendLen - (kPagesPerRequest - 1) * kPageSize);

  // Index arrays, built on the host.
  std::vector<int32_t> append_indptr(kBatch + 1), page_indptr(kBatch + 1);
  for (int64_t b = 0; b <= kBatch; ++b) {
    append_indptr[b] = static_cast<int32_t>(b * kAppendLen);
    page_indptr[b] = static_cast<int32_t>(b * kPagesPerRequest);
  }
  const std::vector<int32_t> page_indices = random_permutation(kNumPages, kPermutationSeed);
  const std::vector<int32_t> last_page_len(kBatch, kLastPageLen);

  DeviceTensor d_append_indptr = ctx.upload_i32(append_indptr);
  DeviceTensor d_page_indptr = ctx.upload_i32(page_indptr);
  DeviceTensor d_page_indices = ctx.upload_i32(page_indices);
  DeviceTensor d_last_page_len = ctx.upload_i32(last_page_len);

  DeviceTensor append_k = ctx.random_tensor(kDType, {kRows, kKvHeads, kHeadDim});
  DeviceTensor append_v = ctx.random_tensor(kDType, {kRows, kKvHeads, kHeadDim});
  const bool nhd = layout == Layout::kNHD;
  DeviceTensor cache_k = nhd ? ctx.zero_tensor(cache_dtype, {kNumPages, kPageSize, kKvHeads, kHeadDim})
                             : ctx.zero_tensor(cache_dtype, {kNumPages, kKvHeads, kPageSize, kHeadDim});
  DeviceTensor cache_v = nhd ? ctx.zero_tensor(cache_dtype, {kNumPages, kPageSize, kKvHeads, kHeadDim})
                             : ctx.zero_tensor(cache_dtype, {kNumPages, kKvHeads, kPageSize, kHeadDim});
  tessera::KVScales scales;
  if (tessera::is_fp8(cache_dtype)) {
    // N(0, 1) rows: |x| / scale stays well inside e4m3's +-448.
    scales.k = 1.0 / 64;
    scales.v = 1.0 / 64;
  }

  tessera::PagedKV cache;
  cache.k = cache_k.view;
  cache.v = cache_v.view;
  cache.layout = layout;
  cache.indptr = d_page_indptr.view;
  cache.indices = d_page_indices.view;
  cache.last_page_len = d_last_page_len.view;

  const Timing t = ctx.measure([&](cudaStream_t stream) {
    tessera::append_paged_kv_cache(append_k.view, append_v.view, d_append_indptr.view, cache,
                                   stream, scales);
  });
  // Rows read in kDType, the same elements written in cache_dtype.
  const double rows_read = static_cast<double>(append_k.nbytes() + append_v.nbytes());
  const double bytes = rows_read + rows_read / tessera::dtype_size(kDType) * tessera::dtype_size(cache_dtype);
  Params params = {{"batch", kBatch},
                   {"append_len", kAppendLen},
                   {"H_kv", kKvHeads},
                   {"D", kHeadDim},
                   {"page_size", kPageSize},
                   {"layout", tessera::layout_name(layout)},
                   {"dtype", tessera::dtype_name(kDType)}};
  // Only where it differs from the rows', so the bf16 workloads' results keep their params.
  if (cache_dtype != kDType) params.emplace_back("cache_dtype", tessera::dtype_name(cache_dtype));
  ctx.report_gbps(t, bytes, std::move(params));
}

void bench_append_paged_nhd(BenchContext& ctx) { run_append(ctx, Layout::kNHD); }
void bench_append_paged_hnd(BenchContext& ctx) { run_append(ctx, Layout::kHND); }
void bench_append_paged_nhd_e4m3(BenchContext& ctx) { run_append(ctx, Layout::kNHD, DType::kE4M3); }

}  // namespace

TESSERA_BENCH_WORKLOAD(bench_append_paged_nhd, "append_paged_nhd",
                       "append 64x1024 rows H_kv=8 D=128 bf16 to a paged cache, page 16, NHD",
                       "append", "quick");
TESSERA_BENCH_WORKLOAD(bench_append_paged_hnd, "append_paged_hnd",
                       "append 64x1024 rows H_kv=8 D=128 bf16 to a paged cache, page 16, HND",
                       "append", "quick");
TESSERA_BENCH_WORKLOAD(bench_append_paged_nhd_e4m3, "append_paged_nhd_e4m3",
                       "append 64x1024 rows H_kv=8 D=128 bf16 to an e4m3 paged cache (per-tensor scale), "
                       "page 16, NHD",
                       "append");

}  // namespace tessera_bench
