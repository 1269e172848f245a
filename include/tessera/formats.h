// KV-cache formats. Every layout is a block-sparse row (BSR) matrix whose rows are query
// positions and columns KV slots (docs/design.md §1): paged KV is BSR with Bc = page_size and the page
// table as column indices, ragged KV is BSR with identity indices, vector sparsity is Bc = 1.
// These structs only describe memory the caller owns; nothing is copied.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "tessera/export.h"
#include "tessera/tensor.h"

namespace tessera {

/// Order of the dimensions of a paged KV tensor.
enum class Layout : int32_t {
  kNHD = 0,  ///< [num_pages, page_size, num_kv_heads, head_dim]
  kHND = 1,  ///< [num_pages, num_kv_heads, page_size, head_dim]
};
TESSERA_API const char* layout_name(Layout layout);

/// Dequantization scales of an fp8 (e4m3 or e5m2) KV cache: a stored element x stands for
/// x * scale. The scale of K (resp. V) is `k` (`v`) times, when given, the f32 device tensor
/// `k_device` (`v_device`): one element ([] or [1], per tensor) or one per KV head ([H_kv]). Device
/// scales are read by the kernels when they run, so a captured CUDA Graph replays with the values
/// the tensor holds at replay time. f16/bf16 caches take no scales (all defaults).
/// FP8 attention (q fp8 too, tessera/attention.h) also descales q: `q` times `q_device`, per
/// tensor or per KV head (the query heads of a KV head's group share its factor, as in FA3);
/// every other call leaves q at its defaults.
struct KVScales {
  double k = 1.0;        ///< host factor of K's scale: finite, > 0
  double v = 1.0;        ///< host factor of V's scale: finite, > 0
  TensorView k_device;   ///< optional f32 [] / [1] / [H_kv] on the KV's device, each finite and > 0
  TensorView v_device;   ///< optional, as k_device
  double q = 1.0;        ///< FP8 attention: host factor of q's scale: finite, > 0
  TensorView q_device;   ///< FP8 attention: optional, as k_device
  bool is_identity() const {
    return k == 1.0 && v == 1.0 && q == 1.0 && !k_device.defined() && !v_device.defined() && !q_device.defined();
  }
  bool has_query_scale() const { return q != 1.0 || q_device.defined(); }
};

/// A packed ("ragged") batch: request b owns rows indptr[b] .. indptr[b+1]-1 of `data`.
struct Ragged {
  TensorView data;    ///< [total_rows, num_heads, head_dim]; any strides, last dim contiguous
  TensorView indptr;  ///< i32 [batch_size + 1]; indptr[0] == 0, non-decreasing, indptr[B] <= total_rows
  int64_t batch_size() const { return indptr.ndim == 1 ? indptr.shape[0] - 1 : -1; }
};

/// A paged KV cache. Request b owns pages indices[indptr[b]] .. indices[indptr[b+1]-1], in order;
/// all are full except the last, which holds last_page_len[b] tokens (1..page_size), so the
/// request's KV length is (num_pages_b - 1) * page_size + last_page_len[b], or 0 with no pages.
/// K and V may be separate tensors or two slices of one combined tensor (see from_combined).
struct TESSERA_API PagedKV {
  TensorView k;              ///< NHD [num_pages, page_size, H_kv, D] or HND [num_pages, H_kv, page_size, D]
  TensorView v;              ///< same dtype and shape as k but for the head dim, which is k's except in
                             ///< prefill with split head dims (head_dim_vo, tessera/head_dims.h); strides
                             ///< may differ; last dim contiguous
  Layout layout = Layout::kNHD;
  TensorView indptr;         ///< i32 [batch_size + 1], page ranges per request
  TensorView indices;        ///< i32 [>= indptr[B]], page ids in [0, num_pages)
  TensorView last_page_len;  ///< i32 [batch_size]

  /// Builds a PagedKV from one tensor holding both K and V: NHD [num_pages, 2, page_size, H_kv, D]
  /// or HND [num_pages, 2, H_kv, page_size, D]; index 0 of dim 1 is K, 1 is V.
  static PagedKV from_combined(const TensorView& kv, Layout layout, const TensorView& indptr,
                               const TensorView& indices, const TensorView& last_page_len);

  int64_t batch_size() const { return indptr.ndim == 1 ? indptr.shape[0] - 1 : -1; }
  int64_t num_pages() const { return k.ndim == 4 ? k.shape[0] : -1; }
  int64_t page_size() const { return k.ndim == 4 ? k.shape[layout == Layout::kNHD ? 1 : 2] : -1; }
  int64_t num_kv_heads() const { return k.ndim == 4 ? k.shape[layout == Layout::kNHD ? 2 : 1] : -1; }
  int64_t head_dim() const { return k.ndim == 4 ? k.shape[3] : -1; }
  /// V's head dim (head_dim() except in prefill with split head dims).
  int64_t head_dim_vo() const { return v.ndim == 4 ? v.shape[3] : -1; }
  /// Element strides of the (page, slot, head) axes of k (resp. v), independent of the layout.
  int64_t k_page_stride() const { return k.strides[0]; }
  int64_t k_slot_stride() const { return k.strides[layout == Layout::kNHD ? 1 : 2]; }
  int64_t k_head_stride() const { return k.strides[layout == Layout::kNHD ? 2 : 1]; }
  int64_t v_page_stride() const { return v.strides[0]; }
  int64_t v_slot_stride() const { return v.strides[layout == Layout::kNHD ? 1 : 2]; }
  int64_t v_head_stride() const { return v.strides[layout == Layout::kNHD ? 2 : 1]; }
};

/// Block-sparse KV over one logical attention matrix of num_rows query rows x num_cols KV slots.
/// Block row r (query rows r*Br .. r*Br+Br-1) sees the KV column blocks indices[indptr[r]] ..
/// indices[indptr[r+1]-1] (columns c*Bc .. c*Bc+Bc-1, clipped to num_cols).
struct BlockSparse {
  int64_t block_rows = 1;  ///< Br >= 1
  int64_t block_cols = 1;  ///< Bc >= 1
  int64_t num_rows = 0;    ///< M, query rows
  TensorView k;            ///< [num_cols, H_kv, D]; last dim contiguous
  TensorView v;            ///< same shape and dtype as k
  TensorView indptr;       ///< i32 [ceil(M / Br) + 1]
  TensorView indices;      ///< i32 [>= indptr[last]], column blocks in [0, ceil(num_cols / Bc)),
                           ///< strictly increasing within a block row
  TensorView block_flags;  ///< optional u8 [same length as indices]: 1 = every element of the
                           ///< block is visible (mask evaluation skipped), 0 = partial
  int64_t num_cols() const { return k.ndim == 3 ? k.shape[0] : -1; }
  int64_t num_row_blocks() const { return (num_rows + block_rows - 1) / block_rows; }
  int64_t num_col_blocks() const { return k.ndim == 3 ? (k.shape[0] + block_cols - 1) / block_cols : -1; }
};

/// One level of a composable format.
using KVFormat = std::variant<Ragged, PagedKV, BlockSparse>;

/// One logical KV matrix stored as several formats (e.g. a shared prefix as one ragged level plus
/// per-request suffixes as a paged level). The attention states of the levels are merged, in
/// order, with the operator of docs/design.md §2. No KV data moves; only index arrays differ.
struct Composable {
  std::vector<KVFormat> levels;
};

}  // namespace tessera
