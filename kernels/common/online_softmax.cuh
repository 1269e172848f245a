// The online softmax of every attention kernel, in base 2 (docs/design.md §2). A row's state is a
// reference max m, the sum d = sum 2^(s - m) and the weighted sum of values acc = sum 2^(s - m) v;
// folding logits or whole states in one at a time never revisits earlier ones. The same type
// serves the prefill tiles (whose values live in MMA fragments: statistics only), decode (logits
// of a few rows at a time), the state merges and the split-KV contraction (whole states, in index
// order, which fixes the floating-point result).
//
// The reference m need not be the true max: the prefill tile moves it only when a logit exceeds
// it by more than a slack (kStaleMaxSlack), which keeps weights <= 2^slack and makes the rescale
// of O rare; O / d and m + log2(d) do not depend on the reference used. Bounded logits
// (soft-cap) may use a fixed reference of 0 (zero_reference) and never rescale.
#pragma once

#include "kernels/common/math.cuh"
#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// Base-2 exponentials: exp2f (decode, merges: few per byte moved, full range) or one MUFU.EX2
/// (the prefill tiles, whose arguments are <= slack; flushes denormal results).
struct Exp2Exact {
  static TESSERA_DEVICE float apply(float x) { return exp2f(x); }
};
struct Exp2Fast {
  static TESSERA_DEVICE float apply(float x) { return fast_exp2(x); }
};

/// How far (base 2) a row's logits may exceed the reference max before the reference moves and
/// the accumulator is rescaled: weights stay <= 2^8 = 256.
constexpr float kStaleMaxSlack = 8.f;

/// Largest base-2 exponent bound for which a fixed reference of 0 is exact enough: weights in
/// [2^-64, 2^64] are normal in fp32 and bf16 (not fp16), and the sum stays below 2^96 for any KV
/// length that fits an int32.
constexpr float kZeroReferenceMaxExponent = 64.f;

/// The statistics of one softmax row.
template <typename Exp2 = Exp2Exact>
struct SoftmaxStats {
  float m = -INFINITY;  // reference max of the base-2 logits folded so far (-inf: none yet)
  float d = 0.f;        // sum of 2^(s - m)

  /// Starts empty, or with a fixed reference of 0 (bounded logits).
  TESSERA_DEVICE void reset(bool zero_reference) {
    m = zero_reference ? 0.f : -INFINITY;
    d = 0.f;
  }
  /// The reference a row with logits up to `row_max` uses: unchanged while row_max stays within
  /// kStaleMaxSlack of it (exact: every weight <= 2^slack), else row_max.
  TESSERA_DEVICE float stale_reference(float row_max) const { return row_max > m + kStaleMaxSlack ? row_max : m; }
  /// Moves the reference to `reference`; returns the factor by which the weights and weighted
  /// values folded so far must be multiplied (d is left to add_weights, which fuses it).
  TESSERA_DEVICE float move_reference(float reference) {
    const float rescale = Exp2::apply(m - exponent_base(reference));
    m = reference;
    return rescale;
  }
  /// d <- d * rescale + weights, where weights = sum 2^(s - exponent_base(m)) of the new logits.
  TESSERA_DEVICE void add_weights(float rescale, float weights) { d = d * rescale + weights; }
  /// The exponent base of a reference: all logits so far masked (-inf) keeps every weight exactly
  /// 0 (2^(-inf - 0)) rather than NaN (2^(-inf + inf)).
  static TESSERA_DEVICE float exponent_base(float reference) { return reference == -INFINITY ? 0.f : reference; }

  /// 1 / d, or 0 for an empty row.
  TESSERA_DEVICE float inv_sum() const { return d > 0.f ? 1.f / d : 0.f; }
  /// log2(sum 2^s), or -inf for an empty row.
  TESSERA_DEVICE float lse() const { return d > 0.f ? m + log2f(d) : -INFINITY; }
};

/// A row's statistics and this thread's N elements of the weighted sum of values.
template <int N, typename Exp2 = Exp2Exact>
struct OnlineSoftmax : SoftmaxStats<Exp2> {
  using SoftmaxStats<Exp2>::m;
  using SoftmaxStats<Exp2>::d;
  float acc[N];  // [N] sum of 2^(s - m) * v

  TESSERA_DEVICE OnlineSoftmax() {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0.f;
  }

  /// Folds R logits s[r] (base 2; masked: -inf with a finite value) with values value(r, i). The
  /// accumulator is rescaled only when the max grows, which after the first rows is rare.
  template <int R, typename Value>
  TESSERA_DEVICE void fold_logits(const float (&s)[R], Value&& value) {
    float m_new = m;
#pragma unroll
    for (int r = 0; r < R; ++r) m_new = fmaxf(m_new, s[r]);
    if (m_new == -INFINITY) return;  // only masked rows so far: 2^(-inf - -inf) would be NaN
    if (m_new > m) {
      const float scale = Exp2::apply(m - m_new);  // 0 on the first valid row
      d *= scale;
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] *= scale;
      m = m_new;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float w = Exp2::apply(s[r] - m);
      d += w;
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] = fmaf(w, value(r, i), acc[i]);
    }
  }

  /// Folds a normalised state (lse s, value v): the merge of attention states. An empty state
  /// (s = -inf) carries no weight and is skipped, which also keeps 2^(-inf - -inf) = NaN out.
  TESSERA_DEVICE void fold_state(float s, const float (&v)[N]) {
    if (s == -INFINITY) return;
    const float m_new = fmaxf(m, s);
    const float scale_old = Exp2::apply(m - m_new);  // 0 on the first fold (m = -inf)
    const float w = Exp2::apply(s - m_new);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = acc[i] * scale_old + w * v[i];
    d = d * scale_old + w;
    m = m_new;
  }

  /// The merged value element i; 0 for an empty row.
  TESSERA_DEVICE float value(int i) const { return d > 0.f ? acc[i] / d : 0.f; }
};

/// Combines unnormalised partial states of one row held by several parties (warps, row slots):
/// first every party's max (add_max), then every party's (m, d, acc) (add), in a fixed order.
template <int N, typename Exp2 = Exp2Exact>
struct PartialStateSum {
  float m = -INFINITY;  // max of the parties' references
  float d = 0.f;
  float acc[N];  // [N]

  TESSERA_DEVICE PartialStateSum() {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0.f;
  }
  TESSERA_DEVICE void add_max(float m_part) { m = fmaxf(m, m_part); }
  /// Folds a party's state; every party's max must have been added first. Returns its weight.
  template <typename Acc>
  TESSERA_DEVICE float add(float m_part, float d_part, Acc&& acc_part) {
    const float w = Exp2::apply(m_part - SoftmaxStats<Exp2>::exponent_base(m));
    d = fmaf(d_part, w, d);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = fmaf(acc_part(i), w, acc[i]);
    return w;
  }
  TESSERA_DEVICE float inv_sum() const { return d > 0.f ? 1.f / d : 0.f; }
  TESSERA_DEVICE float lse() const { return d > 0.f ? m + log2f(d) : -INFINITY; }
};

}  // namespace kernels
}  // namespace tessera
