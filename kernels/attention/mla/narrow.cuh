// The MLA tile for few (token, head) rows per request (MlaNarrowTraits, traits.cuh): decode with
// up to 16 heads a GPU, where MlaTraits' 64-row tile would multiply 48 empty rows per KV tile. The
// rows are the MMAs' N: S^T = K Q^T and O^T += V^T P^T, so the MMA work per KV tile is a quarter
// of the wide tile's and the tile is bound by its copies. Composition, in the order a tile meets
// it: MlaWorkTile with MlaSplitGridSchedule or MlaPlannedSchedule and MlaPipelineState
// (decode.cuh), MlaNarrowLoadWarpgroup (Q and the KV stages by cp.async; MlaNarrowKvCopy),
// MlaNarrowScores (S^T), MlaNarrowSoftmax (per-row max across the math warpgroup's warps, P^T into
// shared memory), MlaNarrowValues (O^T), MlaNarrowEpilogue.
#pragma once

#include "kernels/attention/mla/decode.cuh"
#include "kernels/attention/mla/traits.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/fp8.cuh"
#include "kernels/common/math.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/wgmma.cuh"

namespace tessera {
namespace kernels {

/// A thread of the math warpgroup in the m64n16 accumulators of S^T and of each O^T tile:
/// accumulator 4n + j holds M row 16 warp + g + 8 (j / 2) and N column (a query row)
/// 8n + 2t + j % 2, g = lane / 4, t = lane % 4 (wgmma.cuh). The thread's four query rows, indexed
/// q = 2n + j % 2, are 2t, 2t + 1, 8 + 2t, 9 + 2t.
struct MlaNarrowCoords {
  int warp, g, t;
  static TESSERA_DEVICE MlaNarrowCoords of_thread(int thread) {
    const int lane = thread % kWarpSize;
    return {thread / kWarpSize, lane / 4, lane % 4};
  }
  TESSERA_DEVICE int row(int q) const { return 8 * (q / 2) + 2 * t + q % 2; }
  /// The M index (key, or latent column) of accumulator acc (0-7).
  TESSERA_DEVICE int m_row(int acc) const { return 16 * warp + g + 8 * ((acc % 4) / 2); }
  static TESSERA_DEVICE int q_of(int acc) { return 2 * (acc / 4) + acc % 2; }
};

/// The hand-offs (mbarriers at kBarrierOffset): a stage's copies (and a work tile's Q, with its
/// first tile) landed, load -> math; the math warpgroup is done with a stage, math -> load; the
/// math warpgroup's last S^T of work tile i has read Q buffer i % 2, math -> load. KV tile g
/// (counted CTA-wide) uses stage g % kStages, phase g / kStages; Q is counted in work tiles with
/// KV (MlaPipelineState::items_with_kv: a work tile without KV has no Q copy and no release), and
/// Q i's release is phase i / 2 of buffer i % 2's barrier. The load warpgroup waits for every
/// phase of each barrier in order, and the math warpgroup arrives only after waiting for the copies
/// that follow the load warpgroup's previous wait, so it is never two phases ahead: a parity always
/// names the phase meant.
template <typename Traits>
struct MlaNarrowHandoffs {
  uint64_t* kv_full;     // [kStages]
  uint64_t* stage_free;  // [kStages]
  uint64_t* q_free;      // [kQBuffers]
  static TESSERA_DEVICE MlaNarrowHandoffs at(unsigned char* smem) {
    uint64_t* b = reinterpret_cast<uint64_t*>(smem + Traits::kBarrierOffset);
    return {b, b + Traits::kStages, b + 2 * Traits::kStages};
  }
  TESSERA_DEVICE void init() const {
    for (int st = 0; st < Traits::kStages; ++st) {
      mbarrier_init(kv_full + st, Traits::kWarpgroupThreads);
      mbarrier_init(stage_free + st, Traits::kWarpgroupThreads);
    }
    for (int b = 0; b < Traits::kQBuffers; ++b) mbarrier_init(q_free + b, Traits::kWarpgroupThreads);
  }
  static TESSERA_DEVICE uint32_t parity(int g) { return static_cast<uint32_t>(g / Traits::kStages) & 1u; }
  TESSERA_DEVICE void kv_copied(int g) const { cp_async_mbarrier_arrive(kv_full + g % Traits::kStages); }
  /// This thread's stores of tile g (made and fenced before) are done.
  TESSERA_DEVICE void kv_stored(int g) const { mbarrier_arrive(kv_full + g % Traits::kStages); }
  TESSERA_DEVICE void wait_kv(int g) const { mbarrier_wait(kv_full + g % Traits::kStages, parity(g)); }
  TESSERA_DEVICE void release_stage(int g) const { mbarrier_arrive(stage_free + g % Traits::kStages); }
  TESSERA_DEVICE void wait_stage_free(int g) const { mbarrier_wait(stage_free + g % Traits::kStages, parity(g)); }
  TESSERA_DEVICE void release_q(int item) const { mbarrier_arrive(q_free + item % Traits::kQBuffers); }
  TESSERA_DEVICE void wait_q_free(int item) const {
    mbarrier_wait(q_free + item % Traits::kQBuffers, static_cast<uint32_t>(item / Traits::kQBuffers) & 1u);
  }
};

/// The shared-memory regions of a CTA (traits.cuh's layout).
template <typename Traits>
struct MlaNarrowCta {
  MlaNarrowHandoffs<Traits> handoffs;
  unsigned char* smem;
  TESSERA_DEVICE unsigned char* stage(int g) const {  // [CTA_TILE_KV, kQkDim]
    return smem + Traits::kKVOffset + (g % Traits::kStages) * Traits::kKVStageBytes;
  }
  /// Q `item` (counted as MlaPipelineState::items_with_kv): [CTA_TILE_Q, kQkDim].
  TESSERA_DEVICE unsigned char* q_tile(int item) const {
    return smem + Traits::kQOffset + (item % Traits::kQBuffers) * Traits::kQBytes;
  }
  /// An fp8 cache's raw stage (its work tiles' even KV tiles): [CTA_TILE_KV, kRawRowBytes].
  TESSERA_DEVICE unsigned char* raw() const { return smem + Traits::kRawOffset; }
  TESSERA_DEVICE uint32_t p_tile() const { return smem_addr(smem + Traits::kPOffset); }  // [CTA_TILE_Q, CTA_TILE_KV]
  /// The warps' partial row values of exchange `exchange` (buffer exchange % 2): f32 [kWarps][CTA_TILE_Q].
  TESSERA_DEVICE float* partials(int exchange) const {
    return reinterpret_cast<float*>(smem + Traits::kPartialOffset) + (exchange & 1) * Traits::kWarps * Traits::CTA_TILE_Q;
  }
};

/// The math warpgroup's own barrier (named barrier 1: the load warpgroup never joins it).
TESSERA_DEVICE void mla_narrow_math_sync() { named_barrier_sync(1, 128); }

/// How the load warpgroup fills the operand stages. A 16-bit cache: cp.async straight into the
/// stage of tile t once the math warpgroup has released the stage's previous tile (two stages).
template <typename Traits, bool kFp8 = Traits::kFp8Cache>
struct MlaNarrowKvCopy {
  MlaTileLoader<Traits> loader;
  TESSERA_DEVICE void start(const MlaParamsOf<Traits>&, const MlaWorkTile<Traits>&, const MlaNarrowCta<Traits>&) const {}
  TESSERA_DEVICE void fill(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, const MlaNarrowCta<Traits>& cta,
                           int t, int g) const {
    if (g >= Traits::kStages) cta.handoffs.wait_stage_free(g - Traits::kStages);
    loader.load_kv(p, w, w.first_kv_tile + t, cta.stage(g));
    cta.handoffs.kv_copied(g);  // as this thread's copies land (tile 0's with Q's)
  }
};

/// An fp8 cache: two buffers of stored bytes take turns, so two tiles' loads are in flight while
/// the load warpgroup converts a third into one of the two operand stages (beside the math
/// warpgroup's products on the other): a work tile's even tiles go by cp.async into the raw stage
/// (tile 0's commit group also carries Q), its odd tiles by loads into this thread's registers
/// (MlaKvCopy<Traits, true>, the 64-row tile's register path). Each buffer is refilled with tile
/// t + 2 right after tile t's conversion. A thread converts exactly the 16-byte pieces it copied
/// or loaded (rows tid / 4 + 32 i, pieces tid % 4 + 4 k: MlaKvCopy's), so neither the waits nor
/// the reuse of a buffer involve another thread.
template <typename Traits>
struct MlaNarrowKvCopy<Traits, true> {
  using Registers = MlaKvCopy<Traits, true>;
  using KVT = typename Traits::KVType;
  Registers regs;  // odd tiles

  /// Even tile t's stored bytes into the raw stage, one commit group ([CTA_TILE_KV, kRawRowBytes]).
  TESSERA_DEVICE void copy_raw(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w,
                               const MlaNarrowCta<Traits>& cta, int t) const {
    unsigned char* dst = cta.raw();
#pragma unroll
    for (int i = 0; i < Registers::kRows; ++i) {
      const int row = regs.row(i);
      const int key = (w.first_kv_tile + t) * Traits::CTA_TILE_KV + row;
      const bool valid = key < w.kv_len;  // zeros past the end: no stale NaN meets a zero P
      const int page_in_request = valid ? p.page_div.div(key) : 0;
      const int slot = valid ? p.page_div.mod(key, page_in_request) : 0;
      const int64_t page = valid ? p.kv_indices[w.page_begin + page_in_request] : 0;
      const KVT* latent = p.ckv + page * p.ckv_stride_page + slot * p.ckv_stride_slot;
      const KVT* rope = p.kpe + page * p.kpe_stride_page + slot * p.kpe_stride_slot;
#pragma unroll
      for (int k = 0; k < Registers::kPieces; ++k) {
        const int piece = regs.piece(k);
        const KVT* src = piece < Registers::kLatentPieces ? latent + piece * 16
                                                          : rope + (piece - Registers::kLatentPieces) * 16;
        cp_async_16_zfill(dst + row * Traits::kRawRowBytes + piece * 16, src, valid);
      }
    }
    cp_async_commit();
  }

  /// Q (the caller's copies, issued before) travels in tile 0's group.
  TESSERA_DEVICE void start(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w,
                            const MlaNarrowCta<Traits>& cta) {
    copy_raw(p, w, cta, 0);
    if (w.num_kv_tiles > 1) regs.fetch(p, w, w.first_kv_tile + 1);
  }

  TESSERA_DEVICE void fill(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, const MlaNarrowCta<Traits>& cta,
                           int t, int g) {
    if (g >= Traits::kStages) cta.handoffs.wait_stage_free(g - Traits::kStages);
    unsigned char* stage = cta.stage(g);
    const bool refill = t + 2 < w.num_kv_tiles;
    if (t % 2 == 0) {
      cp_async_wait<0>();  // tile t's group, the only one in flight (odd tiles use no cp.async)
      const unsigned char* src = cta.raw();
#pragma unroll
      for (int i = 0; i < Registers::kRows; ++i) {
#pragma unroll
        for (int k = 0; k < Registers::kPieces; ++k) {
          const int row = regs.row(i), piece = regs.piece(k);
          Registers::store_piece(stage, row, piece,
                                 *reinterpret_cast<const uint4*>(src + row * Traits::kRawRowBytes + piece * 16));
        }
      }
      fence_proxy_async_shared();  // the stores, before wgmma's async-proxy reads
      cta.handoffs.kv_stored(g);
      if (refill) copy_raw(p, w, cta, t + 2);  // into the raw stage just read (this thread's pieces)
    } else {
      regs.store(stage);
      fence_proxy_async_shared();
      cta.handoffs.kv_stored(g);  // a plain arrive: no cp.async of this thread is this tile's
      if (refill) regs.fetch(p, w, w.first_kv_tile + t + 2);
    }
  }
};

/// The load warpgroup: Q (16 rows, one per group of 8 threads), then the KV tiles into the
/// operand stages (MlaNarrowKvCopy).
template <typename Traits>
struct MlaNarrowLoadWarpgroup {
  using T = typename Traits::DType;
  const MlaNarrowCta<Traits>& cta;
  MlaTileLoader<Traits> loader;

  TESSERA_DEVICE void load_q(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, unsigned char* q_tile) const {
    const int r = loader.tid / 8, lane8 = loader.tid % 8;
    const int row = w.row0 + r;
    const bool valid = row < w.rows;
    const int64_t token = w.qo_start + (valid ? row / p.num_heads : 0);
    const int head = valid ? row % p.num_heads : 0;
    const T* latent = p.q_nope + token * p.q_nope_stride_token + head * p.q_nope_stride_head;
    const T* rope = p.q_pe + token * p.q_pe_stride_token + head * p.q_pe_stride_head;
#pragma unroll
    for (int block = 0; block < Traits::kRowChunks / 8; ++block) {
      const int chunk = block * 8 + lane8;
      const T* src = block < Traits::kLatentChunks / 8 ? latent + chunk * 8 : rope + lane8 * 8;
      cp_async_16_zfill(q_tile + Traits::QTile::chunk_offset(r, chunk) * 16, src, valid);
    }
  }

  TESSERA_DEVICE void run(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, const MlaPipelineState& state) const {
    if (w.num_kv_tiles == 0) return;
    const int item = state.items_with_kv;
    if (item >= Traits::kQBuffers) cta.handoffs.wait_q_free(item - Traits::kQBuffers);
    MlaNarrowKvCopy<Traits> copy{loader};
    load_q(p, w, cta.q_tile(item));  // lands with tile 0
    copy.start(p, w, cta);
    for (int t = 0; t < w.num_kv_tiles; ++t) copy.fill(p, w, cta, t, state.tiles_done + t);
  }
};

/// S^T = K Q^T of one stage (m64n16: the stage's keys as M, the tile's rows as N).
template <typename Traits>
struct MlaNarrowScores {
  static TESSERA_DEVICE void issue(float (&s)[8], uint32_t stage, uint32_t q_tile) {
    mla_issue_key_product<typename Traits::DType, Traits::CTA_TILE_Q, typename Traits::KVTile, typename Traits::QTile>(
        s, stage, q_tile);
  }
};

/// The online softmax of the tile's 16 query rows, columns of S^T: each row's 64 keys lie across
/// the warpgroup's four warps, so the row maxima meet in shared memory (one math-warpgroup barrier
/// a tile). Sums stay thread-partial (scaled by the same factors) until the end.
template <typename Traits>
struct MlaNarrowSoftmax {
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};  // running max of the thread's rows (base 2)
  float l[4] = {0.f, 0.f, 0.f, 0.f};                          // thread-partial sums

  /// Masks, takes the rows' maxima (exchange `exchange`), turns s into P and returns each row's
  /// rescale factor.
  TESSERA_DEVICE void step(float (&s)[8], const MlaNarrowCta<Traits>& cta, const MlaNarrowCoords& c, int key0,
                           const int (&limit)[4], float scale_log2, int exchange, float (&alpha)[4]) {
#pragma unroll
    for (int acc = 0; acc < 8; ++acc) {
      if (key0 + c.m_row(acc) >= limit[MlaNarrowCoords::q_of(acc)]) s[acc] = -INFINITY;
    }
    float tile_max[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int n = q / 2, j = q % 2;
      float x = fmaxf(s[4 * n + j], s[4 * n + 2 + j]);
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
      tile_max[q] = x;
    }
    float* part = cta.partials(exchange);
    if (c.g == 0) {
#pragma unroll
      for (int q = 0; q < 4; ++q) part[c.warp * Traits::CTA_TILE_Q + c.row(q)] = tile_max[q];
    }
    mla_narrow_math_sync();
    float m_use[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float x = part[c.row(q)];
#pragma unroll
      for (int w = 1; w < Traits::kWarps; ++w) x = fmaxf(x, part[w * Traits::CTA_TILE_Q + c.row(q)]);
      const float m_new = fmaxf(m[q], x * scale_log2);
      // A row that has seen no key yet keeps -inf; 0 stands in for it (no (-inf) - (-inf)).
      m_use[q] = m_new == -INFINITY ? 0.f : m_new;
      alpha[q] = m_new == m[q] ? 1.f : fast_exp2(m[q] - m_use[q]);
      m[q] = m_new;
      l[q] *= alpha[q];
    }
#pragma unroll
    for (int acc = 0; acc < 8; ++acc) {
      const int q = MlaNarrowCoords::q_of(acc);
      s[acc] = fast_exp2(fmaf(s[acc], scale_log2, -m_use[q]));
      l[q] += s[acc];
    }
  }

  /// The rows' full sums: across the 8 lanes of a column and the four warps (exchange `exchange`).
  TESSERA_DEVICE void reduce_sums(const MlaNarrowCta<Traits>& cta, const MlaNarrowCoords& c, int exchange) {
    float* part = cta.partials(exchange);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float x = l[q];
      x += __shfl_xor_sync(0xffffffffu, x, 4);
      x += __shfl_xor_sync(0xffffffffu, x, 8);
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      if (c.g == 0) part[c.warp * Traits::CTA_TILE_Q + c.row(q)] = x;
    }
    mla_narrow_math_sync();
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float x = 0.f;
#pragma unroll
      for (int w = 0; w < Traits::kWarps; ++w) x += part[w * Traits::CTA_TILE_Q + c.row(q)];
      l[q] = x;
    }
  }
};

/// O^T += V^T P^T: P^T published in shared memory as B ([CTA_TILE_Q, CTA_TILE_KV], keys
/// contiguous), V^T the stage's first 512 columns as an MN-major A, one m64n16 tile per 64 latent
/// columns.
template <typename Traits>
struct MlaNarrowValues {
  using T = typename Traits::DType;
  /// Stores P (the thread's 8 values) into the P tile; the caller fences and syncs.
  static TESSERA_DEVICE void publish_p(const float (&s)[8], uint32_t p_tile, const MlaNarrowCoords& c) {
#pragma unroll
    for (int acc = 0; acc < 8; ++acc) {
      const int key = c.m_row(acc), row = c.row(MlaNarrowCoords::q_of(acc));
      const uint32_t addr = p_tile + Traits::PTile::chunk_offset(row, key / 8) * 16 + (key % 8) * 2;
      const T v = from_float<T>(s[acc]);
      asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(*reinterpret_cast<const uint16_t*>(&v)) : "memory");
    }
  }
  static TESSERA_DEVICE void rescale(float (&o)[Traits::kLatentTiles][8], const float (&alpha)[4]) {
    if (__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f && alpha[2] == 1.f && alpha[3] == 1.f)) return;
#pragma unroll
    for (int mt = 0; mt < Traits::kLatentTiles; ++mt) {
#pragma unroll
      for (int acc = 0; acc < 8; ++acc) o[mt][acc] *= alpha[MlaNarrowCoords::q_of(acc)];
    }
  }
  /// One commit group; the caller waits.
  static TESSERA_DEVICE void issue(float (&o)[Traits::kLatentTiles][8], uint32_t stage, uint32_t p_tile) {
    using KVTile = typename Traits::KVTile;
    const uint64_t v0 = wgmma_mn_major_desc<KVTile>(stage, 0);  // k16 step kk of tile mt: + mt block + kk 2 atoms
    const uint64_t p0 = wgmma_k_major_desc<typename Traits::PTile>(p_tile, 0, 0);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Traits::kPvSteps; ++kk) {
      const uint64_t p_desc = wgmma_desc_advance(p0, wgmma_k_major_offset<typename Traits::PTile>(0, kk));
#pragma unroll
      for (int mt = 0; mt < Traits::kLatentTiles; ++mt) {
        wgmma_m64nNk16_ss_mn_a<T, Traits::CTA_TILE_Q>(
            o[mt], wgmma_desc_advance(v0, mt * KVTile::kBlockBytes + kk * 2 * KVTile::kAtomBytes), p_desc, true);
      }
    }
    wgmma_commit();
  }
};

/// O (rows of the tile, scaled by 1 / l) from the registers into o, a one-shot split's state
/// (16-bit) or a planned item's fp32 state, and the rows' LSE. No shared-memory staging: the
/// stages already hold the next work tile's copies. A warp's store covers 8 consecutive latent
/// columns of 4 rows.
template <typename Traits>
struct MlaNarrowEpilogue {
  using T = typename Traits::DType;
  static TESSERA_DEVICE void store(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, const MlaNarrowCoords& c,
                                   const float (&o)[Traits::kLatentTiles][8], const MlaNarrowSoftmax<Traits>& sm,
                                   float value_scale) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int tile_row = c.row(q);
      const int packed = w.row0 + tile_row;
      if (packed >= w.rows) continue;
      const float inv = sm.l[q] > 0.f ? value_scale / sm.l[q] : 0.f;
      const int acc0 = 4 * (q / 2) + q % 2;  // the row's accumulators: acc0 (column g) and acc0 + 2 (g + 8)
      if (w.state_o != nullptr) {
        float* out = w.state_o + tile_row * Traits::kLatentDim;
#pragma unroll
        for (int mt = 0; mt < Traits::kLatentTiles; ++mt) {
          out[64 * mt + c.m_row(acc0)] = o[mt][acc0] * inv;
          out[64 * mt + c.m_row(acc0 + 2)] = o[mt][acc0 + 2] * inv;
        }
      } else {
        T* out = MlaEpilogue<Traits>::out_row(p, w, packed);
#pragma unroll
        for (int mt = 0; mt < Traits::kLatentTiles; ++mt) {
          out[64 * mt + c.m_row(acc0)] = from_float<T>(o[mt][acc0] * inv);
          out[64 * mt + c.m_row(acc0 + 2)] = from_float<T>(o[mt][acc0 + 2] * inv);
        }
      }
      if (c.g == 0 && c.warp == 0) {  // one writer per row: the column's lane of warp 0
        float* lse = MlaEpilogue<Traits>::lse_slot(p, w, packed);
        if (lse != nullptr) *lse = sm.l[q] > 0.f ? sm.m[q] + __log2f(sm.l[q]) : -INFINITY;
      }
    }
  }
};

/// The math warpgroup: per KV tile t (CTA-wide g): wait for P V of t - 1 and release its stage ->
/// wait KV(g) -> S^T -> softmax (one barrier) -> rescale O^T -> P^T published (one barrier) ->
/// issue O^T += V^T P^T. The P V runs while the next tile's scores wait for their stage. After the
/// last P V: release the stage and the work tile's Q buffer, reduce the sums, store.
template <typename Traits>
struct MlaNarrowMathWarpgroup {
  const MlaNarrowCta<Traits>& cta;
  MlaNarrowCoords c;

  TESSERA_DEVICE void run(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, const MlaPipelineState& state) const {
    const int n = w.num_kv_tiles;
    const int g0 = state.tiles_done;
    const float scale_log2 = p.sm_scale_log2 * MlaDequant<Traits>::key_scale(p);
    int limit[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) limit[q] = w.key_limit(w.row0 + c.row(q), p.num_heads, p.causal);
    MlaNarrowSoftmax<Traits> softmax;
    float o[Traits::kLatentTiles][8];  // [kLatentDim, CTA_TILE_Q] O^T, 8 m64n16 tiles
#pragma unroll
    for (int mt = 0; mt < Traits::kLatentTiles; ++mt) {
#pragma unroll
      for (int acc = 0; acc < 8; ++acc) o[mt][acc] = 0.f;
    }
    const uint32_t q_tile = smem_addr(cta.q_tile(state.items_with_kv));
    // The warps' partials go to buffer (exchange count) % 2, the exchanges counted CTA-wide (n a
    // work tile, then its sums): two writes of a buffer always have an exchange, and so a
    // barrier every warp passes after its reads, between them.
    const int exchange0 = state.tiles_done + state.items_done;
    for (int t = 0; t < n; ++t) {
      const int g = g0 + t;
      if (t > 0) {
        wgmma_wait<0>();  // O^T of tile t - 1: its stage and P are free again
#pragma unroll
        for (int mt = 0; mt < Traits::kLatentTiles; ++mt) wgmma_fence_operands(o[mt]);
        cta.handoffs.release_stage(g - 1);
      }
      cta.handoffs.wait_kv(g);
      fence_proxy_async_shared();
      float s[8];  // [CTA_TILE_KV, CTA_TILE_Q] S^T, m64n16
      const uint32_t stage = smem_addr(cta.stage(g));
      MlaNarrowScores<Traits>::issue(s, stage, q_tile);
      wgmma_wait<0>();
      wgmma_fence_operands(s);
      float alpha[4];
      const int key0 = (w.first_kv_tile + t) * Traits::CTA_TILE_KV;
      softmax.step(s, cta, c, key0, limit, scale_log2, exchange0 + t, alpha);
      MlaNarrowValues<Traits>::rescale(o, alpha);
      MlaNarrowValues<Traits>::publish_p(s, cta.p_tile(), c);
      fence_proxy_async_shared();
      mla_narrow_math_sync();  // every warp's P before the warpgroup's MMAs read it
      MlaNarrowValues<Traits>::issue(o, stage, cta.p_tile());
    }
    // Unconditional: a wgmma wait under a branch makes ptxas serialize every MMA of the kernel
    // (C7518); with no group outstanding it returns at once.
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < Traits::kLatentTiles; ++mt) wgmma_fence_operands(o[mt]);
    if (n > 0) {
      cta.handoffs.release_stage(g0 + n - 1);
      cta.handoffs.release_q(state.items_with_kv);
    }
    softmax.reduce_sums(cta, c, exchange0 + n);
    MlaNarrowEpilogue<Traits>::store(p, w, c, o, softmax, MlaDequant<Traits>::value_scale(p));
  }
};

/// A CTA runs its schedule's work tiles one after another: one (the one-shot grid) or a column of
/// the runtime's plan, the pipeline running on across them (MlaPipelineState). No wait depends on
/// an arrival its own warpgroup makes later: the load warpgroup waits for stage and Q releases
/// that follow the math warpgroup's waits for earlier copies.
template <typename Traits, typename Schedule>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    mla_paged_narrow_kernel(const MlaParamsOf<Traits> p, const typename Schedule::Args schedule) {
#if TESSERA_WGMMA_AVAILABLE
  extern __shared__ __align__(1024) unsigned char smem[];
  const MlaNarrowCta<Traits> cta{MlaNarrowHandoffs<Traits>::at(smem), smem};
  if (threadIdx.x == 0) cta.handoffs.init();
  __syncthreads();
  const int thread = threadIdx.x % Traits::kWarpgroupThreads;
  MlaPipelineState state;
  if (static_cast<MlaNarrowRole>(threadIdx.x / Traits::kWarpgroupThreads) == MlaNarrowRole::kLoad) {
    const MlaNarrowLoadWarpgroup<Traits> load{cta, MlaTileLoader<Traits>{thread}};
    Schedule::for_each_tile(p, schedule, [&](const MlaWorkTile<Traits>& w) {
      load.run(p, w, state);
      state.advance(w.num_kv_tiles);
    });
  } else {
    const MlaNarrowMathWarpgroup<Traits> math{cta, MlaNarrowCoords::of_thread(thread)};
    Schedule::for_each_tile(p, schedule, [&](const MlaWorkTile<Traits>& w) {
      math.run(p, w, state);
      state.advance(w.num_kv_tiles);
    });
  }
#endif
}

}  // namespace kernels
}  // namespace tessera
