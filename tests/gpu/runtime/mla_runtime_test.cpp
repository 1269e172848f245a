// GPU tests of BatchMLAPagedWrapper (tessera/runtime.h): MLA through the plan/run runtime against
// the fp64 MLA oracle (tests/reference/mla.h). Skewed batches whose long requests the planner
// splits (checked in PlanInfo, so the merge is exercised), every split mode, bitwise repeatable
// runs, CUDA-graph replays after re-plans of other lengths, fp8 latent caches (graph replays with
// changed device scales), and named errors.
//
// Inputs are fresh random values from test_seed(); o and lse are poisoned before each run.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/attention/mla_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "gpu/runtime/runtime_test_utils.h"
#include "tessera/runtime.h"
#include "tessera/validate.h"

namespace {

using tessera::DType;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;
using namespace tessera_test::mla;

constexpr double kScale = 0.0721;  // about 1 / sqrt(192)

tessera::MlaRuntimeBounds bounds_for(const MlaCase& c, const MlaRun& run) {
  return {static_cast<int64_t>(c.kv_lens.size()), std::max<int64_t>(run.total_q, 1), c.heads};
}

tessera::MlaPlanShape shape_for(const MlaCase& c) { return {c.heads, c.dtype, kScale, c.causal}; }

void plan(tessera::BatchMLAPagedWrapper& w, const MlaCase& c, const MlaRun& run) {
  tessera::MlaPlanShape shape = shape_for(c);
  shape.kv_dtype = c.fp8;
  shape.kv_scales = run.cache.scales;  // an fp8 case's (prepare())
  w.plan(host_i32(run.qo_indptr_host), host_i32(run.kv_indptr_host), host_i32(run.last_page_len_host), c.page_size,
         shape);
}

void run_wrapper(tessera::BatchMLAPagedWrapper& w, MlaRun& run, cudaStream_t stream = nullptr) {
  w.run(run.q_nope_view, run.q_pe_view, run.cache.ckv, run.cache.kpe, run.cache.indices, run.o.view, run.lse_view,
        stream);
}

void expect_run_matches(const MlaCase& c, MlaRun& run) {
  const std::vector<double> o = read_tensor(run.o);
  const std::vector<double> lse = download_as(DType::kF32, run.lse.get(), static_cast<size_t>(run.total_q * c.heads));
  expect_matches_oracle(c.dtype, o, &lse, run.ref, describe(c));
}

/// Plans and runs case `c` through a fresh wrapper and compares with the oracle; returns the plan.
tessera::PlanInfo run_case(const MlaCase& c, const tessera::RuntimeOptions& options = {}) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", " + describe(c));
  std::mt19937_64 rng(seed);
  MlaRun run = prepare(c, rng, kScale);
  const tessera::MlaRuntimeBounds bounds = bounds_for(c, run);
  Workspace ws(tessera::BatchMLAPagedWrapper::workspace_size(bounds, options));
  ws.buf.poison();  // stale states must not leak into the merge
  tessera::BatchMLAPagedWrapper w(ws.view, bounds, options);
  plan(w, c, run);
  run_wrapper(w, run);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_run_matches(c, run);
  EXPECT_EQ(padding_changes(run.o), 0u) << "writes outside o's view";
  return w.plan_info();
}

#define SKIP_WITHOUT_SM90()                                                                          \
  if (!device_has_wgmma()) GTEST_SKIP() << "BatchMLAPagedWrapper needs an sm_90 GPU (its errors: BadArgumentsAreNamed)"

TEST(MlaRuntime, SkewedBatchesAreSplitAndMatchTheOracle_sanitize) {
  SKIP_WITHOUT_SM90();
  // One long request among short and empty ones: the plan must split it over idle SMs.
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const tessera::PlanInfo info = run_case(MlaCase{dtype, 16, 1, 64, false, {9000, 0, 3, 64, 130}});
    EXPECT_GT(info.num_merges, 0) << "the long request was not split";
  }
  // Many heads and tokens (several query tiles per request), causal among the new tokens.
  const tessera::PlanInfo wide = run_case(MlaCase{DType::kBF16, 128, 4, 16, true, {6000, 1, 77, 0}});
  EXPECT_GT(wide.num_merges, 0) << "the long request's tiles were not split";
}

using GridParam = std::tuple<int64_t /*heads*/, int64_t /*qo_len*/, int64_t /*page_size*/>;
class MlaRuntimeGridTest : public ::testing::TestWithParam<GridParam> {};

TEST_P(MlaRuntimeGridTest, MatchesOracle) {
  SKIP_WITHOUT_SM90();
  const auto [heads, qo_len, page_size] = GetParam();
  for (bool causal : {true, false}) {
    run_case(MlaCase{causal ? DType::kBF16 : DType::kF16, heads, qo_len, page_size, causal,
                     {0, qo_len, 77, 1200 + 3 * qo_len}});
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(MlaRuntime, MlaRuntimeGridTest,
                         ::testing::Combine(::testing::Values<int64_t>(16, 128), ::testing::Values<int64_t>(1, 2, 8),
                                            ::testing::Values<int64_t>(1, 16, 64)),
                         [](const ::testing::TestParamInfo<GridParam>& info) {
                           return "h" + std::to_string(std::get<0>(info.param)) + "_q" +
                                  std::to_string(std::get<1>(info.param)) + "_p" +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST(MlaRuntime, SplitModes) {
  SKIP_WITHOUT_SM90();
  const MlaCase c{DType::kBF16, 64, 2, 16, true, {5000, 700, 0, 1}};
  tessera::RuntimeOptions fixed;
  fixed.split_kv = tessera::SplitKV::kFixed;
  fixed.fixed_split_size = 512;
  const tessera::PlanInfo f = run_case(c, fixed);
  EXPECT_EQ(f.chunk_size, 512);
  EXPECT_GT(f.num_merges, 0);
  tessera::RuntimeOptions none;
  none.split_kv = tessera::SplitKV::kNone;
  EXPECT_EQ(run_case(c, none).num_merges, 0);
  tessera::RuntimeOptions few_sms;
  few_sms.sm_budget = 7;  // many items per CTA: the pipeline runs on across work tiles
  EXPECT_EQ(run_case(c, few_sms).grid_cols, 7);
  run_case(MlaCase{DType::kF16, 16, 1, 1, false, {40000, 3, 0, 129}}, few_sms);
}

TEST(MlaRuntime, PipelineRunsOnAcrossWorkTiles_sanitize) {
  SKIP_WITHOUT_SM90();
  // Two CTAs run every item one after another: empty KV ranges, one-tile items, split chunks and
  // whole tiles back to back (small enough for racecheck and synccheck).
  tessera::RuntimeOptions two_sms;
  two_sms.sm_budget = 2;
  EXPECT_EQ(run_case(MlaCase{DType::kBF16, 16, 2, 16, true, {300, 0, 65, 1, 130}}, two_sms).grid_cols, 2);
  two_sms.split_kv = tessera::SplitKV::kFixed;
  two_sms.fixed_split_size = 128;
  EXPECT_GT(run_case(MlaCase{DType::kF16, 64, 1, 1, false, {0, 300, 2}}, two_sms).num_merges, 0);
}

// Requests of at most 16 (token, head) rows run the narrow tile (PlanInfo::q_tile_rows 16): two
// CTAs run every item one after another (empty KV ranges, one-tile items, split chunks), so the
// load warpgroup fills the next item's Q buffer and stages while the math warpgroup finishes this
// one's; forced tiles either way.
TEST(MlaRuntime, NarrowTileRunsOnAcrossWorkTiles_sanitize) {
  SKIP_WITHOUT_SM90();
  tessera::RuntimeOptions two_sms;
  two_sms.sm_budget = 2;
  const tessera::PlanInfo whole = run_case(MlaCase{DType::kBF16, 16, 1, 16, false, {300, 0, 65, 1, 130, 64}}, two_sms);
  EXPECT_EQ(whole.q_tile_rows, 16);
  EXPECT_EQ(whole.grid_cols, 2);
  MlaCase fp8{DType::kF16, 8, 2, 1, true, {200, 1, 0, 129}};
  fp8.fp8 = DType::kE4M3;
  fp8.fp8_scales = Fp8Scales::kDevice;
  EXPECT_EQ(run_case(fp8, two_sms).q_tile_rows, 16);
  two_sms.split_kv = tessera::SplitKV::kFixed;
  two_sms.fixed_split_size = 128;
  const tessera::PlanInfo split = run_case(MlaCase{DType::kF16, 4, 3, 64, true, {0, 300, 2, 40}}, two_sms);
  EXPECT_EQ(split.q_tile_rows, 16);
  EXPECT_GT(split.num_merges, 0);
  // 32 rows a request: 64-row tiles unless the narrow one is asked for (two tiles a request).
  tessera::RuntimeOptions tile16;
  tile16.q_tile = tessera::QueryTile::k16;
  tile16.sm_budget = 3;
  const MlaCase two_tiles{DType::kBF16, 16, 2, 16, true, {700, 3, 0, 64}};
  EXPECT_EQ(run_case(two_tiles).q_tile_rows, 64);
  EXPECT_EQ(run_case(two_tiles, tile16).q_tile_rows, 16);
  tessera::RuntimeOptions tile64;
  tile64.q_tile = tessera::QueryTile::k64;
  EXPECT_EQ(run_case(MlaCase{DType::kBF16, 16, 1, 64, false, {500, 2}}, tile64).q_tile_rows, 64);
}

TEST(MlaRuntime, LongContexts) {
  SKIP_WITHOUT_SM90();
  run_case(MlaCase{DType::kBF16, 16, 1, 64, false, {65536, 4099}});
  run_case(MlaCase{DType::kF16, 128, 2, 64, true, {16384, 8192}});
}

TEST(MlaRuntime, RunsAreBitwiseRepeatable) {
  SKIP_WITHOUT_SM90();
  std::mt19937_64 rng(test_seed());
  const MlaCase c{DType::kBF16, 64, 2, 16, true, {5000, 700, 0}};
  MlaRun run = prepare(c, rng, kScale);
  const tessera::MlaRuntimeBounds bounds = bounds_for(c, run);
  Workspace ws(tessera::BatchMLAPagedWrapper::workspace_size(bounds));
  tessera::BatchMLAPagedWrapper w(ws.view, bounds);
  plan(w, c, run);
  ASSERT_GT(w.plan_info().num_merges, 0);
  std::vector<unsigned char> first;
  for (int i = 0; i < 10; ++i) {
    run.o.buf.poison();
    run_wrapper(w, run);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<unsigned char> bytes = read_bytes(run.o);
    if (i == 0) first = bytes;
    ASSERT_EQ(bytes, first) << "run " << i << " differs from run 0";
  }
}

// An fp8 latent cache through the runtime: the plan names its dtype and scales; splits (long
// requests) merge dequantized states.
TEST(MlaRuntime, Fp8CacheMatchesOracle_sanitize) {
  SKIP_WITHOUT_SM90();
  for (const auto& [dtype, fp8, heads, qo_len, page_size] :
       {std::tuple<DType, DType, int64_t, int64_t, int64_t>{DType::kBF16, DType::kE4M3, 16, 1, 64},
        {DType::kF16, DType::kE4M3, 128, 2, 16},
        {DType::kBF16, DType::kE5M2, 64, 8, 1},
        {DType::kF16, DType::kE5M2, 16, 4, 64}}) {
    MlaCase c{dtype, heads, qo_len, page_size, qo_len > 1, {0, qo_len, 77, 5000, 1200 + 3 * qo_len}};
    c.fp8 = fp8;
    c.fp8_scales = heads == 16 ? Fp8Scales::kDevice : Fp8Scales::kHost;
    const tessera::PlanInfo info = run_case(c);
    EXPECT_GT(info.num_merges, 0) << describe(c) << ": the long request was not split";
    if (HasFatalFailure()) return;
  }
}

TEST(MlaRuntime, Fp8PipelineRunsOnAcrossWorkTiles_sanitize) {
  SKIP_WITHOUT_SM90();
  // The fp8 tiles fetched a tile ahead through the registers, across items of every length, in two CTAs.
  tessera::RuntimeOptions two_sms;
  two_sms.sm_budget = 2;
  MlaCase c{DType::kBF16, 16, 2, 16, true, {300, 0, 65, 1, 130}};
  c.fp8 = DType::kE4M3;
  EXPECT_EQ(run_case(c, two_sms).grid_cols, 2);
  two_sms.split_kv = tessera::SplitKV::kFixed;
  two_sms.fixed_split_size = 128;
  MlaCase split{DType::kF16, 64, 1, 1, false, {0, 300, 2}};
  split.fp8 = DType::kE5M2;
  split.fp8_scales = Fp8Scales::kDevice;
  EXPECT_GT(run_case(split, two_sms).num_merges, 0);
}

// A captured run() over an fp8 cache reads its device scales at replay: new scale values (and a
// re-plan) without a new capture.
TEST(MlaRuntime, Fp8GraphReplaysWithChangedScales) {
  SKIP_WITHOUT_SM90();
  MlaCase c{DType::kBF16, 32, 2, 16, true, {3000, 5, 0, 700}};
  c.fp8 = DType::kE4M3;
  c.fp8_scales = Fp8Scales::kDevice;
  std::mt19937_64 rng(test_seed());
  MlaRun run = prepare(c, rng, kScale);
  tessera::RuntimeOptions options;
  options.cuda_graph = true;
  options.dtype = DType::kBF16;
  options.kv_dtype = DType::kE4M3;
  const tessera::MlaRuntimeBounds bounds{4, run.total_q, c.heads};
  Workspace ws(tessera::BatchMLAPagedWrapper::workspace_size(bounds, options));
  tessera::BatchMLAPagedWrapper w(ws.view, bounds, options);
  Stream stream;
  plan(w, c, run);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA_OK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
  run_wrapper(w, run, stream.s);
  ASSERT_CUDA_OK(cudaStreamEndCapture(stream.s, &graph));
  ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  for (const auto& [k, v] : {std::pair<double, double>{kFp8KeyScale, kFp8ValueScale}, {0.031, 0.2}, {0.09, 0.011}}) {
    SCOPED_TRACE("k_scale " + std::to_string(k) + ", v_scale " + std::to_string(v));
    set_device_scales(run, k, v, stream.s);
    plan(w, c, run);  // a re-plan keeps the captured launch valid
    run.o.buf.poison();
    run.lse.poison();
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream.s));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream.s));
    run.ref = oracle_with_scales(c, run, kScale, k, v);
    expect_run_matches(c, run);
  }
  cudaGraphExecDestroy(exec);
}

/// Fixed buffers a captured run() reads and writes: inputs of each round are copied in.
struct GraphBuffers {
  static constexpr int64_t kMaxQ = 40, kHeads = 32, kPageSize = 16, kMaxPages = 700;
  DeviceBuffer q_nope{kMaxQ * kHeads * kDc * 2}, q_pe{kMaxQ * kHeads * kDr * 2};
  DeviceBuffer ckv{kMaxPages * kPageSize * kDc * 2}, kpe{kMaxPages * kPageSize * kDr * 2};
  DeviceBuffer indices{kMaxPages * 4}, o{kMaxQ * kHeads * kDc * 2}, lse{kMaxQ * kHeads * 4};
  /// A contiguous view of `b`.
  static TensorView view(const DeviceBuffer& b, DType t, std::initializer_list<int64_t> shape) {
    return TensorView(b.get(), t, shape, tessera::Device::cuda(0));
  }
};

/// Captures run() once and replays it after re-plans of other lengths, splits and batch sizes
/// (the first plan is the one captured), with `heads` query heads and `tokens` a request, bounds
/// of 8 requests and max_q tokens; the captured tile is tile_rows (kAuto, from the bounds).
void expect_graph_replays_after_replans(int64_t heads, int64_t tokens, int64_t max_q, int32_t tile_rows) {
  using G = GraphBuffers;
  ASSERT_LE(heads * max_q, G::kMaxQ * G::kHeads);
  G g;
  tessera::RuntimeOptions options;
  options.cuda_graph = true;
  options.dtype = DType::kBF16;
  const tessera::MlaRuntimeBounds bounds{8, max_q, heads};
  Workspace ws(tessera::BatchMLAPagedWrapper::workspace_size(bounds, options));
  tessera::BatchMLAPagedWrapper w(ws.view, bounds, options);
  const TensorView q_nope = g.view(g.q_nope, DType::kBF16, {max_q, heads, kDc});
  const TensorView q_pe = g.view(g.q_pe, DType::kBF16, {max_q, heads, kDr});
  const TensorView ckv = g.view(g.ckv, DType::kBF16, {G::kMaxPages, G::kPageSize, kDc});
  const TensorView kpe = g.view(g.kpe, DType::kBF16, {G::kMaxPages, G::kPageSize, kDr});
  const TensorView ids = g.view(g.indices, DType::kI32, {G::kMaxPages});
  const TensorView o = g.view(g.o, DType::kBF16, {max_q, heads, kDc});
  const TensorView lse = g.view(g.lse, DType::kF32, {max_q, heads});
  Stream stream;
  std::mt19937_64 rng(test_seed());
  const bool causal = tokens > 1;
  const std::vector<MlaCase> rounds = {
      {DType::kBF16, heads, tokens, G::kPageSize, causal, {3000, 5, 0}},
      {DType::kBF16, heads, tokens, G::kPageSize, causal, {1, 9000, 64, 17, 250}},
      {DType::kBF16, heads, tokens, G::kPageSize, causal, {0}},
      {DType::kBF16, heads, tokens, G::kPageSize, causal, {100, 200, 300, 400, 500, 600, 700, 800}},
  };
  cudaGraphExec_t exec = nullptr;
  for (size_t r = 0; r < rounds.size(); ++r) {
    const MlaCase& c = rounds[r];
    SCOPED_TRACE("round " + std::to_string(r) + ": " + describe(c));
    MlaRun run = prepare(c, rng, kScale);
    ASSERT_LE(static_cast<int64_t>(run.cache.indices.shape[0]), G::kMaxPages);
    // This round's inputs into the captured buffers (contiguous, same layouts).
    ASSERT_CUDA_OK(cudaMemcpy(g.q_nope.get(), run.q_nope_view.data, run.q_nope_view.nbytes(), cudaMemcpyDefault));
    ASSERT_CUDA_OK(cudaMemcpy(g.q_pe.get(), run.q_pe_view.data, run.q_pe_view.nbytes(), cudaMemcpyDefault));
    ASSERT_CUDA_OK(cudaMemcpy(g.ckv.get(), run.cache.ckv.data, run.cache.ckv.nbytes(), cudaMemcpyDefault));
    ASSERT_CUDA_OK(cudaMemcpy(g.kpe.get(), run.cache.kpe.data, run.cache.kpe.nbytes(), cudaMemcpyDefault));
    ASSERT_CUDA_OK(cudaMemcpy(g.indices.get(), run.cache.indices.data, run.cache.indices.nbytes(), cudaMemcpyDefault));
    g.o.poison();
    g.lse.poison();
    plan(w, c, run);
    if (exec == nullptr) {
      cudaGraph_t graph = nullptr;
      ASSERT_CUDA_OK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
      w.run(q_nope, q_pe, ckv, kpe, ids, o, lse, stream.s);
      ASSERT_CUDA_OK(cudaStreamEndCapture(stream.s, &graph));
      ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      cudaGraphDestroy(graph);
    }
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream.s));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream.s));
    const size_t rows = static_cast<size_t>(run.total_q * heads);
    const std::vector<double> out = download_as(DType::kBF16, g.o.get(), rows * kDc);
    const std::vector<double> out_lse = download_as(DType::kF32, g.lse.get(), rows);
    expect_matches_oracle(c.dtype, out, &out_lse, run.ref, describe(c));
    if (r == 1) EXPECT_GT(w.plan_info().num_merges, 0) << "round 1's long request was not split";
    EXPECT_EQ(w.plan_info().q_tile_rows, tile_rows);
  }
  cudaGraphExecDestroy(exec);
}

TEST(MlaRuntime, GraphReplaysAfterReplans_sanitize) {
  SKIP_WITHOUT_SM90();
  expect_graph_replays_after_replans(GraphBuffers::kHeads, 2, GraphBuffers::kMaxQ, 64);
  if (HasFatalFailure()) return;
  expect_graph_replays_after_replans(16, 1, 8, 16);  // decode bounds with 16 heads: the narrow tile
}

TEST(MlaRuntime, BadArgumentsAreNamed) {
  const auto inv = tessera::StatusCode::kInvalidArgument;
  tessera::MlaRuntimeBounds bounds{4, 16, 16};
  tessera::MlaRuntimeBounds no_heads = bounds;
  no_heads.num_heads = 0;
  expect_error_any([&] { tessera::BatchMLAPagedWrapper::workspace_size(no_heads); }, {"bounds.num_heads = 0"}, inv);
  tessera::RuntimeOptions tile128;
  tile128.q_tile = tessera::QueryTile::k128;
  expect_error_any([&] { tessera::BatchMLAPagedWrapper::workspace_size(bounds, tile128); }, {"options.q_tile = 128"},
                   inv);
  tessera::RuntimeOptions f32_cache;
  f32_cache.kv_dtype = DType::kF32;
  expect_error_any([&] { tessera::BatchMLAPagedWrapper::workspace_size(bounds, f32_cache); },
                   {"options.kv_dtype = f32"}, inv);

  std::mt19937_64 rng(test_seed());
  const MlaCase c{DType::kBF16, 16, 2, 16, true, {40, 9}};
  MlaRun run = prepare(c, rng, kScale);
  Workspace ws(tessera::BatchMLAPagedWrapper::workspace_size(bounds));
  Workspace small(256);
  expect_error_any([&] { tessera::BatchMLAPagedWrapper(small.view, bounds); }, {"workspace has 256 bytes"}, inv);
  tessera::BatchMLAPagedWrapper w(ws.view, bounds);
  expect_error_any([&] { run_wrapper(w, run); }, {"run() before plan()"}, inv);
  // plan(): bounds, heads, scale, the page table.
  tessera::MlaPlanShape shape = shape_for(c);
  auto plan_with = [&](const tessera::MlaPlanShape& s, int64_t page_size) {
    w.plan(host_i32(run.qo_indptr_host), host_i32(run.kv_indptr_host), host_i32(run.last_page_len_host), page_size, s);
  };
  tessera::MlaPlanShape many_heads = shape;
  many_heads.num_heads = 32;
  expect_error_any([&] { plan_with(many_heads, 16); }, {"shape.num_heads = 32"}, inv);
  tessera::MlaPlanShape no_scale = shape;
  no_scale.sm_scale = 0;
  expect_error_any([&] { plan_with(no_scale, 16); }, {"shape.sm_scale = 0"}, inv);
  expect_error_any([&] { plan_with(shape, 4); }, {"last_page_len[0] = 8"}, inv);  // pages of 16 read as 4
  tessera::MlaPlanShape scaled = shape;
  scaled.kv_scales.k = 0.5;
  expect_error_any([&] { plan_with(scaled, 16); }, {"shape.kv_scales: scales apply to fp8"}, inv);
  tessera::MlaPlanShape f16_cache = shape;
  f16_cache.kv_dtype = DType::kF16;
  expect_error_any([&] { plan_with(f16_cache, 16); }, {"shape.kv_dtype = f16"}, inv);
  tessera::MlaPlanShape fp8_cache = shape;
  fp8_cache.kv_dtype = DType::kE4M3;
  fp8_cache.kv_scales.k = 0.5;
  plan_with(fp8_cache, 16);
  expect_error_any([&] { run_wrapper(w, run); }, {"ckv.dtype = bf16, but the plan was made for a latent cache of e4m3"},
                   inv);
  const std::vector<int32_t> long_qo = {0, 10, 20};
  expect_error_any([&] {
    w.plan(host_i32(long_qo), host_i32(run.kv_indptr_host), host_i32(run.last_page_len_host), 16, shape);
  }, {"exceeding bounds.max_total_qo_tokens"}, inv);
  plan_with(shape, 16);
  // run(): widths, heads, dtype, the page table.
  TensorView narrow = run.q_nope_view;
  narrow.shape[2] = 256;
  expect_error_any([&] { w.run(narrow, run.q_pe_view, run.cache.ckv, run.cache.kpe, run.cache.indices, run.o.view); },
                   {"q_nope.shape[2] = 256"}, inv);
  TensorView bad_kpe = run.cache.kpe;
  bad_kpe.shape[2] = 32;
  expect_error_any([&] { w.run(run.q_nope_view, run.q_pe_view, run.cache.ckv, bad_kpe, run.cache.indices, run.o.view); },
                   {"kpe.shape[2] = 32"}, inv);
  TensorView o_heads = run.o.view;
  o_heads.shape[1] = 8;
  expect_error_any([&] { w.run(run.q_nope_view, run.q_pe_view, run.cache.ckv, run.cache.kpe, run.cache.indices, o_heads); },
                   {"o.shape[1] = 8"}, inv);
  TensorView wrong_page = run.cache.ckv;
  wrong_page.shape[1] = 8;
  expect_error_any([&] { w.run(run.q_nope_view, run.q_pe_view, wrong_page, run.cache.kpe, run.cache.indices, run.o.view); },
                   {"ckv.shape[1] = 8"}, inv);
  TensorView few_ids = run.cache.indices;
  few_ids.shape[0] = 1;
  expect_error_any([&] { w.run(run.q_nope_view, run.q_pe_view, run.cache.ckv, run.cache.kpe, few_ids, run.o.view); },
                   {"kv_indices has 1 entries"}, inv);
  if (device_has_wgmma()) {
    tessera::set_checked_mode(true);
    const std::vector<int32_t> bad = {0, 1, 2, 999};
    DeviceBuffer bad_ids = upload_i32(bad);
    expect_error_any([&] {
      w.run(run.q_nope_view, run.q_pe_view, run.cache.ckv, run.cache.kpe, i32_view(bad_ids, 4), run.o.view);
    }, {"kv_indices[3] = 999"}, inv);
    tessera::set_checked_mode(false);
  } else {
    expect_error_any([&] { run_wrapper(w, run); }, {"sm_90"}, tessera::StatusCode::kUnsupported);
  }
  // CUDA graphs: what the captured launch bakes in may not change.
  tessera::RuntimeOptions graph;
  graph.cuda_graph = true;
  Workspace gws(tessera::BatchMLAPagedWrapper::workspace_size(bounds, graph));
  tessera::BatchMLAPagedWrapper gw(gws.view, bounds, graph);
  gw.plan(host_i32(run.qo_indptr_host), host_i32(run.kv_indptr_host), host_i32(run.last_page_len_host), 16, shape);
  tessera::MlaPlanShape other_scale = shape;
  other_scale.sm_scale = 0.5;
  expect_error_any([&] {
    gw.plan(host_i32(run.qo_indptr_host), host_i32(run.kv_indptr_host), host_i32(run.last_page_len_host), 16,
            other_scale);
  }, {"cuda_graph: this plan changes"}, inv);
  tessera::MlaPlanShape f16 = shape;
  f16.dtype = DType::kF16;
  expect_error_any([&] {
    gw.plan(host_i32(run.qo_indptr_host), host_i32(run.kv_indptr_host), host_i32(run.last_page_len_host), 16, f16);
  }, {"options.dtype"}, inv);
  expect_error_any([&] {
    gw.plan(host_i32(run.qo_indptr_host), host_i32(run.kv_indptr_host), host_i32(run.last_page_len_host), 16,
            fp8_cache);
  }, {"cuda_graph: shape.kv_dtype = e4m3"}, inv);
  tessera::RuntimeOptions graph_fp8 = graph;
  graph_fp8.kv_dtype = DType::kE4M3;
  Workspace g8ws(tessera::BatchMLAPagedWrapper::workspace_size(bounds, graph_fp8));
  tessera::BatchMLAPagedWrapper g8(g8ws.view, bounds, graph_fp8);
  g8.plan(host_i32(run.qo_indptr_host), host_i32(run.kv_indptr_host), host_i32(run.last_page_len_host), 16, fp8_cache);
  tessera::MlaPlanShape other_kv_scale = fp8_cache;
  other_kv_scale.kv_scales.v = 3.0;
  expect_error_any([&] {
    g8.plan(host_i32(run.qo_indptr_host), host_i32(run.kv_indptr_host), host_i32(run.last_page_len_host), 16,
            other_kv_scale);
  }, {"cuda_graph: this plan changes shape.kv_scales"}, inv);
  expect_error_any([&] { run_wrapper(gw, run); }, {"bounds.max_total_qo_tokens"}, inv);
}

}  // namespace
