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
  /// Offset, in 16-byte chunks from the tile's start, of logical (row, chunk).
  static TESSERA_DEVICE int chunk_offset(int row, int chunk) { return row * ROW_CHUNKS + (chunk ^ (row & 7)); }
};

}  // namespace kernels
}  // namespace tessera
