// Online merge of attention states (DESIGN.md §2) in base 2: a state is (v, s) with
// s = log2(sum 2^x). Folding states one at a time keeps a running maximum m, the running sum of
// weights d = sum 2^(s_i - m) and the weighted sum of values, so no state needs to be revisited.
// The fold order fixes the floating-point result: callers fold in index order for determinism.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

template <int N>
struct StateAccumulator {
  float m = -INFINITY;  // running max of the s_i folded so far
  float d = 0.f;        // sum_i 2^(s_i - m)
  float acc[N];         // [N] sum_i 2^(s_i - m) * v_i

  TESSERA_DEVICE StateAccumulator() {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0.f;
  }

  /// Folds one state. An empty state (s = -inf) carries no weight and is skipped, which also keeps
  /// 2^(-inf - -inf) = NaN out of the arithmetic.
  TESSERA_DEVICE void fold(float s, const float (&v)[N]) {
    if (s == -INFINITY) return;
    const float m_new = fmaxf(m, s);
    const float scale_old = exp2f(m - m_new);  // 0 on the first fold (m = -inf)
    const float w = exp2f(s - m_new);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = acc[i] * scale_old + w * v[i];
    d = d * scale_old + w;
    m = m_new;
  }

  /// The merged value; 0 for an empty merge.
  TESSERA_DEVICE float value(int i) const { return d > 0.f ? acc[i] / d : 0.f; }
  /// The merged log2-sum-exp; -inf for an empty merge.
  TESSERA_DEVICE float lse() const { return d > 0.f ? m + log2f(d) : -INFINITY; }
};

}  // namespace kernels
}  // namespace tessera
