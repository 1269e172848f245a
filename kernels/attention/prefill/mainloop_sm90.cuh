// The sm90 warp-specialised mainloop of the prefill tile (sm_90a): a producer warpgroup resolves
// and copies Q and K/V tiles (cp.async, any KV format) into mbarrier pipelines, and the compute
// warpgroups issue wgmma: each warpgroup multiplies its 64 rows by the whole K tile (m64nKk16, Q
// and K read from shared memory through descriptors) and P, straight from the S registers, by the
// V tile (m64nDk16, D the head dim). The accumulators give each warp the same 16-row fragments as
// the mma.sync path, so the variant applier, the softmax and the epilogue are shared.
//
// The compute warpgroups never meet at a CTA barrier inside the tile loop, and (where the traits
// say so, kMmaTurns) they take turns issuing their MMAs (ping-pong, kPingPong): warpgroup w
// issues a tile's Q K^T and the previous tile's P V once warpgroup w - 1 has issued its own, so
// the tensor cores run one warpgroup's MMAs back to back while the others compute their softmax,
// instead of every warpgroup waiting on its MMAs at once and then leaving the tensor cores idle
// through the exponentials. Inside a warpgroup, P V of tile t is issued after Q K^T of tile t + 1
// and runs while the softmax of tile t + 1 does (Traits::kPvLag): K and V stages have their own
// pipelines (a K stage frees after its Q K^T, a V stage after its P V).
// fp8 KV: the producer converts each stage from a raw copy (Traits::kRawStages), or in place
// where raw stages do not fit (Traits::kConvertInPlace); the compute warpgroups see the T stages
// only. FP8 attention (fp8 Q, K, V; Traits::kFp8Operands): k32 fp8 wgmma, and the producer
// transposes each V tile from a raw copy (produce_transposed), since fp8 wgmma reads B K-major
// only.
// TMA: whole query tiles, and whole KV tiles of ragged KV and of pages that hold them, are copied
// by the copy engine (q_tile_by_tma, KVTileSource::tma_tile), the rest by cp.async.
#pragma once

#include "kernels/attention/prefill/kv_loader.cuh"
#include "kernels/attention/prefill/traits.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/pipeline.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"

namespace tessera {
namespace kernels {

template <typename Traits, KVFormatKind kFormat, typename Variant, typename Params>
struct Sm90Mainloop {
  static_assert(Traits::kWarpSpecialized && Traits::kWgmma && Traits::kPvLag == 1,
                "the sm90 mainloop: a producer warpgroup and wgmma warpgroups with P V a tile behind");
  using T = typename Traits::DType;  // the wgmma operands' element type (the kernel checks Params' types match)
  using PType = T;                   // P's, as P V multiplies it
  static constexpr int kMmaQ = Traits::kMmaQ, kN8KV = Traits::kN8KV, kN8D = Traits::kN8D;
  static constexpr int kSRegs = kN8KV * 4;  // a thread's S accumulators of the warpgroup's 64 x CTA_TILE_KV
  static constexpr int kORegs = kN8D * 4;   // a thread's O accumulators of the warpgroup's 64 x HEAD_DIM_VO
  static constexpr bool kByCopies = stage_completion<Traits, kFormat>() == StageCompletion::kByCopies;
  static constexpr bool kConvertStages = Traits::kDequantizeKV;  // fp8 KV: the producer converts raw stages
  static constexpr bool kTransposeV = Traits::kTransposedV;      // FP8 attention: ... transposes raw V stages
  using Source = KVTileSource<Traits, kFormat, Variant, Params>;
  using QTile = typename Traits::template SmemTile<Traits::CTA_TILE_Q>;    // the loaders' layouts
  using KTile = typename Traits::template SmemTile<Traits::CTA_TILE_KV>;
  using VTile = typename Traits::template VSmemTile<Traits::CTA_TILE_KV>;
  // Where the traits take it (kMmaTurns). Ping-pong needs every warpgroup to reach its turn
  // without waiting for another one: a value transform (issue_pv) meets every compute warp at a
  // barrier inside the turn, so variants with one keep the unordered issue.
  static constexpr bool kPingPong = Traits::kMmaTurns && !Variant::kHasValueTransform;
  using MmaTurns = TurnRotation<Traits::kComputeWarpgroups, 4 * kWarpSize, kFirstTurnBarrier>;

  const PrefillSmem<Traits>& smem;
  Source& kv;
  RingPosition<Traits>& ring;  // carries on across the CTA's work items

  /// Producer: Q into its buffer, then every K/V tile through the ring, K of tile `step` and V of
  /// tile step - 1 per step (P V runs a tile behind Q K^T). A tile's row table is resolved before
  /// its stages are free (see Traits::kRowTables), then each copy waits for its stage and its full
  /// barrier is completed as stage_completion says, so the compute warps wait for the copies only,
  /// never for the producer's next step.
  TESSERA_DEVICE void produce(const Params& p, const PrefillWork& w, T* q_tile) {
    const MbarrierPipeline<Traits::kStages> k_pipe = smem.k_pipeline(), v_pipe = smem.v_pipeline();
    const MbarrierPipeline<Traits::kQStages> q_pipe = smem.q_pipeline();
    // The buffer's previous item (kQStages items back) is done with it.
    q_pipe.producer_acquire(ring.fill_q);
    load_q(p, w, q_tile);
    if constexpr (kByCopies) {
      q_pipe.producer_arrive_on_copies(ring.fill_q);
    } else {
      cp_async_commit();
    }
    const int num_kv_tiles = kv.count();
    kv.load_block_id(0);
    if constexpr (Traits::kConvertInPlace) {
      produce_in_place(k_pipe, v_pipe, q_pipe, num_kv_tiles);
    } else if constexpr (kConvertStages) {
      produce_converted(k_pipe, v_pipe, q_pipe, num_kv_tiles);
    } else if constexpr (kTransposeV) {
      produce_transposed(k_pipe, v_pipe, q_pipe, num_kv_tiles);
    } else {
      produce_copied(k_pipe, v_pipe, q_pipe, num_kv_tiles);
    }
    if constexpr (!kByCopies) {
      if (num_kv_tiles == 0) {
        cp_async_wait<0>();
        fence_proxy_async_shared();
        q_pipe.producer_arrive(ring.fill_q);
      }
    }
    ring.fill_q.advance();
    ring.tiles += num_kv_tiles;
  }

  /// Consumer: waits for the work item's Q.
  TESSERA_DEVICE void wait_q() const { smem.q_pipeline().consumer_wait(ring.read_q); }

  /// Consumer: the MMA turns (every compute warpgroup takes one per KV tile, in qk) open before
  /// the CTA's first work item and close after its last, so the rotation runs on across items: a
  /// warpgroup starts the next item's first Q K^T once the previous warpgroup has issued its last
  /// of the current one, while that one finishes its last P V and epilogue. (A round per item made
  /// the first warpgroup wait at every item for the last one's epilogue, losing the ping-pong's
  /// offset at each boundary: bench/results/LOG.md.)
  static TESSERA_DEVICE void open_mma_turns() {
    if constexpr (kPingPong) turns().open();
  }
  static TESSERA_DEVICE void close_mma_turns() {
    if constexpr (kPingPong) turns().close();
  }

  /// Consumer: waits for `tile`'s K stage.
  TESSERA_DEVICE void wait_tile(int /*tile*/) const {
    smem.k_pipeline().consumer_wait(ring.read_k);
    // kByCopies: the copies (this K stage's, and Q's: q_full completed earlier), before wgmma's
    // async-proxy reads.
    if constexpr (kByCopies) fence_proxy_async_shared();
  }

  TESSERA_DEVICE T* k_tile() const { return smem.k + ring.read_k.stage * Traits::kKTileElems; }  // [CTA_TILE_KV][kSmemRowChunks * 8]
  TESSERA_DEVICE T* v_tile() const { return nullptr; }  // V stages trail K stages: see issue_pv

  /// MMA: S = Q K^T of the warpgroup's 64 rows against all 128 keys (this warp's share is s[0],
  /// 16 rows), then, for every tile but the first (kLagged), the previous tile's P V through
  /// issue_previous_pv, and for the first the previous work item's Q buffer release
  /// (release_stored_q: after the MMA turn, so that the other warpgroup's MMAs need not wait for
  /// it); frees the K stage once Q K^T is done.
  template <bool kLagged, typename IssuePreviousPv>
  TESSERA_DEVICE void qk(float (&s)[kMmaQ][kN8KV][4], const T* q_tile, IssuePreviousPv&& issue_previous_pv) const {
    float(&s_wg)[kSRegs] = reinterpret_cast<float(&)[kSRegs]>(s[0]);  // [kN8KV * 4] = [n8 tile][fragment]
    const uint32_t q_tile_addr = smem_addr(q_tile);
    const int q_wg_row0 = (static_cast<int>(threadIdx.x) / kWarpSize / 4) * 64;
    if constexpr (kPingPong) turns().begin_turn();
    wgmma_fence();
#pragma unroll
    for (int kd = 0; kd < Traits::kMmaD; ++kd) {
      wgmma_k_step_ss<T, Traits::CTA_TILE_KV>(s_wg, wgmma_k_major_desc<QTile>(q_tile_addr, q_wg_row0, kd),
                                              wgmma_k_major_desc<KTile>(smem_addr(k_tile()), 0, kd), kd > 0);
    }
    wgmma_commit();
    if constexpr (kLagged) issue_previous_pv();
    if constexpr (kPingPong) turns().end_turn();
    if constexpr (!kLagged) release_stored_q();
    if constexpr (kLagged) {
      wgmma_wait<1>();  // this tile's Q K^T (committed first) is done; the P V may still run
    } else {
      wgmma_wait<0>();
    }
    wgmma_fence_operands(s_wg);
    smem.k_pipeline().consumer_release(ring.read_k);
  }

  /// MMA: O += P V of tile `v_tile_index` from V stage ring.read_v, issued (and committed) after
  /// the next tile's Q K^T so that the next softmax runs while the tensor cores work;
  /// complete_pv waits for it and frees the stage. O and P stay untouched in between (the
  /// softmax only reads S). The variant's value transform, if any, runs on the stage first.
  /// kHalf (Traits::kHalfKvTiles): P is zero past the tile's first half, whose k steps alone run.
  template <bool kHalf, typename Applier>
  TESSERA_DEVICE void issue_pv(float (&o)[kMmaQ][kN8D][4], uint32_t (&pfrag)[kMmaQ][Traits::kMmaKV][4],
                               int v_tile_index, const Applier& applier) const {
    smem.v_pipeline().consumer_wait(ring.read_v);
    if constexpr (kByCopies) fence_proxy_async_shared();  // the copies, before wgmma's async-proxy reads
    T* v_tile = smem.v + ring.read_v.stage * Traits::kVTileElems;  // [CTA_TILE_KV][kVSmemRowChunks * 8]
    if constexpr (Variant::kHasValueTransform) {
      applier.transform_values(v_tile, kv.keys(v_tile_index));
      fence_proxy_async_shared();
      compute_sync<Traits>();
    }
    float(&o_wg)[kORegs] = reinterpret_cast<float(&)[kORegs]>(o[0]);  // [kN8D * 4] = [n8 tile of D][fragment]
    wgmma_fence_operands(o_wg);
    wgmma_fence();  // the rescale's and the packing's register writes precede the reads
    static_assert(!kHalf || Traits::kHalfKvTiles, "half tiles: 128-key wgmma tiles");
#pragma unroll
    for (int kk = 0; kk < (kHalf ? Traits::kMmaKV / 2 : Traits::kMmaKV); ++kk) {
      if constexpr (kTransposeV) {  // V^T rows of keys: K-major, k32 steps
        wgmma_m64nNk32_rs<T, Traits::HEAD_DIM_VO>(o_wg, pfrag[0][kk],
                                                  wgmma_k_major_desc<VTile>(smem_addr(v_tile), 0, kk), true);
      } else {
        wgmma_m64nNk16_rs<T, Traits::HEAD_DIM_VO>(o_wg, pfrag[0][kk],
                                                  wgmma_mn_major_desc<VTile>(smem_addr(v_tile), kk), true);
      }
    }
    wgmma_commit();
  }
  /// Waits for the P V in flight and frees its V stage; `after`: a value computed by the softmax,
  /// which the wait must follow (wgmma_wait_after).
  TESSERA_DEVICE void complete_pv(float (&o)[kMmaQ][kN8D][4], uint32_t (&pfrag)[kMmaQ][Traits::kMmaKV][4],
                              float after) const {
    wgmma_wait_after<0>(after, smem_addr(smem.wait_anchor + threadIdx.x));
    float(&o_wg)[kORegs] = reinterpret_cast<float(&)[kORegs]>(o[0]);
    wgmma_fence_operands(o_wg);
    // P's registers were read by the P V in flight: keep them allocated until here.
    uint32_t(&p_wg)[Traits::kMmaKV * 4] = reinterpret_cast<uint32_t(&)[Traits::kMmaKV * 4]>(pfrag[0]);
    wgmma_fence_operands(p_wg);
    smem.v_pipeline().consumer_release(ring.read_v);
    ring.read_v.advance();
  }

  /// After the last tile (`last`): its P V, issued and completed. Over the first half of its k
  /// steps where every key the tile's rows may see lies there (Traits::kHalfKvTiles: P is zero
  /// past them), in a branch around the whole issue and wait so that each side is its own wgmma
  /// pipeline stage. Only the last tile visited can be that short (the span's end, which the
  /// causal diagonal clips), so the lagged P Vs inside the loop stay whole.
  template <typename Applier>
  TESSERA_DEVICE void last_pv(float (&o)[kMmaQ][kN8D][4], uint32_t (&pfrag)[kMmaQ][Traits::kMmaKV][4], int last,
                              const Applier& applier) const {
    if (Traits::kHalfKvTiles && kv.tiles.end(last) - kv.tiles.begin(last) <= Traits::CTA_TILE_KV / 2) {
      issue_pv<Traits::kHalfKvTiles>(o, pfrag, last, applier);
      complete_pv(o, pfrag, 0.f);
    } else {
      issue_pv<false>(o, pfrag, last, applier);
      complete_pv(o, pfrag, 0.f);
    }
  }

  TESSERA_DEVICE void tile_done() const { ring.read_k.advance(); }
  /// fp8 KV with folded scales: K's scale on the logits, V's on the output (else 1).
  TESSERA_DEVICE float logits_factor() const { return kv.logits_factor(); }
  TESSERA_DEVICE float output_factor() const { return kv.output_factor(); }

  /// After the work item's last tile: its last Q K^T has completed, so the Q buffer is free unless
  /// the epilogue stages O in it (Traits::kTmaO: release_q, after the epilogue). O is in the
  /// standard fragment layout already.
  template <typename O>
  TESSERA_DEVICE void finish(O& /*o*/) const {
    cp_async_wait<0>();
    if constexpr (!Traits::kTmaO) free_q();
    ring.tiles += kv.count();
  }
  /// After the epilogue, which stages O in the Q buffer where Traits::kTmaO
  /// (PrefillEpilogue::store_tile_tma): the buffer is free for the producer's item kQStages ahead.
  /// Elsewhere the buffer was freed at finish(), so the producer of a single Q buffer (head dim
  /// 256) need not wait for the epilogue. `bulk_stores`: this thread issued the output's bulk
  /// stores, which may still read the buffer; with Traits::kDeferQRelease its release then waits
  /// for release_stored_q.
  TESSERA_DEVICE void release_q(bool bulk_stores) const {
    if constexpr (Traits::kDeferQRelease) {
      if (bulk_stores) {
        ring.stored_q = ring.read_q;
        ring.store_reading = true;
        ring.read_q.advance();
        return;
      }
    }
    if constexpr (Traits::kTmaO) free_q();
  }
  /// Traits::kDeferQRelease: once the previous work item's bulk stores have read its Q buffer,
  /// frees the buffer (a no-op where this thread issued none). Called while the next item's first
  /// Q K^T runs (qk), and before an item's own stores (a flag test there, unless the item had no
  /// Q K^T to hide the wait under).
  TESSERA_DEVICE void release_stored_q() const {
    if constexpr (Traits::kDeferQRelease) {
      if (ring.store_reading) {
        tma_store_wait_read<0>();
        smem.q_pipeline().consumer_release(ring.stored_q);
        ring.store_reading = false;
      }
    }
  }

 private:
  /// The work item's query tile into Q buffer ring.fill_q: by TMA where q_tile_by_tma says so
  /// (the other producer threads copy nothing and still arrive on the buffer's barrier as after
  /// their copies), else by cp.async.
  TESSERA_DEVICE void load_q(const Params& p, const PrefillWork& w, T* q_tile) const {
    if constexpr (Traits::kTmaQ) {
      if (q_tile_by_tma<Traits>(p, w.e, w.packed_begin)) {
        load_q_tile_tma<Traits>(p, w.e, w.kv_head, w.packed_begin, q_tile, smem.q_full + ring.fill_q.stage);
        return;
      }
    }
    load_q_tile<Traits>(p, w.e, w.kv_head, w.packed_begin, q_tile, smem.q_rows);
  }

  /// 16-bit K/V's producer steps: K of tile `step` and V of tile step - 1 per step, each copy
  /// issued once its stage is free (by TMA or cp.async, KVTileSource::copy) and its full barrier
  /// completed as stage_completion says.
  TESSERA_DEVICE void produce_copied(const MbarrierPipeline<Traits::kStages>& k_pipe,
                                     const MbarrierPipeline<Traits::kStages>& v_pipe,
                                     const MbarrierPipeline<Traits::kQStages>& q_pipe, int num_kv_tiles) {
    for (int step = 0; step <= num_kv_tiles; ++step) {
      const bool copies_k = step < num_kv_tiles, copies_v = step > 0;
      if (copies_k) {
        kv.resolve(step);
        loader_sync<Traits>();  // the row table, for every copying thread
        k_pipe.producer_acquire(ring.fill_k);
        kv.template copy<KVPart::kK>(step, ring.fill_k.stage);
        copies_issued(k_pipe, ring.fill_k);
      }
      if (copies_v) {
        v_pipe.producer_acquire(ring.fill_v);
        kv.template copy<KVPart::kV>(step - 1, ring.fill_v.stage);
        copies_issued(v_pipe, ring.fill_v);
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
          if (step == 0) q_pipe.producer_arrive(ring.fill_q);
          k_pipe.producer_arrive(ring.fill_k);
          ring.fill_k.advance();
        }
        if (copies_v) {
          cp_async_wait<0>();
          fence_proxy_async_shared();
          v_pipe.producer_arrive(ring.fill_v);
          ring.fill_v.advance();
        }
      }
    }
  }

  /// fp8 KV's producer steps: copies go to the raw stages, whose chunks only their copying thread
  /// reads, so they need no ring stage; a thread waits for a T stage only to convert into it. Each
  /// raw copy flies while the other tensor's stage converts: K(t + 1) is issued right after K(t)
  /// is converted, V(t) right after V(t - 1), so the cp.async groups alternate K, V, K, V and
  /// every wait leaves the newer one in flight. (Resolving t + 1 this early is why the row-table
  /// ring has one more slot: Traits::kRowTables.)
  TESSERA_DEVICE void produce_converted(const MbarrierPipeline<Traits::kStages>& k_pipe,
                                        const MbarrierPipeline<Traits::kStages>& v_pipe,
                                        const MbarrierPipeline<Traits::kQStages>& q_pipe, int num_kv_tiles) {
    static_assert(!kByCopies, "fp8 stages complete after the producer's wait");
    auto copy_k = [&](int tile) {
      kv.resolve(tile);
      loader_sync<Traits>();  // the row table, for every copying thread
      kv.template copy<KVPart::kK>(tile, 0);
      cp_async_commit();
    };
    if (num_kv_tiles > 0) copy_k(0);
    for (int step = 0; step <= num_kv_tiles; ++step) {
      if (step < num_kv_tiles) {
        // In flight: K(step) (with Q before it at step 0), then V(step - 1).
        if (step > 0) {
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        k_pipe.producer_acquire(ring.fill_k);
        kv.template convert_raw<KVPart::kK>(ring.fill_k.stage);
        fence_proxy_async_shared();
        if (step == 0) q_pipe.producer_arrive(ring.fill_q);
        k_pipe.producer_arrive(ring.fill_k);
        ring.fill_k.advance();
        if (step + 1 < num_kv_tiles) copy_k(step + 1);
      }
      if (step > 0) {
        // In flight: V(step - 1), then K(step + 1) where it exists.
        if (step + 1 < num_kv_tiles) {
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        v_pipe.producer_acquire(ring.fill_v);
        kv.template convert_raw<KVPart::kV>(ring.fill_v.stage);
        fence_proxy_async_shared();
        v_pipe.producer_arrive(ring.fill_v);
        ring.fill_v.advance();
      }
      if (step < num_kv_tiles) {
        kv.template copy<KVPart::kV>(step, 0);
        cp_async_commit();
      }
    }
  }

  /// fp8 KV's producer steps where raw stages do not fit (Traits::kConvertInPlace): a tile's
  /// stored K (V) rows are copied into the upper half of its K (V) stage once the stage is free,
  /// and converted in place once they land. Step t issues K(t + 1) first, which waits for the
  /// compute warps' Q K^T of t - 1 (K stages free right after it), so the copy flies while the
  /// producer converts K(t) and V(t - 1); then it issues V(t), whose stage frees after the P V of
  /// t - 2. The cp.async groups go K(t), V(t - 1), K(t + 1): each wait leaves the newer in flight.
  TESSERA_DEVICE void produce_in_place(const MbarrierPipeline<Traits::kStages>& k_pipe,
                                       const MbarrierPipeline<Traits::kStages>& v_pipe,
                                       const MbarrierPipeline<Traits::kQStages>& q_pipe, int num_kv_tiles) {
    static_assert(!kByCopies && Traits::kConvertInPlace, "fp8 stages complete after the producer's conversion");
    // K(t + 1) is issued while K(t) is the stage to fill next (ring.fill_k), so it takes the one
    // after; V(t) is issued once V(t - 1) is filled, into ring.fill_v's stage itself.
    const auto issue_k = [&](int tile, bool ahead) {
      kv.resolve(tile);
      loader_sync<Traits>();  // the row table, for every copying thread
      PipelineState<Traits::kStages> stage = ring.fill_k;
      if (ahead) stage.advance();
      k_pipe.producer_acquire(stage);
      kv.template copy<KVPart::kK>(tile, stage.stage);
      cp_async_commit();
    };
    if (num_kv_tiles > 0) issue_k(0, false);
    for (int step = 0; step <= num_kv_tiles; ++step) {
      const bool next_k = step + 1 < num_kv_tiles;
      if (next_k) issue_k(step + 1, true);
      if (step < num_kv_tiles) {
        cp_async_wait_at_most((step > 0 ? 1 : 0) + (next_k ? 1 : 0));  // K(step) (and Q, before tile 0) has landed
        kv.template convert_in_place<KVPart::kK>(ring.fill_k.stage);
        fence_proxy_async_shared();
        if (step == 0) q_pipe.producer_arrive(ring.fill_q);
        k_pipe.producer_arrive(ring.fill_k);
        ring.fill_k.advance();
      }
      if (step > 0) {
        cp_async_wait_at_most(next_k ? 1 : 0);  // V(step - 1) has landed
        kv.template convert_in_place<KVPart::kV>(ring.fill_v.stage);
        fence_proxy_async_shared();
        v_pipe.producer_arrive(ring.fill_v);
        ring.fill_v.advance();
      }
      if (step < num_kv_tiles) {
        v_pipe.producer_acquire(ring.fill_v);
        kv.template copy<KVPart::kV>(step, ring.fill_v.stage);
        cp_async_commit();
      }
    }
  }

  /// FP8 attention's producer steps: K straight into its stage, V into a raw stage that the
  /// producer threads transpose together into the V stage (a block reads rows that other threads
  /// copied, so every thread's copies must have landed: a loader barrier). kInFlight tiles' copies
  /// fly at a time: step t waits for tile t's (the later ones may still fly), completes K(t) at
  /// once, issues tile t + kInFlight's copies, whose resolve barrier also certifies that every
  /// thread's V(t) has landed, and transposes V(t). (1 to 3 tiles in flight, and V's raw rows
  /// issued before the K stage's wait, measured alike: bench/results/LOG.md.) Raw stage t %
  /// kTransposeStages is free again when tile t + kTransposeStages is copied into it: that copy's
  /// resolve barrier follows every thread's transpose of t. (Tiles are resolved kInFlight ahead,
  /// before V(t)'s stage is acquired: the row-table ring's extra slots, Traits::kRowTables.)
  TESSERA_DEVICE void produce_transposed(const MbarrierPipeline<Traits::kStages>& k_pipe,
                                         const MbarrierPipeline<Traits::kStages>& v_pipe,
                                         const MbarrierPipeline<Traits::kQStages>& q_pipe, int num_kv_tiles) {
    static_assert(!kByCopies, "FP8 attention's stages complete after the producer's wait");
    constexpr int kInFlight = Traits::kTransposeStages - 1;
    static_assert(kInFlight >= 1 && kInFlight <= 3, "raw V stages of the tiles in flight and the one transposed");
    PipelineState<Traits::kStages> k_copy = ring.fill_k;  // the K stage the next copy fills (ahead of fill_k)
    auto issue = [&](int tile) {
      kv.resolve(tile);
      loader_sync<Traits>();  // the row table, for every copying thread
      k_pipe.producer_acquire(k_copy);
      kv.template copy<KVPart::kK>(tile, k_copy.stage);
      k_copy.advance();
      kv.copy_v_raw(tile, tile % Traits::kTransposeStages);
      cp_async_commit();
    };
    for (int tile = 0; tile < kInFlight && tile < num_kv_tiles; ++tile) issue(tile);
    for (int tile = 0; tile < num_kv_tiles; ++tile) {
      // This tile's copies (and Q's, committed before tile 0's); the later tiles' may still fly.
      cp_async_wait_at_most(min(kInFlight - 1, num_kv_tiles - 1 - tile));
      fence_proxy_async_shared();
      if (tile == 0) q_pipe.producer_arrive(ring.fill_q);
      k_pipe.producer_arrive(ring.fill_k);
      ring.fill_k.advance();
      if (tile + kInFlight < num_kv_tiles) {
        issue(tile + kInFlight);  // its barrier: every thread's V rows of this tile have landed
      } else {
        loader_sync<Traits>();
      }
      v_pipe.producer_acquire(ring.fill_v);
      kv.transpose_v(tile % Traits::kTransposeStages, ring.fill_v.stage);
      fence_proxy_async_shared();
      v_pipe.producer_arrive(ring.fill_v);
      ring.fill_v.advance();
    }
  }

  TESSERA_DEVICE void free_q() const {
    smem.q_pipeline().consumer_release(ring.read_q);
    ring.read_q.advance();
  }

  static TESSERA_DEVICE MmaTurns turns() { return MmaTurns{static_cast<int>(threadIdx.x) / (4 * kWarpSize)}; }

  /// After a stage's copies are issued: kByCopies completes its full barrier through them (and
  /// this thread's own arrival, which releases the row table it wrote); kAfterWait closes a
  /// cp.async group, waited for before the arrival.
  TESSERA_DEVICE void copies_issued(const MbarrierPipeline<Traits::kStages>& pipe,
                                    PipelineState<Traits::kStages>& fill) const {
    if constexpr (kByCopies) {
      pipe.producer_arrive(fill);
      pipe.producer_arrive_on_copies(fill);
      fill.advance();
    } else {
      cp_async_commit();
    }
  }
};

}  // namespace kernels
}  // namespace tessera
