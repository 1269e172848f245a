// Fast math for the softmax: base-2 exponentials on the special-function unit.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// 2^x with one MUFU.EX2 (flushes denormal results to 0; exp2(-inf) = 0). exp2f adds range
/// handling that the softmax, whose arguments are <= 0, never needs.
TESSERA_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// 1 / x in one MUFU instruction (relative error ~2^-23; 1 / inf = 0).
TESSERA_DEVICE float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace kernels
}  // namespace tessera
