// Ragged batches described by an indptr array (request b owns rows indptr[b] .. indptr[b+1]-1):
// which request a packed row belongs to. Shared by the kernels that walk packed rows one thread
// per row (appending to a paged cache, standalone RoPE).
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// Largest b with indptr[b] <= row, i.e. the request owning `row`; -1 if none does.
TESSERA_DEVICE int32_t find_request(const int32_t* indptr, int32_t batch_size, int32_t row) {
  if (batch_size <= 0 || row < indptr[0] || row >= indptr[batch_size]) return -1;
  int32_t lo = 0, hi = batch_size - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) >> 1;
    if (indptr[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace kernels
}  // namespace tessera
