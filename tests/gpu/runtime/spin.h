// A kernel that keeps a stream busy for a while, to hold work queued behind it (a run()) in flight
// while the host goes on (a plan() on another stream).
#pragma once

#include <cuda_runtime_api.h>

namespace tessera_test {

/// Queues on `stream` one single-thread kernel that spins for `microseconds` of GPU time.
void spin_on_stream(cudaStream_t stream, double microseconds);

}  // namespace tessera_test
