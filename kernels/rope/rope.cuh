// Standalone rotary position embedding (RoPE) of queries and keys: FlashInfer's apply_rope family
// (tessera/rope.h). Memory bound: every element of q and k is read once and written once.
//
// A thread owns one unit of one packed row and one group of heads: a rotary unit is
// kRopePairsPerThread consecutive rotation pairs, a copy unit kRopeCopyElems consecutive elements
// of the dims past rotary_dim (out of place only: in place they already hold their values). The
// rotation angles depend on the row's position and the pair, not on the head, so a thread computes
// (or reads) its cos/sin once and then walks the heads of its group, q's heads first and k's after
// them; the host sizes the groups so that the grid still fills the GPU when the batch is small.
//
// Pair i of a head is (x[i], x[i + rotary_dim/2]) ("rotate half", GPT-NeoX / Llama) or, with
// kInterleave, (x[2i], x[2i+1]) (GPT-J). It is rotated by the angle theta_i(pos):
//   (x, y) -> (x cos - y sin, y cos + x sin)
// computed in fp32 from detail::rope_frequency (the fused RoPE of the attention variants, so the
// two agree) or read from a float32 cos/sin table (kCosSinCache: row pos holds cos_i at [i] and
// sin_i at [rotary_dim/2 + i]). A row whose position cannot be resolved (it lies past the indptr's
// last request, or outside the table) is rotated by angle 0: written unchanged.
//
// kVectorized moves 16-byte vectors (every pointer and stride 16-byte aligned, rotary_dim a
// multiple of 16); otherwise the same units move one element at a time, for any even rotary_dim
// and any alignment.
#pragma once

#include "kernels/attention/variants.cuh"
#include "kernels/common/indptr.cuh"
#include "kernels/common/platform.cuh"
#include "kernels/common/vec.cuh"

namespace tessera {
namespace kernels {

/// Rotation pairs per rotary unit: one 16-byte vector of each half (rotate-half) or two vectors of
/// interleaved pairs, for 16-bit elements.
constexpr int kRopePairsPerThread = 8;
/// Elements per copy unit: one 16-byte vector of 16-bit elements.
constexpr int kRopeCopyElems = 8;
constexpr int kRopeThreadsPerBlock = 256;
/// Heads a thread loads before it stores any: the bytes each thread keeps in flight.
constexpr int kRopeHeadsInFlight = 2;
static_assert(kRopeThreadsPerBlock % kWarpSize == 0, "whole warps");

/// Where a row's position comes from.
enum class RopePositionSource : int32_t {
  kIndptrOffsets = 0,  ///< row r of request b (indptr[b] <= r < indptr[b+1]): offsets[b] + r - indptr[b]
  kPosIdsI32 = 1,      ///< pos_ids[r], int32
  kPosIdsI64 = 2,      ///< pos_ids[r], int64
};

template <typename T>
struct RopeParams {
  const T* q;   // [nnz, num_q_heads, head_dim]
  const T* k;   // [nnz, num_k_heads, head_dim]
  T* q_out;     // [nnz, num_q_heads, head_dim]; q itself in place
  T* k_out;     // [nnz, num_k_heads, head_dim]; k itself in place
  // Strides in elements; the last dimension is contiguous.
  int64_t q_row_stride, q_head_stride, k_row_stride, k_head_stride;
  int64_t q_out_row_stride, q_out_head_stride, k_out_row_stride, k_out_head_stride;
  int32_t nnz;
  int32_t num_q_heads;
  int32_t num_k_heads;
  int32_t head_dim;
  int32_t rotary_dim;        // even, <= head_dim
  int32_t num_rotary_units;  // per row and head group: ceil(rotary_dim / 2 / kRopePairsPerThread)
  int32_t num_copy_units;    // per row and head group: ceil((head_dim - rotary_dim) / kRopeCopyElems); 0 in place
  int32_t heads_per_group;   // heads (q's then k's, counted together) one thread walks
  int32_t num_head_groups;   // ceil((num_q_heads + num_k_heads) / heads_per_group)

  RopePositionSource position_source;
  const int32_t* indptr;   // [batch_size + 1] (kIndptrOffsets)
  const int32_t* offsets;  // [batch_size] (kIndptrOffsets)
  int32_t batch_size;
  const void* pos_ids;     // [nnz], int32 or int64 (kPosIdsI32, kPosIdsI64)

  // Computed angles: rope_kind, rope_log2_theta, rope_rcp_scale and the llama31_* fields are read
  // (detail::rope_frequency with head_dim = rotary_dim); the angle of pair i at position pos is
  // pos * rope_rcp_scale * frequency(i).
  VariantParams frequencies;
  // Tabled angles (kCosSinCache).
  const float* cos_sin_cache;  // [cache_rows, rotary_dim]
  int64_t cache_row_stride;
  int64_t cache_rows;
};

/// The position of packed row `row`; false when it has none (past the indptr's last request).
template <typename T>
TESSERA_DEVICE bool rope_position(const RopeParams<T>& p, int32_t row, int64_t& pos) {
  switch (p.position_source) {
    case RopePositionSource::kPosIdsI32: pos = static_cast<const int32_t*>(p.pos_ids)[row]; return true;
    case RopePositionSource::kPosIdsI64: pos = static_cast<const int64_t*>(p.pos_ids)[row]; return true;
    case RopePositionSource::kIndptrOffsets: break;
  }
  const int32_t b = find_request(p.indptr, p.batch_size, row);
  if (b < 0) return false;
  pos = static_cast<int64_t>(p.offsets[b]) + (row - p.indptr[b]);
  return true;
}

/// cos and sin of the angles of pairs first_pair .. first_pair + kRopePairsPerThread - 1 of `row`
/// (angle 0 for pairs past rotary_dim / 2 and for rows without a position).
template <bool kCosSinCache, typename T>
TESSERA_DEVICE void rope_angles(const RopeParams<T>& p, int32_t row, int first_pair,
                                float (&cos_a)[kRopePairsPerThread], float (&sin_a)[kRopePairsPerThread]) {
  const int half = p.rotary_dim / 2;
  int64_t pos = 0;
  bool valid = rope_position(p, row, pos);
  if constexpr (kCosSinCache) valid = valid && pos >= 0 && pos < p.cache_rows;
  const float* table = kCosSinCache && valid ? p.cos_sin_cache + pos * p.cache_row_stride : nullptr;
  // The fp32 position times the scale first, as the fused RoPE does (detail::rope_rotate).
  const float scaled_pos = static_cast<float>(pos) * p.frequencies.rope_rcp_scale;
#pragma unroll
  for (int j = 0; j < kRopePairsPerThread; ++j) {
    const int i = first_pair + j;
    cos_a[j] = 1.f;
    sin_a[j] = 0.f;
    if (!valid || i >= half) continue;
    if constexpr (kCosSinCache) {
      cos_a[j] = table[i];
      sin_a[j] = table[half + i];
    } else {
      sincosf(scaled_pos * detail::rope_frequency(p.frequencies, i, p.rotary_dim), &sin_a[j], &cos_a[j]);
    }
  }
}

/// The rotation pairs of one rotary unit of one head, as floats: x[j], y[j] are pair first_pair + j.
template <typename T, bool kInterleave, bool kVectorized>
struct RopePairs {
  static_assert(sizeof(T) == 2 && vec_elems<T>() == kRopePairsPerThread, "16-bit elements, 8 to a vector");
  float x[kRopePairsPerThread];
  float y[kRopePairsPerThread];

  /// Element offsets of pair i within a head.
  static TESSERA_DEVICE int x_index(int i, int half) { return kInterleave ? 2 * i : i; }
  static TESSERA_DEVICE int y_index(int i, int half) { return kInterleave ? 2 * i + 1 : i + half; }

  TESSERA_DEVICE void load(const T* head, int first_pair, int half) {
    if constexpr (kVectorized) {
      Vec<T> v[2];  // rotate-half: [0] the x half, [1] the y half; interleaved: 16 consecutive elements
      if constexpr (kInterleave) {
        v[0].load_stream(head + 2 * first_pair);
        v[1].load_stream(head + 2 * first_pair + Vec<T>::kElems);
      } else {
        v[0].load_stream(head + first_pair);
        v[1].load_stream(head + half + first_pair);
      }
#pragma unroll
      for (int j = 0; j < kRopePairsPerThread; ++j) {
        if constexpr (kInterleave) {
          x[j] = to_float(v[(2 * j) / Vec<T>::kElems].data[(2 * j) % Vec<T>::kElems]);
          y[j] = to_float(v[(2 * j) / Vec<T>::kElems].data[(2 * j) % Vec<T>::kElems + 1]);
        } else {
          x[j] = to_float(v[0].data[j]);
          y[j] = to_float(v[1].data[j]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kRopePairsPerThread; ++j) {
        const int i = first_pair + j;
        x[j] = y[j] = 0.f;
        if (i >= half) continue;
        x[j] = to_float(head[x_index(i, half)]);
        y[j] = to_float(head[y_index(i, half)]);
      }
    }
  }

  TESSERA_DEVICE void store(T* head, int first_pair, int half) const {
    if constexpr (kVectorized) {
      Vec<T> v[2];
#pragma unroll
      for (int j = 0; j < kRopePairsPerThread; ++j) {
        if constexpr (kInterleave) {
          v[(2 * j) / Vec<T>::kElems].data[(2 * j) % Vec<T>::kElems] = from_float<T>(x[j]);
          v[(2 * j) / Vec<T>::kElems].data[(2 * j) % Vec<T>::kElems + 1] = from_float<T>(y[j]);
        } else {
          v[0].data[j] = from_float<T>(x[j]);
          v[1].data[j] = from_float<T>(y[j]);
        }
      }
      if constexpr (kInterleave) {
        v[0].store(head + 2 * first_pair);
        v[1].store(head + 2 * first_pair + Vec<T>::kElems);
      } else {
        v[0].store(head + first_pair);
        v[1].store(head + half + first_pair);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kRopePairsPerThread; ++j) {
        const int i = first_pair + j;
        if (i >= half) continue;
        head[x_index(i, half)] = from_float<T>(x[j]);
        head[y_index(i, half)] = from_float<T>(y[j]);
      }
    }
  }

  TESSERA_DEVICE void rotate(const float (&cos_a)[kRopePairsPerThread], const float (&sin_a)[kRopePairsPerThread]) {
#pragma unroll
    for (int j = 0; j < kRopePairsPerThread; ++j) {
      const float xr = x[j] * cos_a[j] - y[j] * sin_a[j];
      y[j] = y[j] * cos_a[j] + x[j] * sin_a[j];
      x[j] = xr;
    }
  }
};

/// Head `h` of the q heads followed by the k heads: its input and output rows of packed row `row`.
template <typename T>
TESSERA_DEVICE void rope_head(const RopeParams<T>& p, int32_t row, int h, const T*& in, T*& out) {
  if (h < p.num_q_heads) {
    in = p.q + row * p.q_row_stride + h * p.q_head_stride;
    out = p.q_out + row * p.q_out_row_stride + h * p.q_out_head_stride;
  } else {
    h -= p.num_q_heads;
    in = p.k + row * p.k_row_stride + h * p.k_head_stride;
    out = p.k_out + row * p.k_out_row_stride + h * p.k_out_head_stride;
  }
}

template <typename T, bool kInterleave, bool kCosSinCache, bool kVectorized>
__global__ void __launch_bounds__(kRopeThreadsPerBlock) apply_rope_kernel(const RopeParams<T> p) {
  const int units_per_row = p.num_rotary_units + p.num_copy_units;
  const int total_heads = p.num_q_heads + p.num_k_heads;
  const int half = p.rotary_dim / 2;
  const int64_t total = static_cast<int64_t>(p.nnz) * p.num_head_groups * units_per_row;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // Units fastest: consecutive threads cover consecutive bytes of one row's heads.
    const int unit = static_cast<int>(t % units_per_row);
    const int64_t row_group = t / units_per_row;
    const int group = static_cast<int>(row_group % p.num_head_groups);
    const int32_t row = static_cast<int32_t>(row_group / p.num_head_groups);
    const int head_begin = group * p.heads_per_group;
    const int head_end = min(head_begin + p.heads_per_group, total_heads);

    if (unit < p.num_rotary_units) {
      const int first_pair = unit * kRopePairsPerThread;
      float cos_a[kRopePairsPerThread], sin_a[kRopePairsPerThread];
      rope_angles<kCosSinCache>(p, row, first_pair, cos_a, sin_a);
      // kRopeHeadsInFlight heads loaded before any is stored: in place, a store may alias a later
      // load as far as the compiler knows, so it would not hoist the loads itself.
      for (int h = head_begin; h < head_end; h += kRopeHeadsInFlight) {
        RopePairs<T, kInterleave, kVectorized> pairs[kRopeHeadsInFlight];
        T* out[kRopeHeadsInFlight];
#pragma unroll
        for (int u = 0; u < kRopeHeadsInFlight; ++u) {
          if (h + u >= head_end) break;
          const T* in;
          rope_head(p, row, h + u, in, out[u]);
          pairs[u].load(in, first_pair, half);
        }
#pragma unroll
        for (int u = 0; u < kRopeHeadsInFlight; ++u) {
          if (h + u >= head_end) break;
          pairs[u].rotate(cos_a, sin_a);
          pairs[u].store(out[u], first_pair, half);
        }
      }
    } else {
      // Dims past rotary_dim, out of place: copied bit for bit.
      const int d = p.rotary_dim + (unit - p.num_rotary_units) * kRopeCopyElems;
      for (int h = head_begin; h < head_end; ++h) {
        const T* in;
        T* out;
        rope_head(p, row, h, in, out);
        if constexpr (kVectorized) {
          Vec<T> v;
          v.load_stream(in + d);
          v.store(out + d);
        } else {
          const int end = min(d + kRopeCopyElems, p.head_dim);
          for (int e = d; e < end; ++e) out[e] = in[e];
        }
      }
    }
  }
}

}  // namespace kernels
}  // namespace tessera
