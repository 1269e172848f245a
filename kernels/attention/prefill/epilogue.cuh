// The epilogue of the prefill tile: the row sums, the merge of the warps' states when warps split
// the KV tile (NUM_WARPS_KV > 1), and the store of each row either as the final output (with the
// variant's output transform and the base-2 LSE) or as an fp32 partial state for the split-KV
// contraction.
#pragma once

#include "kernels/attention/params.cuh"
#include "kernels/attention/prefill/kv_loader.cuh"
#include "kernels/attention/prefill/tile_softmax.cuh"
#include "kernels/attention/prefill/traits.cuh"
#include "kernels/attention/variants.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"

namespace tessera {
namespace kernels {

template <typename Traits, typename Variant, typename Softmax, typename Params>
struct PrefillEpilogue {
  static constexpr int kMmaQ = Traits::kMmaQ, kN8D = Traits::kN8D;
  using OT = typename Params::OType;  // the output's element type; the accumulators are fp32
  static_assert(sizeof(OT) == 2, "the stores pack two 16-bit outputs per 32-bit word (pack_pair)");
  const Params& p;
  const VariantParams& vp;
  const PrefillWork& w;
  const FragmentCoords<Traits>& c;
  const int batch;  // as the variant hooks see it

  /// Stores this thread's rows of O (fragments [m16 tile][n8 tile of D][4]) with the softmax
  /// state of its rows (finalized here). `smem` is free for the warps' merge; `q_tile`, the work
  /// item's Q buffer, for the warp-specialised tiles' staging of O (each warpgroup its own rows).
  /// Returns whether this thread issued bulk stores that may still read `q_tile`
  /// (Traits::kDeferQRelease: the mainloop's release_q defers the buffer's release).
  TESSERA_DEVICE bool store(float (&o)[kMmaQ][kN8D][4], Softmax& softmax, const PrefillSmem<Traits>& smem,
                            typename Traits::DType* q_tile) const {
    softmax.finalize();
    if constexpr (Traits::kTmaO) {
      if (w.out.partial_o == nullptr && p.o_tma.enabled != 0 &&
          w.packed_begin + Traits::CTA_TILE_Q <= w.e.qo_len * p.group_size) {
        return store_tile_tma(o, softmax, q_tile);
      }
    }
    if constexpr (Traits::NUM_WARPS_KV > 1) {
      merge_warps_and_store(o, softmax, smem);
    } else {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) store_fragment_row(o, softmax.row[mq][h], mq, h);
    }
    return false;
  }

 private:
  /// Final value of output element `dim` of query row qo_idx, head `head`, from its accumulator.
  TESSERA_DEVICE float final_value(float acc, float inv, int qo_idx, int head, int dim) const {
    const float value = acc * inv;
    if constexpr (Variant::kHasOutputTransform) {
      return Variant::output_transform(vp, w.e, value, batch, w.e.q_pos_offset + qo_idx, head, dim);
    }
    return value;
  }

  /// One row half (mq, h) of the fragments: 2 * kN8D elements per thread.
  TESSERA_DEVICE void store_fragment_row(const float (&o)[kMmaQ][kN8D][4], const SoftmaxStats<Exp2Fast>& st, int mq,
                                         int h) const {
    const int packed = c.packed_row(w.packed_begin, mq, h);
    const PackedRow r = unpack_row(p, w.kv_head, packed);
    const int qo_idx = r.qo_idx, head = r.head;
    if (qo_idx >= w.e.qo_len) return;
    const float inv = Softmax::normaliser(st);
    const float lse = Softmax::log_sum_exp(st);
    const int t = c.t;
    if (w.out.partial_o != nullptr) {
      const int row = packed - w.packed_begin;
      float* dst = w.out.partial_o + row * Traits::HEAD_DIM_VO + 2 * t;  // row of [CTA_TILE_Q][HEAD_DIM_VO]
#pragma unroll
      for (int n = 0; n < kN8D; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[mq][n][2 * h] * inv, o[mq][n][2 * h + 1] * inv);
      }
      if (t == 0) w.out.partial_lse[row] = lse;
      return;
    }
    OT* dst = p.o.data + static_cast<int64_t>(w.e.q_begin + qo_idx) * p.o.row_stride + head * p.o.head_stride + 2 * t;
#pragma unroll
    for (int n = 0; n < kN8D; ++n) {
      *reinterpret_cast<uint32_t*>(dst + n * 8) =
          pack_pair<OT>(final_value(o[mq][n][2 * h], inv, qo_idx, head, n * 8 + 2 * t),
                        final_value(o[mq][n][2 * h + 1], inv, qo_idx, head, n * 8 + 2 * t + 1));
    }
    if (p.o.lse != nullptr && t == 0) {
      p.o.lse[static_cast<int64_t>(w.e.q_begin + qo_idx) * p.o.lse_row_stride + head * p.o.lse_head_stride] = lse;
    }
  }

  /// A whole tile of the request's rows (Traits::kTmaO): each compute warpgroup writes its 64 rows
  /// of final values into its own rows of the Q buffer, in the layout a TMA load of them would
  /// write (its last Q K^T has completed; the other warpgroups read only their rows), and its
  /// first thread stores them with one bulk copy per column block. The Q buffer is released after
  /// the epilogue (the mainloop's release_q), that thread's release once its copies have read the
  /// rows: it waits here, or with Traits::kDeferQRelease under the next item's first Q K^T
  /// (release_stored_q; returns true for that thread). The LSE goes as in store_fragment_row.
  TESSERA_DEVICE bool store_tile_tma(const float (&o)[kMmaQ][kN8D][4], const Softmax& softmax,
                                     typename Traits::DType* q_tile) const {
    static_assert(Traits::kTmaO && kSameType<OT, typename Traits::DType> && kMmaQ == 1,
                  "16-bit O as wide as Q, a warpgroup of 16-row warps");
    using Tile = typename Traits::template SmemTile<Traits::CTA_TILE_Q>;  // [CTA_TILE_Q][HEAD_DIM], swizzled
    const uint32_t tile = smem_addr(q_tile);
    const int t = c.t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const SoftmaxStats<Exp2Fast>& st = softmax.row[0][h];
      const int packed = c.packed_row(w.packed_begin, 0, h);
      const PackedRow r = unpack_row(p, w.kv_head, packed);
      const float inv = Softmax::normaliser(st);
      const int row = packed - w.packed_begin;
#pragma unroll
      for (int n = 0; n < kN8D; ++n) {
        const uint32_t pair = pack_pair<OT>(final_value(o[0][n][2 * h], inv, r.qo_idx, r.head, n * 8 + 2 * t),
                                            final_value(o[0][n][2 * h + 1], inv, r.qo_idx, r.head, n * 8 + 2 * t + 1));
        st_shared_u32(tile + Tile::chunk_offset(row, n) * 16 + 4 * t, pair);
      }
      if (p.o.lse != nullptr && t == 0) {
        p.o.lse[static_cast<int64_t>(w.e.q_begin + r.qo_idx) * p.o.lse_row_stride + r.head * p.o.lse_head_stride] =
            Softmax::log_sum_exp(st);
      }
    }
    fence_proxy_async_shared();  // the stores above, before the bulk copies' (async-proxy) reads
    const int warpgroup = static_cast<int>(threadIdx.x) / (4 * kWarpSize);
    named_barrier_sync(kFirstEpilogueBarrier + warpgroup, 4 * kWarpSize);
    if (threadIdx.x % (4 * kWarpSize) == 0) {
      constexpr int kWarpgroupRows = 4 * Traits::kWarpRowsQ;  // 64
      const int first_query = w.e.q_begin + (w.packed_begin + warpgroup * kWarpgroupRows) / p.group_size;
#pragma unroll
      for (int blk = 0; blk < Traits::kSmemRowChunks / Tile::kAtomChunks; ++blk) {
        tma_store_4d(&p.o_tma.map, tile + blk * Tile::kBlockBytes + warpgroup * kWarpgroupRows * Tile::kRowBytes,
                     blk * Tile::kAtomChunks * Traits::kChunkElems, 0, first_query, w.kv_head);
      }
      tma_store_commit();
      if constexpr (!Traits::kDeferQRelease) tma_store_wait_read<0>();
      return Traits::kDeferQRelease;
    }
    return false;
  }

  /// Each warp saw a different slice of every KV tile: the warps' states of the same rows are
  /// merged through shared memory (PrefillSmem::merge), then every thread stores 8 elements of a row.
  TESSERA_DEVICE void merge_warps_and_store(const float (&o)[kMmaQ][kN8D][4], const Softmax& softmax,
                                            const PrefillSmem<Traits>& smem) const {
    constexpr int kRows = Traits::kWarpRowsQ;
    tile_sync<Traits>();
    constexpr int D = Traits::HEAD_DIM_VO;
    float* merge_o = smem.merge;                             // [kNumWarps][kRows][D]
    float* merge_md = merge_o + Traits::kNumWarps * kRows * D;  // [kNumWarps][kRows][2]
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = mq * 16 + c.g + 8 * h;
#pragma unroll
        for (int n = 0; n < kN8D; ++n) {
          float* dst = merge_o + (c.warp * kRows + row) * D + n * 8 + 2 * c.t;
          dst[0] = o[mq][n][2 * h];
          dst[1] = o[mq][n][2 * h + 1];
        }
        if (c.t == 0) {
          merge_md[(c.warp * kRows + row) * 2] = softmax.row[mq][h].m;
          merge_md[(c.warp * kRows + row) * 2 + 1] = softmax.row[mq][h].d;
        }
      }
    tile_sync<Traits>();
    // All threads now combine: thread -> (row, 8-element column group).
    constexpr int kGroups = kRows * D / 8;
    for (int i = tile_thread<Traits>(); i < kGroups; i += Traits::kComputeThreads) {
      const int row = i / (D / 8), c0 = (i % (D / 8)) * 8;
      PartialStateSum<8> sum;  // the warps' states, in warp order
#pragma unroll
      for (int wp = 0; wp < Traits::kNumWarps; ++wp) sum.add_max(merge_md[(wp * kRows + row) * 2]);
#pragma unroll
      for (int wp = 0; wp < Traits::kNumWarps; ++wp) {
        const float* src = merge_o + (wp * kRows + row) * D + c0;  // [8]
        sum.add(merge_md[(wp * kRows + row) * 2], merge_md[(wp * kRows + row) * 2 + 1], [&](int j) { return src[j]; });
      }
      const PackedRow r = unpack_row(p, w.kv_head, w.packed_begin + row);
      if (r.qo_idx >= w.e.qo_len) continue;
      const float inv = Softmax::kSoftmaxOn ? sum.inv_sum() : 1.f;
      const float lse = Softmax::kSoftmaxOn ? sum.lse() : NAN;
      if (w.out.partial_o != nullptr) {
        float* dst = w.out.partial_o + row * D + c0;  // [8] of [CTA_TILE_Q][D]
        const float* acc = sum.acc;
        *reinterpret_cast<float4*>(dst) = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
        *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
        if (c0 == 0) w.out.partial_lse[row] = lse;
        continue;
      }
      uint32_t packed_out[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        packed_out[j] = pack_pair<OT>(final_value(sum.acc[2 * j], inv, r.qo_idx, r.head, c0 + 2 * j),
                                      final_value(sum.acc[2 * j + 1], inv, r.qo_idx, r.head, c0 + 2 * j + 1));
      }
      OT* dst =
          p.o.data + static_cast<int64_t>(w.e.q_begin + r.qo_idx) * p.o.row_stride + r.head * p.o.head_stride + c0;
      *reinterpret_cast<uint4*>(dst) = make_uint4(packed_out[0], packed_out[1], packed_out[2], packed_out[3]);
      if (p.o.lse != nullptr && c0 == 0) {
        p.o.lse[static_cast<int64_t>(w.e.q_begin + r.qo_idx) * p.o.lse_row_stride + r.head * p.o.lse_head_stride] = lse;
      }
    }
  }
};

}  // namespace kernels
}  // namespace tessera
