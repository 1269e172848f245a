// TMA descriptors of ragged (and dense) K and V for the sm_90 prefill tiles that copy whole KV tiles
// with the copy engine (kernels::PrefillTraits::kTmaKV, kernels/attention/prefill/kv_loader.cuh).
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

/// The rows of K and V as the kernel reads them: element (row, head, d) of k at k + row *
/// k_row_stride + head * k_head_stride + d (elements; v likewise), `num_rows` rows, `num_heads`
/// KV heads, 16-bit elements.
struct KVRowTensors {
  const void* k;
  const void* v;
  int64_t num_rows;
  int64_t num_heads;
  int64_t k_row_stride, k_head_stride, v_row_stride, v_head_stride;
};

/// Whether the TMA copies are on (TESSERA_PREFILL_TMA, "1" by default; "0" keeps every tile on
/// cp.async, for comparison).
bool kv_tma_allowed();

/// Encodes K's and V's descriptors into `out` and sets out.enabled, or leaves out.enabled 0 when
/// the tensors do not meet TMA's requirements (a base or a stride in bytes that is not a multiple
/// of 16, a stride of 2^40 bytes or more, no rows) or kv_tma_allowed() is false: those launches
/// gather every tile with cp.async, the path of the other KV formats, which reads any stride.
void encode_kv_tma(kernels::KVTmaDescriptors& out, const KVRowTensors& kv, const KVTmaBox& k_box,
                   const KVTmaBox& v_box);

}  // namespace detail
}  // namespace tessera
