// Basic definitions shared by every kernel header. Kernel headers compile under nvcc and NVRTC,
// so they include no host-only headers: integer types come from libcu++.
#pragma once

#include <cuda/std/cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// NVRTC has no <math.h>; kernels use INFINITY only in device code.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

#define TESSERA_DEVICE __device__ __forceinline__
#define TESSERA_HOST_DEVICE __host__ __device__ __forceinline__

namespace tessera {
namespace kernels {

using int32_t = cuda::std::int32_t;
using int64_t = cuda::std::int64_t;
using uint32_t = cuda::std::uint32_t;
using uint64_t = cuda::std::uint64_t;
using uint8_t = cuda::std::uint8_t;

constexpr int kWarpSize = 32;

/// Shared memory of one SM, for launch bounds derived from a kernel's shared memory: sm_90's
/// 228 KB, sm_80's and sm_87's 164 KB, 100 KB elsewhere (sm_86, sm_89). The device passes see
/// their architecture's; the host pass (which never launches by it) sees sm_90's.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kSmemPerSmBytes = (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 870) ? 167936 : 102400;
#else
constexpr int kSmemPerSmBytes = 233472;
#endif

/// A compile-time flag as a type, to instantiate a device lambda's body per value
/// (`[&](auto flag) { if constexpr (decltype(flag)::value) ... }`).
template <bool kValue>
struct BoolConstant {
  static constexpr bool value = kValue;
};

/// True when A and B are the same type (static_asserts on element types; NVRTC compiles these
/// headers, so no host <type_traits>).
template <typename A, typename B>
inline constexpr bool kSameType = false;
template <typename A>
inline constexpr bool kSameType<A, A> = true;

/// A if kCondition, else B (std::conditional_t, for the same reason).
template <bool kCondition, typename A, typename B>
struct ConditionalType {
  using type = A;
};
template <typename A, typename B>
struct ConditionalType<false, A, B> {
  using type = B;
};
template <bool kCondition, typename A, typename B>
using Conditional = typename ConditionalType<kCondition, A, B>::type;

template <typename T>
TESSERA_HOST_DEVICE constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace kernels
}  // namespace tessera
