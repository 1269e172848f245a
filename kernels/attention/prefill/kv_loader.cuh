// Where a prefill work tile's operands come from: the query tile, and the KV rows of any format
// gathered through a ring of row tables (page-table lookups a tile ahead, then row addresses,
// then 16-byte cp.async copies into swizzled shared memory). Used by both mainloops: by every
// warp of the sm80 tile, by the producer warpgroup of the sm90 tile.
#pragma once

#include "kernels/attention/custom_mask.cuh"
#include "kernels/attention/params.cuh"
#include "kernels/attention/prefill/traits.cuh"
#include "kernels/attention/variant_params.cuh"
#include "kernels/attention/variants.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/tma.cuh"

namespace tessera {
namespace kernels {

/// A packed query row (query-major: row = qo_idx * group_size + the head's index in the group)
/// as its query index and query head.
struct PackedRow {
  int qo_idx;
  int head;
};
template <typename Params>
TESSERA_DEVICE PackedRow unpack_row(const Params& p, int kv_head, int packed) {
  // Unsigned (both are >= 0): a signed division costs twice the instructions.
  const int qo_idx = static_cast<int>(static_cast<uint32_t>(packed) / static_cast<uint32_t>(p.group_size));
  return PackedRow{qo_idx, kv_head * p.group_size + (packed - qo_idx * p.group_size)};
}

/// Where a tile's result goes: the final output (AttentionParams::o, with its lse) when `partial_o` is
/// null, else an fp32 partial state of the tile's rows — normalised output [CTA_TILE_Q][HEAD_DIM_VO]
/// at partial_o and base-2 LSE [CTA_TILE_Q] at partial_lse — for the merge.
struct TileOutput {
  float* partial_o;
  float* partial_lse;
};

/// Loads the CTA's query tile; packed rows past the request's queries are zero-filled. Thread r
/// first resolves packed row r into an element offset of q (-1: past the queries) in `row_offsets`
/// ([CTA_TILE_Q] int64 of scratch shared memory, free until the caller's next barrier), so each
/// of a thread's 16-byte copies costs a table load, an add and a predicate rather than a
/// division and 64-bit address arithmetic (~35 instructions per copy, 16 copies per thread).
template <typename Traits, typename Params, typename T>
TESSERA_DEVICE void load_q_tile(const Params& p, const RequestExtent& e, int kv_head, int packed_begin, T* q_smem,
                                int64_t* row_offsets) {
  static_assert(kSameType<T, typename Params::QType>, "the query tile holds q's elements as they are in memory");
  using Tile = typename Traits::template SmemTile<Traits::CTA_TILE_Q>;
  const int tid = loader_thread<Traits>();
  // Warp-specialised, the producer runs from item to item without a loader barrier in between
  // when an item has no KV tiles: every thread must be done reading the previous item's offsets.
  if constexpr (Traits::kWarpSpecialized) loader_sync<Traits>();
  // A thread per query row, in passes when the tile has more rows than loader threads.
  const auto row_offset = [&](int row) {
    const PackedRow r = unpack_row(p, kv_head, packed_begin + row);
    return r.qo_idx < e.qo_len ? static_cast<int64_t>(e.q_begin + r.qo_idx) * p.q.row_stride + r.head * p.q.head_stride
                               : int64_t{-1};
  };
  if constexpr (Traits::CTA_TILE_Q <= Traits::kLoaderThreads) {
    if (tid < Traits::CTA_TILE_Q) row_offsets[tid] = row_offset(tid);
  } else {
#pragma unroll
    for (int row = tid; row < Traits::CTA_TILE_Q; row += Traits::kLoaderThreads) row_offsets[row] = row_offset(row);
  }
  loader_sync<Traits>();
  // A thread keeps one chunk column and steps down the rows, as load_kv_tile does: per-pass
  // row/chunk divisions of a flat index are loop-invariant in the persistent kernel, which hoists
  // them out of its item loop and spilled 15 of them (60 B) with the 4 x 32 tile.
  // Threads span kLoaderRowChunks chunk columns; those past the row's data copy nothing.
  static_assert(Traits::kLoaderThreads % Traits::kLoaderRowChunks == 0, "a thread keeps its chunk column");
  constexpr int kRowsPerPass = Traits::kLoaderThreads / Traits::kLoaderRowChunks;
  const int chunk = tid % Traits::kLoaderRowChunks, row0 = tid / Traits::kLoaderRowChunks;
  if (Traits::kLoaderRowChunks != Traits::kRowChunks && chunk >= Traits::kRowChunks) return;
#pragma unroll
  for (int it = 0; it < (Traits::CTA_TILE_Q + kRowsPerPass - 1) / kRowsPerPass; ++it) {
    const int row = row0 + it * kRowsPerPass;
    if (Traits::CTA_TILE_Q % kRowsPerPass != 0 && row >= Traits::CTA_TILE_Q) break;
    const int64_t offset = row_offsets[row];
    cp_async_16_zfill(q_smem + Tile::chunk_offset(row, chunk) * Traits::kChunkElems,
                      p.q.data + (offset < 0 ? 0 : offset) + chunk * Traits::kChunkElems, offset >= 0);
  }
}

/// Whether the query tile of packed rows packed_begin .. + CTA_TILE_Q - 1 goes by TMA: the
/// warp-specialised tiles of 16-bit queries (Traits::kTmaQ) with the host's descriptor, and only
/// a tile of the request's own rows (the rows past its queries would be another request's:
/// load_q_tile zero-fills them).
template <typename Traits, typename Params>
TESSERA_DEVICE bool q_tile_by_tma(const Params& p, const RequestExtent& e, int packed_begin) {
  return Traits::kTmaQ && p.q_tma.enabled != 0 && packed_begin + Traits::CTA_TILE_Q <= e.qo_len * p.group_size;
}

/// Loads a query tile (q_tile_by_tma) with TMA: the first producer thread adds its bytes to the Q
/// buffer's full barrier and issues one box per swizzled column block; the packed rows (query
/// p / group, head p % group) are the box's (query, head) order.
template <typename Traits, typename Params, typename T>
TESSERA_DEVICE void load_q_tile_tma(const Params& p, const RequestExtent& e, int kv_head, int packed_begin, T* q_smem,
                                    uint64_t* full) {
  static_assert(Traits::kTmaQ, "the warp-specialised tiles of 16-bit queries");
  if (loader_thread<Traits>() != 0) return;
  using Tile = typename Traits::template SmemTile<Traits::CTA_TILE_Q>;
  constexpr int kBlocks = Traits::kSmemRowChunks / Tile::kAtomChunks;
  const uint32_t dst = smem_addr(q_smem);
  const int first_query = e.q_begin + packed_begin / p.group_size;  // packed_begin: a multiple of the group
  mbarrier_expect_tx(full, static_cast<uint32_t>(Traits::kQTileBytes));
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    tma_load_4d(dst + blk * Tile::kBlockBytes, &p.q_tma.map, blk * Tile::kAtomChunks * Traits::kChunkElems, 0,
                first_query, kv_head, full);
  }
}

/// The page / column-block id of KV row `row` of the tile starting at kv_begin (the page-table
/// load), or -1 at or past kv_end (the end of the CTA's KV range). Loaded one tile before
/// resolve_kv_rows consumes it, so its latency hides behind a tile of computation.
template <typename Traits, KVFormatKind kFormat, typename Params>
TESSERA_DEVICE int32_t load_kv_block_id(const Params& p, const RequestExtent& e, int kv_end, int kv_begin, int row) {
  const int pos = kv_begin + row;
  return row < Traits::CTA_TILE_KV && pos < kv_end ? KVFormat<kFormat>::row_block(p, e, pos) : -1;
}

/// A row-table entry: the global byte address of a K or V row of the CTA's KV head; a missing
/// row's entry is the tensor's base, never read (the copy zero-fills). The K entry of a missing
/// row also has bit 0 set (`tag`; rows are 16-byte aligned, so the bit is free): it is the
/// predicate of both copies of the row (cp_async_16x2_tagged). Keeping whole addresses makes each
/// 16-byte copy a table load, one add and a predicated cp.async.
struct RowAddress {
  static TESSERA_DEVICE uint64_t make(const void* base, int64_t elem_offset, int elem_bytes, bool valid, bool tag) {
    const uint64_t b = reinterpret_cast<uint64_t>(base);
    return valid ? b + static_cast<uint64_t>(elem_offset * elem_bytes) : (tag ? b | 1u : b);
  }
};

/// Resolves where KV rows kv_begin .. kv_begin + CTA_TILE_KV - 1 live, thread `row` handling row
/// `row` with its block id from load_kv_block_id, into the row table; rows at or past kv_end are
/// missing (zero-filled and masked). A barrier separates this from the copies, so the copying
/// threads hold no per-row registers while the accumulators are live.
template <typename Traits, KVFormatKind kFormat, typename Params>
TESSERA_DEVICE void resolve_kv_rows(const Params& p, const RequestExtent& e, int kv_head, int kv_end, int kv_begin,
                                    int32_t block, uint64_t* row_table, int32_t* row_keys) {
  static_assert(Traits::CTA_TILE_KV <= Traits::kLoaderThreads, "one thread per KV row");
  const int row = loader_thread<Traits>();
  if (row >= Traits::CTA_TILE_KV) return;
  const int pos = kv_begin + row;
  KVRow r{0, 0, -1, false};
  if (pos < kv_end) r = KVFormat<kFormat>::row_in_block(p, e, pos, block);
  constexpr int kElem = static_cast<int>(sizeof(typename Params::KVType));
  row_table[2 * row] = RowAddress::make(p.kv.k, r.k_offset + kv_head * p.kv.k_head_stride, kElem, r.valid, true);
  row_table[2 * row + 1] = RowAddress::make(p.kv.v, r.v_offset + kv_head * p.kv.v_head_stride, kElem, r.valid, false);
  row_keys[row] = r.valid ? r.key : -1;
}

/// Which rows load_kv_tile copies: K and V together, or (warp-specialised tiles, whose V stages
/// free later than their K stages) only one of them.
enum class KVPart : int { kBoth = 0, kK = 1, kV = 2 };

/// Copies the K and V rows resolved in the row table into one stage: its K tile at k_smem, its V
/// tile at v_smem. With equal head dims V lies kVFromK bytes after K in every stage (PrefillSmem),
/// in the same layout, so a chunk's two copies share one destination offset; otherwise
/// load_kv_tile_split_dims. Missing rows are zero-filled.
template <typename Traits, KVPart kPart = KVPart::kBoth, typename T>
TESSERA_DEVICE void load_kv_tile(const uint64_t* row_table, T* k_smem, T* v_smem);

template <typename Traits, KVPart kPart, typename T>
TESSERA_DEVICE void load_kv_tile_split_dims(const uint64_t* row_table, T* k_smem, T* v_smem);

template <typename Traits, KVPart kPart, typename T>
TESSERA_DEVICE void load_kv_tile(const uint64_t* row_table, T* k_smem, T* v_smem) {
  static_assert(!Traits::kDequantizeKV, "fp8 KV lands in the raw ring: load_kv_raw_tile");
  if constexpr (Traits::kSplitHeadDims) {
    load_kv_tile_split_dims<Traits, kPart>(row_table, k_smem, v_smem);
    return;
  }
  constexpr uint32_t kVFromK = Traits::kTileStages * Traits::kKTileBytes;
  using Tile = typename Traits::template SmemTile<Traits::CTA_TILE_KV>;
  // Threads span kLoaderRowChunks chunk columns; those past the row's data copy nothing.
  static_assert((Traits::CTA_TILE_KV * Traits::kLoaderRowChunks) % Traits::kLoaderThreads == 0, "whole passes");
  static_assert(Traits::kLoaderThreads % Traits::kLoaderRowChunks == 0, "a thread keeps its chunk column");
  constexpr int kRowsPerPass = Traits::kLoaderThreads / Traits::kLoaderRowChunks;
  constexpr int kRowsPerThread = Traits::CTA_TILE_KV * Traits::kLoaderRowChunks / Traits::kLoaderThreads;
  // Table entries are read in batches before any copy of the batch is issued: ptxas pads an
  // LDGSTS that closely follows the shared-memory load of its address with three never-executed
  // LDS (a hazard guard), 3 of ~11 instructions per 16-byte copy when loads and copies alternate.
  // One 16-byte load fetches a row's K and V entries (adjacent in the table; a V copy takes its
  // predicate from the K entry's tag).
  constexpr int kBatch = kRowsPerThread < 4 ? kRowsPerThread : 4;
  static_assert(kRowsPerThread % kBatch == 0, "whole batches");
  const int tid = loader_thread<Traits>();
  const int chunk = tid % Traits::kLoaderRowChunks, row0 = tid / Traits::kLoaderRowChunks;
  if (Traits::kLoaderRowChunks != Traits::kRowChunks && chunk >= Traits::kRowChunks) return;
  // When a pass spans whole 8-row swizzle periods, this thread's swizzled chunk is the same in
  // every row it copies, and its destinations are one base plus constant strides (immediates).
  constexpr bool kFixedSwizzle = kRowsPerPass % 8 == 0;
  const uint32_t k_base = smem_addr(k_smem);
  // The table's entries through a 32-bit shared-window address: NVRTC's NVVM keeps shared
  // pointers 64-bit and computed each entry's address in 64 bits before truncating it (nvcc
  // narrows it itself); JIT variant kernels ran 1.5% faster with this (bench/results/LOG.md,
  // session 40).
  const uint32_t table = smem_addr(row_table);
  auto dst_offset = [&](int j) -> uint32_t {
    return kFixedSwizzle ? (Tile::chunk_offset(row0, chunk) + j * kRowsPerPass * Tile::kRowStrideChunks) * 16
                         : Tile::chunk_offset(row0 + j * kRowsPerPass, chunk) * 16;
  };
#pragma unroll
  for (int j0 = 0; j0 < kRowsPerThread; j0 += kBatch) {
    ulonglong2 entries[kBatch];  // [row of the batch]: {K entry (tagged), V entry}
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      entries[b] = ld_shared_u64x2(table + 16 * (row0 + (j0 + b) * kRowsPerPass));
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      // chunk * 16 keeps bit 0, the K entry's tag
      const uint64_t k_src = entries[b].x + chunk * 16, v_src = entries[b].y + chunk * 16;
      const uint32_t dst = k_base + dst_offset(j0 + b);
      if constexpr (kPart == KVPart::kBoth) {
        cp_async_16x2_tagged(dst, dst + kVFromK, k_src, v_src);
      } else if constexpr (kPart == KVPart::kK) {
        cp_async_16_tagged(dst, k_src, k_src);
      } else {
        cp_async_16_tagged(dst + kVFromK, k_src, v_src);
      }
    }
  }
}

/// load_kv_tile for V rows narrower than K rows (Traits::kSplitHeadDims). Both rows are whole
/// 8-chunk (128-byte) blocks, the swizzle's period in both layouts, so a thread keeps one chunk
/// column c of every block and the rows row0 + k * kRowsPerPass (kRowsPerPass a multiple of 8:
/// the swizzled chunk is the same in all of them): per row it loads the table entry once and
/// copies K's kRowChunks / 8 chunks and V's kVRowChunks / 8, every thread the same number (a
/// column per chunk of the longer row left the threads past V's columns idle for V and doubled
/// the busiest threads' copies, 64 against 40 at 192 / 128).
template <typename Traits, KVPart kPart, typename T>
TESSERA_DEVICE void load_kv_tile_split_dims(const uint64_t* row_table, T* k_smem, T* v_smem) {
  using KTile = typename Traits::template SmemTile<Traits::CTA_TILE_KV>;
  using VTile = typename Traits::template VSmemTile<Traits::CTA_TILE_KV>;
  constexpr int kBlockChunks = 8;
  constexpr int kKBlocks = Traits::kRowChunks / kBlockChunks, kVBlocks = Traits::kVRowChunks / kBlockChunks;
  constexpr int kRowsPerPass = Traits::kLoaderThreads / kBlockChunks;
  constexpr int kRowsPerThread = Traits::CTA_TILE_KV / kRowsPerPass;
  // Entries loaded ahead of their copies (the LDS -> LDGSTS hazard padding, load_kv_tile): 4 rows,
  // 2 in the producer warpgroup, whose 56 registers spilled 56-60 bytes with 4 in the persistent
  // kernel (20-24 with 2: bench/results/LOG.md).
  constexpr int kBatch = kRowsPerThread < 2 ? kRowsPerThread : Traits::kWarpSpecialized || kRowsPerThread < 4 ? 2 : 4;
  static_assert(Traits::kRowChunks % kBlockChunks == 0 && Traits::kVRowChunks % kBlockChunks == 0,
                "K and V rows of whole 128-byte blocks");
  static_assert(Traits::kLoaderThreads % kBlockChunks == 0 && kRowsPerPass % 8 == 0 &&
                    Traits::CTA_TILE_KV % kRowsPerPass == 0 && kRowsPerThread % kBatch == 0,
                "passes of whole swizzle periods over the tile; whole batches");
  const int tid = loader_thread<Traits>();
  const int chunk = tid % kBlockChunks, row0 = tid / kBlockChunks;
  // Destinations are one base per tile plus immediates: a further pass adds whole rows, a further
  // block 8 chunks of the row (mma.sync rows) or a block of all rows (wgmma column blocks). Left
  // to chunk_offset per copy, the persistent kernel hoisted the 40 offsets out of its item loop and
  // spilled them.
  constexpr uint32_t kKRowStep = kRowsPerPass * KTile::kRowStrideChunks * 16;
  constexpr uint32_t kVRowStep = kRowsPerPass * VTile::kRowStrideChunks * 16;
  constexpr uint32_t kBlockStep = (Traits::kWgmma ? Traits::CTA_TILE_KV * kBlockChunks : kBlockChunks) * 16;
  const uint32_t k_dst0 = smem_addr(k_smem) + KTile::chunk_offset(row0, chunk) * 16;
  const uint32_t v_dst0 = smem_addr(v_smem) + VTile::chunk_offset(row0, chunk) * 16;
#pragma unroll
  for (int j0 = 0; j0 < kRowsPerThread; j0 += kBatch) {
    ulonglong2 entries[kBatch];  // [row of the batch]: {K entry (tagged), V entry}
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      entries[b] = *reinterpret_cast<const ulonglong2*>(row_table + 2 * (row0 + (j0 + b) * kRowsPerPass));
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int j = j0 + b;
      const uint64_t k_src = entries[b].x + chunk * 16;  // keeps bit 0, the K entry's tag
      if constexpr (kPart != KVPart::kV) {
#pragma unroll
        for (int blk = 0; blk < kKBlocks; ++blk) {
          cp_async_16_tagged(k_dst0 + j * kKRowStep + blk * kBlockStep, k_src, k_src + blk * kBlockChunks * 16);
        }
      }
      if constexpr (kPart != KVPart::kK) {
#pragma unroll
        for (int blk = 0; blk < kVBlocks; ++blk) {
          cp_async_16_tagged(v_dst0 + j * kVRowStep + blk * kBlockStep, k_src,
                             entries[b].y + (blk * kBlockChunks + chunk) * 16);
        }
      }
    }
  }
}

/// fp8 KV: where this loader thread's 16-byte chunks of a raw stage are: one chunk column
/// (`chunk`), rows row0 + j * kRowsPerPass (load_kv_raw_tile copies them, convert_raw_chunks
/// converts them).
template <typename Traits>
struct RawChunkShare {
  static constexpr int kChunks = Traits::kRawRowChunks;
  static_assert(Traits::kLoaderThreads % kChunks == 0 && (Traits::CTA_TILE_KV * kChunks) % Traits::kLoaderThreads == 0,
                "a thread keeps its chunk column; whole passes");
  static constexpr int kRowsPerPass = Traits::kLoaderThreads / kChunks;
  static constexpr int kRowsPerThread = Traits::CTA_TILE_KV / kRowsPerPass;
  int chunk, row0;
  TESSERA_DEVICE RawChunkShare() : chunk(loader_thread<Traits>() % kChunks), row0(loader_thread<Traits>() / kChunks) {}
};

/// fp8 KV: copies the K and V rows (kPart: or one of them) resolved in the row table, as stored
/// (HEAD_DIM bytes a row), into raw stage k_raw (its V stage kVFromK bytes further: kRawStages *
/// kRawTileBytes; FP8 attention's V-only copies pass their raw stage as k_raw and 0);
/// Traits::RawTile; missing rows are zero-filled. A thread keeps one 16-byte chunk column, as
/// load_kv_tile does (RawChunkShare).
template <typename Traits, KVPart kPart = KVPart::kBoth,
          uint32_t kVFromK = static_cast<uint32_t>(Traits::kRawStages * Traits::kRawTileBytes)>
TESSERA_DEVICE void load_kv_raw_tile(const uint64_t* row_table, uint8_t* k_raw) {
  static_assert(Traits::kDequantizeKV || (Traits::kTransposedV && kPart == KVPart::kV), "fp8 KV, or FP8 attention's V");
  using RawTile = typename Traits::RawTile;
  using Share = RawChunkShare<Traits>;
  constexpr int kRowsPerPass = Share::kRowsPerPass, kRowsPerThread = Share::kRowsPerThread;
  const Share share;
  const int chunk = share.chunk, row0 = share.row0;
  // Passes step whole swizzle periods (8 lines), so the thread's swizzled chunk is fixed.
  static_assert(kRowsPerPass % (8 * RawTile::kRowsPerLine) == 0, "passes of whole swizzle periods");
  const uint32_t dst0 = smem_addr(k_raw) + RawTile::chunk_offset(row0, chunk) * 16;
  // The table entries first, then the copies (load_kv_tile: the LDS -> LDGSTS hazard padding), in
  // batches of 4 rows for FP8 attention, whose producer also holds the next tile's K copy state
  // (all rows at once spilled 8-12 bytes there), and for fp8 KV converted in place (likewise).
  constexpr int kBatch = (Traits::kTransposedV || Traits::kConvertInPlace) && kRowsPerThread % 4 == 0 ? 4 : kRowsPerThread;
#pragma unroll
  for (int j0 = 0; j0 < kRowsPerThread; j0 += kBatch) {
    ulonglong2 entries[kBatch];  // [row of the batch]: {K entry (tagged), V entry}
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      entries[b] = *reinterpret_cast<const ulonglong2*>(row_table + 2 * (row0 + (j0 + b) * kRowsPerPass));
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const uint32_t dst = dst0 + (j0 + b) * kRowsPerPass * RawTile::kRowStrideBytes;
      const uint64_t k_src = entries[b].x + chunk * 16, v_src = entries[b].y + chunk * 16;  // keeps the tag
      if constexpr (kPart == KVPart::kBoth) {
        cp_async_16x2_tagged(dst, dst + kVFromK, k_src, v_src);
      } else if constexpr (kPart == KVPart::kK) {
        cp_async_16_tagged(dst, k_src, k_src);
      } else {
        cp_async_16_tagged(dst + kVFromK, k_src, v_src);
      }
    }
  }
}

/// fp8 KV, warp-specialised: converts the chunks this producer thread copied into raw stage `raw`
/// (RawChunkShare; its own copies, so after its own cp.async wait and no barrier) into the T
/// stage `tile` in the wgmma layout, times `scale` when kScaled. kBatch chunks' loads are issued
/// before their conversions (one warp per scheduler: a chunk at a time left every load's latency
/// in the chain), in a rolled loop over batches: the producer runs on few registers.
/// Traits::kConvertInPlace: `raw` is `tile`'s own upper column blocks (InPlaceRawTile), where the
/// 16-bit chunks that land on stored bytes land on their own row's, which only that row's threads
/// read, all in one warp: each batch's loads precede a __syncwarp, and its stores follow it.
template <typename Traits, typename F8, bool kScaled, typename T>
TESSERA_DEVICE void convert_raw_chunks(const uint8_t* raw, T* tile, float scale) {
  static_assert(Traits::kDequantizeKV && Traits::kWarpSpecialized, "the producer's conversion");
  using Tile = typename Traits::template SmemTile<Traits::CTA_TILE_KV>;
  using RawTile = typename Traits::RawTile;
  using Share = RawChunkShare<Traits>;
  constexpr int kBatch = Traits::kProducerRegs >= 56 && Share::kRowsPerThread % 4 == 0 ? 4 : 2;
  static_assert(Share::kRowsPerThread % kBatch == 0, "whole batches");
  const Share share;
#pragma unroll 1
  for (int j0 = 0; j0 < Share::kRowsPerThread; j0 += kBatch) {
    uint4 stored[kBatch];  // [batch]: 16 stored elements of this thread's chunk column
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int row = share.row0 + (j0 + b) * Share::kRowsPerPass;
      stored[b] = *reinterpret_cast<const uint4*>(raw + RawTile::chunk_offset(row, share.chunk) * 16);
    }
    if constexpr (Traits::kConvertInPlace) {
      static_assert(kWarpSize % Share::kChunks == 0, "a stored row's threads in one warp");
      static_assert(in_place_conversion_stays_in_its_row<Tile, RawTile, Traits::CTA_TILE_KV, Share::kChunks>(),
                    "in place, a row's conversion overwrites only its own stored chunks");
      __syncwarp();  // the rows' stored chunks are read before any of them is overwritten
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int row = share.row0 + (j0 + b) * Share::kRowsPerPass;
      Vec<T> out[2];  // [2][8]: T chunks 2 * chunk and 2 * chunk + 1 of the row
      dequantize_vec16<F8, kScaled>(stored[b], scale, out);
      out[0].store(tile + Tile::chunk_offset(row, 2 * share.chunk) * 8);
      out[1].store(tile + Tile::chunk_offset(row, 2 * share.chunk + 1) * 8);
    }
  }
}

/// FP8 attention: transposes the raw V stage `raw` ([CTA_TILE_KV][HEAD_DIM_VO] bytes as stored,
/// Traits::RawTile) into the V stage `vt` ([HEAD_DIM_VO][CTA_TILE_KV], VSmemTile: K-major, the
/// layout fp8 wgmma reads B in), every producer thread a share, after every thread's copies into
/// `raw` have landed (a loader barrier).
/// The keys of each 16-key half of a k32 step are permuted so that P's A fragment is the S
/// accumulators packed in place (pack_p_fragments): byte j of the A word holding columns 4t ..
/// 4t + 3 comes from S column 2t, 2t + 1, 2t + 8, 2t + 9 (j = 0 .. 3), so row d of vt holds
/// V[16 kh + {2t, 2t + 1, 2t + 8, 2t + 9}][d] at bytes 16 kh + 4t + {0, 1, 2, 3}.
/// A warp moves 16 keys x 32 columns per step with 16-bit matrix instructions: ldmatrix.trans of
/// the 8x8 b16 blocks (keys 16 kh + 0..7 and 8..15, columns 32 dc .. + 15 and + 16 .. + 31) gives
/// lane (g, t) the pairs of keys 2t, 2t + 1 and 2t + 8, 2t + 9 at columns 2g, 2g + 1 (of each
/// 16), which two prmt turn into the vt words of rows 2g and 2g + 1: exactly the permuted order.
/// stmatrix stores them, rows chosen by address. (Byte-wise loads, prmt and stores per 4 x 4 block
/// took 3x the instructions, and the producer's transpose bounded the tile: bench/results/LOG.md.)
/// Lanes with g >= 4 swap their even and odd rows between registers, so that each stored matrix
/// holds rows of 8 different swizzle phases (conflict-free); ldmatrix reads 8 keys at one chunk
/// column, which the raw tile's swizzle spreads.
/// The loads go in batches of kBatch column groups ahead of their permutes and stores: the matrix
/// instructions are volatile asm, kept in source order, so one load per group left each group's
/// shared-memory latency exposed, kColumnGroups times per half on one warp per scheduler.
template <typename Traits>
TESSERA_DEVICE void transpose_v_tile(const uint8_t* raw, uint8_t* vt) {
  static_assert(Traits::kTransposedV && Traits::kLoaderThreads == 128, "the producer warpgroup's transpose");
  using RawTile = typename Traits::RawTile;
  using VTile = typename Traits::template VSmemTile<Traits::CTA_TILE_KV>;
  constexpr int kHalves = Traits::CTA_TILE_KV / 16;       // kh: 16-key halves of P V's k32 steps
  constexpr int kHalvesPerWarp = kHalves / 4;
  constexpr int kColumnGroups = Traits::HEAD_DIM_VO / 32;  // dc: 32 columns each
  constexpr int kBatch = kColumnGroups < 4 ? kColumnGroups : 4;  // loads in flight: 16 registers of the producer's 56
  static_assert(kColumnGroups % kBatch == 0, "whole batches of column groups");
  constexpr int kRawRowBytes = Traits::kRawRowChunks * 16;
  static_assert(kHalves % 4 == 0 && RawTile::kRowsPerLine == 1, "4 producer warps x whole halves; whole raw lines");
  const int lane = loader_thread<Traits>() % kWarpSize, warp = loader_thread<Traits>() / kWarpSize;
  const int g = lane / 4, m = lane / 8, r = lane % 8;  // fragment row; the matrix and row this lane addresses
  const bool swap = g >= 4;
  const uint32_t sel_even = swap ? 0x7531u : 0x6420u, sel_odd = swap ? 0x6420u : 0x7531u;
  // ldmatrix: matrix m is keys 8 (m & 1) + r of the half, chunk 2 dc + (m >> 1).
  const int src_key = 8 * (m & 1) + r;
  // stmatrix: matrix m's row r is vt row 16 (m >> 1) + 2r + ((m & 1) ^ (r >= 4)) of the group.
  const int dst_row = 16 * (m >> 1) + 2 * r + ((m & 1) ^ (r >= 4 ? 1 : 0));
  const uint32_t raw_base = smem_addr(raw), vt_base = smem_addr(vt);
#pragma unroll
  for (int i = 0; i < kHalvesPerWarp; ++i) {
    const int kh = warp + 4 * i;
    const int key = 16 * kh + src_key;
    // Rows 32 apart share the swizzle of both tiles: a base per half, plus a constant per group.
    const uint32_t src = raw_base + static_cast<uint32_t>(key * kRawRowBytes);
    const uint32_t dst = vt_base + VTile::chunk_offset(dst_row, kh) * 16;
#pragma unroll
    for (int dc0 = 0; dc0 < kColumnGroups; dc0 += kBatch) {
      uint32_t v[kBatch][4];  // [group]: keys 2t, 2t + 1 | 2t + 8, 2t + 9 at columns 2g, 2g + 1 | the same 16 further
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        ldmatrix_x4_trans(v[b], src + ((2 * (dc0 + b) + (m >> 1)) ^ RawTile::swizzle(key)) * 16);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const uint32_t w[4] = {__byte_perm(v[b][0], v[b][1], sel_even), __byte_perm(v[b][0], v[b][1], sel_odd),
                               __byte_perm(v[b][2], v[b][3], sel_even), __byte_perm(v[b][2], v[b][3], sel_odd)};
        stmatrix_x4(dst + 32 * (dc0 + b) * VTile::kRowStrideChunks * 16, w);
      }
    }
  }
}

/// fp8 KV: dequantizes rows [first_row, first_row + ROWS) of raw stage k_raw (K, and V kStages *
/// kRawTileBytes further) into the swizzled T tiles k_tile and v_tile, with THREADS threads (this
/// one is `tid`); K times k_scale and V times v_scale when kScaled, else as stored (the scales
/// are applied to the logits and the output instead). Zero-filled (missing) rows stay zero. A
/// thread takes 16-byte chunks of stored rows in turn, K's then V's: one tensor at a time keeps
/// the live registers to one chunk's. kUnrollRows: the rows' loads in flight together (the decode
/// tiles, whose accumulators are few); rolled, the 128-row tiles, whose O and S accumulators are
/// live here, convert without spilling (unrolled: 64-92 bytes at head_dim 128).
template <typename Traits, typename F8, bool kScaled, bool kUnrollRows, int ROWS, int THREADS, typename T>
TESSERA_DEVICE void dequantize_kv_rows(const uint8_t* k_raw, T* k_tile, T* v_tile, float k_scale, float v_scale,
                                       int first_row, int tid) {
  static_assert(Traits::kDequantizeKV, "fp8 KV");
  using Tile = typename Traits::template SmemTile<Traits::CTA_TILE_KV>;
  constexpr int kChunks = Traits::kRawRowChunks;
  using RawTile = typename Traits::RawTile;
  constexpr int kVFromK = Traits::kStages * Traits::kRawTileBytes;
  constexpr int kPasses = ROWS * kChunks / THREADS;
  static_assert(THREADS % kChunks == 0 && (ROWS * kChunks) % THREADS == 0, "a thread keeps its chunk column; whole passes");
  const int chunk = tid % kChunks, row0 = first_row + tid / kChunks;
  // Passes of whole swizzle periods keep the thread's stored chunk (the CTA-wide conversions,
  // whose rolled loop would otherwise carry the per-row arithmetic into spills).
  constexpr bool kFixedSwizzle = (THREADS / kChunks) % (8 * RawTile::kRowsPerLine) == 0;
  const int fixed_chunk = chunk ^ RawTile::swizzle(row0);
#pragma unroll
  for (int part = 0; part < 2; ++part) {
    const uint8_t* raw = k_raw + (part == 0 ? 0 : kVFromK);  // [CTA_TILE_KV][HEAD_DIM] stored bytes
    T* tile = part == 0 ? k_tile : v_tile;
    const float scale = part == 0 ? k_scale : v_scale;
    auto convert = [&](int j) {
      const int row = row0 + j * (THREADS / kChunks);
      Vec<T> out[2];  // [2][8]: T chunks 2 * chunk and 2 * chunk + 1 of the row
      const int stored = kFixedSwizzle ? row * kChunks + fixed_chunk : RawTile::chunk_offset(row, chunk);
      dequantize_vec16<F8, kScaled>(*reinterpret_cast<const uint4*>(raw + stored * 16), scale, out);
      out[0].store(tile + Tile::chunk_offset(row, 2 * chunk) * 8);
      out[1].store(tile + Tile::chunk_offset(row, 2 * chunk + 1) * 8);
    };
    if constexpr (kUnrollRows) {
#pragma unroll
      for (int j = 0; j < kPasses; ++j) convert(j);
    } else {
#pragma unroll 1
      for (int j = 0; j < kPasses; ++j) convert(j);
    }
  }
}

/// The KV tiles of one work item: the variant's visible span cut into CTA_TILE_KV-row tiles (those
/// of the sink segment, then those of the main segment), visited in that order or, with
/// kNearestFirst, last first. A bias that grows towards the diagonal (ALiBi: 65 base-2 units per
/// 64-key tile at slope 2^-0.5) moves the softmax's reference max, and rescales O, on nearly every
/// tile when the far keys come first; nearest first, a row's max is set by its first tiles. Other
/// variants keep the forward order, which measured faster for them (bench/results/LOG.md).
/// kMaskList (kVisitsMaskTileLists): given the runtime's mask tile list of the work item
/// (custom_mask.cuh), only the tiles it lists are visited, so every role of the CTA (loads, MMAs,
/// softmax) skips the tiles a custom mask hides from all of the item's rows alike; `count` is then
/// the listed tiles.
template <int kTileKV, bool kNearestFirst, bool kMaskList = false>
struct KVTiles {
  KVSpan span;
  int seg0_tiles;
  int count;
  const uint8_t* groups = nullptr;      // kMaskList: the item's visited groups, or null (every tile)
  const uint8_t* whole_bits = nullptr;  // kMaskList: the item's whole-group bits, or null (no list)
  int group_shift = 0;                  // log2 of the tiles per group

  TESSERA_DEVICE explicit KVTiles(const KVSpan& s, const uint8_t* mask_list = nullptr) : span(s) {
    seg0_tiles = s.seg0_end > s.seg0_begin ? (s.seg0_end - s.seg0_begin + kTileKV - 1) / kTileKV : 0;
    const int main_tiles = s.end > s.begin ? (s.end - s.begin + kTileKV - 1) / kTileKV : 0;
    count = seg0_tiles + main_tiles;
    if constexpr (kMaskList) {
      if (mask_list != nullptr) {
        // The lists' kernel ran just before (the host launches this kernel as its dependent).
        wait_for_prerequisite_grids();
        const int listed = static_cast<int>(__ldg(reinterpret_cast<const uint32_t*>(mask_list)));
        group_shift = mask_tile_group_shift(count);
        whole_bits = mask_list + kMaskTileWholeBitsOffset;
        // An item whose tiles are all listed (a tree's prefix: most speculative-decoding items)
        // visits them without reading the group indices per tile.
        if (listed != count) {
          count = listed;
          groups = mask_list + kMaskTileGroupsOffset;
        }
      }
    }
  }
  /// First KV position of the t-th tile visited and the end of its segment (rows at or past it
  /// are masked).
  TESSERA_DEVICE int begin(int t) const {
    const int r = position(t);
    return r < seg0_tiles ? span.seg0_begin + r * kTileKV : span.begin + (r - seg0_tiles) * kTileKV;
  }
  TESSERA_DEVICE int end(int t) const {
    // Lists come with variants without a sink segment (kVisitsMaskTileLists): one segment.
    if constexpr (kMaskList) return span.end;
    return position(t) < seg0_tiles ? span.seg0_end : span.end;
  }
  /// What the item's list says of the custom mask over the t-th tile visited (kUnknown without
  /// a list).
  TESSERA_DEVICE MaskTileCover mask_cover(int t) const {
    if constexpr (kMaskList) {
      if (whole_bits != nullptr) {
        const int g = position(t) >> group_shift;
        return (__ldg(whole_bits + (g >> 3)) >> (g & 7)) & 1u ? MaskTileCover::kWhole : MaskTileCover::kPartial;
      }
    }
    return MaskTileCover::kUnknown;
  }

 private:
  /// Position in the span of the t-th tile visited.
  TESSERA_DEVICE int position(int t) const {
    const int v = kNearestFirst ? count - 1 - t : t;
    if constexpr (kMaskList) {
      // Every visited group but the item's last is whole, so tile v is in the (v >> shift)-th.
      if (groups != nullptr) return (__ldg(groups + (v >> group_shift)) << group_shift) + (v & ((1 << group_shift) - 1));
    }
    return v;
  }
};

/// One work tile as a scheduler hands it out: packed rows packed_begin .. + CTA_TILE_Q - 1 of
/// `request` (extent e), the query heads of kv_head, against the KV positions of `span` (clipped
/// by the variant to what the tile's rows may see); its result goes to `out`.
struct PrefillWork {
  RequestExtent e;
  int request;
  int kv_head;
  int packed_begin;
  KVSpan span;
  TileOutput out;
  const uint8_t* mask_tile_list = nullptr;  // the runtime's mask tile list of the item (KVTiles), or null
};

/// The KV rows of one work tile as the loaders see them. Each KV tile goes through three steps:
/// its page-table entries are loaded into `block` (one per thread and row, a tile ahead so the
/// latency hides behind a tile of computation), resolved into a row table (addresses and keys),
/// and copied into a stage by cp.async. Row tables form a ring (Traits::kRowTables), indexed by
/// the CTA's running tile count when warp-specialised so the ring carries on across work items.
template <typename Traits, KVFormatKind kFormat, typename Variant, typename Params>
struct KVTileSource {
  using Tiles = KVTiles<Traits::CTA_TILE_KV, Variant::kLinearKeyBias, kVisitsMaskTileLists<Variant>>;
  static_assert(!kVisitsMaskTileLists<Variant> || !Variant::kSinks, "listed tiles lie in one segment");
  // Whole tiles of ragged (and dense) KV, and of paged KV inside one page or of whole pages, by
  // TMA where the host encoded descriptors (copy_tma).
  static constexpr bool kTma = (kFormat == KVFormatKind::kRagged || kFormat == KVFormatKind::kPaged) && Traits::kTmaKV;
  static constexpr int kKTileElems = Traits::kKTileElems;  // a stage's K tile: stored rows (PrefillTraits)
  static constexpr int kVTileElems = Traits::kVTileElems;  // ... and its V tile
  const Params& p;
  const RequestExtent& e;
  const int kv_head;
  const Tiles tiles;
  const PrefillSmem<Traits>& smem;
  const uint32_t tiles_before;  // the CTA's tiles of earlier work items (warp-specialised), else 0
  int32_t block = -1;           // page / column-block id of this thread's row of the next tile to resolve
  // Paged TMA: the page of this thread's row of the last two tiles resolved (even and odd tiles),
  // which the boxes starting at that row read (V is copied a tile after K, past the next resolve).
  int32_t tma_page[2] = {-1, -1};
  // fp8 KV: the KV head's dequantization scales. With the default variant, K's scale multiplies
  // the logits' scale and V's the output, both once per work item, so the tiles hold the stored
  // values converted (exact, and one cvt per pair into f16); a variant's hooks see logits, keys
  // and values, so there the tiles hold the dequantized values.
  // FP8 attention folds its scales the same way, q's with k's: logits q . k x q_scale x k_scale.
  static constexpr bool kFoldScales = (Traits::kDequantizeKV || Traits::kFp8Operands) && kSameType<Variant, DefaultVariant>;
  float k_scale = 1.f, v_scale = 1.f;

  TESSERA_DEVICE KVTileSource(const Params& p_, const PrefillWork& w, const PrefillSmem<Traits>& smem_,
                              uint32_t tiles_before_)
      : p(p_), e(w.e), kv_head(w.kv_head), tiles(w.span, w.mask_tile_list), smem(smem_), tiles_before(tiles_before_) {
    if constexpr (Traits::kDequantizeKV || Traits::kFp8Operands) {
      k_scale = p.kv_scales.k_scale(kv_head);
      v_scale = p.kv_scales.v_scale(kv_head);
    }
    if constexpr (Traits::kFp8Operands) k_scale *= p.kv_scales.q_scale(kv_head);
  }

  TESSERA_DEVICE int count() const { return tiles.count; }
  TESSERA_DEVICE int table_slot(int tile) const {
    return static_cast<int>((tiles_before + tile) % Traits::kRowTables);
  }
  TESSERA_DEVICE uint64_t* row_table(int tile) const { return smem.rows + table_slot(tile) * 2 * Traits::CTA_TILE_KV; }
  /// [CTA_TILE_KV] keys of the tile's rows (-1: missing, masked).
  TESSERA_DEVICE const int32_t* keys(int tile) const { return smem.row_keys + table_slot(tile) * Traits::CTA_TILE_KV; }

  /// Loads the page-table entry of this thread's row of `tile` (-1 past the last tile).
  TESSERA_DEVICE void load_block_id(int tile) {
    block = tile < tiles.count ? load_kv_block_id<Traits, kFormat>(p, e, tiles.end(tile), tiles.begin(tile),
                                                                   loader_thread<Traits>())
                               : -1;
  }
  /// Resolves `tile` into its row table with the entry loaded before, then loads the next one.
  TESSERA_DEVICE void resolve(int tile) {
    if constexpr (kTma && kFormat == KVFormatKind::kPaged) {
      // Selects, not an index: a register array indexed at run time would live in local memory.
      if (tile & 1) {
        tma_page[1] = block;
      } else {
        tma_page[0] = block;
      }
    }
    if (tile < tiles.count) {
      resolve_kv_rows<Traits, kFormat>(p, e, kv_head, tiles.end(tile), tiles.begin(tile), block,
                                       smem.rows + table_slot(tile) * 2 * Traits::CTA_TILE_KV,
                                       smem.row_keys + table_slot(tile) * Traits::CTA_TILE_KV);
    }
    load_block_id(tile + 1);
  }
  /// Copies the K (and V) rows of a resolved tile into stage `stage` (kPart: which of them); fp8
  /// KV into the raw ring's stage.
  template <KVPart kPart = KVPart::kBoth>
  TESSERA_DEVICE void copy(int tile, int stage) const {
    if constexpr (Traits::kConvertInPlace) {
      // The stored rows into the upper half of the K or V stage (Traits::RawTile: InPlaceRawTile),
      // which convert_in_place converts.
      static_assert(kPart != KVPart::kBoth, "K and V stages are acquired on their own");
      constexpr bool kK = kPart == KVPart::kK;
      load_kv_raw_tile<Traits, kPart, 0>(
          row_table(tile), reinterpret_cast<uint8_t*>(kK ? smem.k + stage * kKTileElems : smem.v + stage * kVTileElems));
    } else if constexpr (Traits::kDequantizeKV) {
      // Warp-specialised: the one raw stage (convert_raw moves it into T stage `stage`).
      const int raw_stage = Traits::kWarpSpecialized ? 0 : stage;
      load_kv_raw_tile<Traits, kPart>(row_table(tile), smem.raw_k + raw_stage * Traits::kRawTileBytes);
    } else {
      if constexpr (kTma) {
        if (tma_tile(tile)) {
          copy_tma<kPart>(tile, stage);
          return;
        }
      }
      load_kv_tile<Traits, kPart>(row_table(tile), smem.k + stage * kKTileElems, smem.v + stage * kVTileElems);
    }
  }
  /// Whether `tile` goes by TMA: a tile of kTma sources whose rows are all the request's (the
  /// last partial tile of a span gathers through its row table, which zero-fills the missing rows:
  /// the rows after a request's end may be another request's, padding of its last page or not
  /// exist, and a box would bring them in) and, over paged KV, inside one page or (pages smaller
  /// than a tile, KVTmaDescriptors::box_rows) made of whole pages. Its row table is still
  /// resolved: the masks read its keys.
  TESSERA_DEVICE bool tma_tile(int tile) const {
    const int begin = tiles.begin(tile);
    if (!kTma || p.kv_tma.enabled == 0 || begin + Traits::CTA_TILE_KV > tiles.end(tile)) return false;
    if constexpr (kFormat == KVFormatKind::kPaged) {
      const int slot = p.paged.page_div.mod(begin, p.paged.page_div.div(begin));
      return p.kv_tma.box_rows == Traits::CTA_TILE_KV ? slot + Traits::CTA_TILE_KV <= p.paged.page_size : slot == 0;
    }
    return true;
  }
  /// Copies the K (or V) rows of a whole tile into stage `stage` with the copy engine, one box per
  /// column block and box of rows: the producer thread of each box's first row adds the box's
  /// bytes to the stage's full barrier (which every producer thread still arrives on, as for
  /// cp.async copies, and only after its own expectation: the phase cannot complete before every
  /// box is counted) and issues its boxes; the other threads copy nothing. One box of rows is the
  /// whole tile (ragged KV, pages of a tile or more: the first thread issues), or one page (pages
  /// smaller than a tile: the threads of each page's first row, whose page ids they resolved).
  template <KVPart kPart>
  TESSERA_DEVICE void copy_tma(int tile, int stage) const {
    static_assert(kTma && kPart != KVPart::kBoth, "K and V stages complete on their own barriers");
    constexpr bool kK = kPart == KVPart::kK;
    constexpr int kTileBytes = kK ? Traits::kKTileBytes : Traits::kVTileBytes;
    const int thread = loader_thread<Traits>();
    if constexpr (kFormat == KVFormatKind::kPaged) {
      // No division anywhere on this path: the instructions between a stage freeing and its
      // boxes issuing are on the tile's critical path (bench/results/LOG.md, session 49). A box
      // has at least kMinBoxRows rows (src/kv_tma.h kv_tma_box_rows) and a power of two of them
      // (the tile's, or a page's that divides them), so most producer threads leave at the first
      // test, which reads no parameter, and the rest test a mask.
      constexpr int kMinBoxRows = 16;
      static_assert((Traits::CTA_TILE_KV & (Traits::CTA_TILE_KV - 1)) == 0 && Traits::CTA_TILE_KV >= kMinBoxRows,
                    "a power of two of KV rows a tile, so of rows a box");
      if (thread % kMinBoxRows != 0 || thread >= Traits::CTA_TILE_KV) return;
      const int box_rows = p.kv_tma.box_rows;
      if ((thread & (box_rows - 1)) == 0) {
        copy_tma_box<kPart>(tile, stage, thread, box_rows * (kTileBytes / Traits::CTA_TILE_KV));
      }
    } else {
      if (thread == 0) copy_tma_box<kPart>(tile, stage, 0, kTileBytes);
    }
  }
  /// One box of rows of copy_tma: rows [first, first + bytes / row bytes) of the tile, one box per
  /// column block, its bytes expected on the stage's full barrier.
  template <KVPart kPart>
  TESSERA_DEVICE void copy_tma_box(int tile, int stage, int first, int bytes) const {
    constexpr bool kK = kPart == KVPart::kK;
    using Tile = Conditional<kK, typename Traits::template SmemTile<Traits::CTA_TILE_KV>,
                             typename Traits::template VSmemTile<Traits::CTA_TILE_KV>>;
    constexpr int kRowChunks = kK ? Traits::kSmemRowChunks : Traits::kVSmemRowChunks;
    constexpr int kBlocks = kRowChunks / Tile::kAtomChunks;
    static_assert((kK ? Traits::kKTileBytes : Traits::kVTileBytes) == Traits::CTA_TILE_KV * kBlocks * Tile::kRowBytes,
                  "the boxes fill the stage");
    uint64_t* const full = (kK ? smem.full_k : smem.full_v) + stage;
    const TmaDescriptor* const map = kK ? &p.kv_tma.k : &p.kv_tma.v;
    const uint32_t dst = smem_addr(kK ? smem.k + stage * kKTileElems : smem.v + stage * kVTileElems) +
                         first * Tile::kRowBytes;  // the box's rows of each column block, from row `first`
    // (row in its block, block): ragged KV is one block of rows; paged KV's block is the page of
    // the box's first row, this thread's (a page id out of range lands outside the map:
    // zero-filled, and its rows' keys mask them).
    const int begin = tiles.begin(tile) + first;
    int row = e.kv_begin + begin, page = 0;
    if constexpr (kFormat == KVFormatKind::kPaged) {
      page = (tile & 1) ? tma_page[1] : tma_page[0];
      row = p.paged.page_div.mod(begin, p.paged.page_div.div(begin));
    }
    mbarrier_expect_tx(full, static_cast<uint32_t>(bytes));
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      tma_load_4d(dst + blk * Tile::kBlockBytes, map, blk * Tile::kAtomChunks * Traits::kChunkElems, row, kv_head,
                  page, full);
    }
  }
  /// FP8 attention: copies the V rows of a resolved tile, as stored, into raw stage `raw_stage`
  /// (transpose_v moves them into a V stage).
  TESSERA_DEVICE void copy_v_raw(int tile, int raw_stage) const {
    load_kv_raw_tile<Traits, KVPart::kV, 0>(row_table(tile), smem.raw_v + raw_stage * Traits::kTransposeRawBytes);
  }
  /// FP8 attention: this producer thread's share of transposing raw stage `raw_stage` into V stage
  /// `stage` (after a loader barrier: the raw rows are every thread's copies).
  TESSERA_DEVICE void transpose_v(int raw_stage, int stage) const {
    transpose_v_tile<Traits>(smem.raw_v + raw_stage * Traits::kTransposeRawBytes,
                             reinterpret_cast<uint8_t*>(smem.v + stage * kVTileElems));
  }
  /// fp8 KV: dequantizes rows [first_row, first_row + ROWS) of raw stage `stage` into the T tiles
  /// the MMAs read, with THREADS threads (this one is `tid`; kUnrollRows: see dequantize_kv_rows).
  template <bool kUnrollRows, int ROWS, int THREADS, typename T>
  TESSERA_DEVICE void dequantize(int stage, T* k_tile, T* v_tile, int first_row, int tid) const {
    dequantize_kv_rows<Traits, typename Params::KVType, !kFoldScales, kUnrollRows, ROWS, THREADS>(
        smem.raw_k + stage * Traits::kRawTileBytes, k_tile, v_tile, k_scale, v_scale, first_row, tid);
  }
  /// fp8 KV, warp-specialised: converts this producer thread's chunks of the raw K or V stage into
  /// T stage `stage` (code x scale unless kFoldScales).
  template <KVPart kPart>
  TESSERA_DEVICE void convert_raw(int stage) const {
    static_assert(kPart != KVPart::kBoth, "K and V convert into their own stages");
    constexpr bool kK = kPart == KVPart::kK;
    convert_raw_chunks<Traits, typename Params::KVType, !kFoldScales>(kK ? smem.raw_k : smem.raw_v,
                                                                      kK ? smem.k + stage * kKTileElems
                                                                         : smem.v + stage * kVTileElems,
                                                                      kK ? k_scale : v_scale);
  }
  /// fp8 KV, Traits::kConvertInPlace: converts this producer thread's share of K or V stage
  /// `stage` in place (convert_raw_chunks from the stage's own stored rows), code x scale unless
  /// kFoldScales.
  template <KVPart kPart>
  TESSERA_DEVICE void convert_in_place(int stage) const {
    static_assert(kPart != KVPart::kBoth, "K and V convert into their own stages");
    constexpr bool kK = kPart == KVPart::kK;
    auto* const tile = kK ? smem.k + stage * kKTileElems : smem.v + stage * kVTileElems;  // [CTA_TILE_KV][kSmemRowChunks * 8]
    convert_raw_chunks<Traits, typename Params::KVType, !kFoldScales>(reinterpret_cast<const uint8_t*>(tile), tile,
                                                                      kK ? k_scale : v_scale);
  }
  /// Factors the kernel applies outside the tiles: K's scale on the logits and V's on the output
  /// (fp8 KV with kFoldScales), else 1.
  TESSERA_DEVICE float logits_factor() const { return kFoldScales ? k_scale : 1.f; }
  TESSERA_DEVICE float output_factor() const { return kFoldScales ? v_scale : 1.f; }
};

/// The KV span of a query tile of `tile_rows` packed rows: [kv_first, kv_end) of the request,
/// clipped by causal masking (nothing past the last row's position; the planner mirrors this
/// clip) and by the variant.
template <KVFormatKind kFormat, typename Variant, typename Params>
TESSERA_DEVICE KVSpan query_tile_kv_span(const Params& p, const VariantParams& vp, const RequestExtent& e,
                                         int packed_begin, int tile_rows, int kv_first, int kv_end) {
  const int q_pos_first = e.q_pos_offset + packed_begin / p.group_size;
  const int q_pos_last = e.q_pos_offset + min(e.qo_len - 1, (packed_begin + tile_rows - 1) / p.group_size);
  if (kFormat != KVFormatKind::kBlockSparse) {
    if (p.causal) kv_end = max(kv_first, min(kv_end, q_pos_last + 1));
    return Variant::visible_span(vp, q_pos_first, q_pos_last, kv_first, kv_end);
  }
  return KVSpan{kv_first, kv_first, kv_first, kv_end};  // columns, not positions: no clipping
}
template <typename Traits, KVFormatKind kFormat, typename Variant, typename Params>
TESSERA_DEVICE KVSpan tile_kv_span(const Params& p, const VariantParams& vp, const RequestExtent& e, int packed_begin,
                                   int kv_first, int kv_end) {
  return query_tile_kv_span<kFormat, Variant>(p, vp, e, packed_begin, Traits::CTA_TILE_Q, kv_first, kv_end);
}

}  // namespace kernels
}  // namespace tessera
