// Swizzled shared-memory tiles. A tile row of HEAD_DIM 16-bit elements is ROW_CHUNKS 16-byte
// chunks; chunk c of row r is stored at chunk c ^ (r % 8). ldmatrix reads one 16-byte chunk from
// each of 8 consecutive rows: unswizzled, rows 256 B apart would all hit the same 4 banks; with
// the XOR they cover all 32 banks, and so do the 8-row column writes of cp.async.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

template <int ROW_CHUNKS>
struct SwizzledTile {
  static_assert(ROW_CHUNKS >= 8 && ROW_CHUNKS % 8 == 0, "the XOR pattern spans 8 chunks");
  static constexpr int kRowStrideChunks = ROW_CHUNKS;  // chunks from a row to the next
  /// Offset, in 16-byte chunks from the tile's start, of logical (row, chunk).
  static TESSERA_DEVICE int chunk_offset(int row, int chunk) { return row * ROW_CHUNKS + (chunk ^ (row & 7)); }
};

/// Stored fp8 K/V rows (ROW_CHUNKS 16-byte chunks, no padding). The decode tiles' ldmatrix reads
/// take 8 rows at one chunk column, which must cover all 32 banks (kSwizzled): chunk c of row r
/// is stored at c ^ s(r), s(r) the index of the row's 128-byte line among 8 (rows of >= 8
/// chunks: r % 8; 4-chunk rows, two to a line: (r / 2) % 4, which with the row's half of the line
/// makes the 8 rows' chunks distinct). The XOR touches only the chunk bits, so an address XORs a
/// further (even) chunk step in, as SwizzledTile's readers do. Tiles read a row's consecutive
/// chunks by consecutive threads (the T-tile conversions) are conflict free unswizzled.
template <int ROW_CHUNKS, bool kSwizzled>
struct SwizzledRawTile {
  static_assert(ROW_CHUNKS == 4 || ROW_CHUNKS % 8 == 0, "rows of 64 bytes or whole 128-byte lines");
  static constexpr int kRowsPerLine = ROW_CHUNKS >= 8 ? 1 : 8 / ROW_CHUNKS;
  static constexpr int kRowStrideBytes = ROW_CHUNKS * 16;  // from a row to the next
  static constexpr int kSwizzleMask = kSwizzled ? (ROW_CHUNKS >= 8 ? 8 : ROW_CHUNKS) - 1 : 0;
  static TESSERA_DEVICE int swizzle(int row) { return (row / kRowsPerLine) & kSwizzleMask; }
  /// Offset, in 16-byte chunks from the tile's start, of logical (row, chunk).
  static TESSERA_DEVICE int chunk_offset(int row, int chunk) { return row * ROW_CHUNKS + (chunk ^ swizzle(row)); }
};

/// Stored fp8 K/V rows of ROW_CHUNKS 16-byte chunks placed inside the upper half of the 16-bit
/// WgmmaTile<ROWS, 2 * ROW_CHUNKS> (128-byte column blocks, 2 * ROW_CHUNKS / 8 of them) that they
/// convert into, so that the conversion can run in place: chunk c of stored row r sits in column
/// block kFirstBlock + c / 8 of the tile, in row r, at chunk c % 8 (unswizzled). A stored chunk c
/// becomes the tile's chunks 2c and 2c + 1 of the same row, in block c / 4, so every 16-bit chunk
/// written over stored bytes lands on stored bytes of its own row: only the row's own threads
/// (RawChunkShare: one warp) read them. Offsets count from the tile's start.
template <int ROWS, int ROW_CHUNKS>
struct InPlaceRawTile {
  static_assert(ROW_CHUNKS % 8 == 0, "whole 128-byte blocks of stored chunks (an even number of the tile's)");
  static constexpr int kFirstBlock = ROW_CHUNKS / 8;  // the 16-bit tile has 2 * ROW_CHUNKS / 8 blocks
  static constexpr int kRowStrideBytes = 128;         // from a row to the next, within a block
  static constexpr int kRowsPerLine = 1;
  static TESSERA_HOST_DEVICE constexpr int chunk_offset(int row, int chunk) {
    return (kFirstBlock + chunk / 8) * (ROWS * 8) + row * 8 + chunk % 8;
  }
  /// The stored row whose chunk sits at chunk offset `offset` of the tile (-1: none, the lower half).
  static TESSERA_HOST_DEVICE constexpr int row_at(int offset) {
    return offset < kFirstBlock * ROWS * 8 || offset >= 2 * kFirstBlock * ROWS * 8 ? -1 : offset % (ROWS * 8) / 8;
  }
};

/// Whether converting every stored chunk c of row r (InPlaceRawTile RawTile) into chunks 2c and
/// 2c + 1 of row r of Tile overwrites only stored chunks of row r: the premise of the in-place
/// conversion, checked at compile time for each configuration that takes it.
template <typename Tile, typename RawTile, int ROWS, int RAW_ROW_CHUNKS>
constexpr bool in_place_conversion_stays_in_its_row() {
  for (int r = 0; r < ROWS; ++r) {
    for (int c = 0; c < 2 * RAW_ROW_CHUNKS; ++c) {
      const int stored_row = RawTile::row_at(Tile::chunk_offset(r, c));
      if (stored_row >= 0 && stored_row != r) return false;
    }
  }
  return true;
}

/// The operand layout wgmma reads with a swizzle of ATOM_CHUNKS 16-byte chunks: 128 bytes (8
/// chunks), 64 (4) or 32 (2) (wgmma.cuh). ROWS rows of ROW_CHUNKS chunks are cut into column
/// blocks of ATOM_CHUNKS chunks; block b of every row forms one [ROWS][ATOM_CHUNKS * 16 B] array,
/// the blocks stored one after another. Within a block, chunk c of row r sits at c ^ s(r), where
/// s(r) is the row's byte offset shifted right by 7 (mod ATOM_CHUNKS): the hardware XORs address
/// bits 7.. into bits 4.. . So 8 rows make one atom (1024, 512 or 256 bytes), the swizzle's period.
/// The widest swizzle whose chunk count divides the row is taken (WgmmaTile): 128 bytes for head
/// dims 64, 128 and 256; 64 bytes for 96, whose 192-byte rows are three 64-byte blocks, so no
/// padding is stored or read.
template <int ROWS, int ROW_CHUNKS, int ATOM_CHUNKS>
struct SwizzledOperandTile {
  static_assert(ATOM_CHUNKS == 8 || ATOM_CHUNKS == 4 || ATOM_CHUNKS == 2, "the 128-, 64- or 32-byte swizzle");
  static_assert(ROW_CHUNKS % ATOM_CHUNKS == 0 && ROWS % 8 == 0, "whole column blocks and 8-row atoms");
  static constexpr int kRows = ROWS;
  static constexpr int kAtomChunks = ATOM_CHUNKS;
  static constexpr int kRowStrideChunks = ATOM_CHUNKS;         // from a row to the next, within a block
  static constexpr int kRowBytes = ATOM_CHUNKS * 16;           // a row's share of one column block
  static constexpr int kAtomBytes = 8 * kRowBytes;             // 8 rows: the swizzle's period
  static constexpr int kBlockBytes = ROWS * kRowBytes;         // one column block
  static constexpr int kStepsPerBlock = ATOM_CHUNKS / 2;       // k16 steps (32 bytes) across a block's rows
  static TESSERA_HOST_DEVICE constexpr int chunk_offset(int row, int chunk) {
    const int swizzle = ((row * ATOM_CHUNKS) >> 3) & (ATOM_CHUNKS - 1);
    return (chunk / ATOM_CHUNKS) * (ROWS * ATOM_CHUNKS) + row * ATOM_CHUNKS + ((chunk % ATOM_CHUNKS) ^ swizzle);
  }
};

/// The swizzle width (chunks) of a row of ROW_CHUNKS chunks: the widest that divides it.
constexpr int wgmma_atom_chunks(int row_chunks) {
  return row_chunks % 8 == 0 ? 8 : row_chunks % 4 == 0 ? 4 : 2;
}
template <int ROWS, int ROW_CHUNKS>
using WgmmaTile = SwizzledOperandTile<ROWS, ROW_CHUNKS, wgmma_atom_chunks(ROW_CHUNKS)>;

/// The layout of a ROWS-row operand tile for mma.sync (ldmatrix reads; SwizzledTile) or for wgmma
/// (WgmmaTile).
template <bool kWgmmaOperand, int ROWS, int ROW_CHUNKS>
struct OperandTile {
  using type = SwizzledTile<ROW_CHUNKS>;
};
template <int ROWS, int ROW_CHUNKS>
struct OperandTile<true, ROWS, ROW_CHUNKS> {
  using type = WgmmaTile<ROWS, ROW_CHUNKS>;
};

}  // namespace kernels
}  // namespace tessera
