// The FA2-class kernel's tile configurations and the heuristic that picks one. One place for
// these facts: every instantiation and every launch goes through PrefillConfig.
#pragma once

#include "kernels/attention/prefill.cuh"
#include "src/variant/variant_config.h"

namespace tessera {
namespace detail {

/// Query rows per CTA. The rows are packed (query, head-in-group) pairs, so a decode step with
/// GQA group 4 fills 4 rows of a tile.
/// k128Wgmma is the 128-row tile computed with wgmma (sm_90a, head_dim 128).
enum class QTile { k16, k16Wide, k64, k128, k128Wgmma };

/// Heuristic (docs/design.md §5): the average packed rows per request, avg_qo_len * group_size, sets
/// the query tile — up to 16 rows: a 16-row tile with 4 warps splitting each KV tile (decode and
/// short appends are memory bound: wide KV tiles keep bytes in flight); up to 64 rows, or head_dim
/// 256 (whose 128-row tile would need 256 accumulator registers per thread): 64 rows, one m16 tile
/// per warp; longer: 128 rows. For head_dim 128 the 128-row tile is 4 warps x 32 rows: each K/V
/// fragment loaded from shared memory feeds two m16 tiles, which halves that traffic per FLOP
/// (the O and S accumulators then take 192 of 255 registers, so two CTAs share an SM). KV tiles
/// (32, 64 or 128 rows) are as wide as the register budget allows without spills and keep the K/V
/// double buffer at 64 KB or less; the 16-row tile of head_dim 256 uses 136 KB (one CTA per SM).
/// On an sm_90 device (current_device_has_wgmma) with head_dim 128, 128 rows means the wgmma
/// configuration: two warpgroups of 64 rows, 128-row KV tiles (k128Wgmma).
/// TESSERA_PREFILL_QTILE=16|16w|64|128|128wg overrides the choice (a tuning aid for benchmarks;
/// 128 is then the mma.sync tile on any device; a value without a configuration for the head dim
/// or the device is an error, not a fallback).
QTile choose_q_tile(int head_dim, double avg_packed_rows);

/// The 128-row configuration for head_dim on the current device: k128Wgmma where it runs (unless
/// TESSERA_PREFILL_WGMMA=0), else k128.
QTile q_tile_128(int head_dim);

/// The choice for a grid: choose_q_tile, then the wide 16-row tile (k16Wide: 8 warps split a
/// 128-row KV tile) when the batch's 16-row (tile, KV head) pairs, `pairs_at_16_rows`, are fewer
/// than `sm_count`. The one-shot grid then leaves SMs without a CTA and is bounded by each CTA's
/// streaming rate, and a lone 4-warp CTA (one warp per scheduler) spends its time in the per-tile
/// chain (wait, barrier, copy issue, page lookups, MMAs), not waiting for bytes: 8 warps over
/// twice the rows move twice the bytes per trip through the same chain. The runtime splits such
/// batches' KV over all SMs, and there too one 8-warp CTA per SM streamed faster than two 4-warp
/// ones (W1 B=16 and B=1, bench/results/LOG.md; at B=64 it was slower). Not for head_dim 256 (three
/// 128-row K/V stages exceed shared memory).
QTile choose_q_tile_for_grid(int head_dim, double avg_packed_rows, int64_t pairs_at_16_rows, int sm_count);

template <typename T, int HEAD_DIM, QTile Q>
struct PrefillConfig;

// Traits: <T, HEAD_DIM, CTA_TILE_Q, CTA_TILE_KV, NUM_WARPS_Q, NUM_WARPS_KV, STAGES, MIN_CTAS_PER_SM>
// Tuning aids for benchmarks (set through CMAKE_CUDA_FLAGS; the defaults are the measured best,
// bench/results/LOG.md): the 128-row tile's KV width, warps and stages.
#ifndef TESSERA_Q128_KV
#define TESSERA_Q128_KV 64
#endif
#ifndef TESSERA_Q128_WARPS
#define TESSERA_Q128_WARPS 0  // 0: by head dim, see PrefillConfig<k128>
#endif
#ifndef TESSERA_Q128_STAGES
#define TESSERA_Q128_STAGES 2
#endif
template <typename T, int HEAD_DIM>
struct PrefillConfig<T, HEAD_DIM, QTile::k16> {
  using Traits = kernels::PrefillTraits<T, HEAD_DIM, 16, (HEAD_DIM == 64 ? 128 : 64), 1, 4, (HEAD_DIM == 256 ? 2 : 3)>;
};
template <typename T, int HEAD_DIM>
struct PrefillConfig<T, HEAD_DIM, QTile::k16Wide> {
  static_assert(HEAD_DIM != 256, "head_dim 256 has no wide 16-row tile");
  using Traits = kernels::PrefillTraits<T, HEAD_DIM, 16, 128, 1, 8, 3>;
};
template <typename T, int HEAD_DIM>
struct PrefillConfig<T, HEAD_DIM, QTile::k64> {
  using Traits = kernels::PrefillTraits<T, HEAD_DIM, 64, (HEAD_DIM == 256 ? 32 : 64), 4, 1>;
};
template <typename T, int HEAD_DIM>
struct PrefillConfig<T, HEAD_DIM, QTile::k128> {
  static_assert(HEAD_DIM != 256, "head_dim 256 uses 64-row query tiles");
  // head_dim 128: 4 warps x 32 rows (two m16 tiles per warp share every K/V fragment; 255
  // registers, two CTAs per SM); head_dim 64: 8 warps x 16 rows (measured equal or better there).
  static constexpr int kWarps = TESSERA_Q128_WARPS != 0 ? TESSERA_Q128_WARPS : HEAD_DIM == 128 ? 4 : 8;
  using Traits = kernels::PrefillTraits<T, HEAD_DIM, 128, TESSERA_Q128_KV, kWarps, 1, TESSERA_Q128_STAGES, 2>;
};
template <typename T, int HEAD_DIM>
struct PrefillConfig<T, HEAD_DIM, QTile::k128Wgmma> {
  static_assert(HEAD_DIM == 128, "the wgmma tile is for head_dim 128");
  // Two warpgroups of 64 rows (8 warps x 16 rows, as wgmma's accumulators fall), KV128 (the N of
  // m64n128k16), two stages: 32 KB of Q and 128 KB of K/V, one CTA per SM.
  using Traits = kernels::PrefillTraits<T, HEAD_DIM, 128, 128, 8, 1, 2, 1, kernels::MmaKind::kWgmma>;
};

/// Launches one configuration for one format (defined in prefill_launch.cuh, instantiated per
/// head dim in prefill_d*.cu so the 2-core CI builds them in parallel).
template <typename T, int HEAD_DIM>
void launch_prefill_head_dim(const kernels::AttentionParams<T>& p, const ResolvedVariant& variant,
                             kernels::KVFormatKind format, QTile q_tile, int64_t max_qo_len, cudaStream_t stream);

/// A launch of the runtime's persistent kernel: a grid of (grid_cols, H_kv / work.heads_per_cta)
/// CTAs reading `work`, then, when contraction_blocks > 0, the contraction of split tiles over
/// that many blocks.
struct PersistentLaunch {
  kernels::PlannedWork work;
  int grid_cols;
  int contraction_blocks;
};

/// Launches the persistent kernel (and contraction) of one configuration (prefill_launch.cuh).
/// The variant's kernel is JIT-compiled unless it is the default one.
template <typename T, int HEAD_DIM>
void launch_persistent_head_dim(const kernels::AttentionParams<T>& p, const ResolvedVariant& variant,
                                kernels::KVFormatKind format, QTile q_tile, const PersistentLaunch& launch,
                                cudaStream_t stream);

/// How many CTAs of that persistent kernel one SM of the current device holds.
template <typename T, int HEAD_DIM>
int persistent_ctas_per_sm(kernels::KVFormatKind format, QTile q_tile);

}  // namespace detail
}  // namespace tessera
