// Attention-state merge kernels (docs/design.md §2): two states per row, or a fixed or variable number
// of states per row folded in index order. Memory bound: every thread owns one 16-byte vector of
// head_dim for one (row, head) and streams the states through it.
#pragma once

#include "kernels/common/platform.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/vec.cuh"

namespace tessera {
namespace kernels {

template <typename T>
struct MergeTraits {
  static constexpr int kVecElems = vec_elems<T>();  // elements of head_dim per thread
  static constexpr int kThreadsPerBlock = 256;
  // States loaded before any is folded: several independent 16-byte loads in flight per thread
  // hide DRAM latency without relying on occupancy alone.
  static constexpr int kStatesInFlight = 4;
  static_assert(kVecElems * sizeof(T) == kVecBytes, "one vector per thread");
  static_assert(kThreadsPerBlock % kWarpSize == 0, "whole warps");
  static_assert(kStatesInFlight >= 1 && kStatesInFlight <= 8, "register budget: 8 x 16 B per thread at most");
};

/// Strides (elements) of a state tensor: v[row][state][head][dim], s[row][state][head]. For packed
/// (ragged) states the row stride is unused and state indices are global.
struct StateTensorDesc {
  int64_t v_row_stride;
  int64_t v_state_stride;
  int64_t v_head_stride;
  int64_t s_row_stride;
  int64_t s_state_stride;
  int64_t s_head_stride;
};

template <typename T>
struct MergeStatesParams {
  const T* v;                // [rows, num_states, H, D] or packed [total_states, H, D]
  const float* s;            // [rows, num_states, H] or packed [total_states, H]; base-2 LSE
  StateTensorDesc in;
  const int32_t* indptr;     // [rows + 1] for packed states, nullptr for a fixed count
  int32_t num_states;        // fixed count per row (indptr == nullptr)
  int32_t total_states;      // packed states present; indptr values are clamped to it
  T* v_out;                  // [rows, H, D]
  float* s_out;              // [rows, H] or nullptr
  int64_t out_v_row_stride, out_v_head_stride, out_s_row_stride, out_s_head_stride;
  int32_t rows;
  int32_t num_heads;
  int32_t head_dim;
};

/// The (row, head, 16-byte vector of head_dim) that grid-stride thread index `t` stands for;
/// consecutive threads take consecutive vectors of one head, so warps read contiguous memory.
struct RowHeadVec {
  int64_t row;
  int head;
  int vec;
};
TESSERA_DEVICE RowHeadVec row_head_vec(int64_t t, int num_heads, int vecs_per_head) {
  return {t / (static_cast<int64_t>(vecs_per_head) * num_heads), static_cast<int>((t / vecs_per_head) % num_heads),
          static_cast<int>(t % vecs_per_head)};
}

/// Writes the merged vector, and the LSE from the head's first vector thread.
template <typename T, int N>
TESSERA_DEVICE void store_merged(const OnlineSoftmax<N>& acc, T* v_out, float* s_out, bool owns_lse) {
  Vec<T> out;
  const float inv_d = acc.d > 0.f ? 1.f / acc.d : 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) out.data[i] = from_float<T>(acc.acc[i] * inv_d);
  out.store(v_out);
  if (s_out != nullptr && owns_lse) *s_out = acc.lse();
}

template <typename T>
__global__ void __launch_bounds__(MergeTraits<T>::kThreadsPerBlock)
merge_states_kernel(const MergeStatesParams<T> p) {
  using Traits = MergeTraits<T>;
  constexpr int N = Traits::kVecElems;
  const int vecs_per_head = p.head_dim / N;
  const int64_t total = static_cast<int64_t>(p.rows) * p.num_heads * vecs_per_head;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto [row64, head, vec] = row_head_vec(t, p.num_heads, vecs_per_head);
    const int row = static_cast<int>(row64);

    // First state of this row and how many follow, as offsets into v and s.
    int64_t v_off, s_off;
    int count;
    if (p.indptr != nullptr) {
      // Malformed index arrays are clamped so no load leaves the tensor (docs/design.md §4).
      const int32_t begin = min(max(p.indptr[row], 0), p.total_states);
      const int32_t end = min(max(p.indptr[row + 1], begin), p.total_states);
      v_off = begin * p.in.v_state_stride;
      s_off = begin * p.in.s_state_stride;
      count = end - begin;
    } else {
      v_off = row * p.in.v_row_stride;
      s_off = row * p.in.s_row_stride;
      count = p.num_states;
    }
    const T* v_ptr = p.v + v_off + head * p.in.v_head_stride + vec * N;  // [count] x [N], strided
    const float* s_ptr = p.s + s_off + head * p.in.s_head_stride;       // [count], strided

    OnlineSoftmax<N> acc;
    for (int base = 0; base < count; base += Traits::kStatesInFlight) {
      Vec<T> v_in[Traits::kStatesInFlight];   // [kStatesInFlight] x [N]
      float s_in[Traits::kStatesInFlight];    // [kStatesInFlight]
#pragma unroll
      for (int k = 0; k < Traits::kStatesInFlight; ++k) {
        if (base + k < count) {
          v_in[k].load_stream(v_ptr + (base + k) * p.in.v_state_stride);
          s_in[k] = s_ptr[(base + k) * p.in.s_state_stride];
        }
      }
#pragma unroll
      for (int k = 0; k < Traits::kStatesInFlight; ++k) {
        if (base + k < count) {
          float vf[N];
#pragma unroll
          for (int i = 0; i < N; ++i) vf[i] = to_float(v_in[k].data[i]);
          acc.fold_state(s_in[k], vf);
        }
      }
    }

    store_merged<T, N>(acc, p.v_out + row * p.out_v_row_stride + head * p.out_v_head_stride + vec * N,
                       p.s_out == nullptr ? nullptr : p.s_out + row * p.out_s_row_stride + head * p.out_s_head_stride,
                       vec == 0);
  }
}

template <typename T>
struct MergeStatePairParams {
  const T* v_a;       // [rows, H, D]
  const float* s_a;   // [rows, H]
  const T* v_b;       // [rows, H, D]
  const float* s_b;   // [rows, H]
  T* v_out;           // [rows, H, D]; may alias v_a or v_b
  float* s_out;       // [rows, H] or nullptr; never aliases s_a or s_b
  int64_t v_a_row_stride, v_a_head_stride, v_b_row_stride, v_b_head_stride;
  int64_t s_a_row_stride, s_a_head_stride, s_b_row_stride, s_b_head_stride;
  int64_t out_v_row_stride, out_v_head_stride, out_s_row_stride, out_s_head_stride;
  int32_t rows;
  // nullptr, or a device scalar that lowers `rows` when the kernel runs: a launch captured in a
  // CUDA Graph for the largest batch then merges each replay's rows only (the cascade runtime).
  const int32_t* rows_on_device;
  int32_t num_heads;
  int32_t head_dim;
};

template <typename T>
__global__ void __launch_bounds__(MergeTraits<T>::kThreadsPerBlock)
merge_state_pair_kernel(const MergeStatePairParams<T> p) {
  constexpr int N = MergeTraits<T>::kVecElems;
  const int vecs_per_head = p.head_dim / N;
  const int32_t rows = p.rows_on_device == nullptr ? p.rows : min(max(*p.rows_on_device, 0), p.rows);
  const int64_t total = static_cast<int64_t>(rows) * p.num_heads * vecs_per_head;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto [row, head, vec] = row_head_vec(t, p.num_heads, vecs_per_head);

    Vec<T> a, b;  // [N] each
    a.load_stream(p.v_a + row * p.v_a_row_stride + head * p.v_a_head_stride + vec * N);
    b.load_stream(p.v_b + row * p.v_b_row_stride + head * p.v_b_head_stride + vec * N);
    const float sa = p.s_a[row * p.s_a_row_stride + head * p.s_a_head_stride];
    const float sb = p.s_b[row * p.s_b_row_stride + head * p.s_b_head_stride];

    OnlineSoftmax<N> acc;
    float vf[N];
#pragma unroll
    for (int i = 0; i < N; ++i) vf[i] = to_float(a.data[i]);
    acc.fold_state(sa, vf);
#pragma unroll
    for (int i = 0; i < N; ++i) vf[i] = to_float(b.data[i]);
    acc.fold_state(sb, vf);

    // v_out may alias v_a or v_b: every element is read and written by this thread alone. s_out
    // must not alias s_a or s_b (the host rejects it): the other threads of this head read them.
    store_merged<T, N>(acc, p.v_out + row * p.out_v_row_stride + head * p.out_v_head_stride + vec * N,
                       p.s_out == nullptr ? nullptr : p.s_out + row * p.out_s_row_stride + head * p.out_s_head_stride,
                       vec == 0);
  }
}

}  // namespace kernels
}  // namespace tessera
