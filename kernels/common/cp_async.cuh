// cp.async (sm_80+): asynchronous 16-byte global-to-shared copies, committed in groups and
// awaited by count, so loads of the next tile overlap computation on the current one.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// Copies 16 bytes from global `gmem` to shared `smem`, bypassing L1; when !valid, writes 16
/// zero bytes and reads nothing (gmem may then be any mapped address, e.g. the tensor's base).
/// The ignore-src predicate form keeps this one predicated LDGSTS, with no source-size arithmetic.
TESSERA_DEVICE void cp_async_16_zfill(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile(
      "{\n"
      "  .reg .pred ignore;\n"
      "  setp.eq.u32 ignore, %2, 0;\n"
      "  cp.async.cg.shared.global [%0], [%1], 16, ignore;\n"
      "}\n" ::"r"(dst),
      "l"(gmem), "r"(static_cast<uint32_t>(valid)));
}

/// Closes the group of cp.async issued since the last commit.
TESSERA_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most N committed groups are still in flight.
template <int N>
TESSERA_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace kernels
}  // namespace tessera
