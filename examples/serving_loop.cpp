// A serving loop over Tessera, shaped like one model: kLayers layers of GQA attention (Hq 32,
// Hkv 8, head dim 128, bf16), each with its own paged KV cache (page 16, NHD) over one page table,
// and 16 requests whose prompts range from 1 to 16384 tokens. The values a model's projections
// would produce (q and the new tokens' K/V) are random normal values written on the GPU.
//
//  1. Prefill: the prompts get pages from a shuffled free list; per layer their K/V rows are
//     appended to the cache (append_paged_kv_cache) and attended with causal masking by a
//     BatchPrefillPagedWrapper planned once for the batch.
//  2. Decode, --steps steps: each step gives every request one token (a new page when it crosses
//     a page boundary), appends its K/V row to every layer's cache, plans a BatchDecodeWrapper
//     once and replays a CUDA Graph holding every layer's run(), captured at the first step
//     (RuntimeOptions::cuda_graph: fixed q/o/lse/page-table buffers whose contents change).
//  3. Checks against the fp64 oracle (tests/reference), computed from the K/V rows handed to the
//     append kernel (read back from their input buffers, not from the cache): every layer's cache
//     against those rows, bit for bit; every layer's prefill output at three rows per request;
//     every layer's output of the last decode step for every request.
//  4. Speed: the copy and GEMM ceilings of this GPU measured in this run (bench/ceilings.cpp),
//     the prefill attention against the GEMM ceiling, the decode attention's KV read rate against
//     the copy ceiling, and the wall time of a whole decode step.
//
// Usage: tessera-serving-loop [--steps N]. Exit status 0 when every check passes; without a GPU
// it prints one line and exits 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "example_support.h"
#include "harness.h"
#include "reference/oracle.h"
#include "tessera/runtime.h"
#include "tessera/tessera.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::TensorView;
using tessera_bench::BenchContext;
using tessera_bench::DeviceBuffer;
using tessera_bench::Timing;
using tessera_examples::Bf16Bits;

constexpr int64_t kLayers = 4, kQoHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 16;
constexpr DType kDType = DType::kBF16;
constexpr int64_t kElemBytes = 2;
constexpr int64_t kKvRow = kKvHeads * kHeadDim;  // elements of one token's K (or V) in one layer
constexpr int64_t kQRow = kQoHeads * kHeadDim;   // elements of one token's q (or o)
// Lengths a serving batch mixes: single tokens, page boundaries (15, 16, 17), long contexts.
const std::vector<int64_t> kPrompts = {1,    15,   16,   17,   130,  515,  1000, 2049,
                                       3000, 4096, 5000, 6000, 7001, 8192, 12000, 16384};
constexpr int kDefaultSteps = 32;

/// Hands out the pages of the pool in a shuffled order: after a while a serving engine's free
/// list is in no particular order, so a request's pages are scattered over the pool.
class PageAllocator {
 public:
  PageAllocator(int64_t num_pages, uint64_t seed) : free_(tessera_bench::random_permutation(num_pages, seed)) {}
  int32_t take() {
    if (free_.empty()) throw tessera_bench::FatalError("the page pool is exhausted (size it for the longest run)");
    const int32_t page = free_.back();
    free_.pop_back();
    return page;
  }

 private:
  std::vector<int32_t> free_;
};

/// One request: its KV length and its pages, in order.
struct Sequence {
  int64_t len = 0;
  std::vector<int32_t> pages;

  void grow(int64_t tokens, PageAllocator& allocator) {
    len += tokens;
    while (static_cast<int64_t>(pages.size()) * kPageSize < len) pages.push_back(allocator.take());
  }
};

/// The batch's page table as plan() (host) and append / run() (device copies) take it.
struct PageTable {
  std::vector<int32_t> indptr{0}, indices, last_page_len;

  explicit PageTable(const std::vector<Sequence>& seqs) {
    for (const Sequence& s : seqs) {
      indices.insert(indices.end(), s.pages.begin(), s.pages.end());
      indptr.push_back(static_cast<int32_t>(indices.size()));
      const int64_t full_pages = std::max<int64_t>(static_cast<int64_t>(s.pages.size()) - 1, 0);
      last_page_len.push_back(static_cast<int32_t>(s.len - full_pages * kPageSize));
    }
  }
};

TensorView host_i32(const std::vector<int32_t>& v) {
  return TensorView(const_cast<int32_t*>(v.data()), DType::kI32, {static_cast<int64_t>(v.size())}, Device::cpu());
}

const char* byte_at(const DeviceBuffer& buf, int64_t element, int64_t elem_bytes = kElemBytes) {
  return buf.as<const char>() + element * elem_bytes;
}
char* byte_at(DeviceBuffer& buf, int64_t element, int64_t elem_bytes = kElemBytes) {
  return buf.as<char>() + element * elem_bytes;
}

/// The fixed device buffers of the model: one K and one V page pool per layer, and the page table
/// (at fixed addresses: the captured graph and the append calls read them there).
struct ModelCache {
  int64_t num_pages = 0;
  int64_t batch = 0;
  Device gpu;
  std::vector<DeviceBuffer> k, v;  // per layer, [num_pages, page, Hkv, D]
  DeviceBuffer indptr, indices, last_page_len;

  /// Zeroes the pools (as serving engines allocate them) and the page ids, ordered on `stream`.
  ModelCache(int64_t pages, int64_t batch_size, Device device, cudaStream_t stream)
      : num_pages(pages), batch(batch_size), gpu(device), indptr((batch_size + 1) * 4), indices(pages * 4),
        last_page_len(batch_size * 4) {
    for (int64_t l = 0; l < kLayers; ++l) {
      k.emplace_back(pages * kPageSize * kKvRow * kElemBytes);
      v.emplace_back(pages * kPageSize * kKvRow * kElemBytes);
      BENCH_CUDA(cudaMemsetAsync(k.back().get(), 0, k.back().bytes(), stream));
      BENCH_CUDA(cudaMemsetAsync(v.back().get(), 0, v.back().bytes(), stream));
    }
    // Entries past the current table are never read; zeros keep them valid page ids anyway.
    BENCH_CUDA(cudaMemsetAsync(indices.get(), 0, indices.bytes(), stream));
  }
  /// Copies the host page table into the device arrays, ordered on `stream`. The source is
  /// pageable, so the call returns once the bytes are staged: `table` may change afterwards.
  void upload(const PageTable& table, cudaStream_t stream) {
    BENCH_CUDA(cudaMemcpyAsync(indptr.get(), table.indptr.data(), table.indptr.size() * 4, cudaMemcpyHostToDevice, stream));
    BENCH_CUDA(cudaMemcpyAsync(indices.get(), table.indices.data(), table.indices.size() * 4, cudaMemcpyHostToDevice,
                               stream));
    BENCH_CUDA(cudaMemcpyAsync(last_page_len.get(), table.last_page_len.data(), table.last_page_len.size() * 4,
                               cudaMemcpyHostToDevice, stream));
  }
  TensorView pages_view(const DeviceBuffer& pool) const {
    return TensorView(pool.get(), kDType, {num_pages, kPageSize, kKvHeads, kHeadDim}, gpu);
  }
  /// What append_paged_kv_cache takes for `layer`.
  tessera::PagedKV for_append(int64_t layer) const {
    tessera::PagedKV kv;
    kv.k = pages_view(k[layer]);
    kv.v = pages_view(v[layer]);
    kv.layout = tessera::Layout::kNHD;
    kv.indptr = TensorView(indptr.get(), DType::kI32, {batch + 1}, gpu);
    kv.indices = TensorView(indices.get(), DType::kI32, {num_pages}, gpu);
    kv.last_page_len = TensorView(last_page_len.get(), DType::kI32, {batch}, gpu);
    return kv;
  }
  /// What the runtime's run() takes for `layer` (page ranges come from plan()).
  tessera::PagedKVCache for_run(int64_t layer) const {
    return {pages_view(k[layer]), pages_view(v[layer]), tessera::Layout::kNHD,
            TensorView(indices.get(), DType::kI32, {num_pages}, gpu)};
  }
};

/// Device tensors of one phase (prefill or decode), for every layer: q, o and the base-2 LSE.
struct PhaseBuffers {
  int64_t rows = 0;  // query rows per layer
  DeviceBuffer q, o, lse;
  PhaseBuffers(int64_t query_rows)
      : rows(query_rows),
        q(kLayers * query_rows * kQRow * kElemBytes),
        o(kLayers * query_rows * kQRow * kElemBytes),
        lse(kLayers * query_rows * kQoHeads * 4) {}
  TensorView q_view(int64_t layer, Device gpu) {
    return TensorView(byte_at(q, layer * rows * kQRow), kDType, {rows, kQoHeads, kHeadDim}, gpu);
  }
  TensorView o_view(int64_t layer, Device gpu) {
    return TensorView(byte_at(o, layer * rows * kQRow), kDType, {rows, kQoHeads, kHeadDim}, gpu);
  }
  TensorView lse_view(int64_t layer, Device gpu) {
    return TensorView(byte_at(lse, layer * rows * kQoHeads, 4), DType::kF32, {rows, kQoHeads}, gpu);
  }
};

tessera::PlanShape model_shape(bool causal) {
  tessera::PlanShape shape{kQoHeads, kKvHeads, kHeadDim, kDType, {}, {}, 0};
  shape.attention.causal = causal;
  return shape;
}

/// A device workspace of `bytes`, as the runtime wrappers take it.
struct Workspace {
  DeviceBuffer buf;
  TensorView view;
  Workspace(int64_t bytes, Device gpu) : buf(bytes), view(buf.get(), DType::kU8, {bytes}, gpu) {}
};

/// Seeds of fill_random_normal: a new one for every tensor the "model" produces.
struct Seeds {
  uint64_t next = 20261122;
  uint64_t operator()() { return next++; }
};

/// The K/V rows handed to the append kernel, kept on the host to rebuild every request's
/// sequence independently of the cache: the prompts (per layer [prompt tokens, Hkv, D]) and the
/// decode tokens (per step and layer [batch, Hkv, D]).
struct AppendedRows {
  std::vector<int32_t> prompt_indptr;
  std::vector<std::vector<Bf16Bits>> prompt_k, prompt_v;  // [layer]
  std::vector<Bf16Bits> decode_kv;                        // [step, layer, K|V, batch, Hkv, D]
  int64_t batch = 0, steps = 0;

  /// Request b's K (which = 0) or V (which = 1) rows in `layer`: its prompt, then its decode
  /// tokens. [prompt_b + steps, Hkv, D].
  std::vector<Bf16Bits> sequence(int64_t layer, int64_t b, int which) const {
    const auto& prompt = which == 0 ? prompt_k[layer] : prompt_v[layer];
    const size_t begin = static_cast<size_t>(prompt_indptr[b]) * kKvRow;
    const size_t prompt_elems = static_cast<size_t>(prompt_indptr[b + 1] - prompt_indptr[b]) * kKvRow;
    std::vector<Bf16Bits> bits(prompt.begin() + begin, prompt.begin() + begin + prompt_elems);
    for (int64_t s = 0; s < steps; ++s) {
      const size_t at = static_cast<size_t>((((s * kLayers + layer) * 2 + which) * batch + b) * kKvRow);
      bits.insert(bits.end(), decode_kv.begin() + at, decode_kv.begin() + at + kKvRow);
    }
    return bits;
  }
};

std::vector<double> first_rows(const std::vector<double>& seq, int64_t rows) {
  return std::vector<double>(seq.begin(), seq.begin() + rows * kKvRow);
}

/// The oracle's output for a query row at position `pos` of a request whose keys are `k`, `v`:
/// the row sees keys 0 .. pos (causal), which is a one-row call over the first pos + 1 keys.
tessera_ref::State oracle_row(const std::vector<double>& q_row, const std::vector<double>& k,
                              const std::vector<double>& v, int64_t pos) {
  tessera_ref::Options opts;  // sm_scale 1/sqrt(D), as the kernels default to
  opts.causal = true;
  return tessera_ref::attention_single(q_row, first_rows(k, pos + 1), first_rows(v, pos + 1), 1, pos + 1,
                                       {kQoHeads, kKvHeads, kHeadDim}, opts);
}

/// Query row `row` of `layer` in a phase: q, o (doubles) and the LSE (base 2).
struct RowOutput {
  std::vector<double> q, o, lse;
};
RowOutput read_row(const PhaseBuffers& p, int64_t layer, int64_t row) {
  const int64_t at = layer * p.rows + row;
  const auto q_bits = tessera_examples::download_bf16_bits(byte_at(p.q, at * kQRow), kQRow);
  const auto o_bits = tessera_examples::download_bf16_bits(byte_at(p.o, at * kQRow), kQRow);
  return {tessera_examples::bf16_bits_to_double(q_bits.data(), q_bits.size()),
          tessera_examples::bf16_bits_to_double(o_bits.data(), o_bits.size()),
          tessera_examples::download_f32(byte_at(p.lse, at * kQoHeads, 4), kQoHeads)};
}

/// Elements of request `seq`'s rows in a page pool (host copy) that differ from `expected`.
int64_t cache_mismatches(const std::vector<Bf16Bits>& pool, const Sequence& seq, const std::vector<Bf16Bits>& expected) {
  int64_t mismatches = 0;
  for (int64_t t = 0; t < seq.len; ++t) {
    const Bf16Bits* slot = pool.data() + (seq.pages[t / kPageSize] * kPageSize + t % kPageSize) * kKvRow;
    mismatches += std::inner_product(slot, slot + kKvRow, expected.begin() + t * kKvRow, int64_t{0}, std::plus<>(),
                                     std::not_equal_to<>());
  }
  return mismatches;
}

int parse_steps(int argc, char** argv) {
  int steps = kDefaultSteps;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--steps" && i + 1 < argc) {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 1 || v > 4096) {
        throw tessera_bench::FatalError("--steps " + std::string(argv[i]) + ": expected an integer in [1, 4096]");
      }
      steps = static_cast<int>(v);
    } else {
      throw tessera_bench::FatalError("unknown argument '" + arg + "'; usage: tessera-serving-loop [--steps N]");
    }
  }
  return steps;
}

int run(int argc, char** argv) {
  const int steps = parse_steps(argc, argv);
  const int64_t batch = static_cast<int64_t>(kPrompts.size());
  const int64_t prompt_tokens = std::accumulate(kPrompts.begin(), kPrompts.end(), int64_t{0});

  const tessera_bench::RunInfo info = tessera_examples::announce("tessera-serving-loop");
  std::printf("model: %lld layers, Hq %lld, Hkv %lld, head dim %lld, bf16; paged KV cache per layer (page %lld, NHD)\n"
              "batch: %lld requests, prompts of 1 to 16384 tokens (%lld in all), then %d decode steps\n\n",
              static_cast<long long>(kLayers), static_cast<long long>(kQoHeads), static_cast<long long>(kKvHeads),
              static_cast<long long>(kHeadDim), static_cast<long long>(kPageSize), static_cast<long long>(batch),
              static_cast<long long>(prompt_tokens), steps);

  tessera_bench::OutputSink sink(info, "");
  // No cool-down: the attention timed here is memory-bound, which the power cap does not slow.
  BenchContext ctx(0, /*iters=*/10, /*warmup=*/2, /*cooldown_ms=*/0, sink);
  std::printf("ceilings of this GPU, measured now:\n");
  tessera_bench::run_workloads(ctx, {});
  const double copy_gbps = ctx.ceiling(tessera_bench::kCopyCeiling);
  const double gemm_tflops = ctx.ceiling(tessera_bench::kGemmCeiling);

  const Device gpu = ctx.tensor_device();
  const cudaStream_t stream = ctx.stream();
  Seeds seeds;
  int64_t pool_pages = 0;
  for (int64_t p : kPrompts) pool_pages += (p + steps + kPageSize - 1) / kPageSize;
  ModelCache cache(pool_pages, batch, gpu, stream);
  PageAllocator allocator(pool_pages, /*seed=*/7);
  std::vector<Sequence> seqs(kPrompts.size());

  AppendedRows appended;
  appended.batch = batch;
  appended.steps = steps;
  appended.prompt_indptr = {0};
  for (int64_t p : kPrompts) appended.prompt_indptr.push_back(appended.prompt_indptr.back() + static_cast<int32_t>(p));

  // ---- 1. Prefill -------------------------------------------------------------------------------
  for (size_t b = 0; b < seqs.size(); ++b) seqs[b].grow(kPrompts[b], allocator);
  const PageTable prefill_table(seqs);
  cache.upload(prefill_table, stream);
  DeviceBuffer prompt_indptr(appended.prompt_indptr.size() * 4);
  BENCH_CUDA(cudaMemcpyAsync(prompt_indptr.get(), appended.prompt_indptr.data(), prompt_indptr.bytes(),
                             cudaMemcpyHostToDevice, stream));
  DeviceBuffer prompt_k(kLayers * prompt_tokens * kKvRow * kElemBytes), prompt_v(prompt_k.bytes());
  PhaseBuffers prefill(prompt_tokens);
  tessera_bench::fill_random_normal(prompt_k.get(), kDType, kLayers * prompt_tokens * kKvRow, seeds(), stream);
  tessera_bench::fill_random_normal(prompt_v.get(), kDType, kLayers * prompt_tokens * kKvRow, seeds(), stream);
  tessera_bench::fill_random_normal(prefill.q.get(), kDType, kLayers * prompt_tokens * kQRow, seeds(), stream);

  const tessera::RuntimeBounds prefill_bounds{batch, prompt_tokens, kQoHeads, kKvHeads, kHeadDim};
  Workspace prefill_ws(tessera::BatchPrefillPagedWrapper::workspace_size(prefill_bounds), gpu);
  tessera::BatchPrefillPagedWrapper prefill_wrapper(prefill_ws.view, prefill_bounds);
  for (int64_t l = 0; l < kLayers; ++l) {
    const TensorView new_k(byte_at(prompt_k, l * prompt_tokens * kKvRow), kDType, {prompt_tokens, kKvHeads, kHeadDim}, gpu);
    const TensorView new_v(byte_at(prompt_v, l * prompt_tokens * kKvRow), kDType, {prompt_tokens, kKvHeads, kHeadDim}, gpu);
    tessera::append_paged_kv_cache(new_k, new_v, TensorView(prompt_indptr.get(), DType::kI32, {batch + 1}, gpu),
                                   cache.for_append(l), stream);
  }
  // One plan for the batch; every layer's run() reuses it. The runs are timed as a benchmark
  // (warm-up, L2 flushed before each repetition); run() on the same inputs gives the same bits, so
  // the outputs checked below are those of any repetition.
  BENCH_CUDA(cudaMemsetAsync(prefill.o.get(), 0xFF, prefill.o.bytes(), stream));  // NaN: unwritten rows fail
  prefill_wrapper.plan(host_i32(appended.prompt_indptr), host_i32(prefill_table.indptr),
                       host_i32(prefill_table.last_page_len), kPageSize, model_shape(/*causal=*/true), stream);
  const Timing prefill_time = ctx.measure([&](cudaStream_t s) {
    for (int64_t l = 0; l < kLayers; ++l) {
      prefill_wrapper.run(prefill.q_view(l, gpu), cache.for_run(l), prefill.o_view(l, gpu), prefill.lse_view(l, gpu), s);
    }
  });
  std::printf("\nprefill: %lld prompt tokens appended to each layer's cache; one plan, %lld causal run()s\n",
              static_cast<long long>(prompt_tokens), static_cast<long long>(kLayers));

  // ---- 2. Decode --------------------------------------------------------------------------------
  // Fixed buffers, as the CUDA Graph needs: q, o, lse of every layer, the new K/V rows of every
  // step (kept for the checks) and append_indptr = 0, 1, ..., batch (one token per request).
  PhaseBuffers decode(batch);
  DeviceBuffer decode_kv(static_cast<size_t>(steps) * kLayers * 2 * batch * kKvRow * kElemBytes);
  std::vector<int32_t> one_each(batch + 1);
  std::iota(one_each.begin(), one_each.end(), 0);
  DeviceBuffer one_each_dev(one_each.size() * 4);
  BENCH_CUDA(cudaMemcpyAsync(one_each_dev.get(), one_each.data(), one_each_dev.bytes(), cudaMemcpyHostToDevice, stream));
  const TensorView append_indptr(one_each_dev.get(), DType::kI32, {batch + 1}, gpu);

  tessera::RuntimeOptions graph_options;
  graph_options.cuda_graph = true;
  graph_options.dtype = kDType;
  const tessera::RuntimeBounds decode_bounds{batch, batch, kQoHeads, kKvHeads, kHeadDim};
  Workspace decode_ws(tessera::BatchDecodeWrapper::workspace_size(decode_bounds, graph_options), gpu);
  tessera::BatchDecodeWrapper decode_wrapper(decode_ws.view, decode_bounds, graph_options);

  cudaGraphExec_t graph = nullptr;
  std::vector<double> step_wall_us, attention_us, kv_gbps;
  double kv_bytes_last_step = 0;
  tessera_bench::Timer attention_timer;
  for (int step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    for (Sequence& s : seqs) s.grow(1, allocator);
    const PageTable table(seqs);
    cache.upload(table, stream);
    // The "model": the new tokens' K/V rows of every layer, and q of every layer.
    char* step_kv = byte_at(decode_kv, static_cast<int64_t>(step) * kLayers * 2 * batch * kKvRow);
    tessera_bench::fill_random_normal(step_kv, kDType, kLayers * 2 * batch * kKvRow, seeds(), stream);
    tessera_bench::fill_random_normal(decode.q.get(), kDType, kLayers * batch * kQRow, seeds(), stream);
    for (int64_t l = 0; l < kLayers; ++l) {
      char* k_rows = step_kv + (l * 2) * batch * kKvRow * kElemBytes;
      char* v_rows = step_kv + (l * 2 + 1) * batch * kKvRow * kElemBytes;
      tessera::append_paged_kv_cache(TensorView(k_rows, kDType, {batch, kKvHeads, kHeadDim}, gpu),
                                     TensorView(v_rows, kDType, {batch, kKvHeads, kHeadDim}, gpu), append_indptr,
                                     cache.for_append(l), stream);
    }
    // One plan per step, outside the capture, on the stream that replays.
    decode_wrapper.plan(host_i32(table.indptr), host_i32(table.last_page_len), kPageSize, model_shape(false), stream);
    if (graph == nullptr) {
      cudaGraph_t captured = nullptr;
      BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int64_t l = 0; l < kLayers; ++l) {
        decode_wrapper.run(decode.q_view(l, gpu), cache.for_run(l), decode.o_view(l, gpu), decode.lse_view(l, gpu),
                           stream);
      }
      BENCH_CUDA(cudaStreamEndCapture(stream, &captured));
      BENCH_CUDA(cudaGraphInstantiate(&graph, captured, 0));
      BENCH_CUDA(cudaGraphDestroy(captured));
    }
    attention_timer.start(stream);
    BENCH_CUDA(cudaGraphLaunch(graph, stream));
    attention_timer.stop(stream);
    // A serving engine waits here for the step's tokens before it schedules the next one.
    BENCH_CUDA(cudaStreamSynchronize(stream));
    step_wall_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    attention_us.push_back(attention_timer.elapsed_us());
    int64_t kv_tokens = 0;
    for (const Sequence& s : seqs) kv_tokens += s.len;
    kv_bytes_last_step = 2.0 * kLayers * static_cast<double>(kv_tokens) * kKvRow * kElemBytes;  // K and V
    kv_gbps.push_back(kv_bytes_last_step / (attention_us.back() * 1e-6) / 1e9);
  }
  BENCH_CUDA(cudaGraphExecDestroy(graph));
  const tessera::PlanInfo plan = decode_wrapper.plan_info();
  std::printf("decode: %d steps; each appends one token per request to every layer, plans once and replays one\n"
              "        CUDA Graph of %lld run()s (last plan: %d work items and %d split chunks per KV head)\n",
              steps, static_cast<long long>(kLayers), plan.num_items, plan.num_partials);

  // ---- 3. Checks against the oracle ------------------------------------------------------------
  ctx.synchronize();  // the copies below run on the legacy default stream  std::printf("\nresults against the fp64 oracle (tests/reference), from the K/V rows handed to the append kernel:\n");
  for (int64_t l = 0; l < kLayers; ++l) {
    appended.prompt_k.push_back(tessera_examples::download_bf16_bits(byte_at(prompt_k, l * prompt_tokens * kKvRow),
                                                                     prompt_tokens * kKvRow));
    appended.prompt_v.push_back(tessera_examples::download_bf16_bits(byte_at(prompt_v, l * prompt_tokens * kKvRow),
                                                                     prompt_tokens * kKvRow));
  }
  appended.decode_kv = tessera_examples::download_bf16_bits(decode_kv.get(), decode_kv.bytes() / kElemBytes);
  bool all_ok = true;
  const size_t pool_elems = static_cast<size_t>(cache.num_pages * kPageSize * kKvRow);
  for (int64_t l = 0; l < kLayers; ++l) {
    const auto k_pool = tessera_examples::download_bf16_bits(cache.k[l].get(), pool_elems);
    const auto v_pool = tessera_examples::download_bf16_bits(cache.v[l].get(), pool_elems);
    int64_t mismatches = 0;
    tessera_examples::OracleComparison prefill_check, decode_check;
    for (int64_t b = 0; b < batch; ++b) {
      const std::vector<Bf16Bits> k_bits = appended.sequence(l, b, 0), v_bits = appended.sequence(l, b, 1);
      mismatches += cache_mismatches(k_pool, seqs[b], k_bits) + cache_mismatches(v_pool, seqs[b], v_bits);
      const std::vector<double> k = tessera_examples::bf16_bits_to_double(k_bits.data(), k_bits.size());
      const std::vector<double> v = tessera_examples::bf16_bits_to_double(v_bits.data(), v_bits.size());
      // Prefill: the first, middle and last prompt rows (the row at position i sees keys 0 .. i).
      std::vector<int64_t> rows = {0, kPrompts[b] / 2, kPrompts[b] - 1};
      rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
      for (int64_t i : rows) {
        const RowOutput out = read_row(prefill, l, appended.prompt_indptr[b] + i);
        prefill_check.add(out.o, out.lse, oracle_row(out.q, k, v, i));
      }
      // Decode: the last step's token, at position len - 1, sees the whole sequence.
      const RowOutput out = read_row(decode, l, b);
      decode_check.add(out.o, out.lse, oracle_row(out.q, k, v, seqs[b].len - 1));
    }
    std::printf("  layer %lld: cache vs appended rows: %lld mismatching elements -> %s\n"
                "           prefill, %zu rows: %s\n"
                "           last decode step, %zu rows: %s\n",
                static_cast<long long>(l), static_cast<long long>(mismatches), mismatches == 0 ? "EXACT" : "WRONG",
                prefill_check.rows(), prefill_check.summary().c_str(), decode_check.rows(),
                decode_check.summary().c_str());
    all_ok = all_ok && mismatches == 0 && prefill_check.ok() && decode_check.ok();
  }

  // ---- 4. Speed ---------------------------------------------------------------------------------
  // The first step also captured the graph; the medians are over the later ones.
  const auto later = [](const std::vector<double>& v) {
    return tessera_bench::summarize(v.size() > 1 ? std::vector<double>(v.begin() + 1, v.end()) : v);
  };
  const Timing step_time = later(step_wall_us), attention_time = later(attention_us);
  const double decode_gbps = later(kv_gbps).median_us;  // a median of rates, not of times
  double visible_pairs = 0;  // causal: a prompt of n tokens has n (n + 1) / 2 (query, key) pairs
  for (int64_t p : kPrompts) visible_pairs += 0.5 * static_cast<double>(p) * static_cast<double>(p + 1);
  const double prefill_tflops = 4.0 * kHeadDim * kQoHeads * visible_pairs * kLayers / (prefill_time.median_us * 1e-6) / 1e12;
  std::printf("\nspeed (medians; ceilings measured above: copy %.0f GB/s, GEMM %.0f TFLOP/s):\n", copy_gbps, gemm_tflops);
  std::printf("  prefill attention, %lld layers: %.2f ms, %.0f TFLOP/s = %.2f of the GEMM ceiling\n",
              static_cast<long long>(kLayers), prefill_time.median_us * 1e-3, prefill_tflops, prefill_tflops / gemm_tflops);
  std::printf("  decode attention (graph replay), %lld layers: %.1f us, K/V read (%.0f MB at the last step) at %.0f GB/s\n"
              "    = %.2f of the copy ceiling\n",
              static_cast<long long>(kLayers), attention_time.median_us, kv_bytes_last_step / 1e6, decode_gbps,
              decode_gbps / copy_gbps);
  std::printf("  decode step, wall clock (page table, appends, q, plan, replay, synchronize): %.1f us\n",
              step_time.median_us);

  std::printf("\n%s\n", all_ok ? "tessera-serving-loop: all results match the reference"
                               : "tessera-serving-loop: MISMATCH against the reference");
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (!tessera_examples::gpu_available("tessera-serving-loop")) return 0;
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-serving-loop: %s\n", e.what());
    return 1;
  }
}
