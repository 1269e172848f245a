// The MLA tile's configuration (sm_90a, wgmma): tile sizes, warp roles, stages and the
// shared-memory layout, tied together by static_asserts.
//
// Work split. A CTA holds CTA_TILE_Q query rows (head x token pairs of one request) and walks the
// request's latent KV in tiles of CTA_TILE_KV tokens. Each KV token's 576-wide row serves as the
// key (ckv and kpe) and its first 512 columns as the value, so one shared-memory tile feeds both
// GEMMs. The output, 64 rows x 512 fp32, is too wide for one warpgroup's registers (256 a
// thread), so two warpgroups each own half of its columns:
// - the score warpgroup computes S = Q K^T (the whole 576-wide reduction), runs the online
//   softmax, publishes P and the rows' rescale factors in shared memory, and multiplies P by the
//   left half of V from registers;
// - the value warpgroup copies Q and the KV tiles (cp.async, any page size; an fp8 cache through
//   its registers, converted to the 16-bit type on the way) and multiplies the published P by the
//   right half of V.
// Q K^T is about half of the FLOPs, so the score warpgroup is the longer path; the value
// warpgroup's P V runs under its next Q K^T on the shared tensor cores.
#pragma once

#include "kernels/common/fp8.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/smem_layout.cuh"

namespace tessera {
namespace kernels {

/// The latent row both MLA tiles read, and what follows from it: the key is the 512-wide latent
/// followed by the 64-wide rotary part, the value is the latent; the operand tiles hold 16-bit
/// elements (an fp8 cache is converted on the way in).
struct MlaLatentRow {
  static constexpr int kLatentDim = 512;  // d_c: the value width and the first part of the key
  static constexpr int kRopeDim = 64;     // d_r: the rotary part of the key
  static constexpr int kQkDim = kLatentDim + kRopeDim;
  static constexpr int kOperandBytes = 2;
  static constexpr int kRowChunks = kQkDim * kOperandBytes / 16;  // 72 16-byte chunks
  static constexpr int kLatentChunks = kLatentDim * kOperandBytes / 16;
  static constexpr int kRopeChunks = kRopeDim * kOperandBytes / 16;
  static constexpr int kQkSteps = kQkDim / 16;  // k16 steps of the key product
  static constexpr int kWarpgroupThreads = 128;
};

/// What a warpgroup of the MLA kernel does (see the file comment).
enum class MlaRole : int { kScore = 0, kLoadAndValue = 1 };

/// T: the queries', the shared-memory operand tiles' and the output's type; KVT: the latent
/// cache's element type (T, or fp8 converted to T as the tiles are filled: every e4m3 and e5m2
/// value is exact in f16 and bf16, so the tiles hold the stored values and the scales apply to
/// the fp32 logits and output).
template <typename T, typename KVT = T>
struct MlaTraits : MlaLatentRow {
  using DType = T;
  using KVType = KVT;
  static constexpr bool kFp8Cache = IsFp8<KVT>::value;
  static_assert(kFp8Cache || kSameType<KVT, T>, "a latent cache of q's type or fp8");
  static_assert(sizeof(T) == kOperandBytes, "16-bit Q and operand tiles");
  // 64 query rows: one wgmma M. 64 KV tokens a stage: two stages of 576-wide rows and Q fill the
  // shared memory (below); S is then one m64n64 tile per k16 step.
  static constexpr int CTA_TILE_Q = 64;
  static constexpr int CTA_TILE_KV = 64;
  static constexpr int kStages = 2;
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = kWarpgroups * kWarpgroupThreads;
  static constexpr int kValueCols = kLatentDim / kWarpgroups;  // O columns per warpgroup
  static_assert(kValueCols == 256, "each warpgroup's P V is one m64n256 wgmma per k16 step");

  using QTile = WgmmaTile<CTA_TILE_Q, kRowChunks>;    // [CTA_TILE_Q, kQkDim]
  using KVTile = WgmmaTile<CTA_TILE_KV, kRowChunks>;  // [CTA_TILE_KV, kQkDim]
  using PTile = WgmmaTile<CTA_TILE_Q, CTA_TILE_KV * static_cast<int>(sizeof(T)) / 16>;  // [CTA_TILE_Q, CTA_TILE_KV]
  static_assert(QTile::kAtomChunks == 8 && PTile::kAtomChunks == 8, "128-byte swizzle: 64-column blocks");
  static constexpr int kPvSteps = CTA_TILE_KV / 16;  // k16 steps of P V
  static constexpr int kValueBlocks = kValueCols / 64;  // column blocks of one warpgroup's V half

  // Loaders: 8 consecutive threads copy one 128-byte column block of a row, so a warp's copy
  // instruction reads four rows' 128 contiguous bytes each. The loading warpgroup's 16 groups of 8
  // take rows g, g + 16, ... .
  static constexpr int kLoaderGroups = kWarpgroupThreads / 8;
  static constexpr int kRowsPerLoader = CTA_TILE_KV / kLoaderGroups;
  static_assert(CTA_TILE_Q == CTA_TILE_KV, "Q and KV tiles share the loader's row split");
  static_assert(kRowChunks % 8 == 0 && kLatentChunks % 8 == 0 && kRopeChunks == 8,
                "rows of whole 128-byte blocks; the rotary part is the last block");

  // Shared memory: Q, the KV stages, P, the rows' rescale factors and final 1 / l, the hand-offs'
  // mbarriers.
  static constexpr int kQBytes = CTA_TILE_Q * kRowChunks * 16;
  static constexpr int kKVStageBytes = CTA_TILE_KV * kRowChunks * 16;
  static constexpr int kPBytes = CTA_TILE_Q * CTA_TILE_KV * static_cast<int>(sizeof(T));
  static constexpr int kQOffset = 0;
  static constexpr int kKVOffset = kQOffset + kQBytes;
  static constexpr int kPOffset = kKVOffset + kStages * kKVStageBytes;
  // The rows' rescale factors of tile t go to buffer t % 2, so that a write never meets the read
  // of the tile before it whatever the hand-offs' timing.
  static constexpr int kRowScaleOffset = kPOffset + kPBytes;                     // f32 [2][CTA_TILE_Q]
  static constexpr int kRowInvSumOffset = kRowScaleOffset + 2 * CTA_TILE_Q * 4;  // f32 [CTA_TILE_Q]
  static constexpr int kBarrierOffset = kRowInvSumOffset + CTA_TILE_Q * 4;  // the mbarriers of MlaHandoffs
  static constexpr int kBarriers = 2 * kStages + 4;
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8;
  static_assert(kKVOffset % 1024 == 0 && kKVStageBytes % 1024 == 0 && kPOffset % 1024 == 0,
                "the 128-byte swizzle repeats every 1024 bytes: operand tiles start on its period");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM: sm_90's 227 KB of opt-in shared memory");
};

/// What a warpgroup of the narrow MLA kernel does (narrow.cuh).
enum class MlaNarrowRole : int { kMath = 0, kLoad = 1 };

/// The MLA tile for requests of few (token, head) rows (decode with up to 16 heads a GPU): the
/// rows become the N of the MMAs instead of their M, so no MMA multiplies empty rows. S^T = K Q^T
/// (M = 64 keys, N = 16 rows, 36 k16 steps) and O^T += V^T P^T (M = 512 latent columns in 8 tiles,
/// N = 16 rows, K = 64 keys); O^T is 64 accumulators a thread, so one math warpgroup holds it,
/// and a load warpgroup copies Q and the KV tiles. With a quarter of the 64-row tile's MMA work a
/// KV tile, the tile is bound by the copies it keeps in flight:
/// - a 16-bit cache: two operand stages (cp.async, as MlaTraits), one tile in flight while the
///   other is multiplied;
/// - an fp8 cache: the same two operand stages, which the load warpgroup fills by converting the
///   stored bytes of a tile, and two buffers of stored bytes taking turns (one raw stage by
///   cp.async, the load warpgroup's registers), so two tiles are in flight while a third is
///   converted beside the math warpgroup's products (narrow.cuh's MlaNarrowKvCopy).
template <typename T, typename KVT = T>
struct MlaNarrowTraits : MlaLatentRow {
  using DType = T;
  using KVType = KVT;
  static constexpr bool kFp8Cache = IsFp8<KVT>::value;
  static_assert(sizeof(T) == kOperandBytes && (kFp8Cache || kSameType<KVT, T>), "16-bit Q; a cache of q's type or fp8");
  static constexpr int CTA_TILE_Q = 16;   // packed rows: the MMAs' N
  static constexpr int CTA_TILE_KV = 64;  // keys a stage: S^T's M
  static constexpr int kStages = 2;                     // operand stages ([CTA_TILE_KV, kQkDim] of T)
  static constexpr int kRawStages = kFp8Cache ? 1 : 0;  // raw stages ([CTA_TILE_KV, kQkDim] of KVT)
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = kWarpgroups * kWarpgroupThreads;
  static constexpr int kWarps = kWarpgroupThreads / kWarpSize;  // of the math warpgroup
  static constexpr int kLatentTiles = kLatentDim / 64;          // m64 tiles of O^T
  static constexpr int kPvSteps = CTA_TILE_KV / 16;

  using QTile = WgmmaTile<CTA_TILE_Q, kRowChunks>;    // [CTA_TILE_Q, kQkDim]: B of S^T, K-major
  using KVTile = WgmmaTile<CTA_TILE_KV, kRowChunks>;  // [CTA_TILE_KV, kQkDim]: A of S^T (K-major), of O^T (MN-major)
  using PTile = WgmmaTile<CTA_TILE_Q, CTA_TILE_KV * static_cast<int>(sizeof(T)) / 16>;  // [CTA_TILE_Q, CTA_TILE_KV]: B of O^T
  static_assert(KVTile::kAtomChunks == 8 && QTile::kAtomChunks == 8 && PTile::kAtomChunks == 8,
                "128-byte swizzle: 64-column blocks, one m64 tile of O^T per block");
  // The load warpgroup: 8 threads copy one 128-byte block of a row (as MlaTraits); an fp8 tile is
  // copied and converted in 16-byte pieces, 4 threads a row (MlaKvCopy<Traits, true>).
  static constexpr int kLoaderGroups = kWarpgroupThreads / 8;
  static constexpr int kRowsPerLoader = CTA_TILE_KV / kLoaderGroups;
  static_assert(CTA_TILE_Q == kLoaderGroups, "one Q row per loader group");
  static constexpr int kRawRowBytes = kQkDim * static_cast<int>(sizeof(KVT));

  // Shared memory: the operand stages, an fp8 cache's raw stage, two Q buffers, P^T, the warps' partial row
  // maxima / sums, the mbarriers. Work tile i's Q goes to buffer i % 2: the load warpgroup copies
  // the next work tile's Q while the math warpgroup still multiplies this one's (the runtime's
  // columns of several work tiles).
  static constexpr int kQBuffers = 2;
  static constexpr int kQBytes = CTA_TILE_Q * kRowChunks * 16;
  static constexpr int kKVStageBytes = CTA_TILE_KV * kRowChunks * 16;
  static constexpr int kRawStageBytes = CTA_TILE_KV * kRawRowBytes;
  static constexpr int kPBytes = CTA_TILE_Q * CTA_TILE_KV * static_cast<int>(sizeof(T));
  static constexpr int kKVOffset = 0;
  static constexpr int kRawOffset = kKVOffset + kStages * kKVStageBytes;
  static constexpr int kQOffset = kRawOffset + kRawStages * kRawStageBytes;  // [kQBuffers][CTA_TILE_Q, kQkDim]
  static constexpr int kPOffset = kQOffset + kQBuffers * kQBytes;
  // Two buffers of the warps' partials, by exchange parity (narrow.cuh): a warp writes the next
  // exchange's while another may still read this one's.
  static constexpr int kPartialOffset = kPOffset + kPBytes;  // f32 [2][kWarps, CTA_TILE_Q]
  static constexpr int kBarrierOffset = kPartialOffset + 2 * kWarps * CTA_TILE_Q * 4;
  static constexpr int kBarriers = 2 * kStages + kQBuffers;
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8;
  static_assert(kQOffset % 1024 == 0 && kQBytes % 1024 == 0 && kPOffset % 1024 == 0 && kKVStageBytes % 1024 == 0,
                "operand tiles start on the swizzle's 1024-byte period");
  static_assert(kSmemBytes <= 227 * 1024, "sm_90's 227 KB of opt-in shared memory");
};

}  // namespace kernels
}  // namespace tessera
