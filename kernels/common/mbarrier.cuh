// Barriers for warp-specialised kernels (sm_90): mbarriers in shared memory, which count arrivals
// and complete in phases, so a producer and its consumers can each run ahead of the other by the
// depth of a ring instead of meeting at a CTA-wide barrier; and named barriers, which synchronise
// a subset of the CTA's warps.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// Initialises the mbarrier at `bar` (8 bytes of shared memory) to expect `count` arrivals per
/// phase. One thread initialises; a CTA barrier must follow before any other thread uses it.
TESSERA_DEVICE void mbarrier_init(uint64_t* bar, uint32_t count) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}

/// One arrival of this thread on the current phase.
TESSERA_DEVICE void mbarrier_arrive(uint64_t* bar) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n"
      "  .reg .b64 state;\n"
      "  mbarrier.arrive.shared::cta.b64 state, [%0];\n"
      "}\n" ::"r"(addr)
      : "memory");
}

/// An arrival of this thread that happens when all of its earlier cp.async copies have landed
/// (the count expected at init includes it: .noinc).
TESSERA_DEVICE void cp_async_mbarrier_arrive(uint64_t* bar) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}

/// Waits until the phase of parity `parity` has completed. A fresh barrier is in phase 0, and
/// waiting for parity 1 returns at once (the phase before it counts as complete), so a producer
/// waiting for free slots starts with parity 1.
TESSERA_DEVICE void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n"
      "  .reg .pred done;\n"
      "wait_%=:\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "  @!done bra wait_%=;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
#else
  (void)bar;
  (void)parity;
  __trap();  // try_wait is sm_90+; only the sm_90a warp-specialised kernels wait
#endif
}

/// Synchronises the `count` threads (whole warps) that use named barrier `id` (0-15; 0 is
/// __syncthreads's, which with a count synchronises only that many threads: the tiles that share
/// a CTA in the POD kernel, kernels/attention/pod.cuh).
TESSERA_DEVICE void named_barrier_sync(uint32_t id, uint32_t count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/// Arrives at named barrier `id` without waiting: the barrier completes when `count` threads have
/// arrived or synced there (producer/consumer hand-offs between warp groups).
TESSERA_DEVICE void named_barrier_arrive(uint32_t id, uint32_t count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

}  // namespace kernels
}  // namespace tessera
