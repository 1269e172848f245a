// GPU tests of batch_mla_paged (tessera/mla.h) against the fp64 MLA oracle (tests/reference/mla.h):
// head counts 16-128, query lengths 1-8 per request (causal and not), page sizes 1/16/64 with a
// random page permutation, lengths 0 to 64k, f16 and bf16, fp8 latent caches (e4m3, e5m2; host
// and device scales), strided and combined (FlashMLA-style [pages, page_size, 576]) layouts; and
// the named errors of bad arguments.
//
// Inputs are fresh random values from test_seed(), rounded to the dtype before the reference sees
// them; o and lse are poisoned (NaN) before each call; unused cache slots hold NaN, so a kernel that
// reads past a request's length fails.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/attention/mla_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "reference/mla.h"
#include "reference/oracle.h"
#include "tessera/mla.h"
#include "tessera/validate.h"

namespace {

using tessera::DType;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;
using namespace tessera_test::mla;

tessera::MlaOptions options_for(const MlaCase& c, MlaRun& run, double sm_scale) {
  tessera::MlaOptions options;
  options.sm_scale = sm_scale;
  options.causal = c.causal;
  options.num_kv_splits = c.num_kv_splits;
  const int64_t bytes = tessera::batch_mla_paged_workspace_bytes(run.total_q, c.heads, c.num_kv_splits, c.dtype);
  if (bytes > 0) {
    run.workspace = DeviceBuffer(static_cast<size_t>(bytes));
    run.workspace.poison();  // stale split states must not leak into the merge
    options.workspace = make_view(run.workspace.get(), DType::kU8, {bytes}, {1});
  }
  return options;
}

void run_case(const MlaCase& c) {
  if (!device_has_wgmma()) GTEST_SKIP() << "batch_mla_paged needs an sm_90 GPU (tested in BadArgumentsAreNamed)";
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", " + describe(c));
  std::mt19937_64 rng(seed);
  const double sm_scale = 1.0 / std::sqrt(192.0);
  MlaRun run = prepare(c, rng, sm_scale);
  const tessera::MlaOptions options = options_for(c, run, sm_scale);
  tessera::batch_mla_paged(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, c.qo_len, run.cache, run.o.view,
                           run.lse_view, options);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<double> o = read_tensor(run.o);
  const std::vector<double> lse = download_as(DType::kF32, run.lse.get(), static_cast<size_t>(run.total_q * c.heads));
  expect_matches_oracle(c.dtype, o, &lse, run.ref, describe(c));
  EXPECT_EQ(padding_changes(run.o), 0u) << "writes outside o's view";
}

// The grid of the issue: heads x query lengths x page sizes x dtypes, each a batch with an empty
// request, a one-token request, requests that end inside a tile and ones that span several.
using GridParam = std::tuple<DType, int64_t /*heads*/, int64_t /*qo_len*/, int64_t /*page_size*/>;
class MlaGridTest : public ::testing::TestWithParam<GridParam> {};

TEST_P(MlaGridTest, MatchesOracle) {
  const auto [dtype, heads, qo_len, page_size] = GetParam();
  for (bool causal : {true, false}) {
    MlaCase c{dtype, heads, qo_len, page_size, causal, {0, qo_len, 77, 200 + 3 * qo_len}};
    c.num_kv_splits = causal ? 1 : 3;  // half of the grid through the split states and the merge
    run_case(c);
    if (HasFatalFailure() || IsSkipped()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Mla, MlaGridTest,
                         ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16),
                                            ::testing::Values<int64_t>(16, 32, 64, 128),
                                            ::testing::Values<int64_t>(1, 2, 4, 8),
                                            ::testing::Values<int64_t>(1, 16, 64)),
                         [](const ::testing::TestParamInfo<GridParam>& info) {
                           return std::string(tessera::dtype_name(std::get<0>(info.param))) + "_h" +
                                  std::to_string(std::get<1>(info.param)) + "_q" +
                                  std::to_string(std::get<2>(info.param)) + "_p" +
                                  std::to_string(std::get<3>(info.param));
                         });

TEST(MlaTest, DecodeWithoutQoIndptr_sanitize) {
  MlaCase c{DType::kBF16, 16, 1, 16, false, {5, 0, 64, 129, 1000}};
  c.with_indptr = false;
  run_case(c);
}

TEST(MlaTest, CombinedCacheAndStridedQueries_sanitize) {
  run_case(MlaCase{DType::kF16, 32, 2, 64, true, {300, 1, 64}, Storage::kCombined});
  run_case(MlaCase{DType::kBF16, 128, 1, 1, false, {70, 0}, Storage::kCombined});
}

TEST(MlaTest, LongContexts) {
  run_case(MlaCase{DType::kBF16, 16, 1, 64, false, {65536, 4099}});
  run_case(MlaCase{DType::kF16, 64, 2, 16, true, {16384}});
}

TEST(MlaTest, SplitOverTheKvLength_sanitize) {
  // More splits than some requests have tiles: their extra splits are empty states.
  for (int64_t splits : {2, 5, 64}) {
    MlaCase c{DType::kBF16, 128, 4, 16, true, {0, 1, 77, 1000, 3001}};
    c.num_kv_splits = splits;
    run_case(c);
  }
  MlaCase decode{DType::kF16, 16, 1, 64, false, {40000, 3}};
  decode.num_kv_splits = 16;
  decode.with_indptr = false;
  run_case(decode);
}

TEST(MlaTest, SplitRunsAreBitwiseRepeatable) {
  if (!device_has_wgmma()) GTEST_SKIP() << "batch_mla_paged needs an sm_90 GPU";
  std::mt19937_64 rng(test_seed());
  MlaCase c{DType::kBF16, 64, 2, 16, true, {5000, 700, 0}};
  c.num_kv_splits = 7;
  MlaRun run = prepare(c, rng, 0.07);
  const tessera::MlaOptions options = options_for(c, run, 0.07);
  std::vector<unsigned char> first;
  for (int i = 0; i < 10; ++i) {
    tessera::batch_mla_paged(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, run.cache, run.o.view,
                             run.lse_view, options);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<unsigned char> bytes = read_bytes(run.o);
    if (i == 0) first = bytes;
    ASSERT_EQ(bytes, first) << "run " << i << " differs from run 0";
  }
}

TEST(MlaTest, MoreQueryTokensThanKeys) {
  // Causal: the first qo_len - kv_len tokens sit before position 0 and see nothing (o = 0, lse = -inf).
  run_case(MlaCase{DType::kBF16, 16, 8, 16, true, {3, 0, 8}});
}

// An fp8 latent cache (e4m3, e5m2) under f16 and bf16 queries: the oracle runs on the
// dequantized cache (key and value scales differ), over head counts, query lengths, page sizes,
// splits, the combined layout and device scales.
using Fp8Param = std::tuple<DType /*q*/, DType /*cache*/, int64_t /*page_size*/>;
class MlaFp8CacheTest : public ::testing::TestWithParam<Fp8Param> {};

TEST_P(MlaFp8CacheTest, MatchesOracleOnTheDequantizedCache) {
  const auto [dtype, fp8, page_size] = GetParam();
  for (const auto& [heads, qo_len, causal, splits] :
       {std::tuple<int64_t, int64_t, bool, int64_t>{16, 1, false, 1}, {128, 2, true, 1}, {64, 8, true, 3},
        {32, 4, false, 5}}) {
    MlaCase c{dtype, heads, qo_len, page_size, causal, {0, qo_len, 77, 200 + 3 * qo_len, 1500}};
    c.num_kv_splits = splits;
    c.fp8 = fp8;
    c.fp8_scales = splits > 1 ? Fp8Scales::kDevice : Fp8Scales::kHost;
    run_case(c);
    if (HasFatalFailure() || IsSkipped()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Mla, MlaFp8CacheTest,
                         ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16),
                                            ::testing::Values(DType::kE4M3, DType::kE5M2),
                                            ::testing::Values<int64_t>(1, 16, 64)),
                         [](const ::testing::TestParamInfo<Fp8Param>& info) {
                           return std::string(tessera::dtype_name(std::get<0>(info.param))) + "_" +
                                  tessera::dtype_name(std::get<1>(info.param)) + "_p" +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST(MlaTest, Fp8CombinedCacheLongContext_sanitize) {
  MlaCase c{DType::kBF16, 16, 1, 64, false, {20000, 3}, Storage::kCombined};
  c.fp8 = DType::kE4M3;
  c.fp8_scales = Fp8Scales::kDevice;
  run_case(c);
  MlaCase mtp{DType::kF16, 128, 2, 16, true, {700, 0, 64}, Storage::kCombined};
  mtp.fp8 = DType::kE5M2;
  run_case(mtp);
}

// Requests of at most 16 (token, head) rows run the narrow tile (the rows as the MMAs' N): fewer
// heads than a tile's rows, several tokens, partial tiles, both cache kinds.
TEST(MlaTest, NarrowTileRows_sanitize) {
  run_case(MlaCase{DType::kBF16, 8, 2, 16, true, {0, 2, 77, 700}});
  run_case(MlaCase{DType::kF16, 4, 3, 1, false, {130, 5, 64}});
  MlaCase fp8{DType::kBF16, 2, 8, 64, true, {1000, 8, 0}};
  fp8.fp8 = DType::kE4M3;
  fp8.num_kv_splits = 3;
  run_case(fp8);
}

TEST(MlaTest, BadArgumentsAreNamed) {
  std::mt19937_64 rng(test_seed());
  MlaCase c{DType::kBF16, 16, 2, 16, true, {40, 9}};
  MlaRun run = prepare(c, rng, 0.1);
  tessera::MlaOptions options;
  options.sm_scale = 0.1;
  auto call = [&](const TensorView& q_nope, const TensorView& q_pe, const TensorView& qo_indptr, int64_t max_qo_len,
                  const tessera::PagedLatentCache& cache, const TensorView& o, const TensorView& lse,
                  const tessera::MlaOptions& opts) {
    tessera::batch_mla_paged(q_nope, q_pe, qo_indptr, max_qo_len, cache, o, lse, opts);
  };
  const auto inv = tessera::StatusCode::kInvalidArgument;
  // Wrong latent widths.
  TensorView narrow = run.q_nope_view;
  narrow.shape[2] = 256;
  expect_error_any([&] { call(narrow, run.q_pe_view, run.qo_indptr_view, 2, run.cache, run.o.view, {}, options); },
                   {"q_nope.shape[2] = 256"}, inv);
  tessera::PagedLatentCache bad_cache = run.cache;
  bad_cache.kpe.shape[2] = 32;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, bad_cache, run.o.view, {}, options); },
                   {"kv.kpe.shape[2] = 32"}, inv);
  // Head counts that disagree.
  TensorView few_heads = run.q_pe_view;
  few_heads.shape[1] = 8;
  expect_error_any([&] { call(run.q_nope_view, few_heads, run.qo_indptr_view, 2, run.cache, run.o.view, {}, options); },
                   {"q_pe.shape[1] = 8"}, inv);
  TensorView o_heads = run.o.view;
  o_heads.shape[1] = 32;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, run.cache, o_heads, {}, options); },
                   {"o.shape[1] = 32"}, inv);
  // dtype mismatch, scale, indptr length, too short max_qo_len.
  TensorView f16_q = run.q_nope_view;
  f16_q.dtype = DType::kF16;
  expect_error_any([&] { call(f16_q, run.q_pe_view, run.qo_indptr_view, 2, run.cache, run.o.view, {}, options); },
                   {"q_nope.dtype"});
  tessera::MlaOptions no_scale;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, run.cache, run.o.view, {}, no_scale); },
                   {"options.sm_scale = 0"}, inv);
  TensorView short_indptr = run.qo_indptr_view;
  short_indptr.shape[0] = 2;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, short_indptr, 2, run.cache, run.o.view, {}, options); },
                   {"qo_indptr"}, inv);
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, TensorView{}, 2, run.cache, run.o.view, {}, options); },
                   {"q_nope.shape[0] = 4"}, inv);
  TensorView lse_bad = run.lse_view;
  lse_bad.shape[1] = 3;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, run.cache, run.o.view, lse_bad, options); },
                   {"lse.shape[1] = 3"}, inv);
  // Splits: the count, the workspace.
  tessera::MlaOptions split = options;
  split.num_kv_splits = 0;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, run.cache, run.o.view, {}, split); },
                   {"options.num_kv_splits = 0"}, inv);
  split.num_kv_splits = 4;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, run.cache, run.o.view, {}, split); },
                   {"options.workspace is undefined"}, inv);
  DeviceBuffer small(256);
  split.workspace = make_view(small.get(), DType::kU8, {256}, {1});
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, run.cache, run.o.view, {}, split); },
                   {"options.workspace holds 256 bytes"}, inv);
  // Scales on a 16-bit cache, a query scale, a cache of another 16-bit type, fp8 queries.
  tessera::PagedLatentCache scaled = run.cache;
  scaled.scales.k = 0.5;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, scaled, run.o.view, {}, options); },
                   {"kv.scales: scales apply to fp8"}, inv);
  tessera::PagedLatentCache fp8_cache = run.cache;
  fp8_cache.ckv.dtype = fp8_cache.kpe.dtype = DType::kE4M3;
  fp8_cache.scales.q = 2.0;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, fp8_cache, run.o.view, {}, options); },
                   {"kv.scales.q = 2"}, inv);
  fp8_cache.scales.q = 1.0;
  fp8_cache.scales.v = -1.0;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, fp8_cache, run.o.view, {}, options); },
                   {"kv.scales.v = -1"}, inv);
  tessera::PagedLatentCache mixed = run.cache;
  mixed.kpe.dtype = DType::kE4M3;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, mixed, run.o.view, {}, options); },
                   {"kv.kpe.dtype"}, inv);
  tessera::PagedLatentCache f16_cache = run.cache;
  f16_cache.ckv.dtype = f16_cache.kpe.dtype = DType::kF16;
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, f16_cache, run.o.view, {}, options); },
                   {"kv.ckv.dtype = f16, expected q_nope.dtype (bf16), e4m3 or e5m2"}, inv);
  fp8_cache.scales.v = 1.0;
  TensorView fp8_q = run.q_nope_view;
  fp8_q.dtype = DType::kE4M3;
  expect_error_any([&] { call(fp8_q, run.q_pe_view, run.qo_indptr_view, 2, fp8_cache, run.o.view, {}, options); },
                   {"q_nope.dtype"});
  // The page table, read in checked mode: a page id out of range and a bad last_page_len.
  tessera::set_checked_mode(true);
  std::vector<int32_t> bad_ids = {0, 1, 2, 999};
  DeviceBuffer ids = upload_i32(bad_ids);
  tessera::PagedLatentCache bad_pages = run.cache;
  bad_pages.indices = i32_view(ids, 4);
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, bad_pages, run.o.view, {}, options); },
                   {"kv.indices[3] = 999"}, inv);
  DeviceBuffer last = upload_i32({8, 17});
  tessera::PagedLatentCache bad_last = run.cache;
  bad_last.last_page_len = i32_view(last, 2);
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, bad_last, run.o.view, {}, options); },
                   {"kv.last_page_len[1] = 17"}, inv);
  DeviceBuffer qo_long = upload_i32({0, 1, 4});
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, i32_view(qo_long, 3), 2, run.cache, run.o.view, {}, options); },
                   {"max_qo_len = 2"}, inv);
  // With splits every query row must belong to a request (the merge writes all of o).
  DeviceBuffer qo_short = upload_i32({0, 1, 2});
  const int64_t ws_bytes = tessera::batch_mla_paged_workspace_bytes(4, 16, 4, DType::kBF16);
  DeviceBuffer ws(static_cast<size_t>(ws_bytes));
  split.workspace = make_view(ws.get(), DType::kU8, {ws_bytes}, {1});
  expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, i32_view(qo_short, 3), 2, run.cache, run.o.view, {}, split); },
                   {"qo_indptr[batch_size] = 2, expected q_nope.shape[0] = 4"}, inv);
  tessera::set_checked_mode(false);
  if (!device_has_wgmma()) {
    expect_error_any([&] { call(run.q_nope_view, run.q_pe_view, run.qo_indptr_view, 2, run.cache, run.o.view, {}, options); },
                     {"sm_90"}, tessera::StatusCode::kUnsupported);
  }
}

}  // namespace
