// Host-side launch of the FA2-class kernel for one head dim: the configuration from
// prefill_config.h, the grid from the largest request, the shared-memory opt-in.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "src/check.h"
#include "src/cuda_utils.h"
#include "kernels/attention/contraction.cuh"
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

template <typename Traits>
struct TraitsTag {
  using type = Traits;
};

/// Calls f(TraitsTag<Traits>{}) with the traits of `q_tile` for HEAD_DIM (C++17 stand-in for a
/// template lambda).
template <typename T, int HEAD_DIM, typename F>
void with_q_tile(QTile q_tile, F&& f) {
  switch (q_tile) {
    case QTile::k16:
      return f(TraitsTag<typename PrefillConfig<T, HEAD_DIM, QTile::k16>::Traits>{});
    case QTile::k64:
      return f(TraitsTag<typename PrefillConfig<T, HEAD_DIM, QTile::k64>::Traits>{});
    case QTile::k128:
      if constexpr (HEAD_DIM != 256) return f(TraitsTag<typename PrefillConfig<T, HEAD_DIM, QTile::k128>::Traits>{});
      break;
  }
  TESSERA_FAIL(StatusCode::kInternal) << "no prefill configuration for head_dim " << HEAD_DIM;
}

template <kernels::KVFormatKind kFormat>
using FormatTag = std::integral_constant<kernels::KVFormatKind, kFormat>;

/// Calls f(FormatTag<format>{}) for the runtime value `format`.
template <typename F>
void with_format(kernels::KVFormatKind format, F&& f) {
  switch (format) {
    case kernels::KVFormatKind::kRagged: return f(FormatTag<kernels::KVFormatKind::kRagged>{});
    case kernels::KVFormatKind::kPaged: return f(FormatTag<kernels::KVFormatKind::kPaged>{});
    case kernels::KVFormatKind::kBlockSparse: return f(FormatTag<kernels::KVFormatKind::kBlockSparse>{});
  }
  TESSERA_FAIL(StatusCode::kInternal) << "unknown KV format " << static_cast<int>(format);
}

template <typename T, int HEAD_DIM>
void launch_persistent_head_dim(const kernels::AttentionParams<T>& p, kernels::KVFormatKind format, QTile q_tile,
                                const PersistentLaunch& launch, cudaStream_t stream) {
  with_format(format, [&](auto format_tag) {
    constexpr kernels::KVFormatKind kFormat = decltype(format_tag)::value;
    with_q_tile<T, HEAD_DIM>(q_tile, [&](auto traits_tag) {
      using Traits = typename decltype(traits_tag)::type;
      auto kernel = kernels::attention_persistent_kernel<Traits, kFormat, kernels::DefaultVariant, T>;
      ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
      const dim3 grid(static_cast<unsigned>(launch.grid_cols), static_cast<unsigned>(p.num_kv_heads));
      kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p, launch.work);
      TESSERA_CHECK_LAUNCH();
      if (launch.contraction_blocks > 0) {
        kernels::merge_planned_kernel<T, kFormat>
            <<<launch.contraction_blocks, kernels::ContractionTraits::kThreadsPerBlock, 0, stream>>>(
                p, launch.work, Traits::CTA_TILE_Q, HEAD_DIM);
        TESSERA_CHECK_LAUNCH();
      }
    });
  });
}

template <typename T, int HEAD_DIM>
int persistent_ctas_per_sm(kernels::KVFormatKind format, QTile q_tile) {
  int ctas = 0;
  with_format(format, [&](auto format_tag) {
    constexpr kernels::KVFormatKind kFormat = decltype(format_tag)::value;
    with_q_tile<T, HEAD_DIM>(q_tile, [&](auto traits_tag) {
      using Traits = typename decltype(traits_tag)::type;
      auto kernel = kernels::attention_persistent_kernel<Traits, kFormat, kernels::DefaultVariant, T>;
      ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
      TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, Traits::kThreads,
                                                                       Traits::kSmemBytes))
          << " (occupancy of the persistent kernel)";
    });
  });
  return ctas;
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
