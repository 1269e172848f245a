// FP8 attention (docs/design.md §11): prefill whose q, k and v are all fp8 e4m3, on the wgmma tile
// (sm_90a) with fp8 MMAs, output f16 or bf16. The entry points (src/attention.cu) check the call
// and build AttentionParams<F8, F8, OT>; this header is what they need from the launcher.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/params.cuh"
#include "src/prefill_config.h"

namespace tessera {
namespace detail {

/// The head dims FP8 attention is built for (the tiles of src/fp8_attention.cu).
inline constexpr int kFp8AttentionHeadDims[] = {128, 256};
inline constexpr const char* kFp8AttentionHeadDimsText = "128, 256";

/// Launches the one-shot FP8 attention kernel of `head_dim` over ragged or paged KV (`format`),
/// the default variant (causal masking and sm_scale), q/k/v of type F8 (__nv_fp8_e4m3) and o of
/// type OT (__half or __nv_bfloat16). max_qo_len bounds every request's query length. The caller
/// has checked the head dim, the format and that the device runs wgmma.
template <typename F8, typename OT>
void launch_fp8_attention(const kernels::AttentionParams<F8, F8, OT>& p, kernels::KVFormatKind format, int head_dim,
                          int64_t max_qo_len, cudaStream_t stream);

/// The plan/run runtime's launch of the FP8 attention tile of `head_dim` (the persistent kernel
/// over `launch`'s plan, then its contraction), as launch_persistent_config does for the 16-bit
/// tiles. The plan's query and KV tile rows are the 16-bit wgmma tile's (QTile::k128Wgmma), which
/// the FP8 tiles share.
template <typename F8, typename OT>
void launch_fp8_attention_persistent(const kernels::AttentionParams<F8, F8, OT>& p, kernels::KVFormatKind format,
                                     int head_dim, const PersistentLaunch& launch, cudaStream_t stream);

/// CTAs of the FP8 persistent kernel of `head_dim` and `format` per SM (the occupancy API).
int fp8_attention_ctas_per_sm(int head_dim, kernels::KVFormatKind format);

}  // namespace detail
}  // namespace tessera
