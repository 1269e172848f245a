// The heuristic that picks a prefill tile configuration, and the launchers' declarations. The
// configurations themselves (PrefillConfig: traits and formats per dtype, head dim and query tile)
// are generated from the table src/config/attention_configs.txt; every instantiation and every
// launch goes through them.
#pragma once

#include "kernels/attention/prefill.cuh"
#include "src/config/attention_configs.h"
#include "src/variant/variant_config.h"

namespace tessera {
namespace detail {

/// Heuristic (docs/design.md §5): the average packed rows per request, avg_qo_len * group_size, sets
/// the query tile — up to 16 rows: k16, a 16-row tile with 4 warps splitting each KV tile (decode
/// and short appends are memory bound: wide KV tiles keep bytes in flight); up to 64 rows: k64, one
/// m16 tile per warp; longer: the 128-row tile of the head dim (q_tile_128) when the table has one,
/// else k64. Head_dim 256's 128-row tile is 8 warps x 16 rows (one CTA per SM, the 64-row
/// tile's warps per SM): 32 rows per warp would need 256 accumulator registers per thread, and 8
/// warps sharing each K/V tile halve the K/V copies per FLOP against two 64-row CTAs. The
/// 128-row tile of head_dim 128 is 4 warps x 32 rows: each K/V fragment loaded from shared memory
/// feeds two m16 tiles, which halves that traffic per FLOP (the O and S accumulators then take 192
/// of 255 registers, so two CTAs share an SM).
/// TESSERA_PREFILL_QTILE=16|16w|64|128|128wg overrides the choice (a tuning aid for benchmarks;
/// 128 is then the mma.sync tile on any device; a value without a configuration for the head dim
/// or the device is an error, not a fallback).
/// fp8 KV (kv not kSame) takes the configurations the table builds for it.
QTile choose_q_tile(PrefillHeadDims head_dim, double avg_packed_rows, KVStorage kv = KVStorage::kSame);

/// The 128-row configuration for head_dim on the current device: k128Wgmma where the table has it
/// and the device runs it (unless TESSERA_PREFILL_WGMMA=0), else k128 where the table has it, else
/// k64 (each for KV stored as `kv`).
QTile q_tile_128(PrefillHeadDims head_dim, KVStorage kv = KVStorage::kSame);

/// The choice for a grid: choose_q_tile, then the wide 16-row tile (k16Wide: 8 warps split a
/// 128-row KV tile) when the batch's 16-row (tile, KV head) pairs, `pairs_at_16_rows`, are fewer
/// than `sm_count`. The one-shot grid then leaves SMs without a CTA and is bounded by each CTA's
/// streaming rate, and a lone 4-warp CTA (one warp per scheduler) spends its time in the per-tile
/// chain (wait, barrier, copy issue, page lookups, MMAs), not waiting for bytes: 8 warps over
/// twice the rows move twice the bytes per trip through the same chain. The runtime splits such
/// batches' KV over all SMs, and there too one 8-warp CTA per SM streamed faster than two 4-warp
/// ones (W1 B=16 and B=1, bench/results/LOG.md; at B=64 it was slower). fp8 K/V takes the wide
/// tile at any grid size (its per-tile chain moves half the bytes). Only where the table has
/// k16Wide (not head_dim 256: three 128-row K/V stages exceed shared memory).
QTile choose_q_tile_for_grid(PrefillHeadDims head_dim, double avg_packed_rows, int64_t pairs_at_16_rows, int sm_count,
                             KVStorage kv = KVStorage::kSame);

/// The plan/run runtime's choice (split KV kAuto): choose_q_tile_for_grid, except that where it
/// picks the 64-row mma.sync tile for a grid the 16-row pairs already fill, the wgmma tile runs it
/// instead (16-bit K/V, where the device runs it): with 2-8 query tokens per request at GQA 4 (8-32
/// packed rows, memory-bound) the warp-specialised tile streamed K/V 2-6% faster than the
/// mma.sync tiles despite its padding rows (W5, bench/results/LOG.md, session 32), while for 4-row
/// decode at the same sizes it was 1-15% slower, so the 16-row tiles keep those.
QTile choose_runtime_q_tile(PrefillHeadDims head_dim, double avg_packed_rows, int64_t pairs_at_16_rows, int sm_count,
                            KVStorage kv = KVStorage::kSame);

/// Launches one configuration for one format (defined in prefill_launch.cuh, instantiated per
/// head dims, dtype and KV storage in the generated <build>/src/config/prefill_d*_*.cu, so builds
/// run them in parallel). T: q's, o's and the MMAs' type; KVT: K/V's (T or fp8); HEAD_DIM: of q
/// and k, HEAD_DIM_VO: of v and o.
template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO = HEAD_DIM>
void launch_prefill_head_dim(const kernels::AttentionParams<T, KVT>& p, const ResolvedVariant& variant,
                             kernels::KVFormatKind format, QTile q_tile, int64_t max_qo_len, cudaStream_t stream);

/// A launch of the runtime's persistent kernel: a grid of (grid_cols, H_kv / work.heads_per_cta)
/// CTAs reading `work`, then, when contraction_blocks > 0, the contraction of split tiles over
/// that many blocks.
struct PersistentLaunch {
  kernels::PlannedWork work;
  int grid_cols;
  int contraction_blocks;
  // With work.mask_tile_lists: where mask_tile_lists_kernel writes them (the same bytes) and the
  // items its grid covers (the plan's, or the workspace's most when the launch is captured).
  uint8_t* mask_tile_lists = nullptr;
  int mask_list_items = 0;
};

/// Launches the persistent kernel (and contraction) of one configuration (prefill_launch.cuh).
/// The variant's kernel is JIT-compiled unless it is the default one.
template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO = HEAD_DIM>
void launch_persistent_head_dim(const kernels::AttentionParams<T, KVT>& p, const ResolvedVariant& variant,
                                kernels::KVFormatKind format, QTile q_tile, const PersistentLaunch& launch,
                                cudaStream_t stream);

/// How many CTAs of that persistent kernel one SM of the current device holds.
template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO = HEAD_DIM>
int persistent_ctas_per_sm(kernels::KVFormatKind format, QTile q_tile);

/// The POD kernel's pair of tiles (kernels/attention/pod.cuh): the prefill requests' and the
/// decode requests' (those whose packed rows fit 16).
struct PodTiles {
  QTile prefill;
  QTile decode;
};

/// The pairs the POD kernel is built for (one place: the launcher instantiates exactly these): the
/// prefill side's 128-row tile as q_tile_128 picks it (k128Wgmma; k128 or k64 with mma.sync) and a
/// 16-row decode tile: k16 (a decode CTA runs as many copies of it as fit, PodTraits), or beside
/// the wgmma tile also the wide k16Wide (one copy: 8 warps over 128-row K/V tiles).
constexpr bool is_pod_pair(QTile prefill, QTile decode) {
  return (prefill == QTile::k128Wgmma && (decode == QTile::k16Wide || decode == QTile::k16)) ||
         ((prefill == QTile::k128 || prefill == QTile::k64) && decode == QTile::k16);
}

/// The pair for head_dim on the current device (16-bit K/V): q_tile_128's prefill tile and k16.
/// TESSERA_POD_DECODE_TILE=16w takes k16Wide beside a wgmma tile instead (a tuning aid for
/// benchmarks, like TESSERA_PREFILL_QTILE; an error where the table has no k16Wide).
PodTiles pod_tiles(PrefillHeadDims head_dim);

/// Launches the POD kernel of one tile pair over paged KV with the default variant (then the
/// contraction of each side's split tiles): a grid of launch.prefill's CTAs (grid_cols x H_kv /
/// heads_per_cta) followed by launch.decode's (grid_cols x H_kv). Defined in pod_launch.cuh,
/// instantiated per head dim and dtype in the generated <build>/src/config/pod_d*_*.cu.
struct PodLaunch {
  PersistentLaunch prefill;
  PersistentLaunch decode;
};
template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO = HEAD_DIM>
void launch_pod_head_dim(const kernels::AttentionParams<T, KVT>& p, const ResolvedVariant& variant, PodTiles tiles,
                         const PodLaunch& launch, cudaStream_t stream);

/// How many CTAs of that POD kernel one SM of the current device holds, and how many copies of
/// the decode tile each decode CTA runs (kernels::PodTraits::kDecodeCopies).
struct PodOccupancy {
  int ctas_per_sm;
  int decode_copies;
};
template <typename T, typename KVT, int HEAD_DIM, int HEAD_DIM_VO = HEAD_DIM>
PodOccupancy pod_occupancy(PodTiles tiles);

}  // namespace detail
}  // namespace tessera
