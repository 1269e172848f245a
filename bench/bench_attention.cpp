// Attention workloads of bench/README.md (tessera/attention.h):
//   W1  batch decode over a paged KV cache (B x L grid), GB/s of K and V read, vs. the copy ceiling;
//   W1v the same with variable lengths at B=64;
//   W2  dense prefill over ragged KV (B=16, S 512 .. 16384, three head shapes, causal and not);
//   W4  variable-length prefill, ragged and paged KV (page 16 and page 1), three length sets;
//   W5  incremental prefill and speculative verification (tree masks) through the runtime, and a
//       causal mask given as a custom mask (the tiles it hides skipped) against the built-in flag;
//   W6  a shared prefix: the cascade wrapper against the single paged format;
//   W7  Quest-style page selection: one decode over a budget of selected pages;
//   W11 a prefill chunk and 64 decodes: alone, one after the other, one plan;
//   W8  plan() CPU time of the runtime.
// W1, W1v and W4 cells also run the plan/run runtime (tessera/runtime.h) as impl
// "tessera-runtime" (load balancing on: split-KV, persistent grid); "tessera" is the one-shot grid
// of the same tile code (load balancing off), so each cell is its own ablation.
// Prefill reports TFLOP/s against the GEMM ceiling, FLOPs = 4 * D * (visible query/key pairs)
// summed over query heads (causal: only the visible pairs). Every cell is its own workload so
// suites and --filter can pick cells; the measured anchor figures of bench/README.md are attached
// as `anchor_*` params (and `target_*` where bench/README.md names a number for that cell).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"
#include "tessera/attention.h"
#include "tessera/formats.h"
#include "tessera/runtime.h"

namespace tessera_bench {
namespace {

using tessera::DType;

constexpr DType kDType = DType::kBF16;
constexpr double kElemBytes = 2.0;  // bf16
constexpr uint64_t kPermutationSeed = 20261122;

// W1 / W1v / W4 head shape.
constexpr int64_t kQoHeads = 32;
constexpr int64_t kKvHeads = 8;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kDecodePageSize = 16;

// ------------------------------------------------------------------------------------------------
// Helpers.


int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// False (with a note on stderr) when `bytes` of inputs do not fit in the free device memory.
bool fits(const std::string& name, double bytes) {
  size_t free_bytes = 0, total_bytes = 0;
  BENCH_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  constexpr double kMargin = 512.0 * (1 << 20);  // workspace, allocator slack
  if (bytes + kMargin <= static_cast<double>(free_bytes)) return true;
  std::fprintf(stderr, "tessera-bench: %s skipped: needs %.1f GiB, %.1f GiB free of %.1f GiB\n",
               name.c_str(), bytes / (1 << 30), static_cast<double>(free_bytes) / (1 << 30),
               static_cast<double>(total_bytes) / (1 << 30));
  return false;
}

// Query/key pairs a request sees: query i sits at position kv - qo + i (attention.h).
double visible_pairs(int64_t qo, int64_t kv, bool causal) {
  const double q = static_cast<double>(qo), k = static_cast<double>(kv);
  return causal ? q * (k - q) + q * (q + 1) / 2 : q * k;
}

// indptr of a packed batch with the given per-request lengths.
std::vector<int32_t> indptr_of(const std::vector<int64_t>& lens) {
  std::vector<int32_t> indptr(lens.size() + 1, 0);
  for (size_t b = 0; b < lens.size(); ++b) indptr[b + 1] = indptr[b] + static_cast<int32_t>(lens[b]);
  return indptr;
}

// A paged NHD cache of lens.size() requests, request b holding lens[b] tokens (random K/V), the
// pages of all requests a random permutation of [0, num_pages).
struct PagedCache {
  DeviceTensor k, v, indptr, indices, last_page_len;
  tessera::PagedKV kv;
};

int64_t num_pages_for(const std::vector<int64_t>& lens, int64_t page_size) {
  int64_t pages = 0;
  for (int64_t len : lens) pages += (len + page_size - 1) / page_size;
  return pages;
}

PagedCache make_paged_cache(BenchContext& ctx, const std::vector<int64_t>& lens, int64_t page_size,
                            int64_t kv_heads, int64_t head_dim, DType kv_dtype = kDType) {
  const int64_t batch = static_cast<int64_t>(lens.size());
  std::vector<int32_t> indptr(static_cast<size_t>(batch) + 1, 0), last_page_len(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = (lens[b] + page_size - 1) / page_size;
    indptr[b + 1] = indptr[b] + static_cast<int32_t>(pages);
    last_page_len[b] = static_cast<int32_t>(pages == 0 ? 0 : lens[b] - (pages - 1) * page_size);
  }
  const int64_t num_pages = indptr[batch];
  PagedCache c;
  c.indptr = ctx.upload_i32(indptr);
  c.indices = ctx.upload_i32(random_permutation(num_pages, kPermutationSeed));
  c.last_page_len = ctx.upload_i32(last_page_len);
  c.k = ctx.random_tensor(kv_dtype, {num_pages, page_size, kv_heads, head_dim});
  c.v = ctx.random_tensor(kv_dtype, {num_pages, page_size, kv_heads, head_dim});
  c.kv.k = c.k.view;
  c.kv.v = c.v.view;
  c.kv.layout = tessera::Layout::kNHD;
  c.kv.indptr = c.indptr.view;
  c.kv.indices = c.indices.view;
  c.kv.last_page_len = c.last_page_len.view;
  return c;
}

// Packed rows [sum(lens), heads, head_dim] of random values plus their indptr.
struct Packed {
  DeviceTensor data, indptr;
};

Packed make_packed(BenchContext& ctx, const std::vector<int64_t>& lens, int64_t heads, int64_t head_dim,
                   DType dtype = kDType) {
  Packed p;
  p.data = ctx.random_tensor(dtype, {sum(lens), heads, head_dim});
  p.indptr = ctx.upload_i32(indptr_of(lens));
  return p;
}

// Appends (key, value) to params for every anchor with a known (positive) value.
void add_anchor(Params& params, const char* key, double value) {
  if (value > 0) params.emplace_back(key, value);
}

// Host copies of index arrays as plan() takes them.
tessera::TensorView host_i32(const std::vector<int32_t>& v) {
  return tessera::TensorView(const_cast<int32_t*>(v.data()), DType::kI32, {static_cast<int64_t>(v.size())},
                             tessera::Device::cpu());
}

// A device workspace of `bytes`.
DeviceTensor make_workspace(BenchContext& ctx, int64_t bytes) { return ctx.empty_tensor(DType::kU8, {bytes}); }

// Host page-table description of `lens` (what a serving engine hands plan()).
struct HostPages {
  std::vector<int32_t> indptr, last_page_len;
};
HostPages host_pages(const std::vector<int64_t>& lens, int64_t page_size) {
  HostPages h;
  h.indptr.assign(lens.size() + 1, 0);
  h.last_page_len.assign(lens.size(), 0);
  for (size_t b = 0; b < lens.size(); ++b) {
    const int64_t pages = (lens[b] + page_size - 1) / page_size;
    h.indptr[b + 1] = h.indptr[b] + static_cast<int32_t>(pages);
    h.last_page_len[b] = static_cast<int32_t>(pages == 0 ? 0 : lens[b] - (pages - 1) * page_size);
  }
  return h;
}

// fp8 K/V (W10): per-tensor scales (their values do not change the work); FP8 attention (an fp8
// q) a q scale too.
void set_kv_scales(tessera::AttentionOptions& options, DType kv_dtype, DType q_dtype = kDType) {
  if (!tessera::is_fp8(kv_dtype)) return;
  options.kv_scales.k = 1.0 / 16;
  options.kv_scales.v = 1.0 / 16;
  if (tessera::is_fp8(q_dtype)) options.kv_scales.q = 1.0 / 16;
}

tessera::PlanShape runtime_shape(int64_t qo_heads, int64_t kv_heads, int64_t head_dim, bool causal,
                                 DType kv_dtype = kDType, DType q_dtype = kDType) {
  tessera::PlanShape shape;
  shape.num_qo_heads = qo_heads;
  shape.num_kv_heads = kv_heads;
  shape.head_dim = head_dim;
  shape.dtype = q_dtype;
  shape.kv_dtype = kv_dtype;
  shape.attention.causal = causal;
  set_kv_scales(shape.attention, kv_dtype, q_dtype);
  return shape;
}

// What the plan decided, for the result's params.
void add_plan_info(Params& params, const tessera::PlanInfo& info) {
  params.emplace_back("q_tile", static_cast<int64_t>(info.q_tile_rows));
  params.emplace_back("kv_tile", static_cast<int64_t>(info.kv_tile_rows));
  params.emplace_back("grid_cols", static_cast<int64_t>(info.grid_cols));
  params.emplace_back("heads_per_cta", static_cast<int64_t>(info.heads_per_cta));
  params.emplace_back("items", static_cast<int64_t>(info.num_items));
  params.emplace_back("split_chunks", static_cast<int64_t>(info.num_partials));
  params.emplace_back("chunk", static_cast<int64_t>(info.chunk_size));
  params.emplace_back("grouped", static_cast<int64_t>(info.grouped_by_request));
  params.emplace_back("makespan_over_bound",
                      info.lower_bound > 0 ? static_cast<double>(info.makespan) / info.lower_bound : 0.0);
}

// ------------------------------------------------------------------------------------------------
// W1 / W1v: batch decode over a paged KV cache. bytes = K and V rows actually read
// (sum(L) * Hkv * D * 2 bytes * 2); q (B*Hq*D), o and the page table are not counted.

constexpr int64_t kW1Batches[] = {1, 16, 64, 128};
constexpr int64_t kW1Lengths[] = {1024, 4096, 16384, 32768};

struct DecodeAnchor {
  const char* key;
  int64_t batch;
  double gbps[4];  // per kW1Lengths; <= 0: none
};
constexpr DecodeAnchor kW1Anchors[] = {
    {"anchor_flashinfer_tc", 1, {107, 419, 1161, 1689}},
    {"anchor_flashinfer_tc", 16, {1194, 2153, 2711, 2876}},
    {"anchor_flashinfer_tc", 64, {1958, 2712, 2933, 2976}},
    {"anchor_flashinfer_tc", 128, {2172, 2859, 2993, 3024}},
    {"anchor_cudnn_sdpa", 1, {49, 309, 1178, 1292}},
    {"anchor_cudnn_sdpa", 16, {1279, 1993, 2765, 2824}},
    {"anchor_cudnn_sdpa", 64, {2262, 2824, 3021, 3061}},
    {"anchor_cudnn_sdpa", 128, {2243, 2930, 3025, 3050}},
    {"anchor_fa2_sdpa", 64, {1789, 2503, 2685, 2423}},
    {"anchor_flex", 64, {1029, 2112, 2789, -1}},  // fails at 32k
};
constexpr double kW1FlashInferCudaCoresB64[] = {1638, 2333, 2625, 2735};

// W1 targets in GB/s (the earlier absolute form of the fractions in bench/README.md); <= 0 where
// none is named (only "ahead of every anchor").
double w1_target(int64_t batch, int64_t len) {
  if (batch >= 16 && len >= 16384) return 3000;
  if (batch >= 64 && len == 4096) return 3000;
  if (batch == 1 && len == 32768) return 2700;
  if (batch == 64 && len == 1024) return 2300;
  if (batch == 16 && len == 1024) return 1600;
  return -1;
}

Params decode_params(int64_t batch, const ParamValue& lens, const char* kernel, DType kv_dtype = kDType,
                     DType q_dtype = kDType) {
  return {{"B", batch},           {"L", lens},       {"Hq", kQoHeads},
          {"Hkv", kKvHeads},      {"D", kHeadDim},   {"page_size", kDecodePageSize},
          {"layout", "NHD"},      {"dtype", tessera::dtype_name(q_dtype)}, {"kv_dtype", tessera::dtype_name(kv_dtype)},
          {"kernel", kernel},     {"bytes", "K+V read (bytes of kv_dtype)"}};
}

// Runs batch_decode_paged over `lens`; reports kAuto as "tessera" with `params`, and kCudaCores
// as "tessera-cuda-cores" with `cuda_core_params` when that is non-empty.
void run_decode(BenchContext& ctx, const std::string& name, const std::vector<int64_t>& lens,
                Params params, Params cuda_core_params, DType kv_dtype = kDType, DType q_dtype = kDType) {
  const int64_t batch = static_cast<int64_t>(lens.size());
  const double kv_elem_bytes = static_cast<double>(tessera::dtype_size(kv_dtype));
  const double kv_bytes = 2.0 * static_cast<double>(sum(lens)) * kKvHeads * kHeadDim * kv_elem_bytes;
  const double alloc_bytes = 2.0 * static_cast<double>(num_pages_for(lens, kDecodePageSize)) *
                             kDecodePageSize * kKvHeads * kHeadDim * kv_elem_bytes;
  if (!fits(name, alloc_bytes)) return;

  PagedCache cache = make_paged_cache(ctx, lens, kDecodePageSize, kKvHeads, kHeadDim, kv_dtype);
  DeviceTensor q = ctx.random_tensor(q_dtype, {batch, kQoHeads, kHeadDim});
  DeviceTensor o = ctx.empty_tensor(q_dtype, {batch, kQoHeads, kHeadDim});
  tessera::AttentionOptions options;
  set_kv_scales(options, kv_dtype);
  auto time_kernel = [&](tessera::DecodeKernel kernel) {
    return ctx.measure([&](cudaStream_t stream) {
      tessera::batch_decode_paged(q.view, cache.kv, o.view, tessera::TensorView(), options, stream, kernel);
    });
  };
  Params runtime_params = params;
  ctx.report_gbps(time_kernel(tessera::DecodeKernel::kAuto), kv_bytes, std::move(params));
  if (!cuda_core_params.empty()) {
    ctx.report_gbps(time_kernel(tessera::DecodeKernel::kCudaCores), kv_bytes,
                    std::move(cuda_core_params), "tessera-cuda-cores");
  }
  // The runtime: plan once (a serving step), time run() (one layer).
  const tessera::RuntimeBounds bounds{batch, batch, kQoHeads, kKvHeads, kHeadDim};
  DeviceTensor workspace = make_workspace(ctx, tessera::BatchDecodeWrapper::workspace_size(bounds));
  tessera::BatchDecodeWrapper wrapper(workspace.view, bounds);
  const HostPages pages = host_pages(lens, kDecodePageSize);
  tessera::PlanShape shape = runtime_shape(kQoHeads, kKvHeads, kHeadDim, false, kv_dtype);
  shape.dtype = q_dtype;
  wrapper.plan(host_i32(pages.indptr), host_i32(pages.last_page_len), kDecodePageSize, shape, ctx.stream());
  tessera::PagedKVCache paged{cache.kv.k, cache.kv.v, tessera::Layout::kNHD, cache.kv.indices};
  const Timing t = ctx.measure([&](cudaStream_t stream) {
    wrapper.run(q.view, paged, o.view, tessera::TensorView(), stream);
  });
  add_plan_info(runtime_params, wrapper.plan_info());
  ctx.report_gbps(t, kv_bytes, std::move(runtime_params), "tessera-runtime");
}


void run_w1(BenchContext& ctx, const std::string& name, int64_t batch, size_t len_index) {
  const int64_t len = kW1Lengths[len_index];
  Params params = decode_params(batch, len, "auto");
  for (const DecodeAnchor& a : kW1Anchors) {
    if (a.batch == batch) add_anchor(params, a.key, a.gbps[len_index]);
  }
  add_anchor(params, "target_gbps", w1_target(batch, len));
  Params cuda_core_params;
  if (batch == 64) {
    cuda_core_params = decode_params(batch, len, "cuda_cores");
    add_anchor(cuda_core_params, "anchor_flashinfer_cuda_cores", kW1FlashInferCudaCoresB64[len_index]);
  }
  run_decode(ctx, name, std::vector<int64_t>(static_cast<size_t>(batch), len), std::move(params),
             std::move(cuda_core_params));
}

// W1v, B=64: uniform L_i = 512 + (i * 7919) % 7681; skewed L_i = 32768 when i % 8 == 0, else 1024.
// Target: within 10% of W1's GB/s at the same total KV.
void run_w1v(BenchContext& ctx, const std::string& name, bool skewed) {
  std::vector<int64_t> lens(64);
  for (int64_t i = 0; i < 64; ++i) {
    lens[i] = skewed ? (i % 8 == 0 ? 32768 : 1024) : 512 + (i * 7919) % 7681;
  }
  Params params = decode_params(64, skewed ? "32768 if i%8==0 else 1024" : "512+(i*7919)%7681", "auto");
  params.emplace_back("total_kv", sum(lens));
  run_decode(ctx, name, lens, std::move(params), {});
}

// W10(a): the W1 shapes over an e4m3 cache (per-tensor scales), GB/s counted in fp8 bytes; the
// same run's W1 cells are the bf16 figures (targets: >= 0.95 of the copy ceiling for B >= 64 at
// L >= 4k and for B >= 16 at L >= 16k; B=1 L=32k at least W1's fraction). At B=64 the CUDA-core
// kernel too ("tessera-cuda-cores"), beside W1's CUDA-core figure.
void run_w10_decode(BenchContext& ctx, const std::string& name, int64_t batch, size_t len_index,
                    DType q_dtype = kDType) {
  const int64_t len = kW1Lengths[len_index];
  Params params = decode_params(batch, len, "auto", DType::kE4M3, q_dtype);
  Params cuda_core_params;
  if (batch == 64 && q_dtype == kDType) cuda_core_params = decode_params(batch, len, "cuda_cores", DType::kE4M3, q_dtype);
  run_decode(ctx, name, std::vector<int64_t>(static_cast<size_t>(batch), len), std::move(params),
             std::move(cuda_core_params), DType::kE4M3, q_dtype);
}

// ------------------------------------------------------------------------------------------------
// W2 / W4: prefill. FLOPs = 4 * D * Hq * visible pairs, summed over requests.

enum class KvFormat { kRagged, kPaged };

// Runs batch_prefill_ragged (page_size 0) or batch_prefill_paged over requests with query
// length = KV length = lens[b].
/// q_dtype e4m3 (with kv_dtype e4m3): FP8 attention, o in bf16.
void run_prefill(BenchContext& ctx, const std::string& name, const std::vector<int64_t>& lens,
                 int64_t qo_heads, int64_t kv_heads, int64_t head_dim, bool causal,
                 int64_t page_size, Params params, bool with_runtime = false, DType kv_dtype = kDType,
                 DType q_dtype = kDType) {
  const int64_t total = sum(lens);
  const int64_t kv_slots = page_size > 0 ? num_pages_for(lens, page_size) * page_size : total;
  const double kv_elem_bytes = static_cast<double>(tessera::dtype_size(kv_dtype));
  const double q_elem_bytes = static_cast<double>(tessera::dtype_size(q_dtype));
  const double bytes = head_dim * ((q_elem_bytes + kElemBytes) * static_cast<double>(total) * qo_heads +
                                   kv_elem_bytes * 2.0 * static_cast<double>(kv_slots) * kv_heads);
  if (!fits(name, bytes)) return;

  double flops = 0;
  for (int64_t len : lens) flops += 4.0 * static_cast<double>(head_dim * qo_heads) * visible_pairs(len, len, causal);
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  tessera::AttentionOptions options;
  options.causal = causal;
  set_kv_scales(options, kv_dtype, q_dtype);

  Packed q = make_packed(ctx, lens, qo_heads, head_dim, q_dtype);
  DeviceTensor o = ctx.empty_tensor(kDType, {total, qo_heads, head_dim});
  Timing t;
  if (page_size > 0) {
    PagedCache cache = make_paged_cache(ctx, lens, page_size, kv_heads, head_dim, kv_dtype);
    t = ctx.measure([&](cudaStream_t stream) {
      tessera::batch_prefill_paged(q.data.view, q.indptr.view, max_len, cache.kv, o.view,
                                   tessera::TensorView(), options, stream);
    });
  } else {
    DeviceTensor k = ctx.random_tensor(kv_dtype, {total, kv_heads, head_dim});
    DeviceTensor v = ctx.random_tensor(kv_dtype, {total, kv_heads, head_dim});
    t = ctx.measure([&](cudaStream_t stream) {
      // qo_indptr == kv_indptr: query length = KV length per request.
      tessera::batch_prefill_ragged(q.data.view, q.indptr.view, max_len, k.view, v.view,
                                    q.indptr.view, o.view, tessera::TensorView(), options, stream);
    });
  }
  Params runtime_params = params;
  ctx.report_tflops(t, flops, std::move(params));
  if (!with_runtime) return;
  // The runtime (load balancing on) over the same inputs.
  const std::vector<int32_t> indptr = indptr_of(lens);
  const int64_t batch = static_cast<int64_t>(lens.size());
  const tessera::RuntimeBounds bounds{batch, total, qo_heads, kv_heads, head_dim};
  const tessera::PlanShape shape = runtime_shape(qo_heads, kv_heads, head_dim, causal, kv_dtype, q_dtype);
  if (page_size > 0) {
    DeviceTensor workspace = make_workspace(ctx, tessera::BatchPrefillPagedWrapper::workspace_size(bounds));
    tessera::BatchPrefillPagedWrapper wrapper(workspace.view, bounds);
    const HostPages pages = host_pages(lens, page_size);
    wrapper.plan(host_i32(indptr), host_i32(pages.indptr), host_i32(pages.last_page_len), page_size, shape,
                 ctx.stream());
    PagedCache cache = make_paged_cache(ctx, lens, page_size, kv_heads, head_dim, kv_dtype);
    tessera::PagedKVCache paged{cache.kv.k, cache.kv.v, tessera::Layout::kNHD, cache.kv.indices};
    t = ctx.measure([&](cudaStream_t stream) {
      wrapper.run(q.data.view, paged, o.view, tessera::TensorView(), stream);
    });
    add_plan_info(runtime_params, wrapper.plan_info());
  } else {
    DeviceTensor workspace = make_workspace(ctx, tessera::BatchPrefillRaggedWrapper::workspace_size(bounds));
    tessera::BatchPrefillRaggedWrapper wrapper(workspace.view, bounds);
    wrapper.plan(host_i32(indptr), host_i32(indptr), shape, ctx.stream());
    DeviceTensor k = ctx.random_tensor(kv_dtype, {total, kv_heads, head_dim});
    DeviceTensor v = ctx.random_tensor(kv_dtype, {total, kv_heads, head_dim});
    t = ctx.measure([&](cudaStream_t stream) {
      wrapper.run(q.data.view, k.view, v.view, o.view, tessera::TensorView(), stream);
    });
    add_plan_info(runtime_params, wrapper.plan_info());
  }
  ctx.report_tflops(t, flops, std::move(runtime_params), "tessera-runtime");
}


// W2: B=16, (a) H=16 D=128, (b) H=32 D=64, (c) H=8 D=256.
constexpr int64_t kW2Batch = 16;
constexpr int64_t kW2Lengths[] = {512, 1024, 2048, 4096, 8192, 16384};
struct DenseShape {
  char tag;
  int64_t heads, head_dim;
};
// (d) is not a workload of the brief: head_dim 96 (Phi-3 class: 32 heads of 96), to see that its
// padded shared-memory rows (docs/kernels.md) cost what they should.
constexpr DenseShape kW2Shapes[] = {{'a', 16, 128}, {'b', 32, 64}, {'c', 8, 256}, {'d', 32, 96}};

struct DenseAnchor {
  const char* key;
  char tag;
  bool causal;
  double tflops[6];  // per kW2Lengths; <= 0: none
};
constexpr DenseAnchor kW2Anchors[] = {
    {"anchor_flashinfer_fa3", 'a', true, {198, 368, 534, 626, 623, 623}},
    {"anchor_flashinfer_fa3", 'a', false, {304, 476, 622, 623, 673, 672}},
    {"anchor_flashinfer_fa2", 'a', true, {142, 242, 321, 363, 387, 390}},
    {"anchor_flashinfer_fa2", 'a', false, {241, 334, 380, 382, 365, 382}},
    {"anchor_cudnn_sdpa", 'a', true, {208, 337, 368, 577, 592, 598}},
    {"anchor_cudnn_sdpa", 'a', false, {324, 482, 604, 657, 617, 625}},
    {"anchor_fa2_sdpa", 'a', true, {119, 215, 280, 326, 325, 338}},
    {"anchor_fa2_sdpa", 'a', false, {220, 297, 330, 351, 351, 350}},
    {"anchor_flex", 'a', true, {88, 183, 274, 362, 408, 430}},
    {"anchor_fa3_paper", 'a', true, {292, 423, 521, 579, 602, 616}},
    {"anchor_fa3_paper", 'a', false, {467, 565, 625, 638, 646, 648}},
    {"anchor_flashinfer_paper", 'a', true, {250, 407, 487, 548, 588, 612}},
    {"anchor_flashinfer_fa3", 'b', true, {-1, -1, 359, -1, 473, 488}},
    {"anchor_flashinfer_fa3", 'b', false, {-1, -1, 473, -1, 517, 492}},
    {"anchor_flashinfer_fa2", 'b', false, {-1, -1, 323, -1, 346, 341}},
    {"anchor_fa3_paper", 'b', true, {-1, -1, -1, -1, -1, 473}},
    {"anchor_fa3_paper", 'b', false, {-1, -1, -1, -1, -1, 497}},
    {"anchor_flashinfer_fa3", 'c', true, {-1, -1, 566, -1, 654, 644}},
    {"anchor_flashinfer_fa3", 'c', false, {-1, -1, 676, -1, 707, 705}},
    {"anchor_flashinfer_fa2", 'c', false, {-1, -1, 317, -1, 330, 320}},
    {"anchor_fa3_paper", 'c', true, {-1, -1, -1, -1, -1, 642}},
    {"anchor_fa3_paper", 'c', false, {-1, -1, -1, -1, -1, 756}},
};

// W2 FA3-class targets at 16k (bench/README.md).
double w2_target(char tag, bool causal, int64_t len) {
  if (len != 16384) return -1;
  if (tag == 'a') return causal ? 650 : 700;
  if (tag == 'b' && !causal) return 520;
  if (tag == 'c' && !causal) return 770;
  return -1;
}

void run_w2(BenchContext& ctx, const std::string& name, const DenseShape& shape, bool causal,
            size_t len_index) {
  const int64_t len = kW2Lengths[len_index];
  Params params = {{"B", kW2Batch},      {"S", len},
                   {"H", shape.heads},   {"D", shape.head_dim},
                   {"mask", causal ? "causal" : "none"}, {"kv", "ragged"},
                   {"dtype", "bf16"},    {"flops", "4*D*visible_pairs*H"}};
  for (const DenseAnchor& a : kW2Anchors) {
    if (a.tag == shape.tag && a.causal == causal) add_anchor(params, a.key, a.tflops[len_index]);
  }
  add_anchor(params, "target_tflops", w2_target(shape.tag, causal, len));
  // The runtime too ("tessera-runtime"): its persistent grid is what a serving engine's plan/run
  // wrappers launch, and it overlaps one query tile's epilogue with the next tile's loads.
  run_prefill(ctx, name, std::vector<int64_t>(static_cast<size_t>(kW2Batch), len), shape.heads, shape.heads,
              shape.head_dim, causal, 0, std::move(params), /*with_runtime=*/true);
}

// W10(c): FP8 attention (q, k, v e4m3, o bf16) at the W2 shapes; the target is 1.5x the bf16
// cell of the same run (w2<tag>_..., the "prefill" suite), so no absolute anchor is attached.
void run_w10_fp8_attention(BenchContext& ctx, const std::string& name, const DenseShape& shape, bool causal,
                           size_t len_index) {
  const int64_t len = kW2Lengths[len_index];
  Params params = {{"B", kW2Batch},      {"S", len},
                   {"H", shape.heads},   {"D", shape.head_dim},
                   {"mask", causal ? "causal" : "none"}, {"kv", "ragged"},
                   {"dtype", "e4m3 q/k/v, bf16 o"},    {"flops", "4*D*visible_pairs*H"}};
  if (shape.tag == 'c') add_anchor(params, "anchor_fa3_fp8_paper", 1200);  // FA3's paper: ~1.2 PFLOP/s at D256
  run_prefill(ctx, name, std::vector<int64_t>(static_cast<size_t>(kW2Batch), len), shape.heads, shape.heads,
              shape.head_dim, causal, 0, std::move(params), /*with_runtime=*/true, DType::kE4M3, DType::kE4M3);
}

// W4: B=16, Hq=32, Hkv=8, D=128, causal, query length = KV length per request.
struct LengthSet {
  const char* name;
  std::vector<int64_t> lens;
  double anchor_flashinfer_fa3, anchor_flashinfer_fa2, anchor_cudnn, anchor_fa2, anchor_flex, target;
};
const std::vector<LengthSet>& w4_sets() {
  static const std::vector<LengthSet> sets = {
      {"constant", std::vector<int64_t>(16, 1024), 412, 254, 438, 247, 230, 470},
      {"uniform",
       {906, 942, 553, 777, 1009, 926, 822, 1000, 878, 735, 654, 800, 655, 609, 768, 662},
       318, 239, 253, 134, 129, 400},
      {"skewed",
       {709, 357, 302, 376, 506, 1744, 541, 412, 298, 285, 502, 311, 815, 330, 449, 8439},
       602, 328, 39, 23, 273, 620},
  };
  return sets;
}

void run_w4(BenchContext& ctx, const std::string& name, const LengthSet& set, int64_t page_size,
            DType kv_dtype = kDType) {
  Params params = {{"B", static_cast<int64_t>(set.lens.size())},
                   {"lengths", set.name},
                   {"total", sum(set.lens)},
                   {"Hq", kQoHeads},
                   {"Hkv", kKvHeads},
                   {"D", kHeadDim},
                   {"mask", "causal"},
                   {"kv", page_size > 0 ? "paged" : "ragged"}};
  if (page_size > 0) params.emplace_back("page_size", page_size);
  params.emplace_back("dtype", "bf16");
  params.emplace_back("kv_dtype", tessera::dtype_name(kv_dtype));
  params.emplace_back("flops", "4*D*visible_pairs*Hq");
  add_anchor(params, "anchor_flashinfer_fa3_ragged", set.anchor_flashinfer_fa3);
  add_anchor(params, "anchor_flashinfer_fa2_ragged", set.anchor_flashinfer_fa2);
  add_anchor(params, "anchor_cudnn_sdpa_padded", set.anchor_cudnn);
  add_anchor(params, "anchor_fa2_sdpa_padded", set.anchor_fa2);
  add_anchor(params, "anchor_flex_docmask", set.anchor_flex);
  add_anchor(params, "target_tflops", set.target);
  run_prefill(ctx, name, set.lens, kQoHeads, kKvHeads, kHeadDim, true, page_size, std::move(params),
              /*with_runtime=*/true, kv_dtype);
}

// ------------------------------------------------------------------------------------------------
// W8: plan() CPU time (host index arrays in, plan uploaded), median of 200 calls after 20 warm-up
// calls; the stream is synchronised between calls, outside the timed region.

void report_plan_time(BenchContext& ctx, const std::function<void()>& plan, Params params, double target_us) {
  std::vector<double> samples;
  for (int i = 0; i < 220; ++i) {
    const auto start = std::chrono::steady_clock::now();
    plan();
    const auto stop = std::chrono::steady_clock::now();
    ctx.synchronize();
    if (i >= 20) samples.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
  }
  Result r;
  r.impl = "tessera-runtime";
  r.timing = summarize(samples);
  r.metric = "us";
  r.value = r.timing.median_us;
  add_anchor(params, "target_us", target_us);
  r.params = std::move(params);
  ctx.report(std::move(r));
}

void run_w8_decode(BenchContext& ctx) {
  const std::vector<int64_t> lens(128, 4096);
  const tessera::RuntimeBounds bounds{128, 128, kQoHeads, kKvHeads, kHeadDim};
  DeviceTensor workspace = make_workspace(ctx, tessera::BatchDecodeWrapper::workspace_size(bounds));
  tessera::BatchDecodeWrapper wrapper(workspace.view, bounds);
  const HostPages pages = host_pages(lens, kDecodePageSize);
  const tessera::PlanShape shape = runtime_shape(kQoHeads, kKvHeads, kHeadDim, false);
  report_plan_time(
      ctx,
      [&] {
        wrapper.plan(host_i32(pages.indptr), host_i32(pages.last_page_len), kDecodePageSize, shape, ctx.stream());
      },
      {{"plan", "decode"}, {"B", int64_t{128}}, {"L", int64_t{4096}}, {"Hq", kQoHeads}, {"Hkv", kKvHeads},
       {"D", kHeadDim}, {"page_size", kDecodePageSize}},
      20);
}

void run_w8_prefill(BenchContext& ctx) {
  const std::vector<int64_t>& lens = w4_sets()[2].lens;  // skewed
  const int64_t batch = static_cast<int64_t>(lens.size());
  const tessera::RuntimeBounds bounds{batch, sum(lens), kQoHeads, kKvHeads, kHeadDim};
  DeviceTensor workspace = make_workspace(ctx, tessera::BatchPrefillPagedWrapper::workspace_size(bounds));
  tessera::BatchPrefillPagedWrapper wrapper(workspace.view, bounds);
  const std::vector<int32_t> qo_indptr = indptr_of(lens);
  const HostPages pages = host_pages(lens, kDecodePageSize);
  const tessera::PlanShape shape = runtime_shape(kQoHeads, kKvHeads, kHeadDim, true);
  report_plan_time(
      ctx,
      [&] {
        wrapper.plan(host_i32(qo_indptr), host_i32(pages.indptr), host_i32(pages.last_page_len), kDecodePageSize,
                     shape, ctx.stream());
      },
      {{"plan", "prefill paged, W4 skewed"}, {"B", batch}, {"Hq", kQoHeads}, {"Hkv", kKvHeads}, {"D", kHeadDim},
       {"page_size", kDecodePageSize}, {"causal", int64_t{1}}},
      50);
}

// ------------------------------------------------------------------------------------------------
// W5: incremental prefill and speculative verification through the runtime's paged prefill
// wrapper: B=32 requests of KV length 4096 (the new tokens the cache's last), query lengths 2 / 4 /
// 8 with and without a tree mask (the tokens a random tree: a query sees the prefix, its ancestors
// and itself), 128 and 512 (chunked prefill); Hq=32, Hkv=8, D=128, page 16, causal, pages a random
// permutation. q <= 8: GB/s = K and V read (B x 4096 x Hkv x D x 2 bytes x 2), against W1's
// decode of the same KV (cell w5_decode_q1, the same run); 128 / 512: TFLOP/s = 4 x D x Hq x
// visible pairs. Anchors (FlashInfer 0.3.1 paged prefill, causal, no tree): 869 / 888 / 883 GB/s,
// 419 / 475 TFLOP/s. Targets: q <= 8 at >= 0.85 of W1's GB/s, with and without the tree; 512 at
// >= 550 TFLOP/s.

constexpr int64_t kW5Batch = 32, kW5KvLen = 4096;

/// Random token trees over each request's last qo positions, packed as plan() takes them (little
/// bit order, request b from byte offsets[b]): fan-out 1-4, like a speculative draft's tree.
struct PackedTrees {
  std::vector<uint8_t> bytes;
  std::vector<int32_t> offsets;
};
PackedTrees random_trees(int64_t batch, int64_t qo, int64_t kv, uint64_t seed) {
  PackedTrees t;
  std::mt19937_64 rng(seed);
  const int64_t prefix = kv - qo, row_bits = kv;
  const int64_t bytes_per_request = (qo * row_bits + 7) / 8;
  t.bytes.assign(static_cast<size_t>(batch * bytes_per_request), 0);
  for (int64_t b = 0; b <= batch; ++b) t.offsets.push_back(static_cast<int32_t>(b * bytes_per_request));
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> parent(qo, -1);
    for (int64_t i = 1; i < qo; ++i) {
      parent[i] = std::uniform_int_distribution<int64_t>(std::max<int64_t>(0, (i - 1) / 4), i - 1)(rng);
    }
    uint8_t* m = t.bytes.data() + b * bytes_per_request;
    auto set = [&](int64_t i, int64_t j) { m[(i * row_bits + j) / 8] |= static_cast<uint8_t>(1u << ((i * row_bits + j) % 8)); };
    for (int64_t i = 0; i < qo; ++i) {
      for (int64_t j = 0; j < prefix; ++j) set(i, j);
      for (int64_t a = i; a >= 0; a = parent[a]) set(i, prefix + a);
    }
  }
  return t;
}

/// A packed custom mask (request b from byte offsets[b]) uploaded and given to `shape`; the
/// returned tensor holds the bits and must outlive the runs.
DeviceTensor attach_custom_mask(BenchContext& ctx, tessera::PlanShape& shape, const std::vector<uint8_t>& bytes,
                                const std::vector<int32_t>& offsets) {
  DeviceTensor mask = ctx.empty_tensor(DType::kU8, {static_cast<int64_t>(bytes.size())});
  BENCH_CUDA(cudaMemcpy(mask.view.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  shape.attention.variant.custom_mask = mask.view;
  shape.attention.variant.custom_mask_indptr = host_i32(offsets);
  return mask;
}

/// Plans `wrapper` for qo_lens queries over kv_lens keys of `cache` (pages of kDecodePageSize) and
/// times its run() into o.
Timing time_paged_prefill(BenchContext& ctx, tessera::BatchPrefillPagedWrapper& wrapper,
                          const std::vector<int64_t>& qo_lens, const std::vector<int64_t>& kv_lens,
                          const tessera::PlanShape& shape, const PagedCache& cache, const DeviceTensor& q,
                          const DeviceTensor& o) {
  const HostPages pages = host_pages(kv_lens, kDecodePageSize);
  wrapper.plan(host_i32(indptr_of(qo_lens)), host_i32(pages.indptr), host_i32(pages.last_page_len), kDecodePageSize,
               shape, ctx.stream());
  tessera::PagedKVCache paged{cache.kv.k, cache.kv.v, tessera::Layout::kNHD, cache.kv.indices};
  return ctx.measure([&](cudaStream_t stream) { wrapper.run(q.view, paged, o.view, tessera::TensorView(), stream); });
}

void run_w5(BenchContext& ctx, int64_t qo, bool tree,
            tessera::QueryTile tile = tessera::QueryTile::kAuto) {
  const std::vector<int64_t> kv_lens(kW5Batch, kW5KvLen), qo_lens(kW5Batch, qo);
  const int64_t rows = kW5Batch * qo;
  const double kv_bytes = 2.0 * kW5Batch * kW5KvLen * kKvHeads * kHeadDim * kElemBytes;
  double flops = 0;
  for (int64_t b = 0; b < kW5Batch; ++b) flops += 4.0 * kHeadDim * kQoHeads * visible_pairs(qo, kW5KvLen, true);
  PagedCache cache = make_paged_cache(ctx, kv_lens, kDecodePageSize, kKvHeads, kHeadDim);
  DeviceTensor q = ctx.random_tensor(kDType, {rows, kQoHeads, kHeadDim});
  DeviceTensor o = ctx.empty_tensor(kDType, {rows, kQoHeads, kHeadDim});
  const tessera::RuntimeBounds bounds{kW5Batch, rows, kQoHeads, kKvHeads, kHeadDim};
  tessera::RuntimeOptions options;
  options.q_tile = tile;
  DeviceTensor workspace = make_workspace(ctx, tessera::BatchPrefillPagedWrapper::workspace_size(bounds, options));
  tessera::BatchPrefillPagedWrapper wrapper(workspace.view, bounds, options);
  tessera::PlanShape shape = runtime_shape(kQoHeads, kKvHeads, kHeadDim, true);
  PackedTrees trees;
  DeviceTensor mask;
  if (tree) {
    trees = random_trees(kW5Batch, qo, kW5KvLen, kPermutationSeed + static_cast<uint64_t>(qo));
    mask = attach_custom_mask(ctx, shape, trees.bytes, trees.offsets);
  }
  const Timing t = time_paged_prefill(ctx, wrapper, qo_lens, kv_lens, shape, cache, q, o);
  Params params = {{"B", kW5Batch}, {"L", kW5KvLen}, {"qo_len", qo}, {"Hq", kQoHeads}, {"Hkv", kKvHeads},
                   {"D", kHeadDim}, {"page_size", kDecodePageSize}, {"mask", tree ? "causal+tree" : "causal"},
                   {"dtype", "bf16"}};
  add_plan_info(params, wrapper.plan_info());
  if (qo <= 8) {
    params.emplace_back("bytes", "K+V read");
    add_anchor(params, "anchor_flashinfer_paged_prefill_gbps", qo == 2 ? 869 : qo == 4 ? 888 : 883);
    params.emplace_back("target", "0.85 of w5_decode_q1 (W1's decode of the same KV) of the same run");
    ctx.report_gbps(t, kv_bytes, std::move(params), "tessera-runtime");
  } else {
    params.emplace_back("flops", "4*D*Hq*visible_pairs");
    add_anchor(params, "anchor_flashinfer_paged_prefill_tflops", qo == 128 ? 419 : 475);
    if (qo == 512) params.emplace_back("target_tflops", 550.0);
    ctx.report_tflops(t, flops, std::move(params), "tessera-runtime");
  }
}

// The mask tile lists (issue 25: tiles a custom mask hides are skipped): prefill of B=4 requests
// of 4096 tokens over their own 4096 keys (Hq=32, Hkv=8, D=128, page 16), the causal mask given
// as a custom mask to a non-causal plan (FlashInfer's documented custom-mask example), against the
// built-in causal flag in the same run. TFLOP/s = 4 x D x Hq x causal visible pairs for both: with
// the hidden tiles skipped the custom mask costs the lists' kernel, the per-logit tests of the
// diagonal tiles and a plan balanced for the unmasked spans; visiting every tile
// (TESSERA_MASK_TILE_SKIP=0) computes twice the pairs. A third cell gives the same mask to a
// causal plan (the built-in spans, nothing to skip): what testing a mask costs by itself.

constexpr int64_t kMaskBatch = 4, kMaskLen = 4096;

enum class MaskCausal { kBuiltin, kCustom, kBuiltinAndCustom };

void run_mask_causal(BenchContext& ctx, MaskCausal how) {
  const bool custom = how != MaskCausal::kBuiltin;
  const std::vector<int64_t> lens(kMaskBatch, kMaskLen);
  const int64_t rows = kMaskBatch * kMaskLen;
  const double flops = kMaskBatch * 4.0 * kHeadDim * kQoHeads * visible_pairs(kMaskLen, kMaskLen, true);
  PagedCache cache = make_paged_cache(ctx, lens, kDecodePageSize, kKvHeads, kHeadDim);
  DeviceTensor q = ctx.random_tensor(kDType, {rows, kQoHeads, kHeadDim});
  DeviceTensor o = ctx.empty_tensor(kDType, {rows, kQoHeads, kHeadDim});
  const tessera::RuntimeBounds bounds{kMaskBatch, rows, kQoHeads, kKvHeads, kHeadDim};
  const tessera::RuntimeOptions options;
  DeviceTensor workspace = make_workspace(ctx, tessera::BatchPrefillPagedWrapper::workspace_size(bounds, options));
  tessera::BatchPrefillPagedWrapper wrapper(workspace.view, bounds, options);
  tessera::PlanShape shape = runtime_shape(kQoHeads, kKvHeads, kHeadDim, /*causal=*/how != MaskCausal::kCustom);
  // Row i of a request sees keys 0..i: whole bytes below the diagonal, then its byte's low bits.
  const int64_t request_bytes = kMaskLen * kMaskLen / 8;
  std::vector<uint8_t> bits(static_cast<size_t>(kMaskBatch * request_bytes), 0);
  std::vector<int32_t> offsets;
  for (int64_t b = 0; b <= kMaskBatch; ++b) offsets.push_back(static_cast<int32_t>(b * request_bytes));
  for (int64_t b = 0; b < kMaskBatch; ++b) {
    for (int64_t i = 0; i < kMaskLen; ++i) {
      uint8_t* row = bits.data() + b * request_bytes + i * kMaskLen / 8;
      std::fill_n(row, (i + 1) / 8, uint8_t{0xFF});
      if ((i + 1) % 8 != 0) row[(i + 1) / 8] = static_cast<uint8_t>((1u << ((i + 1) % 8)) - 1u);
    }
  }
  DeviceTensor mask;
  if (custom) mask = attach_custom_mask(ctx, shape, bits, offsets);
  const Timing t = time_paged_prefill(ctx, wrapper, lens, lens, shape, cache, q, o);
  const char* skip = std::getenv("TESSERA_MASK_TILE_SKIP");
  Params params = {{"B", kMaskBatch}, {"S", kMaskLen}, {"Hq", kQoHeads}, {"Hkv", kKvHeads}, {"D", kHeadDim},
                   {"page_size", kDecodePageSize}, {"dtype", "bf16"}, {"flops", "4*D*Hq*causal visible pairs"},
                   {"mask", how == MaskCausal::kBuiltin  ? "built-in causal"
                            : how == MaskCausal::kCustom ? "causal as a custom mask (non-causal plan)"
                                                         : "built-in causal and the same custom mask"},
                   {"mask_tile_skip", skip != nullptr && std::string(skip) == "0" ? "off" : "on"}};
  if (custom) params.emplace_back("baseline", "mask_builtin_causal_s4096 of the same run");
  add_plan_info(params, wrapper.plan_info());
  ctx.report_tflops(t, flops, std::move(params), "tessera-runtime");
}

// ------------------------------------------------------------------------------------------------
// W6: shared prefix. B decodes (Hq=32, Hkv=8, D=128, page 16) share a prefix of P tokens and own a
// suffix of 128; prefix and suffix pages a random permutation of one pool. Three ways, one run:
// the runtime's decode over one page table per request (prefix pages, then its own: the single
// format, impl "tessera-runtime"), the one-shot decode over the same table ("tessera"), and the
// cascade wrapper (level 0: the prefix, one group of all B rows; level 1: each request's suffix;
// impl "tessera-cascade"; each level alone through the paged prefill wrapper as ablations, impls
// "tessera-prefix-level" and "tessera-suffix-level"). Reported as the median time of one run() in
// microseconds (plan once).
// Anchors (FlashInfer 0.3.1, microseconds): two-level cascade 216 / 250 / 626 (B=16, P=1k / 8k /
// 32k), 159 / 281 / 649 (B=64); single format, tensor-core decode 47 / 104 / 288, 79 / 280 / 997.
// Target: the cascade never slower than the single format; B=64 P=32k <= 330.

constexpr int64_t kW6Suffix = 128;
constexpr int64_t kW6Prefixes[] = {1024, 8192, 32768};
constexpr double kW6FlashInferCascadeUs[2][3] = {{216, 250, 626}, {159, 281, 649}};
constexpr double kW6FlashInferSingleUs[2][3] = {{47, 104, 288}, {79, 280, 997}};

void run_w6(BenchContext& ctx, int64_t batch, size_t prefix_index) {
  const int64_t prefix = kW6Prefixes[prefix_index], page = kDecodePageSize;
  const int64_t prefix_pages = prefix / page, suffix_pages = kW6Suffix / page;
  const int64_t num_pages = prefix_pages + batch * suffix_pages;
  // Pool page i of the logical order: the prefix's pages first, then request b's suffix pages.
  const std::vector<int32_t> pool = random_permutation(num_pages, kPermutationSeed + static_cast<uint64_t>(prefix));
  std::vector<int32_t> single_indices;
  for (int64_t b = 0; b < batch; ++b) {
    single_indices.insert(single_indices.end(), pool.begin(), pool.begin() + prefix_pages);
    const auto own = pool.begin() + prefix_pages + b * suffix_pages;
    single_indices.insert(single_indices.end(), own, own + suffix_pages);
  }
  const std::vector<int32_t> prefix_indices(pool.begin(), pool.begin() + prefix_pages);
  const std::vector<int32_t> suffix_indices(pool.begin() + prefix_pages, pool.end());
  DeviceTensor k = ctx.random_tensor(kDType, {num_pages, page, kKvHeads, kHeadDim});
  DeviceTensor v = ctx.random_tensor(kDType, {num_pages, page, kKvHeads, kHeadDim});
  DeviceTensor single_dev = ctx.upload_i32(single_indices), prefix_dev = ctx.upload_i32(prefix_indices),
               suffix_dev = ctx.upload_i32(suffix_indices);
  DeviceTensor q = ctx.random_tensor(kDType, {batch, kQoHeads, kHeadDim});
  DeviceTensor o = ctx.empty_tensor(kDType, {batch, kQoHeads, kHeadDim});

  const std::vector<int64_t> single_lens(static_cast<size_t>(batch), prefix + kW6Suffix);
  const HostPages single = host_pages(single_lens, page);
  const double kv_bytes = 2.0 * static_cast<double>(prefix + batch * kW6Suffix) * kKvHeads * kHeadDim * kElemBytes;
  Params params = {{"B", batch}, {"prefix", prefix}, {"suffix", kW6Suffix}, {"Hq", kQoHeads}, {"Hkv", kKvHeads},
                   {"D", kHeadDim}, {"page_size", page}, {"dtype", "bf16"},
                   {"unique_kv_bytes", kv_bytes}};
  const size_t bi = batch == 16 ? 0 : 1;
  add_anchor(params, "anchor_flashinfer_cascade_us", kW6FlashInferCascadeUs[bi][prefix_index]);
  add_anchor(params, "anchor_flashinfer_single_tc_us", kW6FlashInferSingleUs[bi][prefix_index]);

  // The single format: one-shot and runtime decode over the per-request tables.
  {
    DeviceTensor indptr = ctx.upload_i32(single.indptr), last = ctx.upload_i32(single.last_page_len);
    tessera::PagedKV kv{k.view, v.view, tessera::Layout::kNHD, indptr.view, single_dev.view, last.view};
    const Timing t = ctx.measure([&](cudaStream_t stream) {
      tessera::batch_decode_paged(q.view, kv, o.view, tessera::TensorView(), {}, stream);
    });
    ctx.report_time(t, kMicroseconds, params, "tessera");
  }
  {
    const tessera::RuntimeBounds bounds{batch, batch, kQoHeads, kKvHeads, kHeadDim};
    DeviceTensor workspace = make_workspace(ctx, tessera::BatchDecodeWrapper::workspace_size(bounds));
    tessera::BatchDecodeWrapper wrapper(workspace.view, bounds);
    wrapper.plan(host_i32(single.indptr), host_i32(single.last_page_len), page,
                 runtime_shape(kQoHeads, kKvHeads, kHeadDim, false), ctx.stream());
    tessera::PagedKVCache paged{k.view, v.view, tessera::Layout::kNHD, single_dev.view};
    const Timing t = ctx.measure([&](cudaStream_t stream) {
      wrapper.run(q.view, paged, o.view, tessera::TensorView(), stream);
    });
    Params p = params;
    add_plan_info(p, wrapper.plan_info());
    ctx.report_time(t, kMicroseconds, std::move(p), "tessera-runtime");
  }
  // The cascade's levels: the prefix as one group of all B rows, then each request's suffix.
  std::vector<int32_t> rows(static_cast<size_t>(batch) + 1);
  for (int64_t b = 0; b <= batch; ++b) rows[b] = static_cast<int32_t>(b);
  const std::vector<int32_t> shared_rows{0, static_cast<int32_t>(batch)};
  const std::vector<int32_t> shared_pages{0, static_cast<int32_t>(prefix_pages)}, shared_last{static_cast<int32_t>(page)};
  const HostPages own = host_pages(std::vector<int64_t>(static_cast<size_t>(batch), kW6Suffix), page);
  const std::vector<tessera::CascadeLevel> level_plans = {
      {host_i32(shared_rows), host_i32(shared_pages), host_i32(shared_last)},
      {host_i32(rows), host_i32(own.indptr), host_i32(own.last_page_len)}};
  const std::vector<tessera::PagedKVCache> levels = {
      {k.view, v.view, tessera::Layout::kNHD, prefix_dev.view}, {k.view, v.view, tessera::Layout::kNHD, suffix_dev.view}};
  const tessera::RuntimeBounds bounds{batch, batch, kQoHeads, kKvHeads, kHeadDim};
  const tessera::PlanShape shape = runtime_shape(kQoHeads, kKvHeads, kHeadDim, false);
  // The cascade.
  {
    DeviceTensor workspace = make_workspace(ctx, tessera::BatchCascadePagedWrapper::workspace_size(2, bounds));
    tessera::BatchCascadePagedWrapper cascade(workspace.view, 2, bounds);
    cascade.plan(level_plans, page, shape, ctx.stream());
    const Timing t = ctx.measure([&](cudaStream_t stream) {
      cascade.run(q.view, levels, o.view, tessera::TensorView(), stream);
    });
    Params p = params;
    p.emplace_back("workspace_bytes", static_cast<double>(workspace.view.nbytes()));
    p.emplace_back("shared_q_tile", static_cast<int64_t>(cascade.plan_info(0).q_tile_rows));
    p.emplace_back("shared_partials", static_cast<int64_t>(cascade.plan_info(0).num_partials));
    p.emplace_back("shared_grid_cols", static_cast<int64_t>(cascade.plan_info(0).grid_cols));
    p.emplace_back("own_partials", static_cast<int64_t>(cascade.plan_info(1).num_partials));
    p.emplace_back("target", batch == 64 && prefix == 32768 ? "<= 330 us and <= the single format"
                                                            : "<= the single format (tessera-runtime, tessera)");
    ctx.report_time(t, kMicroseconds, std::move(p), "tessera-cascade");
  }
  // Each level alone through the paged prefill wrapper (what the cascade's run() composes).
  for (int level = 0; level < 2; ++level) {
    DeviceTensor workspace = make_workspace(ctx, tessera::BatchPrefillPagedWrapper::workspace_size(bounds));
    tessera::BatchPrefillPagedWrapper wrapper(workspace.view, bounds);
    const tessera::CascadeLevel& l = level_plans[level];
    wrapper.plan(l.qo_indptr, l.kv_indptr, l.last_page_len, page, shape, ctx.stream());
    const Timing t = ctx.measure([&](cudaStream_t stream) {
      wrapper.run(q.view, levels[level], o.view, tessera::TensorView(), stream);
    });
    Params p = params;
    add_plan_info(p, wrapper.plan_info());
    ctx.report_time(t, kMicroseconds, std::move(p), level == 0 ? "tessera-prefix-level" : "tessera-suffix-level");
  }
}

// ------------------------------------------------------------------------------------------------
// W7: Quest-style page selection. One decode (B=1, Hq=Hkv=32, D=128, page 16) over a sequence of S
// tokens whose pages are a random permutation of the pool, reading only a budget of selected
// pages: a random subset of the sequence's pages in increasing order, the same for every head. The
// selection is the page table (its last page full), so this is the paged decode over a short table,
// through the one-shot kernels ("tessera") and the runtime ("tessera-runtime"), in microseconds
// (and GB/s of the selected K/V). Anchors at S=32768 (microseconds): FlashInfer paper 22 / 29 / 45 /
// 68 for budgets 64 / 128 / 256 / 512; FlashInfer 0.3.1 decode measured 59 / 59 / 65 / 89.
// Target: <= 18 / 23 / 36 / 55 at S=32768.

constexpr int64_t kW7Heads = 32;
constexpr int64_t kW7Budgets[] = {64, 128, 256, 512};
constexpr int64_t kW7Lengths[] = {4096, 32768};
constexpr double kW7PaperUs[] = {22, 29, 45, 68};
constexpr double kW7FlashInferUs[] = {59, 59, 65, 89};
constexpr double kW7TargetUs[] = {18, 23, 36, 55};

void run_w7(BenchContext& ctx, int64_t seq, size_t budget_index) {
  const int64_t budget = kW7Budgets[budget_index], page = kDecodePageSize;
  const int64_t seq_pages = seq / page;
  const std::vector<int32_t> pool = random_permutation(seq_pages, kPermutationSeed + static_cast<uint64_t>(seq));
  // The selection: `budget` of the sequence's logical pages, in increasing order.
  std::vector<int32_t> logical(static_cast<size_t>(seq_pages));
  std::iota(logical.begin(), logical.end(), 0);
  std::mt19937_64 rng(kPermutationSeed + static_cast<uint64_t>(budget));
  std::shuffle(logical.begin(), logical.end(), rng);
  logical.resize(static_cast<size_t>(budget));
  std::sort(logical.begin(), logical.end());
  std::vector<int32_t> selected;
  for (const int32_t l : logical) selected.push_back(pool[l]);
  const std::vector<int32_t> indptr{0, static_cast<int32_t>(budget)}, last{static_cast<int32_t>(page)};
  DeviceTensor k = ctx.random_tensor(kDType, {seq_pages, page, kW7Heads, kHeadDim});
  DeviceTensor v = ctx.random_tensor(kDType, {seq_pages, page, kW7Heads, kHeadDim});
  DeviceTensor indices = ctx.upload_i32(selected), indptr_dev = ctx.upload_i32(indptr), last_dev = ctx.upload_i32(last);
  DeviceTensor q = ctx.random_tensor(kDType, {1, kW7Heads, kHeadDim});
  DeviceTensor o = ctx.empty_tensor(kDType, {1, kW7Heads, kHeadDim});
  const double bytes = 2.0 * static_cast<double>(budget * page) * kW7Heads * kHeadDim * kElemBytes;
  Params params = {{"B", int64_t{1}}, {"S", seq}, {"budget_pages", budget}, {"Hq", kW7Heads}, {"Hkv", kW7Heads},
                   {"D", kHeadDim}, {"page_size", page}, {"dtype", "bf16"}, {"selected_kv_bytes", bytes}};
  if (seq == 32768) {
    add_anchor(params, "anchor_flashinfer_paper_us", kW7PaperUs[budget_index]);
    add_anchor(params, "anchor_flashinfer_measured_us", kW7FlashInferUs[budget_index]);
    add_anchor(params, "target_us", kW7TargetUs[budget_index]);
  }
  {
    const tessera::PagedKV kv{k.view, v.view, tessera::Layout::kNHD, indptr_dev.view, indices.view, last_dev.view};
    const Timing t = ctx.measure([&](cudaStream_t stream) {
      tessera::batch_decode_paged(q.view, kv, o.view, tessera::TensorView(), {}, stream);
    });
    ctx.report_time(t, kMicroseconds, params, "tessera");
  }
  // The runtime with its automatic tile (the wide 16-row tile when few tiles would leave SMs
  // idle), and with the 4-warp 16-row tile as an ablation (two CTAs an SM: twice the columns).
  for (const tessera::QueryTile tile : {tessera::QueryTile::kAuto, tessera::QueryTile::k16}) {
    const tessera::RuntimeBounds bounds{1, 1, kW7Heads, kW7Heads, kHeadDim};
    tessera::RuntimeOptions options;
    options.q_tile = tile;
    DeviceTensor workspace = make_workspace(ctx, tessera::BatchDecodeWrapper::workspace_size(bounds, options));
    tessera::BatchDecodeWrapper wrapper(workspace.view, bounds, options);
    wrapper.plan(host_i32(indptr), host_i32(last), page, runtime_shape(kW7Heads, kW7Heads, kHeadDim, false),
                 ctx.stream());
    const tessera::PagedKVCache paged{k.view, v.view, tessera::Layout::kNHD, indices.view};
    const Timing t = ctx.measure([&](cudaStream_t stream) {
      wrapper.run(q.view, paged, o.view, tessera::TensorView(), stream);
    });
    Params p = params;
    add_plan_info(p, wrapper.plan_info());
    ctx.report_time(t, kMicroseconds, std::move(p),
                    tile == tessera::QueryTile::kAuto ? "tessera-runtime" : "tessera-runtime-t16");
  }
}

// ------------------------------------------------------------------------------------------------
// Block masks over paged KV (BatchBlockSparsePagedWrapper; not a workload of the brief): B = 8
// requests of S = 4096 new tokens over KV 4096 (prefill), Hq 32, Hkv 8, D 128, page 16 (a random
// permutation), blocks of 128 x 128, bf16. Masks: `causal` (the causal block set, blocks below the
// diagonal flagged full, causal masking on the diagonal: the same work as the paged prefill
// runtime's causal plan, impl `tessera-runtime-paged`), `window` (blocks within 1024 keys of the
// diagonal, the built-in window 1024 on top; against the runtime's window variant) and `select25`
// (each block row keeps its diagonal block and a fixed-seed random quarter of the blocks before
// it, as KV selection does; TFLOP/s on the selected pairs, against the runtime's full causal
// plan, whose TFLOP/s counts all causal pairs). Flops: 4 x D x Hq x visible pairs.

constexpr int64_t kBsrBatch = 8, kBsrLen = 4096, kBsrBlock = 128, kBsrWindow = 1024;

void run_bsr_paged(BenchContext& ctx, const std::string& mask) {
  const std::vector<int64_t> lens(kBsrBatch, kBsrLen);
  const int64_t total = sum(lens), page = 16, blocks = kBsrLen / kBsrBlock;
  const bool window = mask == "window", select = mask == "select25";
  std::mt19937_64 rng(kPermutationSeed);
  std::bernoulli_distribution keep(0.25);
  std::vector<int32_t> mask_indptr{0}, mask_indices;
  std::vector<uint8_t> flags;
  double pairs = 0;
  for (int64_t b = 0; b < kBsrBatch; ++b) {
    for (int64_t r = 0; r < blocks; ++r) {
      for (int64_t c = 0; c <= r; ++c) {
        const bool in_window = (r - c) * kBsrBlock <= kBsrWindow;  // some key of the block is in it
        if ((window && !in_window) || (select && c != r && !keep(rng))) continue;
        mask_indices.push_back(static_cast<int32_t>(c));
        // Whole under every mask in effect: below the diagonal, and (window) every key of the block
        // within 1024 of every query of the row.
        const bool whole = c < r && (!window || (r - c + 1) * kBsrBlock - 1 <= kBsrWindow);
        flags.push_back(whole ? 1 : 0);
        for (int64_t i = r * kBsrBlock; i < (r + 1) * kBsrBlock; ++i) {
          const int64_t first = window ? std::max<int64_t>(c * kBsrBlock, i - kBsrWindow) : c * kBsrBlock;
          pairs += static_cast<double>(std::max<int64_t>(0, std::min(i + 1, (c + 1) * kBsrBlock) - first));
        }
      }
      mask_indptr.push_back(static_cast<int32_t>(mask_indices.size()));
    }
  }
  const double flops = 4.0 * static_cast<double>(kHeadDim * kQoHeads) * pairs;
  Params params = {{"B", kBsrBatch}, {"S", kBsrLen}, {"Hq", kQoHeads}, {"Hkv", kKvHeads}, {"D", kHeadDim},
                   {"page_size", page}, {"block", kBsrBlock}, {"mask", mask}, {"dtype", "bf16"},
                   {"listed_blocks", static_cast<int64_t>(mask_indices.size())},
                   {"flops", "4*D*visible_pairs*Hq"}};
  Packed q = make_packed(ctx, lens, kQoHeads, kHeadDim);
  DeviceTensor o = ctx.empty_tensor(kDType, {total, kQoHeads, kHeadDim});
  PagedCache cache = make_paged_cache(ctx, lens, page, kKvHeads, kHeadDim);
  const tessera::PagedKVCache paged{cache.kv.k, cache.kv.v, tessera::Layout::kNHD, cache.kv.indices};
  const std::vector<int32_t> qo_indptr = indptr_of(lens);
  const HostPages pages = host_pages(lens, page);
  tessera::PlanShape shape = runtime_shape(kQoHeads, kKvHeads, kHeadDim, true);
  if (window) shape.attention.variant.window_left = kBsrWindow;
  {
    const tessera::RuntimeBounds bounds{kBsrBatch * blocks, total, kQoHeads, kKvHeads, kHeadDim};
    DeviceTensor workspace = make_workspace(ctx, tessera::BatchBlockSparsePagedWrapper::workspace_size(bounds));
    tessera::BatchBlockSparsePagedWrapper wrapper(workspace.view, bounds);
    wrapper.plan(host_i32(qo_indptr), host_i32(pages.indptr), host_i32(pages.last_page_len), page,
                 host_i32(mask_indptr), kBsrBlock, kBsrBlock, shape, ctx.stream());
    DeviceTensor indices = ctx.upload_i32(mask_indices);
    DeviceTensor flag_bytes = ctx.empty_tensor(DType::kU8, {static_cast<int64_t>(flags.size())});
    BENCH_CUDA(cudaMemcpy(flag_bytes.view.data, flags.data(), flags.size(), cudaMemcpyHostToDevice));
    const Timing t = ctx.measure([&](cudaStream_t stream) {
      wrapper.run(q.data.view, paged, indices.view, flag_bytes.view, o.view, tessera::TensorView(), stream);
    });
    Params p = params;
    add_plan_info(p, wrapper.plan_info());
    ctx.report_tflops(t, flops, std::move(p), "tessera-bsr-paged");
  }
  // The paged prefill runtime over the same cache: the same work for `causal` and `window`, all
  // causal pairs for `select25` (what selection saves).
  const tessera::RuntimeBounds bounds{kBsrBatch, total, kQoHeads, kKvHeads, kHeadDim};
  DeviceTensor workspace = make_workspace(ctx, tessera::BatchPrefillPagedWrapper::workspace_size(bounds));
  tessera::BatchPrefillPagedWrapper wrapper(workspace.view, bounds);
  wrapper.plan(host_i32(qo_indptr), host_i32(pages.indptr), host_i32(pages.last_page_len), page, shape, ctx.stream());
  const Timing t = ctx.measure([&](cudaStream_t stream) {
    wrapper.run(q.data.view, paged, o.view, tessera::TensorView(), stream);
  });
  double runtime_pairs = pairs;
  if (select) runtime_pairs = kBsrBatch * visible_pairs(kBsrLen, kBsrLen, true);
  Params p = params;
  add_plan_info(p, wrapper.plan_info());
  ctx.report_tflops(t, 4.0 * static_cast<double>(kHeadDim * kQoHeads) * runtime_pairs, std::move(p),
                    "tessera-runtime-paged");
}

// ------------------------------------------------------------------------------------------------
// W11: prefill and decode in one batch. One request's 4096-token prefill chunk (KV 4096, causal)
// and 64 decodes of KV 4096; Hq 32, Hkv 8, D 128, page 16, bf16, pages a random permutation. Impls,
// each the median time of one run() in microseconds (plan once): the prefill alone
// ("tessera-prefill-alone", paged prefill wrapper) and the decodes alone ("tessera-decode-alone",
// decode wrapper); the two one after the other on one stream ("tessera-sequential"); the whole
// batch as one paged prefill plan ("tessera-one-plan": one launch, one query tile for all).
// Target (issue 25): one launch >= 1.25x faster than sequential and within 1.15x of the slower alone.

constexpr int64_t kW11Decodes = 64, kW11KvLen = 4096, kW11Chunk = 4096;

void run_w11(BenchContext& ctx) {
  const int64_t page = kDecodePageSize, batch = kW11Decodes + 1;
  // Request 0 is the prefill chunk, requests 1..64 the decodes; one pool for all.
  const std::vector<int64_t> kv_lens(static_cast<size_t>(batch), kW11KvLen);
  PagedCache cache = make_paged_cache(ctx, kv_lens, page, kKvHeads, kHeadDim);
  const HostPages pages = host_pages(kv_lens, page);
  std::vector<int64_t> qo_lens(static_cast<size_t>(batch), 1);
  qo_lens[0] = kW11Chunk;
  const int64_t rows = kW11Chunk + kW11Decodes;
  DeviceTensor q = ctx.random_tensor(kDType, {rows, kQoHeads, kHeadDim});
  DeviceTensor o = ctx.empty_tensor(kDType, {rows, kQoHeads, kHeadDim});
  const tessera::PagedKVCache paged{cache.kv.k, cache.kv.v, tessera::Layout::kNHD, cache.kv.indices};
  Params params = {{"prefill_chunk", kW11Chunk}, {"decodes", kW11Decodes}, {"kv_len", kW11KvLen},
                   {"Hq", kQoHeads}, {"Hkv", kKvHeads}, {"D", kHeadDim}, {"page_size", page}, {"dtype", "bf16"}};

  // The prefill request alone: its page range is the first of the pool's table.
  const std::vector<int32_t> prefill_qo{0, static_cast<int32_t>(kW11Chunk)};
  const std::vector<int32_t> prefill_kv{0, pages.indptr[1]}, prefill_last{pages.last_page_len[0]};
  const tessera::RuntimeBounds prefill_bounds{1, kW11Chunk, kQoHeads, kKvHeads, kHeadDim};
  DeviceTensor prefill_ws = make_workspace(ctx, tessera::BatchPrefillPagedWrapper::workspace_size(prefill_bounds));
  tessera::BatchPrefillPagedWrapper prefill(prefill_ws.view, prefill_bounds);
  prefill.plan(host_i32(prefill_qo), host_i32(prefill_kv), host_i32(prefill_last), page,
               runtime_shape(kQoHeads, kKvHeads, kHeadDim, true), ctx.stream());
  // The decodes alone: the table's entries after the prefill's, rebased.
  std::vector<int32_t> decode_kv(pages.indptr.begin() + 1, pages.indptr.end());
  for (int32_t& x : decode_kv) x -= pages.indptr[1];
  const std::vector<int32_t> decode_last(pages.last_page_len.begin() + 1, pages.last_page_len.end());
  const tessera::TensorView decode_indices(static_cast<int32_t*>(cache.kv.indices.data) + pages.indptr[1],
                                           DType::kI32, {pages.indptr.back() - pages.indptr[1]},
                                           cache.kv.indices.device);
  const tessera::PagedKVCache decode_paged{cache.kv.k, cache.kv.v, tessera::Layout::kNHD, decode_indices};
  const tessera::RuntimeBounds decode_bounds{kW11Decodes, kW11Decodes, kQoHeads, kKvHeads, kHeadDim};
  DeviceTensor decode_ws = make_workspace(ctx, tessera::BatchDecodeWrapper::workspace_size(decode_bounds));
  tessera::BatchDecodeWrapper decode(decode_ws.view, decode_bounds);
  decode.plan(host_i32(decode_kv), host_i32(decode_last), page, runtime_shape(kQoHeads, kKvHeads, kHeadDim, false),
              ctx.stream());
  const tessera::TensorView q_decode(static_cast<char*>(q.view.data) + kW11Chunk * kQoHeads * kHeadDim * 2, kDType,
                                     {kW11Decodes, kQoHeads, kHeadDim}, q.view.device);
  const tessera::TensorView o_decode(static_cast<char*>(o.view.data) + kW11Chunk * kQoHeads * kHeadDim * 2, kDType,
                                     {kW11Decodes, kQoHeads, kHeadDim}, o.view.device);
  const tessera::TensorView q_prefill(q.view.data, kDType, {kW11Chunk, kQoHeads, kHeadDim}, q.view.device);
  const tessera::TensorView o_prefill(o.view.data, kDType, {kW11Chunk, kQoHeads, kHeadDim}, o.view.device);
  auto run_prefill = [&](cudaStream_t s) { prefill.run(q_prefill, paged, o_prefill, tessera::TensorView(), s); };
  auto run_decode = [&](cudaStream_t s) { decode.run(q_decode, decode_paged, o_decode, tessera::TensorView(), s); };
  ctx.report_time(ctx.measure(run_prefill), kMicroseconds, params, "tessera-prefill-alone");
  ctx.report_time(ctx.measure(run_decode), kMicroseconds, params, "tessera-decode-alone");
  ctx.report_time(ctx.measure([&](cudaStream_t s) {
                    run_prefill(s);
                    run_decode(s);
                  }),
                  kMicroseconds, params, "tessera-sequential");
  // The whole batch as one paged prefill plan.
  const tessera::RuntimeBounds mixed_bounds{batch, rows, kQoHeads, kKvHeads, kHeadDim};
  DeviceTensor mixed_ws = make_workspace(ctx, tessera::BatchPrefillPagedWrapper::workspace_size(mixed_bounds));
  tessera::BatchPrefillPagedWrapper mixed(mixed_ws.view, mixed_bounds);
  mixed.plan(host_i32(indptr_of(qo_lens)), host_i32(pages.indptr), host_i32(pages.last_page_len), page,
             runtime_shape(kQoHeads, kKvHeads, kHeadDim, true), ctx.stream());
  Params p = params;
  add_plan_info(p, mixed.plan_info());
  p.emplace_back("target", ">= 1.25x faster than tessera-sequential, <= 1.15x the slower alone");
  ctx.report_time(ctx.measure([&](cudaStream_t s) { mixed.run(q.view, paged, o.view, tessera::TensorView(), s); }),
                  kMicroseconds, std::move(p), "tessera-one-plan");

  // The whole batch through the POD wrapper: one launch, each side with its tile. decode_sms 0 is
  // the wrapper's own division; the others are the sweep its model was fitted to.
  const tessera::RuntimeBounds pod_bounds = mixed_bounds;
  for (const int64_t decode_sms : {0, 32, 40, 48, 56, 64}) {
    tessera::PodOptions pod_options;
    pod_options.decode_sms = decode_sms;
    DeviceTensor pod_ws = make_workspace(ctx, tessera::BatchPODPagedWrapper::workspace_size(pod_bounds, pod_options));
    tessera::BatchPODPagedWrapper pod(pod_ws.view, pod_bounds, pod_options);
    pod.plan(host_i32(indptr_of(qo_lens)), host_i32(pages.indptr), host_i32(pages.last_page_len), page,
             runtime_shape(kQoHeads, kKvHeads, kHeadDim, true), ctx.stream());
    const tessera::PodPlanInfo& info = pod.plan_info();
    Params pp = params;
    pp.emplace_back("decode_sms", decode_sms);
    pp.emplace_back("prefill_ctas", static_cast<int64_t>(info.prefill_ctas));
    pp.emplace_back("decode_ctas", static_cast<int64_t>(info.decode_ctas));
    pp.emplace_back("prefill_partials", static_cast<int64_t>(info.prefill.num_partials));
    pp.emplace_back("decode_partials", static_cast<int64_t>(info.decode.num_partials));
    if (decode_sms == 0) pp.emplace_back("target", ">= 1.25x faster than tessera-sequential, <= 1.15x the slower alone");
    ctx.report_time(ctx.measure([&](cudaStream_t s) { pod.run(q.view, paged, o.view, tessera::TensorView(), s); }),
                    kMicroseconds, std::move(pp), decode_sms == 0 ? "tessera-pod" : "tessera-pod-fixed-split");
  }
}

// ------------------------------------------------------------------------------------------------
// The cells, each registered as its own workload.

struct Cell {
  std::string name;
  std::string description;
  std::vector<std::string> suites;
  std::function<void(BenchContext&, const std::string&)> run;
};

std::vector<std::string> suites_for(const char* suite, bool quick) {
  return quick ? std::vector<std::string>{suite, "quick"} : std::vector<std::string>{suite};
}

const std::vector<Cell>& cells() {
  static const std::vector<Cell> all = [] {
    std::vector<Cell> out;
    // W1.
    for (int64_t batch : kW1Batches) {
      for (size_t li = 0; li < std::size(kW1Lengths); ++li) {
        const int64_t len = kW1Lengths[li];
        const bool quick = ((batch == 16 || batch == 64) && (len == 4096 || len == 16384)) ||
                           (batch == 1 && len == 32768) || (batch == 64 && len == 1024);
        out.push_back({"w1_decode_b" + std::to_string(batch) + "_l" + std::to_string(len),
                       "W1 paged decode B=" + std::to_string(batch) + " L=" + std::to_string(len) +
                           " Hq=32 Hkv=8 D=128 page 16" + (batch == 64 ? " (+ CUDA-core kernel)" : ""),
                       suites_for("decode", quick),
                       [batch, li](BenchContext& ctx, const std::string& name) { run_w1(ctx, name, batch, li); }});
      }
    }
    // W1v.
    for (bool skewed : {false, true}) {
      out.push_back({std::string("w1v_decode_") + (skewed ? "skewed" : "uniform"),
                     std::string("W1v paged decode B=64, ") +
                         (skewed ? "L=32768 every 8th request else 1024" : "L=512+(i*7919)%7681"),
                     suites_for("decode", true),
                     [skewed](BenchContext& ctx, const std::string& name) { run_w1v(ctx, name, skewed); }});
    }
    // W2.
    for (const DenseShape& shape : kW2Shapes) {
      for (bool causal : {true, false}) {
        for (size_t li = 0; li < std::size(kW2Lengths); ++li) {
          const int64_t len = kW2Lengths[li];
          const bool quick = shape.tag == 'a' && (len == 4096 || len == 16384);
          out.push_back({std::string("w2") + shape.tag + (causal ? "_causal_s" : "_noncausal_s") + std::to_string(len),
                         "W2 dense prefill B=16 S=" + std::to_string(len) + " H=" + std::to_string(shape.heads) +
                             " D=" + std::to_string(shape.head_dim) + (causal ? " causal" : " non-causal") +
                             ", ragged KV",
                         suites_for("prefill", quick),
                         [shape, causal, li](BenchContext& ctx, const std::string& name) {
                           run_w2(ctx, name, shape, causal, li);
                         }});
        }
      }
    }
    // W4: ragged, paged page 16 (all sets), paged page 1 (constant, skewed), and paged page 128
    // (constant, skewed: pages that hold whole KV tiles, which the Hopper tiles copy by TMA; not a
    // W4 cell of BENCHMARKS.md).
    struct W4Format {
      const char* tag;
      int64_t page_size;
    };
    for (const W4Format& f :
         {W4Format{"ragged", 0}, W4Format{"paged16", 16}, W4Format{"paged1", 1}, W4Format{"paged128", 128}}) {
      for (size_t si = 0; si < w4_sets().size(); ++si) {
        const LengthSet& set = w4_sets()[si];
        const std::string set_name = set.name;
        if ((f.page_size == 1 || f.page_size == 128) && set_name == "uniform") continue;
        const bool quick = (f.page_size == 0 || f.page_size == 16) && set_name == "constant";
        const int64_t page_size = f.page_size;
        out.push_back({std::string("w4_") + f.tag + "_" + set_name,
                       "W4 varlen causal prefill B=16 Hq=32 Hkv=8 D=128, " + set_name + " lengths, " +
                           (page_size > 0 ? "paged KV page " + std::to_string(page_size) : std::string("ragged KV")),
                       suites_for("prefill", quick),
                       [si, page_size](BenchContext& ctx, const std::string& name) {
                         run_w4(ctx, name, w4_sets()[si], page_size);
                       }});
      }
    }
    // W10: fp8 (e4m3) K/V: the W1 grid, and W4 paged 16 (the same run's W1 / W4 cells are the
    // bf16 figures).
    for (int64_t batch : kW1Batches) {
      for (size_t li = 0; li < std::size(kW1Lengths); ++li) {
        const int64_t len = kW1Lengths[li];
        // The quick suite's fp8 cells sit beside its W1 cells of the same shapes.
        const bool quick = (batch == 64 && len == 4096) || (batch == 16 && len == 16384);
        out.push_back({"w10_decode_e4m3_b" + std::to_string(batch) + "_l" + std::to_string(len),
                       "W10 paged decode over an e4m3 cache B=" + std::to_string(batch) + " L=" + std::to_string(len) +
                           " Hq=32 Hkv=8 D=128 page 16",
                       suites_for("fp8", quick),
                       [batch, li](BenchContext& ctx, const std::string& name) { run_w10_decode(ctx, name, batch, li); }});
      }
    }
    // f16 queries over e4m3 (the dequantization into f16 is one cvt per pair) and over f16, at two
    // W1 shapes: what the conversion into bf16 costs.
    for (const auto& [batch, li] : {std::pair<int64_t, size_t>{64, 2}, std::pair<int64_t, size_t>{128, 1}}) {
      const std::string shape = "b" + std::to_string(batch) + "_l" + std::to_string(kW1Lengths[li]);
      out.push_back({"w10_decode_e4m3_f16q_" + shape, "W10 paged decode, f16 queries over an e4m3 cache, " + shape,
                     suites_for("fp8", false), [batch = batch, li = li](BenchContext& ctx, const std::string& name) {
                       run_w10_decode(ctx, name, batch, li, DType::kF16);
                     }});
      out.push_back({"w10_decode_f16_" + shape, "W1 paged decode with f16 queries and cache, " + shape,
                     suites_for("fp8", false), [batch = batch, li = li](BenchContext& ctx, const std::string& name) {
                       const int64_t len = kW1Lengths[li];
                       run_decode(ctx, name, std::vector<int64_t>(static_cast<size_t>(batch), len),
                                  decode_params(batch, len, "auto", DType::kF16, DType::kF16), {}, DType::kF16,
                                  DType::kF16);
                     }});
    }
    // W10(c): FP8 attention at W2a (D128) and W2c (D256), 4k and 16k.
    for (const DenseShape& shape : kW2Shapes) {
      if (shape.tag != 'a' && shape.tag != 'c') continue;
      for (bool causal : {true, false}) {
        for (size_t li : {size_t{3}, size_t{5}}) {
          const int64_t len = kW2Lengths[li];
          out.push_back({std::string("w10_fp8attn_w2") + shape.tag + (causal ? "_causal_s" : "_noncausal_s") +
                             std::to_string(len),
                         "W10 FP8 attention (e4m3 q/k/v, bf16 o) at W2" + std::string(1, shape.tag) + ": B=16 S=" +
                             std::to_string(len) + " H=" + std::to_string(shape.heads) + " D=" +
                             std::to_string(shape.head_dim) + (causal ? " causal" : " non-causal"),
                         suites_for("fp8", shape.tag == 'a' && !causal && len == 16384),
                         [shape, causal, li](BenchContext& ctx, const std::string& name) {
                           run_w10_fp8_attention(ctx, name, shape, causal, li);
                         }});
        }
      }
    }
    // W10(e): fp8 (e4m3) K/V under bf16 queries at W2c (head dim 256, ragged), beside the bf16
    // cells of the same run (w2c_..., the "prefill" suite).
    for (bool causal : {true, false}) {
      for (size_t li : {size_t{3}, size_t{5}}) {
        const int64_t len = kW2Lengths[li];
        out.push_back({std::string("w10_w2c_e4m3kv") + (causal ? "_causal_s" : "_noncausal_s") + std::to_string(len),
                       "W10 W2c (B=16 H=8 D=256) prefill over e4m3 K/V with bf16 queries, S=" + std::to_string(len) +
                           (causal ? " causal" : " non-causal"),
                       suites_for("fp8", false), [causal, len](BenchContext& ctx, const std::string& name) {
                         const DenseShape& c = kW2Shapes[2];
                         Params params = {{"B", kW2Batch}, {"S", len}, {"H", c.heads}, {"D", c.head_dim},
                                          {"mask", causal ? "causal" : "none"}, {"kv", "ragged"},
                                          {"kv_dtype", "e4m3"}, {"flops", "4*D*visible_pairs*H"}};
                         run_prefill(ctx, name, std::vector<int64_t>(static_cast<size_t>(kW2Batch), len), c.heads,
                                     c.heads, c.head_dim, causal, 0, std::move(params), /*with_runtime=*/true,
                                     DType::kE4M3);
                       }});
      }
    }
    for (size_t si = 0; si < w4_sets().size(); ++si) {
      out.push_back({std::string("w10_w4_paged16_e4m3_") + w4_sets()[si].name,
                     std::string("W10 W4 varlen causal prefill over an e4m3 paged cache (page 16), ") +
                         w4_sets()[si].name + " lengths",
                     suites_for("fp8", si == 0), [si](BenchContext& ctx, const std::string& name) {
                       run_w4(ctx, name, w4_sets()[si], 16, DType::kE4M3);
                     }});
    }
    // W7.
    for (int64_t seq : kW7Lengths) {
      for (size_t bi = 0; bi < std::size(kW7Budgets); ++bi) {
        if (kW7Budgets[bi] * kDecodePageSize > seq) continue;  // more pages than the sequence has
        out.push_back({"w7_s" + std::to_string(seq) + "_budget" + std::to_string(kW7Budgets[bi]),
                       "W7 page selection: B=1 Hq=Hkv=32 D=128 page 16, S=" + std::to_string(seq) + ", " +
                           std::to_string(kW7Budgets[bi]) + " selected pages",
                       suites_for("w7", seq == 32768 && kW7Budgets[bi] == 128),
                       [seq, bi](BenchContext& ctx, const std::string&) { run_w7(ctx, seq, bi); }});
      }
    }
    // W11.
    out.push_back({"w11_pod", "W11 one 4096-token prefill chunk + 64 decodes, KV 4096, Hq 32 Hkv 8 D 128 page 16",
                   suites_for("w11", false), [](BenchContext& ctx, const std::string&) { run_w11(ctx); }});
    // W6.
    for (int64_t batch : {16, 64}) {
      for (size_t pi = 0; pi < std::size(kW6Prefixes); ++pi) {
        out.push_back({"w6_b" + std::to_string(batch) + "_p" + std::to_string(kW6Prefixes[pi]),
                       "W6 shared prefix P=" + std::to_string(kW6Prefixes[pi]) + " + 128 own, B=" +
                           std::to_string(batch) + " decode: cascade vs single format",
                       suites_for("w6", batch == 64 && kW6Prefixes[pi] == 32768),
                       [batch, pi](BenchContext& ctx, const std::string&) { run_w6(ctx, batch, pi); }});
      }
    }
    // W5.
    out.push_back({"w5_decode_q1", "W5 baseline: W1 paged decode of W5's KV, B=32 L=4096 Hq=32 Hkv=8 D=128 page 16",
                   suites_for("w5", false), [](BenchContext& ctx, const std::string& name) {
                     run_decode(ctx, name, std::vector<int64_t>(kW5Batch, kW5KvLen),
                                decode_params(kW5Batch, kW5KvLen, "auto"), {});
                   }});
    for (int64_t qo : {2, 4, 8, 128, 512}) {
      for (bool tree : {false, true}) {
        if (tree && qo > 8) continue;
        out.push_back({"w5_q" + std::to_string(qo) + (tree ? "_tree" : ""),
                       "W5 paged prefill through the runtime, B=32 L=4096 qo=" + std::to_string(qo) +
                           (tree ? ", causal + random tree mask" : ", causal"),
                       suites_for("w5", false),
                       [qo, tree](BenchContext& ctx, const std::string&) { run_w5(ctx, qo, tree); }});
      }
    }
    // q = 8 on the 16-row tile (the auto choice is the 64-row tile): what the tree mask costs per tile.
    for (bool tree : {false, true}) {
      out.push_back({std::string("w5_q8") + (tree ? "_tree" : "") + "_t16",
                     std::string("W5 qo=8") + (tree ? " + tree mask" : "") + " on the 16-row query tile",
                     suites_for("w5", false), [tree](BenchContext& ctx, const std::string&) {
                       run_w5(ctx, 8, tree, tessera::QueryTile::k16);
                     }});
    }
    for (const MaskCausal how : {MaskCausal::kBuiltin, MaskCausal::kCustom, MaskCausal::kBuiltinAndCustom}) {
      const char* name = how == MaskCausal::kBuiltin ? "mask_builtin_causal_s4096"
                         : how == MaskCausal::kCustom ? "mask_custom_causal_s4096"
                                                      : "mask_builtin_and_custom_causal_s4096";
      out.push_back({name,
                     std::string("paged prefill B=4 S=4096 through the runtime, causal ") +
                         (how == MaskCausal::kBuiltin  ? "built in"
                          : how == MaskCausal::kCustom ? "as a custom mask (hidden tiles skipped)"
                                                       : "built in and as a custom mask"),
                     suites_for("w5", false),
                     [how](BenchContext& ctx, const std::string&) { run_mask_causal(ctx, how); }});
    }
    for (const char* mask : {"causal", "window", "select25"}) {
      out.push_back({std::string("bsr_paged_") + mask + "_s4096",
                     std::string("block mask (") + mask + ") over paged KV, B=8 S=4096 Hq=32 Hkv=8 D=128 page 16, "
                         "blocks 128 x 128, against the paged prefill runtime",
                     suites_for("bsr", false),
                     [mask](BenchContext& ctx, const std::string&) { run_bsr_paged(ctx, mask); }});
    }
    // W8.
    out.push_back({"w8_plan_decode_b128", "W8 plan() CPU time, decode B=128 L=4096 page 16",
                   suites_for("runtime", true),
                   [](BenchContext& ctx, const std::string&) { run_w8_decode(ctx); }});
    out.push_back({"w8_plan_prefill_w4_skewed", "W8 plan() CPU time, paged prefill W4 skewed (B=16, causal)",
                   suites_for("runtime", true),
                   [](BenchContext& ctx, const std::string&) { run_w8_prefill(ctx); }});
    return out;
  }();
  return all;
}

// Workload functions are plain function pointers: one instantiation per cell index.
constexpr size_t kMaxCells = 160;

template <size_t I>
void run_cell(BenchContext& ctx) {
  const Cell& cell = cells()[I];
  cell.run(ctx, cell.name);
}

template <size_t... I>
bool register_cells(std::index_sequence<I...>) {
  constexpr WorkloadFn kFns[] = {&run_cell<I>...};
  const std::vector<Cell>& all = cells();
  if (all.size() > sizeof...(I)) {
    std::fprintf(stderr, "tessera-bench: bench_attention.cpp has %zu cells; raise kMaxCells\n", all.size());
    std::abort();
  }
  for (size_t i = 0; i < all.size(); ++i) {
    register_workload(Workload{all[i].name, all[i].suites, all[i].description, kFns[i]});
  }
  return true;
}

[[maybe_unused]] const bool kAttentionCellsRegistered = register_cells(std::make_index_sequence<kMaxCells>{});

}  // namespace
}  // namespace tessera_bench
