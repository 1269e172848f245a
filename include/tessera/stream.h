// The CUDA stream type without pulling CUDA headers into the public API: cudaStream_t and
// CUstream are both `CUstream_st*`, so either converts implicitly. nullptr is the legacy default
// stream.
#pragma once

struct CUstream_st;

namespace tessera {
using StreamHandle = CUstream_st*;
}  // namespace tessera
