// The runtime's mask tile lists (docs/design.md §6.5): before a persistent launch whose variant
// has a custom mask, this kernel lists, for every planned work item, the KV tiles in which the
// mask shows some key to some of the item's query rows, and those it shows whole to every row.
// The persistent kernel's tile iteration (KVTiles) then visits only the listed tiles (a tile the
// mask hides from every row is neither loaded nor multiplied) and masks only those not whole.
// The lists are computed at each run() from the mask's current bytes, so a captured
// run replays correctly for any later plan and mask.
#pragma once

#include "kernels/attention/custom_mask.cuh"
#include "kernels/attention/params.cuh"
#include "kernels/attention/planned_work.cuh"
#include "kernels/attention/prefill/kv_loader.cuh"
#include "kernels/attention/variant_params.cuh"
#include "kernels/attention/variants.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// One warp per work item; lane l tests group 32 w + l of the item's tiles in pass w.
struct MaskTileListsTraits {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
};

/// Lists of the plan's items (a grid-stride loop over the items: a captured launch's grid is sized
/// for the workspace's most items and reads the current plan's count). The item's tiles are the
/// persistent kernel's: `tile_rows` packed query rows, `tile_kv` keys, over the span the default
/// variant gives (the same as any variant that visits lists: kVisitsMaskTileLists). Writes the
/// count of every item, so the lists never need clearing. `max_items` bounds the items array
/// (the plan's count or the workspace's capacity), so an item is read beside the plan's count,
/// not after it: the kernel is a chain of dependent loads (item, request extent, mask bytes)
/// that a run waits for.
template <KVFormatKind kFormat, typename Params>
__global__ void __launch_bounds__(MaskTileListsTraits::kThreads)
mask_tile_lists_kernel(const Params p, const VariantParams vp, const PlannedWork work, int grid_cols, int max_items,
                       int tile_rows, int tile_kv, uint8_t* lists) {
  static_assert(kFormat != KVFormatKind::kBlockSparse, "custom masks take ragged or paged KV");
  // The persistent kernel (a programmatic dependent) starts now; it waits for this grid before it
  // reads a list.
  allow_dependent_launch();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warps = static_cast<int>(gridDim.x) * MaskTileListsTraits::kWarps;
  for (int item_index = static_cast<int>(blockIdx.x * MaskTileListsTraits::kWarps + threadIdx.x / 32);
       item_index < max_items; item_index += warps) {
    const PlannedItem item = work.items[item_index];
    if (item_index >= __ldg(work.cta_indptr + grid_cols)) break;  // past the plan's items
    uint8_t* const list = lists + static_cast<int64_t>(item_index) * kMaskTileListBytes;
    int tiles = 0, visited = 0;
    bool last_visited = false;
    if (item.request >= 0 && item.request < p.batch_size) {  // the persistent kernel skips others
      const RequestExtent e = KVFormat<kFormat>::request_extent(p, item.request);
      const KVSpan span = query_tile_kv_span<kFormat, DefaultVariant>(
          p, vp, e, item.packed_begin, tile_rows, max(item.kv_begin, 0), min(item.kv_end, e.kv_len));
      tiles = span.end > span.begin ? (span.end - span.begin + tile_kv - 1) / tile_kv : 0;
      const int shift = mask_tile_group_shift(tiles);
      const int groups = tiles > 0 ? ((tiles - 1) >> shift) + 1 : 0;
      // The item's query rows: packed rows past the request's queries are padding.
      const int row_first = item.packed_begin / p.group_size;
      const int row_last = min(e.qo_len - 1, (item.packed_begin + tile_rows - 1) / p.group_size);
      const uint8_t* bits = vp.custom_mask + vp.custom_mask_indptr[item.request];
      for (int pass = 0; pass * 32 < groups; ++pass) {
        const int g = pass * 32 + lane;
        bool shown = false, whole = false;
        if (g < groups) {
          const int kv_lo = span.begin + (g << shift) * tile_kv;
          const int kv_hi = min(span.end, kv_lo + (tile_kv << shift));
          whole = true;
          for (int row = row_first; row <= row_last && (whole || !shown); ++row) {
            const int64_t row_bit = static_cast<int64_t>(row) * e.kv_len;
            const PackedBitsCover cover = packed_bits_cover(bits, row_bit + kv_lo, row_bit + kv_hi);
            shown = shown || cover.any;
            whole = whole && cover.all;
          }
        }
        const uint32_t ballot = __ballot_sync(0xffffffffu, shown);
        const uint32_t whole_ballot = __ballot_sync(0xffffffffu, whole);
        if (shown) list[kMaskTileGroupsOffset + visited + __popc(ballot & ((1u << lane) - 1u))] = static_cast<uint8_t>(g);
        if (lane == 0) reinterpret_cast<uint32_t*>(list + kMaskTileWholeBitsOffset)[pass] = whole_ballot;
        visited += __popc(ballot);
        if (pass == (groups - 1) / 32) last_visited = (ballot >> ((groups - 1) % 32)) & 1u;
      }
      // Tiles to visit: the visited groups', the last group's short by what the item lacks.
      visited = visited << shift;
      if (last_visited) visited -= (groups << shift) - tiles;
    }
    if (lane == 0) *reinterpret_cast<uint32_t*>(list) = static_cast<uint32_t>(visited);
  }
}

}  // namespace kernels
}  // namespace tessera
