// Whether this process can use a GPU at all. Every function that does GPU work throws
// tessera::Error (kCudaError) on a machine without a usable GPU; its message starts with
// "no CUDA driver:" (no NVIDIA driver, or one older than the CUDA runtime Tessera was built with)
// or "no CUDA device:" (a driver but no GPU visible to the process) and says what to do. This
// function gives that text without doing any GPU work, e.g. to report it once at start-up.
#pragma once

#include <string>

#include "tessera/export.h"

namespace tessera {

/// "" when the CUDA runtime sees at least one GPU; otherwise why not and what to do (the message
/// of the error a GPU entry point would throw). Never throws.
TESSERA_API std::string cuda_unavailable_reason();

}  // namespace tessera
