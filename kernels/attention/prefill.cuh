// FA2-class attention kernel (DESIGN.md §5) for every KV format: mma.sync m16n8k16 with fp32
// accumulation, ldmatrix from swizzled shared memory, cp.async double buffering of K/V tiles
// gathered row by row (so page size 1 runs the same tile math), online softmax in registers.
//
// A CTA computes one query tile of one (request, KV head) against a range of the request's KV
// positions (attention_tile): the whole range in the one-shot grid kernel, planned chunks in the
// persistent kernel of the plan/run runtime (DESIGN.md §1.3), which writes split chunks as fp32
// partial states for merge_planned_kernel. With head-group fusion the tile's
// rows are (query position, head within the KV head's group) pairs, packed position-major:
// packed row p is query p / group_size of query head kv_head * group_size + p % group_size. Decode
// with GQA is then a prefill whose tile holds the group's heads (DESIGN.md §5, "decode, tensor
// cores").
//
// Warp layout: NUM_WARPS_Q x NUM_WARPS_KV warps. Each warp owns CTA_TILE_Q / NUM_WARPS_Q query
// rows and CTA_TILE_KV / NUM_WARPS_KV columns of every KV tile; with NUM_WARPS_KV > 1 (small
// query tiles) each warp keeps its own softmax state and the states are merged through shared
// memory at the end.
//
// On sm_90a one configuration computes the two products with wgmma instead (MmaKind::kWgmma):
// each warpgroup multiplies its 64 rows by the whole 128-row K tile (m64n128k16, Q and K read
// from shared memory through descriptors) and P, straight from the S registers, by the V tile.
// Its accumulators give each warp the same 16-row fragments as the mma.sync path, so masks,
// softmax, variants and the epilogue are shared. It is warp-specialised: a producer warpgroup
// resolves and copies K/V tiles (cp.async, any KV format) into the ring and signals each stage on
// an mbarrier, and the two compute warpgroups never meet at a CTA barrier inside the tile loop,
// so one warpgroup's softmax overlaps the other's MMAs. Inside a warpgroup, P V of tile t is
// issued after Q K^T of tile t + 1 and runs while the softmax of tile t + 1 does (K and V stages
// have their own barriers: a K stage frees after its Q K^T, a V stage after its P V). Not yet:
// TMA for affine KV, explicit ping-pong ordering of the warpgroups.
#pragma once

#include "kernels/attention/params.cuh"
#include "kernels/attention/planned_work.cuh"
#include "kernels/attention/variants.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/grid_dependency.cuh"
#include "kernels/common/math.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/smem_layout.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/common/wgmma.cuh"

namespace tessera {
namespace kernels {

/// The tensor-core instructions of a prefill configuration: mma.sync m16n8k16 fed by ldmatrix
/// (sm_80+), or wgmma m64n128k16 from shared-memory descriptors (sm_90a; one warpgroup per 64
/// query rows). Softmax, masks, variants, loaders and epilogue are the same code for both: the
/// wgmma accumulators hold each warp's 16 rows in the m16n8 fragment layout (wgmma.cuh).
enum class MmaKind : int { kSync = 0, kWgmma = 1 };

/// What a warp does in attention_tile: everything (every configuration but the warp-specialised
/// ones), or one side of the warp-specialised split, each instantiated on its own so that the
/// producer's code runs within its reduced register limit.
enum class WarpRole : int { kAll = 0, kProducer = 1, kCompute = 2 };

template <WarpRole kRole>
struct RoleTag {
  static constexpr WarpRole value = kRole;
};

template <typename T, int HEAD_DIM_, int CTA_TILE_Q_, int CTA_TILE_KV_, int NUM_WARPS_Q_, int NUM_WARPS_KV_,
          int STAGES_ = 2, int MIN_CTAS_PER_SM_ = 1, MmaKind MMA_ = MmaKind::kSync>
struct PrefillTraits {
  using DType = T;
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int CTA_TILE_Q = CTA_TILE_Q_;
  static constexpr int CTA_TILE_KV = CTA_TILE_KV_;
  static constexpr int NUM_WARPS_Q = NUM_WARPS_Q_;
  static constexpr int NUM_WARPS_KV = NUM_WARPS_KV_;
  static constexpr int kNumWarps = NUM_WARPS_Q * NUM_WARPS_KV;  // warps that compute
  // wgmma configurations are warp-specialised: a producer warpgroup after the compute warps
  // resolves and copies K/V tiles into the ring, and the compute warpgroups wait on mbarriers
  // instead of meeting the producer (and each other) at a CTA barrier every tile. Elsewhere every
  // warp computes and loads.
  static constexpr bool kWarpSpecialized = MMA_ == MmaKind::kWgmma;
  static constexpr int kProducerWarps = kWarpSpecialized ? 4 : 0;
  static constexpr int kComputeThreads = kNumWarps * kWarpSize;
  static constexpr int kThreads = (kNumWarps + kProducerWarps) * kWarpSize;  // launched
  static constexpr int kLoaderThreads = kWarpSpecialized ? kProducerWarps * kWarpSize : kThreads;
  // setmaxnreg: the producer keeps kProducerRegs, the compute warpgroups take the rest (the
  // kernel is compiled for 65536 / kThreads registers per thread). At 40 the persistent kernel's
  // producer, which carries the item loop, spilled 16-24 bytes.
  static constexpr int kProducerRegs = 56;
  static constexpr int kComputeRegs = 224;
  // K/V tiles in flight: one computed while kStages - 1 load. Memory-bound decode tiles go deeper.
  static constexpr int kStages = STAGES_;
  // Occupancy the register allocation must allow (__launch_bounds__): latency hiding for the
  // ldmatrix -> mma chains needs >= 8 warps per SM.
  static constexpr int kMinCtasPerSm = MIN_CTAS_PER_SM_;
  static constexpr MmaKind kMma = MMA_;
  static constexpr bool kWgmma = MMA_ == MmaKind::kWgmma;

  static constexpr int kWarpRowsQ = CTA_TILE_Q / NUM_WARPS_Q;    // query rows per warp
  static constexpr int kMmaQ = kWarpRowsQ / 16;                  // m16 tiles per warp
  static constexpr int kWarpColsKV = CTA_TILE_KV / NUM_WARPS_KV;  // KV columns per warp
  static constexpr int kMmaKV = kWarpColsKV / 16;                 // k16 steps of P*V per warp
  static constexpr int kN8KV = kWarpColsKV / 8;                   // n8 tiles of S per warp
  static_assert((kN8KV & (kN8KV - 1)) == 0, "the softmax's max and sum trees halve kN8KV");
  static constexpr int kMmaD = HEAD_DIM / 16;                     // k16 steps of Q*K^T
  static constexpr int kN8D = HEAD_DIM / 8;                       // n8 tiles of O
  static constexpr int kRowChunks = HEAD_DIM * static_cast<int>(sizeof(T)) / 16;  // 16 B chunks per row
  // Shared-memory layout of a ROWS-row Q, K or V tile, as the MMA kind reads it.
  template <int ROWS>
  using SmemTile = typename OperandTile<kWgmma, ROWS, kRowChunks>::type;

  static constexpr int kQTileBytes = CTA_TILE_Q * HEAD_DIM * static_cast<int>(sizeof(T));
  // Q buffers. Warp-specialised: two, so the producer copies the next work item's Q while the
  // compute warps still read the current one (the persistent kernel's items are short: W4's
  // causal 1k requests average ~5 KV tiles, and a single buffer left each item's Q copy exposed
  // behind the previous item's last P V and epilogue). Elsewhere one.
  static constexpr int kQStages = kWarpSpecialized ? 2 : 1;
  static constexpr int kKVTileBytes = CTA_TILE_KV * HEAD_DIM * static_cast<int>(sizeof(T));
  // Warp-specialised tiles overlap each tile's softmax with the previous tile's P V inside a
  // warpgroup: P V of tile t is issued in iteration t + 1, after Q K^T of tile t + 1. K and V
  // then have their own barriers (a K stage frees after its Q K^T, a V stage after its P V).
  static constexpr int kPvLag = kWarpSpecialized ? 1 : 0;
  // Row tables (addresses and keys) in a ring, one per tile from the one being computed to the
  // one being resolved (see the kernel's pipeline comment): kStages + 1, and one more when the
  // producer runs a further tile ahead (K stages free a P V earlier) and V copies lag K copies.
  static constexpr int kRowTables = kStages + 1 + kPvLag;
  static constexpr int kRowTableBytes = kRowTables * CTA_TILE_KV * (2 * static_cast<int>(sizeof(uint64_t)) + 4);
  // Merging the warps' states (NUM_WARPS_KV > 1) reuses the K/V buffers: O, m, d per warp.
  static constexpr int kMergeBytes = NUM_WARPS_KV > 1 ? kNumWarps * kWarpRowsQ * (HEAD_DIM + 2) * 4 : 0;
  // Warp-specialised: the Q loader's row offsets get their own scratch (the producer loads the
  // next item's Q while K/V stages are in use), and the ring has a "full" and an "empty"
  // mbarrier per stage for K and for V, and a pair for Q.
  static constexpr int kQRowScratchBytes = kWarpSpecialized ? CTA_TILE_Q * 8 : 0;
  // A word per compute thread that wgmma_wait_after stores to (the lagged P V's wait).
  static constexpr int kWaitAnchorBytes = kPvLag == 1 ? kNumWarps * kWarpSize * 4 : 0;
  static constexpr int kBarrierBytes = kWarpSpecialized ? (4 * kStages + 2 * kQStages) * 8 : 0;
  // Layout: Q buffer 0, the K and V stages, row tables, scratch, barriers, then the other Q
  // buffers. A kernel that runs one work item per CTA (the one-shot grid) uses only Q buffer 0 and
  // launches with kOneItemSmemBytes: the second buffer's 32 KB would come out of the L1 carveout
  // (measured: W4 one-shot -1%).
  static constexpr int kOneItemSmemBytes = kQTileBytes + 2 * kStages * kKVTileBytes + kRowTableBytes +
                                           kQRowScratchBytes + kWaitAnchorBytes + kBarrierBytes;
  static constexpr int kExtraQOffset = (kOneItemSmemBytes + 1023) / 1024 * 1024;  // 1024-aligned (swizzle)
  static constexpr int kSmemBytes = kQStages > 1 ? kExtraQOffset + (kQStages - 1) * kQTileBytes : kOneItemSmemBytes;
  // Offsets of the regions (PrefillSmem), tied to the sizes above.
  static constexpr int kKOffset = kQTileBytes;
  static constexpr int kRowTableOffset = kKOffset + 2 * kStages * kKVTileBytes;
  static constexpr int kBarrierOffset = kOneItemSmemBytes - kBarrierBytes;
  static_assert(kRowTableOffset + kRowTableBytes + kWaitAnchorBytes + kQRowScratchBytes == kBarrierOffset,
                "regions tile [0, kOneItemSmemBytes) without overlap");

  static_assert(sizeof(T) == 2, "f16 or bf16 operands");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 pipeline stages");
  static_assert(HEAD_DIM % 64 == 0, "the swizzle spans 8 chunks of 8 elements");
  static_assert(CTA_TILE_Q % (16 * NUM_WARPS_Q) == 0, "whole m16 tiles per warp");
  static_assert(CTA_TILE_KV % (16 * NUM_WARPS_KV) == 0, "whole k16 steps per warp");
  static_assert(NUM_WARPS_Q == 1 || NUM_WARPS_KV == 1, "split either query rows or KV columns across warps");
  static_assert(kMergeBytes <= 2 * kStages * kKVTileBytes, "the warp merge fits in the K/V buffers");
  static_assert(kSmemBytes <= 227 * 1024, "fits an sm_90 SM; sm_80 configurations are checked by the host");
  static_assert(kQTileBytes % 1024 == 0 && kKVTileBytes % 1024 == 0,
                "tile bases 1024-byte aligned: attention_tile's ldmatrix addresses XOR the k16 step in");
  // wgmma: each warpgroup (4 warps) computes 64 query rows against the whole KV tile with
  // m64n128k16, so the KV tile (N of Q K^T) and the head dim (N of P V) are both 128.
  static_assert(!kWgmma || (HEAD_DIM == 128 && CTA_TILE_KV == 128 && NUM_WARPS_KV == 1 && kWarpRowsQ == 16 &&
                            NUM_WARPS_Q % 4 == 0),
                "wgmma configurations: head_dim 128, 128-row KV tiles, warpgroups of 4 warps x 16 query rows");
  static_assert(!kWarpSpecialized ||
                    (kProducerWarps == 4 && CTA_TILE_KV <= kLoaderThreads && CTA_TILE_Q <= kLoaderThreads &&
                     kProducerRegs * kProducerWarps * kWarpSize + kComputeRegs * kComputeThreads <= 65536 &&
                     kComputeRegs % 8 == 0 && kProducerRegs % 8 == 0),
                "one producer warpgroup with a thread per Q and KV row; registers within the SM's 64K");
};

/// A ring position over the kStages K/V buffers. The kernel keeps two: the buffer being
/// computed and the buffer being filled, kStages - 1 tiles ahead. `phase` counts the passes over
/// the ring modulo 2: the parity of the stage's mbarrier phase in the warp-specialised kernels.
template <int kStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;
  TESSERA_DEVICE void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

template <typename Traits>
struct PrefillSmem {
  using T = typename Traits::DType;
  T* q;         // [CTA_TILE_Q][HEAD_DIM], swizzled: Q buffer 0
  T* extra_q;   // [kQStages - 1][CTA_TILE_Q][HEAD_DIM], swizzled: the other Q buffers, after the barriers
  T* k;         // [kStages][CTA_TILE_KV][HEAD_DIM], swizzled
  T* v;         // [kStages][CTA_TILE_KV][HEAD_DIM], swizzled
  uint64_t* rows;     // [kRowTables][CTA_TILE_KV][2] ring of tables: tagged addresses of K and V rows (RowAddress)
  int32_t* row_keys;  // [kRowTables][CTA_TILE_KV] their keys (-1: missing, masked)
  uint64_t* full_k;   // [kStages] warp-specialised: the stage's K copies have landed (see StageCompletion)
  uint64_t* full_v;   // [kStages] ... its V copies
  uint64_t* empty_k;  // [kStages] warp-specialised: the compute warps are done with the stage's K
  uint64_t* empty_v;  // [kStages] ... with its V
  uint64_t* q_full;   // [kQStages] warp-specialised: the buffer's Q tile has landed
  uint64_t* q_empty;  // [kQStages] warp-specialised: the compute warps are done with the buffer's Q tile
  int64_t* q_rows;    // [CTA_TILE_Q] scratch of load_q_tile: the K buffers unless warp-specialised
  float* wait_anchor;  // [kNumWarps * kWarpSize] lagged P V: wgmma_wait_after's slots

  TESSERA_DEVICE explicit PrefillSmem(char* base) {
    q = reinterpret_cast<T*>(base);
    k = reinterpret_cast<T*>(base + Traits::kKOffset);
    v = reinterpret_cast<T*>(base + Traits::kKOffset + Traits::kStages * Traits::kKVTileBytes);  // load_kv_tile's kVFromK
    rows = reinterpret_cast<uint64_t*>(base + Traits::kRowTableOffset);
    row_keys = reinterpret_cast<int32_t*>(rows + 2 * Traits::kRowTables * Traits::CTA_TILE_KV);
    extra_q = reinterpret_cast<T*>(base + Traits::kExtraQOffset);
    full_k = reinterpret_cast<uint64_t*>(base + Traits::kBarrierOffset);
    full_v = full_k + Traits::kStages;
    empty_k = full_v + Traits::kStages;
    empty_v = empty_k + Traits::kStages;
    q_full = empty_v + Traits::kStages;
    q_empty = q_full + Traits::kQStages;
    q_rows = Traits::kWarpSpecialized
                 ? reinterpret_cast<int64_t*>(base + Traits::kBarrierOffset - Traits::kQRowScratchBytes)
                 : reinterpret_cast<int64_t*>(k);
    wait_anchor = reinterpret_cast<float*>(base + Traits::kBarrierOffset - Traits::kQRowScratchBytes -
                                           Traits::kWaitAnchorBytes);
  }
};

/// A packed query row (query-major: row = qo_idx * group_size + the head's index in the group)
/// as its query index and query head.
struct PackedRow {
  int qo_idx;
  int head;
};
template <typename T>
TESSERA_DEVICE PackedRow unpack_row(const AttentionParams<T>& p, int kv_head, int packed) {
  // Unsigned (both are >= 0): a signed division costs twice the instructions.
  const int qo_idx = static_cast<int>(static_cast<uint32_t>(packed) / static_cast<uint32_t>(p.group_size));
  return PackedRow{qo_idx, kv_head * p.group_size + (packed - qo_idx * p.group_size)};
}

/// Named barriers of the warp-specialised configurations (0 is __syncthreads's).
constexpr uint32_t kComputeBarrier = 1;
constexpr uint32_t kLoaderBarrier = 2;

/// This thread's index among the threads that load tiles (the producer warpgroup when
/// warp-specialised, else the whole CTA).
template <typename Traits>
TESSERA_DEVICE int loader_thread() {
  return Traits::kWarpSpecialized ? static_cast<int>(threadIdx.x) - Traits::kComputeThreads
                                  : static_cast<int>(threadIdx.x);
}

/// Synchronises the threads that load tiles.
template <typename Traits>
TESSERA_DEVICE void loader_sync() {
  if constexpr (Traits::kWarpSpecialized) {
    named_barrier_sync(kLoaderBarrier, Traits::kLoaderThreads);
  } else {
    __syncthreads();
  }
}

/// Synchronises the threads that compute (their shared-memory transforms of Q, K, V).
template <typename Traits>
TESSERA_DEVICE void compute_sync() {
  if constexpr (Traits::kWarpSpecialized) {
    named_barrier_sync(kComputeBarrier, Traits::kComputeThreads);
  } else {
    __syncthreads();
  }
}

/// Loads the CTA's query tile; packed rows past the request's queries are zero-filled. Thread r
/// first resolves packed row r into an element offset of q (-1: past the queries) in `row_offsets`
/// ([CTA_TILE_Q] int64 of scratch shared memory, free until the caller's next barrier), so each
/// of a thread's 16-byte copies costs a table load, an add and a predicate rather than a
/// division and 64-bit address arithmetic (~35 instructions per copy, 16 copies per thread).
template <typename Traits, typename T>
TESSERA_DEVICE void load_q_tile(const AttentionParams<T>& p, const RequestExtent& e, int kv_head, int packed_begin,
                                T* q_smem, int64_t* row_offsets) {
  using Tile = typename Traits::template SmemTile<Traits::CTA_TILE_Q>;
  static_assert(Traits::CTA_TILE_Q <= Traits::kLoaderThreads, "one thread per query row");
  const int tid = loader_thread<Traits>();
  // Warp-specialised, the producer runs from item to item without a loader barrier in between
  // when an item has no KV tiles: every thread must be done reading the previous item's offsets.
  if constexpr (Traits::kWarpSpecialized) loader_sync<Traits>();
  if (tid < Traits::CTA_TILE_Q) {
    const PackedRow r = unpack_row(p, kv_head, packed_begin + tid);
    row_offsets[tid] =
        r.qo_idx < e.qo_len ? static_cast<int64_t>(e.q_begin + r.qo_idx) * p.q_row_stride + r.head * p.q_head_stride
                            : -1;
  }
  loader_sync<Traits>();
  // A thread keeps one chunk column and steps down the rows, as load_kv_tile does: per-pass
  // row/chunk divisions of a flat index are loop-invariant in the persistent kernel, which hoists
  // them out of its item loop and spilled 15 of them (60 B) with the 4 x 32 tile.
  static_assert(Traits::kLoaderThreads % Traits::kRowChunks == 0, "a thread keeps its chunk column");
  constexpr int kRowsPerPass = Traits::kLoaderThreads / Traits::kRowChunks;
  const int chunk = tid % Traits::kRowChunks, row0 = tid / Traits::kRowChunks;
#pragma unroll
  for (int it = 0; it < (Traits::CTA_TILE_Q + kRowsPerPass - 1) / kRowsPerPass; ++it) {
    const int row = row0 + it * kRowsPerPass;
    if (Traits::CTA_TILE_Q % kRowsPerPass != 0 && row >= Traits::CTA_TILE_Q) break;
    const int64_t offset = row_offsets[row];
    cp_async_16_zfill(q_smem + Tile::chunk_offset(row, chunk) * 8, p.q + (offset < 0 ? 0 : offset) + chunk * 8,
                      offset >= 0);
  }
}

/// The page / column-block id of KV row `row` of the tile starting at kv_begin (the page-table
/// load), or -1 at or past kv_end (the end of the CTA's KV range). Loaded one tile before
/// resolve_kv_rows consumes it, so its latency hides behind a tile of computation.
template <typename Traits, KVFormatKind kFormat, typename T>
TESSERA_DEVICE int32_t load_kv_block_id(const AttentionParams<T>& p, const RequestExtent& e, int kv_end, int kv_begin,
                                        int row) {
  const int pos = kv_begin + row;
  return row < Traits::CTA_TILE_KV && pos < kv_end ? kv_row_block<kFormat>(p, e, pos) : -1;
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
template <typename Traits, KVFormatKind kFormat, typename T>
TESSERA_DEVICE void resolve_kv_rows(const AttentionParams<T>& p, const RequestExtent& e, int kv_head, int kv_end,
                                    int kv_begin, int32_t block, uint64_t* row_table, int32_t* row_keys) {
  static_assert(Traits::CTA_TILE_KV <= Traits::kLoaderThreads, "one thread per KV row");
  const int row = loader_thread<Traits>();
  if (row >= Traits::CTA_TILE_KV) return;
  const int pos = kv_begin + row;
  KVRow r{0, 0, -1, false};
  if (pos < kv_end) r = kv_row_in_block<kFormat>(p, e, pos, block);
  constexpr int kElem = static_cast<int>(sizeof(T));
  row_table[2 * row] = RowAddress::make(p.k, r.k_offset + kv_head * p.k_head_stride, kElem, r.valid, true);
  row_table[2 * row + 1] = RowAddress::make(p.v, r.v_offset + kv_head * p.v_head_stride, kElem, r.valid, false);
  row_keys[row] = r.valid ? r.key : -1;
}

/// Which rows load_kv_tile copies: K and V together, or (warp-specialised tiles, whose V stages
/// free later than their K stages) only one of them.
enum class KVPart : int { kBoth = 0, kK = 1, kV = 2 };

/// Copies the K and V rows resolved in the row table into one stage (its K tile at k_smem; its V
/// tile is kVFromK bytes further, as PrefillSmem lays them out); missing rows are zero-filled.
template <typename Traits, KVPart kPart = KVPart::kBoth, typename T>
TESSERA_DEVICE void load_kv_tile(const uint64_t* row_table, T* k_smem) {
  constexpr uint32_t kVFromK = Traits::kStages * Traits::kKVTileBytes;
  using Tile = typename Traits::template SmemTile<Traits::CTA_TILE_KV>;
  static_assert((Traits::CTA_TILE_KV * Traits::kRowChunks) % Traits::kLoaderThreads == 0, "whole passes");
  static_assert(Traits::kLoaderThreads % Traits::kRowChunks == 0, "a thread keeps its chunk column");
  constexpr int kRowsPerPass = Traits::kLoaderThreads / Traits::kRowChunks;
  constexpr int kRowsPerThread = Traits::CTA_TILE_KV * Traits::kRowChunks / Traits::kLoaderThreads;
  // Table entries are read in batches before any copy of the batch is issued: ptxas pads an
  // LDGSTS that closely follows the shared-memory load of its address with three never-executed
  // LDS (a hazard guard), 3 of ~11 instructions per 16-byte copy when loads and copies alternate.
  // One 16-byte load fetches a row's K and V entries (adjacent in the table; a V copy takes its
  // predicate from the K entry's tag).
  constexpr int kBatch = kRowsPerThread < 4 ? kRowsPerThread : 4;
  static_assert(kRowsPerThread % kBatch == 0, "whole batches");
  const int tid = loader_thread<Traits>();
  const int chunk = tid % Traits::kRowChunks, row0 = tid / Traits::kRowChunks;
  // When a pass spans whole 8-row swizzle periods, this thread's swizzled chunk is the same in
  // every row it copies, and its destinations are one base plus constant strides (immediates).
  constexpr bool kFixedSwizzle = kRowsPerPass % 8 == 0;
  const uint32_t k_base = smem_addr(k_smem);
  auto dst_offset = [&](int j) -> uint32_t {
    return kFixedSwizzle ? (Tile::chunk_offset(row0, chunk) + j * kRowsPerPass * Tile::kRowStrideChunks) * 16
                         : Tile::chunk_offset(row0 + j * kRowsPerPass, chunk) * 16;
  };
#pragma unroll
  for (int j0 = 0; j0 < kRowsPerThread; j0 += kBatch) {
    ulonglong2 entries[kBatch];  // [row of the batch]: {K entry (tagged), V entry}
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      entries[b] = *reinterpret_cast<const ulonglong2*>(row_table + 2 * (row0 + (j0 + b) * kRowsPerPass));
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

/// The KV tiles of one work item: the variant's visible span cut into CTA_TILE_KV-row tiles (those
/// of the sink segment, then those of the main segment), visited in that order or, with
/// kNearestFirst, last first. A bias that grows towards the diagonal (ALiBi: 65 base-2 units per
/// 64-key tile at slope 2^-0.5) moves the softmax's reference max, and rescales O, on nearly every
/// tile when the far keys come first (ncu: 90% of ALiBi's warp-tiles); nearest first, a row's max
/// is set by its first tiles. Other variants keep the forward order, which measured 1-2% faster
/// for soft-cap and sigmoid (bench/results/LOG.md, session 14).
template <int kTileKV, bool kNearestFirst>
struct KVTiles {
  KVSpan span;
  int seg0_tiles;
  int count;

  TESSERA_DEVICE explicit KVTiles(const KVSpan& s) : span(s) {
    seg0_tiles = s.seg0_end > s.seg0_begin ? (s.seg0_end - s.seg0_begin + kTileKV - 1) / kTileKV : 0;
    const int main_tiles = s.end > s.begin ? (s.end - s.begin + kTileKV - 1) / kTileKV : 0;
    count = seg0_tiles + main_tiles;
  }
  /// First KV position of the t-th tile visited and the end of its segment (rows at or past it
  /// are masked).
  TESSERA_DEVICE int begin(int t) const {
    const int r = position(t);
    return r < seg0_tiles ? span.seg0_begin + r * kTileKV : span.begin + (r - seg0_tiles) * kTileKV;
  }
  TESSERA_DEVICE int end(int t) const { return position(t) < seg0_tiles ? span.seg0_end : span.end; }

 private:
  /// Position in the span of the t-th tile visited.
  TESSERA_DEVICE int position(int t) const { return kNearestFirst ? count - 1 - t : t; }
};

/// Applies a pair transform in place to the rows of a swizzled [ROWS][HEAD_DIM] tile: each step
/// takes chunk c < kRowChunks / 2 of a row and its partner c + kRowChunks / 2, so f(row, dim,
/// (x[dim], x[dim + HEAD_DIM / 2])) sees both halves a rotation needs. f returns the new pair.
template <typename Traits, int ROWS, typename T, typename F>
TESSERA_DEVICE void transform_tile_pairs(T* tile, F&& f) {
  using Tile = typename Traits::template SmemTile<ROWS>;
  constexpr int kHalf = Traits::kRowChunks / 2;
  for (int i = threadIdx.x; i < ROWS * kHalf; i += Traits::kComputeThreads) {
    const int row = i / kHalf, c = i % kHalf;
    uint4* lo_ptr = reinterpret_cast<uint4*>(tile + Tile::chunk_offset(row, c) * 8);
    uint4* hi_ptr = reinterpret_cast<uint4*>(tile + Tile::chunk_offset(row, c + kHalf) * 8);
    uint4 lo = *lo_ptr, hi = *hi_ptr;
    T* l = reinterpret_cast<T*>(&lo);  // [8]
    T* h = reinterpret_cast<T*>(&hi);  // [8]
    bool changed = false;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float2 x = make_float2(to_float(l[j]), to_float(h[j]));
      if (!f(row, c * 8 + j, x)) break;  // a row the transform leaves alone (missing, padding)
      l[j] = from_float<T>(x.x);
      h[j] = from_float<T>(x.y);
      changed = true;
    }
    if (changed) {
      *lo_ptr = lo;
      *hi_ptr = hi;
    }
  }
}

/// Folds tree[0 .. 2W) into tree[0] in halves (depth log2), combining with op. A template
/// recursion rather than a halving loop: the compiler left `for (w = N / 2; w >= 1; w /= 2)` rolled,
/// over local memory, at N = 16.
template <int W, typename Op>
TESSERA_DEVICE void fold_halves(float* tree, Op op) {
  if constexpr (W >= 1) {
#pragma unroll
    for (int n = 0; n < W; ++n) tree[n] = op(tree[n], tree[n + W]);
    fold_halves<W / 2>(tree, op);
  }
}

/// How far (base 2) a row's logits may exceed the softmax state's reference max before the
/// reference moves and O is rescaled: weights stay <= 2^8 = 256 (attention_tile).
constexpr float kStaleMaxSlack = 8.f;

/// Largest base-2 exponent bound (Variant::logits_exponent_bound) for which a softmax with a
/// fixed reference of 0 is exact enough: weights in [2^-64, 2^64] are normal in fp32 and bf16
/// (not fp16), and the sum stays below 2^96 for any KV length that fits an int32.
constexpr float kZeroReferenceMaxExponent = 64.f;

/// Per-thread softmax state of the rows a thread owns: rows g and g+8 of each m16 tile.
template <int kMmaQ>
struct RowState {
  // Reference max of base-2 logits: at most kStaleMaxSlack below the true max; 0 with a zero reference.
  float m[kMmaQ][2];
  float d[kMmaQ][2];  // this thread's share of the running sum of 2^(s - m)
};

/// Where a tile's result goes: the final output (o, lse of AttentionParams) when `partial_o` is
/// null, else an fp32 partial state of the tile's rows — normalised output [CTA_TILE_Q][HEAD_DIM]
/// at partial_o and base-2 LSE [CTA_TILE_Q] at partial_lse — for the merge.
struct TileOutput {
  float* partial_o;
  float* partial_lse;
};

/// Where a CTA's warp-specialised ring stands: the producer's next K, V and Q buffers to fill,
/// the compute warps' next K, V and Q buffers to read (V trails K by a tile; Q advances once per
/// work item) and the tiles of earlier items (row tables are indexed by the CTA's running tile
/// count). Each role keeps its own copy and advances it as the other does, so the mbarrier
/// phases carry on from one work item of the persistent kernel to the next and the producer runs
/// into the next item (its Q, then its K/V tiles as stages free) while the compute warps finish
/// the current one.
template <typename Traits>
struct RingPosition {
  PipelineState<Traits::kStages> fill_k, fill_v, read_k, read_v;
  PipelineState<Traits::kQStages> fill_q, read_q;
  uint32_t tiles = 0;
};

/// Warp-specialised: how the producer completes a K/V stage's `full` barrier (and Q's `q_full`).
/// kAfterWait: each producer thread waits for its copies (cp.async.wait_group), fences the proxy
/// (wgmma reads shared memory through the async proxy) and arrives, so the producer has one
/// step's copies in flight at a time. kByCopies: each thread arrives itself, which releases the
/// row table it wrote, and through cp.async.mbarrier.arrive.noinc, which arrives when its copies
/// land, so the producer never waits for its copies and keeps every free stage in flight; the
/// compute warps then fence the proxy after each wait. Paged KV takes kByCopies: its producer
/// resolves a page per 16 rows, a long chain per tile that the copies in flight hide (W4 paged16
/// +6-7%, one-shot and runtime). Ragged KV keeps kAfterWait: its producer is quick, and the fences
/// in the compute warps' chain cost more than the overlap gains (W2a 16k -1.5 to -1.8%, W3 -0.5
/// to -2%; bench/results/LOG.md, session 19). Block-sparse KV is not measured either way and keeps
/// kAfterWait.
enum class StageCompletion { kAfterWait, kByCopies };
template <KVFormatKind kFormat>
inline constexpr StageCompletion kStageCompletion =
    kFormat == KVFormatKind::kPaged ? StageCompletion::kByCopies : StageCompletion::kAfterWait;

/// Runs f(RoleTag<role>{}) for this warp's role: kAll, or, warp-specialised, after the mbarriers
/// are initialised, kProducer (the last warpgroup, its register limit lowered) or kCompute (the
/// limit raised). The roles' code paths are disjoint from here on: ptxas keeps the setmaxnreg
/// only then (it ignored them, C7507, when both roles went on through shared code).
template <typename Traits, KVFormatKind kFormat, typename F>
TESSERA_DEVICE void with_warp_role(char* smem_raw, F&& f) {
  if constexpr (Traits::kWarpSpecialized) {
    constexpr bool kByCopies = kStageCompletion<kFormat> == StageCompletion::kByCopies;
    PrefillSmem<Traits> smem(smem_raw);
    if (threadIdx.x == 0) {
      // kByCopies: two arrivals per producer thread on a K/V stage (its own and its copies'), one
      // on q_full (its copies'); kAfterWait: one each.
      constexpr int kFullArrivals = (kByCopies ? 2 : 1) * Traits::kLoaderThreads;
      for (int st = 0; st < Traits::kStages; ++st) {
        mbarrier_init(smem.full_k + st, kFullArrivals);
        mbarrier_init(smem.full_v + st, kFullArrivals);
        mbarrier_init(smem.empty_k + st, Traits::kComputeThreads);
        mbarrier_init(smem.empty_v + st, Traits::kComputeThreads);
      }
      for (int st = 0; st < Traits::kQStages; ++st) {
        mbarrier_init(smem.q_full + st, Traits::kLoaderThreads);
        mbarrier_init(smem.q_empty + st, Traits::kComputeThreads);
      }
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) >= Traits::kComputeThreads) {
      warpgroup_registers_decrease<Traits::kProducerRegs>();
      f(RoleTag<WarpRole::kProducer>{});
      if constexpr (kByCopies) {
        cp_async_commit();  // the copies tracked by mbarriers only, into a group to wait for:
        cp_async_wait<0>();  // no copy outlives its thread
      }
    } else {
      warpgroup_registers_increase<Traits::kComputeRegs>();
      f(RoleTag<WarpRole::kCompute>{});
    }
  } else {
    f(RoleTag<WarpRole::kAll>{});
  }
}

/// One query tile (packed rows packed_begin .. + CTA_TILE_Q - 1 of `request`, query heads of
/// kv_head) against the KV positions of `span` (clipped by the variant to what the tile's rows may
/// see). The caller has synchronised the CTA since any earlier use of shared memory.
template <typename Traits, KVFormatKind kFormat, typename Variant, WarpRole kRole, typename T>
TESSERA_DEVICE void attention_tile(const AttentionParams<T>& p, const VariantParams& vp, const RequestExtent& e,
                                   const int request, const int kv_head, const int packed_begin, const KVSpan span,
                                   const TileOutput out, char* smem_raw, RingPosition<Traits>& ring) {
  constexpr int kMmaQ = Traits::kMmaQ, kN8KV = Traits::kN8KV, kN8D = Traits::kN8D;
  constexpr bool kSoftmax = Variant::kUseSoftmax;
  PrefillSmem<Traits> smem(smem_raw);

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warp_q = warp / Traits::NUM_WARPS_KV, warp_kv = warp % Traits::NUM_WARPS_KV;
  const int g = lane / 4, t = lane % 4;

  const KVTiles<Traits::CTA_TILE_KV, Variant::kLinearKeyBias> tiles(span);
  const int num_kv_tiles = tiles.count;
  // The batch index the variant hooks see: block-sparse KV is one sequence whose block rows are
  // this kernel's "requests".
  const int batch = kFormat == KVFormatKind::kBlockSparse ? 0 : request;

  // Packed row r of this thread's m16 tile mq, half h (rows g and g+8).
  auto packed_row = [&](int mq, int h) { return packed_begin + warp_q * Traits::kWarpRowsQ + mq * 16 + g + 8 * h; };
  // Query positions of the tile's first and last rows (for tile-level mask decisions).
  const int q_pos_first = e.q_pos_offset + packed_begin / p.group_size;
  const int q_pos_last =
      e.q_pos_offset + min(e.qo_len - 1, (packed_begin + Traits::CTA_TILE_Q - 1) / p.group_size);

  // The row offsets use the first K buffer, which no copy writes before the prologue's barrier.
  static_assert(Traits::CTA_TILE_Q * sizeof(int64_t) <= Traits::kKVTileBytes, "Q row offsets fit a K buffer");
  constexpr int kQTileElems = Traits::CTA_TILE_Q * Traits::HEAD_DIM;
  // This item's Q buffer: the producer's next to fill, the compute warps' next to read (the same
  // buffer: each role's ring position advances once per item).
  const int q_stage = kRole == WarpRole::kProducer ? ring.fill_q.stage : ring.read_q.stage;
  T* const q_tile = q_stage == 0 ? smem.q : smem.extra_q + (q_stage - 1) * kQTileElems;  // [CTA_TILE_Q][HEAD_DIM]
  constexpr bool kByCopies =
      Traits::kWarpSpecialized && kStageCompletion<kFormat> == StageCompletion::kByCopies;
  auto load_q = [&] {
    load_q_tile<Traits>(p, e, kv_head, packed_begin, q_tile, smem.q_rows);
    if constexpr (!kByCopies) cp_async_commit();  // kByCopies: q_full tracks the copies
  };
  if constexpr (!Traits::kWarpSpecialized) load_q();
  constexpr int kTileElems = Traits::CTA_TILE_KV * Traits::HEAD_DIM;
  // Each KV tile goes through three steps: its page-table entries are loaded into `block` (one
  // per thread and row), resolved into a row table (offsets and keys), and copied into a stage
  // by cp.async. The row tables form a ring of kStages + 1, so the lookups for tile t + kStages
  // can be written while tile t + kStages - 1 is being copied from another table and tile t's
  // keys are read by the mask, with one barrier per tile: a table's last readers (the mask of
  // tile t - 1, copies of earlier tiles) always sit behind the previous tile's barrier.
  // Row-table ring slot of the item's tile: counted over the CTA's items when warp-specialised.
  const uint32_t tiles_before = Traits::kWarpSpecialized ? ring.tiles : 0u;
  auto table_slot = [&](int tile) { return static_cast<int>((tiles_before + tile) % Traits::kRowTables); };
  auto block_id = [&](int tile) {
    return tile < num_kv_tiles ? load_kv_block_id<Traits, kFormat>(p, e, tiles.end(tile), tiles.begin(tile),
                                                                   loader_thread<Traits>())
                               : -1;
  };
  int32_t block = Traits::kWarpSpecialized ? -1 : block_id(0);
  auto resolve = [&](int tile) {
    if (tile < num_kv_tiles) {
      resolve_kv_rows<Traits, kFormat>(p, e, kv_head, tiles.end(tile), tiles.begin(tile), block,
                                       smem.rows + table_slot(tile) * 2 * Traits::CTA_TILE_KV,
                                       smem.row_keys + table_slot(tile) * Traits::CTA_TILE_KV);
    }
    block = block_id(tile + 1);
  };
  auto copy = [&](int tile, int fill) {
    if (tile < num_kv_tiles) {
      load_kv_tile<Traits>(smem.rows + table_slot(tile) * 2 * Traits::CTA_TILE_KV, smem.k + fill * kTileElems);
    }
    cp_async_commit();  // possibly empty: keeps one group per tile for the wait count
  };
  static_assert((kRole == WarpRole::kAll) == !Traits::kWarpSpecialized, "roles split warp-specialised tiles only");
  if constexpr (kRole == WarpRole::kProducer) {
    {
      // The producer warpgroup: Q, then every K/V tile through the ring, K of tile `step` and V of
      // tile step - 1 per step (P V runs a tile behind Q K^T). A tile's row table is resolved
      // before its stages are free (the table ring has kStages + 2 slots: see kRowTables), then
      // each copy waits for its stage (`empty_k`, `empty_v`) and its `full` barrier is completed
      // as kStageCompletion says, so the compute warps wait for the copies only, never for the
      // producer's next step.
      // The buffer's previous item (kQStages items back) is done with it.
      mbarrier_wait(smem.q_empty + q_stage, ring.fill_q.phase ^ 1u);
      load_q();
      if constexpr (kByCopies) cp_async_mbarrier_arrive(smem.q_full + q_stage);
      // After a stage's copies are issued: kByCopies completes its `full` barrier through them
      // (and this thread's own arrival); kAfterWait closes a cp.async group, waited for below.
      auto copies_issued = [&](uint64_t* full, PipelineState<Traits::kStages>& fill) {
        if constexpr (kByCopies) {
          mbarrier_arrive(full + fill.stage);
          cp_async_mbarrier_arrive(full + fill.stage);
          fill.advance();
        } else {
          cp_async_commit();
        }
      };
      block = block_id(0);
      for (int step = 0; step <= num_kv_tiles; ++step) {
        const bool copies_k = step < num_kv_tiles, copies_v = step > 0;
        if (copies_k) {
          resolve(step);
          loader_sync<Traits>();  // the row table, for every copying thread
          mbarrier_wait(smem.empty_k + ring.fill_k.stage, ring.fill_k.phase ^ 1u);
          load_kv_tile<Traits, KVPart::kK>(smem.rows + table_slot(step) * 2 * Traits::CTA_TILE_KV,
                                          smem.k + ring.fill_k.stage * kTileElems);
          copies_issued(smem.full_k, ring.fill_k);
        }
        if (copies_v) {
          mbarrier_wait(smem.empty_v + ring.fill_v.stage, ring.fill_v.phase ^ 1u);
          load_kv_tile<Traits, KVPart::kV>(smem.rows + table_slot(step - 1) * 2 * Traits::CTA_TILE_KV,
                                          smem.k + ring.fill_v.stage * kTileElems);
          copies_issued(smem.full_v, ring.fill_v);
        }
        if constexpr (!kByCopies) {
          if (copies_k) {
            // K (and Q, committed before) has landed when at most the V group is in flight.
            if (copies_v) {
              cp_async_wait<1>();
            } else {
              cp_async_wait<0>();
            }
            fence_proxy_async_shared();
            if (step == 0) mbarrier_arrive(smem.q_full + q_stage);
            mbarrier_arrive(smem.full_k + ring.fill_k.stage);
            ring.fill_k.advance();
          }
          if (copies_v) {
            cp_async_wait<0>();
            fence_proxy_async_shared();
            mbarrier_arrive(smem.full_v + ring.fill_v.stage);
            ring.fill_v.advance();
          }
        }
      }
      if constexpr (!kByCopies) {
        if (num_kv_tiles == 0) {
          cp_async_wait<0>();
          fence_proxy_async_shared();
          mbarrier_arrive(smem.q_full + q_stage);
        }
      }
      ring.fill_q.advance();
      ring.tiles += num_kv_tiles;
      return;
    }
  }
  // ldmatrix addresses. A lane's fragment row is fixed for the whole tile and its rows are 8k +
  // lane % 8, so the swizzled chunk is (2 * step + half) ^ (lane % 8) = ((half ^ lane % 8)) ^
  // 2 * step: a k16 step only XORs (step << 5) into the byte address, and a further m16 / k16 / n16
  // block adds whole rows (an immediate). Exact because every tile base is a multiple of 1024 bytes
  // (smem_raw is 1024-aligned; tile sizes are multiples of 16 rows of >= 128 bytes) and row bases
  // leave the chunk bits free. Saves the per-load swizzle arithmetic of the inner loops.
  constexpr uint32_t kRowBytes = Traits::kRowChunks * 16;
  if (smem_addr(smem_raw) % 1024 != 0) __trap();  // never: the declaration's alignment; never silently wrong
  const uint32_t lane_chunk_lo = static_cast<uint32_t>(((lane / 16) ^ (lane % 8)) << 4);        // half = lane / 16
  const uint32_t lane_chunk_mid = static_cast<uint32_t>((((lane / 8) % 2) ^ (lane % 8)) << 4);  // half = (lane / 8) % 2
  const uint32_t frag_row = (lane % 8) + 8 * ((lane / 8) % 2);  // row of an A (Q, P) or V^T fragment
  const int warp_col0 = warp_kv * Traits::kWarpColsKV;
  // Q: [kWarpRowsQ rows of this warp][HEAD_DIM], A fragments, half = lane / 16
  const uint32_t q_frag = smem_addr(q_tile) + (warp_q * Traits::kWarpRowsQ + frag_row) * kRowBytes + lane_chunk_lo;
  // K: B fragments of two n8 tiles, rows lane % 8 + 8 * (lane / 16), half = (lane / 8) % 2
  const uint32_t k_frag_offset = (warp_col0 + (lane % 8) + 8 * (lane / 16)) * kRowBytes + lane_chunk_mid;
  // V: transposed B fragments of two n8 tiles of D, rows frag_row, half = lane / 16
  const uint32_t v_frag_offset = (warp_col0 + frag_row) * kRowBytes + lane_chunk_lo;
  // wgmma descriptors (Sw128Tile operands): Q (this warpgroup's 64 rows) and K are K-major, V
  // is MN-major (d contiguous).
  const uint32_t q_tile_addr = smem_addr(q_tile);
  const int q_wg_row0 = (warp / 4) * 64;

  constexpr bool kTransformLogits = Variant::kHasLogitsTransform || !kSoftmax;
  // Logits-transforming variants take q.k times their input scale. Softmax-free variants in bf16
  // take it in Q once per tile instead of in every logit (one FMUL per logit): bf16 keeps fp32's
  // exponent range, so q * scale cannot overflow or flush. The 16-bit rounding of q * scale
  // (2^-9 relative) moves each logit by ~1e-3 (natural units, D = 128): harmless to outputs, but
  // it moved softmax variants' LSE past the bf16 tolerance (tests/python, soft-cap with RoPE and a
  // window), so they keep the FMUL; so does fp16, which could flush small scaled elements.
  constexpr bool kPrescaleQuery = !kSoftmax && HasFloatRange<T>::value;
  const float logits_input_scale = Variant::logits_input_scale(vp, p.sm_scale);
  // A bias linear in the key (ALiBi) over consecutive keys (every format but block-sparse) is
  // split into a per-row term, added in the exponent, and per-column constants: one FFMA per
  // logit with an immediate instead of the key's conversion, a subtraction and an FFMA.
  constexpr bool kSplitKeyBias = Variant::kLinearKeyBias && kFormat != KVFormatKind::kBlockSparse;
  // Bounded logits (soft-cap) in bf16 need no running max: with a fixed reference of 0 each tile
  // goes straight from S to the exponentials, without the max trees, the lanes' shuffles and the
  // rescale vote (the chain between the two MMA phases). fp16 P would flush small weights, and a
  // bound beyond kZeroReferenceMaxExponent (cap > 44) keeps the running max.
  constexpr bool kMayUseZeroReference = kSoftmax && Variant::kBoundedLogits && HasFloatRange<T>::value;
  static_assert(!(Variant::kBoundedLogits && kSplitKeyBias), "the zero reference has no row bias");
  const bool zero_reference =
      kMayUseZeroReference && Variant::logits_exponent_bound(vp) <= kZeroReferenceMaxExponent;
  // Per row, fixed for the work item: the slope and the key offset of the thread's first column
  // from the row's position (row bias = slope * (kv_begin + offset)), so a tile adds one IADD,
  // I2F and FMUL per row instead of the row's division, head and slope load.
  float key_slope[kMmaQ][2];        // [m16 tile][row half], folded units
  int32_t key_offset[kMmaQ][2];     // [m16 tile][row half]
  if constexpr (kSplitKeyBias) {
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const PackedRow r = unpack_row(p, kv_head, packed_row(mq, h));
        key_slope[mq][h] = Variant::logits_key_slope(vp, r.head);
        key_offset[mq][h] = warp_col0 + 2 * t - (e.q_pos_offset + min(r.qo_idx, e.qo_len - 1));
      }
  }

  // The stage the iteration's Q K^T reads (without the P V lag, its P V too).
  PipelineState<Traits::kStages> local_read, fill_stage;
  PipelineState<Traits::kStages>& compute_stage = Traits::kWarpSpecialized ? ring.read_k : local_read;
  if constexpr (Traits::kWarpSpecialized) {
    mbarrier_wait(smem.q_full + q_stage, ring.read_q.phase);
  } else {
#pragma unroll
    for (int s = 0; s + 1 < Traits::kStages; ++s) {
      resolve(s);
      __syncthreads();
      copy(s, fill_stage.stage);
      fill_stage.advance();
    }
    resolve(Traits::kStages - 1);
  }

  float o[kMmaQ][kN8D][4];  // [m16 tile][n8 tile of D][fragment]
  RowState<kMmaQ> st;
#pragma unroll
  for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.m[mq][h] = kSoftmax && !zero_reference ? -INFINITY : 0.f;
      st.d[mq][h] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < kN8D; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[mq][n][i] = 0.f;
  }

  // P of the tile whose P V comes next, as A fragments (16-bit pairs). With the lag (wgmma), it
  // waits a whole iteration: packed at the end of tile t, read by the P V issued in tile t + 1.
  uint32_t pfrag[kMmaQ][Traits::kMmaKV][4];  // [m16 tile][k16 step][A fragment]
  // wgmma: O += P V of tile `v_tile_index` from V stage ring.read_v, issued after the next tile's
  // Q K^T so that the next softmax runs while the tensor cores work (the caller commits);
  // wait_lagged_pv waits for it, release_lagged_pv frees the stage. O and pfrag stay untouched
  // in between (the softmax only reads S).
  [[maybe_unused]] auto issue_lagged_pv = [&](int v_tile_index) {
    if constexpr (Traits::kWgmma) {
      mbarrier_wait(smem.full_v + ring.read_v.stage, ring.read_v.phase);
      if constexpr (kByCopies) fence_proxy_async_shared();  // the copies, before wgmma's async-proxy reads
      T* v_tile = smem.v + ring.read_v.stage * kTileElems;  // [CTA_TILE_KV][HEAD_DIM]
      if constexpr (Variant::kHasValueTransform) {
        const int32_t* keys = smem.row_keys + table_slot(v_tile_index) * Traits::CTA_TILE_KV;  // [CTA_TILE_KV]
        transform_tile_pairs<Traits, Traits::CTA_TILE_KV>(v_tile, [&](int row, int dim, float2& x) {
          if (keys[row] < 0) return false;
          x = Variant::value_transform(vp, e, x, batch, -1, keys[row], -1, kv_head, dim, Traits::HEAD_DIM);
          return true;
        });
        fence_proxy_async_shared();
        compute_sync<Traits>();
      }
      float(&o_wg)[64] = reinterpret_cast<float(&)[64]>(o[0]);  // [64] = [n8 tile of D][fragment]
      wgmma_fence_operands(o_wg);
      wgmma_fence();  // the rescale's and the packing's register writes precede the reads
#pragma unroll
      for (int kk = 0; kk < Traits::kMmaKV; ++kk) {
        wgmma_m64n128k16_rs<T>(o_wg, pfrag[0][kk], sw128_mn_major_desc<Traits::CTA_TILE_KV>(smem_addr(v_tile), kk),
                               true);
      }
    }
  };
  // `after`: a value computed by the softmax, which the wait must follow (wgmma_wait_after).
  [[maybe_unused]] auto wait_lagged_pv = [&](float after) {
    if constexpr (Traits::kWgmma) {
      wgmma_wait_after<0>(after, smem_addr(smem.wait_anchor + threadIdx.x));
      float(&o_wg)[64] = reinterpret_cast<float(&)[64]>(o[0]);
      wgmma_fence_operands(o_wg);
      // P's registers were read by the P V in flight: keep them allocated until here.
      uint32_t(&p_wg)[Traits::kMmaKV * 4] = reinterpret_cast<uint32_t(&)[Traits::kMmaKV * 4]>(pfrag[0]);
      wgmma_fence_operands(p_wg);
    }
  };
  [[maybe_unused]] auto release_lagged_pv = [&] {
    if constexpr (Traits::kWgmma) {
      mbarrier_arrive(smem.empty_v + ring.read_v.stage);
      ring.read_v.advance();
    }
  };

  // One KV tile. With kLagged (wgmma, every tile but the first) it also issues the previous
  // tile's P V after this tile's Q K^T. The first tile is a separate instantiation rather than a
  // branch on `tile > 0` around the wgmma issue and waits: ptxas then ends the P V's pipeline
  // stage before the softmax (or serialises every wgmma, C7514).
  auto kv_tile_step = [&](const int tile, auto lagged) {
    constexpr bool kLagged = decltype(lagged)::value;
    static_assert(!kLagged || Traits::kPvLag == 1, "only warp-specialised tiles lag P V");
    const int kv_begin = tiles.begin(tile), kv_tile_end = tiles.end(tile);
    if constexpr (Traits::kWarpSpecialized) {
      mbarrier_wait(smem.full_k + compute_stage.stage, compute_stage.phase);
      // kByCopies: the copies (this K stage's, and Q's: q_full completed earlier), before
      // wgmma's async-proxy reads.
      if constexpr (kByCopies) fence_proxy_async_shared();
    } else {
      cp_async_wait<Traits::kStages - 2>();  // the group of `tile` (and Q) has landed
      // After this barrier: every thread finished computing tile - 1 (its stage and row table are
      // free) and resolved tile + kStages - 1.
      __syncthreads();
      copy(tile + Traits::kStages - 1, fill_stage.stage);
      fill_stage.advance();
      resolve(tile + Traits::kStages);
    }

    T* k_tile = smem.k + compute_stage.stage * kTileElems;  // [CTA_TILE_KV][HEAD_DIM]
    T* v_tile = smem.v + compute_stage.stage * kTileElems;  // [CTA_TILE_KV][HEAD_DIM] (mma.sync)
    const int32_t* keys = smem.row_keys + table_slot(tile) * Traits::CTA_TILE_KV;  // [CTA_TILE_KV]
    const uint32_t k_frag = smem_addr(k_tile) + k_frag_offset;
    const uint32_t v_frag = smem_addr(v_tile) + v_frag_offset;

    // Variant transforms of the operands, in shared memory, before any warp reads them. The
    // query transform also applies the logits' input scale when kPrescaleQuery.
    if constexpr (Variant::kHasQueryTransform || Variant::kHasKeyTransform || Variant::kHasValueTransform ||
                  kPrescaleQuery) {
      if ((Variant::kHasQueryTransform || (kPrescaleQuery && logits_input_scale != 1.f)) && tile == 0) {
        transform_tile_pairs<Traits, Traits::CTA_TILE_Q>(q_tile, [&](int row, int dim, float2& x) {
          const PackedRow r = unpack_row(p, kv_head, packed_begin + row);
          if (r.qo_idx >= e.qo_len) return false;
          if constexpr (Variant::kHasQueryTransform) {
            x = Variant::query_transform(vp, e, x, batch, e.q_pos_offset + r.qo_idx, -1, r.head, kv_head, dim,
                                         Traits::HEAD_DIM);
          }
          if constexpr (kPrescaleQuery) x = make_float2(x.x * logits_input_scale, x.y * logits_input_scale);
          return true;
        });
      }
      if constexpr (Variant::kHasKeyTransform) {
        transform_tile_pairs<Traits, Traits::CTA_TILE_KV>(k_tile, [&](int row, int dim, float2& x) {
          if (keys[row] < 0) return false;
          x = Variant::key_transform(vp, e, x, batch, -1, keys[row], -1, kv_head, dim, Traits::HEAD_DIM);
          return true;
        });
      }
      if constexpr (Variant::kHasValueTransform && !Traits::kWgmma) {  // wgmma: in issue_lagged_pv
        transform_tile_pairs<Traits, Traits::CTA_TILE_KV>(v_tile, [&](int row, int dim, float2& x) {
          if (keys[row] < 0) return false;
          x = Variant::value_transform(vp, e, x, batch, -1, keys[row], -1, kv_head, dim, Traits::HEAD_DIM);
          return true;
        });
      }
      if constexpr (Traits::kWgmma) fence_proxy_async_shared();
      compute_sync<Traits>();
    }

    // S = Q K^T for this warp's rows and columns.
    float s[kMmaQ][kN8KV][4];  // [m16 tile][n8 tile of KV][fragment]
    if constexpr (Traits::kWgmma) {
      // The warpgroup's 64 rows against all 128 keys; this warp's share is s[0] (16 rows).
      float(&s_wg)[64] = reinterpret_cast<float(&)[64]>(s[0]);  // [64] = [n8 tile][fragment]
      wgmma_fence();
#pragma unroll
      for (int kd = 0; kd < Traits::kMmaD; ++kd) {
        wgmma_m64n128k16_ss<T>(s_wg, sw128_k_major_desc<Traits::CTA_TILE_Q>(q_tile_addr, q_wg_row0, kd),
                               sw128_k_major_desc<Traits::CTA_TILE_KV>(smem_addr(k_tile), 0, kd), kd > 0);
      }
      wgmma_commit();
      if constexpr (kLagged) {
        issue_lagged_pv(tile - 1);
        wgmma_commit();
        wgmma_wait<1>();  // this tile's Q K^T (committed first) is done; the P V may still run
      } else {
        wgmma_wait<0>();
      }
      wgmma_fence_operands(s_wg);
      mbarrier_arrive(smem.empty_k + compute_stage.stage);
    } else {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int n = 0; n < kN8KV; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) s[mq][n][i] = 0.f;
#pragma unroll
      for (int kd = 0; kd < Traits::kMmaD; ++kd) {
        uint32_t a[kMmaQ][4];
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) ldmatrix_x4(a[mq], (q_frag ^ (kd << 5)) + mq * 16 * kRowBytes);
#pragma unroll
        for (int nk = 0; nk < kN8KV / 2; ++nk) {
          uint32_t b[4];  // b0, b1 of n8 tile 2nk, then of 2nk+1
          ldmatrix_x4(b, (k_frag ^ (kd << 5)) + nk * 16 * kRowBytes);
#pragma unroll
          for (int mq = 0; mq < kMmaQ; ++mq) {
            mma_m16n8k16<T>(s[mq][2 * nk], a[mq], b[0], b[1]);
            mma_m16n8k16<T>(s[mq][2 * nk + 1], a[mq], b[2], b[3]);
          }
        }
      }
    }

    // Mask, then fold into the running softmax state. Logits stay unscaled until the exponent,
    // where scale and max subtraction are one FMA (sm_scale > 0, so the max commutes with it);
    // a variant that transforms logits gets them scaled (natural units) and returns them in
    // base 2 here, so its exponent uses scale 1.
    bool tile_needs_mask = kv_begin + Traits::CTA_TILE_KV > kv_tile_end ||
                           (p.causal && kv_begin + Traits::CTA_TILE_KV - 1 > q_pos_first) ||
                           !Variant::tile_unmasked(vp, q_pos_first, q_pos_last, kv_begin,
                                                   kv_begin + Traits::CTA_TILE_KV - 1);
    if constexpr (kFormat == KVFormatKind::kBlockSparse) {
      // Listed blocks flagged full need no mask (the flags cover every mask in effect) as long as
      // every column exists: an out-of-range block id or the padded last block keeps its mask,
      // whatever its flag says, so missing columns never join the softmax.
      bool full = p.block_flags != nullptr && kv_begin + Traits::CTA_TILE_KV <= kv_tile_end;
      for (int pos = kv_begin; full && pos < kv_begin + Traits::CTA_TILE_KV; pos += p.page_size - pos % p.page_size) {
        const int entry = e.kv_begin + pos / p.page_size;
        const int32_t block = p.kv_indices[entry];
        full = p.block_flags[entry] != 0 && block >= 0 &&
               static_cast<int64_t>(block + 1) * p.page_size <= p.num_kv_rows;
      }
      tile_needs_mask = !full;
    }
    // Softmax-free variants' transformed logits are the weights themselves (scale 1).
    const float scale = kTransformLogits ? (kSoftmax ? detail::kLog2eF * Variant::logits_output_scale(vp) : 1.f)
                                         : p.sm_scale_log2;
    // With the split key bias, s holds q.k + slope * (column - the thread's first column) and
    // row_bias the rest, slope * (the thread's first key - qo_pos), folded units: a per-lane term.
    float row_bias[kMmaQ][2];  // [m16 tile][row half]
    if constexpr (kSplitKeyBias) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float slope = key_slope[mq][h];
          // Exact: the integer difference converts once (positions < 2^24).
          row_bias[mq][h] = slope * static_cast<float>(kv_begin + key_offset[mq][h]);
#pragma unroll
          for (int n = 0; n < kN8KV; ++n) {
            // Column 0's offset is 0 (fmaf would still add slope * 0 to keep NaN semantics).
            if (n > 0) s[mq][n][2 * h] = fmaf(slope, static_cast<float>(n * 8), s[mq][n][2 * h]);
            s[mq][n][2 * h + 1] = fmaf(slope, static_cast<float>(n * 8 + 1), s[mq][n][2 * h + 1]);
          }
        }
    }
    // One branch per tile around the per-element loop and one warp vote for the O rescale, not
    // one per m16 tile or row: each branch closes a basic block, and the scheduler can only
    // interleave the rows' independent max / exponent / sum chains (the latency that bounds this
    // loop between the two MMA phases) within one. The loop is instantiated twice, with and without
    // the mask, so the unmasked tiles of a logits-transforming variant (nearly all of them) carry
    // no per-logit mask predicates: with one body predicated on tile_needs_mask they cost ~5
    // instructions per logit (SASS) on the softmax's critical path.
    auto transform_and_mask = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int n = 0; n < kN8KV; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int key = keys[warp_col0 + n * 8 + 2 * t + (i & 1)];
            const PackedRow r = unpack_row(p, kv_head, packed_row(mq, i / 2));
            // Padding rows of the request's last query tile are never stored; the hooks see the
            // last real row instead, so a custom mask or a user table indexed by the query never
            // reads past its end (qo_len >= 1 here: a tile exists only for a non-empty request).
            const int qo_pos = e.q_pos_offset + min(r.qo_idx, e.qo_len - 1);
            const int qo_head = r.head;
            if constexpr (kTransformLogits && !kSplitKeyBias) {
              const float x = kPrescaleQuery ? s[mq][n][i] : s[mq][n][i] * logits_input_scale;
              s[mq][n][i] = Variant::logits_transform(vp, e, x, batch, qo_pos, key, qo_head, kv_head);
            }
            if constexpr (kMasked) {
              // 0 <= key < key_end in one unsigned compare (key_end >= 0; per row, hoisted).
              const int key_end = p.causal ? max(qo_pos + 1, 0) : 0x7fffffff;
              const bool visible = static_cast<uint32_t>(key) < static_cast<uint32_t>(key_end) &&
                                   (!Variant::kHasMask || Variant::logits_mask(vp, e, batch, qo_pos, key, qo_head,
                                                                               kv_head));
              if (!visible) s[mq][n][i] = kSoftmax ? -INFINITY : 0.f;
            }
          }
    };
    if (tile_needs_mask) {
      transform_and_mask(BoolConstant<true>{});
    } else if constexpr (kTransformLogits && !kSplitKeyBias) {
      transform_and_mask(BoolConstant<false>{});
    }
    // The weights of row half (mq, h), p = 2^(s * scale - shift) in place, and their sum (a tree).
    // Without a shift (the zero reference) one FMUL per logit rather than an FFMA with -0.
    auto exponentiate = [&](int mq, int h, auto has_shift, float shift) {
      float tree[kN8KV];  // [n8 tile], folded in halves
#pragma unroll
      for (int n = 0; n < kN8KV; ++n) {
#pragma unroll
        for (int i = 2 * h; i < 2 * h + 2; ++i) {
          s[mq][n][i] = fast_exp2(decltype(has_shift)::value ? fmaf(s[mq][n][i], scale, -shift) : s[mq][n][i] * scale);
        }
        tree[n] = s[mq][n][2 * h] + s[mq][n][2 * h + 1];
      }
      fold_halves<kN8KV / 2>(tree, [](float a, float b) { return a + b; });
      return tree[0];
    };
    // O's rescale for a moved reference max waits for the P V in flight (wgmma).
    float rescale[kMmaQ][2];  // [m16 tile][row half]
    bool settled = true;      // no row's max moved in this thread
    if (kMayUseZeroReference && zero_reference) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) st.d[mq][h] += exponentiate(mq, h, BoolConstant<false>{}, 0.f);
    } else if constexpr (kSoftmax) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // Max and sum over the thread's 2 * kN8KV logits of the row as trees: depth log2, where
          // a running value made a serial chain of kN8KV dependent instructions (SASS), the
          // latency between the two MMA phases that 2 warps per scheduler cannot hide.
          float tree[kN8KV];  // [n8 tile], folded in halves
#pragma unroll
          for (int n = 0; n < kN8KV; ++n) tree[n] = fmaxf(s[mq][n][2 * h], s[mq][n][2 * h + 1]);
          fold_halves<kN8KV / 2>(tree, [](float a, float b) { return fmaxf(a, b); });
          // The row bias depends on the lane (its first column): added before the lanes combine.
          float raw_max = kSplitKeyBias ? tree[0] + row_bias[mq][h] : tree[0];
          raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 1));
          raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, 2));
          // The state's max is a reference, not necessarily the true max: it moves only when a
          // logit exceeds it by more than kStaleMaxSlack (base 2), so after the first tiles of a
          // row the O rescale below is almost never needed. Weights are then <= 2^kStaleMaxSlack,
          // exact in fp32 and as 16-bit P (same relative rounding); O / d and m + log2(d) do not
          // depend on which reference was used.
          const float tile_max = raw_max * scale;
          const float row_max = tile_max > st.m[mq][h] + kStaleMaxSlack ? tile_max : st.m[mq][h];
          // All keys so far masked: keep the state empty and make every p exactly 0.
          const float base = row_max == -INFINITY ? 0.f : row_max;
          // The exponent of s is (s + row bias) * scale - base.
          const float shift = kSplitKeyBias ? fmaf(-row_bias[mq][h], scale, base) : base;
          rescale[mq][h] = fast_exp2(st.m[mq][h] - base);
          settled = settled && rescale[mq][h] == 1.f;
          st.m[mq][h] = row_max;
          st.d[mq][h] = st.d[mq][h] * rescale[mq][h] + exponentiate(mq, h, BoolConstant<true>{}, shift);
        }
    }
    if constexpr (kLagged) {
      wait_lagged_pv(st.d[0][0] + st.d[0][1]);  // O and P are free again (after every exponential)
      release_lagged_pv();
    }
    // Once the reference maxima settle (all but the first tiles of a row) no lane rescales.
    if (kSoftmax && !(kMayUseZeroReference && zero_reference) && !__all_sync(0xffffffffu, settled)) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
        for (int n = 0; n < kN8D; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) o[mq][n][i] *= rescale[mq][i / 2];
    }

    // P goes from the S accumulators straight into A fragments, packed to 16 bits first so the
    // fp32 S registers are free during the P V loop.
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int kk = 0; kk < Traits::kMmaKV; ++kk) {
        pfrag[mq][kk][0] = pack_pair<T>(s[mq][2 * kk][0], s[mq][2 * kk][1]);
        pfrag[mq][kk][1] = pack_pair<T>(s[mq][2 * kk][2], s[mq][2 * kk][3]);
        pfrag[mq][kk][2] = pack_pair<T>(s[mq][2 * kk + 1][0], s[mq][2 * kk + 1][1]);
        pfrag[mq][kk][3] = pack_pair<T>(s[mq][2 * kk + 1][2], s[mq][2 * kk + 1][3]);
      }
    // O += P V: with wgmma in the next iteration (issue_lagged_pv), with mma.sync here.
    if constexpr (!Traits::kWgmma) {
#pragma unroll
      for (int kk = 0; kk < Traits::kMmaKV; ++kk) {
#pragma unroll
        for (int nd = 0; nd < kN8D / 2; ++nd) {
          uint32_t b[4];  // b0, b1 of D tile 2nd, then of 2nd+1
          ldmatrix_x4_trans(b, (v_frag ^ (nd << 5)) + kk * 16 * kRowBytes);
#pragma unroll
          for (int mq = 0; mq < kMmaQ; ++mq) {
            mma_m16n8k16<T>(o[mq][2 * nd], pfrag[mq][kk], b[0], b[1]);
            mma_m16n8k16<T>(o[mq][2 * nd + 1], pfrag[mq][kk], b[2], b[3]);
          }
        }
      }
    }
    compute_stage.advance();
  };
  if constexpr (Traits::kPvLag == 1) {
    if (num_kv_tiles > 0) {
      kv_tile_step(0, BoolConstant<false>{});
      for (int tile = 1; tile < num_kv_tiles; ++tile) kv_tile_step(tile, BoolConstant<true>{});
      issue_lagged_pv(num_kv_tiles - 1);
      wgmma_commit();
      wait_lagged_pv(0.f);
      release_lagged_pv();
    }
  } else {
    for (int tile = 0; tile < num_kv_tiles; ++tile) kv_tile_step(tile, BoolConstant<false>{});
  }
  cp_async_wait<0>();
  if constexpr (Traits::kWarpSpecialized) {
    mbarrier_arrive(smem.q_empty + q_stage);  // the item's last Q K^T has completed: the buffer is free
    ring.read_q.advance();
    ring.tiles += num_kv_tiles;
  }

  // Row sums: each thread holds a quarter of every row's terms.
#pragma unroll
  for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.d[mq][h] += __shfl_xor_sync(0xffffffffu, st.d[mq][h], 1);
      st.d[mq][h] += __shfl_xor_sync(0xffffffffu, st.d[mq][h], 2);
    }

  // Final value of output element `dim` of query row qo_idx, head `head`, from its accumulator.
  auto final_value = [&](float acc, float inv, int qo_idx, int head, int dim) {
    const float value = acc * inv;
    if constexpr (Variant::kHasOutputTransform) {
      return Variant::output_transform(vp, e, value, batch, e.q_pos_offset + qo_idx, head, dim);
    }
    return value;
  };
  // Softmax off: the sums are the output (inv 1) and there is no log-sum-exp.
  auto normaliser = [&](float d) { return !kSoftmax ? 1.f : d > 0.f ? 1.f / d : 0.f; };
  auto log_sum_exp = [&](float m, float d) { return !kSoftmax ? NAN : d > 0.f ? m + log2f(d) : -INFINITY; };

  if constexpr (Traits::NUM_WARPS_KV > 1) {
    // Each warp saw a different slice of every KV tile: merge the warps' states (same rows).
    __syncthreads();
    float* merge_o = reinterpret_cast<float*>(smem.k);  // [kNumWarps][kWarpRowsQ][HEAD_DIM]
    float* merge_md = merge_o + Traits::kNumWarps * Traits::kWarpRowsQ * Traits::HEAD_DIM;  // [kNumWarps][kWarpRowsQ][2]
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = mq * 16 + g + 8 * h;
#pragma unroll
        for (int n = 0; n < kN8D; ++n) {
          float* dst = merge_o + (warp * Traits::kWarpRowsQ + row) * Traits::HEAD_DIM + n * 8 + 2 * t;
          dst[0] = o[mq][n][2 * h];
          dst[1] = o[mq][n][2 * h + 1];
        }
        if (t == 0) {
          merge_md[(warp * Traits::kWarpRowsQ + row) * 2] = st.m[mq][h];
          merge_md[(warp * Traits::kWarpRowsQ + row) * 2 + 1] = st.d[mq][h];
        }
      }
    __syncthreads();
    // All threads now combine: thread -> (row, 8-element column group).
    constexpr int kGroups = Traits::kWarpRowsQ * Traits::HEAD_DIM / 8;
    for (int i = threadIdx.x; i < kGroups; i += Traits::kComputeThreads) {
      const int row = i / (Traits::HEAD_DIM / 8), c0 = (i % (Traits::HEAD_DIM / 8)) * 8;
      float m_max = -INFINITY;
#pragma unroll
      for (int w = 0; w < Traits::kNumWarps; ++w) m_max = fmaxf(m_max, merge_md[(w * Traits::kWarpRowsQ + row) * 2]);
      const float base = m_max == -INFINITY ? 0.f : m_max;
      float d_sum = 0.f, acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int w = 0; w < Traits::kNumWarps; ++w) {
        const float wgt = exp2f(merge_md[(w * Traits::kWarpRowsQ + row) * 2] - base);
        d_sum += wgt * merge_md[(w * Traits::kWarpRowsQ + row) * 2 + 1];
        const float* src = merge_o + (w * Traits::kWarpRowsQ + row) * Traits::HEAD_DIM + c0;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += wgt * src[j];
      }
      const PackedRow r = unpack_row(p, kv_head, packed_begin + row);
      if (r.qo_idx >= e.qo_len) continue;
      const float inv = normaliser(d_sum);
      const float lse = log_sum_exp(m_max, d_sum);
      if (out.partial_o != nullptr) {
        float* dst = out.partial_o + row * Traits::HEAD_DIM + c0;  // [8] of [CTA_TILE_Q][HEAD_DIM]
        *reinterpret_cast<float4*>(dst) = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
        *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
        if (c0 == 0) out.partial_lse[row] = lse;
        continue;
      }
      uint32_t packed_out[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        packed_out[j] = pack_pair<T>(final_value(acc[2 * j], inv, r.qo_idx, r.head, c0 + 2 * j),
                                     final_value(acc[2 * j + 1], inv, r.qo_idx, r.head, c0 + 2 * j + 1));
      }
      T* dst = p.o + static_cast<int64_t>(e.q_begin + r.qo_idx) * p.o_row_stride + r.head * p.o_head_stride + c0;
      *reinterpret_cast<uint4*>(dst) = make_uint4(packed_out[0], packed_out[1], packed_out[2], packed_out[3]);
      if (p.lse != nullptr && c0 == 0) {
        p.lse[static_cast<int64_t>(e.q_begin + r.qo_idx) * p.lse_row_stride + r.head * p.lse_head_stride] = lse;
      }
    }
  } else {
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int packed = packed_row(mq, h);
        const PackedRow r = unpack_row(p, kv_head, packed);
        const int qo_idx = r.qo_idx, head = r.head;
        if (qo_idx >= e.qo_len) continue;
        const float inv = normaliser(st.d[mq][h]);
        const float lse = log_sum_exp(st.m[mq][h], st.d[mq][h]);
        if (out.partial_o != nullptr) {
          const int row = packed - packed_begin;
          float* dst = out.partial_o + row * Traits::HEAD_DIM + 2 * t;  // row of [CTA_TILE_Q][HEAD_DIM]
#pragma unroll
          for (int n = 0; n < kN8D; ++n) {
            *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[mq][n][2 * h] * inv, o[mq][n][2 * h + 1] * inv);
          }
          if (t == 0) out.partial_lse[row] = lse;
          continue;
        }
        T* dst = p.o + static_cast<int64_t>(e.q_begin + qo_idx) * p.o_row_stride + head * p.o_head_stride + 2 * t;
#pragma unroll
        for (int n = 0; n < kN8D; ++n) {
          *reinterpret_cast<uint32_t*>(dst + n * 8) =
              pack_pair<T>(final_value(o[mq][n][2 * h], inv, qo_idx, head, n * 8 + 2 * t),
                           final_value(o[mq][n][2 * h + 1], inv, qo_idx, head, n * 8 + 2 * t + 1));
        }
        if (p.lse != nullptr && t == 0) {
          p.lse[static_cast<int64_t>(e.q_begin + qo_idx) * p.lse_row_stride + head * p.lse_head_stride] = lse;
        }
      }
  }
}

/// The KV span of a query tile: [kv_first, kv_end) of the request, clipped by causal masking
/// (nothing past the last row's position; the planner mirrors this clip) and by the variant.
template <typename Traits, KVFormatKind kFormat, typename Variant, typename T>
TESSERA_DEVICE KVSpan tile_kv_span(const AttentionParams<T>& p, const VariantParams& vp, const RequestExtent& e,
                                   int packed_begin, int kv_first, int kv_end) {
  const int q_pos_first = e.q_pos_offset + packed_begin / p.group_size;
  const int q_pos_last = e.q_pos_offset + min(e.qo_len - 1, (packed_begin + Traits::CTA_TILE_Q - 1) / p.group_size);
  if (kFormat != KVFormatKind::kBlockSparse) {
    if (p.causal) kv_end = max(kv_first, min(kv_end, q_pos_last + 1));
    return Variant::visible_span(vp, q_pos_first, q_pos_last, kv_first, kv_end);
  }
  return KVSpan{kv_first, kv_first, kv_first, kv_end};  // columns, not positions: no clipping
}

/// One-shot grid, each CTA a query tile's whole KV range: blockIdx = (query tile, request, KV
/// head), or, when requests have one query tile (num_q_tiles == 1: decode, short appends),
/// (KV head, request, 0). See one_shot_grid (src/prefill_launch.cuh) for why.
template <typename Traits, KVFormatKind kFormat, typename Variant, typename T>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtasPerSm)
attention_prefill_kernel(const AttentionParams<T> p, const VariantParams vp, const int32_t num_q_tiles) {
  extern __shared__ __align__(1024) char smem_raw[];  // 1024: the XOR addressing of attention_tile
  const bool heads_fastest = num_q_tiles == 1;
  // Heaviest causal tiles (the last query rows) are scheduled first.
  const int q_tile = heads_fastest ? 0 : num_q_tiles - 1 - static_cast<int>(blockIdx.x);
  const int request = blockIdx.y, kv_head = heads_fastest ? blockIdx.x : blockIdx.z;
  const RequestExtent e = request_extent<kFormat>(p, request);
  const int packed_begin = q_tile * Traits::CTA_TILE_Q;
  if (packed_begin >= e.qo_len * p.group_size) return;
  const KVSpan span = tile_kv_span<Traits, kFormat, Variant>(p, vp, e, packed_begin, 0, e.kv_len);
  with_warp_role<Traits, kFormat>(smem_raw, [&](auto role) {
    RingPosition<Traits> ring;
    attention_tile<Traits, kFormat, Variant, decltype(role)::value>(p, vp, e, request, kv_head, packed_begin, span,
                                                                    TileOutput{nullptr, nullptr}, smem_raw, ring);
  });
}

/// Persistent grid of the plan/run runtime: blockIdx = (column, KV head group); column c runs the
/// planned items cta_indptr[c] .. cta_indptr[c+1]-1 for each KV head of its group in turn (the
/// plan is one head's; a group of heads_per_cta heads lets the grid fill every SM when H_kv does
/// not divide the CTA slots: 132 SMs, 8 KV heads, 33 columns of 2 heads instead of 16 of 1).
template <typename Traits, KVFormatKind kFormat, typename Variant, typename T>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtasPerSm)
attention_persistent_kernel(const AttentionParams<T> p, const VariantParams vp, const PlannedWork work) {
  extern __shared__ __align__(1024) char smem_raw[];  // 1024: the XOR addressing of attention_tile
  // The contraction may launch now: its CTAs read the plan's merge descriptors and request
  // extents while this grid runs, then wait for it before touching the partial states.
  allow_dependent_launch();
  const int first = work.cta_indptr[blockIdx.x], last = work.cta_indptr[blockIdx.x + 1];
  with_warp_role<Traits, kFormat>(smem_raw, [&](auto role) {
    constexpr WarpRole kRole = decltype(role)::value;
    RingPosition<Traits> ring;  // continues across the items and heads
    auto run_column = [&](const int kv_head) {
      for (int i = first; i < last; ++i) {
        const PlannedItem item = work.items[i];
        if (item.request < 0 || item.request >= p.batch_size) continue;  // never produced by the planner
        const RequestExtent e = request_extent<kFormat>(p, item.request);
        TileOutput out{nullptr, nullptr};
        if (item.partial >= 0) {
          const int64_t slot = static_cast<int64_t>(item.partial) * p.num_kv_heads + kv_head;
          out.partial_o = work.partial_o + slot * Traits::CTA_TILE_Q * Traits::HEAD_DIM;
          out.partial_lse = work.partial_lse + slot * Traits::CTA_TILE_Q;
        }
        const KVSpan span = tile_kv_span<Traits, kFormat, Variant>(p, vp, e, item.packed_begin,
                                                                   max(item.kv_begin, 0), min(item.kv_end, e.kv_len));
        // The previous item's last shared-memory reads are done. The warp-specialised ring orders
        // items through its mbarriers instead, so the producer starts the next item early.
        if constexpr (kRole == WarpRole::kAll) __syncthreads();
        attention_tile<Traits, kFormat, Variant, kRole>(p, vp, e, item.request, kv_head, item.packed_begin, span,
                                                        out, smem_raw, ring);
      }
    };
    if constexpr (Traits::kWarpSpecialized) {
      for (int h = 0; h < work.heads_per_cta; ++h) run_column(static_cast<int>(blockIdx.y) * work.heads_per_cta + h);
    } else {
      // One head per CTA (the host's grid_shape): a head loop around the mma.sync tiles, which
      // use every register, made them spill.
      run_column(static_cast<int>(blockIdx.y));
    }
  });
}

}  // namespace kernels
}  // namespace tessera
