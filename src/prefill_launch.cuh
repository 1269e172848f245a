// Host-side launch of the FA2-class kernel for one head dim: the configuration from
// prefill_config.h, the grid from the largest request, the shared-memory opt-in.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <type_traits>

#include "src/check.h"
#include "src/cuda_utils.h"
#include "kernels/attention/contraction.cuh"
#include "kernels/attention/prefill/mask_tile_lists.cuh"
#include "src/kv_tma.h"
#include "src/prefill_config.h"
#include "src/variant/jit_variant.h"

namespace tessera {
namespace detail {

/// "tessera::kernels::PrefillTraits<...>, tessera::kernels::KVFormatKind::k..." for the JIT.
template <kernels::KVFormatKind kFormat>
constexpr const char* format_enumerator() {
  return kFormat == kernels::KVFormatKind::kRagged  ? "kRagged"
         : kFormat == kernels::KVFormatKind::kPaged ? "kPaged"
                                                     : "kBlockSparse";
}

template <typename Traits, kernels::KVFormatKind kFormat>
std::string prefill_template_args() {
  // The text names these eleven parameters only: a PrefillTraits parameter added later must be
  // added here too, or the JIT would compile a different configuration than the host launches.
  static_assert(std::is_same<Traits, kernels::PrefillTraits<typename Traits::DType, Traits::HEAD_DIM, Traits::CTA_TILE_Q,
                                                            Traits::CTA_TILE_KV, Traits::NUM_WARPS_Q, Traits::NUM_WARPS_KV,
                                                            Traits::kStages, Traits::kMinCtasPerSm, Traits::kMma,
                                                            typename Traits::KVStorage, Traits::HEAD_DIM_VO>>::value,
                "prefill_template_args must spell every PrefillTraits parameter");
  const char* format = format_enumerator<kFormat>();
  return str_cat("tessera::kernels::PrefillTraits<", cuda_type_name<typename Traits::DType>(), ", ", Traits::HEAD_DIM,
                 ", ", Traits::CTA_TILE_Q, ", ", Traits::CTA_TILE_KV, ", ", Traits::NUM_WARPS_Q, ", ",
                 Traits::NUM_WARPS_KV, ", ", Traits::kStages, ", ", Traits::kMinCtasPerSm, ", tessera::kernels::MmaKind::",
                 Traits::kWgmma ? "kWgmma" : "kSync", ", ", cuda_type_name<typename Traits::KVStorage>(), ", ",
                 Traits::HEAD_DIM_VO, ">, tessera::kernels::KVFormatKind::", format);
}

/// The JIT request of the prefill kernel template with one tile scheduler for a non-default
/// variant.
template <typename Traits, kernels::KVFormatKind kFormat>
VariantKernelRequest prefill_variant_request(const char* scheduler, const char* what, int smem_bytes) {
  VariantKernelRequest r;
  r.header = "kernels/attention/prefill.cuh";
  r.kernel = "tessera::kernels::attention_prefill_kernel";
  r.args_before = prefill_template_args<Traits, kFormat>();
  using T = typename Traits::DType;
  using KVT = typename Traits::KVStorage;
  static_assert(std::is_same<kernels::AttentionParams<T, KVT>, kernels::AttentionParams<T, KVT, T, kernels::int32_t>>::value,
                "params_type_name spells the launches' kernels::AttentionParams<T, KVT> with its defaults written out");
  r.args_after = str_cat(scheduler, ", ", params_type_name<T, KVT>());
  r.dynamic_smem_bytes = smem_bytes;
  // e.g. "prefill D128 Q128 KV64 kRagged __nv_bfloat16" (a 16-row tile is the decode shape)
  r.description = str_cat(what, " D", Traits::HEAD_DIM,
                          Traits::kSplitHeadDims ? str_cat("x", Traits::HEAD_DIM_VO) : std::string(), " Q", Traits::CTA_TILE_Q, " KV", Traits::CTA_TILE_KV,
                          Traits::kWgmma ? " wgmma " : " ", format_enumerator<kFormat>(), " ",
                          cuda_type_name<typename Traits::DType>(),
                          Traits::kDequantizeKV ? str_cat(" KV ", cuda_type_name<KVT>()) : std::string());
  return r;
}

/// The JIT requests of the one-shot kernel (one work item per CTA: the first Q buffer only) and
/// of the persistent kernel (every Q buffer).
template <typename Traits, kernels::KVFormatKind kFormat>
VariantKernelRequest oneshot_variant_request() {
  return prefill_variant_request<Traits, kFormat>("tessera::kernels::OneShotScheduler", "prefill",
                                                  Traits::kOneItemSmemBytes);
}
template <typename Traits, kernels::KVFormatKind kFormat>
VariantKernelRequest persistent_variant_request() {
  VariantKernelRequest r = prefill_variant_request<Traits, kFormat>("tessera::kernels::PlannedScheduler",
                                                                    "persistent", Traits::kSmemBytes);
  r.merged_by_lse = true;
  return r;
}

/// The one-shot kernel's grid (OneShotScheduler reads it back). Several query tiles per
/// request: (query tile, request, KV head), so a (request, KV head)'s tiles, which read the same
/// K/V, run together and share it in L2. One query tile per request (decode): (KV head, request,
/// 1), so the CTAs of one request's KV heads run together. A page (NHD) interleaves its rows'
/// heads, so they then stream each page at once, and they share its page-table entries in L2;
/// with the KV head slowest, a grid of more CTAs than slots read half of every page's bytes in
/// one wave and the other half in the next (the multi-wave W1 cells gained: bench/results/LOG.md).
/// Block-sparse "requests" are the block rows of one sequence, which read the same K/V: with one
/// query tile each the grid is (block row, KV head, 1), so a KV head's rows run together (with
/// the heads fastest, every head's K/V streamed at once and overflowed L2: W3 dense through
/// flex_attention 472 against the ragged kernel's 568 TFLOP/s).
inline dim3 one_shot_grid(int64_t q_tiles, int64_t batch_size, int64_t num_kv_heads, bool block_sparse) {
  if (q_tiles == 1 && block_sparse) {
    return dim3(static_cast<unsigned>(batch_size), static_cast<unsigned>(num_kv_heads), 1u);
  }
  if (q_tiles == 1) {
    return dim3(static_cast<unsigned>(num_kv_heads), static_cast<unsigned>(batch_size), 1u);
  }
  return dim3(static_cast<unsigned>(q_tiles), static_cast<unsigned>(batch_size), static_cast<unsigned>(num_kv_heads));
}

/// The one-shot launch of a configuration: its grid and its scheduler's arguments (no CTAs when
/// there are no query tiles or requests).
template <typename Traits>
struct OneShotLaunch {
  dim3 grid;
  typename kernels::OneShotScheduler<Traits>::Arguments tiles;
  bool empty;
};
template <typename Traits, kernels::KVFormatKind kFormat, typename Params>
OneShotLaunch<Traits> one_shot_launch(const Params& p, int64_t max_qo_len) {
  const int64_t packed_rows = max_qo_len * p.group_size;
  const int64_t q_tiles = (packed_rows + Traits::CTA_TILE_Q - 1) / Traits::CTA_TILE_Q;
  TESSERA_CHECK_ARG(q_tiles <= INT32_MAX && p.batch_size <= 65535 && p.num_kv_heads <= 65535)
      << "grid too large: " << q_tiles << " query tiles x " << p.batch_size << " requests x " << p.num_kv_heads
      << " KV heads (limits 2^31-1 x 65535 x 65535)";
  OneShotLaunch<Traits> launch;
  launch.empty = q_tiles == 0 || p.batch_size == 0;
  launch.grid = launch.empty ? dim3(0u)
                             : one_shot_grid(q_tiles, p.batch_size, p.num_kv_heads,
                                             kFormat == kernels::KVFormatKind::kBlockSparse);
  launch.tiles = {static_cast<int32_t>(q_tiles)};
  return launch;
}

/// `p` with the TMA descriptors of its q, K and V for the configuration's tile where it copies
/// whole tiles with TMA (PrefillTraits::kTmaQ, kTmaKV; KV: ragged and paged): encoded at each launch,
/// since they hold the tensors' addresses (a captured graph keeps the launch's, as it keeps the
/// pointers).
template <typename Traits, kernels::KVFormatKind kFormat, typename Params>
Params with_tma_descriptors(const Params& p) {
  Params r = p;
  r.q_tma.enabled = 0;
  r.o_tma.enabled = 0;
  r.kv_tma.enabled = 0;
  if constexpr (Traits::kTmaQ) {
    using QTile = typename Traits::template SmemTile<Traits::CTA_TILE_Q>;
    constexpr int kQAtomElems = QTile::kAtomChunks * Traits::kChunkElems;
    encode_query_rows_tma(r.q_tma,
                          QueryRows{p.q.data, p.num_q_rows, p.group_size, p.num_kv_heads, p.q.row_stride, p.q.head_stride},
                          Traits::CTA_TILE_Q, Traits::HEAD_DIM, kQAtomElems, "the TMA descriptor of q");
    if constexpr (Traits::kTmaO) {  // boxes of a warpgroup's 64 rows (PrefillEpilogue::store_tile_tma)
      encode_query_rows_tma(r.o_tma,
                            QueryRows{p.o.data, p.num_q_rows, p.group_size, p.num_kv_heads, p.o.row_stride,
                                      p.o.head_stride},
                            4 * Traits::kWarpRowsQ, Traits::HEAD_DIM_VO, kQAtomElems, "the TMA descriptor of o");
    }
  }
  if constexpr ((kFormat == kernels::KVFormatKind::kRagged || kFormat == kernels::KVFormatKind::kPaged) &&
                Traits::kTmaKV) {
    using KTile = typename Traits::template SmemTile<Traits::CTA_TILE_KV>;
    using VTile = typename Traits::template VSmemTile<Traits::CTA_TILE_KV>;
    KVRowTensors kv{p.kv.k, p.kv.v, p.ragged.num_rows, p.num_kv_heads, 1, p.kv.k_row_stride, p.kv.k_head_stride, 0,
                    p.kv.v_row_stride, p.kv.v_head_stride, 0, false};
    if constexpr (kFormat == kernels::KVFormatKind::kPaged) {
      kv.paged = true;
      kv.block_rows = p.paged.page_size;
      kv.num_blocks = p.paged.num_pages;
      kv.k_block_stride = p.paged.k_page_stride;
      kv.v_block_stride = p.paged.v_page_stride;
    }
    encode_kv_tma(r.kv_tma, kv, KVTmaBox{Traits::CTA_TILE_KV, Traits::HEAD_DIM, KTile::kAtomChunks * Traits::kChunkElems},
                  KVTmaBox{Traits::CTA_TILE_KV, Traits::HEAD_DIM_VO, VTile::kAtomChunks * Traits::kChunkElems});
  }
  return r;
}

/// Launches the prebuilt (default-variant) one-shot kernel of a configuration.
template <typename Traits, kernels::KVFormatKind kFormat, typename Params>
void launch_default_one_shot(const Params& p, const kernels::VariantParams& vp, const OneShotLaunch<Traits>& launch,
                             cudaStream_t stream) {
  auto kernel = kernels::attention_prefill_kernel<Traits, kFormat, kernels::DefaultVariant, kernels::OneShotScheduler, Params>;
  // One work item per CTA: only the first Q buffer (kOneItemSmemBytes; the default variant's
  // fp8 decode tiles leave out the T tiles they never read).
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kDefaultOneItemSmemBytes);
  kernel<<<launch.grid, Traits::kThreads, Traits::kDefaultOneItemSmemBytes, stream>>>(p, vp, launch.tiles);
  TESSERA_CHECK_LAUNCH();
}

template <typename Traits, kernels::KVFormatKind kFormat, typename Params>
void launch_prefill_config(const Params& p_in, const ResolvedVariant& variant, int64_t max_qo_len, cudaStream_t stream) {
  const OneShotLaunch<Traits> launch = one_shot_launch<Traits, kFormat>(p_in, max_qo_len);
  if (launch.empty) return;
  const Params p = with_tma_descriptors<Traits, kFormat>(p_in);
  if (variant.is_default) {
    launch_default_one_shot<Traits, kFormat>(p, variant.params, launch, stream);
    return;
  }
  const dim3 grid = launch.grid;
  auto tiles = launch.tiles;
  const VariantKernelRequest request = oneshot_variant_request<Traits, kFormat>();
  CUfunction fn = variant_kernel(variant, request);
  Params params = p;
  kernels::VariantParams vp = variant.params;
  void* args[] = {&params, &vp, &tiles};
  launch_variant_kernel(fn, request, grid.x, grid.y, grid.z, Traits::kThreads, args, stream);
}

/// Launches the contraction of a persistent launch's split tiles (none when contraction_blocks is
/// 0): the plan's tiles of q_tile_rows rows, head_dim_vo columns.
template <typename Params, kernels::KVFormatKind kFormat>
void launch_contraction(const Params& p, const PersistentLaunch& launch, int q_tile_rows, int head_dim_vo,
                        bool dependent, cudaStream_t stream) {
  if (launch.contraction_blocks == 0) return;
  // dependent: a programmatic dependent of the persistent kernel (sm_90+): it starts on the SMs
  // that kernel leaves free, reads the plan, then waits for the partial states (W1 B=1 L=32k: the
  // contraction ran 7.6 us after the persistent kernel, mostly dependent plan loads).
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(launch.contraction_blocks));
  config.blockDim = dim3(kernels::ContractionTraits::kThreadsPerBlock);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = dependent && current_device_has_dependent_launch() ? 1 : 0;
  TESSERA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernels::merge_planned_kernel<Params, kFormat>, p, launch.work,
                                        q_tile_rows, head_dim_vo))
      << " (contraction of the plan/run runtime)";
}

/// Launches mask_tile_lists_kernel for the persistent launch of configuration Traits: the lists
/// of its plan's items, over the tiles of that configuration.
template <typename Traits, kernels::KVFormatKind kFormat, typename Params>
void launch_mask_tile_lists(const Params& p, const kernels::VariantParams& vp, const PersistentLaunch& launch,
                            cudaStream_t stream) {
  if constexpr (kFormat == kernels::KVFormatKind::kBlockSparse) {
    TESSERA_FAIL(StatusCode::kInternal) << "mask tile lists over block-sparse KV (custom masks are refused there)";
  } else {
    using Lists = kernels::MaskTileListsTraits;
    const int64_t blocks = std::min<int64_t>((std::max(launch.mask_list_items, 1) + Lists::kWarps - 1) / Lists::kWarps,
                                             4 * current_device_sm_count());
    kernels::mask_tile_lists_kernel<kFormat, Params><<<static_cast<unsigned>(blocks), Lists::kThreads, 0, stream>>>(
        p, vp, launch.work, launch.grid_cols, std::max(launch.mask_list_items, 1), Traits::CTA_TILE_Q,
        Traits::CTA_TILE_KV, launch.mask_tile_lists);
    TESSERA_CHECK_LAUNCH();
  }
}

/// Launches the persistent kernel of one configuration and format (and its contraction).
template <typename Traits, kernels::KVFormatKind kFormat, typename Params>
void launch_persistent_config(const Params& p_in, const ResolvedVariant& variant, const PersistentLaunch& launch,
                              cudaStream_t stream) {
  const Params p = with_tma_descriptors<Traits, kFormat>(p_in);
  TESSERA_CHECK(launch.work.heads_per_cta >= 1 && p.num_kv_heads % launch.work.heads_per_cta == 0 &&
                    (Traits::kWarpSpecialized || launch.work.heads_per_cta == 1),
                StatusCode::kInternal)
      << "persistent launch: heads_per_cta = " << launch.work.heads_per_cta << " with num_kv_heads = "
      << p.num_kv_heads << " (a divisor; 1 unless the tile is warp-specialised)";
  const dim3 grid(static_cast<unsigned>(launch.grid_cols),
                  static_cast<unsigned>(p.num_kv_heads / launch.work.heads_per_cta));
  // The persistent kernel may start under the lists' kernel: it reads only older results until
  // its first list (KVTiles waits there).
  const bool lists = launch.work.mask_tile_lists != nullptr;
  if (lists) launch_mask_tile_lists<Traits, kFormat>(p, variant.params, launch, stream);
  if (variant.is_default) {
    auto kernel =
        kernels::attention_prefill_kernel<Traits, kFormat, kernels::DefaultVariant, kernels::PlannedScheduler, Params>;
    ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kDefaultSmemBytes);
    kernel<<<grid, Traits::kThreads, Traits::kDefaultSmemBytes, stream>>>(p, variant.params, launch.work);
    TESSERA_CHECK_LAUNCH();
  } else {
    const VariantKernelRequest request = persistent_variant_request<Traits, kFormat>();
    CUfunction fn = variant_kernel(variant, request);
    Params params = p;
    kernels::VariantParams vp = variant.params;
    kernels::PlannedWork work = launch.work;
    void* args[] = {&params, &vp, &work};
    launch_variant_kernel(fn, request, grid.x, grid.y, grid.z, Traits::kThreads, args, stream,
                          lists && current_device_has_dependent_launch());
  }
  launch_contraction<Params, kFormat>(p, launch, Traits::CTA_TILE_Q, Traits::HEAD_DIM_VO, /*dependent=*/true, stream);
}

/// Calls f(ConfigTag<Traits>{}, FormatTag<format>{}) with the traits of the table's configuration
/// of (T, HEAD_DIM, HEAD_DIM_VO, q_tile) for K/V stored as KVT, and `format`; a configuration, KV
/// storage or format the table lacks is an error.
template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO, typename F>
void with_prefill_config(QTile q_tile, kernels::KVFormatKind format, F&& f) {
  PrefillTiles<T, HEAD_DIM, HEAD_DIM_VO>::with_q_tile(q_tile, [&](auto config_tag) {
    using Config = typename decltype(config_tag)::type;
    if constexpr ((Config::kKVStorages & kv_storage_bit(kv_storage_of<KVT, T>())) != 0) {
      using Traits = typename Config::template TraitsFor<KVT>;
      if constexpr (Traits::kWgmma) {
        TESSERA_CHECK(current_device_has_wgmma(), StatusCode::kInternal)
            << "the wgmma prefill configuration was chosen on a device without it";
      }
      with_config_format<Config>(format, "prefill", [&](auto format_tag) { f(ConfigTag<Traits>{}, format_tag); });
    } else {
      fail_no_prefill_config(PrefillHeadDims(HEAD_DIM, HEAD_DIM_VO), q_tile, cuda_type_name<KVT>());
    }
  });
}

template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO>
void launch_persistent_head_dim(const kernels::AttentionParams<T, KVT>& p, const ResolvedVariant& variant,
                                kernels::KVFormatKind format, QTile q_tile, const PersistentLaunch& launch,
                                cudaStream_t stream) {
  with_prefill_config<T, KVT, HEAD_DIM, HEAD_DIM_VO>(q_tile, format, [&](auto traits_tag, auto format_tag) {
    using Traits = typename decltype(traits_tag)::type;
    launch_persistent_config<Traits, decltype(format_tag)::value>(p, variant, launch, stream);
  });
}

template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO>
int persistent_ctas_per_sm(kernels::KVFormatKind format, QTile q_tile) {
  int ctas = 0;
  with_prefill_config<T, KVT, HEAD_DIM, HEAD_DIM_VO>(q_tile, format, [&](auto traits_tag, auto format_tag) {
    using Traits = typename decltype(traits_tag)::type;
    auto kernel = kernels::attention_prefill_kernel<Traits, decltype(format_tag)::value, kernels::DefaultVariant,
                                                    kernels::PlannedScheduler, kernels::AttentionParams<T, KVT>>;
    // The default variant's kernel (variants' kernels with fp8 T tiles may fit fewer CTAs: the
    // grid then runs in more than one wave, still correct).
    ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kDefaultSmemBytes);
    TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, Traits::kThreads,
                                                                     Traits::kDefaultSmemBytes))
        << " (occupancy of the persistent kernel)";
  });
  return ctas;
}

template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO>
void launch_prefill_head_dim(const kernels::AttentionParams<T, KVT>& p, const ResolvedVariant& variant,
                             kernels::KVFormatKind format, QTile q_tile, int64_t max_qo_len, cudaStream_t stream) {
  with_prefill_config<T, KVT, HEAD_DIM, HEAD_DIM_VO>(q_tile, format, [&](auto traits_tag, auto format_tag) {
    using Traits = typename decltype(traits_tag)::type;
    launch_prefill_config<Traits, decltype(format_tag)::value>(p, variant, max_qo_len, stream);
  });
}

}  // namespace detail
}  // namespace tessera
