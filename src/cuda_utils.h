// Host-side CUDA helpers for the translation units that launch kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "src/check.h"

namespace tessera {
namespace detail {

/// The SM count of the current device (cached per device).
int current_device_sm_count();

/// Whether the current device runs programmatic dependent launches (sm_90 and later; cached).
bool current_device_has_dependent_launch();

/// Whether the current device runs the wgmma kernel configurations: an sm_90 device (wgmma is
/// sm_90a-only, absent from later architectures) and a library built with sm_90a kernels.
bool current_device_has_wgmma();

/// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per
/// (kernel, device): the opt-in above 48 KB is per device, so a process-wide once-flag would miss
/// the second GPU, and setting it on every launch costs ~1 us. No-op up to 48 KB.
void ensure_dynamic_smem(const void* kernel, int bytes);

/// Blocks for a grid-stride kernel over `total_threads` threads: enough to fill every SM a few
/// times over, never more than the work needs.
int grid_stride_blocks(long long total_threads, int threads_per_block);

}  // namespace detail
}  // namespace tessera

/// After a kernel launch: reports launch-configuration errors at the call that caused them.
#define TESSERA_CHECK_LAUNCH() TESSERA_CUDA_CHECK(cudaGetLastError())
