// GPU tests of BatchPODPagedWrapper (include/tessera/runtime.h): mixed batches of prefill chunks
// and decode requests of random composition in one POD launch, against the fp64 paged oracle
// over the whole batch (the oracle knows nothing of the two sides); page sizes 1 and 16, NHD and
// HND, causal or not, GQA groups 1 to 8, head dims 64 to 256, batches of one kind only, zero-length
// requests, forced divisions of the SMs; bit-identical repeated runs; a CUDA Graph replayed after
// re-plans that change the mix; named errors. Fresh random inputs, outputs poisoned (NaN).
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

struct PodCase {
  std::string name;
  std::vector<int64_t> qo, kv;  // per request
  int64_t num_kv_heads = 2, group = 4, head_dim = 128, page_size = 16;
  DType dtype = DType::kBF16;
  Layout layout = Layout::kNHD;
  bool causal = true;
  int64_t decode_sms = 0;
  SplitKV split = SplitKV::kAuto;

  int64_t num_qo_heads() const { return num_kv_heads * group; }
};

void PrintTo(const PodCase& c, std::ostream* os) { *os << c.name; }

struct PreparedPod {
  tessera_ref::State ref;
  std::vector<int32_t> qo_indptr, kv_indptr, last_page_len;
  DevicePaged paged;
  tessera::PagedKVCache cache;
  DeviceTensor q, o, lse;
  int64_t rows = 0;
};

PreparedPod prepare(const PodCase& c, std::mt19937_64& rng) {
  PreparedPod p;
  const int64_t hq = c.num_qo_heads(), hkv = c.num_kv_heads, d = c.head_dim;
  std::vector<std::vector<double>> qs(c.qo.size()), ks(c.qo.size()), vs(c.qo.size());
  for (size_t b = 0; b < c.qo.size(); ++b) {
    qs[b] = round_to(c.dtype, random_normal(c.qo[b] * hq * d, rng));
    ks[b] = round_to(c.dtype, random_normal(c.kv[b] * hkv * d, rng));
    vs[b] = round_to(c.dtype, random_normal(c.kv[b] * hkv * d, rng));
  }
  const Packed q = pack_rows(qs, hq * d);
  p.qo_indptr = q.indptr;
  p.rows = q.indptr.back();
  const tessera_ref::PagedCache cache =
      tessera_ref::build_paged(ks, vs, c.kv, hkv, d, c.page_size, ref_layout(c.layout), rng() | 1, 3, 0.0);
  tessera_ref::Options opts;
  opts.causal = c.causal;
  p.ref = tessera_ref::attention_paged(q.values, q.indptr, cache, {hq, hkv, d}, opts);
  p.paged = upload_paged(c.dtype, cache, c.layout, /*combined=*/c.page_size == 1);
  p.kv_indptr = cache.indptr;
  p.last_page_len = cache.last_page_len;
  p.cache = tessera::PagedKVCache{p.paged.view.k, p.paged.view.v, c.layout, p.paged.view.indices};
  p.q = upload_tensor(c.dtype, q.values, {std::max<int64_t>(p.rows, 1), hq, d});
  p.o = make_output(c.dtype, {std::max<int64_t>(p.rows, 1), hq, d});
  p.lse = make_output(DType::kF32, {std::max<int64_t>(p.rows, 1), hq});
  return p;
}

tessera::RuntimeBounds bounds_for(const PodCase& c, int64_t rows) {
  return tessera::RuntimeBounds{static_cast<int64_t>(c.qo.size()) + 1, rows + 1, c.num_qo_heads(), c.num_kv_heads,
                                c.head_dim};
}

tessera::PlanShape shape_for(const PodCase& c) {
  tessera::PlanShape s;
  s.num_qo_heads = c.num_qo_heads();
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  s.dtype = c.dtype;
  s.attention.causal = c.causal;
  return s;
}

tessera::PodOptions options_for(const PodCase& c) {
  tessera::PodOptions o;
  o.decode_sms = c.decode_sms;
  o.split_kv = c.split;
  return o;
}

std::string describe(const tessera::PodPlanInfo& info) {
  return "prefill requests " + std::to_string(info.num_prefill_requests) + " on " + std::to_string(info.prefill_ctas) +
         " CTAs (tile " + std::to_string(info.prefill.q_tile_rows) + ", partials " +
         std::to_string(info.prefill.num_partials) + "), decode requests " + std::to_string(info.num_decode_requests) +
         " on " + std::to_string(info.decode_ctas) + " CTAs (tile " + std::to_string(info.decode.q_tile_rows) +
         ", partials " + std::to_string(info.decode.num_partials) + ")";
}

void run_case(const PodCase& c, std::mt19937_64& rng) {
  PreparedPod p = prepare(c, rng);
  const tessera::RuntimeBounds bounds = bounds_for(c, p.rows);
  const tessera::PodOptions options = options_for(c);
  Workspace ws(tessera::BatchPODPagedWrapper::workspace_size(bounds, options));
  tessera::BatchPODPagedWrapper w(ws.view, bounds, options);
  w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), host_i32(p.last_page_len), c.page_size, shape_for(c));
  w.run(p.q.view, p.cache, p.o.view, p.lse.view);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  SCOPED_TRACE(describe(w.plan_info()));
  const std::vector<double> o = read_tensor(p.o), lse = read_tensor(p.lse);
  std::vector<double> o_rows(o.begin(), o.begin() + p.rows * c.num_qo_heads() * c.head_dim);
  std::vector<double> lse_rows(lse.begin(), lse.begin() + p.rows * c.num_qo_heads());
  expect_matches_oracle(c.dtype, o_rows, &lse_rows, p.ref, c.name);
}

/// A random mix: `prefills` chunks of 17 to max_chunk rows and `decodes` requests of 1 to 3
/// tokens (speculative verification) or 1, KV lengths up to max_kv.
PodCase random_mix(const std::string& name, int prefills, int decodes, int64_t max_chunk, int64_t max_kv,
                   std::mt19937_64& rng) {
  PodCase c;
  c.name = name;
  std::uniform_int_distribution<int64_t> chunk(17, max_chunk), kv(1, max_kv), spec(1, 3);
  for (int i = 0; i < prefills + decodes; ++i) {
    const bool prefill = i < prefills;
    c.qo.push_back(prefill ? chunk(rng) : (rng() % 2 == 0 ? 1 : spec(rng)));
    c.kv.push_back(c.qo.back() + kv(rng));
  }
  std::shuffle(c.qo.begin(), c.qo.end(), rng);  // the KV lengths stay >= qo only if shuffled together
  for (size_t b = 0; b < c.qo.size(); ++b) c.kv[b] = std::max(c.kv[b], c.qo[b]);
  return c;
}

class PodRuntimeTest : public ::testing::TestWithParam<PodCase> {};

std::vector<PodCase> pod_cases() {
  std::mt19937_64 rng(20261127);  // the case shapes only; the values are fresh per run
  std::vector<PodCase> cases;
  cases.push_back(random_mix("mix_P2_D30_causal", 2, 30, 700, 3000, rng));
  {
    PodCase c = random_mix("mix_P1_D64_page1_hnd", 1, 64, 300, 900, rng);
    c.page_size = 1;
    c.layout = Layout::kHND;
    cases.push_back(c);
  }
  {
    PodCase c = random_mix("mix_P3_D12_noncausal_g1_f16", 3, 12, 257, 1200, rng);
    c.causal = false;
    c.group = 1;
    c.num_kv_heads = 4;
    c.dtype = DType::kF16;
    cases.push_back(c);
  }
  {
    PodCase c = random_mix("mix_P2_D9_g8_d64", 2, 9, 200, 2000, rng);
    c.group = 8;
    c.num_kv_heads = 1;
    c.head_dim = 64;
    cases.push_back(c);
  }
  {
    PodCase c = random_mix("mix_P2_D10_d96", 2, 10, 150, 800, rng);
    c.head_dim = 96;
    cases.push_back(c);
  }
  {
    PodCase c = random_mix("mix_P1_D7_d256", 1, 7, 160, 600, rng);
    c.head_dim = 256;
    cases.push_back(c);
  }
  {  // decode requests that need the split (one long KV), with zero-length requests in between
    PodCase c;
    c.name = "mix_long_decode_and_empty";
    c.qo = {1, 0, 300, 2, 0, 1};
    c.kv = {30000, 0, 450, 17, 5, 1};
    cases.push_back(c);
  }
  {  // decodes only, prefills only
    PodCase c = random_mix("decodes_only_B40", 0, 40, 1, 4000, rng);
    cases.push_back(c);
    PodCase d = random_mix("prefills_only_B3", 3, 0, 600, 700, rng);
    cases.push_back(d);
  }
  {  // a forced division of the SMs, and no split
    PodCase c = random_mix("mix_P1_D20_decode_sms_40_nosplit", 1, 20, 512, 2500, rng);
    c.decode_sms = 40;
    c.split = SplitKV::kNone;
    cases.push_back(c);
  }
  return cases;
}

TEST_P(PodRuntimeTest, MatchesOracle) {
  std::mt19937_64 rng(test_seed());
  run_case(GetParam(), rng);
}

INSTANTIATE_TEST_SUITE_P(Pod, PodRuntimeTest, ::testing::ValuesIn(pod_cases()),
                         [](const ::testing::TestParamInfo<PodCase>& info) { return info.param.name; });

// The prefill side's wgmma tile and the decode side's 16-row tile both split their long requests;
// ten runs give the same bits.
TEST(PodRuntime, TenRunsAreBitIdentical_sanitize) {
  std::mt19937_64 rng(test_seed());
  PodCase c;
  c.qo = {1, 600, 1, 2, 1};
  c.kv = {9000, 5000, 40, 3000, 700};
  PreparedPod p = prepare(c, rng);
  const tessera::RuntimeBounds bounds = bounds_for(c, p.rows);
  Workspace ws(tessera::BatchPODPagedWrapper::workspace_size(bounds));
  tessera::BatchPODPagedWrapper w(ws.view, bounds);
  w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), host_i32(p.last_page_len), c.page_size, shape_for(c));
  EXPECT_EQ(w.plan_info().num_prefill_requests, 1);
  EXPECT_EQ(w.plan_info().num_decode_requests, 4);
  std::vector<unsigned char> first;
  for (int i = 0; i < 10; ++i) {
    w.run(p.q.view, p.cache, p.o.view, p.lse.view);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    std::vector<unsigned char> bytes = read_bytes(p.o), l = read_bytes(p.lse);
    bytes.insert(bytes.end(), l.begin(), l.end());
    if (i == 0) first = bytes;
    ASSERT_EQ(bytes, first) << "run " << i;
  }
  SCOPED_TRACE(describe(w.plan_info()));
  expect_matches_oracle(c.dtype, read_tensor(p.o), nullptr, p.ref, "ten runs");
}

// A graph captured once replays correctly after re-plans that change the batch and its mix
// (decodes only, prefills only, both); q, o, lse, the pool and the page table live in fixed
// buffers.
TEST(PodRuntime, CudaGraphReplaysAfterReplans_sanitize) {
  const int64_t hkv = 2, g = 4, d = 128, page = 16, max_batch = 24, max_rows = 1024, max_pages = 2048;
  const int64_t hq = hkv * g;
  const DType dtype = DType::kBF16;
  const tessera::RuntimeBounds bounds{max_batch, max_rows, hq, hkv, d};
  tessera::PodOptions options;
  options.cuda_graph = true;
  options.dtype = dtype;
  Workspace ws(tessera::BatchPODPagedWrapper::workspace_size(bounds, options));
  tessera::BatchPODPagedWrapper w(ws.view, bounds, options);
  DeviceBuffer q_buf(max_rows * hq * d * 2), o_buf(max_rows * hq * d * 2), lse_buf(max_rows * hq * 4);
  DeviceBuffer k_buf(max_pages * page * hkv * d * 2), v_buf(max_pages * page * hkv * d * 2), idx_buf(max_pages * 4);
  const TensorView q(q_buf.get(), dtype, {max_rows, hq, d}, Device::cuda(0));
  const TensorView o(o_buf.get(), dtype, {max_rows, hq, d}, Device::cuda(0));
  const TensorView lse(lse_buf.get(), DType::kF32, {max_rows, hq}, Device::cuda(0));
  tessera::PagedKVCache cache;
  cache.k = TensorView(k_buf.get(), dtype, {max_pages, page, hkv, d}, Device::cuda(0));
  cache.v = TensorView(v_buf.get(), dtype, {max_pages, page, hkv, d}, Device::cuda(0));
  cache.indices = TensorView(idx_buf.get(), DType::kI32, {max_pages}, Device::cuda(0));
  Stream stream;
  std::mt19937_64 rng(test_seed());
  cudaGraphExec_t exec = nullptr;
  const std::vector<std::pair<int, int>> mixes = {{1, 12}, {0, 24}, {2, 0}, {3, 17}};
  for (size_t step = 0; step < mixes.size(); ++step) {
    PodCase c = random_mix("graph", mixes[step].first, mixes[step].second, 300, 1500, rng);
    c.num_kv_heads = hkv;
    c.group = g;
    PreparedPod p = prepare(c, rng);
    ASSERT_LE(p.rows, max_rows);
    ASSERT_LE(p.paged.view.k.shape[0], max_pages);
    ASSERT_CUDA_OK(cudaMemcpy(q_buf.get(), p.q.view.data, p.q.view.nbytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(k_buf.get(), p.paged.view.k.data, p.paged.view.k.nbytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(v_buf.get(), p.paged.view.v.data, p.paged.view.v.nbytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(idx_buf.get(), p.paged.view.indices.data, p.paged.view.indices.nbytes(),
                              cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemset(o_buf.get(), 0xFF, o_buf.bytes()));
    ASSERT_CUDA_OK(cudaMemset(lse_buf.get(), 0xFF, lse_buf.bytes()));
    w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), host_i32(p.last_page_len), page, shape_for(c), stream.s);
    if (exec == nullptr) {
      cudaGraph_t graph;
      ASSERT_CUDA_OK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
      w.run(q, cache, o, lse, stream.s);
      ASSERT_CUDA_OK(cudaStreamEndCapture(stream.s, &graph));
      ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      ASSERT_CUDA_OK(cudaGraphDestroy(graph));
    }
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream.s));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream.s));
    const auto o_host = download_as(dtype, o_buf.get(), p.rows * hq * d);
    const auto lse_host = download_as(DType::kF32, lse_buf.get(), p.rows * hq);
    SCOPED_TRACE("step " + std::to_string(step) + ": " + describe(w.plan_info()));
    expect_matches_oracle(dtype, o_host, &lse_host, p.ref, "POD graph replay");
  }
  ASSERT_CUDA_OK(cudaGraphExecDestroy(exec));
}

TEST(PodRuntime, ErrorsNameTheArgument) {
  std::mt19937_64 rng(test_seed());
  PodCase c;
  c.qo = {1, 40};
  c.kv = {100, 50};
  PreparedPod p = prepare(c, rng);
  const tessera::RuntimeBounds bounds = bounds_for(c, p.rows);
  Workspace ws(tessera::BatchPODPagedWrapper::workspace_size(bounds));
  tessera::BatchPODPagedWrapper w(ws.view, bounds);
  expect_error_any([&] { w.run(p.q.view, p.cache, p.o.view, p.lse.view); }, {"run() before plan()"},
                   StatusCode::kInvalidArgument);
  tessera::PlanShape soft_cap = shape_for(c);
  soft_cap.attention.variant.logits_soft_cap = 30.0;
  expect_error_any([&] { w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), host_i32(p.last_page_len), 16, soft_cap); },
                   {"shape.attention.variant"}, StatusCode::kUnsupported);
  tessera::PlanShape fp8 = shape_for(c);
  fp8.kv_dtype = DType::kE4M3;
  expect_error_any([&] { w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), host_i32(p.last_page_len), 16, fp8); },
                   {"shape.kv_dtype"}, StatusCode::kUnsupported);
  std::vector<int32_t> bad_last = p.last_page_len;
  bad_last[1] = 17;
  expect_error_any(
      [&] { w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), host_i32(bad_last), 16, shape_for(c)); },
      {"last_page_len[1] = 17"}, StatusCode::kInvalidArgument);
  tessera::PodOptions negative;
  negative.decode_sms = -1;
  expect_error_any([&] { tessera::BatchPODPagedWrapper bad(ws.view, bounds, negative); }, {"options.decode_sms = -1"},
                   StatusCode::kInvalidArgument);
  Workspace small(1024);
  expect_error_any([&] { tessera::BatchPODPagedWrapper bad(small.view, bounds); }, {"workspace has 1024 bytes"},
                   StatusCode::kInvalidArgument);
  w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), host_i32(p.last_page_len), 16, shape_for(c));
  tessera::PagedKVCache bad = p.cache;
  bad.indices = TensorView();
  expect_error_any([&] { w.run(p.q.view, bad, p.o.view, p.lse.view); }, {"kv.indices"}, StatusCode::kInvalidArgument);
  DeviceTensor short_q = upload_tensor(c.dtype, std::vector<double>(c.num_qo_heads() * c.head_dim, 0.0),
                                       {1, c.num_qo_heads(), c.head_dim});
  expect_error_any([&] { w.run(short_q.view, p.cache, p.o.view, p.lse.view); }, {"q.shape[0] = 1"},
                   StatusCode::kInvalidArgument);
}

}  // namespace
