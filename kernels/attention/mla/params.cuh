// Arguments of the multi-head latent attention (DeepSeek MLA) kernels, absorbed form: every query
// head reads one latent KV per token, the latent ckv (width kLatentDim) and its rotary key part
// kpe (width kRopeDim). Built by the host (src/mla.cu) after validation.
#pragma once

#include "kernels/common/fast_divisor.cuh"
#include "kernels/common/fp8.cuh"
#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// T: the queries' and output's 16-bit type; KVT: the latent cache's element type, T itself or
/// an fp8 type (e4m3, e5m2) whose rows are dequantized with `scales`.
template <typename T, typename KVT = T>
struct MlaParams {
  // Queries of request b: tokens qo_indptr[b] .. qo_indptr[b+1]-1 (null: one token per request,
  // token b), every token all num_heads heads. A CTA's query rows are (token, head) pairs packed
  // row = token * num_heads + head, so a request's rows are one run of qo_len * num_heads.
  const T* q_nope;  // [total_q, num_heads, kLatentDim], element strides q_nope_stride_{token,head}
  const T* q_pe;    // [total_q, num_heads, kRopeDim]
  int64_t q_nope_stride_token, q_nope_stride_head;
  int64_t q_pe_stride_token, q_pe_stride_head;
  const int32_t* qo_indptr;  // [batch_size + 1] or null
  // The paged latent cache: request b owns pages kv_indices[kv_indptr[b]] .. in order, all full
  // but the last, which holds kv_last_page_len[b] tokens.
  const KVT* ckv;  // [num_pages, page_size, kLatentDim], element strides ckv_stride_{page,slot}
  const KVT* kpe;  // [num_pages, page_size, kRopeDim]
  int64_t ckv_stride_page, ckv_stride_slot;
  int64_t kpe_stride_page, kpe_stride_slot;
  const int32_t* kv_indptr;         // [batch_size + 1]
  const int32_t* kv_indices;        // [kv_indptr[batch_size]]
  const int32_t* kv_last_page_len;  // [batch_size]
  int32_t page_size;
  FastDivisor page_div;
  // An fp8 cache's dequantization: a latent row is both the key (ckv and kpe, scale k_scale(0))
  // and the value (ckv, scale v_scale(0)); one latent "KV head". Unused for a 16-bit cache.
  KVScaleParams scales;
  // Output in latent space, like q_nope; lse base 2 of the scaled logits, f32 [total_q, num_heads]
  // contiguous, or null.
  T* o;
  int64_t o_stride_token, o_stride_head;
  float* lse;
  // Split over the KV length (num_kv_splits > 1): blockIdx.z = split z of each request covers
  // its z-th share of the KV tiles, and writes its state (normalised output, LSE) to
  // partial_o [total_q, num_kv_splits, num_heads, kLatentDim] and partial_lse [total_q,
  // num_kv_splits, num_heads] (both contiguous), which a merge then combines; a split with no key
  // writes o = 0, lse = -inf. With one split the kernel writes o and lse directly.
  int32_t num_kv_splits;
  T* partial_o;
  float* partial_lse;
  int32_t batch_size;
  int32_t num_heads;
  float sm_scale_log2;  // sm_scale * log2(e): logits in base-2 units
  bool causal;          // query i of qo_len sits at kv_len - qo_len + i and sees keys <= that
};

}  // namespace kernels
}  // namespace tessera
