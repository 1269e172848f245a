// Parameters shared by the attention kernels (decode and prefill families) and the gather of KV
// rows from any format. A KV format is a block-sparse matrix (docs/design.md §1): the kernels walk a
// request's logical KV positions 0 .. kv_len-1 and ask the format where row `pos` lives and which
// column (key index, for masking) it is.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

enum class KVFormatKind : int {
  kRagged = 0,       // request b owns rows kv_indptr[b] .. kv_indptr[b+1]-1 (dense: one request)
  kPaged = 1,        // page table: kv_indptr (pages per request), kv_indices, last_page_len
  kBlockSparse = 2,  // "request" = query block row; its KV = the listed column blocks of Bc rows
};

template <typename T>
struct AttentionParams {
  // Queries and outputs: [rows, Hq, D]; request b owns rows qo_indptr[b] .. qo_indptr[b+1]-1
  // (BSR: block row r owns rows r*Br .. min(M, r*Br+Br)-1).
  const T* q;
  int64_t q_row_stride, q_head_stride;
  T* o;
  int64_t o_row_stride, o_head_stride;
  float* lse;  // [rows, Hq] base-2, or nullptr
  int64_t lse_row_stride, lse_head_stride;
  const int32_t* qo_indptr;  // [batch + 1]; nullptr: request b owns rows b*qo_len_single .. +qo_len_single-1
  int32_t qo_len_single;

  // Keys and values. Element (row address r, head h, d) is at k + r + h * k_head_stride + d where
  // the row address comes from kv_row_offset().
  const T* k;
  const T* v;
  int64_t k_row_stride, k_head_stride, k_page_stride;  // row = slot within a page when paged
  int64_t v_row_stride, v_head_stride, v_page_stride;
  const int32_t* kv_indptr;      // ragged: rows; paged: pages; BSR: column blocks per block row
  const int32_t* kv_indices;     // paged: page ids; BSR: column-block ids
  const int32_t* last_page_len;  // paged only
  int32_t kv_len_single;         // ragged with kv_indptr == nullptr: one request of this length
  int32_t page_size;             // paged: page size; BSR: Bc
  int32_t num_pages;             // paged: pages in k/v; BSR: column blocks; bound for clamping
  int32_t num_indices;           // entries in kv_indices
  int32_t num_kv_rows;           // ragged: rows in k/v; BSR: N (columns); bound for clamping
  int32_t block_rows;            // BSR: Br
  int32_t num_q_rows;            // total rows of q (BSR: M)

  int32_t batch_size;  // requests (BSR: block rows)
  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t group_size;      // num_qo_heads / num_kv_heads
  float sm_scale_log2;     // sm_scale * log2(e): logits are kept in base 2
  float sm_scale;          // natural units, for variant hooks that transform logits
  bool causal;
  const uint8_t* block_flags;  // BSR: 1 per listed block whose pairs are all visible, or nullptr
};

/// Query rows and KV extent of one request.
struct RequestExtent {
  int32_t q_begin;   // first row of q
  int32_t qo_len;
  int32_t kv_len;    // logical KV positions 0 .. kv_len-1
  int32_t kv_begin;  // ragged: first row; paged: first entry of kv_indices; BSR: first entry
  int32_t q_pos_offset;  // position of query 0: kv_len - qo_len (BSR: N - M + q_begin)
};

template <KVFormatKind kFormat, typename T>
TESSERA_DEVICE RequestExtent request_extent(const AttentionParams<T>& p, int32_t b) {
  RequestExtent e;
  if (kFormat == KVFormatKind::kBlockSparse) {
    e.q_begin = b * p.block_rows;
    e.qo_len = min(p.block_rows, p.num_q_rows - e.q_begin);
    e.kv_begin = min(max(p.kv_indptr[b], 0), p.num_indices);
    const int32_t blocks = min(max(p.kv_indptr[b + 1], e.kv_begin), p.num_indices) - e.kv_begin;
    e.kv_len = blocks * p.page_size;  // columns past N inside the last block are masked
    e.q_pos_offset = p.num_kv_rows - p.num_q_rows + e.q_begin;
    return e;
  }
  if (p.qo_indptr != nullptr) {
    e.q_begin = min(max(p.qo_indptr[b], 0), p.num_q_rows);
    e.qo_len = min(max(p.qo_indptr[b + 1], e.q_begin), p.num_q_rows) - e.q_begin;
  } else {  // every request has qo_len_single rows, request b's at row b * qo_len_single
    e.q_begin = b * p.qo_len_single;
    e.qo_len = p.qo_len_single;
  }
  if (kFormat == KVFormatKind::kRagged) {
    if (p.kv_indptr != nullptr) {
      e.kv_begin = min(max(p.kv_indptr[b], 0), p.num_kv_rows);
      e.kv_len = min(max(p.kv_indptr[b + 1], e.kv_begin), p.num_kv_rows) - e.kv_begin;
    } else {
      e.kv_begin = 0;
      e.kv_len = p.kv_len_single;
    }
  } else {
    e.kv_begin = min(max(p.kv_indptr[b], 0), p.num_indices);
    const int32_t pages = min(max(p.kv_indptr[b + 1], e.kv_begin), p.num_indices) - e.kv_begin;
    const int32_t last = min(max(p.last_page_len[b], 1), p.page_size);
    e.kv_len = pages > 0 ? (pages - 1) * p.page_size + last : 0;
  }
  e.q_pos_offset = e.kv_len - e.qo_len;
  return e;
}

/// Where logical KV position `pos` (0 <= pos < kv_len) of a request lives, as element offsets of
/// its row in k and in v (head 0, d 0), and the key index that masks compare against. A row whose
/// page or block id is out of range gets valid = false: it is zero-filled and masked, never read.
struct KVRow {
  int64_t k_offset;
  int64_t v_offset;
  int32_t key;  // ragged/paged: pos; BSR: the column
  bool valid;
};

/// The global load kv_row depends on: the page (paged) or column block (BSR) id of `pos`; 0 for
/// ragged KV. Split out so kernels can issue it a tile ahead of the copies that need it.
template <KVFormatKind kFormat, typename T>
TESSERA_DEVICE int32_t kv_row_block(const AttentionParams<T>& p, const RequestExtent& e, int32_t pos) {
  return kFormat == KVFormatKind::kRagged ? 0 : p.kv_indices[e.kv_begin + pos / p.page_size];
}

/// kv_row given the id kv_row_block returned for `pos`.
template <KVFormatKind kFormat, typename T>
TESSERA_DEVICE KVRow kv_row_in_block(const AttentionParams<T>& p, const RequestExtent& e, int32_t pos, int32_t block) {
  KVRow r;
  if (kFormat == KVFormatKind::kRagged) {
    const int64_t row = e.kv_begin + pos;
    r.k_offset = row * p.k_row_stride;
    r.v_offset = row * p.v_row_stride;
    r.key = pos;
    r.valid = true;
  } else {
    const int32_t slot = pos % p.page_size;
    if (kFormat == KVFormatKind::kPaged) {
      r.valid = block >= 0 && block < p.num_pages;
      r.k_offset = static_cast<int64_t>(block) * p.k_page_stride + static_cast<int64_t>(slot) * p.k_row_stride;
      r.v_offset = static_cast<int64_t>(block) * p.v_page_stride + static_cast<int64_t>(slot) * p.v_row_stride;
      r.key = pos;
    } else {
      const int32_t column = block * p.page_size + slot;
      r.valid = block >= 0 && block < p.num_pages && column < p.num_kv_rows;
      r.k_offset = static_cast<int64_t>(column) * p.k_row_stride;
      r.v_offset = static_cast<int64_t>(column) * p.v_row_stride;
      r.key = column;
    }
  }
  return r;
}

template <KVFormatKind kFormat, typename T>
TESSERA_DEVICE KVRow kv_row(const AttentionParams<T>& p, const RequestExtent& e, int32_t pos) {
  return kv_row_in_block<kFormat>(p, e, pos, kv_row_block<kFormat>(p, e, pos));
}

}  // namespace kernels
}  // namespace tessera
