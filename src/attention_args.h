// Argument checks and AttentionParams builders shared by the attention entry points
// (src/attention.cu) and the plan/run runtime (src/runtime/). CUDA translation units only: it
// includes the kernels' parameter struct.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention/params.cuh"
#include "src/check.h"
#include "tessera/attention.h"
#include "tessera/validate.h"

namespace tessera {
namespace detail {

using kernels::AttentionParams;

inline constexpr double kLog2e = 1.4426950408889634;

/// A 16-bit tensor of `ndim` dims the kernels read or write in 16-byte vectors.
void check_operand(const TensorView& t, const char* name, int ndim);

void check_index_array(const TensorView& t, const char* name, const TensorView& data, int64_t length);

/// o like q ([rows, Hq, D], same dtype); lse f32 [rows, Hq] when given.
void check_outputs(const TensorView& q, const TensorView& o, const TensorView& lse, int64_t rows);

HeadConfig check_heads(int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim);

/// options.sm_scale, or 1/sqrt(head_dim) when it is negative; checked finite and nonzero (the
/// kernels take the row max before scaling, so the scale must be > 0).
inline double resolved_sm_scale(const AttentionOptions& options, int64_t head_dim) {
  const double sm_scale = options.sm_scale < 0 ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : options.sm_scale;
  TESSERA_CHECK_ARG(std::isfinite(sm_scale) && sm_scale != 0.0)
      << "options.sm_scale = " << options.sm_scale << ", expected a finite value > 0 (or < 0 for 1/sqrt(head_dim))";
  return sm_scale;
}

/// The part of AttentionParams that does not depend on the KV format. q and o are [rows, Hq, D]
/// (a 2-D [Hq, D] q of single decode is one row).
template <typename T>
AttentionParams<T> query_params(const TensorView& q, const TensorView& o, const TensorView& lse,
                                const HeadConfig& heads, const AttentionOptions& options) {
  AttentionParams<T> p{};
  const bool one_row = q.ndim == 2;
  p.q = q.data_as<const T>();
  p.q_row_stride = one_row ? 0 : q.strides[0];
  p.q_head_stride = q.strides[q.ndim - 2];
  p.o = o.data_as<T>();
  p.o_row_stride = o.ndim == 2 ? 0 : o.strides[0];
  p.o_head_stride = o.strides[o.ndim - 2];
  if (lse.data != nullptr) {
    p.lse = lse.data_as<float>();
    p.lse_row_stride = lse.ndim == 1 ? 0 : lse.strides[0];
    p.lse_head_stride = lse.strides[lse.ndim - 1];
  }
  p.num_q_rows = static_cast<int32_t>(one_row ? 1 : q.shape[0]);
  p.num_qo_heads = static_cast<int32_t>(heads.num_qo_heads);
  p.num_kv_heads = static_cast<int32_t>(heads.num_kv_heads);
  p.group_size = static_cast<int32_t>(heads.num_qo_heads / heads.num_kv_heads);
  const double sm_scale = resolved_sm_scale(options, heads.head_dim);
  p.sm_scale_log2 = static_cast<float>(sm_scale * kLog2e);
  p.sm_scale = static_cast<float>(sm_scale);
  p.causal = options.causal;
  return p;
}

/// Dense K/V of one request, NHD [kv_len, Hkv, D] or HND [Hkv, kv_len, D], as a ragged gather.
template <typename T>
void dense_kv_params(AttentionParams<T>& p, const TensorView& k, const TensorView& v, Layout layout) {
  const int row = layout == Layout::kNHD ? 0 : 1, head = 1 - row;
  p.k = k.data_as<const T>();
  p.v = v.data_as<const T>();
  p.k_row_stride = k.strides[row];
  p.k_head_stride = k.strides[head];
  p.v_row_stride = v.strides[row];
  p.v_head_stride = v.strides[head];
  p.kv_indptr = nullptr;
  p.kv_len_single = static_cast<int32_t>(k.shape[row]);
  p.num_kv_rows = p.kv_len_single;
  p.batch_size = 1;
}

template <typename T>
void ragged_kv_params(AttentionParams<T>& p, const TensorView& k, const TensorView& v, const TensorView& kv_indptr) {
  p.k = k.data_as<const T>();
  p.v = v.data_as<const T>();
  p.k_row_stride = k.strides[0];
  p.k_head_stride = k.strides[1];
  p.v_row_stride = v.strides[0];
  p.v_head_stride = v.strides[1];
  p.kv_indptr = kv_indptr.data_as<const int32_t>();
  p.num_kv_rows = static_cast<int32_t>(k.shape[0]);
  p.batch_size = static_cast<int32_t>(kv_indptr.shape[0] - 1);
}

template <typename T>
void paged_kv_params(AttentionParams<T>& p, const PagedKV& kv) {
  p.k = kv.k.data_as<const T>();
  p.v = kv.v.data_as<const T>();
  p.k_page_stride = kv.k_page_stride();
  p.k_row_stride = kv.k_slot_stride();
  p.k_head_stride = kv.k_head_stride();
  p.v_page_stride = kv.v_page_stride();
  p.v_row_stride = kv.v_slot_stride();
  p.v_head_stride = kv.v_head_stride();
  p.kv_indptr = kv.indptr.data_as<const int32_t>();
  p.kv_indices = kv.indices.data_as<const int32_t>();
  p.last_page_len = kv.last_page_len.data_as<const int32_t>();
  p.page_size = static_cast<int32_t>(kv.page_size());
  p.num_pages = static_cast<int32_t>(kv.num_pages());
  p.num_indices = static_cast<int32_t>(kv.indices.shape[0]);
  p.batch_size = static_cast<int32_t>(kv.batch_size());
}

/// K and V of a single request: NHD [kv_len, Hkv, D] or HND [Hkv, kv_len, D].
void check_dense_kv(const TensorView& q, const TensorView& k, const TensorView& v, Layout layout);

void check_paged_kv(const TensorView& q, const PagedKV& kv, int64_t batch);

/// Checks qo_indptr against q and max_qo_len (fully in checked mode) and returns the average
/// query length.
double check_qo_indptr(const TensorView& q, const TensorView& qo_indptr, int64_t batch, int64_t max_qo_len);

}  // namespace detail
}  // namespace tessera
