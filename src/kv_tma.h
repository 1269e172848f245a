// TMA descriptors of q, K and V for the sm_90 prefill tiles that copy whole query and KV tiles with
// the copy engine (kernels::PrefillTraits::kTmaKV, kernels/attention/prefill/kv_loader.cuh).
#pragma once

#include <cstdint>

#include "kernels/attention/params.cuh"

namespace tessera {
namespace detail {

/// The shared-memory box of one KV tensor's tile: `rows` rows (CTA_TILE_KV), cut into column
/// blocks of `atom_elems` elements (the wgmma layout's swizzle width: 64, 32 or 16 16-bit
/// elements for a 128-, 64- or 32-byte swizzle) of a `head_dim`-element row.
struct KVTmaBox {
  int rows;
  int head_dim;
  int atom_elems;
};

/// K and V as the kernel reads them, 16-bit elements: element (row, head, d) of block b of k at k +
/// b * k_block_stride + row * k_row_stride + head * k_head_stride + d (elements; v likewise).
/// Ragged KV: one block of `block_rows` rows (the tensor's); paged KV (`paged`): `num_blocks`
/// pages of `block_rows` slots.
struct KVRowTensors {
  const void* k;
  const void* v;
  int64_t block_rows;
  int64_t num_heads;
  int64_t num_blocks;
  int64_t k_row_stride, k_head_stride, k_block_stride;
  int64_t v_row_stride, v_head_stride, v_block_stride;
  bool paged;
};

/// The rows of one TMA box for KV tiles of `tile_rows` rows (KVTmaDescriptors::box_rows): the
/// tile where a block holds whole tiles, a page where pages of 16 to tile_rows / 2 slots fill a
/// tile evenly (smaller pages, whose boxes would be 1 KiB or less, and pages that do not divide a
/// tile keep cp.async), else 0: no TMA.
int64_t kv_tma_box_rows(const KVRowTensors& kv, int64_t tile_rows);

/// Whether the TMA copies are on (TESSERA_PREFILL_TMA, "1" by default; "0" keeps every tile on
/// cp.async, for comparison).
bool kv_tma_allowed();

/// Encodes K's and V's descriptors into `out` and sets out.enabled and out.box_rows, or leaves
/// out.enabled 0 when the tensors do not meet TMA's requirements (a base or a stride in bytes that
/// is not a multiple of 16, a stride of 2^40 bytes or more), kv_tma_box_rows is 0 or
/// kv_tma_allowed() is false: those launches gather every tile with cp.async through the row
/// tables, as block-sparse KV always does. k_box.rows and v_box.rows are the tile's rows.
void encode_kv_tma(kernels::KVTmaDescriptors& out, const KVRowTensors& kv, const KVTmaBox& k_box,
                   const KVTmaBox& v_box);

/// q (or o) as the kernel reads it, 16-bit elements: element (row, head, d) at q + row * row_stride
/// + head * head_stride + d; `num_kv_heads` KV heads of `group` query heads each.
struct QueryRows {
  const void* q;
  int64_t num_rows;
  int64_t group;
  int64_t num_kv_heads;
  int64_t row_stride, head_stride;
};

/// Encodes the descriptor of a tensor in the query rows' layout for boxes of `box_rows` packed rows
/// (a query tile for q, a warpgroup's 64 rows for o) into `out` and sets out.enabled, or leaves it
/// 0 where the group size does not divide box_rows (a box's rows would not be whole queries), the
/// base or strides are not 16-byte multiples, or kv_tma_allowed() is false: those tiles load with
/// cp.async (q) or store their fragments (o). `what` names the tensor in errors.
void encode_query_rows_tma(kernels::QueryRowsTma& out, const QueryRows& q, int box_rows, int head_dim, int atom_elems,
                           const char* what);

}  // namespace detail
}  // namespace tessera
