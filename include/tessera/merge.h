// Attention-state merge (docs/design.md §2).
//
// A state is (V, S): V [rows, num_heads, head_dim] the attention output over some KV set, S
// [rows, num_heads] f32 its log-sum-exp. Tessera's C++ API uses BASE-2 log-sum-exp throughout:
// S = log2(sum_j 2^(x_j * log2(e))) = ln(sum_j e^(x_j)) / ln(2), the same convention as
// FlashInfer's Python API. Two states over disjoint KV sets combine as
//   S = log2(2^S_a + 2^S_b),  V = 2^(S_a - S) V_a + 2^(S_b - S) V_b.
// A state with S = -inf is empty and contributes nothing; merging only empty states gives V = 0,
// S = -inf.
//
// Requirements shared by all functions here: V tensors f16, bf16 or f32 (inputs and output the
// same dtype), on the CUDA device that is current, any strides with a contiguous last dimension,
// head_dim * dtype_size a multiple of 16 bytes; S tensors f32 with a contiguous last dimension.
// Work is queued on `stream`; nothing synchronises.
#pragma once

#include "tessera/export.h"
#include "tessera/stream.h"
#include "tessera/tensor.h"

namespace tessera {

/// Merges two states elementwise: (v_a, s_a) + (v_b, s_b) -> (v_out, s_out).
/// v_*: [rows, H, D]; s_*: [rows, H]. s_out may be an undefined TensorView (LSE not wanted).
/// v_out may alias v_a or v_b (in place); s_out must not alias s_a or s_b (kInvalidArgument).
TESSERA_API void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                             const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                             StreamHandle stream = nullptr);

/// Merges a fixed number of states per row, in index order (deterministic):
/// v: [rows, num_states, H, D], s: [rows, num_states, H] -> v_out [rows, H, D], s_out [rows, H].
TESSERA_API void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                              const TensorView& s_out, StreamHandle stream = nullptr);

/// Merges a variable number of states per row, in index order (deterministic): row r merges the
/// packed states indptr[r] .. indptr[r+1]-1 of v: [total_states, H, D], s: [total_states, H].
/// indptr: i32 [rows + 1] in device memory. A row with no states gets V = 0, S = -inf.
TESSERA_API void merge_states_ragged(const TensorView& v, const TensorView& s, const TensorView& indptr,
                                     const TensorView& v_out, const TensorView& s_out,
                                     StreamHandle stream = nullptr);

}  // namespace tessera
