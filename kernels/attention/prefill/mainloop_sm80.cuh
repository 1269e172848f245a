// The sm80 mainloop of the prefill tile (every GPU from sm_80): every warp loads (cp.async into a
// kStages ring, one CTA barrier per KV tile) and computes with mma.sync m16n8k16 fed by ldmatrix
// from swizzled shared memory.
//
// fp8 KV (Traits::kDequantizeKV): the ring holds the stored bytes. Decode tiles with the default
// variant (kConvertFragments) load K and V fragments from it with ldmatrix and convert them in
// registers, and run their MMAs in f16 whatever q's type (fp8 -> f16 is exact; a bf16 query tile
// is rescaled by a power of two into f16's range once per work item, and the factor folded into
// the logits' scale). ldmatrix hands out 16-bit units, i.e. pairs of fp8 elements, so the
// fragments come in permuted orders, which the kernel absorbs instead of shuffling every tile:
// - K, non-transposed: lane (g, t) gets head-dim elements 4t..4t+3 of a 16-element chunk, where
//   an MMA's B fragment holds 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1). Any permutation of the
//   head dim applied to both Q and K leaves Q K^T unchanged, so the Q tile is stored with each
//   16-element chunk permuted the same way (prepare_query_tile) and read as before.
// - V, transposed: lane (g, t) gets elements 2g, 2g + 1 of rows 2t and 2t + 1; split into the
//   even and the odd element, each is the B fragment of an n8 tile whose columns are the chunk's
//   even or odd head-dim elements. The accumulators of O then hold each lane's four consecutive
//   elements of a chunk across two n8 tiles; restore_output_layout moves them to the standard
//   fragment layout once, after the last tile.
// Elsewhere the stage is dequantized into the one T tile pair the MMAs read after a tile's
// barrier: with one warp of query rows (each warp reads only its own KV rows) and no variant
// transforming K or V across rows, each warp converts its rows and a __syncwarp publishes them;
// otherwise every thread converts a share and a second CTA barrier publishes the tiles. The raw
// stage of tile t - 1 and the T tiles are free by then (their last readers, the dequantization and
// the MMAs of tile t - 1, precede the first barrier).
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
  static constexpr uint32_t kRowBytes = Traits::kSmemRowChunks * 16;    // a stored Q or K row (SwizzledTile)
  static constexpr uint32_t kVRowBytes = Traits::kVSmemRowChunks * 16;  // a stored V row
  using Source = KVTileSource<Traits, kFormat, Variant, Params>;
  static constexpr bool kConvertFragments = Traits::kConvertFragments && Source::kFoldScales;
  static constexpr bool kWarpDequantize = Traits::kDequantizeKV && Traits::NUM_WARPS_Q == 1 && !kConvertFragments &&
                                          !Variant::kHasKeyTransform && !Variant::kHasValueTransform;
  // The MMAs' operand type: the tiles', or f16 for converted fp8 fragments (and so for P).
  using MmaT = Conditional<kConvertFragments, __half, T>;
  using PType = MmaT;
  using RawTile = typename Traits::RawTile;
  static constexpr uint32_t kRawRowBytes = Traits::HEAD_DIM;  // a stored fp8 row

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
  // kConvertFragments: K and V fragments of the raw ring, for both: rows warp_col0 + lane % 8 +
  // 8 * ((lane / 8) % 2), chunk XOR lane / 16 (two k16 steps of K, two chunks of V per x4 load).
  uint32_t raw_frag_offset = 0;
  int warp_col0;           // the warp's first KV row of each tile (kWarpDequantize converts its rows)
  int lane;
  T* q_tile;               // kConvertFragments rewrites it once per work item (prepare_query_tile)
  float q_factor = 1.f;    // ... and the power of two it scaled it by, folded into the logits' scale

  TESSERA_DEVICE Sm80Mainloop(const PrefillSmem<Traits>& smem_, Source& kv_, T* q_tile_,
                              const FragmentCoords<Traits>& c)
      : smem(smem_), kv(kv_), warp_col0(c.warp_col0), lane(c.lane), q_tile(q_tile_) {
    const uint32_t lane_chunk_lo = static_cast<uint32_t>(((lane / 16) ^ (lane % 8)) << 4);        // half = lane / 16
    const uint32_t lane_chunk_mid = static_cast<uint32_t>((((lane / 8) % 2) ^ (lane % 8)) << 4);  // half = (lane / 8) % 2
    const uint32_t frag_row = (lane % 8) + 8 * ((lane / 8) % 2);  // row of an A (Q, P) or V^T fragment
    q_frag = smem_addr(q_tile) + (c.warp_q * Traits::kWarpRowsQ + frag_row) * kRowBytes + lane_chunk_lo;
    k_frag_offset = (c.warp_col0 + (lane % 8) + 8 * (lane / 16)) * kRowBytes + lane_chunk_mid;
    v_frag_offset = (c.warp_col0 + frag_row) * kVRowBytes + lane_chunk_lo;
    if constexpr (kConvertFragments) {
      const int raw_row = c.warp_col0 + static_cast<int>(frag_row);
      raw_frag_offset = raw_row * kRawRowBytes + static_cast<uint32_t>(((lane / 16) ^ RawTile::swizzle(raw_row)) << 4);
    }
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
      tile_sync<Traits>();
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
    tile_sync<Traits>();
    current = tile;
    if constexpr (!Traits::kLoadsBehindMma) {
      copy(tile + Traits::kStages - 1);
      kv.resolve(tile + Traits::kStages);
    }
    if constexpr (kConvertFragments) {
      if (tile == 0) prepare_query_tile();
    } else if constexpr (kWarpDequantize) {
      kv.template dequantize<true, Traits::kWarpColsKV, kWarpSize>(read.stage, k_tile(), v_tile(), warp_col0, lane);
      __syncwarp();  // the warp's rows are complete before its lanes read them
    } else if constexpr (Traits::kDequantizeKV) {
      kv.template dequantize<false, Traits::CTA_TILE_KV, Traits::kThreads>(read.stage, k_tile(), v_tile(), 0,
                                                                            tile_thread<Traits>());
      tile_sync<Traits>();  // the T tiles are complete before any warp reads them
    }
  }

  /// fp8 KV with folded scales: K's scale (and the query tile's, kConvertFragments) on the
  /// logits, V's on the output (else 1).
  TESSERA_DEVICE float logits_factor() const {
    return kConvertFragments ? kv.logits_factor() * q_factor : kv.logits_factor();
  }
  TESSERA_DEVICE float output_factor() const { return kv.output_factor(); }

  // The tiles the MMAs read: the stage's, or fp8 KV's one dequantized pair.
  TESSERA_DEVICE int tile_stage() const { return Traits::kDequantizeKV ? 0 : read.stage; }
  TESSERA_DEVICE T* k_tile() const { return smem.k + tile_stage() * Traits::kKTileElems; }  // [CTA_TILE_KV][kSmemRowChunks * 8]
  TESSERA_DEVICE T* v_tile() const { return smem.v + tile_stage() * Traits::kVTileElems; }  // [CTA_TILE_KV][kVSmemRowChunks * 8]
  // fp8 KV: the raw stage being computed, [CTA_TILE_KV][HEAD_DIM] bytes each (Traits::RawTile).
  TESSERA_DEVICE uint32_t raw_k_stage() const { return smem_addr(smem.raw_k + read.stage * Traits::kRawTileBytes); }
  TESSERA_DEVICE uint32_t raw_v_stage() const { return smem_addr(smem.raw_v + read.stage * Traits::kRawTileBytes); }

  /// MMA: S = Q K^T for this warp's rows and columns (Q from the mainloop's fragment addresses),
  /// then (kLoadsBehindMma) the copies wait_tile allowed. The interface's P V lag
  /// (mainloop_sm90.cuh) does not apply: P V runs in its own tile.
  template <bool kIssuePreviousPv, typename IssuePreviousPv>
  TESSERA_DEVICE void qk(float (&s)[kMmaQ][kN8KV][4], const T* /*q_tile*/, IssuePreviousPv&&) {
    static_assert(!kIssuePreviousPv, "the sm80 mainloop issues P V in its own tile");
    if constexpr (kConvertFragments) {
      qk_converted(s);
      return;
    }
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
  template <bool kHalf, typename Applier>
  TESSERA_DEVICE void issue_pv(float (&o)[kMmaQ][kN8D][4], const uint32_t (&pfrag)[kMmaQ][Traits::kMmaKV][4],
                               int /*v_tile_index*/, const Applier&) const {
    static_assert(!kHalf, "whole tiles (Traits::kHalfKvTiles is the wgmma tiles')");
    if constexpr (kConvertFragments) {
      pv_converted(o, pfrag);
      return;
    }
    const uint32_t v_frag = smem_addr(v_tile()) + v_frag_offset;
#pragma unroll
    for (int kk = 0; kk < Traits::kMmaKV; ++kk) {
#pragma unroll
      for (int nd = 0; nd < kN8D / 2; ++nd) {
        uint32_t b[4];  // b0, b1 of D tile 2nd, then of 2nd+1
        ldmatrix_x4_trans(b, (v_frag ^ (nd << 5)) + kk * 16 * kVRowBytes);
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
  /// are empty groups), and O's accumulators are in the standard fragment layout.
  TESSERA_DEVICE void finish(float (&o)[kMmaQ][kN8D][4]) const {
    cp_async_wait<0>();
    if constexpr (kConvertFragments) restore_output_layout(o);
  }
  /// After the epilogue: nothing to release (the next tile's barrier orders the Q buffer's reuse).
  TESSERA_DEVICE void release_q(bool /*bulk_stores*/) const {}
  TESSERA_DEVICE void release_stored_q() const {}

 private:
  using F8 = typename Traits::KVStorage;

  /// kConvertFragments: S = Q K^T with K's fragments converted from the raw stage. Each x4 load
  /// covers two n8 tiles of KV rows by two k16 steps; its registers are (tile 0, step 0),
  /// (tile 1, step 0), (tile 0, step 1), (tile 1, step 1), each a whole B fragment once converted.
  TESSERA_DEVICE void qk_converted(float (&s)[kMmaQ][kN8KV][4]) {
    constexpr int kChains = Traits::kQkChains;
    static_assert(kChains <= 2, "the two k16 steps of a load feed two chains at most");
    const uint32_t k_frag = raw_k_stage() + raw_frag_offset;
    float s_odd[kChains > 1 ? kMmaQ : 1][kN8KV][4];  // [m16 tile][n8 tile of KV][fragment]: odd k16 steps
    zero_fragments(s);
    if constexpr (kChains > 1) zero_fragments(s_odd);
#pragma unroll
    for (int kd2 = 0; kd2 < Traits::kMmaD / 2; ++kd2) {
      uint32_t a[2][kMmaQ][4];  // [k16 step of the pair][m16 tile][A fragment]
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) ldmatrix_x4(a[h][mq], (q_frag ^ ((2 * kd2 + h) << 5)) + mq * 16 * kRowBytes);
#pragma unroll
      for (int nk = 0; nk < kN8KV / 2; ++nk) {
        uint32_t raw[4];  // [k16 step of the pair * 2 + n8 tile of the pair]: 4 fp8 elements
        ldmatrix_x4(raw, (k_frag ^ (kd2 << 5)) + nk * 16 * kRawRowBytes);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float(&acc)[kMmaQ][kN8KV][4] = (kChains > 1 && h == 1) ? s_odd : s;  // unrolled: a constant choice
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            uint32_t b0, b1;
            fp8x4_to_half2x2<F8>(raw[2 * h + n], b0, b1);
#pragma unroll
            for (int mq = 0; mq < kMmaQ; ++mq) mma_m16n8k16<MmaT>(acc[mq][2 * nk + n], a[h][mq], b0, b1);
          }
        }
      }
    }
    if constexpr (Traits::kLoadsBehindMma) copy(current + Traits::kStages - 1);
    if constexpr (kChains > 1) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int n = 0; n < kN8KV; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) s[mq][n][i] += s_odd[mq][n][i];
    }
  }

  /// kConvertFragments: O += P V with V's fragments converted from the raw stage. Each x4.trans
  /// load covers 16 KV rows by two 16-element chunks of the head dim; a register (8 rows of one
  /// chunk) splits into the even and odd elements' B fragments: O's n8 tile 2c holds chunk c's
  /// even elements, 2c + 1 its odd ones (restore_output_layout).
  TESSERA_DEVICE void pv_converted(float (&o)[kMmaQ][kN8D][4],
                                   const uint32_t (&pfrag)[kMmaQ][Traits::kMmaKV][4]) const {
    const uint32_t v_frag = raw_v_stage() + raw_frag_offset;
#pragma unroll
    for (int kk = 0; kk < Traits::kMmaKV; ++kk) {
#pragma unroll
      for (int cp = 0; cp < Traits::kRawRowChunks / 2; ++cp) {
        uint32_t raw[4];  // [chunk of the pair * 2 + row half]: 2 x 2 fp8 elements
        ldmatrix_x4_trans(raw, (v_frag ^ (cp << 5)) + kk * 16 * kRawRowBytes);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t even0, odd0, even1, odd1;  // rows 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1)
          fp8x4_to_half2x2_columns<F8>(raw[2 * h], even0, odd0);
          fp8x4_to_half2x2_columns<F8>(raw[2 * h + 1], even1, odd1);
          const int c = 2 * cp + h;
#pragma unroll
          for (int mq = 0; mq < kMmaQ; ++mq) {
            mma_m16n8k16<MmaT>(o[mq][2 * c], pfrag[mq][kk], even0, even1);
            mma_m16n8k16<MmaT>(o[mq][2 * c + 1], pfrag[mq][kk], odd0, odd1);
          }
        }
      }
    }
  }

  /// kConvertFragments, once per work item after Q has landed: rewrites the query tile as the
  /// converted K fragments need it. Each 16-element chunk pair (x0..x15) is stored as x0 x1 x4 x5
  /// x8 x9 x12 x13 | x2 x3 x6 x7 x10 x11 x14 x15 (the even then the odd 32-bit pairs), so the
  /// A fragment's k = 2t, 2t + 1 and 2t + 8, 2t + 9 are elements 4t..4t+3, as in K's fragments.
  /// A bf16 tile becomes f16 scaled by 2^-k, k the exponent of its largest magnitude minus 14 (so
  /// every element stays below 2^15, and those more than 2^24 below the largest, which move the
  /// logits by less than f16's rounding of the largest, are what flushes); q_factor = 2^k.
  TESSERA_DEVICE void prepare_query_tile() {
    using Tile = typename Traits::template SmemTile<Traits::CTA_TILE_Q>;
    constexpr int kPairsPerRow = Traits::HEAD_DIM / 16;  // 16-element chunk pairs of a row
    constexpr int kPairs = Traits::CTA_TILE_Q * kPairsPerRow;
    constexpr bool kRescale = !kSameType<T, __half>;
    const int tid = tile_thread<Traits>();
    float q_scale = 1.f;
    if constexpr (kRescale) {
      // Every warp reads the whole tile (a few 16-byte loads per lane), so no warp's maximum
      // needs another's: one barrier then orders the reads before the rewrites.
      uint32_t max_bits = 0;  // |x| of bf16 x as integers order like the magnitudes
      for (int i = lane; i < Traits::CTA_TILE_Q * Traits::kRowChunks; i += kWarpSize) {
        const uint4 v = *reinterpret_cast<const uint4*>(q_tile + Tile::chunk_offset(i / Traits::kRowChunks,
                                                                                     i % Traits::kRowChunks) * 8);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) max_bits = max(max_bits, max(words[w] & 0x7FFFu, (words[w] >> 16) & 0x7FFFu));
      }
      max_bits = __reduce_max_sync(0xFFFFFFFFu, max_bits);
      const int exponent = static_cast<int>(max_bits >> 7) - 127;  // of the largest |x| (bf16: 8 exponent bits)
      const int k = max_bits == 0 ? 0 : max(exponent - 14, -126);  // <= 113
      q_scale = __int_as_float((127 - k) << 23);
      q_factor = __int_as_float((127 + k) << 23);
      tile_sync<Traits>();
    }
    for (int i = tid; i < kPairs; i += Traits::kThreads) {
      const int row = i / kPairsPerRow, pair = i % kPairsPerRow;
      T* lo_chunk = q_tile + Tile::chunk_offset(row, 2 * pair) * 8;
      T* hi_chunk = q_tile + Tile::chunk_offset(row, 2 * pair + 1) * 8;
      const uint4 lo = *reinterpret_cast<const uint4*>(lo_chunk), hi = *reinterpret_cast<const uint4*>(hi_chunk);
      uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};  // 32-bit pairs x0x1, x2x3, ...
      if constexpr (kRescale) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
          w[j] = pack_pair<__half>(f.x * q_scale, f.y * q_scale);
        }
      }
      *reinterpret_cast<uint4*>(lo_chunk) = make_uint4(w[0], w[2], w[4], w[6]);
      *reinterpret_cast<uint4*>(hi_chunk) = make_uint4(w[1], w[3], w[5], w[7]);
    }
    tile_sync<Traits>();  // the rewritten tile before any warp's ldmatrix
  }

  /// kConvertFragments: moves O from the converted V fragments' layout (lane t holds elements
  /// 4t + 2i + e of chunk c in tile 2c + e, slot i) to the standard one (elements 2t + j of tile
  /// 2c and 8 + 2t + j of tile 2c + 1, slot j): standard (f, j) is lane 2f + t / 2's (e = j,
  /// i = t % 2), fetched within the lane's quad.
  TESSERA_DEVICE void restore_output_layout(float (&o)[kMmaQ][kN8D][4]) const {
    const int t = lane % 4, quad = lane - t;
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int c = 0; c < kN8D / 2; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float out[2][2];  // [standard tile 2c + f][slot j]
#pragma unroll
          for (int f = 0; f < 2; ++f) {
            const int src = quad + 2 * f + t / 2;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const float i0 = __shfl_sync(0xFFFFFFFFu, o[mq][2 * c + j][2 * h], src);
              const float i1 = __shfl_sync(0xFFFFFFFFu, o[mq][2 * c + j][2 * h + 1], src);
              out[f][j] = t % 2 == 0 ? i0 : i1;
            }
          }
#pragma unroll
          for (int f = 0; f < 2; ++f)
#pragma unroll
            for (int j = 0; j < 2; ++j) o[mq][2 * c + f][2 * h + j] = out[f][j];
        }
  }

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
