// fp64 reference of the standalone RoPE functions (tessera/rope.h, FlashInfer's flashinfer.rope),
// written from the definition; shares no code with the library or its kernels.
//
// Each head vector x of D elements: its first rotary_dim dims form rotary_dim / 2 pairs, pair i
// being (x[i], x[i + rotary_dim/2]) ("rotate half") or (x[2i], x[2i+1]) (interleaved); the pair is
// rotated by the angle a_i of the row's position p,
//   (x, y) -> (x cos a_i - y sin a_i, y cos a_i + x sin a_i),
// and the dims past rotary_dim are kept. Angles:
//   plain RoPE:   a_i = (p / rope_scale) * rope_theta^(-2i / rotary_dim)
//   Llama 3.1:    a_i = p * f_i, with f_i the Llama 3.1 smoothing (oracle.h's rope_frequencies,
//                 factor = rope_scale) of rope_theta^(-2i / rotary_dim)
//   cos/sin table: cos a_i = table[p][i], sin a_i = table[p][rotary_dim/2 + i]
#pragma once

#include <cstdint>
#include <vector>

#include "reference/oracle.h"

namespace tessera_ref {

struct StandaloneRope {
  int64_t rotary_dim = 0;  // even, in [2, head_dim]
  bool interleave = false;
  bool llama31 = false;
  double rope_scale = 1.0;  // plain: divides positions; Llama 3.1: the smoothing factor
  double rope_theta = 1e4;
  double low_freq_factor = 1.0;   // Llama 3.1 only
  double high_freq_factor = 4.0;  // Llama 3.1 only
  double old_context_len = 8192.0;
};

// Positions of the packed rows of a ragged batch: row indptr[b] + j sits at offsets[b] + j. Rows
// past indptr.back() (up to nnz) get no position (the result holds -1 and `has_position` false).
std::vector<int64_t> positions_from_indptr(const std::vector<int32_t>& indptr, const std::vector<int32_t>& offsets,
                                           int64_t nnz, std::vector<bool>* has_position = nullptr);

// The rotation angles a_i(p) of StandaloneRope for pairs i < rotary_dim / 2. Returns [rotary_dim / 2].
std::vector<double> rope_angles(const StandaloneRope& rope, double position);

// x [n, num_heads, head_dim] rotated row by row at positions[r] (n entries). A row with
// rotate[r] == false (when `rotate` is given) is returned unchanged. Returns [n, num_heads, head_dim].
std::vector<double> apply_standalone_rope(const std::vector<double>& x, int64_t n, int64_t num_heads,
                                          int64_t head_dim, const std::vector<int64_t>& positions,
                                          const StandaloneRope& rope, const std::vector<bool>* rotate = nullptr);

// The same with the angles of a cos/sin table [max_position, rotary_dim] (row-major); rows whose
// position lies outside [0, max_position) are returned unchanged.
std::vector<double> apply_rope_cos_sin_table(const std::vector<double>& x, int64_t n, int64_t num_heads,
                                             int64_t head_dim, const std::vector<int64_t>& positions,
                                             const std::vector<double>& table, int64_t max_position,
                                             int64_t rotary_dim, bool interleave);

}  // namespace tessera_ref
