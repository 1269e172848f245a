// Packed-bit custom masks as the kernels read them: each request's [qo_len, kv_len] mask
// row-major, little bit order, from the request's byte offset (FlashInfer's packed_custom_mask).
// The built-in variant tests a tile's bits through these (variants.cuh), and the runtime's mask
// tile lists (prefill/mask_tile_lists.cuh) say which KV tiles of a work item a mask leaves visible.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// Whether every bit of [first, end) is set. Reads a byte (or its covered part) at a time,
/// stopping at the first byte with a zero bit (a tile test: most ranges are a tree's prefix, whose
/// bytes are all set, and a few bytes long).
TESSERA_DEVICE bool packed_bits_all(const uint8_t* bits, int64_t first, int64_t end) {
  for (int64_t b = first; b < end; b = (b | 7) + 1) {
    const int lo = static_cast<int>(b & 7);
    const int64_t left = end - (b & ~int64_t{7});  // bits from this byte's start to the range's end
    const int hi = left < 8 ? static_cast<int>(left) : 8;
    const uint32_t want = ((1u << hi) - 1u) & ~((1u << lo) - 1u);
    if ((static_cast<uint32_t>(__ldg(bits + (b >> 3))) & want) != want) return false;
  }
  return true;
}

/// Which bits of a packed range are set: some (any) and all (all; true for an empty range).
struct PackedBitsCover {
  bool any;
  bool all;
};

/// The cover of [first, end), reading kBatch bytes per step with their loads issued together
/// (a mask's bytes are mostly not in cache, and one dependent load per byte would cost a memory
/// latency each), stopping once some bit is known set and some clear.
template <int kBatch = 8>
TESSERA_DEVICE PackedBitsCover packed_bits_cover(const uint8_t* bits, int64_t first, int64_t end) {
  PackedBitsCover cover{false, true};
  if (first >= end) return cover;
  const int64_t first_byte = first >> 3, last_byte = (end - 1) >> 3;
  for (int64_t base = first_byte; base <= last_byte && (cover.all || !cover.any); base += kBatch) {
    uint32_t set = 0, clear = 0;  // wanted bits set / clear in this step's bytes
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t byte = base + i;
      if (byte <= last_byte) {
        uint32_t want = 0xFFu;
        if (byte == first_byte) want &= 0xFFu << (first & 7);
        if (byte == last_byte) want &= 0xFFu >> (7 - ((end - 1) & 7));
        const uint32_t got = static_cast<uint32_t>(__ldg(bits + byte)) & want;
        set |= got;
        clear |= got ^ want;
      }
    }
    cover.any = cover.any || set != 0u;
    cover.all = cover.all && clear == 0u;
  }
  return cover;
}

/// Mask tile lists: per planned work item, the groups of its KV tiles in which the custom mask
/// shows some key to one of the item's query rows, in order, and which groups it shows whole to
/// every row, as one record of kMaskTileListBytes: the number of tiles to visit (u32), the visited
/// groups' indices (u8 each, kMaskTileMaxGroups slots), then a bit per group (little bit order)
/// set where every row sees every key of the group. A group is 2^shift consecutive tiles of the
/// item (shift = mask_tile_group_shift(the item's tiles)): one tile up to kMaskTileMaxGroups
/// tiles (32k keys in 128-key tiles), a few for longer items, so a record's size, and the
/// workspace's, does not depend on KV lengths, and the t-th visited tile is one byte load and two
/// shifts away (KVTiles::position in prefill/kv_loader.cuh). The whole-group bits spare the
/// persistent kernel its own test of a tile's mask bytes (a chain of loads in front of the
/// softmax, per tile) where the lists exist.
constexpr int kMaskTileMaxGroups = 256;
constexpr int kMaskTileGroupsOffset = 4;
constexpr int kMaskTileWholeBitsOffset = kMaskTileGroupsOffset + kMaskTileMaxGroups;
constexpr int kMaskTileListBytes = kMaskTileWholeBitsOffset + kMaskTileMaxGroups / 8;
static_assert(kMaskTileWholeBitsOffset % 4 == 0, "the lists' kernel stores the whole-group bits 32 at a time");

/// What a KV tile's record says of the custom mask over it: nothing (no record: the kernel tests
/// the mask's bytes itself), every pair shown, or some pair hidden.
enum class MaskTileCover { kUnknown, kWhole, kPartial };

/// log2 of the tiles per group of an item that spans `tiles` tiles: the least with at most
/// kMaskTileMaxGroups groups.
TESSERA_DEVICE int mask_tile_group_shift(int tiles) {
  int shift = 0;
  while (((tiles - 1) >> shift) >= kMaskTileMaxGroups) ++shift;
  return shift;
}

/// Whether a variant's kernels visit only the listed tiles when the runtime gives mask tile lists:
/// a custom mask without a sliding window (a window clips the tile's span per variant, which the
/// lists' kernel does not reproduce; its span already leaves out most hidden keys).
template <typename Variant>
inline constexpr bool kVisitsMaskTileLists = Variant::kCustomMask && !Variant::kWindow;

}  // namespace kernels
}  // namespace tessera
