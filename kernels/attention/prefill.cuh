// The attention prefill kernel for every KV format (docs/design.md §5), as a composition of
// collectives under kernels/attention/prefill/:
// - traits.cuh: tile sizes, warp roles, stages and the shared-memory budget (PrefillTraits);
// - kv_loader.cuh: where a work tile's Q and K/V rows come from (any format, row by row, so page
//   size 1 runs the same tile math);
// - mainloop_sm80.cuh (cp.async + mma.sync, every warp loads and computes) and mainloop_sm90.cuh
//   (a producer warpgroup feeding wgmma warpgroups through mbarrier pipelines);
// - variant_applier.cuh (operand and logits transforms, masks), tile_softmax.cuh (the online
//   softmax over S fragments), epilogue.cuh (final output or split-KV partial states);
// - tile_scheduler.cuh: the one-shot grid or the plan/run runtime's persistent grid.
//
// A CTA computes query tiles of (request, KV head) pairs against ranges of the request's KV
// positions. With head-group fusion the tile's rows are (query position, head within the KV
// head's group) pairs, packed position-major: packed row p is query p / group_size of query head
// kv_head * group_size + p % group_size. Decode with GQA is then a prefill whose tile holds the
// group's heads (docs/design.md §5, "decode, tensor cores").
//
// Warp layout: NUM_WARPS_Q x NUM_WARPS_KV compute warps. Each owns CTA_TILE_Q / NUM_WARPS_Q query
// rows and CTA_TILE_KV / NUM_WARPS_KV columns of every KV tile; with NUM_WARPS_KV > 1 (small
// query tiles) each warp keeps its own softmax state and the epilogue merges them.
#pragma once

#include "kernels/attention/params.cuh"
#include "kernels/attention/prefill/epilogue.cuh"
#include "kernels/attention/prefill/kv_loader.cuh"
#include "kernels/attention/prefill/mainloop_sm80.cuh"
#include "kernels/attention/prefill/mainloop_sm90.cuh"
#include "kernels/attention/prefill/tile_scheduler.cuh"
#include "kernels/attention/prefill/tile_softmax.cuh"
#include "kernels/attention/prefill/traits.cuh"
#include "kernels/attention/prefill/variant_applier.cuh"
#include "kernels/attention/variants.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// P (the softmax's S accumulators, m16n8 C fragments) as the A fragments of P V, in place: a
/// k16 step's four words are pairs of 16-bit values (the m16n8k16 A layout is the C layout of two
/// n8 tiles); an fp8 k32 step's are four bytes of two n8 tiles each, S columns 2t, 2t + 1, 2t + 8,
/// 2t + 9 of a 16-column half in the word of A columns 4t .. 4t + 3, which V's transpose matches
/// with the same permutation of keys (transpose_v_tile).
template <typename Traits, typename PT>
TESSERA_DEVICE void pack_p_fragments(const float (&s)[Traits::kMmaQ][Traits::kN8KV][4],
                                     uint32_t (&pfrag)[Traits::kMmaQ][Traits::kMmaKV][4]) {
  constexpr int kN8PerStep = Traits::kMmaK / 8;  // n8 tiles of S per k step: 2, fp8 4
#pragma unroll
  for (int mq = 0; mq < Traits::kMmaQ; ++mq)
#pragma unroll
    for (int kk = 0; kk < Traits::kMmaKV; ++kk) {
      const float(&a)[4] = s[mq][kN8PerStep * kk];
      const float(&b)[4] = s[mq][kN8PerStep * kk + 1];
      if constexpr (Traits::kFp8Operands) {
        const float(&c)[4] = s[mq][kN8PerStep * kk + 2];
        const float(&d)[4] = s[mq][kN8PerStep * kk + 3];
        pfrag[mq][kk][0] = float4_to_fp8x4<PT>(a[0], a[1], b[0], b[1]);  // row g
        pfrag[mq][kk][1] = float4_to_fp8x4<PT>(a[2], a[3], b[2], b[3]);  // row g + 8
        pfrag[mq][kk][2] = float4_to_fp8x4<PT>(c[0], c[1], d[0], d[1]);
        pfrag[mq][kk][3] = float4_to_fp8x4<PT>(c[2], c[3], d[2], d[3]);
      } else {
        pfrag[mq][kk][0] = pack_pair<PT>(a[0], a[1]);
        pfrag[mq][kk][1] = pack_pair<PT>(a[2], a[3]);
        pfrag[mq][kk][2] = pack_pair<PT>(b[0], b[1]);
        pfrag[mq][kk][3] = pack_pair<PT>(b[2], b[3]);
      }
    }
}

/// The compute warps' side of one work tile: for each KV tile, the mainloop's Q K^T, the
/// variant's transforms and masks, the online softmax, P V; then the epilogue. The mainloop's
/// loads were started by the caller (sm80: its prologue; sm90: the producer warpgroup).
template <typename Traits, KVFormatKind kFormat, typename Variant, typename Mainloop, typename Params, typename T>
TESSERA_DEVICE void compute_tile(const Params& p, const VariantParams& vp, const PrefillWork& w,
                                 const PrefillSmem<Traits>& smem, const FragmentCoords<Traits>& c, Mainloop& ml,
                                 const typename Mainloop::Source& kv, T* q_tile) {
  constexpr int kMmaQ = Traits::kMmaQ, kN8KV = Traits::kN8KV, kN8D = Traits::kN8D;
  using Applier = VariantApplier<Traits, kFormat, Variant, Params>;
  using PT = typename Mainloop::PType;  // P's element type: P V multiplies P by V as the MMAs read it
  using Softmax = TileSoftmax<Traits, Variant::kUseSoftmax, Applier::kMayUseZeroReference, Applier::kSplitKeyBias>;
  const Applier applier(p, vp, w, c);
  Softmax softmax(applier.zero_reference);
  float o[kMmaQ][kN8D][4];  // [m16 tile][n8 tile of D][fragment]
  zero_fragments(o);
  // P of the tile whose P V comes next, as A fragments (pack_p_fragments). With the P V lag (sm90), it
  // waits a whole iteration: packed at the end of tile t, read by the P V issued in tile t + 1.
  uint32_t pfrag[kMmaQ][Traits::kMmaKV][4];  // [m16 tile][k16 step][A fragment]

  // One KV tile. With kLagged (sm90, every tile but the first) it also issues the previous
  // tile's P V after this tile's Q K^T. The first tile is a separate instantiation rather than a
  // branch on `tile > 0` around the wgmma issue and waits: ptxas then ends the P V's pipeline
  // stage before the softmax (or serialises every wgmma, C7514).
  auto kv_tile_step = [&](const int tile, auto lagged) {
    constexpr bool kLagged = decltype(lagged)::value;
    static_assert(!kLagged || Traits::kPvLag == 1, "only warp-specialised tiles lag P V");
    const int kv_begin = kv.tiles.begin(tile), kv_tile_end = kv.tiles.end(tile);
    // Decided before the waits: block-sparse tiles read their blocks' flags from global memory,
    // whose latency then hides under the wait and the Q K^T instead of stalling the softmax.
    const bool needs_mask = applier.tile_needs_mask(kv_begin, kv_tile_end, kv.tiles.mask_cover(tile));
    ml.wait_tile(tile);
    const int32_t* keys = kv.keys(tile);  // [CTA_TILE_KV]
    applier.template transform_operands<Traits::kWgmma>(tile, q_tile, ml.k_tile(), ml.v_tile(), keys);

    float s[kMmaQ][kN8KV][4];  // [m16 tile][n8 tile of KV][fragment]
    ml.template qk<kLagged>(s, q_tile, [&] { ml.template issue_pv<false>(o, pfrag, tile - 1, applier); });

    // Mask, then fold into the running softmax state. Logits stay unscaled until the exponent,
    // where scale and max subtraction are one FMA (sm_scale > 0, so the max commutes with it);
    // a variant that transforms logits gets them scaled (natural units) and returns them in
    // base 2 here, so its exponent uses scale 1.
    const float scale = applier.logits_scale() * ml.logits_factor();
    float row_bias[kMmaQ][2];  // [m16 tile][row half]: the split key bias
    applier.add_key_bias(s, kv_begin, keys, row_bias);
    applier.transform_and_mask(s, keys, needs_mask, kv_begin);
    float rescale[kMmaQ][2];  // [m16 tile][row half]: O's factor for a moved reference max
    const bool settled = softmax.update(s, scale, row_bias, rescale);
    // O and P are free again (after every exponential); O's rescale waits for the P V.
    if constexpr (kLagged) ml.complete_pv(o, pfrag, softmax.row[0][0].d + softmax.row[0][1].d);
    softmax.rescale_output(o, rescale, settled);

    // P goes from the S accumulators straight into A fragments, packed first so the fp32 S
    // registers are free during the P V loop.
    pack_p_fragments<Traits, PT>(s, pfrag);
    // O += P V: here, or with the lag in the next iteration's Q K^T.
    if constexpr (Traits::kPvLag == 0) ml.template issue_pv<false>(o, pfrag, tile, applier);
    ml.tile_done();
  };
  const int num_kv_tiles = kv.count();
  if constexpr (Traits::kPvLag == 1) {
    if (num_kv_tiles > 0) {
      kv_tile_step(0, BoolConstant<false>{});
      for (int tile = 1; tile < num_kv_tiles; ++tile) kv_tile_step(tile, BoolConstant<true>{});
      ml.last_pv(o, pfrag, num_kv_tiles - 1, applier);
    }
  } else {
    for (int tile = 0; tile < num_kv_tiles; ++tile) kv_tile_step(tile, BoolConstant<false>{});
  }
  ml.finish(o);
  if (const float f = ml.output_factor(); f != 1.f) {  // fp8 V's scale (folded out of the tiles)
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int n = 0; n < kN8D; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[mq][n][i] *= f;
  }
  // At the latest before this item's stores: where the first Q K^T released it, a flag test (an
  // item without KV tiles has none to hide the wait under).
  ml.release_stored_q();
  const bool bulk_stores =
      PrefillEpilogue<Traits, Variant, Softmax, Params>{p, vp, w, c, applier.batch}.store(o, softmax, smem, q_tile);
  ml.release_q(bulk_stores);
}

/// One work tile, as this warp's role sees it. The caller has synchronised the CTA since any
/// earlier use of shared memory (the warp-specialised ring orders work items through its
/// mbarriers instead).
template <typename Traits, KVFormatKind kFormat, typename Variant, WarpRole kRole, typename Params>
TESSERA_DEVICE void attention_tile(const Params& p, const VariantParams& vp, const PrefillWork& w, char* smem_raw,
                                   RingPosition<Traits>& ring) {
  using T = typename Traits::DType;  // the tiles' element type
  static_assert((kRole == WarpRole::kAll) == !Traits::kWarpSpecialized, "roles split warp-specialised tiles only");
  const PrefillSmem<Traits> smem(smem_raw);
  // This item's Q buffer: the producer's next to fill, the compute warps' next to read (the same
  // buffer: each role's ring position advances once per item).
  const int q_stage = kRole == WarpRole::kProducer ? ring.fill_q.stage : ring.read_q.stage;
  T* const q_tile = q_stage == 0 ? smem.q : smem.extra_q + (q_stage - 1) * Traits::kQTileElems;
  KVTileSource<Traits, kFormat, Variant, Params> kv(p, w, smem, Traits::kWarpSpecialized ? ring.tiles : 0u);
  if constexpr (Traits::kWarpSpecialized) {
    Sm90Mainloop<Traits, kFormat, Variant, Params> ml{smem, kv, ring};
    if constexpr (kRole == WarpRole::kProducer) {
      ml.produce(p, w, q_tile);
    } else {
      ml.wait_q();
      compute_tile<Traits, kFormat, Variant>(p, vp, w, smem, FragmentCoords<Traits>(), ml, kv, q_tile);
    }
  } else {
    const FragmentCoords<Traits> c;
    Sm80Mainloop<Traits, kFormat, Variant, Params> ml(smem, kv, q_tile, c);
    // The ldmatrix addressing XORs k16 steps into 1024-byte-aligned tile bases.
    if (smem_addr(smem_raw) % 1024 != 0) __trap();  // never: the declaration's alignment; never silently wrong
    ml.load_prologue(p, w, q_tile);
    compute_tile<Traits, kFormat, Variant>(p, vp, w, smem, c, ml, kv, q_tile);
  }
}

/// The occupancy a prefill kernel's register allocation must allow: the traits', or, where the
/// default variant converts fp8 fragments (no T tiles), what their shared memory fits.
template <typename Traits, typename Variant>
inline constexpr int kPrefillMinCtasPerSm = Traits::kConvertFragments && kSameType<Variant, DefaultVariant>
                                                ? Traits::kFragmentMinCtasPerSm
                                                : Traits::kMinCtasPerSm;

/// The compute warpgroups' MMA turns (Sm90Mainloop::open_mma_turns): one round for all of the
/// CTA's work items, opened before the first (`open`) and closed after the last.
template <typename Traits, KVFormatKind kFormat, typename Variant, typename Params>
TESSERA_DEVICE void mma_turns_round(bool open) {
  if constexpr (Traits::kWarpSpecialized) {
    using Mainloop = Sm90Mainloop<Traits, kFormat, Variant, Params>;
    if (open) {
      Mainloop::open_mma_turns();
    } else {
      Mainloop::close_mma_turns();
    }
  }
}

/// The work tiles `scheduler` gives this CTA, each the same composition: the body of the prefill
/// kernel, and of each side of the POD kernel (pod.cuh).
template <typename Traits, KVFormatKind kFormat, typename Variant, typename Scheduler, typename Params>
TESSERA_DEVICE void run_work_tiles(const Params& p, const VariantParams& vp, const Scheduler& scheduler,
                                   char* smem_raw) {
  const auto first = scheduler.template initial_work<kFormat, Variant>(p, vp);
  if (!scheduler.valid(first)) return;  // CTA-uniform, before any barrier
  with_warp_role<Traits, kFormat>(smem_raw, [&](auto role) {
    constexpr WarpRole kRole = decltype(role)::value;
    RingPosition<Traits> ring;  // continues across the CTA's work tiles
    if constexpr (kRole == WarpRole::kCompute) mma_turns_round<Traits, kFormat, Variant, Params>(true);
    for (auto cursor = first; scheduler.valid(cursor); cursor = scheduler.next_work(cursor)) {
      PrefillWork w;
      if (!scheduler.template work<kFormat, Variant>(p, vp, cursor, w)) continue;
      // The previous tile's last shared-memory reads are done (the warp-specialised ring orders
      // tiles through its mbarriers instead, so the producer starts the next tile early).
      if constexpr (Scheduler::kPersistent && kRole == WarpRole::kAll) tile_sync<Traits>();
      attention_tile<Traits, kFormat, Variant, kRole>(p, vp, w, smem_raw, ring);
    }
    if constexpr (kRole == WarpRole::kCompute) mma_turns_round<Traits, kFormat, Variant, Params>(false);
    // The last item's output stores must have read shared memory before the CTA exits
    // (Traits::kDeferQRelease left that wait to the next item).
    if constexpr (kRole == WarpRole::kCompute && Traits::kDeferQRelease) {
      if (ring.store_reading) tma_store_wait_read<0>();
    }
  });
}

/// One element type in the tiles: Q K^T multiplies Q and K as the tiles hold them, q as it is in
/// memory and k/v as stored or (fp8) dequantized on the way (Traits::KVStorage).
template <typename Traits, typename Params>
inline constexpr bool kParamsFitTraits = kSameType<typename Params::QType, typename Traits::DType> &&
                                         kSameType<typename Params::KVType, typename Traits::KVStorage>;

/// The prefill kernel: Scheduler<Traits> (tile_scheduler.cuh) says which work tiles the CTA runs,
/// and every tile is the same composition. Grid and arguments per scheduler: OneShotScheduler
/// takes the query tiles per request (grid: see one_shot_grid on the host), PlannedScheduler the
/// runtime's plan (grid: columns x KV head groups). Params: an AttentionParams, passed by value
/// (the JIT-compiled instances take the host's struct as it is: src/prefill_launch.cuh), as a
/// __grid_constant__: the TMA descriptors in it (RaggedKVParams::tma) are used where they are, in
/// parameter space.
template <typename Traits, KVFormatKind kFormat, typename Variant, template <typename> class Scheduler, typename Params>
__global__ void __launch_bounds__(Traits::kThreads, (kPrefillMinCtasPerSm<Traits, Variant>))
attention_prefill_kernel(const __grid_constant__ Params p, const VariantParams vp,
                         const typename Scheduler<Traits>::Arguments args) {
  static_assert(kParamsFitTraits<Traits, Params>,
                "the prefill kernel needs q of the tile's element type and k/v of its storage type");
  static_assert(kInt32Indices<Params>, "the prefill kernel takes int32 index arrays (int32 KV positions)");
  extern __shared__ __align__(1024) char smem_raw[];  // 1024: the XOR addressing of the tiles
  Scheduler<Traits>::on_launch();
  run_work_tiles<Traits, kFormat, Variant>(p, vp, Scheduler<Traits>(args), smem_raw);
}

}  // namespace kernels
}  // namespace tessera
