// Internal interface between the attention entry points (src/attention.cu: validation, building
// AttentionParams) and the kernel families' launchers. Only CUDA translation units include it.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/params.cuh"
#include "src/config/config_types.h"
#include "src/variant/variant_config.h"

namespace tessera {
namespace detail {

/// Launches the CUDA-core decode kernel (kernels/attention/decode.cuh): one query row per request
/// (p.qo_indptr == nullptr and qo_len 1 per request, q row b = request b), ragged or paged KV, any
/// group size. T is __half or __nv_bfloat16, KVT T or fp8 (e4m3, e5m2); head_dim one with a
/// decode row in the configuration table that lists KVT (others are kUnsupported).
template <typename T, typename KVT>
void launch_decode_cuda_cores(const kernels::AttentionParams<T, KVT>& p, kernels::KVFormatKind format, int head_dim,
                              cudaStream_t stream);

/// Launches the FA2-class prefill kernel (kernels/attention/prefill.cuh) over any format, the
/// prebuilt default variant or a JIT-compiled one. max_qo_len bounds every request's query length
/// (BSR: Br); avg_qo_len drives the tile choice. KVT: T, or fp8 (e4m3, e5m2) for head dims whose
/// table rows build it (has_prefill_kv_storage; others are an error). head_dims: of q/k and v/o
/// (an int converts to equal ones).
template <typename T, typename KVT>
void launch_prefill(const kernels::AttentionParams<T, KVT>& p, const ResolvedVariant& variant,
                    kernels::KVFormatKind format, PrefillHeadDims head_dims, int64_t max_qo_len, double avg_qo_len,
                    cudaStream_t stream);

}  // namespace detail
}  // namespace tessera
