// Host checks of the shared-memory layouts behind the in-place fp8 conversion
// (kernels/common/smem_layout.cuh: InPlaceRawTile inside a WgmmaTile). The premise that makes the
// conversion race-free without a producer barrier (a row's conversion overwrites only its own
// stored chunks) is a compile-time check in the kernel; here it is checked against the layout
// that broke it, so the check itself is known to fail where it should.
#include <gtest/gtest.h>

#include "kernels/common/smem_layout.cuh"

namespace {

using tessera::kernels::in_place_conversion_stays_in_its_row;
using tessera::kernels::InPlaceRawTile;
using tessera::kernels::WgmmaTile;

// The first in-place layout: stored rows as plain rows in the tile's upper half.
template <int ROWS, int ROW_CHUNKS>
struct PlainRowsInUpperHalf {
  static constexpr int row_at(int offset) {
    return offset < ROWS * ROW_CHUNKS ? -1 : (offset - ROWS * ROW_CHUNKS) / ROW_CHUNKS;
  }
};

// Head dim 256 (64-key tiles, 32 chunks of bf16 a row, 16 stored) and 128 (128 keys, 16 and 8).
static_assert(in_place_conversion_stays_in_its_row<WgmmaTile<64, 32>, InPlaceRawTile<64, 16>, 64, 16>(),
              "head dim 256: the in-place layout keeps each conversion in its row");
static_assert(in_place_conversion_stays_in_its_row<WgmmaTile<128, 16>, InPlaceRawTile<128, 8>, 128, 8>(),
              "head dim 128: likewise");
static_assert(!in_place_conversion_stays_in_its_row<WgmmaTile<64, 32>, PlainRowsInUpperHalf<64, 16>, 64, 16>(),
              "plain rows at head dim 256 overwrite other rows' stored chunks (the wrong outputs measured)");

TEST(InPlaceRawTile, StoredChunksSitInTheirRowsUpperColumnBlocks) {
  using Raw = InPlaceRawTile<64, 16>;  // head dim 256: the 16-bit tile has 4 column blocks of 64 x 8 chunks
  EXPECT_EQ(Raw::chunk_offset(0, 0), 2 * 64 * 8);               // block 2, row 0
  EXPECT_EQ(Raw::chunk_offset(5, 9), 3 * 64 * 8 + 5 * 8 + 1);   // block 3, row 5, chunk 1
  EXPECT_EQ(Raw::chunk_offset(63, 15), 4 * 64 * 8 - 1);         // the tile's last chunk
  EXPECT_EQ(Raw::row_at(2 * 64 * 8 - 1), -1);                   // the lower half holds no stored chunk
  EXPECT_EQ(Raw::row_at(Raw::chunk_offset(41, 12)), 41);
}

TEST(InPlaceRawTile, ConversionTargetsOfARowStayInThatRow) {
  using Tile = WgmmaTile<64, 32>;
  using Raw = InPlaceRawTile<64, 16>;
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 16; ++c) {
      for (int h = 0; h < 2; ++h) {
        const int stored_row = Raw::row_at(Tile::chunk_offset(r, 2 * c + h));
        EXPECT_TRUE(stored_row == -1 || stored_row == r) << "row " << r << " stored chunk " << c;
      }
    }
  }
}

}  // namespace
