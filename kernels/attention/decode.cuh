// CUDA-core decode kernel (docs/design.md §5, "decode"): one query token per request over ragged or
// paged KV, any GQA group size. Decode is memory bound (every K/V byte is used once per query
// head), so the design is about bytes in flight, not FLOPs:
//
// - One CTA per (request, KV head, chunk of the group's query heads): every query head of a KV
//   head reads the same K/V rows, so they share one copy in shared memory and each K/V byte leaves
//   DRAM once (large groups are split into chunks of at most kGroups heads so that per-thread state
//   stays one head; the chunks then re-read K/V, mostly from L2).
// - A "row group" of kThreadsPerRow threads covers one K/V row with one 16-byte vector per thread
//   (HEAD_DIM / 8 of them, rounded up to a power of two); dot products are reduced inside the row
//   group with shuffles.
// - K/V rows are gathered row by row (any page size, including 1 and 3) with 16-byte cp.async
//   into a kStages-deep ring of tiles, kStages - 1 tiles ahead of the computation, so each CTA keeps
//   (kStages - 1) * kStageBytes in flight while it computes. The page-table lookups for the next
//   tile are issued one iteration early so their latency hides behind the computation too.
// - The kGroups row groups of the CTA are split at run time into nh head slots x (kGroups / nh)
//   row slots: each row group keeps one query head's running softmax (max, sum, fp32 accumulator
//   of its 8 elements) over the tile rows of its row slot. The row slots' partial states are merged
//   through shared memory at the end.
//
// Logits are in base 2 (s = q.k * sm_scale_log2); lse is log2(sum 2^s).
#pragma once

#include "kernels/attention/params.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/fp8.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/vec.cuh"

namespace tessera {
namespace kernels {

template <typename T, int HEAD_DIM_, int GROUPS_, int LOAD_ROWS_PER_GROUP_, int STAGES_, typename KVT_ = T>
struct DecodeTraits {
  using DType = T;  // q's and o's; a thread holds one 16-byte vector of T of the query and output
  // K/V as stored: T, or fp8 (e4m3, e5m2), converted to fp32 as a thread reads its elements of a
  // row from shared memory (exact), with K's scale folded into the query and V's into the output.
  using KVStorage = KVT_;
  static constexpr bool kFp8KV = IsFp8<KVT_>::value;
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int HEAD_DIM_VO = HEAD_DIM_;  // k and v rows alike (the configuration table's switches read both)
  static constexpr int kVecElems = vec_elems<T>();               // elements per 16-byte vector of T
  static constexpr int kVecsPerRow = HEAD_DIM / kVecElems;       // 16-byte vectors of a row's data
  // A thread's share of a stored K/V row: its kVecElems elements, 16 bytes (T) or 8 (fp8).
  static constexpr int kKVVecBytes = kVecElems * static_cast<int>(sizeof(KVT_));
  // One row group: a power of two of threads, for the xor-shuffle reductions. A row whose vector
  // count is not one (head_dim 96: 12) gets the next power of two; the extra threads hold zeros
  // (their copies zero-fill, they store nothing), and shared-memory rows are kRowElems wide.
  static constexpr int kThreadsPerRow = kVecsPerRow <= 8 ? 8 : kVecsPerRow <= 16 ? 16 : 32;
  static constexpr int kRowElems = kThreadsPerRow * kVecElems;   // a row in shared memory
  // Row groups per CTA (the configuration table picks them: 8 keeps 128 threads for head_dim 128;
  // head_dim 64 takes 16 so that its CTA still has 128 threads and its tile as many bytes).
  static constexpr int kGroups = GROUPS_;
  static constexpr int kThreads = kGroups * kThreadsPerRow;
  // Rows each row group copies per tile: sized so a stage is about 8 KB for every head dim, which
  // with 3 stages ahead (24 KB per CTA) covers DRAM latency at an SM's share of bandwidth even
  // when a single CTA runs on the SM (the tail of the grid).
  // fp8 rows are half as wide, so they take twice the rows and a stage keeps its bytes.
  static constexpr int kLoadRowsPerGroup = LOAD_ROWS_PER_GROUP_ * (kFp8KV ? 2 : 1);
  static constexpr int kTileRows = kGroups * kLoadRowsPerGroup;  // K/V rows per pipeline stage
  static constexpr int kStages = STAGES_;
  // Rows whose dot products are in flight together: two independent shuffle chains per step.
  static constexpr int kRowsPerStep = 2;
  static constexpr int kStageBytes = 2 * kTileRows * HEAD_DIM * static_cast<int>(sizeof(KVT_));  // K + V

  struct SharedStorage {
    union {
      struct {
        KVT_ k[kStages][kTileRows][kRowElems];  // [kStages][kTileRows][kRowElems], HEAD_DIM of data
        KVT_ v[kStages][kTileRows][kRowElems];  // [kStages][kTileRows][kRowElems]
      } kv;
      // Reused once the pipeline has drained: one partial state per row group.
      struct {
        float acc[kGroups][kRowElems];  // [kGroups][kRowElems] unnormalised sum of 2^(s - m) * v
        float m[kGroups];              // [kGroups] running max
        float d[kGroups];              // [kGroups] sum of 2^(s - m)
      } merge;
    };
    // 0 for rows that are zero-filled: past kv_len or on an out-of-range page.
    uint8_t row_valid[kStages][kTileRows];  // [kStages][kTileRows]
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));

  static_assert(sizeof(T) == 2, "f16 or bf16");
  static_assert(kSameType<KVT_, T> || kFp8KV, "K/V stored as q's type or as fp8");
  static_assert(kVecElems * static_cast<int>(sizeof(T)) == kVecBytes, "one 16-byte vector per thread and row");
  static_assert(HEAD_DIM % kVecElems == 0, "whole vectors per row");
  static_assert(kVecsPerRow <= kThreadsPerRow, "a row group covers its row");
  static_assert(kThreadsPerRow <= kWarpSize && kWarpSize % kThreadsPerRow == 0,
                "a row group lies inside one warp: its reductions are shuffles");
  static_assert((kThreadsPerRow & (kThreadsPerRow - 1)) == 0, "xor-shuffle reduction needs a power of two");
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "whole warps, one CTA");
  static_assert(kTileRows == kGroups * kLoadRowsPerGroup, "every thread copies the same number of vectors");
  static_assert(kStages >= 2, "at least one tile loads while one is computed");
  static_assert(kRowsPerStep >= 1 && kRowsPerStep <= 4, "register budget of the in-flight rows");
  static_assert(sizeof(SharedStorage::merge) <= sizeof(SharedStorage::kv), "the merge reuses the K/V ring");
  static_assert(kSmemBytes <= 227 * 1024, "fits an SM");
};

namespace decode {

/// Ring position of one side of the pipeline (the stage being filled or the one being computed).
template <int kStages>
struct PipelineStage {
  int index = 0;
  TESSERA_DEVICE void advance() { index = index + 1 == kStages ? 0 : index + 1; }
};

/// Lanes of the calling thread's row group, for shuffles that leave the warp's other row groups
/// free to take a different branch (their rows may be masked or their loop shorter).
template <int kThreadsPerRow>
TESSERA_DEVICE uint32_t row_group_mask() {
  if constexpr (kThreadsPerRow == kWarpSize) {
    return 0xffffffffu;
  } else {
    const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
    return ((1u << kThreadsPerRow) - 1u) << (lane & ~(kThreadsPerRow - 1));
  }
}

/// This thread's share of each tile copy: vector `vec` of rows group + j * kGroups. The gather
/// addresses of the next tile are computed (page-table loads issued) one iteration before the copy
/// so their latency overlaps the computation of the current tile.
template <typename Traits, KVFormatKind kFormat, typename Params>
struct KVTileLoader {
  using T = typename Params::KVType;  // as stored
  static constexpr int kRows = Traits::kLoadRowsPerGroup;
  const T* k_head;  // K of this KV head at this thread's vector (element offset within a row)
  const T* v_head;
  int group;
  int vec_elem;
  int64_t k_offset[kRows];  // [kRows] row offsets of the prepared tile
  int64_t v_offset[kRows];  // [kRows]
  bool valid[kRows];        // [kRows]

  bool has_data;  // false for a padding thread of the row group: its copies zero-fill

  TESSERA_DEVICE KVTileLoader(const Params& p, int kv_head, int group_, int vec) : group(group_) {
    vec_elem = vec * Traits::kVecElems;
    has_data = Traits::kVecsPerRow == Traits::kThreadsPerRow || vec < Traits::kVecsPerRow;
    k_head = p.kv.k + kv_head * p.kv.k_head_stride + vec_elem;
    v_head = p.kv.v + kv_head * p.kv.v_head_stride + vec_elem;
  }

  TESSERA_DEVICE void prepare(const Params& p, const RequestExtent& e, int tile) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int32_t pos = tile * Traits::kTileRows + group + j * Traits::kGroups;
      valid[j] = pos < e.kv_len;
      k_offset[j] = 0;
      v_offset[j] = 0;
      if (valid[j]) {
        const KVRow r = kv_row<kFormat>(p, e, pos);
        valid[j] = r.valid;
        k_offset[j] = r.valid ? r.k_offset : 0;
        v_offset[j] = r.valid ? r.v_offset : 0;
      }
    }
  }

  /// Copies the prepared tile into `stage`; rows that are not valid are zero-filled (the source
  /// address is then the head's first row, never read) so masked rows contribute 0 * 0, not NaN.
  TESSERA_DEVICE void issue(typename Traits::SharedStorage& smem, int stage) const {
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int row = group + j * Traits::kGroups;
      if constexpr (Traits::kKVVecBytes == 16) {
        cp_async_16_zfill(&smem.kv.k[stage][row][vec_elem], k_head + k_offset[j], valid[j] && has_data);
        cp_async_16_zfill(&smem.kv.v[stage][row][vec_elem], v_head + v_offset[j], valid[j] && has_data);
      } else {
        static_assert(Traits::kKVVecBytes == 8, "16 bytes (16-bit K/V) or 8 (fp8) per thread and row");
        cp_async_8_zfill(&smem.kv.k[stage][row][vec_elem], k_head + k_offset[j], valid[j] && has_data);
        cp_async_8_zfill(&smem.kv.v[stage][row][vec_elem], v_head + v_offset[j], valid[j] && has_data);
      }
      if (vec_elem == 0) smem.row_valid[stage][row] = valid[j];
    }
  }
};

/// The row group's reduction of R dot products, masked rows to -inf, and one online-softmax
/// update with the rows' values value(r, i).
template <typename Traits, int R, typename Value>
TESSERA_DEVICE void fold_rows(const typename Traits::SharedStorage& smem, int stage, int first, int stride,
                              uint32_t mask, float (&s)[R], OnlineSoftmax<Traits::kVecElems>& state, Value&& value) {
#pragma unroll
  for (int offset = Traits::kThreadsPerRow / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] += __shfl_xor_sync(mask, s[r], offset);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (!smem.row_valid[stage][first + r * stride]) s[r] = -INFINITY;
  }
  state.fold_logits(s, value);
}

/// compute_rows over fp8 K/V: a thread's 8 stored elements (one 8-byte load) as fp32.
template <typename Traits, int R>
TESSERA_DEVICE void compute_fp8_rows(const typename Traits::SharedStorage& smem, int stage, int first, int stride,
                                     int vec_elem, uint32_t mask, const float (&q)[Traits::kVecElems],
                                     OnlineSoftmax<Traits::kVecElems>& state) {
  using F8 = typename Traits::KVStorage;
  constexpr int N = Traits::kVecElems;
  static_assert(N == 8, "8 elements, two 32-bit words of fp8, per thread and row");
  float v[R][N];  // [R][N]
  float s[R];     // [R]
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = first + r * stride;
    const uint2 k_raw = *reinterpret_cast<const uint2*>(&smem.kv.k[stage][row][vec_elem]);
    const uint2 v_raw = *reinterpret_cast<const uint2*>(&smem.kv.v[stage][row][vec_elem]);
    const uint32_t k_words[2] = {k_raw.x, k_raw.y}, v_words[2] = {v_raw.x, v_raw.y};
    s[r] = 0.f;
#pragma unroll
    for (int w = 0; w < 2; ++w) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 4 * w + 2 * h;  // element index of the pair
        const float2 kf = fp8x2_to_float2<F8>(static_cast<uint16_t>(k_words[w] >> (16 * h)));
        const float2 vf = fp8x2_to_float2<F8>(static_cast<uint16_t>(v_words[w] >> (16 * h)));
        s[r] = fmaf(q[i + 1], kf.y, fmaf(q[i], kf.x, s[r]));  // elements in order, as the 16-bit path
        v[r][i] = vf.x;
        v[r][i + 1] = vf.y;
      }
    }
  }
  fold_rows<Traits, R>(smem, stage, first, stride, mask, s, state, [&](int r, int i) { return v[r][i]; });
}

/// Computes R rows first, first + stride, ... of one stage for one query head: dot products with
/// the (pre-scaled) query, reduced over the row group, then one online-softmax update.
template <typename Traits, int R, typename T>
TESSERA_DEVICE void compute_rows(const typename Traits::SharedStorage& smem, int stage, int first, int stride,
                                 int vec_elem, uint32_t mask, const float (&q)[Traits::kVecElems],
                                 OnlineSoftmax<Traits::kVecElems>& state) {
  constexpr int N = Traits::kVecElems;
  if constexpr (Traits::kFp8KV) {
    compute_fp8_rows<Traits, R>(smem, stage, first, stride, vec_elem, mask, q, state);
  } else {
    Vec<T> k[R];  // [R][N]
    Vec<T> v[R];  // [R][N]
    float s[R];   // [R]
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = first + r * stride;
      k[r].load(&smem.kv.k[stage][row][vec_elem]);
      v[r].load(&smem.kv.v[stage][row][vec_elem]);
      s[r] = 0.f;
#pragma unroll
      for (int i = 0; i < N; ++i) s[r] = fmaf(q[i], to_float(k[r].data[i]), s[r]);
    }
    fold_rows<Traits, R>(smem, stage, first, stride, mask, s, state, [&](int r, int i) { return to_float(v[r].data[i]); });
  }
}

/// A thread's place in a decode CTA: its row group and vector within the row, and the (query head,
/// row slot) its row group computes. A CTA's row groups share its heads' KV rows: with nh head
/// slots, group r computes head slot r % nh over every row_slots-th KV row starting at r / nh.
struct ThreadPlace {
  int group;      // row group
  int vec;        // vector within the row
  int vec_elem;   // first element of the thread's vector
  int nh;         // head slots of the CTA
  int row_slots;  // row groups per head slot
  int head_slot;
  int row_slot;
  bool computes;  // false: row groups past nh * row_slots (nh not dividing kGroups), copies only
  bool has_data;  // false: a padding thread of the row group (vec past the row's data), zeros throughout
};

template <typename Traits>
TESSERA_DEVICE ThreadPlace thread_place(int nh) {
  ThreadPlace t;
  t.group = static_cast<int>(threadIdx.x) / Traits::kThreadsPerRow;
  t.vec = static_cast<int>(threadIdx.x) % Traits::kThreadsPerRow;
  t.vec_elem = t.vec * Traits::kVecElems;
  t.nh = nh;
  t.row_slots = Traits::kGroups / nh;
  t.head_slot = t.group % nh;
  t.row_slot = t.group / nh;
  t.computes = t.row_slot < t.row_slots;
  t.has_data = Traits::kVecsPerRow == Traits::kThreadsPerRow || t.vec < Traits::kVecsPerRow;
  return t;
}

/// The thread's query elements [N], times sm_scale * log2(e) (and fp8 K's scale: every logit is
/// q . k x k_scale).
template <typename Traits, typename Params, int N>
TESSERA_DEVICE void load_query(const Params& p, int b, int kv_head, int qo_head, const ThreadPlace& t, float (&q)[N]) {
  using QT = typename Params::QType;
  Vec<QT> qv;
  if (t.has_data) {
    qv.load(p.q.data + static_cast<int64_t>(b) * p.q.row_stride + static_cast<int64_t>(qo_head) * p.q.head_stride +
            t.vec_elem);
  }
  const float q_scale = Traits::kFp8KV ? p.sm_scale_log2 * p.kv_scales.k_scale(kv_head) : p.sm_scale_log2;
#pragma unroll
  for (int i = 0; i < N; ++i) q[i] = t.has_data ? to_float(qv.data[i]) * q_scale : 0.f;
}

/// The mainloop: every KV tile of the request through the cp.async ring, each row group folding
/// its rows into its head's running state (returned: one query head over the rows this row group
/// has seen).
template <typename Traits, KVFormatKind kFormat, typename Params, int N>
TESSERA_DEVICE OnlineSoftmax<N> fold_kv_tiles(const Params& p, const RequestExtent& e, int kv_head,
                                              const ThreadPlace& t, typename Traits::SharedStorage& smem,
                                              const float (&q)[N]) {
  using KVT = typename Params::KVType;
  constexpr int kStages = Traits::kStages;
  constexpr int kTileRows = Traits::kTileRows;
  constexpr int kStep = Traits::kRowsPerStep;
  const int num_tiles = ceil_div(max(e.kv_len, 0), kTileRows);
  const uint32_t mask = row_group_mask<Traits::kThreadsPerRow>();
  KVTileLoader<Traits, kFormat, Params> loader(p, kv_head, t.group, t.vec);
  OnlineSoftmax<N> state;
  PipelineStage<kStages> load_stage, compute_stage;

  // Prologue: kStages - 1 tiles in flight. Every iteration commits a group, empty or not, so the
  // wait count below always refers to the tile about to be computed.
  loader.prepare(p, e, 0);
#pragma unroll
  for (int tile = 0; tile < kStages - 1; ++tile) {
    if (tile < num_tiles) loader.issue(smem, load_stage.index);
    cp_async_commit();
    load_stage.advance();
    loader.prepare(p, e, tile + 1);
  }

  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait<kStages - 2>();
    // Tile t is visible to every thread, and every thread is done with tile t - 1, whose stage the
    // copy below refills.
    __syncthreads();
    const int next = tile + kStages - 1;
    if (next < num_tiles) loader.issue(smem, load_stage.index);
    cp_async_commit();
    load_stage.advance();
    loader.prepare(p, e, next + 1);

    if (t.computes) {
      int row = t.row_slot;
      for (; row + (kStep - 1) * t.row_slots < kTileRows; row += kStep * t.row_slots) {
        compute_rows<Traits, kStep, KVT>(smem, compute_stage.index, row, t.row_slots, t.vec_elem, mask, q, state);
      }
      for (; row < kTileRows; row += t.row_slots) {
        compute_rows<Traits, 1, KVT>(smem, compute_stage.index, row, t.row_slots, t.vec_elem, mask, q, state);
      }
    }
    compute_stage.advance();
  }
  return state;
}

/// The epilogue's first step: row slots past the first publish their states in shared memory (the
/// K/V ring becomes the exchange buffer). Every thread calls it (barriers).
template <typename Traits, int N>
TESSERA_DEVICE void publish_row_slots(typename Traits::SharedStorage& smem, const ThreadPlace& t,
                                      const OnlineSoftmax<N>& state) {
  cp_async_wait<0>();
  __syncthreads();
  if (t.computes && t.row_slot > 0) {
    float* dst = &smem.merge.acc[t.group][t.vec_elem];
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      *reinterpret_cast<float4*>(dst + i) = make_float4(state.acc[i], state.acc[i + 1], state.acc[i + 2], state.acc[i + 3]);
    }
    if (t.vec == 0) {
      smem.merge.m[t.group] = state.m;
      smem.merge.d[t.group] = state.d;
    }
  }
  __syncthreads();
}

/// The second: the first slot of each head sums the head's row slots in slot order (an empty slot
/// has m = -inf, acc = 0).
template <typename Traits, int N>
TESSERA_DEVICE PartialStateSum<N> sum_row_slots(const typename Traits::SharedStorage& smem, const ThreadPlace& t,
                                                const OnlineSoftmax<N>& state) {
  PartialStateSum<N> sum;
  sum.add_max(state.m);
  for (int r = 1; r < t.row_slots; ++r) sum.add_max(smem.merge.m[t.head_slot + r * t.nh]);
  sum.add(state.m, state.d, [&](int i) { return state.acc[i]; });
  for (int r = 1; r < t.row_slots; ++r) {
    const int other = t.head_slot + r * t.nh;
    float acc[N];  // [N] the other slot's elements, in 16-byte loads
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 a = *reinterpret_cast<const float4*>(&smem.merge.acc[other][t.vec_elem + i]);
      acc[i] = a.x;
      acc[i + 1] = a.y;
      acc[i + 2] = a.z;
      acc[i + 3] = a.w;
    }
    sum.add(smem.merge.m[other], smem.merge.d[other], [&](int i) { return acc[i]; });
  }
  return sum;
}

/// The third: the head's normalised output (fp8 V's scale folded in: every
/// value is code x v_scale) and its LSE.
template <typename Traits, typename Params, int N>
TESSERA_DEVICE void store_output(const Params& p, int b, int kv_head, int qo_head, const ThreadPlace& t,
                                 const PartialStateSum<N>& sum) {
  using OT = typename Params::OType;
  const float inv_d = Traits::kFp8KV ? sum.inv_sum() * p.kv_scales.v_scale(kv_head) : sum.inv_sum();
  Vec<OT> out;
#pragma unroll
  for (int i = 0; i < N; ++i) out.data[i] = from_float<OT>(sum.acc[i] * inv_d);
  if (t.has_data) {
    out.store(p.o.data + static_cast<int64_t>(b) * p.o.row_stride + static_cast<int64_t>(qo_head) * p.o.head_stride +
              t.vec_elem);
  }
  if (p.o.lse != nullptr && t.vec == 0) {
    p.o.lse[static_cast<int64_t>(b) * p.o.lse_row_stride + static_cast<int64_t>(qo_head) * p.o.lse_head_stride] =
        sum.lse();
  }
}

}  // namespace decode

/// Grid: (batch_size, num_kv_heads, head chunks), where head chunks = ceil(group_size / kGroups);
/// block: Traits::kThreads; dynamic shared memory: Traits::kSmemBytes. p.qo_indptr must be nullptr:
/// request b's query is row b of q. Params: an AttentionParams whose KV type is Traits::DType.
template <typename Traits, KVFormatKind kFormat, typename Params>
__global__ void __launch_bounds__(Traits::kThreads) batch_decode_kernel(const Params p) {
  using QT = typename Params::QType;
  using KVT = typename Params::KVType;
  using OT = typename Params::OType;
  static_assert(kSameType<KVT, typename Traits::KVStorage>, "the shared-memory ring holds K/V as they are in memory");
  // A thread's query vector lines up with its K/V elements: the same kVecElems elements of a row.
  static_assert(kSameType<QT, typename Traits::DType>, "the decode kernel needs q of the traits' element type");
  static_assert(vec_elems<OT>() == Traits::kVecElems, "a thread stores its output elements as one 16-byte vector");
  static_assert(kInt32Indices<Params>, "the decode kernel takes int32 index arrays (int32 KV positions)");
  constexpr int N = Traits::kVecElems;
  using SharedStorage = typename Traits::SharedStorage;
  extern __shared__ __align__(16) unsigned char decode_smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(decode_smem_raw);

  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int kv_head = static_cast<int>(blockIdx.y);
  const int g = p.group_size;
  const int chunk_heads = ceil_div(g, static_cast<int>(gridDim.z));
  const int head_begin = static_cast<int>(blockIdx.z) * chunk_heads;  // within the group
  const int nh = min(chunk_heads, g - head_begin);                    // head slots of this CTA
  if (nh <= 0) return;  // CTA-uniform, before any barrier
  const decode::ThreadPlace t = decode::thread_place<Traits>(nh);
  const int qo_head = kv_head * g + head_begin + t.head_slot;

  float q[N];  // [N] this thread's query elements, scaled
  decode::load_query<Traits>(p, b, kv_head, qo_head, t, q);
  const RequestExtent e = KVFormat<kFormat>::request_extent(p, b);
  const OnlineSoftmax<N> state = decode::fold_kv_tiles<Traits, kFormat>(p, e, kv_head, t, smem, q);
  decode::publish_row_slots<Traits>(smem, t, state);
  if (!t.computes || t.row_slot > 0) return;
  decode::store_output<Traits>(p, b, kv_head, qo_head, t, decode::sum_row_slots<Traits>(smem, t, state));
}

}  // namespace kernels
}  // namespace tessera
