// Tile schedulers of the prefill kernel: which work tiles a CTA runs, in which order. One
// interface: a cursor walks the CTA's work (initial_work, then next_work while valid) and work()
// resolves it into a PrefillWork (false: skip it). Two implementations:
// - OneShotScheduler: the grid covers every (query tile, request, KV head); each CTA one tile over
//   its request's whole KV range.
// - PlannedScheduler: the persistent grid of the plan/run runtime; CTA column c runs the planned
//   items cta_indptr[c] .. cta_indptr[c+1]-1 (query tiles, possibly split into KV chunks whose
//   partial states the contraction merges) for each KV head of its group in turn.
#pragma once

#include "kernels/attention/params.cuh"
#include "kernels/attention/planned_work.cuh"
#include "kernels/attention/prefill/kv_loader.cuh"
#include "kernels/attention/prefill/traits.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// One-shot grid: blockIdx = (query tile, request, KV head), or, when requests have one query tile
/// (num_q_tiles == 1: decode, short appends), (KV head, request, 0), and for block-sparse KV
/// (block row, KV head, 0). The host's one_shot_grid (src/prefill_launch.cuh) says why.
template <typename Traits>
struct OneShotScheduler {
  struct Arguments {
    int32_t num_q_tiles;
  };
  /// The CTA's tile, resolved by initial_work up to its KV span, which work() computes where the
  /// tile runs: the span's constant parts (no sink segment, KV from position 0 for most variants)
  /// then stay constants for the compiler, which keeps the loaders' row positions induction
  /// variables (a span carried through the cursor made the producer's loop longer: measured slower,
  /// bench/results/LOG.md).
  struct Cursor {
    RequestExtent e;
    int request;
    int kv_head;
    int packed_begin;
    bool valid;
  };
  static constexpr bool kPersistent = false;
  const Arguments args;

  TESSERA_DEVICE explicit OneShotScheduler(const Arguments& a) : args(a) {}
  /// The kernel's first statement.
  static TESSERA_DEVICE void on_launch() {}

  /// The CTA's tile; not valid past the request's queries.
  template <KVFormatKind kFormat, typename Variant, typename Params>
  TESSERA_DEVICE Cursor initial_work(const Params& p, const VariantParams&) const {
    Cursor c;
    constexpr bool kBlockRows = kFormat == KVFormatKind::kBlockSparse;
    const bool single_tile = args.num_q_tiles == 1;
    const bool rows_fastest = kBlockRows && single_tile;
    // Heaviest causal tiles (the last query rows) are scheduled first. Block-sparse "requests" are
    // block rows: causal, windowed and prefix masks give later rows at least as many blocks, so
    // they too run last row first (in ascending order the heaviest rows formed the last wave).
    const int q_tile = single_tile ? 0 : args.num_q_tiles - 1 - static_cast<int>(blockIdx.x);
    const unsigned request_slot = rows_fastest ? blockIdx.x : blockIdx.y;
    const unsigned requests = rows_fastest ? gridDim.x : gridDim.y;
    c.request = static_cast<int>(kBlockRows ? requests - 1 - request_slot : request_slot);
    c.kv_head = rows_fastest ? blockIdx.y : (single_tile ? blockIdx.x : blockIdx.z);
    c.e = KVFormat<kFormat>::request_extent(p, c.request);
    c.packed_begin = q_tile * Traits::CTA_TILE_Q;
    c.valid = c.packed_begin < c.e.qo_len * p.group_size;
    return c;
  }
  TESSERA_DEVICE Cursor next_work(Cursor c) const {
    c.valid = false;
    return c;
  }
  TESSERA_DEVICE bool valid(const Cursor& c) const { return c.valid; }
  template <KVFormatKind kFormat, typename Variant, typename Params>
  TESSERA_DEVICE bool work(const Params& p, const VariantParams& vp, const Cursor& c, PrefillWork& w) const {
    w.e = c.e;
    w.request = c.request;
    w.kv_head = c.kv_head;
    w.packed_begin = c.packed_begin;
    w.span = tile_kv_span<Traits, kFormat, Variant>(p, vp, c.e, c.packed_begin, 0, c.e.kv_len);
    w.out = TileOutput{nullptr, nullptr};
    return true;
  }
};

/// Persistent grid of the plan/run runtime: CTAs at (column, KV head group). The plan is one
/// head's; a group of heads_per_cta heads lets the grid fill every SM when H_kv does not divide the
/// CTA slots (132 SMs, 8 KV heads: 33 columns of 2 heads instead of 16 of 1). Only warp-specialised
/// tiles take groups: a head loop around the mma.sync tiles, which use every register, made them
/// spill, so they take one head per CTA (the host launches them so) and have no head loop.
template <typename Traits>
struct PlannedScheduler {
  using Arguments = PlannedWork;
  struct Cursor {
    int head;  // within the CTA's group
    int item;
  };
  static constexpr bool kPersistent = true;
  const Arguments args;
  const int column, head_group;  // the CTA's place in the plan's grid
  const int first, last;         // the column's items

  /// The CTA at (column, head_group) of the plan's grid: blockIdx for the persistent kernel, a
  /// share of a larger grid for the POD kernel (kernels/attention/pod.cuh).
  TESSERA_DEVICE PlannedScheduler(const Arguments& a, int cta_column, int cta_head_group)
      : args(a),
        column(cta_column),
        head_group(cta_head_group),
        first(a.cta_indptr[cta_column]),
        last(a.cta_indptr[cta_column + 1]) {}
  TESSERA_DEVICE explicit PlannedScheduler(const Arguments& a)
      : PlannedScheduler(a, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y)) {}

  /// The contraction may launch now: its CTAs read the plan's merge descriptors and request
  /// extents while this grid runs, then wait for it before touching the partial states.
  static TESSERA_DEVICE void on_launch() { allow_dependent_launch(); }
  template <KVFormatKind kFormat, typename Variant, typename Params>
  TESSERA_DEVICE Cursor initial_work(const Params&, const VariantParams&) const {
    return {0, first};
  }
  TESSERA_DEVICE Cursor next_work(Cursor c) const {
    if (++c.item == last && Traits::kWarpSpecialized) {
      c.item = first;
      ++c.head;
    }
    return c;
  }
  TESSERA_DEVICE bool valid(Cursor c) const {
    // The mma.sync tiles hold 128 registers per thread; keeping `last` live across their item
    // loop spilled it, so they reload it per item (an L1 hit).
    return Traits::kWarpSpecialized ? c.head < args.heads_per_cta && c.item < last
                                    : c.item < __ldg(args.cta_indptr + column + 1);
  }

  /// The planned item at the cursor; false for an item the planner never produces (a request out
  /// of range), which the CTA skips.
  template <KVFormatKind kFormat, typename Variant, typename Params>
  TESSERA_DEVICE bool work(const Params& p, const VariantParams& vp, Cursor c, PrefillWork& w) const {
    const PlannedItem item = args.items[c.item];
    if (item.request < 0 || item.request >= p.batch_size) return false;
    w.request = item.request;
    w.kv_head = Traits::kWarpSpecialized ? head_group * args.heads_per_cta + c.head : head_group;
    w.e = KVFormat<kFormat>::request_extent(p, item.request);
    w.packed_begin = item.packed_begin;
    w.out = TileOutput{nullptr, nullptr};
    if (item.partial >= 0) {
      const int64_t slot = static_cast<int64_t>(item.partial) * p.num_kv_heads + w.kv_head;
      w.out.partial_o = args.partial_o + slot * Traits::CTA_TILE_Q * Traits::HEAD_DIM_VO;
      w.out.partial_lse = args.partial_lse + slot * Traits::CTA_TILE_Q;
    }
    w.span = tile_kv_span<Traits, kFormat, Variant>(p, vp, w.e, item.packed_begin, max(item.kv_begin, 0),
                                                   min(item.kv_end, w.e.kv_len));
    if constexpr (kVisitsMaskTileLists<Variant>) {
      if (args.mask_tile_lists != nullptr) {
        w.mask_tile_list = args.mask_tile_lists + static_cast<int64_t>(c.item) * kMaskTileListBytes;
      }
    }
    return true;
  }
};

}  // namespace kernels
}  // namespace tessera
