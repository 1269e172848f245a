// Host-side launch of the POD kernel (kernels/attention/pod.cuh) for one head dim: the tile pair
// (prefill_config.h's is_pod_pair), the shared-memory opt-in, the grid of both plans, then the
// contraction of each side's split tiles.
#pragma once

#include <type_traits>

#include "kernels/attention/pod.cuh"
#include "src/prefill_launch.cuh"

namespace tessera {
namespace detail {

/// The query tile of a generated PrefillConfig.
template <typename Config>
struct ConfigQTile;
template <typename T, int HEAD_DIM, QTile Q, int HEAD_DIM_VO>
struct ConfigQTile<PrefillConfig<T, HEAD_DIM, Q, HEAD_DIM_VO>> {
  static constexpr QTile value = Q;
};

/// Calls f(ConfigTag<PrefillTraits>{}, ConfigTag<DecodeTraits>{}) with the table's traits of
/// `tiles` for K/V stored as KVT; a pair that is_pod_pair rejects, or that the table lacks, is an
/// error (the runtime asks pod_tiles, so never).
template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO, typename F>
void with_pod_config(PodTiles tiles, F&& f) {
  using Tiles = PrefillTiles<T, HEAD_DIM, HEAD_DIM_VO>;
  Tiles::with_q_tile(tiles.prefill, [&](auto prefill_tag) {
    Tiles::with_q_tile(tiles.decode, [&](auto decode_tag) {
      using PrefillC = typename std::decay_t<decltype(prefill_tag)>::type;  // a captured tag: decay the reference
      using DecodeC = typename std::decay_t<decltype(decode_tag)>::type;
      constexpr uint32_t kKV = kv_storage_bit(kv_storage_of<KVT, T>());
      if constexpr (is_pod_pair(ConfigQTile<PrefillC>::value, ConfigQTile<DecodeC>::value) &&
                    (PrefillC::kKVStorages & kKV) != 0 && (DecodeC::kKVStorages & kKV) != 0 &&
                    (PrefillC::kFormats & DecodeC::kFormats & format_bit(kernels::KVFormatKind::kPaged)) != 0) {
        using PrefillT = typename PrefillC::template TraitsFor<KVT>;
        using DecodeT = typename DecodeC::template TraitsFor<KVT>;
        if constexpr (PrefillT::kWgmma) {
          TESSERA_CHECK(current_device_has_wgmma(), StatusCode::kInternal)
              << "the wgmma POD configuration was chosen on a device without it";
        }
        f(ConfigTag<PrefillT>{}, ConfigTag<DecodeT>{});
      } else {
        TESSERA_FAIL(StatusCode::kInternal)
            << "no POD kernel for query tiles " << q_tile_name(tiles.prefill) << " + " << q_tile_name(tiles.decode)
            << " at head_dim " << HEAD_DIM << " (prefill_config.h is_pod_pair)";
      }
    });
  });
}

template <typename PrefillT, typename DecodeT, typename Params>
auto pod_kernel() {
  return kernels::attention_pod_kernel<PrefillT, DecodeT, kernels::KVFormatKind::kPaged, kernels::DefaultVariant,
                                       Params>;
}

template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO>
void launch_pod_head_dim(const kernels::AttentionParams<T, KVT>& p_in, const ResolvedVariant& variant, PodTiles tiles,
                         const PodLaunch& launch, cudaStream_t stream) {
  using Params = kernels::AttentionParams<T, KVT>;
  TESSERA_CHECK(variant.is_default, StatusCode::kInternal) << "the POD kernel runs the default variant only";
  with_pod_config<T, KVT, HEAD_DIM, HEAD_DIM_VO>(tiles, [&](auto prefill_tag, auto decode_tag) {
    using PrefillT = typename decltype(prefill_tag)::type;
    using DecodeT = typename decltype(decode_tag)::type;
    // The prefill side's TMA copies (the decode side's mma.sync tile reads none of it).
    const Params p = with_tma_descriptors<PrefillT, kernels::KVFormatKind::kPaged>(p_in);
    using Pod = kernels::PodTraits<PrefillT, DecodeT, kernels::DefaultVariant>;
    const kernels::PlannedWork& prefill = launch.prefill.work;
    TESSERA_CHECK(launch.decode.work.heads_per_cta == 1 && prefill.heads_per_cta >= 1 &&
                      p.num_kv_heads % prefill.heads_per_cta == 0 &&
                      (PrefillT::kWarpSpecialized || prefill.heads_per_cta == 1),
                  StatusCode::kInternal)
        << "POD launch: heads_per_cta = " << prefill.heads_per_cta << " / " << launch.decode.work.heads_per_cta
        << " with num_kv_heads = " << p.num_kv_heads;
    kernels::PodWork work;
    work.prefill = prefill;
    work.decode = launch.decode.work;
    work.prefill_cols = launch.prefill.grid_cols;
    work.prefill_ctas = launch.prefill.grid_cols * (p.num_kv_heads / prefill.heads_per_cta);
    work.decode_cols = launch.decode.grid_cols;
    const int64_t decode_slots = static_cast<int64_t>(work.decode_cols) * p.num_kv_heads;
    const int64_t ctas = work.prefill_ctas + (decode_slots + Pod::kDecodeCopies - 1) / Pod::kDecodeCopies;
    if (ctas == 0) return;
    auto kernel = pod_kernel<PrefillT, DecodeT, Params>();
    ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Pod::kSmemBytes);
    kernel<<<static_cast<unsigned>(ctas), Pod::kThreads, Pod::kSmemBytes, stream>>>(p, variant.params, work);
    TESSERA_CHECK_LAUNCH();
    // Each side's split tiles: the first a programmatic dependent of the POD kernel, the second
    // after it in stream order.
    launch_contraction<Params, kernels::KVFormatKind::kPaged>(p, launch.prefill, PrefillT::CTA_TILE_Q,
                                                              PrefillT::HEAD_DIM_VO, /*dependent=*/true, stream);
    launch_contraction<Params, kernels::KVFormatKind::kPaged>(p, launch.decode, DecodeT::CTA_TILE_Q,
                                                              DecodeT::HEAD_DIM_VO,
                                                              /*dependent=*/launch.prefill.contraction_blocks == 0,
                                                              stream);
  });
}

template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO>
PodOccupancy pod_occupancy(PodTiles tiles) {
  PodOccupancy occupancy{0, 0};
  with_pod_config<T, KVT, HEAD_DIM, HEAD_DIM_VO>(tiles, [&](auto prefill_tag, auto decode_tag) {
    using PrefillT = typename decltype(prefill_tag)::type;
    using DecodeT = typename decltype(decode_tag)::type;
    using Pod = kernels::PodTraits<PrefillT, DecodeT, kernels::DefaultVariant>;
    auto kernel = pod_kernel<PrefillT, DecodeT, kernels::AttentionParams<T, KVT>>();
    ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Pod::kSmemBytes);
    TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy.ctas_per_sm, kernel, Pod::kThreads,
                                                                     Pod::kSmemBytes))
        << " (occupancy of the POD kernel)";
    occupancy.decode_copies = Pod::kDecodeCopies;
  });
  return occupancy;
}

}  // namespace detail
}  // namespace tessera
