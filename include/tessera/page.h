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

/// Appends new latent rows of DeepSeek-style MLA (multi-head latent attention) to a paged latent
/// cache, FlashInfer's append_paged_mla_kv_cache: row i goes to request batch_indices[i] at token
/// position positions[i] of that request, i.e. to page kv_indices[kv_indptr[b] + pos / page_size],
/// slot pos % page_size, with b = batch_indices[i] and pos = positions[i]. A copy: the bits of each
/// row are stored unchanged (f16, bf16, e4m3 or e5m2).
///
/// append_ckv: [nnz, ckv_dim], the compressed KV (latent) part of each new token (ckv_dim = 512
///   for DeepSeek V2/V3). append_kpe: [nnz, kpe_dim], its rotary (position-encoded) key part
///   (kpe_dim = 64 for DeepSeek). Both of the cache's dtype (an fp8 cache's rows come already
///   quantized: the copy never converts); any row stride, contiguous last dim.
/// batch_indices, positions: i32 [nnz] on the cache's device, contiguous: the request (in
///   [0, batch_size)) and the token position (in [0, kv_len_b)) of each row. Rows may come in any
///   order; two rows with the same target race (one of them wins).
/// ckv_cache: [num_pages, page_size, ckv_dim]; kpe_cache: [num_pages, page_size, kpe_dim], the
///   same num_pages and page_size (any page size >= 1). Both f16, bf16, e4m3 or e5m2, on one CUDA
///   device; any page and slot strides (e.g. two slices of one [num_pages, page_size, 576] tensor)
///   with a contiguous last dim.
/// Widths and alignment: ckv_dim and kpe_dim positive multiples of 16 bytes (8 elements, 16 at
///   fp8); every
///   data pointer, and every stride but the last (in bytes), a multiple of 16.
/// kv_indptr: i32 [batch_size + 1], kv_indptr[0] == 0, non-decreasing, kv_indptr[batch_size] <=
///   kv_indices.shape[0]; request b owns the pages kv_indices[kv_indptr[b] .. kv_indptr[b+1]-1]
///   (i32 page ids in [0, num_pages)); kv_last_page_len: i32 [batch_size], tokens in each
///   request's last page (1 .. page_size), so kv_len_b = (pages_b - 1) * page_size +
///   kv_last_page_len[b] (0 without pages). All three contiguous on the cache's device, and, as in
///   FlashInfer, describing the lengths AFTER the append.
/// stream: the CUDA stream of the copy (nullptr: the legacy default stream); asynchronous.
/// Rows whose request or position is out of range, or whose page id is out of range, are skipped,
/// never written out of bounds; checked mode (tessera/validate.h) reads the index arrays and
/// reports them (and a bad page table) as kInvalidArgument before the launch. Other bad arguments
/// throw tessera::Error (kInvalidArgument) naming the argument, its value and what was expected.
TESSERA_API void append_paged_mla_kv_cache(const TensorView& append_ckv, const TensorView& append_kpe,
                                           const TensorView& batch_indices, const TensorView& positions,
                                           const TensorView& ckv_cache, const TensorView& kpe_cache,
                                           const TensorView& kv_indptr, const TensorView& kv_indices,
                                           const TensorView& kv_last_page_len, StreamHandle stream = nullptr);

/// One copy of copy_index_arrays: src[0, count) into dst[0, count).
struct IndexArrayCopy {
  TensorView dst;     ///< i32, 1-D, contiguous, at least `count` entries, on the current GPU
  TensorView src;     ///< i32, 1-D, contiguous, at least `count` entries, in host memory or on the current GPU
  int64_t count = 0;  ///< entries to copy, in [0, 2^31)
};

/// Most copies of one copy_index_arrays call, and most entries all its host sources may hold.
inline constexpr int kMaxIndexArrayCopies = 4;
inline constexpr int64_t kMaxIndexArrayHostEntries = 896;

/// Copies up to kMaxIndexArrayCopies small int32 index arrays (page ids, indptr arrays) into device
/// buffers in ONE kernel launch on `stream`: what a CUDA-graph serving step does before replaying,
/// to refresh the fixed buffers its captured runs read, for the host cost of one launch where a
/// cudaMemcpyAsync per array costs several. Host sources (pageable or pinned) are read during the
/// call and their values travel in the launch's parameters, so the caller may modify or free them
/// as soon as it returns; device sources are read when the kernel runs (stream order). A copy with
/// dst == src or count == 0 copies nothing. Destination ranges must not overlap each other or
/// another copy's source range.
///
/// Returns true when the copies are enqueued; false, with nothing enqueued, when they do not fit
/// one launch (more than kMaxIndexArrayCopies copies, or more than kMaxIndexArrayHostEntries
/// entries from host memory in all) or `stream` is capturing (a captured launch would replay
/// this call's host values, not the arrays' later ones): the caller then copies another way.
/// Bad arguments (dtype, shape, device, overlapping ranges) throw tessera::Error (kInvalidArgument)
/// naming the copy and what was expected.
TESSERA_API bool copy_index_arrays(const IndexArrayCopy* copies, int num_copies, StreamHandle stream = nullptr);

}  // namespace tessera
