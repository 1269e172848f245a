// Host-side launch of the CUDA-core decode kernel (kernels/attention/decode.cuh) for one head dim:
// the table's configuration (src/config/attention_configs.txt), the grid, the shared-memory opt-in.
// Instantiated per head dim and dtype in the generated <build>/src/config/decode_d*_*.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/decode.cuh"
#include "src/check.h"
#include "src/config/attention_configs.h"
#include "src/cuda_utils.h"

namespace tessera {
namespace detail {

template <typename Traits, kernels::KVFormatKind kFormat, typename T, typename KVT>
void launch_decode_config(const kernels::AttentionParams<T, KVT>& p, cudaStream_t stream) {
  auto kernel = kernels::batch_decode_kernel<Traits, kFormat, kernels::AttentionParams<T, KVT>>;
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
  // Groups larger than one CTA's row groups are split over CTAs (grid z) so that each thread keeps
  // the state of a single query head.
  const int64_t head_chunks = (static_cast<int64_t>(p.group_size) + Traits::kGroups - 1) / Traits::kGroups;
  TESSERA_CHECK_ARG(p.num_kv_heads <= 65535 && head_chunks <= 65535)
      << "grid too large: " << p.batch_size << " requests x " << p.num_kv_heads << " KV heads x " << head_chunks
      << " head chunks (limits 2^31-1 x 65535 x 65535)";
  const dim3 grid(static_cast<unsigned>(p.batch_size), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(head_chunks));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  TESSERA_CHECK_LAUNCH();
}

/// Launches the table's decode configuration of (T, HEAD_DIM) for K/V stored as KVT over `format`
/// (an error for a format the table does not list for it; the caller checks the KV storage).
template <typename T, typename KVT, int HEAD_DIM>
void launch_decode_head_dim(const kernels::AttentionParams<T, KVT>& p, kernels::KVFormatKind format,
                            cudaStream_t stream) {
  using Config = DecodeConfig<T, HEAD_DIM>;
  static_assert((Config::kKVStorages & kv_storage_bit(kv_storage_of<KVT, T>())) != 0,
                "instantiated for the KV storages the table lists");
  with_config_format<Config>(format, "decode (CUDA cores)", [&](auto format_tag) {
    launch_decode_config<typename Config::template TraitsFor<KVT>, decltype(format_tag)::value>(p, stream);
  });
}

}  // namespace detail
}  // namespace tessera
