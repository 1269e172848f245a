// FlexAttention-style attention with Tessera (tessera/variant.h): documents packed into one
// sequence, each attending only within itself through a causal sliding window, with the logits
// soft-capped (as Gemma 2 does).
//
//  1. The mask is two mask_mods written as CUDA source, same_document and sliding_window,
//     combined with and_masks; the soft-cap is a score_mod. Their parameters (the document id of
//     every position, the window, the cap) are VariantParams.
//  2. build_block_mask evaluates the mask on the GPU for every (query, key) pair and writes the
//     blocks holding a visible pair as a BSR matrix, each flagged full or partial
//     (FlexAttention's create_block_mask).
//  3. block_sparse_attention runs over those blocks with flex_variant(mask, score_mod), compiled
//     just in time on first use: absent blocks cost nothing, full blocks skip the mask, partial
//     blocks evaluate it.
//  4. The output is compared with the fp64 oracle (tests/reference) given the same mask as a
//     dense custom mask built on the host from the same definition, and the same soft-cap.
//  5. Its time is set against causal attention over the whole sequence (single_prefill), what a
//     kernel without the mask would have to compute.
//
// Without a GPU it prints one line and exits 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "example_support.h"
#include "harness.h"
#include "reference/oracle.h"
#include "tessera/tessera.h"

namespace {

using tessera::DType;
using tessera::TensorView;
using tessera::VariantParam;
using tessera_bench::BenchContext;
using tessera_bench::DeviceBuffer;

constexpr int64_t kQoHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr DType kDType = DType::kBF16;
const std::vector<int64_t> kDocuments = {700, 37, 1900, 1, 1200, 2163};  // tokens per document
constexpr int32_t kWindow = 512;     // a query sees itself and the kWindow keys before it
constexpr float kSoftCap = 2.0f;     // |logit| < 2 after the cap: strong enough to change the output
constexpr int64_t kBlockRows = 128;  // block mask granularity: query rows x keys per block
constexpr int64_t kBlockCols = 64;

// The mask_mods and the score_mod, as FlexAttention users write them, in CUDA C++.
const tessera::MaskMod kSameDocument{
    "bool same_document(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
    "  return params.document[q_idx] == params.document[kv_idx];\n"
    "}\n",
    "same_document"};
const tessera::MaskMod kSlidingWindow{
    "bool sliding_window(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
    "  return kv_idx <= q_idx && q_idx - kv_idx <= params.window;\n"
    "}\n",
    "sliding_window"};
const tessera::ScoreMod kSoftCapMod{
    "float soft_cap(const Params& params, float score, int b, int h, int q_idx, int kv_idx) {\n"
    "  return params.cap * tanhf(score / params.cap);\n"
    "}\n",
    "soft_cap"};

/// The same mask on the host, written from its definition: [N, N] row-major, 1 = visible.
std::vector<uint8_t> dense_mask(const std::vector<int32_t>& document) {
  const int64_t n = static_cast<int64_t>(document.size());
  std::vector<uint8_t> mask(static_cast<size_t>(n * n), 0);
  for (int64_t q = 0; q < n; ++q) {
    for (int64_t kv = std::max<int64_t>(0, q - kWindow); kv <= q; ++kv) {
      mask[q * n + kv] = document[q] == document[kv];
    }
  }
  return mask;
}

int run() {
  const int64_t n = std::accumulate(kDocuments.begin(), kDocuments.end(), int64_t{0});
  const tessera_bench::RunInfo info = tessera_examples::announce("tessera-flex-mask");
  std::printf("sequence: %zu documents packed into %lld tokens; Hq %lld, Hkv %lld, head dim %lld, bf16\n"
              "mask_mod: and_masks(sliding_window (window %d), same_document); score_mod: soft_cap (cap %.1f)\n",
              kDocuments.size(), static_cast<long long>(n), static_cast<long long>(kQoHeads),
              static_cast<long long>(kKvHeads), static_cast<long long>(kHeadDim), kWindow, kSoftCap);

  tessera_bench::OutputSink sink(info, "");
  BenchContext ctx(0, /*iters=*/20, /*warmup=*/3, /*cooldown_ms=*/0, sink);
  const cudaStream_t stream = ctx.stream();

  // Inputs: q, k, v of the packed sequence, and the document id of every position.
  tessera_bench::DeviceTensor q = ctx.random_tensor(kDType, {n, kQoHeads, kHeadDim});
  tessera_bench::DeviceTensor k = ctx.random_tensor(kDType, {n, kKvHeads, kHeadDim});
  tessera_bench::DeviceTensor v = ctx.random_tensor(kDType, {n, kKvHeads, kHeadDim});
  tessera_bench::DeviceTensor o = ctx.empty_tensor(kDType, {n, kQoHeads, kHeadDim});
  tessera_bench::DeviceTensor lse = ctx.empty_tensor(DType::kF32, {n, kQoHeads});
  std::vector<int32_t> document;
  for (size_t d = 0; d < kDocuments.size(); ++d) document.insert(document.end(), kDocuments[d], static_cast<int32_t>(d));
  tessera_bench::DeviceTensor document_dev = ctx.upload_i32(document);

  // 1. The mask, the score_mod and their parameters.
  const tessera::MaskMod mask = tessera::and_masks(kSlidingWindow, kSameDocument);
  const std::vector<VariantParam> params = {VariantParam::device_tensor("document", document_dev.view),
                                            VariantParam::scalar_i32("window", kWindow),
                                            VariantParam::scalar_f32("cap", kSoftCap)};

  // 2. The block mask: room for every block; build_block_mask writes indptr[last] of them.
  const int64_t row_blocks = (n + kBlockRows - 1) / kBlockRows, col_blocks = (n + kBlockCols - 1) / kBlockCols;
  tessera_bench::DeviceTensor indptr = ctx.empty_tensor(DType::kI32, {row_blocks + 1});
  tessera_bench::DeviceTensor indices = ctx.empty_tensor(DType::kI32, {row_blocks * col_blocks});
  tessera_bench::DeviceTensor flags = ctx.empty_tensor(DType::kU8, {row_blocks * col_blocks});
  tessera::build_block_mask(mask, params, n, n, kBlockRows, kBlockCols, /*batch=*/0, /*head=*/0, indptr.view,
                            indices.view, flags.view, stream);
  ctx.synchronize();
  std::vector<int32_t> indptr_host(static_cast<size_t>(row_blocks + 1));
  BENCH_CUDA(cudaMemcpy(indptr_host.data(), indptr.buffer.get(), indptr_host.size() * 4, cudaMemcpyDeviceToHost));
  const int64_t listed = indptr_host.back();
  std::vector<uint8_t> flags_host(static_cast<size_t>(listed));
  BENCH_CUDA(cudaMemcpy(flags_host.data(), flags.buffer.get(), flags_host.size(), cudaMemcpyDeviceToHost));
  const int64_t full = std::accumulate(flags_host.begin(), flags_host.end(), int64_t{0});
  int64_t causal_blocks = 0;  // blocks holding a pair with kv <= q
  for (int64_t r = 0; r < row_blocks; ++r) {
    causal_blocks += std::min(col_blocks, (std::min(n, (r + 1) * kBlockRows) - 1) / kBlockCols + 1);
  }
  std::printf("block mask (%lld x %lld blocks): %lld of %lld blocks listed (%lld full, %lld partial); causal alone "
              "needs %lld\n",
              static_cast<long long>(kBlockRows), static_cast<long long>(kBlockCols), static_cast<long long>(listed),
              static_cast<long long>(row_blocks * col_blocks), static_cast<long long>(full),
              static_cast<long long>(listed - full), static_cast<long long>(causal_blocks));

  // 3. Attention over the blocks with the mask and the score_mod.
  const tessera::BlockSparse bsr{kBlockRows, kBlockCols, n, k.view, v.view, indptr.view, indices.view, flags.view};
  const tessera::VariantSpec variant = tessera::flex_variant("document_window_softcap", &mask, &kSoftCapMod, params);
  tessera::AttentionOptions options;
  options.variant.user = &variant;
  BENCH_CUDA(cudaMemsetAsync(o.buffer.get(), 0xFF, o.buffer.bytes(), stream));  // NaN: an unwritten row fails
  tessera::block_sparse_attention(q.view, bsr, o.view, lse.view, options, stream);
  ctx.synchronize();

  // 4. The oracle over the dense mask.
  const auto to_double = [&](const tessera_bench::DeviceTensor& t, int64_t count) {
    const auto bits = tessera_examples::download_bf16_bits(t.buffer.get(), static_cast<size_t>(count));
    return tessera_examples::bf16_bits_to_double(bits.data(), bits.size());
  };
  tessera_ref::Options ref_options;
  ref_options.custom_mask = dense_mask(document);
  ref_options.custom_mask_indptr = {0, n * n};
  ref_options.logits_soft_cap = kSoftCap;
  const tessera_ref::State ref =
      tessera_ref::attention_single(to_double(q, n * kQoHeads * kHeadDim), to_double(k, n * kKvHeads * kHeadDim),
                                    to_double(v, n * kKvHeads * kHeadDim), n, n, {kQoHeads, kKvHeads, kHeadDim},
                                    ref_options);
  tessera_examples::OracleComparison check;
  check.add(to_double(o, n * kQoHeads * kHeadDim), tessera_examples::download_f32(lse.buffer.get(), n * kQoHeads), ref);
  std::printf("attention vs the fp64 oracle (dense mask, logits_soft_cap), %zu rows: %s\n", check.rows(),
              check.summary().c_str());

  // 5. Time against causal attention over the whole sequence.
  const tessera_bench::Timing flex_time = ctx.measure([&](cudaStream_t s) {
    tessera::block_sparse_attention(q.view, bsr, o.view, lse.view, options, s);
  });
  tessera::AttentionOptions causal;
  causal.causal = true;
  tessera_bench::DeviceTensor o_causal = ctx.empty_tensor(kDType, {n, kQoHeads, kHeadDim});
  const tessera_bench::Timing causal_time = ctx.measure([&](cudaStream_t s) {
    tessera::single_prefill(q.view, k.view, v.view, tessera::Layout::kNHD, o_causal.view, TensorView(), causal, s);
  });
  std::printf("time (median): masked block-sparse attention %.1f us; causal attention over the whole sequence %.1f us "
              "(%.1fx)\n",
              flex_time.median_us, causal_time.median_us, causal_time.median_us / flex_time.median_us);

  std::printf("\n%s\n", check.ok() ? "tessera-flex-mask: the result matches the reference"
                                   : "tessera-flex-mask: MISMATCH against the reference");
  return check.ok() ? 0 : 1;
}

}  // namespace

int main() {
  if (!tessera_examples::gpu_available("tessera-flex-mask")) return 0;
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-flex-mask: %s\n", e.what());
    return 1;
  }
}
