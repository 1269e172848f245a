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

/// The operand layout wgmma reads with the 128-byte swizzle (wgmma.cuh): ROWS rows of ROW_CHUNKS
/// chunks, cut into column blocks of 8 chunks (64 elements); block b of every row forms one
/// [ROWS][128 B] array, the blocks stored one after another, and within a block chunk c of row r
/// sits at c ^ (r % 8). Rows are 128 B apart, so 8 rows make one 1024-byte swizzle atom.
template <int ROWS, int ROW_CHUNKS>
struct Sw128Tile {
  static_assert(ROW_CHUNKS % 8 == 0 && ROWS % 8 == 0, "whole 8-row, 128-byte atoms");
  static constexpr int kRowStrideChunks = 8;
  static constexpr int kBlockBytes = ROWS * 128;  // one column block: the MN-major operand's block stride
  static TESSERA_DEVICE int chunk_offset(int row, int chunk) {
    return (chunk >> 3) * (ROWS * 8) + row * 8 + ((chunk & 7) ^ (row & 7));
  }
};

/// The layout of a ROWS-row operand tile for mma.sync (ldmatrix reads; SwizzledTile) or for wgmma
/// (Sw128Tile).
template <bool kWgmmaOperand, int ROWS, int ROW_CHUNKS>
struct OperandTile {
  using type = SwizzledTile<ROW_CHUNKS>;
};
template <int ROWS, int ROW_CHUNKS>
struct OperandTile<true, ROWS, ROW_CHUNKS> {
  using type = Sw128Tile<ROWS, ROW_CHUNKS>;
};

}  // namespace kernels
}  // namespace tessera
