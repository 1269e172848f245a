// The online softmax of the prefill tile over its S fragments: per row a SoftmaxStats
// (kernels/common/online_softmax.cuh) whose reference max moves only by more than the slack, the
// weights computed in place in S, and the O rescale voted once per tile.
#pragma once

#include "kernels/attention/prefill/traits.cuh"
#include "kernels/common/math.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// Folds tree[0 .. 2W) into tree[0] in halves (depth log2), combining with op. A template
/// recursion rather than a halving loop: the compiler left `for (w = N / 2; w >= 1; w /= 2)` rolled,
/// over local memory, at N = 16.
template <int W, typename Op>
TESSERA_DEVICE void fold_halves(float* tree, Op op) {
  if constexpr (W >= 1) {
#pragma unroll
    for (int n = 0; n < W; ++n) tree[n] = op(tree[n], tree[n + W]);
    fold_halves<W / 2>(tree, op);
  }
}

/// The softmax state of the rows this thread holds (rows g and g + 8 of each m16 tile), each
/// thread with a quarter of every row's terms until finalize() sums them. kSoftmax false
/// (sigmoid attention): S is used as it is and the statistics stay unused.
/// kMayUseZeroReference: the variant's logits are bounded, so the caller may ask for a fixed
/// reference of 0 (no max trees, shuffles or rescale); kSplitKeyBias: a per-row bias (the split
/// ALiBi term) is added in the exponent.
template <typename Traits, bool kSoftmax, bool kMayUseZeroReference, bool kSplitKeyBias>
struct TileSoftmax {
  static constexpr int kMmaQ = Traits::kMmaQ, kN8KV = Traits::kN8KV, kN8D = Traits::kN8D;
  using Stats = SoftmaxStats<Exp2Fast>;
  static constexpr bool kSoftmaxOn = kSoftmax;
  Stats row[kMmaQ][2];  // [m16 tile][row half]
  const bool zero_reference;

  TESSERA_DEVICE explicit TileSoftmax(bool zero_reference_) : zero_reference(zero_reference_) {
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) row[mq][h].reset(!kSoftmax || zero_reference);
  }

  /// Folds one KV tile's S (masked, transformed; scale: S to base-2 exponents; row_bias: the
  /// split key bias of each row) and turns S into the weights P in place. rescale[mq][h] is the
  /// factor O must be multiplied by; the return value says whether it is 1 for every row of
  /// this thread (the reference maxima have settled).
  TESSERA_DEVICE bool update(float (&s)[kMmaQ][kN8KV][4], float scale, const float (&row_bias)[kMmaQ][2],
                             float (&rescale)[kMmaQ][2]) {
    bool settled = true;
    if (kMayUseZeroReference && zero_reference) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) row[mq][h].d += exponentiate(s, mq, h, scale, BoolConstant<false>{}, 0.f);
    } else if constexpr (kSoftmax) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // Max and sum over the thread's 2 * kN8KV logits of the row as trees: depth log2, where
          // a running value made a serial chain of kN8KV dependent instructions, the latency
          // between the two MMA phases that 2 warps per scheduler cannot hide.
          float tree[kN8KV];  // [n8 tile], folded in halves
#pragma unroll
          for (int n = 0; n < kN8KV; ++n) tree[n] = fmaxf(s[mq][n][2 * h], s[mq][n][2 * h + 1]);
          fold_halves<kN8KV / 2>(tree, [](float a, float b) { return fmaxf(a, b); });
          // The row bias depends on the lane (its first column): added before the lanes combine.
          float raw_max = kSplitKeyBias ? tree[0] + row_bias[mq][h] : tree[0];
          raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 1));
          raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 2));
          Stats& st = row[mq][h];
          const float reference = st.stale_reference(raw_max * scale);
          const float base = Stats::exponent_base(reference);
          // The exponent of s is (s + row bias) * scale - base.
          const float shift = kSplitKeyBias ? fmaf(-row_bias[mq][h], scale, base) : base;
          rescale[mq][h] = st.move_reference(reference);
          settled = settled && rescale[mq][h] == 1.f;
          st.add_weights(rescale[mq][h], exponentiate(s, mq, h, scale, BoolConstant<true>{}, shift));
        }
    }
    return settled;
  }

  /// Multiplies O by the tile's rescale factors unless every lane's maxima settled (one warp vote:
  /// after the first tiles of a row no lane rescales).
  TESSERA_DEVICE void rescale_output(float (&o)[kMmaQ][kN8D][4], const float (&rescale)[kMmaQ][2],
                                     bool settled) const {
    if (kSoftmax && !(kMayUseZeroReference && zero_reference) && !__all_sync(0xffffffffu, settled)) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int n = 0; n < kN8D; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) o[mq][n][i] *= rescale[mq][i / 2];
    }
  }

  /// Row sums: each thread holds a quarter of every row's terms.
  TESSERA_DEVICE void finalize() {
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row[mq][h].d += __shfl_xor_sync(0xffffffffu, row[mq][h].d, 1);
        row[mq][h].d += __shfl_xor_sync(0xffffffffu, row[mq][h].d, 2);
      }
  }

  /// What the output is multiplied by and the row's LSE (after finalize). Softmax off: the sums
  /// are the output and there is no log-sum-exp.
  static TESSERA_DEVICE float normaliser(const Stats& st) { return !kSoftmax ? 1.f : st.inv_sum(); }
  static TESSERA_DEVICE float log_sum_exp(const Stats& st) { return !kSoftmax ? NAN : st.lse(); }

 private:
  /// The weights of row half (mq, h), p = 2^(s * scale - shift) in place, and their sum (a tree).
  /// Without a shift (the zero reference) one FMUL per logit rather than an FFMA with -0.
  template <typename HasShift>
  static TESSERA_DEVICE float exponentiate(float (&s)[kMmaQ][kN8KV][4], int mq, int h, float scale, HasShift,
                                           float shift) {
    float tree[kN8KV];  // [n8 tile], folded in halves
#pragma unroll
    for (int n = 0; n < kN8KV; ++n) {
#pragma unroll
      for (int i = 2 * h; i < 2 * h + 2; ++i) {
        s[mq][n][i] = fast_exp2(HasShift::value ? fmaf(s[mq][n][i], scale, -shift) : s[mq][n][i] * scale);
      }
      tree[n] = s[mq][n][2 * h] + s[mq][n][2 * h + 1];
    }
    fold_halves<kN8KV / 2>(tree, [](float a, float b) { return a + b; });
    return tree[0];
  }
};

}  // namespace kernels
}  // namespace tessera
