// Appending new K/V rows of a ragged batch to a paged KV cache. Memory bound: each thread copies
// one 16-byte vector of K and the matching vector of V for one (row, head). The target slot of a
// row comes from the page table, which the host describes as it will be AFTER the append.
#pragma once

#include "kernels/common/platform.cuh"
#include "kernels/common/vec.cuh"

namespace tessera {
namespace kernels {

template <typename T>
struct AppendTraits {
  static constexpr int kVecElems = vec_elems<T>();
  static constexpr int kThreadsPerBlock = 256;
  static_assert(kVecElems * sizeof(T) == kVecBytes, "one 16-byte vector per thread and tensor");
  static_assert(kThreadsPerBlock % kWarpSize == 0, "whole warps");
};

/// Where the cache's pages live; strides in elements, so NHD and HND differ only in the values of
/// slot_stride and head_stride.
template <typename T>
struct PagedCacheDesc {
  T* k;
  T* v;
  int64_t k_page_stride, k_slot_stride, k_head_stride;
  int64_t v_page_stride, v_slot_stride, v_head_stride;
  const int32_t* page_indptr;    // [batch + 1]
  const int32_t* page_indices;   // [num_indices]
  const int32_t* last_page_len;  // [batch]
  int32_t batch_size;
  int32_t page_size;
  int32_t num_pages;
  int32_t num_indices;
};

/// How a row finds its request and position: from the append indptr (position counted back from
/// the request's length), or explicitly from per-row arrays (FlashInfer's convention).
enum class AppendTargetMode { kFromIndptr, kExplicit };

template <typename T>
struct AppendParams {
  const T* append_k;  // [nnz, H, D]
  const T* append_v;  // [nnz, H, D]
  int64_t k_row_stride, k_head_stride, v_row_stride, v_head_stride;
  const int32_t* append_indptr;  // [batch + 1] (kFromIndptr)
  const int32_t* batch_indices;  // [nnz] (kExplicit)
  const int32_t* positions;      // [nnz] (kExplicit)
  PagedCacheDesc<T> cache;
  int32_t nnz;
  int32_t num_heads;
  int32_t head_dim;
};

/// KV length of request b according to the page table; 0 for a request without pages.
template <typename T>
TESSERA_DEVICE int64_t paged_kv_len(const PagedCacheDesc<T>& c, int32_t b) {
  const int32_t pages = c.page_indptr[b + 1] - c.page_indptr[b];
  return pages > 0 ? static_cast<int64_t>(pages - 1) * c.page_size + c.last_page_len[b] : 0;
}

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

template <typename T, AppendTargetMode kMode>
__global__ void __launch_bounds__(AppendTraits<T>::kThreadsPerBlock)
append_paged_kv_cache_kernel(const AppendParams<T> p) {
  constexpr int N = AppendTraits<T>::kVecElems;
  const PagedCacheDesc<T>& c = p.cache;
  const int vecs_per_row = p.num_heads * (p.head_dim / N);
  const int64_t total = static_cast<int64_t>(p.nnz) * vecs_per_row;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t row = static_cast<int32_t>(t / vecs_per_row);
    const int within = static_cast<int>(t % vecs_per_row);
    const int head = within / (p.head_dim / N);
    const int d = (within % (p.head_dim / N)) * N;

    int32_t b;
    int64_t pos;
    if (kMode == AppendTargetMode::kFromIndptr) {
      b = find_request(p.append_indptr, c.batch_size, row);
      if (b < 0) continue;
      const int64_t append_len = p.append_indptr[b + 1] - p.append_indptr[b];
      pos = paged_kv_len(c, b) - append_len + (row - p.append_indptr[b]);
    } else {
      b = p.batch_indices[row];
      if (b < 0 || b >= c.batch_size) continue;
      pos = p.positions[row];
    }
    // Skip rather than write out of bounds when the index arrays disagree (docs/design.md §4).
    if (pos < 0 || pos >= paged_kv_len(c, b)) continue;
    const int64_t page_entry = c.page_indptr[b] + pos / c.page_size;
    if (page_entry < 0 || page_entry >= c.num_indices) continue;
    const int32_t page = c.page_indices[page_entry];
    if (page < 0 || page >= c.num_pages) continue;
    const int64_t slot = pos % c.page_size;

    Vec<T> k, v;  // [N] each
    k.load_stream(p.append_k + row * p.k_row_stride + head * p.k_head_stride + d);
    v.load_stream(p.append_v + row * p.v_row_stride + head * p.v_head_stride + d);
    k.store(c.k + page * c.k_page_stride + slot * c.k_slot_stride + head * c.k_head_stride + d);
    v.store(c.v + page * c.v_page_stride + slot * c.v_slot_stride + head * c.v_head_stride + d);
  }
}

}  // namespace kernels
}  // namespace tessera
