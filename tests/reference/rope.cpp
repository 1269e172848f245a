#include "reference/rope.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace tessera_ref {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("rope reference: " + what);
}

/// Rotates the pairs of every head of row r with cos_a[i], sin_a[i]; the other dims are copied.
void rotate_row(const double* in, double* out, int64_t num_heads, int64_t head_dim, int64_t rotary_dim,
                bool interleave, const std::vector<double>& cos_a, const std::vector<double>& sin_a) {
  const int64_t half = rotary_dim / 2;
  for (int64_t h = 0; h < num_heads; ++h) {
    const double* x = in + h * head_dim;
    double* y = out + h * head_dim;
    for (int64_t d = rotary_dim; d < head_dim; ++d) y[d] = x[d];
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + half;
      y[a] = x[a] * cos_a[i] - x[b] * sin_a[i];
      y[b] = x[b] * cos_a[i] + x[a] * sin_a[i];
    }
  }
}

void check_sizes(const std::vector<double>& x, int64_t n, int64_t num_heads, int64_t head_dim,
                 const std::vector<int64_t>& positions, int64_t rotary_dim) {
  require(n >= 0 && num_heads >= 0 && head_dim >= 2, "bad sizes");
  require(static_cast<int64_t>(x.size()) == n * num_heads * head_dim, "x has the wrong size");
  require(static_cast<int64_t>(positions.size()) == n, "positions has the wrong size");
  require(rotary_dim >= 2 && rotary_dim <= head_dim && rotary_dim % 2 == 0, "rotary_dim must be even, in [2, D]");
}

}  // namespace

std::vector<int64_t> positions_from_indptr(const std::vector<int32_t>& indptr, const std::vector<int32_t>& offsets,
                                           int64_t nnz, std::vector<bool>* has_position) {
  require(!indptr.empty() && offsets.size() + 1 == indptr.size(), "indptr needs batch_size + 1 entries");
  std::vector<int64_t> pos(static_cast<size_t>(nnz), -1);
  if (has_position != nullptr) has_position->assign(static_cast<size_t>(nnz), false);
  for (size_t b = 0; b < offsets.size(); ++b) {
    for (int64_t r = indptr[b]; r < indptr[b + 1] && r < nnz; ++r) {
      pos[static_cast<size_t>(r)] = static_cast<int64_t>(offsets[b]) + (r - indptr[b]);
      if (has_position != nullptr) (*has_position)[static_cast<size_t>(r)] = true;
    }
  }
  return pos;
}

std::vector<double> rope_angles(const StandaloneRope& rope, double position) {
  require(rope.rope_scale > 0 && rope.rope_theta > 0, "rope_scale and rope_theta must be > 0");
  RopeParams params;
  params.theta = rope.rope_theta;
  std::vector<double> freq;
  if (rope.llama31) {
    params.llama31_factor = rope.rope_scale;
    params.llama31_low_freq_factor = rope.low_freq_factor;
    params.llama31_high_freq_factor = rope.high_freq_factor;
    params.llama31_original_max_position = rope.old_context_len;
    freq = rope_frequencies(rope.rotary_dim, RopeMode::Llama31, params);
  } else {
    freq = rope_frequencies(rope.rotary_dim, RopeMode::Llama, params);
    position /= rope.rope_scale;
  }
  for (double& f : freq) f *= position;
  return freq;
}

std::vector<double> apply_standalone_rope(const std::vector<double>& x, int64_t n, int64_t num_heads,
                                          int64_t head_dim, const std::vector<int64_t>& positions,
                                          const StandaloneRope& rope, const std::vector<bool>* rotate) {
  check_sizes(x, n, num_heads, head_dim, positions, rope.rotary_dim);
  require(rotate == nullptr || static_cast<int64_t>(rotate->size()) == n, "rotate has the wrong size");
  const int64_t half = rope.rotary_dim / 2;
  std::vector<double> out(x.size());
  std::vector<double> cos_a(half), sin_a(half);
  for (int64_t r = 0; r < n; ++r) {
    const bool rotated = rotate == nullptr || (*rotate)[static_cast<size_t>(r)];
    const std::vector<double> a = rotated ? rope_angles(rope, static_cast<double>(positions[r])) : std::vector<double>(half, 0.0);
    for (int64_t i = 0; i < half; ++i) {
      cos_a[i] = std::cos(a[i]);
      sin_a[i] = std::sin(a[i]);
    }
    const int64_t row = r * num_heads * head_dim;
    rotate_row(x.data() + row, out.data() + row, num_heads, head_dim, rope.rotary_dim, rope.interleave, cos_a, sin_a);
  }
  return out;
}

std::vector<double> apply_rope_cos_sin_table(const std::vector<double>& x, int64_t n, int64_t num_heads,
                                             int64_t head_dim, const std::vector<int64_t>& positions,
                                             const std::vector<double>& table, int64_t max_position,
                                             int64_t rotary_dim, bool interleave) {
  check_sizes(x, n, num_heads, head_dim, positions, rotary_dim);
  require(max_position >= 0 && static_cast<int64_t>(table.size()) == max_position * rotary_dim,
          "table has the wrong size");
  const int64_t half = rotary_dim / 2;
  std::vector<double> out(x.size());
  std::vector<double> cos_a(half), sin_a(half);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t p = positions[r];
    const bool in_table = p >= 0 && p < max_position;
    for (int64_t i = 0; i < half; ++i) {
      cos_a[i] = in_table ? table[p * rotary_dim + i] : 1.0;
      sin_a[i] = in_table ? table[p * rotary_dim + half + i] : 0.0;
    }
    const int64_t row = r * num_heads * head_dim;
    rotate_row(x.data() + row, out.data() + row, num_heads, head_dim, rotary_dim, interleave, cos_a, sin_a);
  }
  return out;
}

}  // namespace tessera_ref
