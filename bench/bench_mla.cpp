// W9: multi-head latent attention (DeepSeek MLA, absorbed form) over a paged latent cache
// (tessera/mla.h): bf16, page 64, the pages a random permutation of the pool.
//   (a) memory-bound decode: B=128, L in {4096, 8192, 32768}, 16 heads, one token per request;
//       GB/s = latent bytes read (B x L x 576 x 2), against the copy ceiling (target >= 0.93).
//   (b) compute-bound decode: B=128, L in {4096, 8192}, 128 heads, 2 tokens per request (causal);
//       TFLOP/s = 2 x B x q_len x heads x L x (576 + 512) / time, against the GEMM ceiling
//       (target >= 620 TFLOP/s).
//   (small batch, not a W9 cell) B=8, L=32768, 128 heads, one token: latent GB/s with the KV
//       split over the SMs the 16 CTAs leave idle (what the Python wrapper's plan() chooses) and
//       without a split.
//   Every decode cell also runs through the plan/run runtime (BatchMLAPagedWrapper, implementation
//   "tessera-runtime"; run() only, the plan made once), and (skewed, not a W9 cell) a batch of
//   one long and many short requests compares the one-shot entry point's uniform split with the
//   runtime's balanced plan.
//   (fp8, not a W9 cell) the W9a cells at L=4096 and 32768 and the W9b cell at L=4096 over an e4m3
//       latent cache (bytes counted in fp8: B x L x 576 x 1).
//   (c) prefill of the non-absorbed form: q/k head dim 192 (128 + 64 rotary), v/o 128, B=4, 128
//       heads (as many KV heads), S in {4096, 16384}, causal, ragged KV through
//       batch_prefill_ragged; TFLOP/s = 2 x (192 + 128) x heads x visible pairs / time, against
//       W2a D128 causal of the same run (target >= 0.95 of it: run with the prefill suite's
//       w2a_causal cells).
// Anchor (published): FlashMLA on H800 SXM5, up to 3000 GB/s and 660 TFLOP/s.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "harness.h"
#include "tessera/attention.h"
#include "tessera/mla.h"
#include "tessera/runtime.h"

namespace tessera_bench {
namespace {

using tessera::DType;

constexpr int64_t kW9Batch = 128;
constexpr int64_t kW9PageSize = 64;
constexpr uint64_t kW9PermutationSeed = 0x3a9;
constexpr double kFlashMlaGbps = 3000;
constexpr double kFlashMlaTflops = 660;

/// Times the plan/run runtime on the same inputs as a one-shot cell: run() of a plan made once.
Timing time_runtime(BenchContext& ctx, const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                    const std::vector<int32_t>& last, int64_t heads, bool causal, const tessera::TensorView& q_nope,
                    const tessera::TensorView& q_pe, const tessera::PagedLatentCache& kv, const tessera::TensorView& o,
                    tessera::PlanInfo* info) {
  const int64_t batch = static_cast<int64_t>(last.size());
  const tessera::MlaRuntimeBounds bounds{batch, qo_indptr.back(), heads};
  DeviceTensor workspace =
      ctx.empty_tensor(DType::kU8, {tessera::BatchMLAPagedWrapper::workspace_size(bounds)});
  tessera::BatchMLAPagedWrapper wrapper(workspace.view, bounds);
  auto host = [](const std::vector<int32_t>& v) {
    return tessera::TensorView(const_cast<int32_t*>(v.data()), DType::kI32, {static_cast<int64_t>(v.size())},
                               tessera::Device::cpu());
  };
  tessera::MlaPlanShape shape{heads, DType::kBF16, 1.0 / std::sqrt(192.0), causal};
  shape.kv_dtype = kv.ckv.dtype;
  shape.kv_scales = kv.scales;
  wrapper.plan(host(qo_indptr), host(kv_indptr), host(last), kv.page_size(), shape);
  *info = wrapper.plan_info();
  return ctx.measure([&](cudaStream_t stream) {
    wrapper.run(q_nope, q_pe, kv.ckv, kv.kpe, kv.indices, o, tessera::TensorView(),
                reinterpret_cast<tessera::StreamHandle>(stream));
  });
}

void add_plan_params(Params& params, const tessera::PlanInfo& info) {
  params.emplace_back("runtime_items", static_cast<int64_t>(info.num_items));
  params.emplace_back("runtime_merges", static_cast<int64_t>(info.num_merges));
  params.emplace_back("runtime_chunk_size", static_cast<int64_t>(info.chunk_size));
  params.emplace_back("runtime_makespan_over_lower_bound",
                      info.lower_bound > 0 ? static_cast<double>(info.makespan) / static_cast<double>(info.lower_bound)
                                           : 0.0);
}

/// One MLA decode cell over requests of KV lengths `lens` (tokens), each with qo_len new tokens:
/// the one-shot entry point with the split the Python wrapper's plan() chooses (and, when that
/// splits, without), and the runtime. `lengths` names a non-uniform batch in the results.
void run_w9(BenchContext& ctx, const std::vector<int64_t>& lens, int64_t heads, int64_t qo_len,
            const char* lengths = nullptr, DType kv_dtype = DType::kBF16) {
  const int64_t batch = static_cast<int64_t>(lens.size());
  std::vector<int32_t> indptr(batch + 1, 0), last(batch), qo_indptr(batch + 1, 0);
  int64_t len = 0;
  double total_len = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = (lens[b] + kW9PageSize - 1) / kW9PageSize;
    indptr[b + 1] = static_cast<int32_t>(indptr[b] + pages);
    qo_indptr[b + 1] = static_cast<int32_t>((b + 1) * qo_len);
    last[b] = static_cast<int32_t>(lens[b] - (pages - 1) * kW9PageSize);
    len = std::max(len, lens[b]);
    total_len += static_cast<double>(lens[b]);
  }
  const int64_t num_pages = indptr.back();
  // One [pages, page_size, 576] cache, ckv and kpe its slices (FlashMLA's layout).
  DeviceTensor cache = ctx.random_tensor(kv_dtype, {num_pages, kW9PageSize, 576});
  const double kv_bytes = static_cast<double>(tessera::dtype_size(kv_dtype));
  DeviceTensor q = ctx.random_tensor(DType::kBF16, {batch * qo_len, heads, 576});
  DeviceTensor o = ctx.empty_tensor(DType::kBF16, {batch * qo_len, heads, 512});
  DeviceTensor indptr_t = ctx.upload_i32(indptr), last_t = ctx.upload_i32(last), qo_t = ctx.upload_i32(qo_indptr);
  DeviceTensor indices_t = ctx.upload_i32(random_permutation(num_pages, kW9PermutationSeed));
  auto slice = [](const tessera::TensorView& full, int64_t offset, int64_t width) {
    tessera::TensorView v = full;
    v.data = static_cast<char*>(full.data) + offset * static_cast<int64_t>(tessera::dtype_size(full.dtype));
    v.shape[2] = width;
    return v;
  };
  tessera::PagedLatentCache kv;
  kv.ckv = slice(cache.view, 0, 512);
  kv.kpe = slice(cache.view, 512, 64);
  kv.indptr = indptr_t.view;
  kv.indices = indices_t.view;
  kv.last_page_len = last_t.view;
  if (tessera::is_fp8(kv_dtype)) kv.scales.k = kv.scales.v = 1.0 / 16;  // a scale as a real cache has
  tessera::MlaOptions options;
  options.sm_scale = 1.0 / std::sqrt(192.0);
  options.causal = qo_len > 1;
  const tessera::TensorView q_nope = slice(q.view, 0, 512), q_pe = slice(q.view, 512, 64);
  // KV splits as the Python wrapper's plan() chooses them.
  const int64_t splits =
      tessera::batch_mla_paged_num_kv_splits(batch, qo_len, heads, len, ctx.props().multiProcessorCount);
  const int64_t ws_bytes = tessera::batch_mla_paged_workspace_bytes(batch * qo_len, heads, splits, DType::kBF16);
  DeviceTensor workspace = ctx.empty_tensor(DType::kU8, {std::max<int64_t>(ws_bytes, 1)});
  auto time_with = [&](int64_t num_splits) {
    tessera::MlaOptions opt = options;
    opt.num_kv_splits = num_splits;
    opt.workspace = workspace.view;
    return ctx.measure([&](cudaStream_t stream) {
      tessera::batch_mla_paged(q_nope, q_pe, qo_t.view, qo_len, kv, o.view, tessera::TensorView(), opt,
                               reinterpret_cast<tessera::StreamHandle>(stream));
    });
  };
  const Timing t = time_with(splits);
  Params params = {{"B", batch},     {"L", lengths != nullptr ? ParamValue(lengths) : ParamValue(len)}, {"heads", heads},
                   {"qo_len", qo_len},
                   {"page_size", kW9PageSize}, {"dtype", "bf16"}, {"kv_dtype", tessera::dtype_name(kv_dtype)},
                   {"causal", static_cast<int64_t>(options.causal)},
                   {"kv_splits", splits}};
  tessera::PlanInfo info;
  const Timing t_runtime = time_runtime(ctx, qo_indptr, indptr, last, heads, options.causal, q_nope, q_pe, kv, o.view,
                                        &info);
  Params runtime_params(params.begin(), params.end() - 1);
  add_plan_params(runtime_params, info);
  if (splits > 1) {
    Params unsplit = params;
    unsplit.back() = {"kv_splits", int64_t{1}};
    ctx.report_gbps(time_with(1), total_len * 576.0 * kv_bytes, std::move(unsplit), "tessera-no-split");
  }
  if (qo_len == 1) {
    params.emplace_back("bytes", kv_bytes == 2 ? "latent rows read: B x L x 576 x 2" : "latent rows read: B x L x 576 x 1");
    params.emplace_back("anchor_flashmla_h800_gbps", kFlashMlaGbps);
    if (kv_bytes == 2) params.emplace_back("target_fraction_of_copy", 0.93);
    const double bytes = total_len * 576.0 * kv_bytes;
    ctx.report_gbps(t_runtime, bytes, std::move(runtime_params), "tessera-runtime");
    ctx.report_gbps(t, bytes, std::move(params));
  } else {
    params.emplace_back("flops", "2 x B x q_len x heads x L x (576 + 512)");
    params.emplace_back("anchor_flashmla_h800_tflops", kFlashMlaTflops);
    if (kv_bytes == 2) params.emplace_back("target_tflops", 620.0);
    const double flops = 2.0 * static_cast<double>(qo_len * heads) * total_len * 1088.0;
    ctx.report_tflops(t_runtime, flops, std::move(runtime_params), "tessera-runtime");
    ctx.report_tflops(t, flops, std::move(params));
  }
}

constexpr int64_t kW9cBatch = 4, kW9cHeads = 128, kW9cHeadDimQk = 192, kW9cHeadDimVo = 128;

void run_w9c(BenchContext& ctx, int64_t len) {
  const int64_t total = kW9cBatch * len;
  std::vector<int32_t> indptr(kW9cBatch + 1);
  for (int64_t b = 0; b <= kW9cBatch; ++b) indptr[b] = static_cast<int32_t>(b * len);
  DeviceTensor q = ctx.random_tensor(DType::kBF16, {total, kW9cHeads, kW9cHeadDimQk});
  DeviceTensor k = ctx.random_tensor(DType::kBF16, {total, kW9cHeads, kW9cHeadDimQk});
  DeviceTensor v = ctx.random_tensor(DType::kBF16, {total, kW9cHeads, kW9cHeadDimVo});
  DeviceTensor o = ctx.empty_tensor(DType::kBF16, {total, kW9cHeads, kW9cHeadDimVo});
  DeviceTensor indptr_t = ctx.upload_i32(indptr);
  tessera::AttentionOptions options;
  options.causal = true;
  options.sm_scale = 1.0 / std::sqrt(static_cast<double>(kW9cHeadDimQk));
  const Timing t = ctx.measure([&](cudaStream_t stream) {
    // qo_indptr == kv_indptr: query length = KV length per request.
    tessera::batch_prefill_ragged(q.view, indptr_t.view, len, k.view, v.view, indptr_t.view, o.view,
                                  tessera::TensorView(), options, reinterpret_cast<tessera::StreamHandle>(stream));
  });
  const double pairs = static_cast<double>(len) * static_cast<double>(len + 1) / 2.0;
  const double flops = 2.0 * static_cast<double>(kW9cHeadDimQk + kW9cHeadDimVo) * static_cast<double>(kW9cHeads) *
                       static_cast<double>(kW9cBatch) * pairs;
  Params params = {{"B", kW9cBatch},       {"S", len},         {"heads", kW9cHeads},
                   {"head_dim_qk", kW9cHeadDimQk}, {"head_dim_vo", kW9cHeadDimVo}, {"mask", "causal"},
                   {"kv", "ragged"},       {"dtype", "bf16"},
                   {"flops", "2 x (192 + 128) x heads x visible pairs"},
                   {"target", "0.95 of W2a D128 causal (prefill suite) of the same run"}};
  ctx.report_tflops(t, flops, std::move(params));
}

std::vector<int64_t> uniform(int64_t batch, int64_t len) { return std::vector<int64_t>(batch, len); }
void w9_memory_l4096(BenchContext& ctx) { run_w9(ctx, uniform(kW9Batch, 4096), 16, 1); }
void w9_memory_l8192(BenchContext& ctx) { run_w9(ctx, uniform(kW9Batch, 8192), 16, 1); }
void w9_memory_l32768(BenchContext& ctx) { run_w9(ctx, uniform(kW9Batch, 32768), 16, 1); }
void w9_compute_l4096(BenchContext& ctx) { run_w9(ctx, uniform(kW9Batch, 4096), 128, 2); }
void w9_compute_l8192(BenchContext& ctx) { run_w9(ctx, uniform(kW9Batch, 8192), 128, 2); }
void mla_small_batch(BenchContext& ctx) { run_w9(ctx, uniform(8, 32768), 128, 1); }
void w9_memory_l4096_e4m3(BenchContext& ctx) { run_w9(ctx, uniform(kW9Batch, 4096), 16, 1, nullptr, DType::kE4M3); }
void w9_memory_l32768_e4m3(BenchContext& ctx) { run_w9(ctx, uniform(kW9Batch, 32768), 16, 1, nullptr, DType::kE4M3); }
void w9_compute_l4096_e4m3(BenchContext& ctx) { run_w9(ctx, uniform(kW9Batch, 4096), 128, 2, nullptr, DType::kE4M3); }
// A serving step's skew: one long context among 63 short ones.
std::vector<int64_t> skewed() {
  std::vector<int64_t> lens(64, 2048);
  lens[0] = 131072;
  return lens;
}
void mla_skewed_h16(BenchContext& ctx) { run_w9(ctx, skewed(), 16, 1, "1 x 131072 + 63 x 2048"); }
void mla_skewed_h128(BenchContext& ctx) { run_w9(ctx, skewed(), 128, 2, "1 x 131072 + 63 x 2048"); }
void w9_prefill_s4096(BenchContext& ctx) { run_w9c(ctx, 4096); }
void w9_prefill_s16384(BenchContext& ctx) { run_w9c(ctx, 16384); }

TESSERA_BENCH_WORKLOAD(w9_memory_l4096, "w9_mla_decode_h16_l4096", "W9a MLA decode B=128 L=4096 16 heads, page 64",
                       "mla", "quick");
TESSERA_BENCH_WORKLOAD(w9_memory_l8192, "w9_mla_decode_h16_l8192", "W9a MLA decode B=128 L=8192 16 heads, page 64",
                       "mla");
TESSERA_BENCH_WORKLOAD(w9_memory_l32768, "w9_mla_decode_h16_l32768",
                       "W9a MLA decode B=128 L=32768 16 heads, page 64", "mla", "quick");
TESSERA_BENCH_WORKLOAD(w9_compute_l4096, "w9_mla_decode_h128_q2_l4096",
                       "W9b MLA decode B=128 L=4096 128 heads, 2 tokens, page 64", "mla", "quick");
TESSERA_BENCH_WORKLOAD(mla_small_batch, "mla_decode_b8_h128_l32768",
                       "MLA decode B=8 L=32768 128 heads, page 64, split over the KV length vs not", "mla", "quick");
TESSERA_BENCH_WORKLOAD(mla_skewed_h16, "mla_decode_skewed_h16",
                       "MLA decode B=64 (1 x 128k + 63 x 2k) 16 heads, page 64: uniform split vs the runtime's plan",
                       "mla", "quick");
TESSERA_BENCH_WORKLOAD(mla_skewed_h128, "mla_decode_skewed_h128_q2",
                       "MLA decode B=64 (1 x 128k + 63 x 2k) 128 heads, 2 tokens, page 64: uniform split vs the "
                       "runtime's plan",
                       "mla", "quick");
TESSERA_BENCH_WORKLOAD(w9_compute_l8192, "w9_mla_decode_h128_q2_l8192",
                       "W9b MLA decode B=128 L=8192 128 heads, 2 tokens, page 64", "mla");

TESSERA_BENCH_WORKLOAD(w9_memory_l4096_e4m3, "mla_decode_h16_l4096_e4m3",
                       "MLA decode B=128 L=4096 16 heads, page 64, e4m3 latent cache (W9a over fp8)", "mla", "quick");
TESSERA_BENCH_WORKLOAD(w9_memory_l32768_e4m3, "mla_decode_h16_l32768_e4m3",
                       "MLA decode B=128 L=32768 16 heads, page 64, e4m3 latent cache (W9a over fp8)", "mla");
TESSERA_BENCH_WORKLOAD(w9_compute_l4096_e4m3, "mla_decode_h128_q2_l4096_e4m3",
                       "MLA decode B=128 L=4096 128 heads, 2 tokens, page 64, e4m3 latent cache (W9b over fp8)", "mla");

TESSERA_BENCH_WORKLOAD(w9_prefill_s4096, "w9c_mla_prefill_qk192_vo128_s4096",
                       "W9c prefill B=4 S=4096 128 heads, q/k 192, v/o 128, causal, ragged KV", "mla", "quick");
TESSERA_BENCH_WORKLOAD(w9_prefill_s16384, "w9c_mla_prefill_qk192_vo128_s16384",
                       "W9c prefill B=4 S=16384 128 heads, q/k 192, v/o 128, causal, ragged KV", "mla");

}  // namespace
}  // namespace tessera_bench
