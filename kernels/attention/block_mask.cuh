// Block mask builder (FlexAttention's create_block_mask): evaluates a mask on every (query row,
// key) pair of a q_len x kv_len grid cut into (Br, Bc) blocks and writes the BSR of the blocks
// that hold a visible pair, with a full/partial flag per listed block (docs/design.md §1.1, §4
// BlockSparse). Three kernels, queued in this order on one stream after the host zeroes
// row_counts:
//
//   block_mask_classify_kernel  every block -> BlockClass, and listed blocks counted per block row
//   block_mask_indptr_kernel    one CTA: exclusive scan of the counts -> indptr
//   block_mask_compact_kernel   one CTA per block row: listed column blocks, increasing, -> indices
//                               and flags at indptr[row block]
//
// The result depends only on the mask (integer counts and an ordered compaction): it is the same
// bit for bit on every run and every GPU.
//
// Which pairs a block holds, and when it is "full". The attention kernels skip all mask
// evaluation (causal, variant masks, and the check that a key column exists) in KV tiles whose
// blocks are all flagged full, so the flag must be safe under exactly that rule:
// - Rows past q_len do not exist (the last block row is short): they are not evaluated and do
//   not keep a block from being full. The kernels never store those rows.
// - Columns past kv_len inside the last column block DO count, as hidden pairs: the kernels
//   zero-fill them and rely on the mask to hide them, so a block with such padding is at most
//   partial. (FlexAttention's create_block_mask ignores padding both ways; here the column side is
//   stricter so the flags stay correct for Tessera's kernels.)
// So: empty = no existing pair visible; full = every existing row sees all Bc columns of the
// block; partial otherwise.
//
// The mask is a template argument, MaskFn, with
//   static __device__ bool visible(const uint64_t* param_slots, int b, int h, int q_idx, int kv_idx);
// where param_slots are BlockMaskArgs::mask_params (src/variant/block_mask.cpp generates one that
// calls the user's mask_mod with its Params struct).
#pragma once

#include "kernels/attention/block_mask_params.cuh"
#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

namespace block_mask_detail {

constexpr unsigned kFullWarp = 0xffffffffu;

/// Inclusive prefix sum over the lanes of a warp.
TESSERA_DEVICE int32_t warp_inclusive_sum(int32_t x, int lane) {
#pragma unroll
  for (int d = 1; d < kWarpSize; d *= 2) {
    const int32_t y = __shfl_up_sync(kFullWarp, x, d);
    if (lane >= d) x += y;
  }
  return x;
}

}  // namespace block_mask_detail

/// Pass 1. A group of lanes_per_block lanes classifies one block: each lane walks the block's
/// pairs row-major, lanes_per_block pairs apart (consecutive lanes take consecutive columns, so
/// a mask that reads a per-key table reads it coalesced). Every kPairsPerVote steps the warp
/// votes and stops once each of its groups has seen both a visible and a hidden pair (partial:
/// nothing more to learn); empty and full blocks need every pair. Grid-stride over blocks, with
/// warp-uniform trip counts so the votes see the whole warp.
template <typename MaskFn, int kThreads>
__global__ void __launch_bounds__(kThreads) block_mask_classify_kernel(const BlockMaskArgs a) {
  using block_mask_detail::kFullWarp;
  constexpr int kWarpsPerCta = kThreads / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int group_lanes = a.lanes_per_block;
  const int blocks_per_warp = kWarpSize / group_lanes;
  const int group = lane / group_lanes, lane_in_group = lane % group_lanes;
  const unsigned group_bits = (group_lanes == kWarpSize ? kFullWarp : (1u << group_lanes) - 1u)
                              << (group * group_lanes);
  const int64_t total_blocks = static_cast<int64_t>(a.num_row_blocks) * a.num_col_blocks;
  const int64_t block_pairs = static_cast<int64_t>(a.block_rows) * a.block_cols;
  const int64_t steps = (block_pairs + group_lanes - 1) / group_lanes;  // the same for every block
  // One step moves a lane group_lanes pairs on: row_step rows and col_step columns, with a carry.
  const int row_step = group_lanes / a.block_cols, col_step = group_lanes % a.block_cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerCta * blocks_per_warp;

  for (int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / kWarpSize) * blocks_per_warp;
       first < total_blocks; first += stride) {
    const int64_t block = first + group;
    const bool active = block < total_blocks;
    const int row_block = active ? static_cast<int>(block / a.num_col_blocks) : 0;
    const int col_block = active ? static_cast<int>(block % a.num_col_blocks) : 0;
    const int row0 = row_block * a.block_rows, col0 = col_block * a.block_cols;
    const int rows = active ? min(a.block_rows, a.q_len - row0) : 0;  // existing rows of the block
    const int cols = min(a.block_cols, a.kv_len - col0);              // existing columns
    bool seen_visible = false;
    bool seen_hidden = cols < a.block_cols;  // padding columns are hidden pairs (see the top)
    bool group_done = !active;
    int64_t r = lane_in_group / a.block_cols;
    int c = lane_in_group % a.block_cols;
    int since_vote = 0;
    for (int64_t step = 0; step < steps; ++step) {
      if (!group_done && r < rows && c < cols) {
        const bool visible =
            MaskFn::visible(a.mask_params, a.batch, a.head, a.q_pos_offset + row0 + static_cast<int>(r), col0 + c);
        seen_visible = seen_visible || visible;
        seen_hidden = seen_hidden || !visible;
      }
      r += row_step;
      c += col_step;
      if (c >= a.block_cols) {
        c -= a.block_cols;
        ++r;
      }
      if (++since_vote == BlockMaskTraits::kPairsPerVote) {
        since_vote = 0;
        const unsigned visible_lanes = __ballot_sync(kFullWarp, seen_visible) & group_bits;
        const unsigned hidden_lanes = __ballot_sync(kFullWarp, seen_hidden) & group_bits;
        group_done = group_done || (visible_lanes != 0 && hidden_lanes != 0);
        if (__all_sync(kFullWarp, group_done)) break;
      }
    }
    const unsigned visible_lanes = __ballot_sync(kFullWarp, seen_visible) & group_bits;
    const unsigned hidden_lanes = __ballot_sync(kFullWarp, seen_hidden) & group_bits;
    if (active && lane_in_group == 0) {
      const BlockClass cls = visible_lanes == 0   ? BlockClass::kEmpty
                             : hidden_lanes == 0 ? BlockClass::kFull
                                                 : BlockClass::kPartial;
      a.block_class[block] = static_cast<uint8_t>(cls);
      if (cls != BlockClass::kEmpty) atomicAdd(a.row_counts + row_block, 1);
    }
  }
}

/// Pass 2, one CTA: indptr[0] = 0, indptr[i + 1] = row_counts[0] + ... + row_counts[i], in chunks
/// of kThreads block rows with a running carry. The total fits int32 (host: at most
/// num_row_blocks * num_col_blocks < 2^31).
template <int kThreads>
__global__ void __launch_bounds__(kThreads) block_mask_indptr_kernel(const BlockMaskArgs a) {
  constexpr int kWarps = kThreads / kWarpSize;
  __shared__ int32_t warp_totals[kWarps];  // [kWarps] inclusive prefix of the chunk's warp sums
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (threadIdx.x == 0) a.indptr[0] = 0;
  int32_t carry = 0;  // listed blocks of the earlier chunks
  for (int64_t base = 0; base < a.num_row_blocks; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const int32_t x = block_mask_detail::warp_inclusive_sum(i < a.num_row_blocks ? a.row_counts[i] : 0, lane);
    if (lane == kWarpSize - 1) warp_totals[warp] = x;
    __syncthreads();
    if (warp == 0) {
      const int32_t t = block_mask_detail::warp_inclusive_sum(lane < kWarps ? warp_totals[lane] : 0, lane);
      if (lane < kWarps) warp_totals[lane] = t;
    }
    __syncthreads();
    if (i < a.num_row_blocks) a.indptr[i + 1] = carry + (warp > 0 ? warp_totals[warp - 1] : 0) + x;
    carry += warp_totals[kWarps - 1];
    __syncthreads();  // the next chunk rewrites warp_totals
  }
}

/// Pass 3, one CTA per block row (grid-stride): the row's listed column blocks in increasing
/// order from indptr[row block] on. Each chunk of kThreads column blocks is placed by a CTA-wide
/// prefix count (warp ballots, then the warps' counts in shared memory).
template <int kThreads>
__global__ void __launch_bounds__(kThreads) block_mask_compact_kernel(const BlockMaskArgs a) {
  using block_mask_detail::kFullWarp;
  constexpr int kWarps = kThreads / kWarpSize;
  __shared__ int32_t warp_counts[kWarps];  // [kWarps] listed blocks per warp in the current chunk
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int64_t row_block = blockIdx.x; row_block < a.num_row_blocks; row_block += gridDim.x) {
    const uint8_t* classes = a.block_class + row_block * a.num_col_blocks;  // [num_col_blocks]
    int32_t out = a.indptr[row_block];
    for (int64_t base = 0; base < a.num_col_blocks; base += kThreads) {
      const int64_t col_block = base + threadIdx.x;
      const uint8_t cls = col_block < a.num_col_blocks ? classes[col_block] : static_cast<uint8_t>(BlockClass::kEmpty);
      const bool listed = cls != static_cast<uint8_t>(BlockClass::kEmpty);
      const unsigned listed_lanes = __ballot_sync(kFullWarp, listed);
      if (lane == 0) warp_counts[warp] = __popc(listed_lanes);
      __syncthreads();
      int32_t before = 0, total = 0;  // listed blocks of the lower warps, and of the whole chunk
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const int32_t n = warp_counts[w];
        before += w < warp ? n : 0;
        total += n;
      }
      if (listed) {
        const int32_t at = out + before + __popc(listed_lanes & lanes_below);
        a.indices[at] = static_cast<int32_t>(col_block);
        a.block_flags[at] = cls == static_cast<uint8_t>(BlockClass::kFull) ? 1 : 0;
      }
      out += total;
      __syncthreads();  // the next chunk rewrites warp_counts
    }
  }
}

}  // namespace kernels
}  // namespace tessera
