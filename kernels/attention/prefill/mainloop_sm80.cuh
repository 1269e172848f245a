// The sm80 mainloop of the prefill tile (every GPU from sm_80): every warp loads (cp.async into a
// kStages ring, one CTA barrier per KV tile) and computes with mma.sync m16n8k16 fed by ldmatrix
// from swizzled shared memory.
//
// fp8 KV (Traits::kDequantizeKV): the ring holds the stored bytes; after a tile's barrier the
// stage is dequantized into the one T tile pair the MMAs read. Where each warp reads only its own
// KV rows (one warp of query rows, NUM_WARPS_Q == 1: the decode tiles) and no variant transforms
// K or V across rows, each warp converts its rows and a __syncwarp publishes them; otherwise
// every thread converts a share and a second CTA barrier publishes the tiles. The raw stage of
// tile t - 1 and the T tiles are free by then (their last readers, the dequantization and the
// MMAs of tile t - 1, precede the first barrier).
//
// Pipeline: the row tables form a ring of kStages + 1, so the lookups for tile t + kStages can be
// written while tile t + kStages - 1 is being copied from another table and tile t's keys are read
// by the mask, with one barrier per tile: a table's last readers (the mask of tile t - 1, copies
// of earlier tiles) always sit behind the previous tile's barrier.
#pragma once

#include "kernels/attention/prefill/kv_loader.cuh"
#include "kernels/attention/prefill/traits.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/pipeline.cuh"
#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

template <typename Traits, KVFormatKind kFormat, typename Variant, typename Params>
struct Sm80Mainloop {
  using T = typename Traits::DType;  // the Q and K/V tiles' element type (the kernel checks Params' types match)
  static_assert(!Traits::kWarpSpecialized && !Traits::kWgmma, "the sm80 mainloop: every warp loads and computes");
  static constexpr int kMmaQ = Traits::kMmaQ, kN8KV = Traits::kN8KV, kN8D = Traits::kN8D;
  static constexpr int kTileElems = Traits::kKVTileElems;
  static constexpr uint32_t kRowBytes = Traits::kSmemRowChunks * 16;  // a stored row (SwizzledTile)
  using Source = KVTileSource<Traits, kFormat, Variant, Params>;
  static constexpr bool kWarpDequantize = Traits::kDequantizeKV && Traits::NUM_WARPS_Q == 1 &&
                                          !Variant::kHasKeyTransform && !Variant::kHasValueTransform;

  const PrefillSmem<Traits>& smem;
  Source& kv;
  PipelineState<Traits::kStages> fill, read;  // the stage being filled, the stage being computed
  int current = 0;                             // the tile between wait_tile and tile_done
  // ldmatrix addresses. A lane's fragment row is fixed for the whole tile and its rows are 8k +
  // lane % 8, so the swizzled chunk is (2 * step + half) ^ (lane % 8) = ((half ^ lane % 8)) ^
  // 2 * step: a k16 step only XORs (step << 5) into the byte address, and a further m16 / k16 /
  // n16 block adds whole rows (an immediate). Exact because every tile base is a multiple of 1024
  // bytes (smem_raw is 1024-aligned; tile sizes are multiples of 16 rows of >= 128 bytes) and row
  // bases leave the chunk bits free. Saves the per-load swizzle arithmetic of the inner loops.
  uint32_t q_frag;         // Q: [kWarpRowsQ rows of this warp][HEAD_DIM], A fragments, half = lane / 16
  uint32_t k_frag_offset;  // K: B fragments of two n8 tiles, rows lane % 8 + 8 * (lane / 16), half = (lane / 8) % 2
  uint32_t v_frag_offset;  // V: transposed B fragments of two n8 tiles of D, rows frag_row, half = lane / 16
  int warp_col0;           // the warp's first KV row of each tile (kWarpDequantize converts its rows)
  int lane;

  TESSERA_DEVICE Sm80Mainloop(const PrefillSmem<Traits>& smem_, Source& kv_, const T* q_tile,
                              const FragmentCoords<Traits>& c)
      : smem(smem_), kv(kv_), warp_col0(c.warp_col0), lane(c.lane) {
    const uint32_t lane_chunk_lo = static_cast<uint32_t>(((lane / 16) ^ (lane % 8)) << 4);        // half = lane / 16
    const uint32_t lane_chunk_mid = static_cast<uint32_t>((((lane / 8) % 2) ^ (lane % 8)) << 4);  // half = (lane / 8) % 2
    const uint32_t frag_row = (lane % 8) + 8 * ((lane / 8) % 2);  // row of an A (Q, P) or V^T fragment
    q_frag = smem_addr(q_tile) + (c.warp_q * Traits::kWarpRowsQ + frag_row) * kRowBytes + lane_chunk_lo;
    k_frag_offset = (c.warp_col0 + (lane % 8) + 8 * (lane / 16)) * kRowBytes + lane_chunk_mid;
    v_frag_offset = (c.warp_col0 + frag_row) * kRowBytes + lane_chunk_lo;
  }

  /// Load: the query tile (packed rows past the request's queries zero-filled) and the first
  /// kStages - 1 KV tiles, each its own cp.async group, and the row table of the next.
  TESSERA_DEVICE void load_prologue(const Params& p, const PrefillWork& w, T* q_tile) {
    load_q_tile<Traits>(p, w.e, w.kv_head, w.packed_begin, q_tile, smem.q_rows);
    cp_async_commit();
    kv.load_block_id(0);
#pragma unroll
    for (int s = 0; s + 1 < Traits::kStages; ++s) {
      kv.resolve(s);
      __syncthreads();
      copy(s);
    }
    kv.resolve(Traits::kStages - 1);
  }

  /// Load: waits for `tile` (and Q), then the loads this allows: the copies of tile + kStages - 1
  /// into the stage tile - 1 freed and the row table of tile + kStages (with
  /// Traits::kLoadsBehindMma, issued by qk() and tile_done() instead, behind the MMAs).
  TESSERA_DEVICE void wait_tile(int tile) {
    cp_async_wait<Traits::kStages - 2>();  // the group of `tile` (and Q) has landed
    // After this barrier: every thread finished computing tile - 1 (its stage and row table are
    // free) and resolved tile + kStages - 1.
    __syncthreads();
    current = tile;
    if constexpr (!Traits::kLoadsBehindMma) {
      copy(tile + Traits::kStages - 1);
      kv.resolve(tile + Traits::kStages);
    }
    if constexpr (kWarpDequantize) {
      kv.template dequantize<true, Traits::kWarpColsKV, kWarpSize>(read.stage, k_tile(), v_tile(), warp_col0, lane);
      __syncwarp();  // the warp's rows are complete before its lanes read them
    } else if constexpr (Traits::kDequantizeKV) {
      kv.template dequantize<false, Traits::CTA_TILE_KV, Traits::kThreads>(read.stage, k_tile(), v_tile(), 0,
                                                                            static_cast<int>(threadIdx.x));
      __syncthreads();  // the T tiles are complete before any warp reads them
    }
  }

  /// fp8 KV with folded scales: K's scale on the logits, V's on the output (else 1).
  TESSERA_DEVICE float logits_factor() const { return kv.logits_factor(); }
  TESSERA_DEVICE float output_factor() const { return kv.output_factor(); }

  // The tiles the MMAs read: the stage's, or fp8 KV's one dequantized pair.
  TESSERA_DEVICE int tile_stage() const { return Traits::kDequantizeKV ? 0 : read.stage; }
  TESSERA_DEVICE T* k_tile() const { return smem.k + tile_stage() * kTileElems; }  // [CTA_TILE_KV][kSmemRowChunks * 8]
  TESSERA_DEVICE T* v_tile() const { return smem.v + tile_stage() * kTileElems; }  // [CTA_TILE_KV][kSmemRowChunks * 8]

  /// MMA: S = Q K^T for this warp's rows and columns (Q from the mainloop's fragment addresses),
  /// then (kLoadsBehindMma) the copies wait_tile allowed. The interface's P V lag
  /// (mainloop_sm90.cuh) does not apply: P V runs in its own tile.
  template <bool kIssuePreviousPv, typename IssuePreviousPv>
  TESSERA_DEVICE void qk(float (&s)[kMmaQ][kN8KV][4], const T* /*q_tile*/, IssuePreviousPv&&) {
    static_assert(!kIssuePreviousPv, "the sm80 mainloop issues P V in its own tile");
    constexpr int kChains = Traits::kQkChains;
    const uint32_t k_frag = smem_addr(k_tile()) + k_frag_offset;
    // Partial S of the k16 steps kd % kChains == c + 1 (kQkChains, traits.cuh); chain 0 is s.
    float s_more[kChains > 1 ? kChains - 1 : 1][kMmaQ][kN8KV][4];  // [chain - 1][m16 tile][n8 tile of KV][fragment]
    zero_fragments(s);
#pragma unroll
    for (int c = 0; c + 1 < kChains; ++c) zero_fragments(s_more[c]);
#pragma unroll
    for (int kd = 0; kd < Traits::kMmaD; ++kd) {
      float(&acc)[kMmaQ][kN8KV][4] = kd % kChains == 0 ? s : s_more[kd % kChains - 1];  // unrolled: a constant choice
      uint32_t a[kMmaQ][4];  // [m16 tile][A fragment]
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) ldmatrix_x4(a[mq], (q_frag ^ (kd << 5)) + mq * 16 * kRowBytes);
#pragma unroll
      for (int nk = 0; nk < kN8KV / 2; ++nk) {
        uint32_t b[4];  // b0, b1 of n8 tile 2nk, then of 2nk+1
        ldmatrix_x4(b, (k_frag ^ (kd << 5)) + nk * 16 * kRowBytes);
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) mma_m16n8k16_pair<T>(acc[mq][2 * nk], acc[mq][2 * nk + 1], a[mq], b);
      }
    }
    if constexpr (Traits::kLoadsBehindMma) copy(current + Traits::kStages - 1);
    if constexpr (kChains > 1) {
#pragma unroll
      for (int c = 0; c + 1 < kChains; ++c)
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
          for (int n = 0; n < kN8KV; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) s[mq][n][i] += s_more[c][mq][n][i];
    }
  }

  /// MMA: O += P V of the current tile, P as A fragments, synchronously (the variant's value
  /// transform ran with the other operand transforms).
  template <typename Applier>
  TESSERA_DEVICE void issue_pv(float (&o)[kMmaQ][kN8D][4], const uint32_t (&pfrag)[kMmaQ][Traits::kMmaKV][4],
                               int /*v_tile_index*/, const Applier&) const {
    const uint32_t v_frag = smem_addr(v_tile()) + v_frag_offset;
#pragma unroll
    for (int kk = 0; kk < Traits::kMmaKV; ++kk) {
#pragma unroll
      for (int nd = 0; nd < kN8D / 2; ++nd) {
        uint32_t b[4];  // b0, b1 of D tile 2nd, then of 2nd+1
        ldmatrix_x4_trans(b, (v_frag ^ (nd << 5)) + kk * 16 * kRowBytes);
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) mma_m16n8k16_pair<T>(o[mq][2 * nd], o[mq][2 * nd + 1], pfrag[mq][kk], b);
      }
    }
  }

  /// P V completed in issue_pv.
  TESSERA_DEVICE void complete_pv(float (&)[kMmaQ][kN8D][4], const uint32_t (&)[kMmaQ][Traits::kMmaKV][4],
                                  float) const {}
  /// With kLoadsBehindMma, resolves the row table of tile + kStages after the P V MMAs were
  /// issued; the next tile's barrier publishes it.
  TESSERA_DEVICE void tile_done() {
    if constexpr (Traits::kLoadsBehindMma) kv.resolve(current + Traits::kStages);
    read.advance();
  }
  /// After the work item's last tile: no copy outlives the item (the copies past its last tile
  /// are empty groups).
  TESSERA_DEVICE void finish() const { cp_async_wait<0>(); }

 private:
  /// Copies `tile` (when it exists) into the fill stage; commits a group either way, so the wait
  /// count always refers to the tile about to be computed.
  TESSERA_DEVICE void copy(int tile) {
    if (tile < kv.count()) kv.copy(tile, fill.stage);
    cp_async_commit();
    fill.advance();
  }
};

}  // namespace kernels
}  // namespace tessera
