// The FA2/FA3-class prefill tile's configuration: the traits struct (tile sizes, warp roles,
// stages, shared-memory budget, tied together by static_asserts), the shared-memory layout it
// implies, and the synchronisation of its warp roles.
#pragma once

#include "kernels/attention/params.cuh"
#include "kernels/common/fp8.cuh"
#include "kernels/common/pipeline.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/smem_layout.cuh"
#include "kernels/common/wgmma.cuh"

namespace tessera {
namespace kernels {

/// The tensor-core instructions of a prefill configuration: mma.sync m16n8k16 fed by ldmatrix
/// (sm_80+), or wgmma m64nNk16 from shared-memory descriptors (sm_90a; one warpgroup per 64
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
          int STAGES_ = 2, int MIN_CTAS_PER_SM_ = 1, MmaKind MMA_ = MmaKind::kSync, typename KVT_ = T,
          int HEAD_DIM_VO_ = HEAD_DIM_>
struct PrefillTraits {
  using DType = T;  // the MMA operands' type: Q, and K/V as the MMAs read them
  // K/V as they are stored in memory: T, or fp8 (e4m3, e5m2), which the mainloop dequantizes
  // into T tiles (times the KV scales) after each tile lands. fp8 -> T is exact and the scale one
  // multiply, so the tiles the MMAs read are what a T cache of the dequantized values would hold
  // (up to T's rounding of x * scale).
  using KVStorage = KVT_;
  // FP8 attention (sm_90a): Q, K and V all fp8 (T e4m3 or e5m2, K/V stored as T), Q K^T and P V
  // as fp8 wgmma (k32 steps) with fp32 accumulation, P rounded to T, the output of another type
  // (Params::OType, f16 or bf16) and the per-tensor or per-KV-head descale factors folded into
  // the logits' scale (q x k) and the output (v). fp8 wgmma reads B K-major only, so V is
  // transposed on the way in (kTransposedV).
  static constexpr bool kFp8Operands = IsFp8<T>::value;
  static constexpr bool kDequantizeKV = IsFp8<KVT_>::value && !kFp8Operands;
  static constexpr int kChunkElems = 16 / static_cast<int>(sizeof(T));  // elements of a 16-byte chunk
  static constexpr int kMmaK = 32 / static_cast<int>(sizeof(T));        // elements an MMA k step sums: 16, fp8 32
  // Q and K rows have HEAD_DIM elements (Q K^T's reduction), V and O rows HEAD_DIM_VO (P V's
  // columns): they differ for the prefill of models whose keys carry a rotary part that values
  // lack (DeepSeek's MLA without absorption: 192 = 128 + 64 against 128). V's columns are a prefix
  // of the loaders' chunk columns, so HEAD_DIM_VO <= HEAD_DIM.
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int HEAD_DIM_VO = HEAD_DIM_VO_;
  static constexpr bool kSplitHeadDims = HEAD_DIM_VO != HEAD_DIM;
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
  static constexpr int kComputeWarpgroups = kWarpSpecialized ? kNumWarps / 4 : 0;
  // Whether the compute warpgroups take turns issuing their MMAs (ping-pong, Sm90Mainloop). It
  // pays where a warpgroup's softmax is long beside its MMAs: the softmax's work per KV tile does
  // not grow with the head dim, the MMAs' does. Measured against the unordered issue (H100,
  // bench/results/LOG.md): faster at head dims 64 (three warpgroups) and 128 (the variable-length
  // batches; dense 16k within 1%), slower at 96 (2-3%) and 256 (4-7%), which keep the unordered
  // issue. Split head dims 192 / 128 keep the unordered issue (ping-pong measured 1% slower).
  static constexpr bool kMmaTurns = kComputeWarpgroups > 1 && (HEAD_DIM == 64 || HEAD_DIM == 128);
  static constexpr int kThreads = (kNumWarps + kProducerWarps) * kWarpSize;  // launched
  static constexpr int kLoaderThreads = kWarpSpecialized ? kProducerWarps * kWarpSize : kThreads;
  // setmaxnreg: the producer keeps kProducerRegs, the compute warpgroups take the rest (the
  // kernel is compiled for 65536 / kThreads registers per thread). At 40 the persistent kernel's
  // producer, which carries the item loop, spilled 16-24 bytes. (64 would leave the compute
  // warpgroups' increase to 224 short of the 168 x 384 registers the CTA is allocated: the
  // split-head-dims kernels hung with it.)
  static constexpr int kProducerRegs = NUM_WARPS_Q_ * NUM_WARPS_KV_ > 8 ? 32 : 56;
  // The compute warpgroups share the rest of the SM's 64K registers (multiples of 8, at most 240):
  // 224 with two of them, 152 with three.
  static constexpr int kComputeShare = (65536 - kProducerRegs * kProducerWarps * kWarpSize) / kComputeThreads / 8 * 8;
  static constexpr int kComputeRegs = !kWarpSpecialized ? 0 : kComputeShare > 240 ? 240 : kComputeShare;
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
  static constexpr int kMmaKV = kWarpColsKV / kMmaK;              // k steps of P*V per warp
  static constexpr int kN8KV = kWarpColsKV / 8;                   // n8 tiles of S per warp
  static_assert((kN8KV & (kN8KV - 1)) == 0, "the softmax's max and sum trees halve kN8KV");
  static constexpr int kMmaD = HEAD_DIM / kMmaK;                  // k steps of Q*K^T
  // Decode-sized warp tiles (one m16 x two n8 of S per warp: the 16-row tiles) are latency-bound
  // when a CTA runs alone on its SM (a long request of a skewed decode batch): each scheduler has
  // one warp, and a KV tile is one chain of dependent steps. Two changes shorten the chain:
  // - kQkChains: a warp's S is kMmaQ x kN8KV accumulators, each the end of kMmaD dependent
  //   mma.sync; here even and odd k16 steps go to separate accumulators, summed after the loop
  //   (4 chains of half the depth, 8 more registers).
  // - kLoadsBehindMma: the tile's copies (tile + kStages - 1) are issued after its Q K^T MMAs and
  //   its row-table resolve after its P V MMAs, so their ~250 instructions fill the MMAs' latency
  //   instead of preceding the first MMA.
  // Larger warp tiles have independent chains enough, and their registers are all accumulators:
  // issued late, the copies' addresses spilled (8-80 bytes).
  static constexpr bool kChainBoundTile = !kWgmma && kMmaQ * kN8KV <= 2;
  static constexpr int kQkChains = kChainBoundTile && kMmaD % 2 == 0 ? 2 : 1;
  static constexpr bool kLoadsBehindMma = kChainBoundTile;
  static constexpr int kN8D = HEAD_DIM_VO / 8;                    // n8 tiles of O
  static constexpr int kRowChunks = HEAD_DIM * static_cast<int>(sizeof(T)) / 16;  // 16 B chunks of a Q or K row's data
  static constexpr int kVRowChunks = HEAD_DIM_VO * static_cast<int>(sizeof(T)) / 16;  // ... of a V row's
  // The chunk columns the loaders spread their threads over: a power of two of at least 8, so that
  // a thread keeps its column from pass to pass; threads past the row's data (head dim 96: 12 of
  // 16 columns) copy nothing.
  static constexpr int kLoaderRowChunks = kRowChunks <= 8 ? 8 : kRowChunks <= 16 ? 16 : kRowChunks <= 32 ? 32 : 64;
  // Chunks a row takes in shared memory. The mma.sync mainloop XORs the k16 step into its ldmatrix
  // addresses, which needs rows of a power of two chunks: head dim 96 (12 chunks) is stored in 16,
  // its last chunks never written or read (a quarter of the Q/K/V buffers), so it runs the other
  // head dims' inner loops unchanged. wgmma reads rows as they are, in the widest swizzle that
  // divides them (WgmmaTile: 64-byte blocks at 96).
  static constexpr int kSmemRowChunks = kWgmma ? kRowChunks : kLoaderRowChunks;
  // V rows likewise: as they are for wgmma, else a power of two of at least 8 chunks.
  // fp8 operands: V is stored transposed (kTransposedV), rows of CTA_TILE_KV keys.
  static constexpr bool kTransposedV = kFp8Operands;
  static constexpr int kVSmemRowChunks = kTransposedV ? CTA_TILE_KV * static_cast<int>(sizeof(T)) / 16
                                         : !kSplitHeadDims ? kSmemRowChunks
                                         : kWgmma         ? kVRowChunks
                                         : kVRowChunks <= 8 ? 8 : kVRowChunks <= 16 ? 16 : kVRowChunks <= 32 ? 32 : 64;
  // Shared-memory layout of a ROWS-row Q or K tile, and of a V tile of ROWS keys, as the MMA kind
  // reads them (the same type when the head dims agree; transposed V: HEAD_DIM_VO rows of ROWS
  // keys, K-major for P V).
  template <int ROWS>
  using SmemTile = typename OperandTile<kWgmma, ROWS, kSmemRowChunks>::type;
  template <int ROWS>
  using VSmemTile = Conditional<kTransposedV, WgmmaTile<HEAD_DIM_VO, ROWS * static_cast<int>(sizeof(T)) / 16>,
                                typename OperandTile<kWgmma, ROWS, kVSmemRowChunks>::type>;

  static constexpr int kQTileElems = CTA_TILE_Q * kSmemRowChunks * kChunkElems;     // [CTA_TILE_Q][kSmemRowChunks * kChunkElems]
  static constexpr int kKTileElems = CTA_TILE_KV * kSmemRowChunks * kChunkElems;    // [CTA_TILE_KV][kSmemRowChunks * kChunkElems]
  static constexpr int kVTileElems = kTransposedV ? HEAD_DIM_VO * CTA_TILE_KV      // [HEAD_DIM_VO][CTA_TILE_KV]
                                                   : CTA_TILE_KV * kVSmemRowChunks * kChunkElems;  // [CTA_TILE_KV][kVSmemRowChunks * kChunkElems]
  static constexpr int kQTileBytes = kQTileElems * static_cast<int>(sizeof(T));
  // Q buffers. Warp-specialised: two where they fit, so the producer copies the next work item's
  // Q while the compute warps still read the current one (the persistent kernel's items are short:
  // W4's causal 1k requests average ~5 KV tiles, and a single buffer left each item's Q copy
  // exposed behind the previous item's last P V and epilogue). Head dim 256's 64 KB Q tiles leave
  // room for one beside the K/V ring. Elsewhere one.
  static constexpr int kRowBytes = kSmemRowChunks * 16;
  static constexpr int kKTileBytes = kKTileElems * static_cast<int>(sizeof(T));
  static constexpr int kVTileBytes = kVTileElems * static_cast<int>(sizeof(T));
  // FP8 attention: the producer copies a tile's V rows as stored into a raw stage and transposes
  // them into the V stage (transpose_v_tile); three raw stages, so the next two tiles' copies fly
  // while one is transposed (Sm90Mainloop::produce_transposed).
  static constexpr int kTransposeStages = kTransposedV ? 3 : 0;
  static constexpr int kTransposeRawBytes = kTransposedV ? CTA_TILE_KV * HEAD_DIM_VO : 0;  // [CTA_TILE_KV][HEAD_DIM_VO] bytes
  // fp8 KV, warp-specialised: whether a raw stage of K and of V fits beside one Q tile and the T
  // stages (the row tables, barriers and scratch as in kSecondQFits); else kConvertInPlace.
  static constexpr bool kRawStagesFit = kQTileBytes + STAGES_ * (kKTileBytes + kVTileBytes) +
                                            (STAGES_ + 3) * CTA_TILE_KV * 20 + 8 * 1024 + 2 * CTA_TILE_KV * HEAD_DIM <=
                                        227 * 1024;
  static constexpr bool kConvertInPlace = kDequantizeKV && kWarpSpecialized && !kRawStagesFit;
  static constexpr bool kSecondQFits =
      2 * kQTileBytes + STAGES_ * (kKTileBytes + kVTileBytes) + (STAGES_ + 3) * CTA_TILE_KV * 20 + 8 * 1024 +
          (kDequantizeKV && !kConvertInPlace ? 2 * CTA_TILE_KV * HEAD_DIM : 0) +
          kTransposeStages * kTransposeRawBytes <=
      227 * 1024;  // two Q tiles, the K/V ring, the row tables (see kRowTables), barriers and scratch, fp8's raw stages
  static constexpr int kQStages = kWarpSpecialized && kSecondQFits ? 2 : 1;
  // fp8 KV, sm80 mainloop: the cp.async ring holds the stored bytes (kStages raw stages of K and
  // of V, rows of HEAD_DIM bytes, RawTile), and the MMAs read either one dequantized T tile of K
  // and of V, rewritten each KV tile (kTileStages), or (kConvertFragments) the raw ring itself.
  // Half the ring's bytes per stage, so the same stages keep as many tokens in flight as a 16-bit
  // ring. Warp-specialised (wgmma): the producer copies a tile's stored rows into one raw stage of
  // K and one of V, waits for its own copies and converts the chunks it copied into the kStages
  // T stages the wgmma read (Sm90Mainloop::produce), so the compute warpgroups never see fp8 and
  // no producer thread waits for another's copies. Where the raw stages do not fit (head dim 256:
  // a 64 KB Q tile and 128 KB of T stages), a stored row being half a T row, a tile's stored rows
  // land in the upper half of the T stage they convert into, copied once the stage is free, and
  // the producer converts them in place (kConvertInPlace; Sm90Mainloop::produce_in_place). Where
  // both fit the raw stages are kept: at head dim 128 they measured faster (bench/results/LOG.md).
  static constexpr int kTileStages = kDequantizeKV && !kWarpSpecialized ? 1 : kStages;  // T K/V tiles the MMAs read
  static constexpr int kRawStages = kWarpSpecialized ? (kConvertInPlace ? 0 : 1) : kStages;
  // TMA (sm_90): the producer of a 16-bit tile asks the copy engine for a whole KV tile of rows
  // that are contiguous in memory (ragged and dense KV, KVTileSource::tma_tile), one instruction
  // per swizzled column block, which writes the wgmma layout itself (128-, 64- or 32-byte swizzle;
  // WgmmaTile). fp8 stages are converted or transposed by the producer after its own copies, so
  // they keep cp.async; so do the rows of any other format, gathered through the row tables.
  static constexpr bool kTmaKV = kWarpSpecialized && !kDequantizeKV && !kTransposedV;
  // Query tiles likewise wherever they are 16-bit (fp8 KV's too; FP8 attention's fp8 Q keeps cp.async).
  static constexpr bool kTmaQ = kWarpSpecialized && !kFp8Operands;
  // ... and output tiles, stored from each compute warpgroup's own 64 rows of the Q buffer (which
  // only it reads) by one bulk store per column block; O rows as wide as Q rows (no split head
  // dims). Only where the compute warps have registers to spare for a second store path: at head
  // dim 256 (128 O accumulators) it spilled 44-72 bytes more in the persistent kernels and 12-44
  // in the one-shot ones, and at 64 (three warpgroups of 152 registers) 20-28 (ptxas).
  static constexpr bool kTmaO = kTmaQ && !kSplitHeadDims && HEAD_DIM_VO <= 128 && kComputeRegs >= 224;
  // The thread that issued a tile's output stores waits for them to have read the Q buffer (and
  // then frees it) after the next work item's first Q K^T is issued rather than before: the
  // wait then runs under that MMA instead of holding its warpgroup's first MMA of the item back.
  // Needs a second Q buffer: the next item's Q cannot wait for a buffer whose release waits for
  // that item.
  static constexpr bool kDeferQRelease = kTmaO && kQStages == 2;
  static constexpr int kRawRowChunks = kDequantizeKV || kTransposedV ? HEAD_DIM / 16 : 0;  // 16-byte chunks of a stored row
  static constexpr int kRawTileBytes = kDequantizeKV ? CTA_TILE_KV * HEAD_DIM : 0;
  static constexpr int kRawRingBytes = 2 * kRawStages * kRawTileBytes;  // K and V
  // Decode tiles (one warp of query rows, whose warps each read only their own KV rows) load fp8
  // K/V fragments straight from the raw ring with ldmatrix and convert them in registers, one cvt
  // per pair into f16 (Sm80Mainloop::kConvertFragments, the default variant): each element is
  // still converted once, but without a T tile's store, barrier and second read, and without the
  // T tiles' shared memory, which held these tiles to 2 CTAs per SM (8 warps: latency bound,
  // bench/results/LOG.md). Variants (their hooks see dequantized values) keep the T tiles.
  static constexpr bool kConvertFragments = kDequantizeKV && NUM_WARPS_Q == 1;
  // The raw stages' layout: swizzled for the fragments' ldmatrix reads and the transpose's
  // column reads (transpose_v_tile).
  // In place (kConvertInPlace): inside the upper half of the T stage (InPlaceRawTile).
  using RawTile = Conditional<kConvertInPlace, InPlaceRawTile<CTA_TILE_KV, (kRawRowChunks > 0 ? kRawRowChunks : 8)>,
                              SwizzledRawTile<(kRawRowChunks > 0 ? kRawRowChunks : 8), kConvertFragments || kTransposedV>>;
  // The region after Q: the K/V stages (then FP8 attention's raw V stages), or fp8 KV's raw ring.
  // The T tiles of fp8 KV come last (kDequantTileOffset), so the kernels that never read them
  // launch without them.
  static constexpr int kKVRegionBytes = kDequantizeKV && !kConvertInPlace ? kRawRingBytes
                                                      : kStages * (kKTileBytes + kVTileBytes) +
                                                            kTransposeStages * kTransposeRawBytes;
  // Warp-specialised tiles overlap each tile's softmax with the previous tile's P V inside a
  // warpgroup: P V of tile t is issued in iteration t + 1, after Q K^T of tile t + 1. K and V
  // then have their own barriers (a K stage frees after its Q K^T, a V stage after its P V).
  static constexpr int kPvLag = kWarpSpecialized ? 1 : 0;
  // A work item's last KV tile whose visible keys all lie in its first half (the causal diagonal
  // of a query tile that covers fewer positions than a KV tile, as GQA's packed rows do; a span's
  // short end) runs P V over that half's k steps only: P is zero past it. Q K^T stays whole: a
  // half-width (m64n64) Q K^T in its own instantiation of the last step made ptxas serialise the
  // wgmmas of the D64 and D128 kernels for want of registers (C7511). wgmma tiles of 128 keys; the
  // mma.sync tiles compute whole tiles.
  static constexpr bool kHalfKvTiles = kWgmma && CTA_TILE_KV == 128;
  // Row tables (addresses and keys) in a ring, one per tile from the one being computed to the
  // one being resolved (see the kernel's pipeline comment): kStages + 1, and one more when the
  // producer runs a further tile ahead (K stages free a P V earlier) and V copies lag K copies;
  // warp-specialised fp8 one more: its producer resolves tile t + 1 before it waits for the V
  // stage of t - 1, i.e. while a P V of t - 3 (a value transform reads its keys) may still run.
  // FP8 attention kTransposeStages - 1 more: its producer resolves that many tiles ahead of the
  // one whose V stage it acquires.
  static constexpr int kRowTables = kStages + 1 + kPvLag + (kWarpSpecialized && kDequantizeKV ? 1 : 0) +
                                    (kTransposedV ? kTransposeStages - 1 : 0);
  static constexpr int kRowTableBytes = kRowTables * CTA_TILE_KV * (2 * static_cast<int>(sizeof(uint64_t)) + 4);
  // Merging the warps' states (NUM_WARPS_KV > 1) reuses the K/V region and the row tables (free
  // after the last tile): O, m, d per warp.
  static constexpr int kMergeBytes = NUM_WARPS_KV > 1 ? kNumWarps * kWarpRowsQ * (HEAD_DIM_VO + 2) * 4 : 0;
  // Warp-specialised: the Q loader's row offsets get their own scratch (the producer loads the
  // next item's Q while K/V stages are in use), and the ring has a "full" and an "empty"
  // mbarrier per stage for K and for V, and a pair for Q.
  static constexpr int kQRowScratchBytes = kWarpSpecialized ? CTA_TILE_Q * 8 : 0;
  // A word per compute thread that wgmma_wait_after stores to (the lagged P V's wait).
  static constexpr int kWaitAnchorBytes = kPvLag == 1 ? kNumWarps * kWarpSize * 4 : 0;
  static constexpr int kBarrierBytes = kWarpSpecialized ? (4 * kStages + 2 * kQStages) * 8 : 0;
  // Layout: Q buffer 0, the K/V region (stages, or fp8 KV's raw ring), row tables, scratch,
  // barriers, then fp8 KV's T tiles (the K/V region's stages where kConvertInPlace) or the other
  // Q buffers. A kernel that runs one work item per CTA (the one-shot grid) uses only Q buffer 0
  // and launches with kOneItemSmemBytes: the second buffer's 32 KB would come out of the L1
  // carveout (measured slower: bench/results/LOG.md).
  static constexpr int kCoreSmemBytes = kQTileBytes + kKVRegionBytes + kRowTableBytes + kQRowScratchBytes +
                                        kWaitAnchorBytes + kBarrierBytes;
  static constexpr int kDequantTileOffset = (kCoreSmemBytes + 1023) / 1024 * 1024;  // 1024-aligned (swizzle)
  static constexpr int kOneItemSmemBytes = kDequantizeKV && !kConvertInPlace
                                              ? kDequantTileOffset + kTileStages * (kKTileBytes + kVTileBytes)
                                              : kCoreSmemBytes;
  static constexpr int kExtraQOffset = (kOneItemSmemBytes + 1023) / 1024 * 1024;  // 1024-aligned (swizzle)
  static constexpr int kSmemBytes = kQStages > 1 ? kExtraQOffset + (kQStages - 1) * kQTileBytes : kOneItemSmemBytes;
  // The default variant's kernels on kConvertFragments tiles never touch the T tiles.
  static constexpr int kDefaultOneItemSmemBytes = kConvertFragments ? kCoreSmemBytes : kOneItemSmemBytes;
  static constexpr int kDefaultSmemBytes = kConvertFragments ? kCoreSmemBytes : kSmemBytes;
  // ... and their register allocation allows the CTAs per SM that this shared memory fits (1 KB
  // reserved per CTA), at most 2: the wide D128 tile then runs 2 CTAs of 8 warps (<= 128
  // registers; unbounded, ~170 and 1 CTA). The 4-warp tiles reach 3 CTAs in the one-shot kernel
  // on their own (146-151 registers at D128); bounding the persistent kernel's to 3 (168) spilled
  // with f16 queries and measured 1-5% slower (bench/results/LOG.md, session 26).
  static constexpr int kFragmentCtasBySmem = kSmemPerSmBytes / (kCoreSmemBytes + 1024);
  static constexpr int kFragmentMinCtasPerSm = kFragmentCtasBySmem < 1 ? 1 : kFragmentCtasBySmem > 2 ? 2 : kFragmentCtasBySmem;
  // Offsets of the regions (PrefillSmem), tied to the sizes above.
  static constexpr int kKOffset = kDequantizeKV && !kConvertInPlace ? kDequantTileOffset : kQTileBytes;  // the T tiles
  static constexpr int kKVRegionOffset = kQTileBytes;
  static constexpr int kRawOffset = kKVRegionOffset;  // fp8 KV: the raw ring
  static constexpr int kRowTableOffset = kKVRegionOffset + kKVRegionBytes;
  static constexpr int kBarrierOffset = kCoreSmemBytes - kBarrierBytes;
  static_assert(kRowTableOffset + kRowTableBytes + kWaitAnchorBytes + kQRowScratchBytes == kBarrierOffset,
                "regions tile [0, kCoreSmemBytes) without overlap");

  static_assert(sizeof(T) == 2 || (kFp8Operands && kWgmma && !kSplitHeadDims),
                "f16 or bf16 operands, or fp8 ones on the wgmma tile (equal head dims)");
  static_assert(kSameType<KVT_, T> || kDequantizeKV, "K/V stored as the operands' type or as fp8");
  static_assert(!kDequantizeKV || HEAD_DIM % 16 == 0, "fp8 KV: whole 16-byte chunks of a stored row");
  static_assert(!kConvertInPlace || (kKTileBytes == 2 * kRawTileBytes && kVTileBytes == 2 * kRawTileBytes &&
                                     kSmemRowChunks == 2 * kRawRowChunks && kRawRowChunks % 8 == 0 && kWgmma),
                "fp8 KV converted in place: stored rows of whole 128-byte blocks, half of a wgmma tile's row");
  static_assert(!kSplitHeadDims || (!kDequantizeKV && HEAD_DIM_VO < HEAD_DIM && HEAD_DIM_VO % 16 == 0),
                "different Q/K and V head dims: 16-bit K/V, V's columns a prefix of the loaders' (HEAD_DIM_VO < "
                "HEAD_DIM), whole k16 steps");
  static_assert(kStages >= 2 && kStages <= 4, "2 to 4 pipeline stages");
  static_assert(!kTransposedV || (kWarpSpecialized && kSameType<KVT_, T> && CTA_TILE_KV % 32 == 0 &&
                                  HEAD_DIM_VO % 32 == 0 && kTransposeRawBytes % 1024 == 0),
                "FP8 attention: the producer transposes V into k32 steps of P V (4 x 4-byte blocks)");
  static_assert(HEAD_DIM % 16 == 0, "whole k16 steps of Q K^T, pairs of n8 tiles of O, an even number of chunks");
  static_assert(kSmemRowChunks >= kRowChunks && kLoaderRowChunks >= kRowChunks && kLoaderRowChunks <= 64,
                "the stored row holds the data; the loaders' columns cover it");
  static_assert(CTA_TILE_Q % (16 * NUM_WARPS_Q) == 0, "whole m16 tiles per warp");
  static_assert(CTA_TILE_KV % (16 * NUM_WARPS_KV) == 0, "whole k16 steps per warp");
  static_assert(NUM_WARPS_Q == 1 || NUM_WARPS_KV == 1, "split either query rows or KV columns across warps");
  static_assert(kMergeBytes <= kKVRegionBytes + kRowTableBytes, "the warp merge fits in the K/V region and row tables");
  static_assert(kSmemBytes <= 227 * 1024, "fits an sm_90 SM; sm_80 configurations are checked by the host");
  static_assert(kQTileBytes % 1024 == 0 && kKTileBytes % 1024 == 0 && kVTileBytes % 1024 == 0 &&
                    kRawTileBytes % 1024 == 0,
                "tile bases 1024-byte aligned: attention_tile's ldmatrix addresses XOR the k16 step in");
  static_assert(!kConvertFragments || (kMmaD % 2 == 0 && kN8KV % 2 == 0 && kRawRowChunks % 2 == 0),
                "fp8 fragments: ldmatrix x4 loads of two k16 steps by two n8 tiles (K) or two chunks by 16 rows (V)");
  // wgmma: each warpgroup (4 warps) computes 64 query rows against the whole KV tile: Q K^T with
  // m64nKk16 (K the KV tile), P V with m64nDk16 (D the V head dim); kernels/common/wgmma.cuh has N
  // = 64, 96, 128 and 256. Head dim 256 takes 64-row KV tiles: its O is 128 accumulators per
  // thread, and a 128-row tile's S (64 more) and P would not fit beside it in the compute
  // registers. Q K^T's reduction may be any whole number of k16 steps (192: 12).
  static_assert(!kWgmma || ((HEAD_DIM_VO == 64 || HEAD_DIM_VO == 96 || HEAD_DIM_VO == 128 || HEAD_DIM_VO == 256) &&
                            (CTA_TILE_KV == 128 || (CTA_TILE_KV == 64 && HEAD_DIM_VO == 256)) && NUM_WARPS_KV == 1 &&
                            kWarpRowsQ == 16 && NUM_WARPS_Q % 4 == 0),
                "wgmma configurations: V head_dim 64, 96, 128 or 256, 128-row KV tiles (64 at 256), "
                "warpgroups of 4 warps x 16 query rows");
  static_assert(!kWarpSpecialized ||
                    (kProducerWarps == 4 && CTA_TILE_KV <= kLoaderThreads &&
                     kProducerRegs * kProducerWarps * kWarpSize + kComputeRegs * kComputeThreads <= 65536 &&
                     kComputeRegs % 8 == 0 && kProducerRegs % 8 == 0),
                "one producer warpgroup with a thread per KV row; registers within the SM's 64K");
};

template <typename Traits>
struct PrefillSmem {
  using T = typename Traits::DType;
  // Rows of kSmemRowChunks * 8 elements, HEAD_DIM of them data (V: kVSmemRowChunks * 8 and
  // HEAD_DIM_VO; see PrefillTraits).
  T* q;         // [CTA_TILE_Q][kSmemRowChunks * 8], swizzled: Q buffer 0
  T* extra_q;   // [kQStages - 1][CTA_TILE_Q][kSmemRowChunks * 8], swizzled: the other Q buffers, after the barriers
  T* k;         // [kStages][CTA_TILE_KV][kSmemRowChunks * 8], swizzled
  T* v;         // [kStages][CTA_TILE_KV][kVSmemRowChunks * 8], swizzled
                // (fp8 KV: [kTileStages][...] after the barriers; one T tile each in the sm80 mainloop)
  uint8_t* raw_k;  // fp8 KV: [kRawStages][CTA_TILE_KV][HEAD_DIM] stored K bytes (Traits::RawTile); nullptr otherwise
                   // (kConvertInPlace: the stored rows sit in the upper half of each K / V stage)
  uint8_t* raw_v;  // fp8 KV: [kRawStages][CTA_TILE_KV][HEAD_DIM] stored V bytes, right after raw_k;
                   // FP8 attention: [kTransposeStages][CTA_TILE_KV][HEAD_DIM_VO] after the V stages
  float* merge;    // the warps' merge (epilogue): the K/V region and row tables, after the last tile
  uint64_t* rows;     // [kRowTables][CTA_TILE_KV][2] ring of tables: tagged addresses of K and V rows (RowAddress)
  int32_t* row_keys;  // [kRowTables][CTA_TILE_KV] their keys (-1: missing, masked)
  uint64_t* full_k;   // [kStages] warp-specialised: the stage's K copies have landed (see StageCompletion)
  uint64_t* full_v;   // [kStages] ... its V copies
  uint64_t* empty_k;  // [kStages] warp-specialised: the compute warps are done with the stage's K
  uint64_t* empty_v;  // [kStages] ... with its V
  uint64_t* q_full;   // [kQStages] warp-specialised: the buffer's Q tile has landed
  uint64_t* q_empty;  // [kQStages] warp-specialised: the compute warps are done with the buffer's Q tile
  int64_t* q_rows;    // [CTA_TILE_Q] scratch of load_q_tile: the K/V region's start unless warp-specialised
  float* wait_anchor;  // [kNumWarps * kWarpSize] lagged P V: wgmma_wait_after's slots

  TESSERA_DEVICE explicit PrefillSmem(char* base) {
    q = reinterpret_cast<T*>(base);
    k = reinterpret_cast<T*>(base + Traits::kKOffset);
    v = reinterpret_cast<T*>(base + Traits::kKOffset + Traits::kTileStages * Traits::kKTileBytes);  // load_kv_tile's kVFromK
    raw_k = Traits::kDequantizeKV && !Traits::kConvertInPlace ? reinterpret_cast<uint8_t*>(base + Traits::kRawOffset)
                                                              : nullptr;
    raw_v = Traits::kDequantizeKV ? (Traits::kConvertInPlace ? nullptr : raw_k + Traits::kRawStages * Traits::kRawTileBytes)
            : Traits::kTransposedV
                ? reinterpret_cast<uint8_t*>(base + Traits::kKVRegionOffset +
                                             Traits::kStages * (Traits::kKTileBytes + Traits::kVTileBytes))
                : nullptr;
    merge = reinterpret_cast<float*>(base + Traits::kKVRegionOffset);
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
                 : reinterpret_cast<int64_t*>(base + Traits::kKVRegionOffset);
    wait_anchor = reinterpret_cast<float*>(base + Traits::kBarrierOffset - Traits::kQRowScratchBytes -
                                           Traits::kWaitAnchorBytes);
  }
  // The warp-specialised rings of K, V and Q buffers.
  TESSERA_DEVICE MbarrierPipeline<Traits::kStages> k_pipeline() const { return {full_k, empty_k}; }
  TESSERA_DEVICE MbarrierPipeline<Traits::kStages> v_pipeline() const { return {full_v, empty_v}; }
  TESSERA_DEVICE MbarrierPipeline<Traits::kQStages> q_pipeline() const { return {q_full, q_empty}; }
};

/// This thread's index among its tile's threads: threadIdx.x, except in the POD kernel's decode
/// CTAs, which run copies of a small tile side by side (copy i on threads i * kThreads ..
/// (i + 1) * kThreads - 1, kernels/attention/pod.cuh). Warp-specialised tiles take whole CTAs.
template <typename Traits>
TESSERA_DEVICE int tile_thread() {
  return Traits::kWarpSpecialized ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x % Traits::kThreads);
}

/// Where this thread sits in the tile's MMA fragments: warp (warp_q, warp_kv) of the
/// NUM_WARPS_Q x NUM_WARPS_KV layout, and lane (g, t) of the m16n8 fragment layout (rows g and
/// g + 8, columns 2t and 2t + 1 of each 16 x 8 block).
template <typename Traits>
struct FragmentCoords {
  int lane, warp, warp_q, warp_kv, g, t;
  int warp_col0;  // first KV column of the warp's share of a KV tile

  TESSERA_DEVICE FragmentCoords() {
    lane = tile_thread<Traits>() % kWarpSize;
    warp = tile_thread<Traits>() / kWarpSize;
    warp_q = warp / Traits::NUM_WARPS_KV;
    warp_kv = warp % Traits::NUM_WARPS_KV;
    g = lane / 4;
    t = lane % 4;
    warp_col0 = warp_kv * Traits::kWarpColsKV;
  }
  /// Packed row of this thread's m16 tile mq, half h (rows g and g+8), in a tile at packed_begin.
  TESSERA_DEVICE int packed_row(int packed_begin, int mq, int h) const {
    return packed_begin + warp_q * Traits::kWarpRowsQ + mq * 16 + g + 8 * h;
  }
};

/// Named barriers of the warp-specialised configurations (0 is __syncthreads's): the compute
/// warps', the loaders', and from kFirstTurnBarrier one per compute warpgroup for their MMA turns
/// (Sm90Mainloop).
constexpr uint32_t kComputeBarrier = 1;
constexpr uint32_t kLoaderBarrier = 2;
constexpr uint32_t kFirstTurnBarrier = 3;
constexpr uint32_t kFirstEpilogueBarrier = 6;  // one per compute warpgroup (at most 3): its O staged

/// This thread's index among the threads that load tiles (the producer warpgroup when
/// warp-specialised, else the whole CTA).
template <typename Traits>
TESSERA_DEVICE int loader_thread() {
  return Traits::kWarpSpecialized ? static_cast<int>(threadIdx.x) - Traits::kComputeThreads : tile_thread<Traits>();
}

/// Synchronises the threads of a tile that is not warp-specialised: its kThreads at barrier
/// threadIdx.x / kThreads, i.e. the whole CTA at barrier 0, except in the POD kernel's decode
/// CTAs, where copy i of the tile syncs its own threads at barrier i (the CTA's other threads run
/// other copies or have exited).
template <typename Traits>
TESSERA_DEVICE void tile_sync() {
  static_assert(!Traits::kWarpSpecialized, "warp-specialised tiles synchronise roles at named barriers");
  named_barrier_sync(threadIdx.x / Traits::kThreads, Traits::kThreads);
}

/// Synchronises the threads of one role: warp-specialised, the role's warps at its named barrier;
/// otherwise every warp has every role, so the whole tile.
template <typename Traits, uint32_t kBarrier, int kRoleThreads>
TESSERA_DEVICE void role_sync() {
  if constexpr (Traits::kWarpSpecialized) {
    named_barrier_sync(kBarrier, kRoleThreads);
  } else {
    tile_sync<Traits>();
  }
}
/// Synchronises the threads that load tiles.
template <typename Traits>
TESSERA_DEVICE void loader_sync() {
  role_sync<Traits, kLoaderBarrier, Traits::kLoaderThreads>();
}
/// Synchronises the threads that compute (their shared-memory transforms of Q, K, V).
template <typename Traits>
TESSERA_DEVICE void compute_sync() {
  role_sync<Traits, kComputeBarrier, Traits::kComputeThreads>();
}

/// Warp-specialised: how the producer completes a K/V stage's `full` barrier (and Q's `q_full`).
/// kAfterWait: each producer thread waits for its copies (cp.async.wait_group), fences the proxy
/// (wgmma reads shared memory through the async proxy) and arrives, so the producer has one
/// step's copies in flight at a time. kByCopies: each thread arrives itself, which releases the
/// row table it wrote, and through cp.async.mbarrier.arrive.noinc, which arrives when its copies
/// land, so the producer never waits for its copies and keeps every free stage in flight; the
/// compute warps then fence the proxy after each wait. Paged KV takes kByCopies: its producer
/// resolves a page per 16 rows, a long chain per tile that the copies in flight hide. Ragged KV
/// keeps kAfterWait: its producer is quick, and the fences in the compute warps' chain cost more
/// than the overlap gains (both measured: bench/results/LOG.md). Block-sparse KV is not measured
/// either way and keeps kAfterWait.
enum class StageCompletion { kAfterWait, kByCopies };
/// fp8 KV takes kAfterWait: its producer converts what its copies brought before it arrives (FP8
/// attention: transposes V).
template <typename Traits, KVFormatKind kFormat>
constexpr StageCompletion stage_completion() {
  return kFormat == KVFormatKind::kPaged && !Traits::kDequantizeKV && !Traits::kTransposedV
             ? StageCompletion::kByCopies
             : StageCompletion::kAfterWait;
}

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
  // Traits::kDeferQRelease: the Q buffer whose staged output this thread's bulk stores may still
  // be reading (the previous work item's), released by Sm90Mainloop::release_stored_q.
  PipelineState<Traits::kQStages> stored_q;
  bool store_reading = false;
};

/// Runs f(RoleTag<role>{}) for this warp's role: kAll, or, warp-specialised, after the mbarriers
/// are initialised, kProducer (the last warpgroup, its register limit lowered) or kCompute (the
/// limit raised). The roles' code paths are disjoint from here on: ptxas keeps the setmaxnreg
/// only then (it ignored them, C7507, when both roles went on through shared code).
template <typename Traits, KVFormatKind kFormat, typename F>
TESSERA_DEVICE void with_warp_role(char* smem_raw, F&& f) {
  if constexpr (Traits::kWarpSpecialized) {
    constexpr bool kByCopies = stage_completion<Traits, kFormat>() == StageCompletion::kByCopies;
    PrefillSmem<Traits> smem(smem_raw);
    if (threadIdx.x == 0) {
      // kByCopies: two arrivals per producer thread on a K/V stage (its own and its copies'), one
      // on q_full (its copies'); kAfterWait: one each.
      constexpr int kFullArrivals = (kByCopies ? 2 : 1) * Traits::kLoaderThreads;
      smem.k_pipeline().init(kFullArrivals, Traits::kComputeThreads);
      smem.v_pipeline().init(kFullArrivals, Traits::kComputeThreads);
      smem.q_pipeline().init(Traits::kLoaderThreads, Traits::kComputeThreads);
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

}  // namespace kernels
}  // namespace tessera
