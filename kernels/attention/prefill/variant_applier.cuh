// The variant applier of the prefill tile: the variant's query/key/value transforms on the
// shared-memory operands, its logits transform and masks on the S fragments, and the tile-level
// decisions that let most tiles skip them (docs/design.md §1.2 for the hooks).
#pragma once

#include "kernels/attention/params.cuh"
#include "kernels/attention/prefill/kv_loader.cuh"
#include "kernels/attention/prefill/traits.cuh"
#include "kernels/attention/variants.cuh"
#include "kernels/common/math.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/vec.cuh"

namespace tessera {
namespace kernels {

/// Applies a pair transform in place to the rows of a swizzled [ROWS][D] tile (layout Tile, D =
/// ROW_CHUNKS * 8 elements of data): each step takes chunk c < ROW_CHUNKS / 2 of a row and its
/// partner c + ROW_CHUNKS / 2, so f(row, dim, (x[dim], x[dim + D / 2])) sees both halves a
/// rotation needs. f returns false for a row it leaves alone (missing, padding), else updates the
/// pair.
template <typename Traits, typename Tile, int ROWS, int ROW_CHUNKS, typename T, typename F>
TESSERA_DEVICE void transform_tile_pairs(T* tile, F&& f) {
  constexpr int kHalf = ROW_CHUNKS / 2;
  for (int i = tile_thread<Traits>(); i < ROWS * kHalf; i += Traits::kComputeThreads) {
    const int row = i / kHalf, c = i % kHalf;
    uint4* lo_ptr = reinterpret_cast<uint4*>(tile + Tile::chunk_offset(row, c) * 8);
    uint4* hi_ptr = reinterpret_cast<uint4*>(tile + Tile::chunk_offset(row, c + kHalf) * 8);
    uint4 lo = *lo_ptr, hi = *hi_ptr;
    T* l = reinterpret_cast<T*>(&lo);  // [8]
    T* h = reinterpret_cast<T*>(&hi);  // [8]
    bool changed = false;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float2 x = make_float2(to_float(l[j]), to_float(h[j]));
      if (!f(row, c * 8 + j, x)) break;
      l[j] = from_float<T>(x.x);
      h[j] = from_float<T>(x.y);
      changed = true;
    }
    if (changed) {
      *lo_ptr = lo;
      *hi_ptr = hi;
    }
  }
}

template <typename Traits, KVFormatKind kFormat, typename Variant, typename Params>
struct VariantApplier {
  using QT = typename Params::QType;    // the query tile's elements
  using KVT = typename Traits::DType;  // the K/V tiles' elements as the MMAs read them (fp8 KV dequantized), and P's
  static constexpr int kMmaQ = Traits::kMmaQ, kN8KV = Traits::kN8KV;
  static constexpr bool kSoftmax = Variant::kUseSoftmax;
  static constexpr bool kTransformLogits = Variant::kHasLogitsTransform || !kSoftmax;
  // Logits-transforming variants take q.k times their input scale. Softmax-free variants in bf16
  // take it in Q once per tile instead of in every logit (one FMUL per logit): bf16 keeps fp32's
  // exponent range, so q * scale cannot overflow or flush. The 16-bit rounding of q * scale
  // (2^-9 relative) moves each logit by ~1e-3 (natural units, D = 128): harmless to outputs, but
  // it moved softmax variants' LSE past the bf16 tolerance (tests/python, soft-cap with RoPE and a
  // window), so they keep the FMUL; so does fp16, which could flush small scaled elements.
  static constexpr bool kPrescaleQuery = !kSoftmax && HasFloatRange<QT>::value;
  // A bias linear in the key (ALiBi) over consecutive keys is split into a per-row term, added in
  // the exponent, and per-column constants: one FFMA per logit with an immediate instead of the
  // key's conversion, a subtraction and an FFMA. Block-sparse tiles hold consecutive keys when
  // they lie inside one column block (block widths a multiple of the tile's, FlexAttention's
  // 128); add_key_bias tells per tile and adds the whole bias per logit to the others.
  static constexpr bool kSplitKeyBias = Variant::kLinearKeyBias;
  // Bounded logits (soft-cap) in bf16 need no running max: with a fixed reference of 0 each tile
  // goes straight from S to the exponentials, without the max trees, the lanes' shuffles and the
  // rescale vote (the chain between the two MMA phases). fp16 P would flush small weights, and a
  // bound beyond kZeroReferenceMaxExponent (cap > 44) keeps the running max.
  static constexpr bool kMayUseZeroReference = kSoftmax && Variant::kBoundedLogits && HasFloatRange<KVT>::value;
  static_assert(!(Variant::kBoundedLogits && kSplitKeyBias), "the zero reference has no row bias");
  static constexpr bool kTransformsOperands = Variant::kHasQueryTransform || Variant::kHasKeyTransform ||
                                              Variant::kHasValueTransform || kPrescaleQuery;

  const Params& p;
  const VariantParams& vp;
  const PrefillWork& w;
  const FragmentCoords<Traits>& c;
  // The batch index the variant hooks see: block-sparse KV's "requests" are block rows, of one
  // sequence (batch 0) or of the request their segment names.
  const int batch;
  const float logits_input_scale;
  const bool zero_reference;
  // Query positions of the tile's first and last rows (for tile-level mask decisions).
  const int q_pos_first, q_pos_last;
  // Split key bias, per row and fixed for the work item: the slope and the key offset of the
  // thread's first column from the row's position (row bias = slope * (kv_begin + offset)), so a
  // tile adds one IADD, I2F and FMUL per row instead of the row's division, head and slope load.
  float key_slope[kMmaQ][2];     // [m16 tile][row half], folded units
  int32_t key_offset[kMmaQ][2];  // [m16 tile][row half]
  // Block-sparse: the row's entries whose blocks are flagged full and wholly exist, when they form
  // one run [full_lo, full_hi) (causal, windowed, dense and most document masks do); else
  // full_lo = full_hi = 0 and each tile tests its entries' flags (tile_needs_mask).
  int full_lo = 0, full_hi = 0;
  bool full_run = false;

  TESSERA_DEVICE VariantApplier(const Params& p_, const VariantParams& vp_, const PrefillWork& w_,
                                const FragmentCoords<Traits>& c_)
      : p(p_),
        vp(vp_),
        w(w_),
        c(c_),
        batch(kFormat == KVFormatKind::kBlockSparse ? w_.e.batch : w_.request),
        logits_input_scale(Variant::logits_input_scale(vp_, p_.sm_scale)),
        zero_reference(kMayUseZeroReference && Variant::logits_exponent_bound(vp_) <= kZeroReferenceMaxExponent),
        q_pos_first(w_.e.q_pos_offset + w_.packed_begin / p_.group_size),
        q_pos_last(w_.e.q_pos_offset +
                   min(w_.e.qo_len - 1, (w_.packed_begin + Traits::CTA_TILE_Q - 1) / p_.group_size)) {
    if constexpr (kSplitKeyBias) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const PackedRow r = thread_row(mq, h);
          key_slope[mq][h] = Variant::logits_key_slope(vp, r.head);
          key_offset[mq][h] = c.warp_col0 + 2 * c.t - hook_qo_pos(r);
        }
    }
    if constexpr (kFormat == KVFormatKind::kBlockSparse) find_full_run();
  }

  /// Block-sparse: finds the run of full entries of the work item's row, 32 entries per warp
  /// step (a ballot each), once per work item: each tile then compares its entries with it
  /// instead of reading their flags and ids (~40 instructions per warp and tile, measured by ncu:
  /// bench/results/LOG.md, session 39).
  TESSERA_DEVICE void find_full_run() {
    const BlockSparseKVParams<typename Params::IdType>& bs = p.block_sparse;
    if (bs.block_flags == nullptr) return;
    const int entries = bs.block_cols_div.div(w.e.kv_len);  // kv_len is whole blocks
    // (block + 1) * block_cols <= key_end, i.e. the block's columns all exist.
    const int whole_blocks = bs.block_cols_div.div(max(w.e.key_end, 0));
    const int lane = static_cast<int>(threadIdx.x % kWarpSize);
    int lo = entries, hi = 0, count = 0;
    for (int base = 0; base < entries; base += kWarpSize) {
      const int i = base + lane;
      bool full = false;
      if (i < entries) {
        const int32_t block = bs.indices[w.e.kv_begin + i];
        full = bs.block_flags[w.e.kv_begin + i] != 0 && block >= 0 && block < whole_blocks;
      }
      const uint32_t votes = __ballot_sync(0xffffffffu, full);
      if (votes != 0) {
        lo = min(lo, base + __ffs(votes) - 1);
        hi = max(hi, base + kWarpSize - __clz(votes));
        count += __popc(votes);
      }
    }
    full_run = count == 0 || count == hi - lo;  // none, or contiguous
    full_lo = full_run && count > 0 ? lo : 0;
    full_hi = full_run && count > 0 ? hi : 0;
  }

  /// The variant's value transform of a V tile (keys: its rows' keys, -1 for missing rows).
  TESSERA_DEVICE void transform_values(KVT* v_tile, const int32_t* keys) const {
    using VTile = typename Traits::template VSmemTile<Traits::CTA_TILE_KV>;
    transform_tile_pairs<Traits, VTile, Traits::CTA_TILE_KV, Traits::kVRowChunks>(v_tile, [&](int row, int dim, float2& x) {
      if (keys[row] < 0) return false;
      x = Variant::value_transform(vp, w.e, x, batch, -1, keys[row], -1, w.kv_head, dim, Traits::HEAD_DIM_VO);
      return true;
    });
  }

  /// The operand transforms in shared memory before any warp reads them: the query (once per
  /// work item, with the logits' input scale when kPrescaleQuery), the keys, and the values
  /// unless the mainloop transforms them itself when it issues P V (kValuesLater).
  template <bool kValuesLater>
  TESSERA_DEVICE void transform_operands(int tile, QT* q_tile, KVT* k_tile, KVT* v_tile, const int32_t* keys) const {
    if constexpr (kTransformsOperands) {
      if ((Variant::kHasQueryTransform || (kPrescaleQuery && logits_input_scale != 1.f)) && tile == 0) {
        using QTile = typename Traits::template SmemTile<Traits::CTA_TILE_Q>;
        transform_tile_pairs<Traits, QTile, Traits::CTA_TILE_Q, Traits::kRowChunks>(q_tile, [&](int row, int dim, float2& x) {
          const PackedRow r = unpack_row(p, w.kv_head, w.packed_begin + row);
          if (r.qo_idx >= w.e.qo_len) return false;
          if constexpr (Variant::kHasQueryTransform) {
            x = Variant::query_transform(vp, w.e, x, batch, w.e.q_pos_offset + r.qo_idx, -1, r.head, w.kv_head, dim,
                                         Traits::HEAD_DIM);
          }
          if constexpr (kPrescaleQuery) x = make_float2(x.x * logits_input_scale, x.y * logits_input_scale);
          return true;
        });
      }
      if constexpr (Variant::kHasKeyTransform) {
        using KTile = typename Traits::template SmemTile<Traits::CTA_TILE_KV>;
        transform_tile_pairs<Traits, KTile, Traits::CTA_TILE_KV, Traits::kRowChunks>(k_tile, [&](int row, int dim, float2& x) {
          if (keys[row] < 0) return false;
          x = Variant::key_transform(vp, w.e, x, batch, -1, keys[row], -1, w.kv_head, dim, Traits::HEAD_DIM);
          return true;
        });
      }
      if constexpr (Variant::kHasValueTransform && !kValuesLater) transform_values(v_tile, keys);
      if constexpr (Traits::kWgmma) fence_proxy_async_shared();
      compute_sync<Traits>();
    }
  }

  /// The thread's fragment row of m16 tile mq, half h (rows g and g + 8).
  TESSERA_DEVICE PackedRow thread_row(int mq, int h) const {
    return unpack_row(p, w.kv_head, c.packed_row(w.packed_begin, mq, h));
  }
  /// The query position the variant's hooks see for row r. Padding rows of the request's last
  /// query tile are never stored; the hooks see the last real row instead, so a custom mask or a
  /// user table indexed by the query never reads past its end (qo_len >= 1 here: a tile exists only
  /// for a non-empty request). Hooks that must tell them apart (side effects) read
  /// RequestExtent::padding_row.
  TESSERA_DEVICE int hook_qo_pos(const PackedRow& r) const { return w.e.q_pos_offset + min(r.qo_idx, w.e.qo_len - 1); }

  /// Whether some pair of the KV tile [kv_begin, kv_begin + CTA_TILE_KV) may be masked: rows past
  /// the tile's segment end, causal pairs, the variant's own mask, a custom mask's zero bits (as
  /// the runtime's mask tile list says, `cover`, or else per warp: its rows over its columns), or
  /// (block-sparse) a block that is not flagged full.
  TESSERA_DEVICE bool tile_needs_mask(int kv_begin, int kv_tile_end, MaskTileCover cover) const {
    bool needs = kv_begin + Traits::CTA_TILE_KV > kv_tile_end ||
                 (p.causal && kv_begin + Traits::CTA_TILE_KV - 1 > q_pos_first) ||
                 !Variant::tile_unmasked(vp, q_pos_first, q_pos_last, kv_begin, kv_begin + Traits::CTA_TILE_KV - 1);
    if constexpr (Variant::kCustomMask) {
      // Most tiles of a tree mask lie in the prefix every row sees: knowing a tile whole spares
      // the per-logit bit loads there. The runtime's lists say it for the CTA's rows; without
      // them each warp tests the mask's bytes of its rows, a chain of loads in front of the
      // tile's softmax that costs more than the test spares (bench/results/LOG.md). A quad's four
      // lanes share rows and split the warp's columns; the warp votes, so its lanes take one
      // branch (`needs` is uniform).
      if (cover != MaskTileCover::kUnknown) {
        needs = needs || cover == MaskTileCover::kPartial;
      } else if (!needs) {
        constexpr int kLaneCols = kN8KV * 8 / 4;
        bool shown = true;
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int qo_pos = hook_qo_pos(thread_row(mq, h));
            shown = shown && Variant::custom_mask_shows_all(vp, w.e, batch, qo_pos,
                                                            kv_begin + c.warp_col0 + c.t * kLaneCols, kLaneCols);
          }
        needs = !__all_sync(0xffffffffu, shown);
      }
    }
    if constexpr (kFormat == KVFormatKind::kBlockSparse) {
      // Listed blocks flagged full need no mask (the flags cover every mask in effect) as long as
      // every column exists: an out-of-range block id or the padded last block keeps its mask,
      // whatever its flag says, so missing columns never join the softmax.
      // Positions fill the listed blocks in order, so the tile's blocks are consecutive entries
      // from its first position's: one division per tile, and one entry for a tile inside a
      // block (FlexAttention's 128-wide blocks).
      const BlockSparseKVParams<typename Params::IdType>& bs = p.block_sparse;
      bool full = bs.block_flags != nullptr && kv_begin + Traits::CTA_TILE_KV <= kv_tile_end;
      if (full && full_run) {
        // Entries of the tile's first and last columns within the run of full entries.
        full = bs.block_cols_div.div(kv_begin) >= full_lo &&
               bs.block_cols_div.div(kv_begin + Traits::CTA_TILE_KV - 1) < full_hi;
      } else if (full) {
        const int first = bs.block_cols_div.div(kv_begin);
        int entry = w.e.kv_begin + first;
        for (int pos = first * bs.block_cols; full && pos < kv_begin + Traits::CTA_TILE_KV;
             pos += bs.block_cols, ++entry) {
          const int32_t block = bs.indices[entry];
          full = bs.block_flags[entry] != 0 && block >= 0 &&
                 static_cast<int64_t>(block + 1) * bs.block_cols <= w.e.key_end;
        }
      }
      needs = !full;
    }
    return needs;
  }

  /// The factor from S to base-2 exponents: sm_scale * log2(e), or, for logits the variant
  /// transformed (and scaled), its output scale in base 2; softmax-free variants' transformed
  /// logits are the weights themselves (scale 1).
  TESSERA_DEVICE float logits_scale() const {
    return kTransformLogits ? (kSoftmax ? detail::kLog2eF * Variant::logits_output_scale(vp) : 1.f) : p.sm_scale_log2;
  }

  /// Split key bias: adds slope * (column - the thread's first column) to S and returns in
  /// row_bias the rest, slope * (the thread's first key - qo_pos) in folded units, a per-lane term.
  /// kv_begin: the tile's first KV position; keys: its rows' keys (block-sparse: columns, -1 for
  /// missing rows).
  TESSERA_DEVICE void add_key_bias(float (&s)[kMmaQ][kN8KV][4], int kv_begin, const int32_t* keys,
                                   float (&row_bias)[kMmaQ][2]) const {
    if constexpr (kSplitKeyBias) {
      int first_key = kv_begin;
      if constexpr (kFormat == KVFormatKind::kBlockSparse) {
        // The tile's keys are consecutive when it lies inside one column block (uniform across
        // the CTA). A first row that is missing means the whole block is (its columns are a
        // prefix), and the mask removes every logit of the tile.
        const BlockSparseKVParams<typename Params::IdType>& bs = p.block_sparse;
        const int offset = bs.block_cols_div.mod(kv_begin, bs.block_cols_div.div(kv_begin));
        if (offset + Traits::CTA_TILE_KV > bs.block_cols) {
          add_key_bias_per_logit(s, keys, row_bias);
          return;
        }
        first_key = max(keys[0], 0);
      }
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float slope = key_slope[mq][h];
          // Exact: the integer difference converts once (positions < 2^24).
          row_bias[mq][h] = slope * static_cast<float>(first_key + key_offset[mq][h]);
#pragma unroll
          for (int n = 0; n < kN8KV; ++n) {
            // Column 0's offset is 0 (fmaf would still add slope * 0 to keep NaN semantics).
            if (n > 0) s[mq][n][2 * h] = fmaf(slope, static_cast<float>(n * 8), s[mq][n][2 * h]);
            s[mq][n][2 * h + 1] = fmaf(slope, static_cast<float>(n * 8 + 1), s[mq][n][2 * h + 1]);
          }
        }
    }
  }

  /// Block-sparse tiles across column blocks: the whole bias, slope * (key - qo_pos), on every
  /// logit, and no row term (missing rows' keys are -1; the mask removes them).
  TESSERA_DEVICE void add_key_bias_per_logit(float (&s)[kMmaQ][kN8KV][4], const int32_t* keys,
                                             float (&row_bias)[kMmaQ][2]) const {
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float slope = key_slope[mq][h];
        const int qo_pos = c.warp_col0 + 2 * c.t - key_offset[mq][h];
        row_bias[mq][h] = 0.f;
#pragma unroll
        for (int n = 0; n < kN8KV; ++n)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int key = keys[c.warp_col0 + n * 8 + 2 * c.t + j];
            s[mq][n][2 * h + j] = fmaf(slope, static_cast<float>(key - qo_pos), s[mq][n][2 * h + j]);
          }
      }
  }

  /// The logits transform and the masks, over S in place. One branch per tile around the
  /// per-element loop, which is instantiated twice, with and without the mask, so the unmasked
  /// tiles of a logits-transforming variant (nearly all of them) carry no per-logit mask
  /// predicates on the softmax's critical path.
  /// kv_begin: the tile's first KV position (its keys' positions follow it: custom masks take
  /// ragged and paged KV only).
  TESSERA_DEVICE void transform_and_mask(float (&s)[kMmaQ][kN8KV][4], const int32_t* keys, bool needs_mask,
                                         int kv_begin) const {
    if (needs_mask) {
      transform_and_mask_tile(s, keys, kv_begin, BoolConstant<true>{});
    } else if constexpr (kTransformLogits && !kSplitKeyBias) {
      transform_and_mask_tile(s, keys, kv_begin, BoolConstant<false>{});
    }
  }

 private:
  template <typename Masked>
  TESSERA_DEVICE void transform_and_mask_tile(float (&s)[kMmaQ][kN8KV][4], const int32_t* keys, int kv_begin,
                                              Masked) const {
    constexpr bool kMasked = Masked::value;
    constexpr bool kReadsCustomMask = kMasked && Variant::kCustomMask;
    static_assert(!Variant::kCustomMask || kFormat != KVFormatKind::kBlockSparse, "custom masks take ragged or paged KV");
    // The custom mask's bits of the thread's rows over the warp's columns (kN8KV * 8 bits a row),
    // read before the logits; without a custom mask, rows that show every key.
    Conditional<kReadsCustomMask, QuadMaskRow<kN8KV * 8>, ShowAllMaskRow> mask_rows[kMmaQ][2];  // [m16 tile][row half]
    if constexpr (kReadsCustomMask) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) mask_rows[mq][h] = custom_mask_row(hook_qo_pos(thread_row(mq, h)), kv_begin);
    }
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int n = 0; n < kN8KV; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = keys[c.warp_col0 + n * 8 + 2 * c.t + (i & 1)];
          const PackedRow r = thread_row(mq, i / 2);
          const int qo_pos = hook_qo_pos(r);
          const bool shown = mask_rows[mq][i / 2].shows(n, i & 1);
          if constexpr (Variant::kReadsPaddingRow) {
            RequestExtent e = w.e;
            e.padding_row = r.qo_idx >= w.e.qo_len;
            transform_and_mask_logit<kMasked>(s[mq][n][i], e, qo_pos, key, r.head, shown);
          } else {
            transform_and_mask_logit<kMasked>(s[mq][n][i], w.e, qo_pos, key, r.head, shown);
          }
        }
  }

  /// The custom mask's row qo_pos over the warp's columns of the tile at kv_begin.
  TESSERA_DEVICE QuadMaskRow<kN8KV * 8> custom_mask_row(int qo_pos, int kv_begin) const {
    const int64_t row_bit = static_cast<int64_t>(qo_pos - w.e.q_pos_offset) * w.e.kv_len;
    return QuadMaskRow<kN8KV * 8>(vp.custom_mask + vp.custom_mask_indptr[batch], row_bit + kv_begin + c.warp_col0,
                                  row_bit + w.e.kv_len, c.lane);
  }

  /// One logit of transform_and_mask_tile: the variant's transform, then the masks (custom_shown:
  /// the custom mask's bit, true without one).
  template <bool kMasked>
  TESSERA_DEVICE void transform_and_mask_logit(float& s, const RequestExtent& e, int qo_pos, int key, int qo_head,
                                               bool custom_shown) const {
    if constexpr (kTransformLogits && !kSplitKeyBias) {
      const float x = kPrescaleQuery ? s : s * logits_input_scale;
      s = Variant::logits_transform(vp, e, x, batch, qo_pos, key, qo_head, w.kv_head);
    }
    if constexpr (kMasked) {
      // 0 <= key < key_end in one unsigned compare (key_end >= 0; per row, hoisted).
      const int key_end = p.causal ? max(qo_pos + 1, 0) : 0x7fffffff;
      bool visible = static_cast<uint32_t>(key) < static_cast<uint32_t>(key_end) &&
                     (!Variant::kHasMask || Variant::logits_mask(vp, e, batch, qo_pos, key, qo_head, w.kv_head));
      // Only with a custom mask: `&& custom_shown` with a constant true changes other variants'
      // code (NVRTC's front end does not fold it away before the optimiser).
      if constexpr (Variant::kCustomMask) visible = visible && custom_shown;
      if (!visible) s = kSoftmax ? -INFINITY : 0.f;
    }
  }
};

}  // namespace kernels
}  // namespace tessera
