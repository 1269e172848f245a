// FA2-class kernels for head_dim 64 (one translation unit per head dim: parallel builds).
#include "src/prefill_launch.cuh"

namespace tessera {
namespace detail {

template void launch_prefill_head_dim<__half, 64>(const kernels::AttentionParams<__half>&, const ResolvedVariant&,
                                                  kernels::KVFormatKind, QTile, int64_t, cudaStream_t);
template void launch_prefill_head_dim<__nv_bfloat16, 64>(const kernels::AttentionParams<__nv_bfloat16>&, const ResolvedVariant&,
                                                         kernels::KVFormatKind, QTile, int64_t, cudaStream_t);
template void launch_persistent_head_dim<__half, 64>(const kernels::AttentionParams<__half>&, const ResolvedVariant&,
                                                      kernels::KVFormatKind,
                                                      QTile, const PersistentLaunch&, cudaStream_t);
template void launch_persistent_head_dim<__nv_bfloat16, 64>(const kernels::AttentionParams<__nv_bfloat16>&, const ResolvedVariant&,
                                                      kernels::KVFormatKind, QTile, const PersistentLaunch&,
                                                             cudaStream_t);
template int persistent_ctas_per_sm<__half, 64>(kernels::KVFormatKind, QTile);
template int persistent_ctas_per_sm<__nv_bfloat16, 64>(kernels::KVFormatKind, QTile);

}  // namespace detail
}  // namespace tessera
