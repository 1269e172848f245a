// The argument block of the block-mask builder (block_mask.cuh): plain data, so the host
// (src/variant/block_mask.cpp) fills the same layout the JIT-compiled kernels read.
#pragma once

#include "kernels/attention/variant_params.cuh"
#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// Launch shapes of the three builder kernels (the host reads them for its launches and name
/// expressions).
struct BlockMaskTraits {
  static constexpr int kClassifyThreads = 256;
  // One CTA scans every block row's count: the widest block keeps its chunk loop short.
  static constexpr int kScanThreads = 1024;
  static constexpr int kCompactThreads = 256;
  // Mask evaluations per lane between two warp votes on "already partial": a vote costs about as
  // much as a cheap mask, so voting every pair would double the work of full and empty blocks.
  static constexpr int kPairsPerVote = 4;
  static_assert(kClassifyThreads % kWarpSize == 0 && kScanThreads % kWarpSize == 0 &&
                    kCompactThreads % kWarpSize == 0,
                "whole warps");
  static_assert(kScanThreads / kWarpSize <= kWarpSize, "one warp scans the per-warp sums");
};

/// What a block of the (q_len x kv_len) pair grid holds.
enum class BlockClass : uint8_t {
  kEmpty = 0,    // no visible pair: not listed
  kPartial = 1,  // listed, flag 0: the attention kernels evaluate the mask inside it
  kFull = 2,     // listed, flag 1: every pair of every existing row is visible
};

struct BlockMaskArgs {
  int32_t q_len;           // M, query rows
  int32_t kv_len;          // N, KV columns
  int32_t q_pos_offset;    // kv_len - q_len: query row r is passed to the mask as q_idx = q_pos_offset + r
  int32_t block_rows;      // Br
  int32_t block_cols;      // Bc
  int32_t num_row_blocks;  // ceil(q_len / Br)
  int32_t num_col_blocks;  // ceil(kv_len / Bc); num_row_blocks * num_col_blocks < 2^31
  int32_t batch;           // b passed to the mask
  int32_t head;            // h passed to the mask
  // Lanes of a warp that classify one block together: a power of two in [1, 32], at least
  // Br * Bc when that is below 32, so small blocks do not leave most of a warp idle.
  int32_t lanes_per_block;
  uint8_t* block_class;    // [num_row_blocks][num_col_blocks] scratch: BlockClass per block
  int32_t* row_counts;     // [num_row_blocks] scratch: listed blocks per block row (zeroed by the host)
  int32_t* indptr;         // [num_row_blocks + 1] output
  int32_t* indices;        // [>= indptr[num_row_blocks]] output: column blocks, increasing per block row
  uint8_t* block_flags;    // [>= indptr[num_row_blocks]] output: 1 = full, 0 = partial
  uint64_t mask_params[kMaxVariantParamSlots];  // the mask's Params: one 8-byte slot per parameter
};

}  // namespace kernels
}  // namespace tessera
