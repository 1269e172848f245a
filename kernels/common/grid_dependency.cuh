// Programmatic dependent launch (sm_90 and later): a kernel launched with the programmatic
// stream-serialisation attribute may start while the previous kernel in its stream still runs,
// do the work that does not read that kernel's results, then wait for it. Before sm_90 both
// calls compile to nothing and the host launches without the attribute (plain serialisation).
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// Lets the next kernel of the stream (if launched as a programmatic dependent) start now.
/// Carries no memory guarantee: the dependent still waits for this grid's completion.
TESSERA_DEVICE void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Waits until the grids this one depends on have completed and their memory is visible.
/// Returns at once for a kernel launched without the programmatic attribute.
TESSERA_DEVICE void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace kernels
}  // namespace tessera
