// fp8 (e4m3, e5m2) storage for the KV cache: conversions between 16 stored elements (one 16-byte
// vector) and the 16-bit types the MMAs take, and the dequantization scales of K and V.
//
// Every fp8 value is exactly representable in f16 (e4m3: 3 mantissa bits, |x| <= 448, smallest
// subnormal 2^-9; e5m2 is f16 with its low 8 mantissa bits dropped), so fp8 -> f16 -> fp32 is
// exact and the only rounding of a dequantized element is the final one, x * scale to T.
#pragma once

#include <cuda_fp8.h>

#include "kernels/common/platform.cuh"
#include "kernels/common/vec.cuh"

namespace tessera {
namespace kernels {

template <typename T>
struct IsFp8 : BoolConstant<false> {};
template <>
struct IsFp8<__nv_fp8_e4m3> : BoolConstant<true> {};
template <>
struct IsFp8<__nv_fp8_e5m2> : BoolConstant<true> {};

template <typename T>
constexpr __nv_fp8_interpretation_t fp8_interpretation() {
  return kSameType<T, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
}

/// Two stored fp8 elements (the low byte first) as fp32.
template <typename F8>
TESSERA_DEVICE float2 fp8x2_to_float2(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), fp8_interpretation<F8>());
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

/// Two fp32 values as stored fp8 elements (the first in the low byte), rounded to nearest and
/// saturated to the largest finite value (NaN stays NaN).
template <typename F8>
TESSERA_DEVICE uint16_t float2_to_fp8x2(float a, float b) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, fp8_interpretation<F8>()));
}

/// Four fp32 values as fp8 elements of one word (a in the low byte), rounded to nearest and
/// saturated: an fp8 MMA operand (FP8 attention's P). Two cvt on sm_89+.
template <typename F8>
TESSERA_DEVICE uint32_t float4_to_fp8x4(float a, float b, float c, float d) {
  static_assert(IsFp8<F8>::value, "fp8 storage");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t word;
  // cvt's first source lands in the upper byte of each pair.
  if constexpr (kSameType<F8, __nv_fp8_e4m3>) {
    asm("{\n .reg .b16 l, h;\n cvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n"
        " mov.b32 %0, {l, h};\n}\n"
        : "=r"(word)
        : "f"(a), "f"(b), "f"(c), "f"(d));
  } else {
    asm("{\n .reg .b16 l, h;\n cvt.rn.satfinite.e5m2x2.f32 l, %2, %1;\n cvt.rn.satfinite.e5m2x2.f32 h, %4, %3;\n"
        " mov.b32 %0, {l, h};\n}\n"
        : "=r"(word)
        : "f"(a), "f"(b), "f"(c), "f"(d));
  }
  return word;
#else
  return static_cast<uint32_t>(float2_to_fp8x2<F8>(a, b)) | (static_cast<uint32_t>(float2_to_fp8x2<F8>(c, d)) << 16);
#endif
}

/// 16 stored fp8 elements (one 16-byte vector), times `scale` when kScaled, as two 16-byte
/// vectors of T: out[0] holds elements 0-7, out[1] elements 8-15. Unscaled into f16 the
/// conversion is exact (one cvt per pair on sm_89+).
template <typename F8, bool kScaled, typename T>
TESSERA_DEVICE void dequantize_vec16(const uint4& raw, float scale, Vec<T> (&out)[2]) {
  static_assert(IsFp8<F8>::value && sizeof(T) == 2, "fp8 into f16 or bf16");
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint16_t pair = static_cast<uint16_t>(words[w] >> (16 * h));
      const int e = 4 * w + 2 * h;  // element index in the 16
      if constexpr (!kScaled && kSameType<T, __half>) {
        const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), fp8_interpretation<F8>());
        const __half2 h2 = *reinterpret_cast<const __half2*>(&r);
        out[e / 8].data[e % 8] = __low2half(h2);
        out[e / 8].data[e % 8 + 1] = __high2half(h2);
      } else {
        const float2 f = fp8x2_to_float2<F8>(pair);
        out[e / 8].data[e % 8] = from_float<T>(kScaled ? f.x * scale : f.x);
        out[e / 8].data[e % 8 + 1] = from_float<T>(kScaled ? f.y * scale : f.y);
      }
    }
  }
}

/// Four stored fp8 elements (a 32-bit word, element 0 in the low byte) as two f16 pairs, the
/// register form of MMA operands: lo = (e0, e1), hi = (e2, e3). Exact (one cvt per pair).
template <typename F8>
TESSERA_DEVICE void fp8x4_to_half2x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
  static_assert(IsFp8<F8>::value, "fp8 storage");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The halves as 16-bit operands of the cvt (no extraction instructions).
  if constexpr (kSameType<F8, __nv_fp8_e4m3>) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(word));
  } else {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e5m2x2 %0, l;\n cvt.rn.f16x2.e5m2x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(word));
  }
#else
  const __half2_raw l = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xFFFFu), fp8_interpretation<F8>());
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), fp8_interpretation<F8>());
  lo = static_cast<uint32_t>(l.x) | (static_cast<uint32_t>(l.y) << 16);
  hi = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#endif
}

/// Four stored fp8 elements as two pairs of T (f16 or bf16), exact either way (an fp8 value has at
/// most 4 significant bits and an exponent inside both types' ranges): lo = (e0, e1), hi = (e2,
/// e3). Into bf16 through f32: sm_90 has no direct fp8 -> bf16x2 cvt.
template <typename F8, typename T>
TESSERA_DEVICE void fp8x4_to_pairs(uint32_t word, uint32_t& lo, uint32_t& hi) {
  static_assert(sizeof(T) == 2, "f16 or bf16 pairs");
  fp8x4_to_half2x2<F8>(word, lo, hi);
  if constexpr (!kSameType<T, __half>) {
    const auto to_bf16x2 = [](uint32_t h2) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
      return *reinterpret_cast<const uint32_t*>(&b);
    };
    lo = to_bf16x2(lo);
    hi = to_bf16x2(hi);
  }
}

/// The same for a word holding two elements of each of two rows (e0, e1 of row a, then e0, e1
/// of row b, as ldmatrix.trans delivers 16-bit units of fp8 data): even = (a0, b0), odd =
/// (a1, b1), the column pairs across the two rows.
template <typename F8>
TESSERA_DEVICE void fp8x4_to_half2x2_columns(uint32_t word, uint32_t& even, uint32_t& odd) {
  fp8x4_to_half2x2<F8>(__byte_perm(word, 0u, 0x3120u), even, odd);  // bytes a0 b0 a1 b1
}

/// The dequantization scales of an fp8 KV cache (tessera::KVScales): K's scale for KV head h is
/// k * k_device[h * k_device_stride] when k_device is set (stride 0: one scale for the tensor,
/// 1: one per KV head), else k; V's likewise, and (FP8 attention, fp8 queries) q's, one per KV
/// head shared by the group's query heads. Read in the kernels, so a CUDA Graph replays with the
/// device values of replay time.
struct KVScaleParams {
  float k;
  float v;
  const float* k_device;  // [1] or [num_kv_heads], or nullptr
  const float* v_device;  // [1] or [num_kv_heads], or nullptr
  int32_t k_device_stride;
  int32_t v_device_stride;
  float q;                // FP8 attention only
  const float* q_device;  // [1] or [num_kv_heads], or nullptr
  int32_t q_device_stride;

  TESSERA_DEVICE float k_scale(int kv_head) const {
    return k_device != nullptr ? k * k_device[kv_head * k_device_stride] : k;
  }
  TESSERA_DEVICE float v_scale(int kv_head) const {
    return v_device != nullptr ? v * v_device[kv_head * v_device_stride] : v;
  }
  TESSERA_DEVICE float q_scale(int kv_head) const {
    return q_device != nullptr ? q * q_device[kv_head * q_device_stride] : q;
  }
};

}  // namespace kernels
}  // namespace tessera
