// 16-byte vectors: the unit of every global-memory load and store in the memory-bound kernels.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

constexpr int kVecBytes = 16;

/// Elements of T in one 16-byte vector.
template <typename T>
TESSERA_HOST_DEVICE constexpr int vec_elems() {
  return kVecBytes / static_cast<int>(sizeof(T));
}

/// One 16-byte vector of T; the address must be 16-byte aligned.
template <typename T>
struct alignas(kVecBytes) Vec {
  static constexpr int kElems = vec_elems<T>();
  T data[kElems];  // [kElems]

  TESSERA_DEVICE void load(const T* ptr) { *reinterpret_cast<uint4*>(data) = *reinterpret_cast<const uint4*>(ptr); }
  /// Streaming load: data read once should not displace what other CTAs reuse from L2.
  TESSERA_DEVICE void load_stream(const T* ptr) {
    *reinterpret_cast<uint4*>(data) = __ldcs(reinterpret_cast<const uint4*>(ptr));
  }
  TESSERA_DEVICE void store(T* ptr) const { *reinterpret_cast<uint4*>(ptr) = *reinterpret_cast<const uint4*>(data); }
  TESSERA_DEVICE void store_stream(T* ptr) const {
    __stcs(reinterpret_cast<uint4*>(ptr), *reinterpret_cast<const uint4*>(data));
  }
};

TESSERA_DEVICE float to_float(float x) { return x; }
TESSERA_DEVICE float to_float(__half x) { return __half2float(x); }
TESSERA_DEVICE float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/// 16-bit types with fp32's exponent range: scaling by a normal float never overflows or flushes.
template <typename T>
struct HasFloatRange : BoolConstant<false> {};
template <>
struct HasFloatRange<__nv_bfloat16> : BoolConstant<true> {};

template <typename T>
TESSERA_DEVICE T from_float(float x);
template <>
TESSERA_DEVICE float from_float<float>(float x) { return x; }
template <>
TESSERA_DEVICE __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
TESSERA_DEVICE __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

}  // namespace kernels
}  // namespace tessera
