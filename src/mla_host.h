// Host pieces of MLA shared by the one-shot entry point (src/mla.cu) and the runtime's
// BatchMLAPagedWrapper (src/runtime/mla_runtime.cu): operand checks and the kernel parameters
// that come from the tensors.
#pragma once

#include <cstdint>

#include "kernels/attention/mla/params.cuh"
#include "tessera/tensor.h"

namespace tessera {
namespace detail {

/// A 3-D operand of the MLA kernels: f16/bf16 (or, with cache = true, a latent cache's e4m3 /
/// e5m2) on CUDA, last dim `width` (layout names it in messages, e.g. "[num_pages, page_size,
/// 512]"), contiguous last dim, 16-byte vectors.
void check_latent_operand(const TensorView& t, const char* name, int64_t width, const char* layout,
                          bool cache = false);
/// The latent cache's dtype against the queries': q's own or fp8 (e4m3, e5m2).
void check_latent_cache_dtype(const TensorView& ckv, const char* ckv_name, DType q_dtype);
/// t has ref's dtype and device and agrees with it in the first `dims` sizes.
void check_latent_matches(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name,
                          int dims);
/// lse: f32 [rows, num_heads] contiguous on q's device.
void check_latent_lse(const TensorView& lse, const TensorView& q, int64_t rows, int64_t num_heads);

/// The tensors' part of the kernel parameters: queries, latent pages (the page table's device
/// arrays are the caller's), outputs. Checked before.
template <typename T, typename KVT>
void set_mla_tensor_params(kernels::MlaParams<T, KVT>& p, const TensorView& q_nope, const TensorView& q_pe,
                           const TensorView& ckv, const TensorView& kpe, const TensorView& o, const TensorView& lse) {
  p.q_nope = q_nope.data_as<const T>();
  p.q_pe = q_pe.data_as<const T>();
  p.q_nope_stride_token = q_nope.strides[0];
  p.q_nope_stride_head = q_nope.strides[1];
  p.q_pe_stride_token = q_pe.strides[0];
  p.q_pe_stride_head = q_pe.strides[1];
  p.ckv = static_cast<const KVT*>(ckv.data);
  p.kpe = static_cast<const KVT*>(kpe.data);
  p.ckv_stride_page = ckv.strides[0];
  p.ckv_stride_slot = ckv.strides[1];
  p.kpe_stride_page = kpe.strides[0];
  p.kpe_stride_slot = kpe.strides[1];
  p.page_size = static_cast<int32_t>(ckv.shape[1]);
  p.page_div = kernels::FastDivisor::make(ckv.shape[1]);
  p.o = o.data_as<T>();
  p.o_stride_token = o.strides[0];
  p.o_stride_head = o.strides[1];
  p.lse = lse.defined() ? lse.data_as<float>() : nullptr;
  p.num_heads = static_cast<int32_t>(q_nope.shape[1]);
}

}  // namespace detail
}  // namespace tessera
