#include "src/kv_tma.h"

#include <cuda.h>

#include <cstring>

#include "src/check.h"
#include "src/env.h"
#include "src/jit/module_loader.h"

namespace tessera {
namespace detail {
namespace {

static_assert(sizeof(CUtensorMap) == sizeof(kernels::TmaDescriptor) && alignof(kernels::TmaDescriptor) >= 64,
              "the kernels' descriptor type holds a CUtensorMap");

constexpr int64_t kElemBytes = 2;  // the 16-bit tiles (fp8 stages keep cp.async: PrefillTraits::kTmaKV)

bool tma_stride_ok(int64_t stride_elems, int64_t extent) {
  const int64_t bytes = stride_elems * kElemBytes;
  // A dimension of extent 1 never steps: its stride is replaced (tma_stride).
  return extent == 1 || (bytes > 0 && bytes % 16 == 0 && bytes < (int64_t{1} << 40));
}
cuuint64_t tma_stride(int64_t stride_elems, int64_t extent) {
  return extent == 1 ? 16u : static_cast<cuuint64_t>(stride_elems * kElemBytes);
}

CUtensorMapSwizzle swizzle_of(int atom_elems) {
  switch (atom_elems * kElemBytes) {
    case 128: return CU_TENSOR_MAP_SWIZZLE_128B;
    case 64: return CU_TENSOR_MAP_SWIZZLE_64B;
    case 32: return CU_TENSOR_MAP_SWIZZLE_32B;
    default: break;
  }
  TESSERA_FAIL(StatusCode::kInternal) << "no TMA swizzle of " << atom_elems * kElemBytes << " bytes";
}

/// One tensor's 4-D map {head dim, rows of a block, heads, blocks}, boxes of one column block of a
/// tile.
void encode_one(kernels::TmaDescriptor& out, const void* base, const KVRowTensors& kv, int64_t row_stride,
                int64_t head_stride, int64_t block_stride, const KVTmaBox& box, const char* what) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(box.head_dim), static_cast<cuuint64_t>(kv.block_rows),
                              static_cast<cuuint64_t>(kv.num_heads), static_cast<cuuint64_t>(kv.num_blocks)};
  const cuuint64_t strides[3] = {tma_stride(row_stride, kv.block_rows), tma_stride(head_stride, kv.num_heads),
                                 tma_stride(block_stride, kv.num_blocks)};
  const cuuint32_t box_dims[4] = {static_cast<cuuint32_t>(box.atom_elems), static_cast<cuuint32_t>(box.rows), 1u, 1u};
  CUtensorMap map;
  jit::encode_tiled_tensor_map(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, base, dims, strides, box_dims,
                               swizzle_of(box.atom_elems), what);
  std::memcpy(&out, &map, sizeof(map));
}

}  // namespace

bool kv_tma_allowed() {
  static const bool allowed = env_choice("TESSERA_PREFILL_TMA", {"1", "0"}) == "1";
  return allowed;
}

int64_t kv_tma_box_rows(const KVRowTensors& kv, int64_t tile_rows) {
  if (kv.block_rows >= tile_rows) return tile_rows;
  // Whole pages only: a tile's boxes then start at its page boundaries (KVTileSource::tma_tile).
  if (kv.paged && kv.block_rows >= 16 && tile_rows % kv.block_rows == 0) return kv.block_rows;
  return 0;
}

void encode_kv_tma(kernels::KVTmaDescriptors& out, const KVRowTensors& kv, const KVTmaBox& k_box,
                   const KVTmaBox& v_box) {
  out.enabled = 0;
  out.box_rows = 0;
  TESSERA_CHECK(k_box.rows == v_box.rows, StatusCode::kInternal)
      << "K and V tiles of " << k_box.rows << " and " << v_box.rows << " rows";
  const int64_t box_rows = kv_tma_box_rows(kv, k_box.rows);
  if (!kv_tma_allowed() || box_rows == 0 || kv.num_heads < 1 || kv.num_blocks < 1) return;
  // KVTileSource::copy_tma picks a box's first thread by a mask: boxes of a power of two of rows.
  TESSERA_CHECK(box_rows >= 16 && (box_rows & (box_rows - 1)) == 0, StatusCode::kInternal)
      << "TMA boxes of " << box_rows << " rows under tiles of " << k_box.rows;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(kv.k) || !aligned(kv.v) || !tma_stride_ok(kv.k_row_stride, kv.block_rows) ||
      !tma_stride_ok(kv.k_head_stride, kv.num_heads) || !tma_stride_ok(kv.k_block_stride, kv.num_blocks) ||
      !tma_stride_ok(kv.v_row_stride, kv.block_rows) || !tma_stride_ok(kv.v_head_stride, kv.num_heads) ||
      !tma_stride_ok(kv.v_block_stride, kv.num_blocks)) {
    return;
  }
  const KVTmaBox k_page_box{static_cast<int>(box_rows), k_box.head_dim, k_box.atom_elems};
  const KVTmaBox v_page_box{static_cast<int>(box_rows), v_box.head_dim, v_box.atom_elems};
  encode_one(out.k, kv.k, kv, kv.k_row_stride, kv.k_head_stride, kv.k_block_stride, k_page_box,
             "the TMA descriptor of k");
  encode_one(out.v, kv.v, kv, kv.v_row_stride, kv.v_head_stride, kv.v_block_stride, v_page_box,
             "the TMA descriptor of v");
  out.enabled = 1;
  out.box_rows = static_cast<int32_t>(box_rows);
}

void encode_query_rows_tma(kernels::QueryRowsTma& out, const QueryRows& q, int box_rows, int head_dim, int atom_elems,
                           const char* what) {
  out.enabled = 0;
  if (!kv_tma_allowed() || q.group < 1 || box_rows % q.group != 0 || q.num_rows < 1 || q.num_kv_heads < 1) return;
  if (reinterpret_cast<uintptr_t>(q.q) % 16 != 0 || !tma_stride_ok(q.head_stride, q.group) ||
      !tma_stride_ok(q.row_stride, q.num_rows) || !tma_stride_ok(q.head_stride * q.group, q.num_kv_heads)) {
    return;
  }
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(q.group),
                              static_cast<cuuint64_t>(q.num_rows), static_cast<cuuint64_t>(q.num_kv_heads)};
  const cuuint64_t strides[3] = {tma_stride(q.head_stride, q.group), tma_stride(q.row_stride, q.num_rows),
                                 tma_stride(q.head_stride * q.group, q.num_kv_heads)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(atom_elems), static_cast<cuuint32_t>(q.group),
                             static_cast<cuuint32_t>(box_rows / q.group), 1u};
  CUtensorMap map;
  jit::encode_tiled_tensor_map(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, q.q, dims, strides, box, swizzle_of(atom_elems),
                               what);
  std::memcpy(&out.map, &map, sizeof(map));
  out.enabled = 1;
}

}  // namespace detail
}  // namespace tessera
