// Multi-head latent attention (DeepSeek-V2/V3 MLA) in absorbed form over a paged latent cache.
//
// Every query head attends to one latent KV per token: the latent ckv_j (width 512) and the
// rotary key part kpe_j (width 64). The caller has multiplied the no-rope query by the key
// up-projection (q_nope, width 512), so the logits are
//   x_ij = sm_scale * (q_nope_i . ckv_j + q_pe_i . kpe_j)
// and the output stays in latent space: o_i = sum_j softmax_j(x_ij) ckv_j (width 512); the
// caller's value up-projection takes it to head space.
//
// Positions as in tessera/attention.h: with qo_len query tokens and kv_len cached tokens, query
// token i sits at position kv_len - qo_len + i (the new tokens are the last of the cache, already
// appended); causal hides keys after it.
#pragma once

#include <cstdint>

#include "tessera/dtype.h"
#include "tessera/export.h"
#include "tessera/formats.h"
#include "tessera/stream.h"
#include "tessera/tensor.h"

namespace tessera {

/// The latent widths the MLA kernels are built for (DeepSeek-V2/V3/R1).
constexpr int64_t kMlaLatentDim = 512;
constexpr int64_t kMlaRopeDim = 64;

/// A paged latent cache. Request b owns pages indices[indptr[b]] .. indices[indptr[b+1]-1], in
/// order; all are full except the last, which holds last_page_len[b] tokens (1..page_size), so the
/// request's length is (num_pages_b - 1) * page_size + last_page_len[b], or 0 with no pages.
/// ckv and kpe may be two slices of one [num_pages, page_size, 576] tensor (FlashMLA's layout).
///
/// An fp8 cache (e4m3 or e5m2, under f16 or bf16 queries) stores each latent row quantized: the
/// kernels compute with stored value x scale, where the key scale (scales.k, times
/// scales.k_device[0] when given) applies to ckv and kpe as the key and the value scale
/// (scales.v, v_device) to ckv as the value. The latent is one KV head, so device scales have one
/// element. Scales must stay at their defaults for a 16-bit cache.
struct PagedLatentCache {
  TensorView ckv;            ///< f16/bf16 (the queries' dtype) or e4m3/e5m2 [num_pages, page_size, 512];
                             ///< last dim contiguous, rows 16-byte aligned
  TensorView kpe;            ///< ckv's dtype, [num_pages, page_size, 64]; same requirements
  TensorView indptr;         ///< i32 [batch_size + 1] in device memory: page ranges per request
  TensorView indices;        ///< i32 [>= indptr[batch_size]]: page ids in [0, num_pages)
  TensorView last_page_len;  ///< i32 [batch_size]
  KVScales scales;           ///< an fp8 cache's dequantization scales (k and v; q must stay 1)
  int64_t batch_size() const { return indptr.ndim == 1 ? indptr.shape[0] - 1 : -1; }
  int64_t page_size() const { return ckv.ndim == 3 ? ckv.shape[1] : -1; }
};

struct MlaOptions {
  /// Logit scale, finite and > 0. There is no default: the usual 1 / sqrt(192) belongs to the
  /// model's head dims (128 no-rope + 64 rope), which the absorbed inputs do not show.
  double sm_scale = 0.0;
  bool causal = false;  ///< hide keys after the query's position (among a request's new tokens)
  /// Split over the KV length: each request's KV tiles (64 tokens) are cut into this many nearly
  /// equal runs, one CTA each, whose states are merged afterwards (merge_states, in split order:
  /// deterministic). 1 (no split) suits batches whose CTAs fill the GPU; a few long requests need
  /// more (the Python wrapper's plan() chooses). In [1, 256].
  int64_t num_kv_splits = 1;
  /// Scratch for the split states when num_kv_splits > 1: device memory (any dtype, contiguous,
  /// 256-byte aligned) of at least batch_mla_paged_workspace_bytes(...) bytes; ignored otherwise.
  TensorView workspace;
};

/// Bytes of MlaOptions::workspace that batch_mla_paged needs: the split states, output in the
/// queries' dtype (f16/bf16) and f32 LSE, [total_q, num_kv_splits, num_heads, 512 + 1]; 0 for
/// one split.
TESSERA_API int64_t batch_mla_paged_workspace_bytes(int64_t total_q, int64_t num_heads, int64_t num_kv_splits,
                                                    DType dtype);

/// The KV split count a batch should take (what the Python BatchMLAPagedAttentionWrapper's plan()
/// uses): as many splits as fill the SMs that the batch's CTAs (batch_size x ceil(max_qo_len x
/// num_heads / 64)) leave idle, each split at least four 64-token KV tiles, at most 256; 1 when the
/// CTAs fill the GPU or the KV is short. Host-only arithmetic. batch_size >= 0, max_qo_len >= 1,
/// num_heads >= 1, max_kv_len >= 0 (tokens), sm_count >= 1 (the device's SMs).
TESSERA_API int64_t batch_mla_paged_num_kv_splits(int64_t batch_size, int64_t max_qo_len, int64_t num_heads,
                                                  int64_t max_kv_len, int64_t sm_count);

/// MLA over a paged latent cache, for decode and append-style prefill (any number of new tokens
/// per request). One CTA per 64 (token x head) rows of a request and KV split; with
/// options.num_kv_splits > 1 a merge launch follows.
///
/// q_nope: f16/bf16 [total_q, num_heads, 512], the absorbed no-rope query; q_pe: [total_q,
///   num_heads, 64], the rotary part; both of one dtype, the cache's unless the cache is fp8, last
///   dim contiguous, 16-byte aligned rows, any other strides.
/// qo_indptr: i32 [batch_size + 1] in device memory (request b's tokens are rows qo_indptr[b] ..
///   qo_indptr[b+1]-1), or undefined for one token per request (row b; total_q == batch_size).
///   With num_kv_splits > 1, qo_indptr[batch_size] must be total_q (checked in checked mode):
///   the merge writes every row of o.
/// max_qo_len: an upper bound of the requests' token counts (it sizes the grid); ignored without
///   qo_indptr. Tokens past it are not computed, so it must hold.
/// kv: the paged latent cache, batch_size requests.
/// o: [total_q, num_heads, 512] of q_nope's dtype, the latent-space output; lse: f32 [total_q,
///   num_heads] contiguous, the BASE-2 log-sum-exp of the scaled logits, or undefined. A row that
///   sees no key gets o = 0 and lse = -inf.
/// Runs on sm_90 GPUs (wgmma); elsewhere it throws kUnsupported.
TESSERA_API void batch_mla_paged(const TensorView& q_nope, const TensorView& q_pe, const TensorView& qo_indptr,
                                 int64_t max_qo_len, const PagedLatentCache& kv, const TensorView& o,
                                 const TensorView& lse, const MlaOptions& options, StreamHandle stream = nullptr);

}  // namespace tessera
