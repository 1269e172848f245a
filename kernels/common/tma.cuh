// The Tensor Memory Accelerator of sm_90 (TMA): one thread asks the copy engine for a whole box of
// a tensor, described by a tensor map the host encodes (cuTensorMapEncodeTiled), and the bytes
// land in shared memory, swizzled as the map says, completing an mbarrier's transaction count (or,
// the other way, a shared-memory box is written to the tensor as one bulk store). A
// tile that took 16 cp.async per producer thread and a row table takes one instruction per
// 128-byte column block.
//
// The map must live in kernel parameter, constant or global memory: the kernels that use one take
// their parameters as __grid_constant__ and pass the map's address in parameter space.
#pragma once

#include "kernels/common/platform.cuh"

// As wgmma.cuh: the instructions are sm_90's; other targets compile the callers but never run
// them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TESSERA_TMA_AVAILABLE 1
#else
#define TESSERA_TMA_AVAILABLE 0
#endif

namespace tessera {
namespace kernels {

/// CUtensorMap's 128 opaque bytes (cuda.h is a host header; the host encodes into this type and
/// static_asserts the sizes agree).
struct alignas(64) TmaDescriptor {
  uint64_t opaque[16];
};

/// Adds `bytes` to the transaction count the current phase of the mbarrier at `bar` waits for,
/// without arriving: the caller's own arrival (or another thread's) still completes the phase, and
/// only once the copies that carry those bytes have landed.
TESSERA_DEVICE void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) {
#if TESSERA_TMA_AVAILABLE
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(bytes) : "memory");
#else
  (void)bar;
  (void)bytes;
  __trap();
#endif
}

/// Copies the box of the 4-D tensor map `map` whose first element is at coordinates (c0, c1, c2,
/// c3) (innermost first) into shared memory at `dst` (aligned as the map's swizzle requires: 1024
/// bytes for 128-byte swizzling), completing its bytes on the mbarrier at `bar`. Elements outside
/// the tensor are zero-filled.
TESSERA_DEVICE void tma_load_4d(uint32_t dst, const TmaDescriptor* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
#if TESSERA_TMA_AVAILABLE
  const uint32_t bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar_addr)
      : "memory");
#else
  (void)dst;
  (void)map;
  (void)c0;
  (void)c1;
  (void)c2;
  (void)c3;
  (void)bar;
  __trap();
#endif
}

/// Copies shared memory at `src` (the layout a load of the same box would write) into the box of
/// the 4-D tensor map `map` at (c0, c1, c2, c3); elements outside the tensor are not written.
/// The copy joins this thread's current bulk group (tma_store_commit).
TESSERA_DEVICE void tma_store_4d(const TmaDescriptor* map, uint32_t src, int c0, int c1, int c2, int c3) {
#if TESSERA_TMA_AVAILABLE
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory");
#else
  (void)map;
  (void)src;
  (void)c0;
  (void)c1;
  (void)c2;
  (void)c3;
  __trap();
#endif
}

/// Closes this thread's bulk group of TMA stores.
TESSERA_DEVICE void tma_store_commit() {
#if TESSERA_TMA_AVAILABLE
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

/// Waits until at most kPending of this thread's bulk groups still read their shared memory (the
/// source may be overwritten then; the global writes complete on their own).
template <int kPending>
TESSERA_DEVICE void tma_store_wait_read() {
#if TESSERA_TMA_AVAILABLE
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}

/// Fetches the tensor map at `map` into the TMA unit's descriptor cache ahead of its first use.
TESSERA_DEVICE void tma_prefetch_descriptor(const TmaDescriptor* map) {
#if TESSERA_TMA_AVAILABLE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#else
  (void)map;
#endif
}

}  // namespace kernels
}  // namespace tessera
