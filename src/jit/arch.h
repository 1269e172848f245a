// The JIT target architecture of a GPU (docs/design.md §7: "compiled for the current GPU's
// architecture").
#pragma once

#include <string>

namespace tessera {
namespace jit {

/// The architecture string NVRTC gets for compute capability major.minor: "90a" for 9.0 (Tessera
/// uses sm_90a-only instructions there: wgmma, setmaxnreg), "<major><minor>" otherwise ("80",
/// "86", "89", "100", "120"). Architecture-specific code for other GPUs would add its suffix here.
std::string arch_for_compute_capability(int major, int minor);

/// arch_for_compute_capability of the current CUDA device (cudaGetDevice). Needs a GPU: throws
/// tessera::Error (kCudaError) when there is none.
std::string current_device_arch();

}  // namespace jit
}  // namespace tessera
