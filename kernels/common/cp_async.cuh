// cp.async (sm_80+): asynchronous 16-byte (and 8-byte) global-to-shared copies, committed in groups and
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

/// The same for 8 bytes (through L1: cp.async.cg takes 16-byte copies only), for rows whose
/// per-thread share is 8 bytes (fp8 K/V in the CUDA-core decode kernel).
TESSERA_DEVICE void cp_async_8_zfill(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile(
      "{\n"
      "  .reg .pred ignore;\n"
      "  setp.eq.u32 ignore, %2, 0;\n"
      "  cp.async.ca.shared.global [%0], [%1], 8, ignore;\n"
      "}\n" ::"r"(dst),
      "l"(gmem), "r"(static_cast<uint32_t>(valid)));
}

/// Two 16-byte copies under one predicate carried in a source address: `tagged_a` -> smem_a and
/// `gmem_b` -> smem_b, or zero-fills of both when bit 0 of `tagged_a` is set (sources are 16-byte
/// aligned, so the bit is free; the K and V chunks of one KV row exist or are missing together).
/// A set tag means ignore-src, so the odd address is never dereferenced and needs no clearing.
/// `smem_*` are shared-window addresses. In PTX, so ptxas tests the bit with one predicate-setting
/// LOP3; from C++ it compared the 64-bit value (three instructions per copy).
TESSERA_DEVICE void cp_async_16x2_tagged(uint32_t smem_a, uint32_t smem_b, uint64_t tagged_a, uint64_t gmem_b) {
  asm volatile(
      "{\n"
      "  .reg .pred ignore;\n"
      "  .reg .b32 lo;\n"
      "  cvt.u32.u64 lo, %2;\n"
      "  and.b32 lo, lo, 1;\n"
      "  setp.ne.u32 ignore, lo, 0;\n"
      "  cp.async.cg.shared.global [%0], [%2], 16, ignore;\n"
      "  cp.async.cg.shared.global [%1], [%3], 16, ignore;\n"
      "}\n" ::"r"(smem_a),
      "r"(smem_b), "l"(tagged_a), "l"(gmem_b));
}

/// One 16-byte copy `gmem` -> smem under the predicate of cp_async_16x2_tagged: a zero-fill when
/// bit 0 of `tag` is set. `tag` may be gmem itself (the K entry of a row) or the row's K entry
/// guarding its V copy.
TESSERA_DEVICE void cp_async_16_tagged(uint32_t smem, uint64_t tag, uint64_t gmem) {
  asm volatile(
      "{\n"
      "  .reg .pred ignore;\n"
      "  .reg .b32 lo;\n"
      "  cvt.u32.u64 lo, %1;\n"
      "  and.b32 lo, lo, 1;\n"
      "  setp.ne.u32 ignore, lo, 0;\n"
      "  cp.async.cg.shared.global [%0], [%2], 16, ignore;\n"
      "}\n" ::"r"(smem),
      "l"(tag), "l"(gmem));
}

/// Closes the group of cp.async issued since the last commit.
TESSERA_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most N committed groups are still in flight.
template <int N>
TESSERA_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// Waits until every cp.async this thread has issued, committed or not, has landed.
TESSERA_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/// cp_async_wait for a count known at run time, 0 to 2 (wait_group takes an immediate): until at
/// most `newer` of this thread's groups are in flight.
TESSERA_DEVICE void cp_async_wait_at_most(int newer) {
  if (newer >= 2) {
    cp_async_wait<2>();
  } else if (newer == 1) {
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

}  // namespace kernels
}  // namespace tessera
