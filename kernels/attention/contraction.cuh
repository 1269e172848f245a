// Contraction of the plan/run runtime (docs/design.md §1.3): folds the fp32 partial states of every
// split query tile, in KV order, into the final output and LSE. The order is fixed by the plan,
// so the result is the same bits whichever CTAs computed the chunks.
#pragma once

#include "kernels/attention/params.cuh"
#include "kernels/attention/planned_work.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/vec.cuh"

namespace tessera {
namespace kernels {

struct ContractionTraits {
  static constexpr int kThreadsPerBlock = 256;
  static constexpr int kFloatsPerThread = 8;  // one 16-byte output vector of a 16-bit dtype
  // Partial states loaded before any is folded. A split decode tile has few rows but up to
  // dozens of chunks, so the fold is a chain of DRAM round trips unless loads are batched:
  // 8 x 36 B in flight per thread.
  static constexpr int kStatesInFlight = 8;
  static_assert(kThreadsPerBlock % kWarpSize == 0, "whole warps");
};

/// Folds the partial states of one split tile's row, 8 columns from `col`, in KV order: slots
/// merge.partial_begin .. partial_end - 1 of KV head `kv_head` (planned_work.cuh's layout).
TESSERA_DEVICE OnlineSoftmax<ContractionTraits::kFloatsPerThread> fold_planned_partials(
    const PlannedWork& work, const PlannedMerge& merge, int kv_head, int num_kv_heads, int q_tile_rows, int row,
    int head_dim, int col) {
  constexpr int N = ContractionTraits::kFloatsPerThread;
  constexpr int kBatch = ContractionTraits::kStatesInFlight;
  OnlineSoftmax<N> acc;
  for (int base = merge.partial_begin; base < merge.partial_end; base += kBatch) {
    float4 lo[kBatch], hi[kBatch];  // [kBatch] x [N] partial outputs
    float lse[kBatch];              // [kBatch]
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (base + k < merge.partial_end) {
        const int64_t slot = static_cast<int64_t>(base + k) * num_kv_heads + kv_head;
        const float* src = work.partial_o + (slot * q_tile_rows + row) * head_dim + col;  // [N]
        lo[k] = __ldcs(reinterpret_cast<const float4*>(src));
        hi[k] = __ldcs(reinterpret_cast<const float4*>(src + 4));
        lse[k] = work.partial_lse[slot * q_tile_rows + row];
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (base + k < merge.partial_end) {
        const float v[N] = {lo[k].x, lo[k].y, lo[k].z, lo[k].w, hi[k].x, hi[k].y, hi[k].z, hi[k].w};
        acc.fold_state(lse[k], v);
      }
    }
  }
  return acc;
}

/// Grid-stride over (merge, KV head, tile row, 8 columns of head_dim); the grid is fixed by the
/// runtime and the merge count is read from the workspace, so one captured launch serves any plan.
/// Launched as a programmatic dependent of the persistent kernel (sm_90+): everything up to the
/// partial states (the plan, written before that kernel started) is read while it still runs.
/// Params: the persistent kernel's AttentionParams (request extents and outputs).
template <typename Params, KVFormatKind kFormat>
__global__ void __launch_bounds__(ContractionTraits::kThreadsPerBlock)
merge_planned_kernel(const Params p, const PlannedWork work, const int q_tile_rows, const int head_dim) {
  using OT = typename Params::OType;
  constexpr int N = ContractionTraits::kFloatsPerThread;
  static_assert(vec_elems<OT>() == N, "16-bit outputs");
  static_assert(kInt32Indices<Params>, "the contraction takes int32 index arrays (int32 query rows)");
  const int vecs = head_dim / N;
  const int64_t per_merge = static_cast<int64_t>(p.num_kv_heads) * q_tile_rows * vecs;
  const int64_t total = static_cast<int64_t>(*work.num_merges) * per_merge;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int vec = static_cast<int>(t % vecs);
    const int row = static_cast<int>((t / vecs) % q_tile_rows);
    const int kv_head = static_cast<int>((t / (static_cast<int64_t>(vecs) * q_tile_rows)) % p.num_kv_heads);
    const PlannedMerge merge = work.merges[t / per_merge];
    if (merge.request < 0 || merge.request >= p.batch_size) continue;  // never produced by the planner
    const RequestExtent e = KVFormat<kFormat>::request_extent(p, merge.request);
    const int packed = merge.packed_begin + row;
    const int qo_idx = packed / p.group_size;
    if (qo_idx >= e.qo_len) continue;
    const int head = kv_head * p.group_size + packed % p.group_size;

    wait_for_prerequisite_grids();  // the persistent kernel's partial states are complete
    const OnlineSoftmax<N> acc = fold_planned_partials(work, merge, kv_head, p.num_kv_heads, q_tile_rows, row,
                                                       head_dim, vec * N);
    Vec<OT> out;
    const float inv_d = acc.d > 0.f ? 1.f / acc.d : 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i) out.data[i] = from_float<OT>(acc.acc[i] * inv_d);
    out.store(p.o.data + static_cast<int64_t>(e.q_begin + qo_idx) * p.o.row_stride + head * p.o.head_stride + vec * N);
    if (p.o.lse != nullptr && vec == 0) {
      p.o.lse[static_cast<int64_t>(e.q_begin + qo_idx) * p.o.lse_row_stride + head * p.o.lse_head_stride] = acc.lse();
    }
  }
}

}  // namespace kernels
}  // namespace tessera
