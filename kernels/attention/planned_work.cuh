// The plan of the plan/run runtime as the persistent kernels read it from the workspace
// (docs/design.md §1.3, §6). The host planner (src/runtime/planner.h) writes the same layouts; the
// runtime's launch code static_asserts that the two agree field by field.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// One chunk of one query tile, for the KV head of the CTA's grid row.
struct PlannedItem {
  int32_t request;
  int32_t packed_begin;  // first packed (query, head-in-group) row of the tile
  int32_t kv_begin;      // KV positions [kv_begin, kv_end) of the request
  int32_t kv_end;
  int32_t partial;       // -1: write the final output; else the partial slot to write
};

/// A split tile: partial slots [partial_begin, partial_end) hold its chunks in KV order.
struct PlannedMerge {
  int32_t request;
  int32_t packed_begin;
  int32_t partial_begin;
  int32_t partial_end;
};

/// Device pointers into the workspace. Partial slot s of KV head h is the fp32 state of a whole
/// query tile: output [q_tile_rows][head_dim] at partial_o + (s * H_kv + h) * q_tile_rows *
/// head_dim, base-2 LSE [q_tile_rows] at partial_lse + (s * H_kv + h) * q_tile_rows.
/// The persistent grid is (columns, H_kv / heads_per_cta): CTA (c, g) runs column c's items for
/// KV heads g * heads_per_cta .. + heads_per_cta - 1, one head after the other.
struct PlannedWork {
  const int32_t* cta_indptr;  // [gridDim.x + 1]
  const PlannedItem* items;   // [cta_indptr[gridDim.x]]
  const int32_t* num_merges;  // device scalar: merges in this plan
  const PlannedMerge* merges; // [*num_merges]
  float* partial_o;
  float* partial_lse;
  int32_t heads_per_cta;  // divides H_kv
  // [cta_indptr[gridDim.x]][kMaskTileListBytes] (custom_mask.cuh): the KV tiles of each item a
  // custom mask leaves visible, written by mask_tile_lists_kernel before the launch; null: none.
  const uint8_t* mask_tile_lists = nullptr;
};

}  // namespace kernels
}  // namespace tessera
