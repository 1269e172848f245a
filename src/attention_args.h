// Argument checks and AttentionParams builders shared by the attention entry points
// (src/attention.cu) and the plan/run runtime (src/runtime/). CUDA translation units only: it
// includes the kernels' parameter struct.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention/params.cuh"
#include "src/check.h"
#include "src/config/config_types.h"
#include "src/kv_scales.h"
#include "tessera/attention.h"
#include "tessera/validate.h"

namespace tessera {
namespace detail {

using kernels::AttentionParams;

inline constexpr double kLog2e = 1.4426950408889634;

/// A 16-bit tensor of `ndim` dims the kernels read or write in 16-byte vectors.
void check_operand(const TensorView& t, const char* name, int ndim);
/// The q of a prefill entry point: check_operand's, or fp8 (e4m3, e5m2: FP8 attention, which
/// checks the rest of the call).
void check_prefill_query(const TensorView& q, int ndim);

/// A K or V tensor of `ndim` dims: q's dtype, or fp8 (e4m3, e5m2; the kernels convert it), last
/// dim contiguous, 16-byte vectors.
void check_kv_operand(const TensorView& t, const char* name, int ndim, const TensorView& q);

void check_index_array(const TensorView& t, const char* name, const TensorView& data, int64_t length);

/// o like q ([rows, Hq, D], same dtype, or f16/bf16 for an fp8 q); lse f32 [rows, Hq] when given.
void check_outputs(const TensorView& q, const TensorView& o, const TensorView& lse, int64_t rows);
/// ... with o's head dim `head_dim_vo` (V's, when it differs from q's).
void check_outputs(const TensorView& q, const TensorView& o, const TensorView& lse, int64_t rows, int64_t head_dim_vo);

HeadConfig check_heads(int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim);

/// The heads of a prefill call whose q and k rows have head_dim_qk elements and whose v rows
/// (`v_name`) have head_dim_vo: check_heads when they agree, else a pair of
/// kSupportedPrefillSplitHeadDims (kUnsupported naming v's last dim otherwise).
PrefillHeadDims check_prefill_heads(int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim_qk,
                                    int64_t head_dim_vo, const char* v_name);

/// options.sm_scale, or 1/sqrt(head_dim) when it is negative; checked finite and nonzero (the
/// kernels take the row max before scaling, so the scale must be > 0).
inline double resolved_sm_scale(const AttentionOptions& options, int64_t head_dim) {
  const double sm_scale = options.sm_scale < 0 ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : options.sm_scale;
  TESSERA_CHECK_ARG(std::isfinite(sm_scale) && sm_scale != 0.0)
      << "options.sm_scale = " << options.sm_scale << ", expected a finite value > 0 (or < 0 for 1/sqrt(head_dim))";
  return sm_scale;
}

/// The part of AttentionParams that does not depend on the KV format. q and o are [rows, Hq, D]
/// (a 2-D [Hq, D] q of single decode is one row); KVT: K/V's element type (T, or fp8 with
/// options.kv_scales); OT: o's (T, except for FP8 attention).
template <typename T, typename KVT = T, typename OT = T>
AttentionParams<T, KVT, OT> query_params(const TensorView& q, const TensorView& o, const TensorView& lse,
                                         const HeadConfig& heads, const AttentionOptions& options) {
  AttentionParams<T, KVT, OT> p{};
  const bool one_row = q.ndim == 2;
  p.q.data = q.data_as<const T>();
  p.q.row_stride = one_row ? 0 : q.strides[0];
  p.q.head_stride = q.strides[q.ndim - 2];
  p.o.data = o.data_as<OT>();
  p.o.row_stride = o.ndim == 2 ? 0 : o.strides[0];
  p.o.head_stride = o.strides[o.ndim - 2];
  if (lse.data != nullptr) {
    p.o.lse = lse.data_as<float>();
    p.o.lse_row_stride = lse.ndim == 1 ? 0 : lse.strides[0];
    p.o.lse_head_stride = lse.strides[lse.ndim - 1];
  }
  p.num_q_rows = static_cast<int32_t>(one_row ? 1 : q.shape[0]);
  p.num_qo_heads = static_cast<int32_t>(heads.num_qo_heads);
  p.num_kv_heads = static_cast<int32_t>(heads.num_kv_heads);
  p.group_size = static_cast<int32_t>(heads.num_qo_heads / heads.num_kv_heads);
  const double sm_scale = resolved_sm_scale(options, heads.head_dim);
  p.sm_scale_log2 = static_cast<float>(sm_scale * kLog2e);
  p.sm_scale = static_cast<float>(sm_scale);
  p.causal = options.causal;
  p.kv_scales = kv_scale_params(options.kv_scales);
  return p;
}

/// K and V as rows: k and v are [rows, Hkv, D] (row_axis 0) or [Hkv, rows, D] (row_axis 1), the
/// rows of ragged KV (one request or many) and the columns of block-sparse KV.
template <typename Params>
void kv_row_tensors(Params& p, const TensorView& k, const TensorView& v, int row_axis) {
  using KVT = typename Params::KVType;
  const int head_axis = 1 - row_axis;
  p.kv.k = k.data_as<const KVT>();
  p.kv.v = v.data_as<const KVT>();
  p.kv.k_row_stride = k.strides[row_axis];
  p.kv.k_head_stride = k.strides[head_axis];
  p.kv.v_row_stride = v.strides[row_axis];
  p.kv.v_head_stride = v.strides[head_axis];
}

/// Dense K/V of one request, NHD [kv_len, Hkv, D] or HND [Hkv, kv_len, D], as ragged KV without
/// an indptr.
template <typename Params>
void dense_kv_params(Params& p, const TensorView& k, const TensorView& v, Layout layout) {
  const int row = layout == Layout::kNHD ? 0 : 1;
  kv_row_tensors(p, k, v, row);
  p.ragged.indptr = nullptr;
  p.ragged.len_single = static_cast<int32_t>(k.shape[row]);
  p.ragged.num_rows = p.ragged.len_single;
  p.batch_size = 1;
}

template <typename Params>
void ragged_kv_params(Params& p, const TensorView& k, const TensorView& v, const TensorView& kv_indptr) {
  kv_row_tensors(p, k, v, 0);
  p.ragged.indptr = kv_indptr.data_as<const int32_t>();
  p.ragged.num_rows = static_cast<int32_t>(k.shape[0]);
  p.batch_size = static_cast<int32_t>(kv_indptr.shape[0] - 1);
}

/// Paged K/V: p.kv's row strides are the slot strides within a page.
template <typename Params>
void paged_kv_params(Params& p, const PagedKV& kv) {
  using KVT = typename Params::KVType;
  p.kv.k = kv.k.data_as<const KVT>();
  p.kv.v = kv.v.data_as<const KVT>();
  p.kv.k_row_stride = kv.k_slot_stride();
  p.kv.k_head_stride = kv.k_head_stride();
  p.kv.v_row_stride = kv.v_slot_stride();
  p.kv.v_head_stride = kv.v_head_stride();
  p.paged.k_page_stride = kv.k_page_stride();
  p.paged.v_page_stride = kv.v_page_stride();
  p.paged.indptr = kv.indptr.data_as<const int32_t>();
  p.paged.indices = kv.indices.data_as<const int32_t>();
  p.paged.last_page_len = kv.last_page_len.data_as<const int32_t>();
  p.paged.page_size = static_cast<int32_t>(kv.page_size());
  p.paged.page_div = kernels::FastDivisor::make(kv.page_size());
  p.paged.num_pages = static_cast<int32_t>(kv.num_pages());
  p.paged.num_indices = static_cast<int32_t>(kv.indices.shape[0]);
  p.batch_size = static_cast<int32_t>(kv.batch_size());
}

/// Block-sparse K/V but its indptr and block flags: k and v are [N, Hkv, D]. `indices`: the
/// column-block ids the kernels read (the one-shot call's own, or run()'s device address of them).
/// The caller sets block_sparse.indptr, block_sparse.block_flags and batch_size (the runtime's
/// come from the plan).
template <typename Params>
void block_sparse_kv_params(Params& p, const TensorView& k, const TensorView& v, const int32_t* indices,
                            int64_t num_indices, int64_t block_rows, int64_t block_cols, int64_t num_rows,
                            int64_t num_cols) {
  kv_row_tensors(p, k, v, 0);
  p.block_sparse.indices = indices;
  p.block_sparse.num_indices = static_cast<int32_t>(num_indices);
  p.block_sparse.block_rows = static_cast<int32_t>(block_rows);
  p.block_sparse.block_cols = static_cast<int32_t>(block_cols);
  p.block_sparse.block_cols_div = kernels::FastDivisor::make(block_cols);
  p.block_sparse.num_blocks = static_cast<int32_t>((num_cols + block_cols - 1) / block_cols);
  p.block_sparse.num_rows = static_cast<int32_t>(num_rows);
  p.block_sparse.num_cols = static_cast<int32_t>(num_cols);
}

/// K and V of a single request: NHD [kv_len, Hkv, D] or HND [Hkv, kv_len, D].
void check_dense_kv(const TensorView& q, const TensorView& k, const TensorView& v, Layout layout);

void check_paged_kv(const TensorView& q, const PagedKV& kv, int64_t batch);

/// Checks qo_indptr against q and max_qo_len (fully in checked mode) and returns the average
/// query length.
double check_qo_indptr(const TensorView& q, const TensorView& qo_indptr, int64_t batch, int64_t max_qo_len);

}  // namespace detail
}  // namespace tessera
