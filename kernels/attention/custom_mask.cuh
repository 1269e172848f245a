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

/// A custom mask's bits of one query row over a warp's kCols columns of a KV tile, as the lanes
/// of a quad hold the row's logits in MMA accumulators (lane t: columns 8 n + 2 t and 8 n + 2 t + 1
/// of each 8-column block n). Each lane of the quad reads 32 consecutive bits of the row (five byte
/// loads issued together; a row's bits need not be byte-aligned), and the quad trades them by
/// shuffles: a row's mask costs a few loads per lane instead of a dependent load per logit.
template <int kCols>
struct QuadMaskRow {
  static constexpr int kChunks = (kCols + 31) / 32;  // 32-bit chunks of the row's columns
  static constexpr int kRounds = (kChunks + 3) / 4;  // chunks each quad lane loads
  static_assert(kCols % 8 == 0, "whole 8-column blocks");
  uint32_t chunk[kChunks];  // chunk j >> 2 t: bit 8 k + b is column 32 j + 8 k + 2 t + b

  /// The bits [first, first + kCols) of `bits` (first: the warp's first column of the row),
  /// reading no byte past the row's last bit, row_end (bits past it are the next row's and the
  /// caller masks their keys). `lane`: the lane in the warp; every lane takes part (shuffles).
  QuadMaskRow() = default;
  TESSERA_DEVICE QuadMaskRow(const uint8_t* bits, int64_t first, int64_t row_end, int lane) {
    const int quad_lane = lane % 4;
    const int64_t last_byte = (row_end - 1) >> 3;
    uint32_t mine[kRounds];
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int j = 4 * r + quad_lane;
      const int64_t b = first + 32 * static_cast<int64_t>(j);
      uint64_t window = 0;  // bytes b >> 3 .. + 4, little-endian
#pragma unroll
      for (int k = 0; k < 5; ++k) {
        const int64_t byte = (b >> 3) + k;
        if (j < kChunks && byte <= last_byte) window |= static_cast<uint64_t>(__ldg(bits + byte)) << (8 * k);
      }
      mine[r] = static_cast<uint32_t>(window >> (b & 7));
    }
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
      chunk[j] = __shfl_sync(0xffffffffu, mine[j / 4], (lane & ~3) + j % 4) >> (2 * quad_lane);
  }
  /// Whether the mask shows column 8 n + 2 t + odd of the row (the lane's logit of block n).
  TESSERA_DEVICE bool shows(int n, int odd) const { return (chunk[n / 4] >> (8 * (n % 4) + odd)) & 1u; }
};

/// A row without a custom mask (QuadMaskRow's interface).
struct ShowAllMaskRow {
  TESSERA_DEVICE bool shows(int /*n*/, int /*odd*/) const { return true; }
};

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
