// Attention variants (docs/design.md §1.2). A variant is a struct of static hooks the kernel templates
// call; the kernels know nothing else about masking or logit transforms:
//
//   kUseSoftmax                  false: the transformed logits are the weights (no max, no sum)
//   kHasQueryTransform ...       which hooks do something (the kernels skip the others' passes)
//   query_transform / key_transform / value_transform (vp, e, pair, batch, qo_pos, kv_idx,
//                                qo_head, kv_head, dim) -> float2: elements dim and dim + D/2
//   logits_transform(vp, e, x, batch, qo_pos, kv_idx, qo_head, kv_head) -> float: x is q.k times
//                                logits_input_scale (natural units: sm_scale), the result times
//                                logits_output_scale is the natural-unit logit (softmax variants)
//   logits_input_scale(vp, sm_scale), logits_output_scale(vp) -> float: sm_scale and 1 unless a
//                                built-in variant folds its own scales into the kernel's (soft-cap)
//   kLinearKeyBias, logits_key_slope(vp, qo_head) -> float: when set, logits_transform(x) is
//                                exactly x + logits_key_slope * (kv_idx - qo_pos), so a kernel
//                                whose tile holds consecutive keys may add it as a per-row term
//                                and per-column constants instead of calling logits_transform;
//                                such a bias peaks at the diagonal, so kernels visit the nearest
//                                keys first (the softmax max then rarely moves)
//   kBoundedLogits, logits_exponent_bound(vp) -> float: when set, every transformed logit times
//                                log2(e) * logits_output_scale lies within +-bound (soft-cap's
//                                tanh), so a kernel may use a fixed softmax reference of 0
//                                instead of a running max where 2^+-bound is representable
//   logits_mask(vp, e, batch, qo_pos, kv_idx, qo_head, kv_head) -> bool (causal is p.causal, the
//                                custom mask the kernel's own: kCustomMask)
//   output_transform(vp, e, value, batch, qo_pos, qo_head, dim) -> float
//   visible_span(vp, q_pos_first, q_pos_last, kv_first, kv_end) -> KVSpan: the KV positions any of
//                                the rows may see, so whole tiles outside it are never loaded
//   tile_unmasked(vp, q_pos_first, q_pos_last, kv_begin, kv_last) -> bool: every pair of the tile
//                                passes logits_mask (a custom mask aside), so its evaluation is
//                                skipped
//   custom_mask_shows_all(vp, e, batch, qo_pos, kv_begin, count) -> bool: the custom mask (if any)
//                                shows the row every key of [kv_begin, kv_begin + count), read as
//                                the mask's packed bytes (a kernel tests whole tiles with it)
//
// `e` is the request's extent (qo_len, kv_len: a custom mask needs the row width). Every variant
// kernel takes one VariantParams block by value: the built-in variants' fields and the slots of a
// user variant's extra parameters, one layout for the host (src/variant), the prebuilt kernels and
// the JIT-generated ones.
//
// The default variant is BuiltinVariant<0>. Built-in features are bits of its template argument
// and compose: masks AND together, logit transforms apply ALiBi, then soft-cap, then sigmoid.
// JIT-generated user variants derive from a BuiltinVariant and chain their hooks after its own;
// with user hooks they derive from BuiltinVariant<features, false>, whose
// logits_transform returns natural units (no folded scales) for the user's hook to take.
#pragma once

#include "kernels/attention/custom_mask.cuh"
#include "kernels/attention/params.cuh"
#include "kernels/attention/variant_params.cuh"
#include "kernels/common/math.cuh"

namespace tessera {
namespace kernels {

namespace detail {

constexpr float kLog2eF = 1.4426950408889634f;

TESSERA_DEVICE float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// Rotation angle per position unit of frequency index `i` (0 <= i < head_dim / 2).
TESSERA_DEVICE float rope_frequency(const VariantParams& vp, int i, int head_dim) {
  float freq = exp2f(-vp.rope_log2_theta * (2.f * static_cast<float>(i) / static_cast<float>(head_dim)));
  if (vp.rope_kind == static_cast<int32_t>(RopeKind::kLlama31)) {
    const float wavelen = 6.283185307179586f / freq;
    if (wavelen > vp.llama31_low_freq_wavelen) {
      freq = freq / vp.llama31_factor;
    } else if (wavelen >= vp.llama31_high_freq_wavelen) {
      const float smooth = vp.llama31_smooth_scale / wavelen - vp.llama31_smooth_bias;
      freq = (1.f - smooth) * freq / vp.llama31_factor + smooth * freq;
    }
  }
  return freq;
}

/// Non-interleaved rotation of the pair (x[dim], x[dim + D/2]) at `position`.
TESSERA_DEVICE float2 rope_rotate(const VariantParams& vp, float2 x, int position, int dim, int head_dim) {
  const float angle = static_cast<float>(position) * vp.rope_rcp_scale * rope_frequency(vp, dim, head_dim);
  float s, c;
  sincosf(angle, &s, &c);
  return make_float2(x.x * c - x.y * s, x.y * c + x.x * s);
}

}  // namespace detail

template <uint32_t kFeatures, bool kFoldScales = true>
struct BuiltinVariant {
  static constexpr uint32_t kBuiltinFeatures = kFeatures;
  static constexpr bool kWindow = (kFeatures & feature::kWindow) != 0;
  static constexpr bool kSinks = (kFeatures & feature::kSinks) != 0;
  static constexpr bool kSoftCap = (kFeatures & feature::kSoftCap) != 0;
  static constexpr bool kAlibi = (kFeatures & feature::kAlibi) != 0;
  static constexpr bool kSigmoid = (kFeatures & feature::kSigmoid) != 0;
  static constexpr bool kCustomMask = (kFeatures & feature::kCustomMask) != 0;
  static constexpr bool kRope = (kFeatures & feature::kRope) != 0;
  static_assert(!kSinks || kWindow, "attention sinks extend a sliding window");
  // With softmax (sigmoid needs natural units), soft-cap and ALiBi hand their constant factors to
  // the kernel's own multiplies: the scale of q.k before the transform (logits_input_scale) and
  // the base-2 exponent's scale after it (logits_output_scale). Per logit that leaves ALiBi one
  // FADD and one FFMA on raw q.k (its slope divided by sm_scale per row), and soft-cap one FMUL
  // and the tanh, instead of 3 and 3 FP32 instructions (SASS).
  static constexpr bool kFold = kFoldScales && !kSigmoid && (kSoftCap || kAlibi);

  static constexpr bool kUseSoftmax = !kSigmoid;
  static constexpr bool kHasQueryTransform = kRope;
  static constexpr bool kHasKeyTransform = kRope;
  static constexpr bool kHasValueTransform = false;
  static constexpr bool kHasLogitsTransform = kSoftCap || kAlibi || kSigmoid;
  // The custom mask is not logits_mask's: kernels read its bits themselves (kCustomMask), a row
  // of a tile at a time rather than a logit at a time (QuadMaskRow in custom_mask.cuh).
  static constexpr bool kHasMask = kWindow;
  static constexpr bool kHasOutputTransform = false;
  // Whether the logits hooks read RequestExtent::padding_row (user variants' Request does).
  static constexpr bool kReadsPaddingRow = false;

  static TESSERA_DEVICE float2 query_transform(const VariantParams& vp, const RequestExtent&, float2 x, int batch,
                                               int qo_pos, int /*kv_idx*/, int /*qo_head*/, int /*kv_head*/, int dim,
                                               int head_dim) {
    if constexpr (kRope) {
      const int offset = vp.rope_q_offset != nullptr ? vp.rope_q_offset[batch] : 0;
      return detail::rope_rotate(vp, x, qo_pos + offset, dim, head_dim);
    }
    return x;
  }
  static TESSERA_DEVICE float2 key_transform(const VariantParams& vp, const RequestExtent&, float2 x, int batch,
                                             int /*qo_pos*/, int kv_idx, int /*qo_head*/, int /*kv_head*/, int dim,
                                             int head_dim) {
    if constexpr (kRope) {
      const int offset = vp.rope_k_offset != nullptr ? vp.rope_k_offset[batch] : 0;
      return detail::rope_rotate(vp, x, kv_idx + offset, dim, head_dim);
    }
    return x;
  }
  static TESSERA_DEVICE float2 value_transform(const VariantParams&, const RequestExtent&, float2 x, int, int, int,
                                               int, int, int, int) {
    return x;
  }

  // Folded units: ALiBi adds its bias to raw q.k, so the sum is natural / sm_scale; soft-cap
  // (without ALiBi) takes q.k * sm_scale / cap directly; a capped result is tanh(natural / cap).
  static TESSERA_DEVICE float logits_input_scale(const VariantParams& vp, float sm_scale) {
    if constexpr (kFold && kAlibi) return 1.f;
    if constexpr (kFold) return sm_scale * vp.inv_soft_cap;
    return sm_scale;
  }
  static TESSERA_DEVICE float logits_output_scale(const VariantParams& vp) {
    if constexpr (kFold && kSoftCap) return vp.soft_cap;
    if constexpr (kFold) return vp.sm_scale;
    return 1.f;
  }

  // ALiBi alone is a bias linear in the key: slope * (kv_idx - qo_pos), folded units.
  static constexpr bool kLinearKeyBias = kFold && kAlibi && !kSoftCap;
  static TESSERA_DEVICE float logits_key_slope(const VariantParams& vp, int qo_head) {
    return vp.alibi_slopes[qo_head] * fast_rcp(vp.sm_scale);
  }

  // Folded soft-cap (ALiBi, if any, comes before the tanh) gives tanh(...) * cap: at most cap in
  // magnitude, so base-2 exponents stay within +-cap * log2(e). Unfolded (user hooks chained
  // after it), nothing bounds the result.
  static constexpr bool kBoundedLogits = kFold && kSoftCap;
  static TESSERA_DEVICE float logits_exponent_bound(const VariantParams& vp) { return vp.soft_cap * detail::kLog2eF; }

  static TESSERA_DEVICE float logits_transform(const VariantParams& vp, const RequestExtent&, float x, int /*batch*/,
                                               int qo_pos, int kv_idx, int qo_head, int /*kv_head*/) {
    // float(kv_idx) - float(qo_pos) rather than float(kv_idx - qo_pos): the kernel's unrolled loop
    // then converts each column's key and each row's position once (CSE) instead of once per
    // logit (I2F issues at a quarter rate). Exact while positions stay below 2^24.
    if constexpr (kAlibi) {
      const float slope = kFold ? vp.alibi_slopes[qo_head] * fast_rcp(vp.sm_scale) : vp.alibi_slopes[qo_head];
      x = fmaf(slope, static_cast<float>(kv_idx) - static_cast<float>(qo_pos), x);
    }
    if constexpr (kFold && kSoftCap) {
      x = detail::tanh_approx(kAlibi ? x * (vp.sm_scale * vp.inv_soft_cap) : x);  // times logits_output_scale
    } else if constexpr (kSoftCap) {
      x = vp.soft_cap * detail::tanh_approx(x * vp.inv_soft_cap);
    }
    // Approximate exp2 and reciprocal (MUFU): their ~2^-22 relative error is far below the
    // 16-bit P the weights are rounded to.
    // e^-(x + bias) as one FFMA and the exp2.
    if constexpr (kSigmoid) x = fast_rcp(1.f + fast_exp2(fmaf(x, -detail::kLog2eF, -vp.sigmoid_bias * detail::kLog2eF)));
    return x;
  }

  static TESSERA_DEVICE bool logits_mask(const VariantParams& vp, const RequestExtent& /*e*/, int /*batch*/,
                                         int qo_pos, int kv_idx, int /*qo_head*/, int /*kv_head*/) {
    bool visible = true;
    if constexpr (kWindow) {
      visible = kv_idx >= qo_pos - vp.window_left;
      if constexpr (kSinks) visible = visible || kv_idx < vp.num_sink_tokens;
    }
    return visible;
  }

  static TESSERA_DEVICE float output_transform(const VariantParams&, const RequestExtent&, float value, int, int, int,
                                               int) {
    return value;
  }

  static TESSERA_DEVICE KVSpan visible_span(const VariantParams& vp, int q_pos_first, int /*q_pos_last*/,
                                            int kv_first, int kv_end) {
    KVSpan s{kv_first, kv_first, kv_first, kv_end};
    if constexpr (kWindow) {
      // The tile's first row sees the window's lowest keys; nothing before them (but sinks).
      const int lo = max(kv_first, q_pos_first - vp.window_left);
      s.begin = min(lo, kv_end);
      if constexpr (kSinks) s.seg0_end = max(kv_first, min(min(vp.num_sink_tokens, s.begin), kv_end));
    }
    return s;
  }

  static TESSERA_DEVICE bool tile_unmasked(const VariantParams& vp, int /*q_pos_first*/, int q_pos_last,
                                           int kv_begin, int /*kv_last*/) {
    if constexpr (kWindow) return kv_begin >= q_pos_last - vp.window_left;
    return true;
  }

  static TESSERA_DEVICE bool custom_mask_shows_all(const VariantParams& vp, const RequestExtent& e, int batch,
                                                   int qo_pos, int kv_begin, int count) {
    if constexpr (kCustomMask) {
      const int64_t first = static_cast<int64_t>(qo_pos - e.q_pos_offset) * e.kv_len + kv_begin;
      return packed_bits_all(vp.custom_mask + vp.custom_mask_indptr[batch], first, first + count);
    }
    return true;
  }
};

using DefaultVariant = BuiltinVariant<0>;

}  // namespace kernels
}  // namespace tessera
