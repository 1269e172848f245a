// Rotary position embedding (RoPE) applied to queries and keys on their own, before they reach an
// attention kernel or a KV cache: FlashInfer's flashinfer.rope functions (apply_rope,
// apply_rope_pos_ids, apply_llama31_rope, apply_rope_with_cos_sin_cache and their _inplace forms).
// The attention kernels can instead rotate q and k as they load them (tessera/variant.h,
// RopeOptions); both compute the frequencies with the same device code.
//
// Common conventions
// - q: [nnz, num_q_heads, head_dim], k: [nnz, num_k_heads, head_dim], f16 or bf16 (the same
//   dtype), on the current CUDA device; any number of heads in each (0 included), any head_dim >= 2.
//   Any row and head strides with a contiguous last dimension (e.g. q and k as slices of one packed
//   qkv projection). The rotation is computed in fp32 and rounded once to the dtype.
// - Rotation: the first rotary_dim dims of every head form rotary_dim / 2 pairs; pair i is
//   (x[i], x[i + rotary_dim/2]) ("rotate half", GPT-NeoX / Llama; interleave = false) or
//   (x[2i], x[2i+1]) (GPT-J; interleave = true), and is rotated by the angle a_i(pos) of the
//   row's position: (x, y) -> (x cos a - y sin a, y cos a + x sin a). The remaining
//   head_dim - rotary_dim dims are copied unchanged.
// - Angles: a_i(pos) = pos / rope_scale * rope_theta^(-2i / rotary_dim) radians (apply_rope*);
//   Llama 3.1 smooths the frequencies instead (apply_llama31_rope*, see ApplyLlama31RopeOptions);
//   apply_rope_with_cos_sin_cache reads cos a_i and sin a_i from a table.
// - Positions: from indptr and offsets (token j of request b, packed at row indptr[b] + j, sits at
//   position offsets[b] + j), or per row from pos_ids / positions (i32 or i64). All index arrays
//   are 1-D, contiguous, in device memory on q's device.
// - Out of place: q_rope and k_rope (q's and k's shapes and dtype, any strides with a contiguous
//   last dimension) get the result; each may be the input itself (same data and strides: in
//   place) but must not otherwise overlap it. The _inplace functions write q and k.
// - Work is queued on `stream` (nullptr: the legacy default stream); nothing synchronises.
// - Errors: tessera::Error (kInvalidArgument) naming the argument, its value and what was
//   expected. Every argument is checked on the host before the device is touched; in checked
//   mode (tessera/validate.h) the index arrays are also read and checked (indptr, and the cache
//   positions against the table).
#pragma once

#include <cstdint>

#include "tessera/export.h"
#include "tessera/stream.h"
#include "tessera/tensor.h"

namespace tessera {

/// Arguments of apply_rope and apply_rope_pos_ids (FlashInfer's names and defaults).
struct ApplyRopeOptions {
  /// Leading dims of each head that are rotated: even, in [2, head_dim]. 0 (the default): head_dim.
  int64_t rotary_dim = 0;
  /// false: pair i is (x[i], x[i + rotary_dim/2]); true: pair i is (x[2i], x[2i+1]).
  bool interleave = false;
  /// > 0, finite: positions are divided by it (linear position interpolation).
  double rope_scale = 1.0;
  /// > 0, finite: the base of the frequencies, rope_theta^(-2i / rotary_dim) radians per position.
  double rope_theta = 1e4;
};

/// Arguments of apply_llama31_rope and apply_llama31_rope_pos_ids (FlashInfer's names and
/// defaults). Frequencies f_i = rope_theta^(-2i / rotary_dim) with wavelength w_i = 2 pi / f_i are
/// smoothed as Llama 3.1 does: w_i > old_context_len / low_freq_factor: f_i / rope_scale;
/// w_i < old_context_len / high_freq_factor: f_i unchanged; in between (1 - s) f_i / rope_scale +
/// s f_i with s = (old_context_len / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor).
/// Positions are used as they are (rope_scale is the smoothing factor, not a position divisor).
struct ApplyLlama31RopeOptions {
  /// As in ApplyRopeOptions.
  int64_t rotary_dim = 0;
  bool interleave = false;
  /// > 0, finite: the factor long wavelengths are stretched by (Llama 3.1's "factor").
  double rope_scale = 8.0;
  /// > 0, finite.
  double rope_theta = 5e5;
  /// 0 < low_freq_factor < high_freq_factor, finite.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  /// > 0, finite: the context length (tokens) the model was first trained for.
  double old_context_len = 8192.0;
};

/// Rotates q and k at the positions of a ragged batch into q_rope and k_rope.
/// indptr: i32 [batch_size + 1], indptr[0] == 0, non-decreasing, indptr[batch_size] == nnz; row r
///   with indptr[b] <= r < indptr[b+1] belongs to request b. A row past indptr[batch_size] (a
///   malformed indptr) is written unrotated.
/// offsets: i32 [batch_size]: the position of request b's first row.
TESSERA_API void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                            const TensorView& k_rope, const TensorView& indptr, const TensorView& offsets,
                            const ApplyRopeOptions& options = {}, StreamHandle stream = nullptr);
/// apply_rope writing q and k.
TESSERA_API void apply_rope_inplace(const TensorView& q, const TensorView& k, const TensorView& indptr,
                                    const TensorView& offsets, const ApplyRopeOptions& options = {},
                                    StreamHandle stream = nullptr);

/// Rotates row r of q and k at position pos_ids[r]. pos_ids: i32 or i64 [nnz], any values.
TESSERA_API void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                    const TensorView& k_rope, const TensorView& pos_ids,
                                    const ApplyRopeOptions& options = {}, StreamHandle stream = nullptr);
TESSERA_API void apply_rope_pos_ids_inplace(const TensorView& q, const TensorView& k, const TensorView& pos_ids,
                                            const ApplyRopeOptions& options = {}, StreamHandle stream = nullptr);

/// apply_rope with Llama 3.1 frequencies (ApplyLlama31RopeOptions).
TESSERA_API void apply_llama31_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                    const TensorView& k_rope, const TensorView& indptr, const TensorView& offsets,
                                    const ApplyLlama31RopeOptions& options = {}, StreamHandle stream = nullptr);
TESSERA_API void apply_llama31_rope_inplace(const TensorView& q, const TensorView& k, const TensorView& indptr,
                                            const TensorView& offsets, const ApplyLlama31RopeOptions& options = {},
                                            StreamHandle stream = nullptr);

/// apply_rope_pos_ids with Llama 3.1 frequencies (ApplyLlama31RopeOptions).
TESSERA_API void apply_llama31_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                            const TensorView& k_rope, const TensorView& pos_ids,
                                            const ApplyLlama31RopeOptions& options = {},
                                            StreamHandle stream = nullptr);
TESSERA_API void apply_llama31_rope_pos_ids_inplace(const TensorView& q, const TensorView& k,
                                                    const TensorView& pos_ids,
                                                    const ApplyLlama31RopeOptions& options = {},
                                                    StreamHandle stream = nullptr);

/// Rotates with precomputed cos/sin, the convention of vLLM and SGLang (FlashInfer's
/// apply_rope_with_cos_sin_cache).
/// positions: i32 or i64 [nnz]: row r uses table row positions[r]. A position outside
///   [0, max_position) reads nothing and leaves the row unrotated; checked mode reports it.
/// query: [nnz, num_q_heads * head_size], key: [nnz, num_k_heads * head_size] (each row the heads
///   one after the other, head_size elements apart), f16 or bf16 (the same dtype), contiguous last
///   dimension, any row stride.
/// head_size: elements per head, >= 2; divides query.shape[1] and key.shape[1].
/// cos_sin_cache: f32 [max_position, rotary_dim], any row stride, contiguous last dimension, on
///   query's device: row p holds cos a_i(p) at [i] and sin a_i(p) at [rotary_dim/2 + i] for
///   i < rotary_dim / 2. rotary_dim (its width) is even and <= head_size.
/// is_neox: true: pair i is (x[i], x[i + rotary_dim/2]); false: (x[2i], x[2i+1]).
/// query_out, key_out: query's and key's shapes and dtype (the inputs themselves in place).
TESSERA_API void apply_rope_with_cos_sin_cache(const TensorView& positions, const TensorView& query,
                                               const TensorView& key, int64_t head_size,
                                               const TensorView& cos_sin_cache, bool is_neox,
                                               const TensorView& query_out, const TensorView& key_out,
                                               StreamHandle stream = nullptr);
TESSERA_API void apply_rope_with_cos_sin_cache_inplace(const TensorView& positions, const TensorView& query,
                                                       const TensorView& key, int64_t head_size,
                                                       const TensorView& cos_sin_cache, bool is_neox = true,
                                                       StreamHandle stream = nullptr);

}  // namespace tessera
