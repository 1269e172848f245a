// Tessera's demo: what a serving engine does each step, on the kernels available so far.
//  1. Prefill: the prompts of a ragged batch are appended to an empty paged KV cache (page 16,
//     shuffled pages); then one decode step appends one token per request. The cache is compared,
//     bit for bit, with the fp64 reference's paged cache of the same sequences.
//  2. Split-KV: each request's attention is computed over KV chunks (by the reference, rounded
//     to bf16 like a kernel's partial outputs) and the chunk states are merged on the GPU with
//     merge_states_ragged; the result is compared with unsplit attention.
//  3. The copy and GEMM ceilings are measured and the two kernels' bandwidth reported against them.
// Without a GPU it says so and exits 0.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "reference/oracle.h"
#include "tessera/tessera.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::TensorView;
using tessera_bench::BenchContext;
using tessera_bench::DeviceBuffer;

constexpr int64_t kPageSize = 16, kKvHeads = 8, kQoHeads = 32, kHeadDim = 128;

DeviceBuffer upload_bf16(const std::vector<double>& v) {
  std::vector<__nv_bfloat16> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = __float2bfloat16_rn(static_cast<float>(v[i]));
  DeviceBuffer d(std::max<size_t>(h.size() * 2, 16));
  BENCH_CUDA(cudaMemcpy(d.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

std::vector<double> download_bf16(const void* d, size_t n) {
  std::vector<__nv_bfloat16> h(n);
  BENCH_CUDA(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(h[i]);
  return out;
}

std::vector<double> bf16_round(std::vector<double> v) {
  for (auto& x : v) x = __bfloat162float(__float2bfloat16_rn(static_cast<float>(x)));
  return v;
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer d(std::max<size_t>(v.size() * sizeof(T), 16));
  BENCH_CUDA(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

/// Step 1: prefill then one decode token per request, through append_paged_kv_cache.
bool demo_paged_cache(BenchContext& ctx, std::mt19937_64& rng) {
  const std::vector<int64_t> prompt = {37, 1, 130, 0, 515, 16};
  const int64_t batch = static_cast<int64_t>(prompt.size()), row = kKvHeads * kHeadDim;
  std::vector<int64_t> final_len(batch);
  std::vector<std::vector<double>> k(batch), v(batch);
  std::normal_distribution<double> normal;
  for (int64_t b = 0; b < batch; ++b) {
    final_len[b] = prompt[b] + 1;
    k[b].resize(final_len[b] * row);
    v[b].resize(final_len[b] * row);
    for (auto& x : k[b]) x = normal(rng);
    for (auto& x : v[b]) x = normal(rng);
    k[b] = bf16_round(k[b]);
    v[b] = bf16_round(v[b]);
  }
  // The reference cache of the final sequences fixes the page table (shuffled page ids) that the
  // serving engine's allocator would have produced.
  const auto ref = tessera_ref::build_paged(k, v, final_len, kKvHeads, kHeadDim, kPageSize, tessera_ref::Layout::NHD,
                                            /*shuffle_seed=*/2026, /*extra_pages=*/4, /*unused_fill=*/0.0);
  const Device gpu = ctx.tensor_device();
  DeviceBuffer d_k(ref.k_pages.size() * 2), d_v(ref.v_pages.size() * 2);
  BENCH_CUDA(cudaMemset(d_k.get(), 0, d_k.bytes()));
  BENCH_CUDA(cudaMemset(d_v.get(), 0, d_v.bytes()));
  auto d_indices = upload(ref.indices), d_last = upload(ref.last_page_len), d_indptr = upload(ref.indptr);
  tessera::PagedKV cache;
  cache.layout = tessera::Layout::kNHD;
  cache.k = TensorView(d_k.get(), DType::kBF16, {ref.num_pages, kPageSize, kKvHeads, kHeadDim}, gpu);
  cache.v = TensorView(d_v.get(), DType::kBF16, {ref.num_pages, kPageSize, kKvHeads, kHeadDim}, gpu);
  cache.indices = TensorView(d_indices.get(), DType::kI32, {static_cast<int64_t>(ref.indices.size())}, gpu);

  // Two appends: the prompts (the page table covering prompt lengths), then one token each.
  double bytes_moved = 0;
  for (int step = 0; step < 2; ++step) {
    std::vector<int32_t> page_indptr = {0}, last(batch), append_indptr = {0};
    std::vector<double> ak, av;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = step == 0 ? prompt[b] : final_len[b];
      const int64_t pages = (len + kPageSize - 1) / kPageSize;
      // The request keeps its first `pages` pages of the final table.
      page_indptr.push_back(page_indptr.back() + static_cast<int32_t>(pages));
      last[b] = pages > 0 ? static_cast<int32_t>(len - (pages - 1) * kPageSize) : 0;
      const int64_t from = step == 0 ? 0 : prompt[b];
      append_indptr.push_back(append_indptr.back() + static_cast<int32_t>(len - from));
      ak.insert(ak.end(), k[b].begin() + from * row, k[b].begin() + len * row);
      av.insert(av.end(), v[b].begin() + from * row, v[b].begin() + len * row);
    }
    // Page ids per request, packed for this step's table.
    std::vector<int32_t> step_indices;
    for (int64_t b = 0; b < batch; ++b)
      for (int32_t i = 0; i < page_indptr[b + 1] - page_indptr[b]; ++i) step_indices.push_back(ref.indices[ref.indptr[b] + i]);
    auto d_step_indices = upload(step_indices), d_step_indptr = upload(page_indptr), d_step_last = upload(last);
    auto d_append_indptr = upload(append_indptr);
    auto d_ak = upload_bf16(ak), d_av = upload_bf16(av);
    const int64_t nnz = append_indptr.back();
    tessera::PagedKV step_cache = cache;
    step_cache.indptr = TensorView(d_step_indptr.get(), DType::kI32, {batch + 1}, gpu);
    step_cache.indices = TensorView(d_step_indices.get(), DType::kI32, {static_cast<int64_t>(step_indices.size())}, gpu);
    step_cache.last_page_len = TensorView(d_step_last.get(), DType::kI32, {batch}, gpu);
    tessera::append_paged_kv_cache(TensorView(d_ak.get(), DType::kBF16, {nnz, kKvHeads, kHeadDim}, gpu),
                                   TensorView(d_av.get(), DType::kBF16, {nnz, kKvHeads, kHeadDim}, gpu),
                                   TensorView(d_append_indptr.get(), DType::kI32, {batch + 1}, gpu), step_cache,
                                   ctx.stream());
    bytes_moved += 4.0 * nnz * row * 2;
  }
  ctx.synchronize();
  const auto got_k = download_bf16(d_k.get(), ref.k_pages.size());
  const auto got_v = download_bf16(d_v.get(), ref.v_pages.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < got_k.size(); ++i) mismatches += (got_k[i] != ref.k_pages[i]) + (got_v[i] != ref.v_pages[i]);
  std::printf("[1] append_paged_kv_cache: %lld requests, prompts {37, 1, 130, 0, 515, 16} + 1 decode token, page %lld,\n"
              "    %lld shuffled pages, %.1f MiB moved: cache vs fp64 reference: %zu mismatching elements -> %s\n",
              static_cast<long long>(batch), static_cast<long long>(kPageSize), static_cast<long long>(ref.num_pages),
              bytes_moved / (1 << 20), mismatches, mismatches == 0 ? "EXACT" : "WRONG");
  return mismatches == 0;
}

/// Step 2: split-KV attention states merged on the GPU equal unsplit attention.
bool demo_split_kv_merge(BenchContext& ctx, std::mt19937_64& rng) {
  const std::vector<int64_t> kv_len = {1000, 1, 4099};
  const int64_t chunk = 512, batch = static_cast<int64_t>(kv_len.size());
  tessera_ref::HeadConfig heads{kQoHeads, kKvHeads, kHeadDim};
  tessera_ref::Options opts;  // decode: one query per request, sm_scale = 1/sqrt(D)
  std::vector<double> packed_v, packed_s, whole_o;
  std::vector<int32_t> indptr = {0};
  std::normal_distribution<double> normal;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> q(kQoHeads * kHeadDim), k(kv_len[b] * kKvHeads * kHeadDim), v(k.size());
    for (auto* t : {&q, &k, &v})
      for (auto& x : *t) x = normal(rng);
    const auto whole = tessera_ref::attention_single(q, k, v, 1, kv_len[b], heads, opts);
    whole_o.insert(whole_o.end(), whole.o.begin(), whole.o.end());
    int32_t chunks = 0;
    for (int64_t start = 0; start < kv_len[b]; start += chunk, ++chunks) {
      const int64_t len = std::min(chunk, kv_len[b] - start);
      const size_t off = start * kKvHeads * kHeadDim, n = len * kKvHeads * kHeadDim;
      std::vector<double> kc(k.begin() + off, k.begin() + off + n), vc(v.begin() + off, v.begin() + off + n);
      const auto part = tessera_ref::attention_single(q, kc, vc, 1, len, heads, opts);
      const auto o = bf16_round(part.o);
      packed_v.insert(packed_v.end(), o.begin(), o.end());
      const auto s2 = tessera_ref::lse_natural_to_log2(part.lse);
      packed_s.insert(packed_s.end(), s2.begin(), s2.end());
    }
    indptr.push_back(indptr.back() + chunks);
  }
  const int64_t states = indptr.back();
  const Device gpu = ctx.tensor_device();
  std::vector<float> s_f(packed_s.begin(), packed_s.end());
  auto d_v = upload_bf16(packed_v), d_s = upload(s_f), d_indptr = upload(indptr);
  DeviceBuffer d_out(batch * kQoHeads * kHeadDim * 2), d_lse(batch * kQoHeads * 4);
  BENCH_CUDA(cudaMemset(d_out.get(), 0xFF, d_out.bytes()));
  tessera::merge_states_ragged(TensorView(d_v.get(), DType::kBF16, {states, kQoHeads, kHeadDim}, gpu),
                               TensorView(d_s.get(), DType::kF32, {states, kQoHeads}, gpu),
                               TensorView(d_indptr.get(), DType::kI32, {batch + 1}, gpu),
                               TensorView(d_out.get(), DType::kBF16, {batch, kQoHeads, kHeadDim}, gpu),
                               TensorView(d_lse.get(), DType::kF32, {batch, kQoHeads}, gpu), ctx.stream());
  ctx.synchronize();
  const auto out = download_bf16(d_out.get(), batch * kQoHeads * kHeadDim);
  const double rel = tessera_ref::rel_error(out, whole_o), max_abs = tessera_ref::max_abs_error(out, whole_o);
  const bool ok = rel <= 1e-2;
  std::printf("[2] merge_states_ragged: decode over KV {1000, 1, 4099} in chunks of %lld (%lld states), Hq=%lld,\n"
              "    D=%lld, bf16: merged vs unsplit fp64 attention: rel err %.2e, max abs %.2e (bf16 bound 1e-2) -> %s\n",
              static_cast<long long>(chunk), static_cast<long long>(states), static_cast<long long>(kQoHeads),
              static_cast<long long>(kHeadDim), rel, max_abs, ok ? "OK" : "WRONG");
  return ok;
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("tessera-demo: no CUDA GPU found on this machine. Tessera %s is built (kernels for the\n"
                "architectures in TESSERA_CUDA_ARCHS), but running its kernels needs an NVIDIA GPU\n"
                "(sm_80 or newer). Nothing was measured.\n",
                tessera::version_string());
    return 0;
  }
  try {
    tessera_bench::RunInfo info = tessera_bench::make_run_info(0);
    std::printf("tessera-demo: Tessera %s on %s (%d SMs)\n\n", tessera::version_string(), info.gpu.c_str(),
                info.sm_count);
    tessera_bench::OutputSink sink(info, "");
    // No cool-down: the demo times memory-bound kernels, which the power cap does not slow.
    BenchContext ctx(0, /*iters=*/20, /*warmup=*/3, /*cooldown_ms=*/0, sink);
    std::mt19937_64 rng(20261122);
    const bool ok1 = demo_paged_cache(ctx, rng);
    const bool ok2 = demo_split_kv_merge(ctx, rng);
    std::printf("\n[3] ceilings measured now, and the two kernels' bandwidth at >= 256 MiB against them:\n");
    tessera_bench::run_workloads(ctx, {"merge_states_ragged", "append_paged_nhd"});
    std::printf("\n%s\n", ok1 && ok2 ? "tessera-demo: all results match the reference"
                                     : "tessera-demo: MISMATCH against the reference");
    return ok1 && ok2 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-demo: %s\n", e.what());
    return 1;
  }
}
