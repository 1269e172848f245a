// Host dispatch for the CUDA-core decode kernel (kernels/attention/decode.cuh): the head dim picks
// the table's configuration (src/decode_launch.cuh launches it); the grid is one CTA per (request,
// KV head, chunk of query heads).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "src/attention_dispatch.h"
#include "src/config/attention_configs.h"
#include "src/check.h"
#include "src/cuda_utils.h"
#include "src/variant/jit_variant.h"

namespace tessera {
namespace detail {
/// Defined in src/decode_launch.cuh, instantiated in the generated decode_d*_*.cu.
template <typename T, typename KVT, int HEAD_DIM>
void launch_decode_head_dim(const kernels::AttentionParams<T, KVT>& p, kernels::KVFormatKind format,
                            cudaStream_t stream);

template <typename T, typename KVT>
void launch_decode_cuda_cores(const kernels::AttentionParams<T, KVT>& p, kernels::KVFormatKind format, int head_dim,
                              cudaStream_t stream) {
  // The caller (src/attention.cu) has validated the arguments; these guard the kernel's own
  // assumptions (query row b = request b, integer division by the group size).
  TESSERA_CHECK(p.qo_indptr == nullptr, StatusCode::kInternal) << "decode (CUDA cores): qo_indptr must be null";
  TESSERA_CHECK(p.group_size >= 1 && p.num_kv_heads >= 0 && p.batch_size >= 0, StatusCode::kInternal)
      << "decode (CUDA cores): group_size = " << p.group_size << ", num_kv_heads = " << p.num_kv_heads
      << ", batch_size = " << p.batch_size;
  with_decode_head_dim(head_dim, [&](auto head_dim_tag) {
    constexpr int kHeadDim = decltype(head_dim_tag)::value;
    if constexpr (has_decode_kv_storage(kHeadDim, kv_storage_of<KVT, T>())) {
      if (p.batch_size == 0 || p.num_kv_heads == 0) return;
      launch_decode_head_dim<T, KVT, kHeadDim>(p, format, stream);
    } else {
      TESSERA_FAIL(StatusCode::kUnsupported) << "decode (CUDA cores): K/V of type " << cuda_type_name<KVT>()
                                             << " is not built for head_dim " << kHeadDim
                                             << " (src/config/attention_configs.txt)";
    }
  });
}

#define TESSERA_INSTANTIATE_DECODE_CUDA_CORES(T, KVT)                                                                \
  template void launch_decode_cuda_cores<T, KVT>(const kernels::AttentionParams<T, KVT>&, kernels::KVFormatKind, int, \
                                                 cudaStream_t);
TESSERA_INSTANTIATE_DECODE_CUDA_CORES(__half, __half)
TESSERA_INSTANTIATE_DECODE_CUDA_CORES(__nv_bfloat16, __nv_bfloat16)
TESSERA_INSTANTIATE_DECODE_CUDA_CORES(__half, __nv_fp8_e4m3)
TESSERA_INSTANTIATE_DECODE_CUDA_CORES(__nv_bfloat16, __nv_fp8_e4m3)
TESSERA_INSTANTIATE_DECODE_CUDA_CORES(__half, __nv_fp8_e5m2)
TESSERA_INSTANTIATE_DECODE_CUDA_CORES(__nv_bfloat16, __nv_fp8_e5m2)
#undef TESSERA_INSTANTIATE_DECODE_CUDA_CORES

}  // namespace detail
}  // namespace tessera
