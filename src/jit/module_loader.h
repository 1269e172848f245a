// The CUDA driver API calls of libtessera: loading JIT-compiled CUBINs (docs/design.md §7) and
// encoding TMA tensor maps (src/kv_tma.h). Needs a GPU.
//
// libtessera does not link libcuda (it must load on machines without a driver, e.g. CI running
// the CPU tests): the driver functions are looked up at run time with
// cudaGetDriverEntryPointByVersion, through the runtime library Tessera already uses.
//
// Modules are loaded once per (cache key, CUDA context) and kept until the process exits;
// contexts are the runtime's primary contexts, which live as long as the process unless someone
// calls cudaDeviceReset (after which these handles are stale: do not mix the two).
#pragma once

#include <cuda.h>

#include <string>

#include "src/jit/kernel_cache.h"

namespace tessera {
namespace jit {

/// `kernel`'s module in the current context (the runtime's context of the current device;
/// initialised if needed), loaded with cuModuleLoadData on first use. Errors are
/// tessera::Error(kCudaError) naming the CUresult, e.g. CUDA_ERROR_NO_BINARY_FOR_GPU.
CUmodule load_module(const CachedKernel& kernel);

/// The function of `kernel` named by `name_expression` (one of its request's name expressions).
CUfunction get_function(const CachedKernel& kernel, const std::string& name_expression);

/// Lets `fn` use `bytes` of dynamic shared memory (cuFuncSetAttribute); `what` names it in errors.
void set_max_dynamic_shared_memory(CUfunction fn, int bytes, const std::string& what);

/// cuLaunchKernel of a 1-D block; errors are tessera::Error(kCudaError) naming `what`.
/// programmatic_dependent (sm_90+; the caller checks): launched with programmatic stream
/// serialisation, so it may start once the stream's previous kernel allows it
/// (kernels/common/grid_dependency.cuh), and must wait for that kernel before reading its results.
void launch(CUfunction fn, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x, int smem_bytes,
            CUstream stream, void** args, const std::string& what, bool programmatic_dependent = false);

/// cuTensorMapEncodeTiled with element strides 1, no interleave, 256-byte L2 promotion and zero
/// fill; a failure is tessera::Error(kInternal) naming `what` (callers check the requirements of
/// base, strides and box first).
void encode_tiled_tensor_map(CUtensorMap* map, CUtensorMapDataType dtype, unsigned rank, const void* base,
                             const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                             CUtensorMapSwizzle swizzle, const std::string& what);

}  // namespace jit
}  // namespace tessera
