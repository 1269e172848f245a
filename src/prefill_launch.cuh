// Host-side launch of the FA2-class kernel for one head dim: the configuration from
// prefill_config.h, the grid from the largest request, the shared-memory opt-in.
#pragma once

#include <cuda_runtime_api.h>

#include "src/check.h"
#include "src/cuda_utils.h"
#include "src/prefill_config.h"

namespace tessera {
namespace detail {

template <typename Traits, kernels::KVFormatKind kFormat, typename T>
void launch_prefill_config(const kernels::AttentionParams<T>& p, int64_t max_qo_len, cudaStream_t stream) {
  auto kernel = kernels::attention_prefill_kernel<Traits, kFormat, kernels::DefaultVariant, T>;
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
  const int64_t packed_rows = max_qo_len * p.group_size;
  const int64_t q_tiles = (packed_rows + Traits::CTA_TILE_Q - 1) / Traits::CTA_TILE_Q;
  TESSERA_CHECK_ARG(q_tiles <= INT32_MAX && p.batch_size <= 65535 && p.num_kv_heads <= 65535)
      << "grid too large: " << q_tiles << " query tiles x " << p.batch_size << " requests x " << p.num_kv_heads
      << " KV heads (limits 2^31-1 x 65535 x 65535)";
  if (q_tiles == 0 || p.batch_size == 0) return;
  const dim3 grid(static_cast<unsigned>(q_tiles), static_cast<unsigned>(p.batch_size),
                  static_cast<unsigned>(p.num_kv_heads));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p, static_cast<int32_t>(q_tiles));
  TESSERA_CHECK_LAUNCH();
}

template <typename Traits, typename T>
void launch_prefill_format(const kernels::AttentionParams<T>& p, kernels::KVFormatKind format, int64_t max_qo_len,
                           cudaStream_t stream) {
  switch (format) {
    case kernels::KVFormatKind::kRagged:
      return launch_prefill_config<Traits, kernels::KVFormatKind::kRagged>(p, max_qo_len, stream);
    case kernels::KVFormatKind::kPaged:
      return launch_prefill_config<Traits, kernels::KVFormatKind::kPaged>(p, max_qo_len, stream);
    case kernels::KVFormatKind::kBlockSparse:
      return launch_prefill_config<Traits, kernels::KVFormatKind::kBlockSparse>(p, max_qo_len, stream);
  }
  TESSERA_FAIL(StatusCode::kInternal) << "unknown KV format " << static_cast<int>(format);
}

template <typename T, int HEAD_DIM>
void launch_prefill_head_dim(const kernels::AttentionParams<T>& p, kernels::KVFormatKind format, QTile q_tile,
                             int64_t max_qo_len, cudaStream_t stream) {
  switch (q_tile) {
    case QTile::k16:
      return launch_prefill_format<typename PrefillConfig<T, HEAD_DIM, QTile::k16>::Traits>(p, format, max_qo_len, stream);
    case QTile::k64:
      return launch_prefill_format<typename PrefillConfig<T, HEAD_DIM, QTile::k64>::Traits>(p, format, max_qo_len, stream);
    case QTile::k128:
      if constexpr (HEAD_DIM != 256) {
        return launch_prefill_format<typename PrefillConfig<T, HEAD_DIM, QTile::k128>::Traits>(p, format, max_qo_len,
                                                                                             stream);
      }
      break;
  }
  TESSERA_FAIL(StatusCode::kInternal) << "no prefill configuration for head_dim " << HEAD_DIM;
}

}  // namespace detail
}  // namespace tessera
