// Contraction of the plan/run runtime (DESIGN.md §1.3): folds the fp32 partial states of a split
// query tile, in KV order, into the final output and LSE. It runs inside the persistent kernel
// (a stream-K fix-up): once every chunk of a tile has been counted for a KV head, one of the CTAs
// that computed a chunk of it merges the tile (attention_persistent_kernel). The order is fixed
// by the plan, so the result is the same bits whichever CTAs computed the chunks and whichever
// of them merges.
#pragma once

#include "kernels/attention/params.cuh"
#include "kernels/attention/planned_work.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/state.cuh"
#include "kernels/common/vec.cuh"

namespace tessera {
namespace kernels {

struct ContractionTraits {
  static constexpr int kFloatsPerThread = 8;  // one 16-byte output vector of a 16-bit dtype
  // Partial states loaded before any is folded. A split decode tile has few rows but up to
  // dozens of chunks, so the fold is a chain of round trips to memory unless loads are batched:
  // 8 x 36 B in flight per thread. Before sm_90, ptxas spilled in the persistent kernels at 255
  // registers with 8 (and not with 4). The batch only schedules loads: the fold order, hence
  // the bits, are the same.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static constexpr int kStatesInFlight = 4;
#else
  static constexpr int kStatesInFlight = 8;
#endif
};

/// Merges split tile `merge` for `kv_head`: every thread of the CTA takes (tile row, 8 columns of
/// head_dim) tasks, threadIdx.x strided by blockDim.x, and folds partial slots partial_begin ..
/// partial_end - 1 in that order. The caller has made the slots of every chunk visible (each
/// writer fenced before its arrival was counted). No barrier and no shared memory inside.
template <typename T, KVFormatKind kFormat>
TESSERA_DEVICE void merge_split_tile(const AttentionParams<T>& p, const PlannedWork& work, const PlannedMerge& merge,
                                     const int kv_head, const int q_tile_rows, const int head_dim) {
  constexpr int N = ContractionTraits::kFloatsPerThread;
  static_assert(vec_elems<T>() == N, "16-bit outputs");
  if (merge.request < 0 || merge.request >= p.batch_size) return;  // never produced by the planner
  const RequestExtent e = request_extent<kFormat>(p, merge.request);
  const int vecs = head_dim / N;
  for (int t = threadIdx.x; t < q_tile_rows * vecs; t += blockDim.x) {
    const int vec = t % vecs;
    const int row = t / vecs;
    const int packed = merge.packed_begin + row;
    const int qo_idx = packed / p.group_size;
    if (qo_idx >= e.qo_len) continue;  // rows past the request: no chunk wrote them
    const int head = kv_head * p.group_size + packed % p.group_size;

    constexpr int kBatch = ContractionTraits::kStatesInFlight;
    StateAccumulator<N> acc;
    for (int base = merge.partial_begin; base < merge.partial_end; base += kBatch) {
      float4 lo[kBatch], hi[kBatch];  // [kBatch] x [N] partial outputs
      float lse[kBatch];              // [kBatch]
      // Other SMs wrote these states during this grid: the loads go to L2 (__ldcg), where the
      // writers' fenced stores are, not to an L1 line this SM may hold from before.
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        if (base + k < merge.partial_end) {
          const int64_t slot = static_cast<int64_t>(base + k) * p.num_kv_heads + kv_head;
          const float* src = work.partial_o + (slot * q_tile_rows + row) * head_dim + vec * N;  // [N]
          lo[k] = __ldcg(reinterpret_cast<const float4*>(src));
          hi[k] = __ldcg(reinterpret_cast<const float4*>(src + 4));
          lse[k] = __ldcg(work.partial_lse + slot * q_tile_rows + row);
        }
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        if (base + k < merge.partial_end) {
          const float v[N] = {lo[k].x, lo[k].y, lo[k].z, lo[k].w, hi[k].x, hi[k].y, hi[k].z, hi[k].w};
          acc.fold(lse[k], v);
        }
      }
    }
    Vec<T> out;  // [N]
    const float inv_d = acc.d > 0.f ? 1.f / acc.d : 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i) out.data[i] = from_float<T>(acc.acc[i] * inv_d);
    out.store(p.o + static_cast<int64_t>(e.q_begin + qo_idx) * p.o_row_stride + head * p.o_head_stride + vec * N);
    if (p.lse != nullptr && vec == 0) {
      p.lse[static_cast<int64_t>(e.q_begin + qo_idx) * p.lse_row_stride + head * p.lse_head_stride] = acc.lse();
    }
  }
}

}  // namespace kernels
}  // namespace tessera
