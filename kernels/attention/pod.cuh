// The POD kernel: prefill and decode work of one batch in one persistent launch (docs/design.md
// §6.10). A mixed batch planned as one prefill puts its decode requests, a few packed rows each,
// into the prefill's large query tiles: their K/V is read at the compute-bound tile's pace and
// most of each tile's MMAs are padding. Here the batch is two plans, each with its own tile: the
// prefill requests' items in the large tile (compute-bound) and the decode requests' items in a
// 16-row tile (bandwidth-bound), run by disjoint CTAs of one grid. While the prefill CTAs keep the
// tensor cores busy, the decode CTAs stream their K/V, so each kind of work runs under the other
// instead of after it.
//
// Grid: PodWork::prefill_ctas CTAs of the prefill plan (column b % prefill_cols, head group
// b / prefill_cols), then the decode plan's CTA slots, PodTraits::kDecodeCopies to a CTA: the
// launch has the larger tile's threads and shared memory, and a decode CTA runs as many copies of
// the 16-row tile side by side as they hold, each on its own threads, shared memory and barrier
// (tile_thread, tile_sync in prefill/traits.cuh); threads beyond the copies exit at once.
#pragma once

#include "kernels/attention/prefill.cuh"

namespace tessera {
namespace kernels {

/// The two plans of a POD launch and how the grid divides between them.
struct PodWork {
  PlannedWork prefill;   // the large tile's plan
  PlannedWork decode;    // the 16-row tile's plan
  int32_t prefill_cols;  // columns of the prefill plan
  int32_t prefill_ctas;  // prefill_cols x its head groups: blockIdx.x below this runs the prefill plan
  int32_t decode_cols;   // columns of the decode plan (one KV head per slot: mma.sync tiles), whose
                         // cols x H_kv slots run PodTraits::kDecodeCopies to a CTA
};

/// The launch shape of a (prefill tile, decode tile) pair: threads of the larger, the occupancy
/// both allow, and how many copies of the decode tile a decode CTA runs side by side (as many as
/// its threads and the shared memory hold: each copy is one more independent stream of K/V
/// copies, and a lone 16-row tile on an SM is bound by its per-tile chain, not by bandwidth).
template <typename PrefillTraits, typename DecodeTraits, typename Variant>
struct PodTraits {
  static constexpr int kThreads =
      PrefillTraits::kThreads > DecodeTraits::kThreads ? PrefillTraits::kThreads : DecodeTraits::kThreads;
  // A decode copy's shared memory, rounded up so every copy keeps the 1024-byte alignment of the
  // tiles' XOR addressing.
  static constexpr int kDecodeSmemStride = (DecodeTraits::kDefaultSmemBytes + 1023) / 1024 * 1024;
  static constexpr int kSmemLimit = 227 * 1024;  // sm_80 / sm_90 opt-in maximum per CTA
  static constexpr int kDecodeCopiesByThreads = kThreads / DecodeTraits::kThreads;
  static constexpr int kDecodeCopiesBySmem = kSmemLimit / kDecodeSmemStride;
  static constexpr int kDecodeCopies =
      kDecodeCopiesByThreads < kDecodeCopiesBySmem ? kDecodeCopiesByThreads : kDecodeCopiesBySmem;
  static constexpr int kDecodeSmemBytes = kDecodeCopies * kDecodeSmemStride;
  static constexpr int kSmemBytes =
      PrefillTraits::kDefaultSmemBytes > kDecodeSmemBytes ? PrefillTraits::kDefaultSmemBytes : kDecodeSmemBytes;
  static constexpr int kPrefillMin = kPrefillMinCtasPerSm<PrefillTraits, Variant>;
  static constexpr int kDecodeMin = kPrefillMinCtasPerSm<DecodeTraits, Variant>;
  static constexpr int kMinCtasPerSm = kPrefillMin < kDecodeMin ? kPrefillMin : kDecodeMin;

  static_assert(kSameType<typename PrefillTraits::DType, typename DecodeTraits::DType> &&
                    kSameType<typename PrefillTraits::KVStorage, typename DecodeTraits::KVStorage> &&
                    PrefillTraits::HEAD_DIM == DecodeTraits::HEAD_DIM &&
                    PrefillTraits::HEAD_DIM_VO == DecodeTraits::HEAD_DIM_VO,
                "the two tiles of a POD launch read the same q, K/V and o");
  // A warp-specialised tile meets all of the CTA's threads at its set-up barrier and splits them
  // into roles by thread index, so only it may set the launch's thread count; the decode tile's
  // copies each synchronise their own threads at their own barrier (tile_sync).
  static_assert(!DecodeTraits::kWarpSpecialized, "the decode side is an mma.sync tile");
  static_assert(!PrefillTraits::kWarpSpecialized || PrefillTraits::kThreads == kThreads,
                "a warp-specialised prefill tile takes the whole CTA");
  static_assert(DecodeTraits::CTA_TILE_Q < PrefillTraits::CTA_TILE_Q, "the decode tile is the smaller one");
  static_assert(kDecodeCopies >= 1 && kDecodeCopies <= 16, "one barrier per decode copy (16 per CTA)");
  static_assert(kSmemBytes <= kSmemLimit, "the launch's shared memory fits an SM");
};

template <typename PrefillTraits, typename DecodeTraits, KVFormatKind kFormat, typename Variant, typename Params>
__global__ void __launch_bounds__((PodTraits<PrefillTraits, DecodeTraits, Variant>::kThreads),
                                  (PodTraits<PrefillTraits, DecodeTraits, Variant>::kMinCtasPerSm))
attention_pod_kernel(const __grid_constant__ Params p, const VariantParams vp, const PodWork work) {
  static_assert(kParamsFitTraits<PrefillTraits, Params> && kParamsFitTraits<DecodeTraits, Params>,
                "the POD kernel needs q of the tiles' element type and k/v of their storage type");
  static_assert(kInt32Indices<Params>, "the POD kernel takes int32 index arrays (int32 KV positions)");
  extern __shared__ __align__(1024) char smem_raw[];  // 1024: the XOR addressing of the tiles
  PlannedScheduler<PrefillTraits>::on_launch();
  const int cta = static_cast<int>(blockIdx.x);
  if (cta < work.prefill_ctas) {
    if (static_cast<int>(threadIdx.x) >= PrefillTraits::kThreads) return;
    const PlannedScheduler<PrefillTraits> scheduler(work.prefill, cta % work.prefill_cols, cta / work.prefill_cols);
    run_work_tiles<PrefillTraits, kFormat, Variant>(p, vp, scheduler, smem_raw);
  } else {
    // Copy `copy` of the decode tile is the decode plan's CTA slot d * kDecodeCopies + copy, at
    // (slot % cols, slot / cols); a slot past the plan's grid (the last CTA's spare copies) exits.
    using Pod = PodTraits<PrefillTraits, DecodeTraits, Variant>;
    const int copy = static_cast<int>(threadIdx.x) / DecodeTraits::kThreads;
    const int slot = (cta - work.prefill_ctas) * Pod::kDecodeCopies + copy;
    if (copy >= Pod::kDecodeCopies || slot >= work.decode_cols * p.num_kv_heads) return;
    const PlannedScheduler<DecodeTraits> scheduler(work.decode, slot % work.decode_cols, slot / work.decode_cols);
    run_work_tiles<DecodeTraits, kFormat, Variant>(p, vp, scheduler, smem_raw + copy * Pod::kDecodeSmemStride);
  }
}

}  // namespace kernels
}  // namespace tessera
