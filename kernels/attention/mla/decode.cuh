// Multi-head latent attention (DeepSeek MLA) in absorbed form over a paged latent cache, on sm_90a
// wgmma: decode and append-style prefill (any number of query tokens per request, causal among
// them). The kernel is a composition of the types below, in the order a tile meets them:
// MlaWorkTile (which query rows and KV tokens a CTA works on) and its two tile schedulers
// (MlaSplitGridSchedule: one tile per CTA of the one-shot grid; MlaPlannedSchedule: the plan/run
// runtime's persistent columns of work items), MlaTileLoader
// (cp.async copies of Q and of paged KV rows into the swizzled operand tiles), MlaKvCopy (how a
// stage is filled: cp.async for a 16-bit cache, through the registers with a conversion for an
// fp8 one), MlaScoreMainloop (Q K^T), MlaDequant (an fp8 cache's scales), MlaOnlineSoftmax
// (masking, running max and sum, P), MlaValueGemm (the P V products),
// MlaEpilogue, MlaHandoffs (the pipeline between the warpgroups), and the two warpgroup roles,
// MlaValueWarpgroup and MlaScoreWarpgroup. Roles and shared memory: traits.cuh.
#pragma once

#include "kernels/attention/mla/params.cuh"
#include "kernels/attention/planned_work.cuh"
#include "kernels/attention/mla/traits.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/math.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/wgmma.cuh"

namespace tessera {
namespace kernels {

/// The kernel parameters of a traits struct's dtypes.
template <typename Traits>
using MlaParamsOf = MlaParams<typename Traits::DType, typename Traits::KVType>;

/// The query rows and KV range of one work tile: CTA_TILE_Q packed rows of one request against a
/// run of its KV tiles, and where the result goes.
template <typename Traits>
struct MlaWorkTile {
  int request;
  int split;         // one-shot grid: the KV split (blockIdx.z); planned items: 0
  int64_t qo_start;  // the request's first query token
  int qo_len;
  int kv_len;
  int row0;          // the tile's first packed row (token * num_heads + head) within the request
  int rows;          // packed rows of the request: qo_len * num_heads
  int page_begin;    // the request's first entry of kv_indices
  int first_kv_tile;  // the first KV tile of the run
  int num_kv_tiles;   // KV tiles of the run that some row of this tile sees
  // A planned item that is one chunk of a split tile writes its fp32 state here instead of o:
  // [CTA_TILE_Q, kLatentDim] normalised output and [CTA_TILE_Q] base-2 LSE (null otherwise).
  float* state_o;
  float* state_lse;

  /// The request's extent (everything but the tile's rows and KV run).
  template <typename Params>
  static TESSERA_DEVICE MlaWorkTile of_request(const Params& p, int request, int row0) {
    MlaWorkTile w;
    w.request = request;
    w.split = 0;
    w.qo_start = p.qo_indptr ? p.qo_indptr[request] : request;
    w.qo_len = p.qo_indptr ? p.qo_indptr[request + 1] - static_cast<int>(w.qo_start) : 1;
    w.page_begin = p.kv_indptr[request];
    const int pages = p.kv_indptr[request + 1] - w.page_begin;
    w.kv_len = pages == 0 ? 0 : (pages - 1) * p.page_size + p.kv_last_page_len[request];
    w.row0 = row0;
    w.rows = w.qo_len * p.num_heads;
    w.first_kv_tile = 0;
    w.num_kv_tiles = 0;
    w.state_o = nullptr;
    w.state_lse = nullptr;
    return w;
  }
  /// KV tiles that some row of the tile sees (the last row sees the most: causal positions grow
  /// with the token).
  template <typename Params>
  TESSERA_DEVICE int visible_kv_tiles(const Params& p) const {
    const int last_row = min(row0 + Traits::CTA_TILE_Q, rows) - 1;
    const int visible = key_limit(last_row, p.num_heads, p.causal);
    return visible > 0 ? (visible + Traits::CTA_TILE_KV - 1) / Traits::CTA_TILE_KV : 0;
  }
  TESSERA_DEVICE bool empty() const { return row0 >= rows; }
  /// Keys [0, limit) are visible to packed row `row` of the request.
  TESSERA_DEVICE int key_limit(int row, int num_heads, bool causal) const {
    return causal ? min(kv_len, kv_len - qo_len + row / num_heads + 1) : kv_len;
  }
};

/// The one-shot grid (batch_mla_paged): CTA (x, y, z) is row tile x of request y against KV split
/// z, the request's visible KV tiles cut into num_kv_splits nearly equal runs.
template <typename Traits>
struct MlaSplitGridSchedule {
  struct Args {};
  template <typename Params, typename F>
  static TESSERA_DEVICE void for_each_tile(const Params& p, Args, F&& run_tile) {
    MlaWorkTile<Traits> w = MlaWorkTile<Traits>::of_request(p, blockIdx.y, blockIdx.x * Traits::CTA_TILE_Q);
    if (w.empty()) return;
    const int tiles = w.visible_kv_tiles(p);
    w.split = blockIdx.z;
    const int per_split = (tiles + p.num_kv_splits - 1) / p.num_kv_splits;
    w.first_kv_tile = min(w.split * per_split, tiles);
    w.num_kv_tiles = min(per_split, tiles - w.first_kv_tile);
    run_tile(w);
  }
};

/// The plan/run runtime's persistent grid: CTA c runs the work items cta_indptr[c] ..
/// cta_indptr[c + 1] - 1 of the plan (src/runtime/planner.h) one after another, each a query tile
/// of 64 packed rows against KV positions [kv_begin, kv_end) (multiples of CTA_TILE_KV but the
/// last). The kernel's pipeline runs on across items (MlaPipelineState).
template <typename Traits>
struct MlaPlannedSchedule {
  using Args = PlannedWork;
  template <typename Params, typename F>
  static TESSERA_DEVICE void for_each_tile(const Params& p, const PlannedWork& work, F&& run_tile) {
    const int end = work.cta_indptr[blockIdx.x + 1];
    for (int i = work.cta_indptr[blockIdx.x]; i < end; ++i) {
      const PlannedItem item = work.items[i];
      MlaWorkTile<Traits> w = MlaWorkTile<Traits>::of_request(p, item.request, item.packed_begin);
      // Keys past what the tile's rows see are masked anyway; the planner clips the run to them.
      w.first_kv_tile = item.kv_begin / Traits::CTA_TILE_KV;
      const int last = min(item.kv_end, w.kv_len);
      w.num_kv_tiles = last > item.kv_begin ? (last - item.kv_begin + Traits::CTA_TILE_KV - 1) / Traits::CTA_TILE_KV : 0;
      if (item.partial >= 0) {
        w.state_o = work.partial_o + static_cast<int64_t>(item.partial) * Traits::CTA_TILE_Q * Traits::kLatentDim;
        w.state_lse = work.partial_lse + static_cast<int64_t>(item.partial) * Traits::CTA_TILE_Q;
      }
      run_tile(w);
    }
  }
};

/// Where a CTA's pipeline stands: the KV tiles and work tiles it has run before the current one.
/// The hand-offs' phases and a tile's stage follow from these CTA-wide counts, so one CTA can run
/// any number of work tiles back to back (MlaPlannedSchedule).
struct MlaPipelineState {
  int tiles_done = 0;
  int items_done = 0;
  int items_with_kv = 0;  // work tiles of at least one KV tile (the narrow tile's Q buffers, narrow.cuh)
  TESSERA_DEVICE void advance(int tiles) {
    tiles_done += tiles;
    ++items_done;
    items_with_kv += tiles > 0 ? 1 : 0;
  }
};

/// cp.async copies of Q rows and paged KV rows into the operand tiles, by the loading warpgroup.
/// Thread `tid` (0-127) copies 16-byte chunk tid % 8 of each 128-byte column block of rows
/// tid / 8 + 16 i; missing rows are zero-filled so that no NaN of stale memory meets a zero P.
template <typename Traits>
struct MlaTileLoader {
  using T = typename Traits::DType;
  int tid;

  TESSERA_DEVICE int loader_row(int i) const { return tid / 8 + Traits::kLoaderGroups * i; }

  /// Copies one 576-wide row made of a latent part and a rotary part.
  TESSERA_DEVICE void copy_row(unsigned char* tile, int row, const T* latent, const T* rope, bool valid) const {
    const int lane8 = tid % 8;
#pragma unroll
    for (int block = 0; block < Traits::kRowChunks / 8; ++block) {
      const int chunk = block * 8 + lane8;
      const T* src = block < Traits::kLatentChunks / 8 ? latent + chunk * 8 : rope + lane8 * 8;
      cp_async_16_zfill(tile + Traits::KVTile::chunk_offset(row, chunk) * 16, src, valid);
    }
  }

  TESSERA_DEVICE void load_q(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, unsigned char* q_tile) const {
#pragma unroll
    for (int i = 0; i < Traits::kRowsPerLoader; ++i) {
      const int r = loader_row(i);
      const int row = w.row0 + r;
      const bool valid = row < w.rows;
      const int64_t token = w.qo_start + (valid ? row / p.num_heads : 0);
      const int head = valid ? row % p.num_heads : 0;
      copy_row(q_tile, r, p.q_nope + token * p.q_nope_stride_token + head * p.q_nope_stride_head,
               p.q_pe + token * p.q_pe_stride_token + head * p.q_pe_stride_head, valid);
    }
  }

  TESSERA_DEVICE void load_kv(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, int kv_tile,
                              unsigned char* stage) const {
#pragma unroll
    for (int i = 0; i < Traits::kRowsPerLoader; ++i) {
      const int r = loader_row(i);
      const int key = kv_tile * Traits::CTA_TILE_KV + r;
      const bool valid = key < w.kv_len;
      const int page_in_request = valid ? p.page_div.div(key) : 0;
      const int slot = valid ? p.page_div.mod(key, page_in_request) : 0;
      const int64_t page = valid ? p.kv_indices[w.page_begin + page_in_request] : 0;
      copy_row(stage, r, p.ckv + page * p.ckv_stride_page + slot * p.ckv_stride_slot,
               p.kpe + page * p.kpe_stride_page + slot * p.kpe_stride_slot, valid);
    }
  }
};

/// How the loading warpgroup fills a KV stage, in two steps: fetch() starts a tile's reads (early:
/// at the top of the iteration that frees its stage) and fill() puts the tile into its stage and
/// signals it (MlaHandoffs::kv_full). A 16-bit cache is copied by cp.async in fill(), with
/// nothing to fetch ahead.
template <typename Traits, bool kFp8 = Traits::kFp8Cache>
struct MlaKvCopy {
  MlaTileLoader<Traits> loader;
  TESSERA_DEVICE void fetch(const MlaParamsOf<Traits>&, const MlaWorkTile<Traits>&, int) {}
  template <typename Handoffs>
  TESSERA_DEVICE void fill(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, int kv_tile,
                           unsigned char* stage, const Handoffs& handoffs, int g) const {
    loader.load_kv(p, w, kv_tile, stage);
    handoffs.kv_copied(g);  // arrives as this thread's copies land (Q's included, for a first tile)
  }
};

/// An fp8 cache goes through the registers: fetch() loads a tile's stored bytes as 16-byte pieces
/// (16 elements, two chunks of the operand stage), thread tid pieces tid % 4 + 4 k of rows
/// tid / 4 + 32 i, and fill() converts them to T (exact) and stores the chunks. The loads are in
/// flight while the warpgroup waits for P and multiplies it.
template <typename Traits>
struct MlaKvCopy<Traits, true> {
  using T = typename Traits::DType;
  using KVT = typename Traits::KVType;
  static constexpr int kPieceLanes = 4;                                  // threads sharing a row
  static constexpr int kRows = Traits::CTA_TILE_KV * kPieceLanes / Traits::kWarpgroupThreads;  // a thread's rows
  static constexpr int kRowPieces = Traits::kQkDim * static_cast<int>(sizeof(KVT)) / 16;       // 36
  static constexpr int kLatentPieces = Traits::kLatentDim * static_cast<int>(sizeof(KVT)) / 16;
  static constexpr int kPieces = kRowPieces / kPieceLanes;               // a thread's pieces of a row
  static_assert(kRowPieces % kPieceLanes == 0 && kLatentPieces % kPieceLanes == 0,
                "a lane's pieces: whole pieces of the latent and of the rotary part");
  MlaTileLoader<Traits> loader;
  uint4 raw[kRows][kPieces];  // [rows, pieces] 16 stored elements each

  TESSERA_DEVICE int row(int i) const { return loader.tid / kPieceLanes + (Traits::CTA_TILE_KV / kRows) * i; }
  TESSERA_DEVICE int piece(int k) const { return loader.tid % kPieceLanes + kPieceLanes * k; }

  TESSERA_DEVICE void fetch(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, int kv_tile) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int key = kv_tile * Traits::CTA_TILE_KV + row(i);
      if (key >= w.kv_len) {  // zeros, as the 16-bit path's zero-fill: no stale NaN meets a zero P
#pragma unroll
        for (int k = 0; k < kPieces; ++k) raw[i][k] = make_uint4(0u, 0u, 0u, 0u);
        continue;
      }
      const int page_in_request = p.page_div.div(key);
      const int slot = p.page_div.mod(key, page_in_request);
      const int64_t page = p.kv_indices[w.page_begin + page_in_request];
      const KVT* latent = p.ckv + page * p.ckv_stride_page + slot * p.ckv_stride_slot;
      const KVT* rope = p.kpe + page * p.kpe_stride_page + slot * p.kpe_stride_slot;
#pragma unroll
      for (int k = 0; k < kPieces; ++k) {
        const int pc = piece(k);
        const KVT* src = pc < kLatentPieces ? latent + pc * 16 : rope + (pc - kLatentPieces) * 16;
        raw[i][k] = __ldg(reinterpret_cast<const uint4*>(src));
      }
    }
  }
  /// One piece's 16 stored elements converted to T (exact) into their two chunks of a stage's row.
  static TESSERA_DEVICE void store_piece(unsigned char* stage, int row, int piece, const uint4& stored) {
    uint32_t v[8];  // [16] T: chunks 2 piece and 2 piece + 1 of the row
    fp8x4_to_pairs<KVT, T>(stored.x, v[0], v[1]);
    fp8x4_to_pairs<KVT, T>(stored.y, v[2], v[3]);
    fp8x4_to_pairs<KVT, T>(stored.z, v[4], v[5]);
    fp8x4_to_pairs<KVT, T>(stored.w, v[6], v[7]);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t addr = smem_addr(stage + Traits::KVTile::chunk_offset(row, 2 * piece + half) * 16);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[4 * half]), "r"(v[4 * half + 1]),
                   "r"(v[4 * half + 2]), "r"(v[4 * half + 3])
                   : "memory");
    }
  }
  /// The fetched tile into `stage` (the caller fences and signals).
  TESSERA_DEVICE void store(unsigned char* stage) const {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int k = 0; k < kPieces; ++k) store_piece(stage, row(i), piece(k), raw[i][k]);
    }
  }
  template <typename Handoffs>
  TESSERA_DEVICE void fill(const MlaParamsOf<Traits>&, const MlaWorkTile<Traits>&, int, unsigned char* stage,
                           const Handoffs& handoffs, int g) const {
    store(stage);
    // A plain arrive does not track cp.async: a first tile's Q copies must have landed before it.
    cp_async_wait_all();
    fence_proxy_async_shared();  // the stores, before wgmma's async-proxy reads
    handoffs.kv_stored(g);
  }
};

/// A thread's place in a warpgroup's m64nN accumulators: rows row_lo and row_lo + 8 of the tile,
/// columns 8 n + col_in_n8 and + 1 of each n8 block (wgmma.cuh).
struct MlaFragmentCoords {
  int row_lo;
  int col_in_n8;
  TESSERA_DEVICE static MlaFragmentCoords of_thread(int thread_in_warpgroup) {
    const int warp = thread_in_warpgroup / kWarpSize, lane = thread_in_warpgroup % kWarpSize;
    return {warp * 16 + lane / 4, 2 * (lane % 4)};
  }
};

/// A B^T over the latent row's full width (MlaLatentRow::kQkSteps k16 steps of m64nN), both
/// operands K-major tiles in shared memory, committed as one wgmma group (the caller waits): Q K^T
/// of the 64-row tile (A = Q), K Q^T of the narrow one (A = the KV stage, narrow.cuh).
template <typename T, int N, typename ATile, typename BTile>
TESSERA_DEVICE void mla_issue_key_product(float (&acc)[N / 2], uint32_t a_tile, uint32_t b_tile) {
  const uint64_t a0 = wgmma_k_major_desc<ATile>(a_tile, 0, 0);
  const uint64_t b0 = wgmma_k_major_desc<BTile>(b_tile, 0, 0);
  wgmma_fence();
#pragma unroll
  for (int kd = 0; kd < MlaLatentRow::kQkSteps; ++kd) {
    wgmma_m64nNk16_ss<T, N>(acc, wgmma_desc_advance(a0, wgmma_k_major_offset<ATile>(0, kd)),
                            wgmma_desc_advance(b0, wgmma_k_major_offset<BTile>(0, kd)), kd > 0);
  }
  wgmma_commit();
}

/// S = Q K^T for one KV stage (m64n64), by the score warpgroup.
template <typename Traits>
struct MlaScoreMainloop {
  static TESSERA_DEVICE void issue(float (&s)[Traits::CTA_TILE_KV / 2], uint32_t q_tile, uint32_t kv_stage) {
    mla_issue_key_product<typename Traits::DType, Traits::CTA_TILE_KV, typename Traits::QTile, typename Traits::KVTile>(
        s, q_tile, kv_stage);
  }
};

/// An fp8 cache's dequantization as the tile applies it: the operand tiles hold the stored values,
/// so the key scale joins the logits' scale and the value scale the rows' 1 / l (read from
/// device memory when the caller passed device scales: a CUDA Graph replays with their values).
template <typename Traits>
struct MlaDequant {
  static TESSERA_DEVICE float key_scale(const MlaParamsOf<Traits>& p) {
    if constexpr (Traits::kFp8Cache) return p.scales.k_scale(0);
    return 1.f;
  }
  static TESSERA_DEVICE float value_scale(const MlaParamsOf<Traits>& p) {
    if constexpr (Traits::kFp8Cache) return p.scales.v_scale(0);
    return 1.f;
  }
};

/// The online softmax of the score warpgroup's two rows per thread, in base-2 units: masks the
/// keys a row cannot see, updates the running max m and (thread-partial) sum l, turns S into P and
/// returns the factor by which each row's earlier output must be scaled.
template <typename Traits>
struct MlaOnlineSoftmax {
  static constexpr int kN8 = Traits::CTA_TILE_KV / 8;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};

  /// s: the tile's logits (unscaled); key0: the tile's first key; limit_lo/hi: the rows' visible
  /// key counts; mask: whether any key of the tile may be hidden from this thread's rows.
  TESSERA_DEVICE void step(float (&s)[Traits::CTA_TILE_KV / 2], int key0, int col_in_n8, int limit_lo, int limit_hi,
                           bool mask, float scale_log2, float (&alpha)[2]) {
    if (mask) {
#pragma unroll
      for (int n = 0; n < kN8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + 8 * n + col_in_n8 + (e & 1);
          if (key >= (e < 2 ? limit_lo : limit_hi)) s[4 * n + e] = -INFINITY;
        }
      }
    }
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kN8; ++n) {
      row_max[0] = fmaxf(row_max[0], fmaxf(s[4 * n], s[4 * n + 1]));
      row_max[1] = fmaxf(row_max[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
    float m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
      const float m_new = fmaxf(m[r], row_max[r] * scale_log2);
      // A row that has seen no key yet keeps -inf; 0 then stands in for it, so that exp2 of
      // (-inf) - (-inf) never makes a NaN.
      m_use[r] = m_new == -INFINITY ? 0.f : m_new;
      // Exactly 1 when the row's max has not moved (most tiles once it settles), so that the
      // output's rescale can be skipped (MlaValueGemm::rescale).
      alpha[r] = m_new == m[r] ? 1.f : fast_exp2(m[r] - m_use[r]);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < kN8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        s[4 * n + e] = fast_exp2(fmaf(s[4 * n + e], scale_log2, -m_use[r]));
        l[r] += s[4 * n + e];
      }
    }
  }

  /// The rows' full sums (the quad's four threads hold parts of each row).
  TESSERA_DEVICE void reduce_sums() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
  }
};

/// O[:, cols] += P V[:, cols] for one warpgroup's half of the value columns: P either from the
/// score warpgroup's registers (the m16n8k16 A layout) or from its published shared-memory tile.
template <typename Traits>
struct MlaValueGemm {
  using T = typename Traits::DType;
  static constexpr int kOAccs = Traits::kValueCols / 2;

  static TESSERA_DEVICE uint64_t v_desc(uint32_t kv_stage, int first_block, int kk) {
    return wgmma_mn_major_desc<typename Traits::KVTile>(kv_stage + first_block * Traits::KVTile::kBlockBytes, kk);
  }
  /// Issues the P V products with P from registers as one wgmma group; the caller waits (and
  /// keeps p alive until then: the MMAs read the registers asynchronously).
  static TESSERA_DEVICE void issue_from_registers(float (&o)[kOAccs], const uint32_t (&p)[Traits::kPvSteps][4],
                                                  uint32_t kv_stage, int first_block) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Traits::kPvSteps; ++kk) {
      wgmma_m64nNk16_rs<T, Traits::kValueCols>(o, p[kk], v_desc(kv_stage, first_block, kk), true);
    }
    wgmma_commit();
  }
  static TESSERA_DEVICE void from_shared(float (&o)[kOAccs], uint32_t p_tile, uint32_t kv_stage, int first_block) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Traits::kPvSteps; ++kk) {
      wgmma_m64nNk16_ss_mn_b<T, Traits::kValueCols>(o, wgmma_k_major_desc<typename Traits::PTile>(p_tile, 0, kk),
                                                    v_desc(kv_stage, first_block, kk), true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(o);
  }
  /// O *= alpha per row; skipped by a warp whose rows all keep their max (alpha exactly 1): 128
  /// multiplies a thread on the path between the softmax and the next P V.
  static TESSERA_DEVICE void rescale(float (&o)[kOAccs], const float (&alpha)[2]) {
    if (__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) return;
#pragma unroll
    for (int i = 0; i < kOAccs; ++i) o[i] *= alpha[(i / 2) % 2];
  }
};

/// Writes a warpgroup's half of the output rows (scaled by 1 / l) and, from the score warpgroup,
/// the rows' LSE: into o and lse, into the one-shot split's state (16-bit), or into a planned
/// item's fp32 state (MlaWorkTile::state_o).
template <typename Traits>
struct MlaEpilogue {
  using T = typename Traits::DType;
  /// Row `row` (packed, of the request) of the output this CTA writes, and its LSE slot (null when
  /// no LSE is wanted).
  static TESSERA_DEVICE T* out_row(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, int row) {
    const int64_t token = w.qo_start + row / p.num_heads;
    const int head = row % p.num_heads;
    if (p.num_kv_splits > 1) {
      return p.partial_o + ((token * p.num_kv_splits + w.split) * p.num_heads + head) * Traits::kLatentDim;
    }
    return p.o + token * p.o_stride_token + head * p.o_stride_head;
  }
  static TESSERA_DEVICE float* lse_slot(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, int row) {
    if (w.state_lse != nullptr) return w.state_lse + (row - w.row0);
    const int64_t token = w.qo_start + row / p.num_heads;
    const int head = row % p.num_heads;
    if (p.num_kv_splits > 1) return p.partial_lse + (token * p.num_kv_splits + w.split) * p.num_heads + head;
    return p.lse != nullptr ? p.lse + token * p.num_heads + head : nullptr;
  }
  template <int kOAccs>
  static TESSERA_DEVICE void store(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, const float (&o)[kOAccs],
                                   MlaFragmentCoords c, int col0, const float (&inv_sum)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tile_row = c.row_lo + 8 * r;
      const int row = w.row0 + tile_row;
      if (row >= w.rows) continue;
      if (w.state_o != nullptr) {
        float* out = w.state_o + tile_row * Traits::kLatentDim + col0 + c.col_in_n8;  // [kOAccs / 4] pairs
#pragma unroll
        for (int n = 0; n < kOAccs / 4; ++n) {
          *reinterpret_cast<float2*>(out + 8 * n) =
              make_float2(o[4 * n + 2 * r] * inv_sum[r], o[4 * n + 2 * r + 1] * inv_sum[r]);
        }
        continue;
      }
      T* out = out_row(p, w, row) + col0 + c.col_in_n8;
#pragma unroll
      for (int n = 0; n < kOAccs / 4; ++n) {
        const uint32_t pair = pack_pair<T>(o[4 * n + 2 * r] * inv_sum[r], o[4 * n + 2 * r + 1] * inv_sum[r]);
        *reinterpret_cast<uint32_t*>(out + 8 * n) = pair;
      }
    }
  }
};

/// The hand-offs between the two warpgroups, as mbarriers in shared memory (traits.cuh's
/// kBarrierOffset). Each completes a phase when the 128 threads of the signalling warpgroup have
/// arrived, and the waiter names the phase's parity, so neither side meets the other at a CTA-wide
/// barrier and the generic stores that cross a hand-off (the rescale factors, 1 / l) are ordered by
/// the arrive's release and the wait's acquire. Tiles and work tiles are counted CTA-wide
/// (MlaPipelineState): KV tile g's stage and stage release are phase g / 2 of their stage's barrier
/// (tile g uses stage g % 2), P's are phase g, work tile i's sums and their read are phase i.
template <typename Traits>
struct MlaHandoffs {
  uint64_t* kv_full;     // [kStages] a stage's copies (and, for tile 0, Q's) have landed: value -> score
  uint64_t* stage_free;  // [kStages] the score warpgroup is done with a stage: score -> value
  uint64_t* p_full;      // P and the rescale factors of a tile are published: score -> value
  uint64_t* p_empty;     // the value warpgroup has finished reading P: value -> score
  uint64_t* sums;        // the rows' 1 / l are published: score -> value
  uint64_t* sums_read;   // the value warpgroup has read them (the next work tile may overwrite): value -> score

  static TESSERA_DEVICE MlaHandoffs at(unsigned char* smem) {
    uint64_t* b = reinterpret_cast<uint64_t*>(smem + Traits::kBarrierOffset);
    uint64_t* p = b + 2 * Traits::kStages;
    return {b, b + Traits::kStages, p, p + 1, p + 2, p + 3};
  }
  /// Thread 0; a CTA barrier must follow.
  TESSERA_DEVICE void init() const {
    for (int st = 0; st < Traits::kStages; ++st) {
      mbarrier_init(kv_full + st, Traits::kWarpgroupThreads);
      mbarrier_init(stage_free + st, Traits::kWarpgroupThreads);
    }
    mbarrier_init(p_full, Traits::kWarpgroupThreads);
    mbarrier_init(p_empty, Traits::kWarpgroupThreads);
    mbarrier_init(sums, Traits::kWarpgroupThreads);
    mbarrier_init(sums_read, Traits::kWarpgroupThreads);
  }
  static TESSERA_DEVICE uint32_t stage_parity(int tile) { return static_cast<uint32_t>(tile / Traits::kStages) & 1u; }
  /// This thread's copies of `tile` (issued before) count as arrived once they land.
  TESSERA_DEVICE void kv_copied(int tile) const { cp_async_mbarrier_arrive(kv_full + tile % Traits::kStages); }
  /// This thread's stores of `tile` (made and fenced before) are done.
  TESSERA_DEVICE void kv_stored(int tile) const { mbarrier_arrive(kv_full + tile % Traits::kStages); }
  TESSERA_DEVICE void wait_kv(int tile) const { mbarrier_wait(kv_full + tile % Traits::kStages, stage_parity(tile)); }
  TESSERA_DEVICE void release_stage(int tile) const { mbarrier_arrive(stage_free + tile % Traits::kStages); }
  TESSERA_DEVICE void wait_stage_free(int tile) const {
    mbarrier_wait(stage_free + tile % Traits::kStages, stage_parity(tile));
  }
  TESSERA_DEVICE void publish_p() const { mbarrier_arrive(p_full); }
  TESSERA_DEVICE void wait_p(int tile) const { mbarrier_wait(p_full, static_cast<uint32_t>(tile) & 1u); }
  TESSERA_DEVICE void release_p() const { mbarrier_arrive(p_empty); }
  TESSERA_DEVICE void wait_p_released(int tile) const { mbarrier_wait(p_empty, static_cast<uint32_t>(tile) & 1u); }
  TESSERA_DEVICE void publish_sums() const { mbarrier_arrive(sums); }
  TESSERA_DEVICE void wait_sums(int item) const { mbarrier_wait(sums, static_cast<uint32_t>(item) & 1u); }
  TESSERA_DEVICE void release_sums() const { mbarrier_arrive(sums_read); }
  TESSERA_DEVICE void wait_sums_released(int item) const {
    mbarrier_wait(sums_read, static_cast<uint32_t>(item) & 1u);
  }
};

/// What both warpgroups of a CTA share: the hand-offs and the shared-memory regions (traits.cuh's
/// layout).
template <typename Traits>
struct MlaCta {
  MlaHandoffs<Traits> handoffs;
  unsigned char* smem;
  TESSERA_DEVICE uint32_t q_tile() const { return smem_addr(smem + Traits::kQOffset); }  // [CTA_TILE_Q, kQkDim]
  TESSERA_DEVICE uint32_t p_tile() const { return smem_addr(smem + Traits::kPOffset); }  // [CTA_TILE_Q, CTA_TILE_KV]
  /// The KV stage of the CTA's KV tile g (CTA-wide count): [CTA_TILE_KV, kQkDim].
  TESSERA_DEVICE unsigned char* stage(int g) const {
    return smem + Traits::kKVOffset + (g % Traits::kStages) * Traits::kKVStageBytes;
  }
  /// The rows' rescale factors of KV tile g: f32 [CTA_TILE_Q], one of two buffers.
  TESSERA_DEVICE float* row_scale(int g) const {
    return reinterpret_cast<float*>(smem + Traits::kRowScaleOffset) + (g % 2) * Traits::CTA_TILE_Q;
  }
  TESSERA_DEVICE float* row_inv_sum() const { return reinterpret_cast<float*>(smem + Traits::kRowInvSumOffset); }
};

/// The load-and-value warpgroup: copies Q and the KV tiles, and multiplies each published P by the
/// right half of V. Per work tile of n KV tiles, g = the CTA-wide index of its tile t:
///   Q and tiles 0 and 1 are copied first (each into a stage the score warpgroup has released);
///   per tile: wait KV(g) and P(g) -> rescale, P V right -> release P(g) -> wait the stage of g
///   released, copy t + 2 into it (if t + 2 < n); then wait for the rows' 1 / l, store, release them.
/// Q of the next work tile is copied after P of this one's last tile: every Q K^T reading the old
/// Q has completed by then (the score warpgroup publishes P only after its Q K^T).
template <typename Traits>
struct MlaValueWarpgroup {
  using T = typename Traits::DType;
  const MlaCta<Traits>& cta;
  MlaFragmentCoords coords;
  MlaTileLoader<Traits> loader;

  /// Puts KV tile `t` of `w` (CTA-wide index g; fetched before) into its stage once the score
  /// warpgroup has released the stage's previous tile.
  TESSERA_DEVICE void copy_kv(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, MlaKvCopy<Traits>& copy,
                              int t, int g) const {
    if (g >= Traits::kStages) cta.handoffs.wait_stage_free(g - Traits::kStages);
    copy.fill(p, w, w.first_kv_tile + t, cta.stage(g), cta.handoffs, g);
  }

  TESSERA_DEVICE void run(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, const MlaPipelineState& state) const {
    const MlaHandoffs<Traits>& handoffs = cta.handoffs;
    const int n = w.num_kv_tiles;
    const int g0 = state.tiles_done;
    MlaKvCopy<Traits> copy{loader};
    float o[Traits::kValueCols / 2];  // [CTA_TILE_Q, kValueCols] right half of O, m64n256 layout
#pragma unroll
    for (int i = 0; i < Traits::kValueCols / 2; ++i) o[i] = 0.f;
    if (n > 0) {
      loader.load_q(p, w, cta.smem + Traits::kQOffset);  // lands with tile 0's copies (one arrive)
      copy.fetch(p, w, w.first_kv_tile);
      copy_kv(p, w, copy, 0, g0);
      if (n > 1) {
        copy.fetch(p, w, w.first_kv_tile + 1);
        copy_kv(p, w, copy, 1, g0 + 1);
      }
    }
    for (int t = 0; t < n; ++t) {
      const int g = g0 + t;
      if (t + 2 < n) copy.fetch(p, w, w.first_kv_tile + t + 2);
      handoffs.wait_kv(g);
      handoffs.wait_p(g);
      fence_proxy_async_shared();  // the copies and P, before wgmma's async-proxy reads
      const float* row_scale = cta.row_scale(g);
      const float alpha[2] = {row_scale[coords.row_lo], row_scale[coords.row_lo + 8]};
      MlaValueGemm<Traits>::rescale(o, alpha);
      MlaValueGemm<Traits>::from_shared(o, cta.p_tile(), smem_addr(cta.stage(g)), Traits::kValueBlocks);
      handoffs.release_p();
      if (t + 2 < n) copy_kv(p, w, copy, t + 2, g + 2);
    }
    handoffs.wait_sums(state.items_done);
    const float inv_sum[2] = {cta.row_inv_sum()[coords.row_lo], cta.row_inv_sum()[coords.row_lo + 8]};
    handoffs.release_sums();
    MlaEpilogue<Traits>::store(p, w, o, coords, Traits::kValueCols, inv_sum);
  }
};

/// The score warpgroup: Q K^T, the online softmax, P's publication and the left half of P V. Per
/// KV tile t of a work tile (CTA-wide index g):
///   softmax of S(t) -> wait P(g - 1) released (if g > 0) -> publish P(g) -> rescale, issue P V
///   left -> wait KV(g + 1), issue Q K^T of t + 1 (if t + 1 < n) -> wait for P V left -> release
///   the stage of g -> wait for Q K^T.
/// The left P V of tile t and Q K^T of t + 1 are issued back to back, so the tensor cores go on
/// from one to the other while this warpgroup waits. Every stage is released (the value
/// warpgroup's next copy into it, of this work tile or the next, waits for that).
template <typename Traits>
struct MlaScoreWarpgroup {
  using T = typename Traits::DType;
  using PFragments = uint32_t[Traits::kPvSteps][4];  // P as m16n8k16 A fragments, one set per k16 step
  const MlaCta<Traits>& cta;
  MlaFragmentCoords coords;

  static TESSERA_DEVICE void pack_p(const float (&s)[Traits::CTA_TILE_KV / 2], PFragments& p_frag) {
#pragma unroll
    for (int kk = 0; kk < Traits::kPvSteps; ++kk) {
      p_frag[kk][0] = pack_pair<T>(s[8 * kk + 0], s[8 * kk + 1]);
      p_frag[kk][1] = pack_pair<T>(s[8 * kk + 2], s[8 * kk + 3]);
      p_frag[kk][2] = pack_pair<T>(s[8 * kk + 4], s[8 * kk + 5]);
      p_frag[kk][3] = pack_pair<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  }
  /// Writes P into the PTile ([CTA_TILE_Q, CTA_TILE_KV]) and the rows' rescale factors of KV tile
  /// g, then publishes both.
  TESSERA_DEVICE void publish_p(int g, const PFragments& p_frag, const float (&alpha)[2]) const {
    const uint32_t p_tile = cta.p_tile();
#pragma unroll
    for (int kk = 0; kk < Traits::kPvSteps; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t addr = p_tile + Traits::PTile::chunk_offset(coords.row_lo + 8 * r, 2 * kk + half) * 16 +
                                coords.col_in_n8 * 2;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(p_frag[kk][2 * half + r]) : "memory");
        }
      }
    }
    if (coords.col_in_n8 == 0) {
      cta.row_scale(g)[coords.row_lo] = alpha[0];
      cta.row_scale(g)[coords.row_lo + 8] = alpha[1];
    }
    fence_proxy_async_shared();
    cta.handoffs.publish_p();
  }
  /// O and P stay bound to their registers until the P V that reads them has completed.
  static TESSERA_DEVICE void keep_until_here(float (&o)[Traits::kValueCols / 2], PFragments& p_frag) {
    wgmma_fence_operands(o);
#pragma unroll
    for (int kk = 0; kk < Traits::kPvSteps; ++kk) wgmma_fence_operands(p_frag[kk]);
  }
  /// The rows' 1 / l for the value warpgroup (once it has read the previous work tile's), and
  /// their LSE.
  TESSERA_DEVICE void finish_rows(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, const MlaPipelineState& state,
                                  MlaOnlineSoftmax<Traits>& softmax, float (&inv_sum)[2]) const {
    softmax.reduce_sums();
    if (state.items_done > 0) cta.handoffs.wait_sums_released(state.items_done - 1);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      inv_sum[r] = softmax.l[r] > 0.f ? MlaDequant<Traits>::value_scale(p) / softmax.l[r] : 0.f;
      const int row = coords.row_lo + 8 * r;
      if (coords.col_in_n8 == 0) {
        cta.row_inv_sum()[row] = inv_sum[r];
        const int packed = w.row0 + row;
        float* lse = packed < w.rows ? MlaEpilogue<Traits>::lse_slot(p, w, packed) : nullptr;
        if (lse != nullptr) *lse = softmax.l[r] > 0.f ? softmax.m[r] + __log2f(softmax.l[r]) : -INFINITY;
      }
    }
    cta.handoffs.publish_sums();
  }

  TESSERA_DEVICE void run(const MlaParamsOf<Traits>& p, const MlaWorkTile<Traits>& w, const MlaPipelineState& state) const {
    const MlaHandoffs<Traits>& handoffs = cta.handoffs;
    const int n = w.num_kv_tiles;
    const int g0 = state.tiles_done;
    const int limit_lo = w.key_limit(w.row0 + coords.row_lo, p.num_heads, p.causal);
    const int limit_hi = w.key_limit(w.row0 + coords.row_lo + 8, p.num_heads, p.causal);
    const float scale_log2 = p.sm_scale_log2 * MlaDequant<Traits>::key_scale(p);
    MlaOnlineSoftmax<Traits> softmax;
    float o[Traits::kValueCols / 2];  // [CTA_TILE_Q, kValueCols] left half of O, m64n256 layout
#pragma unroll
    for (int i = 0; i < Traits::kValueCols / 2; ++i) o[i] = 0.f;
    float s[Traits::CTA_TILE_KV / 2];  // [CTA_TILE_Q, CTA_TILE_KV] logits, m64n64 layout
    if (n > 0) {
      handoffs.wait_kv(g0);
      fence_proxy_async_shared();
      MlaScoreMainloop<Traits>::issue(s, cta.q_tile(), smem_addr(cta.stage(g0)));
      wgmma_wait<0>();
      wgmma_fence_operands(s);
    }
    for (int t = 0; t < n; ++t) {
      const int g = g0 + t;
      const int key0 = (w.first_kv_tile + t) * Traits::CTA_TILE_KV;
      float alpha[2];
      softmax.step(s, key0, coords.col_in_n8, limit_lo, limit_hi, key0 + Traits::CTA_TILE_KV > limit_lo,
                   scale_log2, alpha);
      PFragments p_frag;
      pack_p(s, p_frag);
      if (g > 0) handoffs.wait_p_released(g - 1);
      publish_p(g, p_frag, alpha);
      MlaValueGemm<Traits>::rescale(o, alpha);
      MlaValueGemm<Traits>::issue_from_registers(o, p_frag, smem_addr(cta.stage(g)), 0);
      if (t + 1 < n) {
        handoffs.wait_kv(g + 1);
        fence_proxy_async_shared();
        MlaScoreMainloop<Traits>::issue(s, cta.q_tile(), smem_addr(cta.stage(g + 1)));
        wgmma_wait<1>();  // the P V of tile t (committed first); Q K^T of t + 1 may still run
        keep_until_here(o, p_frag);
        handoffs.release_stage(g);
        wgmma_wait<0>();
        wgmma_fence_operands(s);
      } else {
        wgmma_wait<0>();
        keep_until_here(o, p_frag);
        handoffs.release_stage(g);
      }
    }
    float inv_sum[2];
    finish_rows(p, w, state, softmax, inv_sum);
    MlaEpilogue<Traits>::store(p, w, o, coords, 0, inv_sum);
  }
};

/// A CTA runs its schedule's work tiles one after another: one (the one-shot grid) or a column of
/// the runtime's plan. The two warpgroups hand off through MlaHandoffs; no wait depends on an
/// arrival that its own warpgroup makes later, and no phase is arrived at twice before its waiter
/// has passed it (P(g + 1) needs P(g) released, which follows the wait for P(g); a stage's next
/// copies need its release, which follows the wait for its data; the next work tile's 1 / l need
/// this one's read).
template <typename Traits, typename Schedule>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    mla_paged_kernel(const MlaParamsOf<Traits> p, const typename Schedule::Args schedule) {
#if TESSERA_WGMMA_AVAILABLE
  extern __shared__ __align__(1024) unsigned char smem[];
  const MlaCta<Traits> cta{MlaHandoffs<Traits>::at(smem), smem};
  if (threadIdx.x == 0) cta.handoffs.init();
  __syncthreads();
  const int thread_in_wg = threadIdx.x % Traits::kWarpgroupThreads;
  const MlaFragmentCoords coords = MlaFragmentCoords::of_thread(thread_in_wg);
  MlaPipelineState state;
  if (static_cast<MlaRole>(threadIdx.x / Traits::kWarpgroupThreads) == MlaRole::kLoadAndValue) {
    const MlaValueWarpgroup<Traits> value{cta, coords, MlaTileLoader<Traits>{thread_in_wg}};
    Schedule::for_each_tile(p, schedule, [&](const MlaWorkTile<Traits>& w) {
      value.run(p, w, state);
      state.advance(w.num_kv_tiles);
    });
  } else {
    const MlaScoreWarpgroup<Traits> score{cta, coords};
    Schedule::for_each_tile(p, schedule, [&](const MlaWorkTile<Traits>& w) {
      score.run(p, w, state);
      state.advance(w.num_kv_tiles);
    });
  }
#endif
}

}  // namespace kernels
}  // namespace tessera
