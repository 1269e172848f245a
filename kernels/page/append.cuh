// Appending new K/V rows of a ragged batch to a paged KV cache. Memory bound: each thread writes
// one 16-byte vector of the cache for K and the matching one for V, of one (row, head). The target
// slot of a row comes from the page table, which the host describes as it will be AFTER the append.
//
// Same-dtype caches (f16, bf16, f32) get a copy: one 16-byte load and store per tensor. An fp8
// cache (e4m3, e5m2) takes f16/bf16 rows and stores x / scale rounded to nearest and saturated to
// the largest finite fp8 value: a thread reads 16 elements (two 16-byte vectors) and writes them as
// one 16-byte fp8 vector.
//
// MLA latent caches (append_paged_mla_kv_cache_kernel): each appended row is one compressed-KV
// vector (ckv) and one rotary key part (kpe), stored per slot in two page tensors without heads;
// each thread copies one 16-byte vector of either, with the same page-table lookup.
#pragma once

#include "kernels/common/fp8.cuh"
#include "kernels/common/indptr.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/vec.cuh"

namespace tessera {
namespace kernels {

/// In: the appended rows' element type; Cache: the cache's (In for a copy, fp8 when quantizing).
template <typename In, typename Cache = In>
struct AppendTraits {
  static constexpr bool kQuantize = IsFp8<Cache>::value;
  /// Elements per thread and tensor: one 16-byte vector of the cache (16 fp8, 8 f16/bf16, 4 f32).
  static constexpr int kVecElems = vec_elems<Cache>();
  /// 16-byte vectors of the appended rows those elements take (2 for f16/bf16 into fp8, else 1).
  static constexpr int kLoads = kVecElems / vec_elems<In>();
  static constexpr int kThreadsPerBlock = 256;
  static_assert(kQuantize ? sizeof(In) == 2 : kSameType<In, Cache>,
                "a copy into a cache of the rows' dtype, or f16/bf16 rows quantized into fp8");
  static_assert(kLoads * vec_elems<In>() == kVecElems, "whole 16-byte vectors of the rows");
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

template <typename In, typename Cache = In>
struct AppendParams {
  const In* append_k;  // [nnz, H, D]
  const In* append_v;  // [nnz, H, D]
  int64_t k_row_stride, k_head_stride, v_row_stride, v_head_stride;
  const int32_t* append_indptr;  // [batch + 1] (kFromIndptr)
  const int32_t* batch_indices;  // [nnz] (kExplicit)
  const int32_t* positions;      // [nnz] (kExplicit)
  PagedCacheDesc<Cache> cache;
  KVScaleParams scales;  // read by fp8 caches only (a copy has no scale)
  int32_t nnz;
  int32_t num_heads;
  int32_t head_dim;
};

/// KV length of request b according to the page table; 0 for a request without pages. `Table`
/// is any cache descriptor with the page-table members of PagedCacheDesc (page_indptr,
/// page_indices, last_page_len, batch_size, page_size, num_pages, num_indices).
template <typename Table>
TESSERA_DEVICE int64_t paged_kv_len(const Table& c, int32_t b) {
  const int32_t pages = c.page_indptr[b + 1] - c.page_indptr[b];
  return pages > 0 ? static_cast<int64_t>(pages - 1) * c.page_size + c.last_page_len[b] : 0;
}

/// The page and slot of position `pos` of request b; false when the target is to be skipped:
/// b outside the batch, pos outside the request's pages, or a page id out of range. Skipping
/// rather than writing out of bounds when the index arrays disagree (docs/design.md §4).
template <typename Table>
TESSERA_DEVICE bool paged_target_slot(const Table& c, int32_t b, int64_t pos, int32_t& page, int64_t& slot) {
  if (b < 0 || b >= c.batch_size) return false;
  if (pos < 0 || pos >= paged_kv_len(c, b)) return false;
  const int64_t page_entry = c.page_indptr[b] + pos / c.page_size;
  if (page_entry < 0 || page_entry >= c.num_indices) return false;
  page = c.page_indices[page_entry];
  if (page < 0 || page >= c.num_pages) return false;
  slot = pos % c.page_size;
  return true;
}

/// The page and slot that appended row `row` goes to; false when the row is to be skipped. The
/// one place that decides, for every (row dtype, cache dtype).
template <AppendTargetMode kMode, typename In, typename Cache>
TESSERA_DEVICE bool append_target_slot(const AppendParams<In, Cache>& p, int32_t row, int32_t& page, int64_t& slot) {
  const PagedCacheDesc<Cache>& c = p.cache;
  int32_t b;
  int64_t pos;
  if (kMode == AppendTargetMode::kFromIndptr) {
    b = find_request(p.append_indptr, c.batch_size, row);
    if (b < 0) return false;
    const int64_t append_len = p.append_indptr[b + 1] - p.append_indptr[b];
    pos = paged_kv_len(c, b) - append_len + (row - p.append_indptr[b]);
  } else {
    b = p.batch_indices[row];  // checked by paged_target_slot
    pos = p.positions[row];
  }
  return paged_target_slot(c, b, pos, page, slot);
}

/// 16 f16/bf16 elements (in[0]: elements 0-7, in[1]: 8-15) times inv_scale, rounded to nearest
/// and saturated to the largest finite F8, as one 16-byte vector (element 0 in the lowest byte,
/// the order dequantize_vec16 reads).
template <typename F8, typename In>
TESSERA_DEVICE uint4 quantize_vec16(const Vec<In> (&in)[2], float inv_scale) {
  static_assert(IsFp8<F8>::value && sizeof(In) == 2, "f16 or bf16 into fp8");
  uint32_t words[4];  // [4]: elements 4w .. 4w+3, the lowest byte first
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 4 * w + 2 * h;  // element index in the 16
      const uint16_t pair = float2_to_fp8x2<F8>(to_float(in[e / 8].data[e % 8]) * inv_scale,
                                                to_float(in[e / 8].data[e % 8 + 1]) * inv_scale);
      word |= static_cast<uint32_t>(pair) << (16 * h);
    }
    words[w] = word;
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

template <typename In, typename Cache, AppendTargetMode kMode>
__global__ void __launch_bounds__(AppendTraits<In, Cache>::kThreadsPerBlock)
append_paged_kv_cache_kernel(const AppendParams<In, Cache> p) {
  using Traits = AppendTraits<In, Cache>;
  constexpr int N = Traits::kVecElems;
  const PagedCacheDesc<Cache>& c = p.cache;
  const int vecs_per_head = p.head_dim / N;
  const int vecs_per_row = p.num_heads * vecs_per_head;
  const int64_t total = static_cast<int64_t>(p.nnz) * vecs_per_row;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t row = static_cast<int32_t>(t / vecs_per_row);
    const int within = static_cast<int>(t % vecs_per_row);
    const int head = within / vecs_per_head;
    const int d = (within % vecs_per_head) * N;

    // x / scale as x times the reciprocal: one division per thread rather than per element, and
    // the (device) scales read before the page-table lookups so their latencies overlap.
    float k_inv_scale = 1.0f, v_inv_scale = 1.0f;
    if constexpr (Traits::kQuantize) {
      k_inv_scale = 1.0f / p.scales.k_scale(head);
      v_inv_scale = 1.0f / p.scales.v_scale(head);
    }
    int32_t page;
    int64_t slot;
    if (!append_target_slot<kMode>(p, row, page, slot)) continue;

    Vec<In> k[Traits::kLoads], v[Traits::kLoads];  // [kLoads] each: N consecutive elements
    const In* k_src = p.append_k + row * p.k_row_stride + head * p.k_head_stride + d;
    const In* v_src = p.append_v + row * p.v_row_stride + head * p.v_head_stride + d;
#pragma unroll
    for (int i = 0; i < Traits::kLoads; ++i) {
      k[i].load_stream(k_src + i * Vec<In>::kElems);
      v[i].load_stream(v_src + i * Vec<In>::kElems);
    }
    Cache* k_dst = c.k + page * c.k_page_stride + slot * c.k_slot_stride + head * c.k_head_stride + d;
    Cache* v_dst = c.v + page * c.v_page_stride + slot * c.v_slot_stride + head * c.v_head_stride + d;
    if constexpr (Traits::kQuantize) {
      *reinterpret_cast<uint4*>(k_dst) = quantize_vec16<Cache>(k, k_inv_scale);
      *reinterpret_cast<uint4*>(v_dst) = quantize_vec16<Cache>(v, v_inv_scale);
    } else {
      k[0].store(k_dst);
      v[0].store(v_dst);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// MLA latent caches: per slot one ckv row and one kpe row, in two page tensors
// [num_pages, page_size, width] of one 16-bit dtype (any page and slot strides).

/// Where a paged latent cache's pages live; strides in elements.
template <typename T>
struct AppendMlaCacheDesc {
  T* ckv;  // [num_pages, page_size, ckv_dim]
  T* kpe;  // [num_pages, page_size, kpe_dim]
  int64_t ckv_page_stride, ckv_slot_stride, kpe_page_stride, kpe_slot_stride;
  const int32_t* page_indptr;    // [batch + 1]
  const int32_t* page_indices;   // [num_indices]
  const int32_t* last_page_len;  // [batch]
  int32_t batch_size;
  int32_t page_size;
  int32_t num_pages;
  int32_t num_indices;
};

template <typename T>
struct AppendMlaParams {
  const T* append_ckv;  // [nnz, ckv_dim]
  const T* append_kpe;  // [nnz, kpe_dim]
  int64_t ckv_row_stride, kpe_row_stride;
  const int32_t* batch_indices;  // [nnz]
  const int32_t* positions;      // [nnz]
  AppendMlaCacheDesc<T> cache;
  int32_t nnz;
  int32_t ckv_vecs;  // 16-byte vectors per ckv row (ckv_dim / vec_elems<T>())
  int32_t kpe_vecs;  // 16-byte vectors per kpe row
};

struct AppendMlaTraits {
  static constexpr int kThreadsPerBlock = 256;
  static_assert(kThreadsPerBlock % kWarpSize == 0, "whole warps");
};

/// Row i goes to request batch_indices[i] at position positions[i]. One thread per 16-byte vector
/// of a row's ckv_vecs + kpe_vecs vectors (the ckv ones first), so that consecutive threads copy
/// consecutive bytes of one row; a row whose target is out of range is skipped.
template <typename T>
__global__ void __launch_bounds__(AppendMlaTraits::kThreadsPerBlock)
append_paged_mla_kv_cache_kernel(const AppendMlaParams<T> p) {
  constexpr int N = vec_elems<T>();
  const AppendMlaCacheDesc<T>& c = p.cache;
  const int vecs_per_row = p.ckv_vecs + p.kpe_vecs;
  const int64_t total = static_cast<int64_t>(p.nnz) * vecs_per_row;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t row = static_cast<int32_t>(t / vecs_per_row);
    const int within = static_cast<int>(t % vecs_per_row);
    int32_t page;
    int64_t slot;
    if (!paged_target_slot(c, p.batch_indices[row], p.positions[row], page, slot)) continue;
    const T* src;
    T* dst;
    if (within < p.ckv_vecs) {
      const int d = within * N;
      src = p.append_ckv + row * p.ckv_row_stride + d;
      dst = c.ckv + page * c.ckv_page_stride + slot * c.ckv_slot_stride + d;
    } else {
      const int d = (within - p.ckv_vecs) * N;
      src = p.append_kpe + row * p.kpe_row_stride + d;
      dst = c.kpe + page * c.kpe_page_stride + slot * c.kpe_slot_stride + d;
    }
    Vec<T> x;
    x.load_stream(src);
    x.store(dst);
  }
}

}  // namespace kernels
}  // namespace tessera
