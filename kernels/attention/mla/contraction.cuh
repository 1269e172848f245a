// Contraction of the MLA plan/run runtime: folds the fp32 states of every split query tile (the
// chunks of MlaPlannedSchedule's items, written in KV order) into the latent output and its LSE.
// MLA's plan has one KV head and 64-row tiles of (token, head) rows, so a state slot is
// [64, kLatentDim] (planned_work.cuh's layout with H_kv = 1, head_dim = kLatentDim).
#pragma once

#include "kernels/attention/contraction.cuh"
#include "kernels/attention/mla/params.cuh"
#include "kernels/attention/mla/traits.cuh"
#include "kernels/attention/planned_work.cuh"
#include "kernels/common/vec.cuh"

namespace tessera {
namespace kernels {

/// Grid-stride over (merge, tile row, 8 latent columns); the merge count is read from the
/// workspace, so a captured launch with the grid of the largest plan serves every later plan.
template <typename Traits>
__global__ void __launch_bounds__(ContractionTraits::kThreadsPerBlock)
    mla_merge_planned_kernel(const MlaParams<typename Traits::DType, typename Traits::KVType> p, const PlannedWork work) {
  using T = typename Traits::DType;
  constexpr int N = ContractionTraits::kFloatsPerThread;
  static_assert(vec_elems<T>() == N, "16-bit outputs");
  constexpr int kVecs = Traits::kLatentDim / N;
  constexpr int64_t kPerMerge = static_cast<int64_t>(Traits::CTA_TILE_Q) * kVecs;
  const int64_t total = static_cast<int64_t>(*work.num_merges) * kPerMerge;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int vec = static_cast<int>(t % kVecs);
    const int row = static_cast<int>((t / kVecs) % Traits::CTA_TILE_Q);
    const PlannedMerge merge = work.merges[t / kPerMerge];
    if (merge.request < 0 || merge.request >= p.batch_size) continue;  // never produced by the planner
    const int qo_start = p.qo_indptr[merge.request];
    const int qo_len = p.qo_indptr[merge.request + 1] - qo_start;
    const int packed = merge.packed_begin + row;
    if (packed >= qo_len * p.num_heads) continue;
    const int64_t token = qo_start + packed / p.num_heads;
    const int head = packed % p.num_heads;
    const OnlineSoftmax<N> acc =
        fold_planned_partials(work, merge, 0, 1, Traits::CTA_TILE_Q, row, Traits::kLatentDim, vec * N);
    Vec<T> out;
    const float inv_d = acc.d > 0.f ? 1.f / acc.d : 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i) out.data[i] = from_float<T>(acc.acc[i] * inv_d);
    out.store(p.o + token * p.o_stride_token + head * p.o_stride_head + vec * N);
    if (p.lse != nullptr && vec == 0) p.lse[token * p.num_heads + head] = acc.lse();
  }
}

}  // namespace kernels
}  // namespace tessera
