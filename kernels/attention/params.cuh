// Parameters shared by the attention kernels (decode, prefill and the contraction) and the gather of
// KV rows from any format. A KV format is a block-sparse matrix (docs/design.md §1): the kernels walk
// a request's logical KV positions 0 .. kv_len-1 and ask the format, KVFormat<kFormat>, where row
// `pos` lives and which column (key index, for masking) it is.
//
// AttentionParams keeps one element type per operand (queries QT, keys and values KVT, outputs OT)
// and the type of the index arrays (IdT), so that KV stored in another type than the queries (fp8
// KV) has a place in the parameters; a kernel that needs two of them equal static_asserts it. Each
// KV format has its own sub-struct, whose fields mean one thing: a kernel instantiated for a format
// reads its format's sub-struct only, and the host leaves the others zero.
#pragma once

#include "kernels/common/fast_divisor.cuh"
#include "kernels/common/fp8.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/tma.cuh"

namespace tessera {
namespace kernels {

enum class KVFormatKind : int {
  kRagged = 0,       // RaggedKVParams: request b owns a range of rows of k/v (dense: one request)
  kPaged = 1,        // PagedKVParams: a page table per request (page ids, last page's length)
  kBlockSparse = 2,  // BlockSparseKVParams: "request" = query block row; its KV = listed column blocks
                     // (of one k/v matrix, or, with block-row segments, of each request's paged KV)
};

/// Queries: element (row, head, d) is at data[row * row_stride + head * head_stride + d].
template <typename QT>
struct QueryTensor {
  const QT* data;       // [num_q_rows, Hq, D], D contiguous
  int64_t row_stride;   // elements between query rows (0 for the single row of single decode)
  int64_t head_stride;  // elements between query heads
};

/// Keys and values. Element (head h, d) of KV row address r is at k[r + h * k_head_stride + d]
/// (v likewise); the format turns a logical position into r (KVFormat<kFormat>::row_in_block):
/// row * row_stride for ragged and block-sparse KV, page * page stride + slot * row_stride for
/// paged KV.
template <typename KVT>
struct KVTensors {
  const KVT* k;           // ragged, block-sparse: [rows, Hkv, D] or [Hkv, rows, D]; paged: [pages, ...] with
                          // page_size slots per page, in any order of (slot, head); D contiguous
  const KVT* v;           // as k, with its own strides
  int64_t k_row_stride;   // elements between rows of k (paged: between slots of a page)
  int64_t k_head_stride;  // elements between heads of k
  int64_t v_row_stride;   // elements between rows of v (paged: between slots of a page)
  int64_t v_head_stride;  // elements between heads of v
};

/// Outputs, in the query rows' layout: element (row, head, d) is at data[row * row_stride + head *
/// head_stride + d]; its LSE, when asked for, at lse[row * lse_row_stride + head * lse_head_stride].
template <typename OT>
struct OutputTensor {
  OT* data;                 // [num_q_rows, Hq, D], D contiguous
  int64_t row_stride;       // elements between rows (0 for the single row of single decode)
  int64_t head_stride;      // elements between heads
  float* lse;               // [num_q_rows, Hq] base-2 log-sum-exp of each row's logits, or nullptr
  int64_t lse_row_stride;   // floats between rows of lse (0 for a single row)
  int64_t lse_head_stride;  // floats between heads of lse
};

/// TMA descriptors of K and V for the sm_90 tiles that copy whole KV tiles with the copy engine
/// (PrefillTraits::kTmaKV). Each is a 4-D map of the tensor, innermost first {head dim, rows of a
/// block, KV heads, blocks}: ragged KV is one block of all its rows, paged KV a block per page
/// (rows: its slots). A box is one swizzled column block of `box_rows` rows, {swizzle width,
/// box_rows, 1, 1}: CTA_TILE_KV where a tile lies inside one block (ragged KV, pages of at least a
/// tile), or the page size where pages are smaller than a tile and a whole number of them fill it
/// (16 to CTA_TILE_KV / 2 rows), so such a tile is one box a page and column block. The host
/// encodes them where the tensors allow (16-byte aligned base and strides; those page sizes), else
/// leaves `enabled` 0 and the tiles gather rows with cp.async.
struct KVTmaDescriptors {
  TmaDescriptor k;
  TmaDescriptor v;
  int32_t enabled;   // 1: k and v hold descriptors of AttentionParams::kv's tensors for this launch's tile
  int32_t box_rows;  // rows of a box: CTA_TILE_KV, or the page size (pages smaller than a tile)
};

/// The TMA descriptor of a tensor in the query rows' layout (q, or o) for the same tiles: a 4-D
/// map {head dim, heads of a KV head's group, query rows, KV heads}, whose box {swizzle width,
/// group size, rows / group size, 1} is one swizzled column block of `rows` packed rows in their
/// order (query-major, the group's heads inside): a query tile (q), a warpgroup's 64 rows (o).
/// Encoded where the group size divides those rows and the tensor's base and strides are 16-byte
/// multiples, else `enabled` 0 (cp.async loads, fragment stores).
struct QueryRowsTma {
  TmaDescriptor map;
  int32_t enabled;
};

/// Ragged KV: each request owns a contiguous range of rows of k/v.
template <typename IdT>
struct RaggedKVParams {
  const IdT* indptr;  // [batch_size + 1] row offsets: request b owns rows indptr[b] .. indptr[b+1]-1;
                      // nullptr: a single request (batch_size 1) of rows 0 .. len_single-1
  IdT len_single;     // rows of the single request when indptr is nullptr
  IdT num_rows;       // rows of k/v: indptr entries are clamped to it
};

/// Paged KV: request b's positions fill its pages in order, page_size slots each, the last page
/// last_page_len of them.
template <typename IdT>
struct PagedKVParams {
  const IdT* indptr;         // [batch_size + 1] offsets into indices: request b's pages are
                             // indices[indptr[b]] .. indices[indptr[b+1]-1]
  const IdT* indices;        // [num_indices] page ids, in [0, num_pages) (others: rows zero-filled, masked)
  const IdT* last_page_len;  // [batch_size] used slots of each request's last page, clamped to [1, page_size]
  int64_t k_page_stride;     // elements between pages of k
  int64_t v_page_stride;     // elements between pages of v
  IdT page_size;             // slots per page
  IdT num_pages;             // pages of k/v: the bound a page id is checked against
  IdT num_indices;           // entries of indices: indptr entries are clamped to it
  FastDivisor page_div;      // page_size as a divisor (FastDivisor::make(page_size))
};

/// One block row of block-sparse KV over a paged cache (BlockSparseKVParams::segments): the
/// request it cuts from and where that request's KV is. Written by the runtime's plan.
struct BlockRowSegment {
  int32_t request;       // the request (the batch index the variant hooks see)
  int32_t page_begin;    // the request's first entry of paged.indices
  int32_t kv_len;        // the request's KV positions: listed columns at or past it are masked
  int32_t q_pos_offset;  // position of the block row's first query: kv_len - qo_len + the row's
                         // first query index within the request
};

/// Block-sparse KV over an M x N attention matrix (rows: queries, columns: keys) cut into Br x Bc
/// blocks: block row r is the kernels' request r (query rows r*Br .. min(M, r*Br+Br)-1), and its
/// KV is the listed column blocks, concatenated (column block c: columns c*Bc .. c*Bc+Bc-1).
/// With `segments`, the block rows are those of a batch of requests over a paged cache instead:
/// block row r has the query rows qo_indptr[r] .. qo_indptr[r+1]-1 and its columns are logical
/// KV positions of request segments[r].request, found through paged.indices (PagedKVParams).
template <typename IdT>
struct BlockSparseKVParams {
  const IdT* indptr;           // [batch_size + 1] offsets into indices: block row r lists
                               // indices[indptr[r]] .. indices[indptr[r+1]-1]
  const IdT* indices;          // [num_indices] column-block ids, in [0, num_blocks) (others: masked)
  const uint8_t* block_flags;  // [num_indices] 1: every pair of that listed block is visible, so a tile
                               // of such blocks skips the mask; nullptr: every tile is masked
  // ptxas loads two counts that share an 8-byte word at once, so their order changes the
  // block-sparse kernels' scheduling: compare a new order with scripts/sass-diff.sh.
  IdT num_blocks;              // column blocks, ceil(N / Bc): the bound a block id is checked against
  IdT block_cols;              // Bc: columns per column block (the last may reach past N: masked)
  IdT num_cols;                // N: columns (rows of k and v)
  IdT block_rows;              // Br: query rows per block row (the last block row may have fewer)
  IdT num_indices;             // entries of indices (and block_flags): indptr entries are clamped to it
  IdT num_rows;                // M: query rows (rows of q and o)
  FastDivisor block_cols_div;  // block_cols as a divisor (FastDivisor::make(block_cols))
  const BlockRowSegment* segments;  // [batch_size] block rows over paged KV, or nullptr: one matrix of
                                    // k/v rows (num_rows, num_cols and block_rows describe it)
};

/// Everything an attention kernel reads besides its variant's parameters. QT, KVT, OT: element
/// types of q, k/v and o; IdT: of the index arrays. AttentionParams<T> is the same-dtype case.
template <typename QT, typename KVT = QT, typename OT = QT, typename IdT = int32_t>
struct AttentionParams {
  using QType = QT;
  using KVType = KVT;
  using OType = OT;
  using IdType = IdT;

  QueryTensor<QT> q;
  KVTensors<KVT> kv;
  OutputTensor<OT> o;
  // Whole query and KV tiles by TMA (the sm_90 wgmma tiles; KV: ragged and paged), and whole
  // output tiles stored by it, or enabled 0.
  QueryRowsTma q_tma;
  QueryRowsTma o_tma;
  KVTmaDescriptors kv_tma;
  // fp8 KV only (KVT e4m3 or e5m2): a stored element x of KV head h stands for x *
  // kv_scales.k_scale(h) (resp. v_scale); the kernels dequantize K/V tiles with it. Zero for
  // 16-bit KV, whose kernels never read it.
  KVScaleParams kv_scales;

  // The query rows of each request, for ragged and paged KV (block-sparse KV: its block rows).
  const IdT* qo_indptr;  // [batch_size + 1] row offsets: request b owns rows qo_indptr[b] .. qo_indptr[b+1]-1;
                         // nullptr: request b owns rows b*qo_len_single .. b*qo_len_single+qo_len_single-1
  IdT qo_len_single;     // query rows per request when qo_indptr is nullptr
  IdT num_q_rows;        // rows of q and o: qo_indptr entries are clamped to it

  // The KV format's description: a kernel reads the sub-struct of the format it was instantiated
  // for (kFormat), never another one.
  RaggedKVParams<IdT> ragged;
  PagedKVParams<IdT> paged;
  BlockSparseKVParams<IdT> block_sparse;

  int32_t batch_size;    // requests (block-sparse: block rows, ceil(M / Br)); the runtime passes the
                         // bound its workspace's index arrays hold (its plan names the requests)
  int32_t num_qo_heads;  // Hq
  int32_t num_kv_heads;  // Hkv
  int32_t group_size;    // Hq / Hkv: query heads per KV head
  float sm_scale_log2;   // sm_scale * log2(e): logits are kept in base 2
  float sm_scale;        // natural units, for variant hooks that transform logits
  bool causal;           // query at position p sees keys 0 .. p (positions: RequestExtent::q_pos_offset)
};

/// Query rows and KV extent of one request.
struct RequestExtent {
  int32_t q_begin;   // first row of q
  int32_t qo_len;
  int32_t kv_len;    // logical KV positions 0 .. kv_len-1
  int32_t kv_begin;  // ragged: first row of k/v; paged: first entry of paged.indices; BSR: first
                     // entry of block_sparse.indices
  int32_t q_pos_offset;  // position of query 0: kv_len - qo_len (BSR: N - M + q_begin)
  // Block-sparse KV only (the other formats leave them unset):
  int32_t batch;       // the batch index of the variant hooks: 0 for one matrix, else the request
  int32_t key_end;     // columns at or past it do not exist: N, or the request's KV length
  int32_t page_begin;  // over paged KV: the request's first entry of paged.indices
  // Variant hooks only (Variant::kReadsPaddingRow): the call is for a padding row of the
  // request's last query tile, whose qo_idx is the last real row's (VariantApplier).
  bool padding_row = false;
};

/// Where logical KV position `pos` (0 <= pos < kv_len) of a request lives, as element offsets of
/// its row in k and in v (head 0, d 0), and the key index that masks compare against. A row whose
/// page or block id is out of range gets valid = false: it is zero-filled and masked, never read.
struct KVRow {
  int64_t k_offset;
  int64_t v_offset;
  int32_t key;  // ragged/paged: pos; BSR: the column
  bool valid;
};

/// Entries indptr[b] .. indptr[b+1]-1 of an offsets array, clamped to [0, bound]: a malformed
/// indptr makes a request empty or short, never a read out of range. Returns the count.
template <typename IdT>
TESSERA_DEVICE int32_t clamped_range(const IdT* indptr, int32_t b, int32_t bound, int32_t& begin) {
  begin = min(max(indptr[b], 0), bound);
  return min(max(indptr[b + 1], begin), bound) - begin;
}

/// The block (page or column block) listed for position `pos` of a request whose positions fill
/// its listed blocks of block_size.divisor in order, from entry e.kv_begin of `indices` on.
template <typename IdT>
TESSERA_DEVICE int32_t listed_block(const IdT* indices, const RequestExtent& e, int32_t pos,
                                    const FastDivisor& block_size) {
  return indices[e.kv_begin + block_size.div(pos)];
}

/// Query rows of request b for ragged and paged KV (the KV fields are the caller's to fill).
template <typename Params>
TESSERA_DEVICE RequestExtent request_query_rows(const Params& p, int32_t b) {
  RequestExtent e;
  if (p.qo_indptr != nullptr) {
    e.qo_len = clamped_range(p.qo_indptr, b, p.num_q_rows, e.q_begin);
  } else {  // every request has qo_len_single rows, request b's at row b * qo_len_single
    e.q_begin = b * p.qo_len_single;
    e.qo_len = p.qo_len_single;
  }
  return e;
}

/// The per-format part of the kernels, one specialisation per KVFormatKind, each reading its own
/// sub-struct of AttentionParams:
/// - request_extent(p, b): request b's query rows and KV extent;
/// - row_block(p, e, pos): the global load row_in_block depends on, the page (paged) or column
///   block (BSR) id of `pos`; 0 for ragged KV. Split out so kernels can issue it a tile ahead of
///   the copies that need it;
/// - row_in_block(p, e, pos, block): where `pos` lives (KVRow), given row_block's id;
/// kv_row (below) composes the two.
template <KVFormatKind kFormat>
struct KVFormat;

template <>
struct KVFormat<KVFormatKind::kRagged> {
  template <typename Params>
  static TESSERA_DEVICE RequestExtent request_extent(const Params& p, int32_t b) {
    RequestExtent e = request_query_rows(p, b);
    if (p.ragged.indptr != nullptr) {
      e.kv_len = clamped_range(p.ragged.indptr, b, p.ragged.num_rows, e.kv_begin);
    } else {
      e.kv_begin = 0;
      e.kv_len = p.ragged.len_single;
    }
    e.q_pos_offset = e.kv_len - e.qo_len;
    return e;
  }
  template <typename Params>
  static TESSERA_DEVICE int32_t row_block(const Params&, const RequestExtent&, int32_t) {
    return 0;
  }
  template <typename Params>
  static TESSERA_DEVICE KVRow row_in_block(const Params& p, const RequestExtent& e, int32_t pos, int32_t) {
    const int64_t row = e.kv_begin + pos;
    return KVRow{row * p.kv.k_row_stride, row * p.kv.v_row_stride, pos, true};
  }
};

template <>
struct KVFormat<KVFormatKind::kPaged> {
  template <typename Params>
  static TESSERA_DEVICE RequestExtent request_extent(const Params& p, int32_t b) {
    RequestExtent e = request_query_rows(p, b);
    const int32_t pages = clamped_range(p.paged.indptr, b, p.paged.num_indices, e.kv_begin);
    const int32_t last = min(max(p.paged.last_page_len[b], 1), p.paged.page_size);
    e.kv_len = pages > 0 ? (pages - 1) * p.paged.page_size + last : 0;
    e.q_pos_offset = e.kv_len - e.qo_len;
    return e;
  }
  template <typename Params>
  static TESSERA_DEVICE int32_t row_block(const Params& p, const RequestExtent& e, int32_t pos) {
    return listed_block(p.paged.indices, e, pos, p.paged.page_div);
  }
  template <typename Params>
  static TESSERA_DEVICE KVRow row_in_block(const Params& p, const RequestExtent&, int32_t pos, int32_t page) {
    const int32_t slot = p.paged.page_div.mod(pos, p.paged.page_div.div(pos));
    const bool valid = page >= 0 && page < p.paged.num_pages;
    return KVRow{static_cast<int64_t>(page) * p.paged.k_page_stride + static_cast<int64_t>(slot) * p.kv.k_row_stride,
                 static_cast<int64_t>(page) * p.paged.v_page_stride + static_cast<int64_t>(slot) * p.kv.v_row_stride,
                 pos, valid};
  }
};

template <>
struct KVFormat<KVFormatKind::kBlockSparse> {
  template <typename Params>
  static TESSERA_DEVICE RequestExtent request_extent(const Params& p, int32_t b) {
    const BlockSparseKVParams<typename Params::IdType>& bs = p.block_sparse;
    RequestExtent e;
    if (bs.segments != nullptr) {
      const BlockRowSegment s = bs.segments[b];
      e = request_query_rows(p, b);
      e.q_pos_offset = s.q_pos_offset;
      e.batch = s.request;
      e.key_end = s.kv_len;
      e.page_begin = s.page_begin;
    } else {
      e.q_begin = b * bs.block_rows;
      e.qo_len = min(bs.block_rows, bs.num_rows - e.q_begin);
      e.q_pos_offset = bs.num_cols - bs.num_rows + e.q_begin;
      e.batch = 0;
      e.key_end = bs.num_cols;
      e.page_begin = 0;
    }
    const int32_t blocks = clamped_range(bs.indptr, b, bs.num_indices, e.kv_begin);
    e.kv_len = blocks * bs.block_cols;  // columns past key_end inside the last block are masked
    return e;
  }
  template <typename Params>
  static TESSERA_DEVICE KVRow row_in_block(const Params& p, const RequestExtent& e, int32_t pos, int32_t block) {
    const BlockSparseKVParams<typename Params::IdType>& bs = p.block_sparse;
    // The block's range check comes before its multiplication, which a wild id would overflow.
    const bool listed = block >= 0 && block < bs.num_blocks;
    const int32_t column =
        (listed ? block : 0) * bs.block_cols + bs.block_cols_div.mod(pos, bs.block_cols_div.div(pos));
    const bool exists = listed && column < e.key_end;
    if (bs.segments == nullptr) {
      return KVRow{static_cast<int64_t>(column) * p.kv.k_row_stride, static_cast<int64_t>(column) * p.kv.v_row_stride,
                   column, exists};
    }
    // Over paged KV the column is a logical position of the request: its page-table entry is read
    // here, a dependent load after the block id's (which load_kv_block_id issued a tile ahead).
    const int32_t page_index = p.paged.page_div.div(column);
    const int32_t page = exists ? p.paged.indices[e.page_begin + page_index] : -1;
    const int32_t slot = column - page_index * p.paged.page_size;
    const bool valid = exists && page >= 0 && page < p.paged.num_pages;
    return KVRow{static_cast<int64_t>(valid ? page : 0) * p.paged.k_page_stride +
                     static_cast<int64_t>(slot) * p.kv.k_row_stride,
                 static_cast<int64_t>(valid ? page : 0) * p.paged.v_page_stride +
                     static_cast<int64_t>(slot) * p.kv.v_row_stride,
                 column, valid};
  }
  template <typename Params>
  static TESSERA_DEVICE int32_t row_block(const Params& p, const RequestExtent& e, int32_t pos) {
    return listed_block(p.block_sparse.indices, e, pos, p.block_sparse.block_cols_div);
  }
};

/// Where position `pos` of a request lives when the block id need not be loaded ahead: row_block,
/// then row_in_block.
template <KVFormatKind kFormat, typename Params>
TESSERA_DEVICE KVRow kv_row(const Params& p, const RequestExtent& e, int32_t pos) {
  return KVFormat<kFormat>::row_in_block(p, e, pos, KVFormat<kFormat>::row_block(p, e, pos));
}

/// The index type every kernel takes: RequestExtent and the row tables hold int32 positions.
template <typename Params>
inline constexpr bool kInt32Indices = kSameType<typename Params::IdType, int32_t>;

}  // namespace kernels
}  // namespace tessera
