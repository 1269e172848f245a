// GPU tests of BatchCascadePagedWrapper (include/tessera/runtime.h): shared-prefix attention in 1
// to 3 levels against the fp64 oracle (each level's state by the paged oracle over the level's
// groups, merged in level order: tests/reference/oracle.h §4), requests with and without a shared
// prefix in one batch, prefixes from 0 to 32k keys, decode and causal prefill; bit-identical
// repeated runs; a CUDA Graph replayed after re-plans; named errors. Fresh random inputs, outputs
// poisoned (NaN).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "gpu/runtime/runtime_test_utils.h"
#include "reference/oracle.h"
#include "tessera/runtime.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::Layout;
using tessera::SplitKV;
using tessera::StatusCode;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

/// One level: contiguous groups of requests (group_end[i]: one past the last request of group i)
/// and each group's KV length. The last level has one group per request.
struct LevelSpec {
  std::vector<int64_t> group_end;
  std::vector<int64_t> kv;
};

struct CascadeCase {
  std::string name;
  std::vector<int64_t> qo;         // query rows per request
  std::vector<LevelSpec> levels;   // outermost first
  int64_t num_kv_heads = 2, group = 4, head_dim = 128, page_size = 16;
  DType dtype = DType::kBF16;
  Layout layout = Layout::kNHD;
  bool causal = false;
  double soft_cap = 0.0;
  Fp8KV fp8 = Fp8KV::kNone;
  SplitKV split = SplitKV::kAuto;

  int64_t num_qo_heads() const { return num_kv_heads * group; }
  DType kv_dtype() const { return fp8 == Fp8KV::kE4M3 ? DType::kE4M3 : fp8 == Fp8KV::kE5M2 ? DType::kE5M2 : dtype; }
};

void PrintTo(const CascadeCase& c, std::ostream* os) { *os << c.name; }

constexpr double kFp8KScale = 5.0 / 64, kFp8VScale = 3.0 / 64;

/// A level of one group per request with these lengths.
LevelSpec per_request(const std::vector<int64_t>& kv) {
  LevelSpec l;
  for (size_t b = 0; b < kv.size(); ++b) l.group_end.push_back(static_cast<int64_t>(b) + 1);
  l.kv = kv;
  return l;
}

/// Random lengths in [lo, hi].
std::vector<int64_t> random_lengths(size_t n, int64_t lo, int64_t hi, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> len(lo, hi);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = len(rng);
  return v;
}

/// Inputs, oracle and device copies of one case: one page pool holds every (level, group)
/// sequence; level i's page table is its slice of the pool's table.
struct PreparedCascade {
  tessera_ref::State ref;
  std::vector<std::vector<int32_t>> qo_indptr, kv_indptr, last_page_len;  // per level, host
  std::vector<DeviceBuffer> indices;                                       // per level
  std::vector<tessera::PagedKVCache> caches;                               // per level
  DeviceTensor q, o, lse;
  DevicePaged pool;
  int64_t rows = 0;
};

PreparedCascade prepare(const CascadeCase& c, std::mt19937_64& rng) {
  PreparedCascade p;
  const int64_t hq = c.num_qo_heads(), hkv = c.num_kv_heads, d = c.head_dim;
  const tessera_ref::HeadConfig heads{hq, hkv, d};
  std::vector<std::vector<double>> qs(c.qo.size());
  for (size_t b = 0; b < c.qo.size(); ++b) qs[b] = round_to(c.dtype, random_normal(c.qo[b] * hq * d, rng));
  const Packed q = pack_rows(qs, hq * d);
  p.rows = q.indptr.back();

  // Every level's groups, one after another, as the pool's "requests".
  std::vector<std::vector<double>> ks, vs, k_store, v_store;
  std::vector<int64_t> lens;
  for (const LevelSpec& l : c.levels) {
    for (const int64_t len : l.kv) {
      for (auto* pair : {&ks, &vs}) {
        std::vector<double> stored;
        if (c.fp8 == Fp8KV::kNone) {
          stored = round_to(c.dtype, random_normal(len * hkv * d, rng));
          pair->push_back(stored);
        } else {
          stored = round_to(c.kv_dtype(), random_normal(len * hkv * d, rng, 16.0));
          std::vector<double> values = stored;
          for (double& x : values) x *= pair == &ks ? kFp8KScale : kFp8VScale;
          pair->push_back(values);
        }
        (pair == &ks ? k_store : v_store).push_back(stored);
      }
      lens.push_back(len);
    }
  }
  const uint64_t page_seed = rng() | 1;
  const auto pool = tessera_ref::build_paged(ks, vs, lens, hkv, d, c.page_size, ref_layout(c.layout), page_seed, 2, 0.0);
  const auto stored = tessera_ref::build_paged(k_store, v_store, lens, hkv, d, c.page_size, ref_layout(c.layout),
                                               page_seed, 2, 0.0);
  p.pool = upload_paged(c.kv_dtype(), stored, c.layout, /*combined=*/false);

  tessera_ref::Options opts;
  opts.logits_soft_cap = c.soft_cap;
  std::vector<tessera_ref::State> states;
  size_t first_group = 0;
  for (size_t i = 0; i < c.levels.size(); ++i) {
    const LevelSpec& l = c.levels[i];
    const size_t groups = l.kv.size();
    std::vector<int32_t> qo_indptr{0};
    for (const int64_t end : l.group_end) qo_indptr.push_back(q.indptr[end]);
    tessera_ref::PagedCache level = pool;  // the level's slice of the pool's table
    const int32_t base = pool.indptr[first_group];
    level.indptr.assign(pool.indptr.begin() + first_group, pool.indptr.begin() + first_group + groups + 1);
    for (auto& x : level.indptr) x -= base;
    level.indices.assign(pool.indices.begin() + base, pool.indices.begin() + pool.indptr[first_group + groups]);
    level.last_page_len.assign(pool.last_page_len.begin() + first_group,
                               pool.last_page_len.begin() + first_group + groups);
    opts.causal = c.causal && i + 1 == c.levels.size();  // causal is the last level's only
    states.push_back(tessera_ref::attention_paged(q.values, qo_indptr, level, heads, opts));
    p.qo_indptr.push_back(qo_indptr);
    p.kv_indptr.push_back(level.indptr);
    p.last_page_len.push_back(level.last_page_len);
    p.indices.push_back(upload_i32(level.indices.empty() ? std::vector<int32_t>{0} : level.indices));
    tessera::PagedKVCache cache;
    cache.k = p.pool.view.k;
    cache.v = p.pool.view.v;
    cache.layout = c.layout;
    cache.indices = i32_view(p.indices.back(), std::max<int64_t>(1, static_cast<int64_t>(level.indices.size())));
    p.caches.push_back(cache);
    first_group += groups;
  }
  p.ref = tessera_ref::merge_levels(states);
  p.q = upload_tensor(c.dtype, q.values, {p.rows, hq, d});
  p.o = make_output(c.dtype, {p.rows, hq, d});
  p.lse = make_output(DType::kF32, {p.rows, hq});
  return p;
}

tessera::RuntimeBounds cascade_bounds(const CascadeCase& c, int64_t rows) {
  int64_t groups = 0;
  for (const LevelSpec& l : c.levels) groups = std::max<int64_t>(groups, static_cast<int64_t>(l.kv.size()));
  return tessera::RuntimeBounds{groups + 1, rows + 1, c.num_qo_heads(), c.num_kv_heads, c.head_dim};
}

tessera::PlanShape cascade_shape(const CascadeCase& c) {
  tessera::PlanShape s;
  s.num_qo_heads = c.num_qo_heads();
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  s.dtype = c.dtype;
  s.attention.causal = c.causal;
  s.attention.variant.logits_soft_cap = c.soft_cap;
  if (c.fp8 != Fp8KV::kNone) {
    s.kv_dtype = c.kv_dtype();
    s.attention.kv_scales.k = kFp8KScale;
    s.attention.kv_scales.v = kFp8VScale;
  }
  return s;
}

std::vector<tessera::CascadeLevel> level_views(const PreparedCascade& p) {
  std::vector<tessera::CascadeLevel> levels;
  for (size_t i = 0; i < p.qo_indptr.size(); ++i) {
    levels.push_back({host_i32(p.qo_indptr[i]), host_i32(p.kv_indptr[i]), host_i32(p.last_page_len[i])});
  }
  return levels;
}

/// Builds, plans and runs a wrapper for the case; checks against the oracle.
void run_case(const CascadeCase& c, std::mt19937_64& rng) {
  PreparedCascade p = prepare(c, rng);
  tessera::RuntimeOptions options;
  options.split_kv = c.split;
  const tessera::RuntimeBounds bounds = cascade_bounds(c, p.rows);
  const auto num_levels = static_cast<int64_t>(c.levels.size());
  Workspace ws(tessera::BatchCascadePagedWrapper::workspace_size(num_levels, bounds, options));
  tessera::BatchCascadePagedWrapper w(ws.view, num_levels, bounds, options);
  w.plan(level_views(p), c.page_size, cascade_shape(c));
  w.run(p.q.view, p.caches, p.o.view, p.lse.view);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  std::string info;
  for (int64_t i = 0; i < num_levels; ++i) {
    info += " level " + std::to_string(i) + ": tile " + std::to_string(w.plan_info(i).q_tile_rows) + ", partials " +
            std::to_string(w.plan_info(i).num_partials) + ";";
  }
  SCOPED_TRACE(info);
  const std::vector<double> o = read_tensor(p.o), lse = read_tensor(p.lse);
  expect_matches_oracle(c.dtype, o, &lse, p.ref, c.name);
}

class CascadeRuntimeTest : public ::testing::TestWithParam<CascadeCase> {};

std::vector<CascadeCase> cascade_cases() {
  std::mt19937_64 rng(20261127);  // the case shapes only; the values are fresh per run
  std::vector<CascadeCase> cases;
  auto add = [&](CascadeCase c) { cases.push_back(std::move(c)); };
  {  // decode: one prefix shared by the batch, then each request's own pages
    CascadeCase c;
    c.name = "decode_B16_prefix1000";
    c.qo.assign(16, 1);
    c.levels = {{{16}, {1000}}, per_request(random_lengths(16, 1, 200, rng))};
    add(c);
  }
  {  // requests with and without a shared prefix in one batch (a group of prefix 0), GQA 8, f16
    CascadeCase c;
    c.name = "decode_B12_mixed_prefixes_g8_f16";
    c.qo.assign(12, 1);
    c.group = 8;
    c.num_kv_heads = 1;
    c.dtype = DType::kF16;
    c.levels = {{{5, 8, 12}, {513, 0, 77}}, per_request(random_lengths(12, 0, 90, rng))};
    add(c);
  }
  {  // a 32k prefix over 8 decodes: the shared level splits over the grid
    CascadeCase c;
    c.name = "decode_B8_prefix32k";
    c.qo.assign(8, 1);
    c.levels = {{{8}, {32768}}, per_request(random_lengths(8, 1, 300, rng))};
    add(c);
  }
  {  // three levels: a system prompt, two conversation prefixes, own pages; page size 1, HND
    CascadeCase c;
    c.name = "decode_B10_three_levels_page1_hnd";
    c.qo.assign(10, 1);
    c.page_size = 1;
    c.layout = Layout::kHND;
    c.levels = {{{10}, {300}}, {{4, 10}, {129, 0}}, per_request(random_lengths(10, 1, 40, rng))};
    add(c);
  }
  {  // causal prefill / append under a shared prefix (causal on the last level only)
    CascadeCase c;
    c.name = "prefill_B5_causal_prefix2000";
    c.qo = {37, 1, 64, 5, 129};
    c.causal = true;
    std::vector<int64_t> own(5);
    for (size_t b = 0; b < 5; ++b) own[b] = c.qo[b] + static_cast<int64_t>(rng() % 50);
    c.levels = {{{5}, {2000}}, per_request(own)};
    add(c);
  }
  {  // parallel sampling: 4 requests of 16 rows sharing a 4k prompt, GQA 1, head dim 64
    CascadeCase c;
    c.name = "prefill_B4_prefix4096_g1_d64";
    c.qo.assign(4, 16);
    c.group = 1;
    c.num_kv_heads = 4;
    c.head_dim = 64;
    c.levels = {{{4}, {4096}}, per_request(random_lengths(4, 16, 60, rng))};
    add(c);
  }
  {  // head dim 256, soft-cap
    CascadeCase c;
    c.name = "decode_B6_prefix700_d256_softcap";
    c.qo.assign(6, 1);
    c.head_dim = 256;
    c.soft_cap = 30.0;
    c.levels = {{{6}, {700}}, per_request(random_lengths(6, 1, 100, rng))};
    add(c);
  }
  {  // fp8 (e4m3) KV in every level
    CascadeCase c;
    c.name = "decode_B9_prefix1500_kve4m3";
    c.qo.assign(9, 1);
    c.fp8 = Fp8KV::kE4M3;
    c.levels = {{{9}, {1500}}, per_request(random_lengths(9, 1, 120, rng))};
    add(c);
  }
  {  // one level: plain paged prefill through the cascade
    CascadeCase c;
    c.name = "one_level_B3";
    c.qo = {3, 1, 20};
    c.causal = true;
    c.levels = {per_request({40, 9, 20})};
    add(c);
  }
  {  // empty levels: no request has a prefix; no-split plans
    CascadeCase c;
    c.name = "decode_B7_prefix0_nosplit";
    c.qo.assign(7, 1);
    c.split = SplitKV::kNone;
    c.levels = {{{7}, {0}}, per_request(random_lengths(7, 1, 500, rng))};
    add(c);
  }
  return cases;
}

TEST_P(CascadeRuntimeTest, MatchesOracle) {
  std::mt19937_64 rng(test_seed());
  run_case(GetParam(), rng);
}

INSTANTIATE_TEST_SUITE_P(Cascade, CascadeRuntimeTest, ::testing::ValuesIn(cascade_cases()),
                         [](const ::testing::TestParamInfo<CascadeCase>& info) { return info.param.name; });

TEST(CascadeRuntime, TenRunsAreBitIdentical_sanitize) {
  std::mt19937_64 rng(test_seed());
  CascadeCase c;
  c.qo.assign(6, 1);
  c.levels = {{{6}, {3000}}, per_request(random_lengths(6, 1, 300, rng))};
  PreparedCascade p = prepare(c, rng);
  const tessera::RuntimeBounds bounds = cascade_bounds(c, p.rows);
  Workspace ws(tessera::BatchCascadePagedWrapper::workspace_size(2, bounds));
  tessera::BatchCascadePagedWrapper w(ws.view, 2, bounds);
  w.plan(level_views(p), c.page_size, cascade_shape(c));
  std::vector<unsigned char> first;
  for (int i = 0; i < 10; ++i) {
    w.run(p.q.view, p.caches, p.o.view, p.lse.view);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    std::vector<unsigned char> bytes = read_bytes(p.o), l = read_bytes(p.lse);
    bytes.insert(bytes.end(), l.begin(), l.end());
    if (i == 0) first = bytes;
    ASSERT_EQ(bytes, first) << "run " << i;
  }
  expect_matches_oracle(c.dtype, read_tensor(p.o), nullptr, p.ref, "ten runs");
}

// A graph captured once replays correctly after re-plans that change the batch, the groups and the
// prefix lengths; q, o, lse, the pool and every level's page table live in fixed buffers.
TEST(CascadeRuntime, CudaGraphReplaysAfterReplans_sanitize) {
  const int64_t hkv = 2, g = 4, d = 128, page = 16, max_batch = 24, max_pages = 4096;
  const int64_t hq = hkv * g;
  const DType dtype = DType::kBF16;
  const tessera::RuntimeBounds bounds{max_batch, max_batch, hq, hkv, d};
  tessera::RuntimeOptions options;
  options.cuda_graph = true;
  options.dtype = dtype;
  Workspace ws(tessera::BatchCascadePagedWrapper::workspace_size(2, bounds, options));
  tessera::BatchCascadePagedWrapper w(ws.view, 2, bounds, options);
  DeviceBuffer q_buf(max_batch * hq * d * 2), o_buf(max_batch * hq * d * 2), lse_buf(max_batch * hq * 4);
  DeviceBuffer k_buf(max_pages * page * hkv * d * 2), v_buf(max_pages * page * hkv * d * 2);
  std::vector<DeviceBuffer> idx_buf;
  idx_buf.emplace_back(max_pages * 4);
  idx_buf.emplace_back(max_pages * 4);
  const TensorView q(q_buf.get(), dtype, {max_batch, hq, d}, Device::cuda(0));
  const TensorView o(o_buf.get(), dtype, {max_batch, hq, d}, Device::cuda(0));
  const TensorView lse(lse_buf.get(), DType::kF32, {max_batch, hq}, Device::cuda(0));
  std::vector<tessera::PagedKVCache> caches(2);
  for (int i = 0; i < 2; ++i) {
    caches[i].k = TensorView(k_buf.get(), dtype, {max_pages, page, hkv, d}, Device::cuda(0));
    caches[i].v = TensorView(v_buf.get(), dtype, {max_pages, page, hkv, d}, Device::cuda(0));
    caches[i].indices = TensorView(idx_buf[i].get(), DType::kI32, {max_pages}, Device::cuda(0));
  }
  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(test_seed());
  cudaGraphExec_t exec = nullptr;
  const std::vector<int64_t> batches = {5, 24, 1, 13};
  const std::vector<int64_t> prefixes = {700, 9000, 0, 2500};
  for (size_t step = 0; step < batches.size(); ++step) {
    CascadeCase c;
    c.num_kv_heads = hkv;
    c.group = g;
    c.qo.assign(batches[step], 1);
    const auto b = batches[step];
    // Two shared groups from step 1 on: the first half of the batch and the rest.
    if (step % 2 == 1 && b > 1) {
      c.levels = {{{b / 2, b}, {prefixes[step], prefixes[step] / 3}}, per_request(random_lengths(b, 1, 400, rng))};
    } else {
      c.levels = {{{b}, {prefixes[step]}}, per_request(random_lengths(b, 1, 400, rng))};
    }
    PreparedCascade p = prepare(c, rng);
    ASSERT_LE(p.pool.view.k.shape[0], max_pages);
    // Copy this step's inputs into the fixed buffers.
    ASSERT_CUDA_OK(cudaMemcpy(q_buf.get(), p.q.view.data, p.q.view.nbytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(k_buf.get(), p.pool.view.k.data, p.pool.view.k.nbytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(v_buf.get(), p.pool.view.v.data, p.pool.view.v.nbytes(), cudaMemcpyDeviceToDevice));
    for (int i = 0; i < 2; ++i) {
      ASSERT_CUDA_OK(cudaMemcpy(idx_buf[i].get(), p.indices[i].get(), p.indices[i].bytes(), cudaMemcpyDeviceToDevice));
    }
    ASSERT_CUDA_OK(cudaMemset(o_buf.get(), 0xFF, o_buf.bytes()));
    ASSERT_CUDA_OK(cudaMemset(lse_buf.get(), 0xFF, lse_buf.bytes()));
    w.plan(level_views(p), page, cascade_shape(c), stream);
    if (exec == nullptr) {
      cudaGraph_t graph;
      ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      w.run(q, caches, o, lse, stream);
      ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
      ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      ASSERT_CUDA_OK(cudaGraphDestroy(graph));
    }
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    const auto o_host = download_as(dtype, o_buf.get(), p.rows * hq * d);
    const auto lse_host = download_as(DType::kF32, lse_buf.get(), p.rows * hq);
    SCOPED_TRACE("step " + std::to_string(step) + ", batch " + std::to_string(b) + ", shared tile " +
                 std::to_string(w.plan_info(0).q_tile_rows) + ", shared partials " +
                 std::to_string(w.plan_info(0).num_partials));
    expect_matches_oracle(dtype, o_host, &lse_host, p.ref, "cascade graph replay");
  }
  ASSERT_CUDA_OK(cudaGraphExecDestroy(exec));
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

TEST(CascadeRuntime, ErrorsNameTheArgument) {
  std::mt19937_64 rng(test_seed());
  CascadeCase c;
  c.qo.assign(4, 1);
  c.levels = {{{4}, {100}}, per_request({5, 6, 7, 8})};
  PreparedCascade p = prepare(c, rng);
  const tessera::RuntimeBounds bounds = cascade_bounds(c, p.rows);
  expect_error_any([&] { tessera::BatchCascadePagedWrapper::workspace_size(0, bounds); }, {"num_levels = 0"},
                   StatusCode::kInvalidArgument);
  Workspace ws(tessera::BatchCascadePagedWrapper::workspace_size(2, bounds));
  tessera::BatchCascadePagedWrapper w(ws.view, 2, bounds);
  expect_error_any([&] { w.run(p.q.view, p.caches, p.o.view, p.lse.view); }, {"run() before plan()"},
                   StatusCode::kInvalidArgument);
  std::vector<tessera::CascadeLevel> levels = level_views(p);
  expect_error_any([&] { w.plan({levels[0]}, c.page_size, cascade_shape(c)); }, {"levels has 1 entries"},
                   StatusCode::kInvalidArgument);
  // A level that misses a row.
  std::vector<int32_t> short_qo{0, 3};
  levels[0].qo_indptr = host_i32(short_qo);
  expect_error_any([&] { w.plan(levels, c.page_size, cascade_shape(c)); }, {"levels[1]: qo_indptr ends at 4"},
                   StatusCode::kInvalidArgument);
  levels = level_views(p);
  // An error inside a level's plan names the level.
  std::vector<int32_t> bad_last(p.last_page_len[1]);
  bad_last[2] = 17;
  levels[1].last_page_len = host_i32(bad_last);
  expect_error_any([&] { w.plan(levels, c.page_size, cascade_shape(c)); }, {"levels[1]: last_page_len[2] = 17"},
                   StatusCode::kInvalidArgument);
  levels = level_views(p);
  tessera::PlanShape window = cascade_shape(c);
  window.attention.variant.window_left = 64;
  expect_error_any([&] { w.plan(levels, c.page_size, window); }, {"window_left"}, StatusCode::kUnsupported);
  w.plan(levels, c.page_size, cascade_shape(c));
  expect_error_any([&] { w.run(p.q.view, {p.caches[0]}, p.o.view, p.lse.view); }, {"kv has 1 caches"},
                   StatusCode::kInvalidArgument);
  expect_error_any([&] { (void)w.plan_info(2); }, {"level = 2"}, StatusCode::kInvalidArgument);
  // A bad tensor inside a level's run is named with the level.
  tessera::PagedKVCache bad = p.caches[1];
  bad.indices = TensorView();
  expect_error_any([&] { w.run(p.q.view, {p.caches[0], bad}, p.o.view, p.lse.view); }, {"levels[1]:"},
                   StatusCode::kInvalidArgument);
}

}  // namespace
