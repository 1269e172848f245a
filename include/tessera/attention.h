// Attention over every KV format (docs/design.md §1, §5): decode (one query token per request) and
// prefill/append (any query length), single request and batch, over dense, ragged, paged and
// block-sparse KV.
//
// Common conventions
// - Tensors are TensorViews on the current CUDA device; q and o are f16 or bf16 (the same
//   dtype), k and v q's dtype or, for head dims 64, 128 and 256, fp8 e4m3 / e5m2 (both the same;
//   dequantized with options.kv_scales; decode then runs on tensor cores and prefill on the
//   mma.sync tiles on every GPU); any strides with a contiguous last dimension and 16-byte
//   aligned rows. Index arrays are i32, contiguous, in device memory.
// - FP8 attention (the prefill entry points, sm_90a): q, k and v all e4m3 and o f16 or bf16, head
//   dims 128 and 256, the default variant; options.kv_scales descales q (KVScales::q, q_device),
//   k and v. The MMAs run in fp8 and P is rounded to e4m3 (docs/kernels.md, "FP8 attention").
// - Heads: num_qo_heads % num_kv_heads == 0; query head h reads KV head h / (Hq / Hkv) (GQA; MQA
//   when Hkv == 1). head_dim (D) is one of kSupportedHeadDims (tessera/head_dims.h, generated
//   from the build's kernel configuration table).
// - Positions: within a request with qo_len queries and kv_len keys, query i sits at position
//   kv_len - qo_len + i and key j at j; causal masking hides keys j > kv_len - qo_len + i.
// - Logits are sm_scale * q.k (sm_scale < 0 selects 1/sqrt(D)).
// - o gets the output in the query's layout; lse (optional: pass an undefined TensorView) gets
//   the BASE-2 log-sum-exp of the scaled logits, f32 [rows, num_qo_heads]. A row that sees no key
//   gets o = 0 and lse = -inf.
// - Work is queued on `stream`; nothing synchronises. Unsupported combinations (a head dim, a
//   dtype) throw tessera::Error(kUnsupported); nothing falls back silently.
#pragma once

#include <cstdint>

#include "tessera/export.h"
#include "tessera/formats.h"
#include "tessera/head_dims.h"
#include "tessera/stream.h"
#include "tessera/tensor.h"
#include "tessera/variant.h"

namespace tessera {

struct AttentionOptions {
  double sm_scale = -1.0;  ///< logit scale, > 0; < 0 means 1/sqrt(head_dim); 0 is an error
  bool causal = false;     ///< hide keys after the query's position (offset kv_len - qo_len)
  /// Built-in and user variants (tessera/variant.h); the default runs the prebuilt kernels, any
  /// other is compiled just in time on first use.
  VariantOptions variant;
  /// Dequantization scales of an fp8 (e4m3, e5m2) K/V (tessera/formats.h): K and V elements are
  /// read as x * scale. Defaults only for f16/bf16 K/V.
  KVScales kv_scales;
};

/// Kernel family chosen for a decode call (exposed for tests and benchmarks).
enum class DecodeKernel : int32_t {
  kAuto = 0,         ///< tensor cores when Hq / Hkv >= 4, a variant is set or K/V is fp8, CUDA cores otherwise
  kCudaCores = 1,    ///< one CTA per (request, KV head), 16-byte loads (8 of fp8 K/V), cp.async
                     ///< pipeline; the default variant only (a variant is kUnsupported here)
  kTensorCores = 2,  ///< prefill template with the query heads of a KV head stacked as tile rows
};

// ---------------------------------------------------------------------------------------------
// Decode: one query token per request.

/// q: [Hq, D]; k, v: [kv_len, Hkv, D] (kv_layout NHD) or [Hkv, kv_len, D] (HND); o: [Hq, D];
/// lse: [Hq] or undefined.
TESSERA_API void single_decode(const TensorView& q, const TensorView& k, const TensorView& v, Layout kv_layout,
                               const TensorView& o, const TensorView& lse, const AttentionOptions& options = {},
                               StreamHandle stream = nullptr, DecodeKernel kernel = DecodeKernel::kAuto);

/// q: [B, Hq, D] (request b's token is row b); kv: a paged cache with B requests; o: [B, Hq, D];
/// lse: [B, Hq] or undefined.
TESSERA_API void batch_decode_paged(const TensorView& q, const PagedKV& kv, const TensorView& o, const TensorView& lse,
                                    const AttentionOptions& options = {}, StreamHandle stream = nullptr,
                                    DecodeKernel kernel = DecodeKernel::kAuto);

/// q: [B, Hq, D]; k, v: [total_kv, Hkv, D] with kv_indptr [B + 1] (request b owns rows
/// kv_indptr[b] .. kv_indptr[b+1]-1); o: [B, Hq, D]; lse: [B, Hq] or undefined.
TESSERA_API void batch_decode_ragged(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& kv_indptr, const TensorView& o, const TensorView& lse,
                                     const AttentionOptions& options = {}, StreamHandle stream = nullptr,
                                     DecodeKernel kernel = DecodeKernel::kAuto);

// ---------------------------------------------------------------------------------------------
// Prefill / append: any number of query tokens per request.

/// q: [qo_len, Hq, D]; k, v: [kv_len, Hkv, D] (NHD) or [Hkv, kv_len, D] (HND); o: [qo_len, Hq, D];
/// lse: [qo_len, Hq] or undefined. With causal and qo_len > kv_len, the first qo_len - kv_len
/// queries sit before position 0 and see no key (o = 0, lse = -inf).
TESSERA_API void single_prefill(const TensorView& q, const TensorView& k, const TensorView& v, Layout kv_layout,
                                const TensorView& o, const TensorView& lse, const AttentionOptions& options = {},
                                StreamHandle stream = nullptr);

/// q: [total_q, Hq, D] with qo_indptr [B + 1]; max_qo_len: the largest qo_indptr[b+1] -
/// qo_indptr[b] (an upper bound is fine; it sizes the grid, as FlashAttention's max_seqlen_q);
/// k, v: [total_kv, Hkv, D] with kv_indptr [B + 1]; o: [total_q, Hq, D]; lse: [total_q, Hq].
TESSERA_API void batch_prefill_ragged(const TensorView& q, const TensorView& qo_indptr, int64_t max_qo_len,
                                      const TensorView& k, const TensorView& v, const TensorView& kv_indptr,
                                      const TensorView& o, const TensorView& lse, const AttentionOptions& options = {},
                                      StreamHandle stream = nullptr);

/// Paged KV: q, qo_indptr, max_qo_len, o, lse as above; kv a paged cache with B requests.
TESSERA_API void batch_prefill_paged(const TensorView& q, const TensorView& qo_indptr, int64_t max_qo_len,
                                     const PagedKV& kv, const TensorView& o, const TensorView& lse,
                                     const AttentionOptions& options = {}, StreamHandle stream = nullptr);

/// Block-sparse attention: q [M, Hq, D] (M = kv.num_rows); query row r sees the KV columns of
/// the column blocks listed for block row r / Br, then the causal mask with offset N - M applies
/// to (row, column) positions. o: [M, Hq, D]; lse: [M, Hq] or undefined. KV tiles whose blocks
/// are all flagged full in kv.block_flags skip every mask (causal, variant masks): the flags must
/// describe the masks in effect (build_block_mask in tessera/variant.h writes such flags).
TESSERA_API void block_sparse_attention(const TensorView& q, const BlockSparse& kv, const TensorView& o,
                                        const TensorView& lse, const AttentionOptions& options = {},
                                        StreamHandle stream = nullptr);

}  // namespace tessera
