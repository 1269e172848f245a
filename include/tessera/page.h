// KV-cache utilities for the serving loop.
#pragma once

#include "tessera/export.h"
#include "tessera/formats.h"
#include "tessera/stream.h"
#include "tessera/tensor.h"

namespace tessera {

/// Appends the new K/V rows of a ragged batch to a paged KV cache.
///
/// append_k, append_v: [nnz, H_kv, D], both of one dtype: the cache's for an f16, bf16 or f32 cache
///   (a copy), f16 or bf16 for an e4m3 or e5m2 cache (quantized, see `scales`); any strides with a
///   contiguous last dim; request b's new rows are append_indptr[b] .. append_indptr[b+1]-1.
/// append_indptr: i32 [batch_size + 1] in device memory, batch_size == cache.batch_size().
/// cache: the page table must already describe the lengths AFTER the append (as in FlashInfer):
///   request b's appended rows go to positions kv_len_b - append_len_b .. kv_len_b - 1, where
///   kv_len_b = (num_pages_b - 1) * page_size + last_page_len[b]. Its index arrays are in device
///   memory. Both layouts, any page size, separate or combined K/V; dtype f16, bf16, f32, e4m3 or
///   e5m2 (K and V alike).
/// scales: the defaults for an f16/bf16/f32 cache. For an fp8 cache, the dequantization scales the
///   attention kernels will use (tessera::KVScales): each element x of K in KV head h is stored as
///   x / scale_k(h) (in fp32, as x times the fp32 reciprocal of the scale), rounded to nearest even
///   and saturated to the largest finite fp8 value (+-448 for e4m3, +-57344 for e5m2; NaN stays
///   NaN); V likewise. Scales per tensor or per KV head; device scales are read when the kernel
///   runs, so a CUDA Graph replay sees the values they hold then.
/// Rows whose target position falls outside the request's pages (append_len_b > kv_len_b) or whose
/// page id is out of range are skipped, never written out of bounds; checked mode reports them.
TESSERA_API void append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                                       const TensorView& append_indptr, const PagedKV& cache,
                                       StreamHandle stream = nullptr, const KVScales& scales = {});

/// The same with explicit per-row targets, FlashInfer's convention: row i goes to request
/// batch_indices[i] at position positions[i] (both i32 [nnz] in device memory).
TESSERA_API void append_paged_kv_cache_at(const TensorView& append_k, const TensorView& append_v,
                                          const TensorView& batch_indices, const TensorView& positions,
                                          const PagedKV& cache, StreamHandle stream = nullptr,
                                          const KVScales& scales = {});

}  // namespace tessera
