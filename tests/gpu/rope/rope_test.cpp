// GPU tests of the standalone RoPE functions (tessera/rope.h) against the fp64 reference
// (tests/reference/rope.h), on fresh random inputs with NaN-poisoned outputs.
//
// Tolerance, per element: the kernel rounds its fp32 result once to f16/bf16, and computes the
// angle pos * f_i in fp32, so an element of a rotated pair (x, y) may differ from the fp64 value by
//   2 ulp of the dtype at the element's magnitude (the final rounding, with margin)
//   + |(x, y)| * (|a_i| * (4 + |log2 f_i|) * 2^-22 + 2^-20)
// where a_i is the pair's angle: exp2f, the position product and the Llama 3.1 smoothing each
// contribute a few fp32 roundings relative to the angle (the frequency's exponent log2 f_i
// carries its rounding into f_i); 2^-20 covers sincosf (~2 ulp) and the fp32 rotation, which
// matter where the result cancels to far below the pair's norm. With a cos/sin table the angle is
// read, not computed: only |(x, y)| * 2^-22 (the rotation's roundings) remains. Dims past rotary_dim must be copied bit for bit, and every
// element outside q's and k's rows (padding of strided layouts) must keep its value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "reference/rope.h"
#include "tessera/attention.h"
#include "tessera/rope.h"
#include "tessera/validate.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::TensorView;
using namespace tessera_test;

/// Which entry point computes the positions and angles.
enum class Api { kIndptr, kPosIdsI32, kPosIdsI64, kCacheI32, kCacheI64 };
/// Where q and k live: packed contiguous tensors, slices of one packed qkv row (strided, aligned),
/// or those slices one element off (no 16-byte alignment: the element-wise kernel path).
enum class Placement { kContiguous, kPackedQkv, kMisaligned };

struct RopeCase {
  DType dtype;
  Api api;
  bool llama31;
  bool interleave;
  bool in_place;
  Placement placement;
  int64_t nnz, num_q_heads, num_k_heads, head_dim, rotary_dim;
};

const char* api_name(Api a) {
  switch (a) {
    case Api::kIndptr: return "indptr";
    case Api::kPosIdsI32: return "posids32";
    case Api::kPosIdsI64: return "posids64";
    case Api::kCacheI32: return "cache32";
    case Api::kCacheI64: return "cache64";
  }
  return "?";
}

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::kContiguous: return "contiguous";
    case Placement::kPackedQkv: return "qkv";
    case Placement::kMisaligned: return "misaligned";
  }
  return "?";
}

std::string case_name(const ::testing::TestParamInfo<RopeCase>& info) {
  const RopeCase& c = info.param;
  std::ostringstream s;
  s << tessera::dtype_name(c.dtype) << "_" << api_name(c.api) << (c.llama31 ? "_llama31" : "")
    << (c.interleave ? "_interleave" : "_half") << (c.in_place ? "_inplace" : "_out") << "_"
    << placement_name(c.placement) << "_n" << c.nnz << "_hq" << c.num_q_heads << "_hk" << c.num_k_heads << "_d"
    << c.head_dim << "_r" << c.rotary_dim;
  return s.str();
}

bool uses_cache(Api a) { return a == Api::kCacheI32 || a == Api::kCacheI64; }

/// One ulp of f16 / bf16 at magnitude m.
double ulp(DType dtype, double m) {
  const int mantissa_bits = dtype == DType::kF16 ? 10 : 7;
  const int min_exponent = dtype == DType::kF16 ? -14 : -126;
  const int e = m > 0 ? std::max(static_cast<int>(std::floor(std::log2(m))), min_exponent) : min_exponent;
  return std::ldexp(1.0, e - mantissa_bits);
}

/// q's and k's rows inside one buffer [nnz, row_width]: row r of q starts at q_offset + r * row_width
/// (k likewise), heads head_dim apart. Elements outside them are padding.
struct Layout {
  int64_t row_width = 0, q_offset = 0, k_offset = 0, rows = 0;
  int64_t size() const { return rows * row_width; }
};

Layout make_layout(const RopeCase& c) {
  Layout l;
  l.rows = c.nnz;
  const int64_t q_row = c.num_q_heads * c.head_dim, k_row = c.num_k_heads * c.head_dim;
  if (c.placement == Placement::kContiguous) {
    // Two separate packed tensors, modelled as one buffer whose "row" is the whole of q then k.
    l.rows = 1;
    l.row_width = c.nnz * (q_row + k_row);
    l.k_offset = c.nnz * q_row;
    return l;
  }
  // q, k (and a v slot) of a fused projection, plus 8 spare elements per row.
  l.row_width = q_row + 2 * k_row + 8;
  l.q_offset = c.placement == Placement::kMisaligned ? 1 : 0;
  l.k_offset = l.q_offset + q_row;
  return l;
}

/// Element index in the buffer of (tensor, row, head, dim); tensor 0 is q, 1 is k.
int64_t buffer_index(const RopeCase& c, const Layout& l, int tensor, int64_t r, int64_t h, int64_t d) {
  const int64_t heads = tensor == 0 ? c.num_q_heads : c.num_k_heads;
  const int64_t base = tensor == 0 ? l.q_offset : l.k_offset;
  if (c.placement == Placement::kContiguous) return base + (r * heads + h) * c.head_dim + d;
  return base + r * l.row_width + h * c.head_dim + d;
}

TensorView view_of(const RopeCase& c, const Layout& l, void* buffer, int tensor) {
  const int64_t heads = tensor == 0 ? c.num_q_heads : c.num_k_heads;
  const int64_t offset = tensor == 0 ? l.q_offset : l.k_offset;
  char* data = static_cast<char*>(buffer) + offset * static_cast<int64_t>(tessera::dtype_size(c.dtype));
  const int64_t row_stride = c.placement == Placement::kContiguous ? heads * c.head_dim : l.row_width;
  return TensorView(data, c.dtype, {c.nnz, heads, c.head_dim}, {row_stride, c.head_dim, 1}, Device::cuda(0));
}

/// The same rows as a cos/sin-cache entry point takes them: [nnz, heads * head_dim].
TensorView flat(const TensorView& t) {
  return TensorView(t.data, t.dtype, {t.shape[0], t.shape[1] * t.shape[2]}, {t.strides[0], 1}, t.device);
}

DeviceBuffer upload_i64(const std::vector<int64_t>& values) {
  DeviceBuffer buf(values.size() * sizeof(int64_t));
  buf.upload(values.data(), values.size() * sizeof(int64_t));
  return buf;
}

class RopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeTest, MatchesReference) {
  const RopeCase c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Layout layout = make_layout(c);

  // Inputs: random q and k rounded to the dtype; padding holds a sentinel that must survive.
  const double sentinel = round_to(c.dtype, {1234.0})[0];
  std::vector<double> buffer(layout.size(), sentinel);
  std::vector<double> q = round_to(c.dtype, random_normal(c.nnz * c.num_q_heads * c.head_dim, rng));
  std::vector<double> k = round_to(c.dtype, random_normal(c.nnz * c.num_k_heads * c.head_dim, rng));
  auto scatter = [&](std::vector<double>& buf, const std::vector<double>& values, int tensor, int64_t heads) {
    for (int64_t r = 0; r < c.nnz; ++r)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < c.head_dim; ++d)
          buf[buffer_index(c, layout, tensor, r, h, d)] = values[(r * heads + h) * c.head_dim + d];
  };
  scatter(buffer, q, 0, c.num_q_heads);
  scatter(buffer, k, 1, c.num_k_heads);

  // Positions: a ragged batch with offsets, or per-row ids (sorted runs and random jumps).
  std::vector<int32_t> indptr = {0}, offsets;
  std::vector<int64_t> positions(c.nnz);
  std::vector<bool> has_position(c.nnz, true);
  const int64_t max_position = 6000;
  if (c.api == Api::kIndptr) {
    std::uniform_int_distribution<int64_t> len(0, std::max<int64_t>(1, c.nnz / 3)), offset(0, 3000);
    while (indptr.back() < c.nnz) {
      indptr.push_back(static_cast<int32_t>(std::min<int64_t>(c.nnz, indptr.back() + len(rng))));
      offsets.push_back(static_cast<int32_t>(offset(rng)));
    }
    positions = tessera_ref::positions_from_indptr(indptr, offsets, c.nnz, &has_position);
  } else {
    std::uniform_int_distribution<int64_t> pos(0, max_position - 1);
    for (int64_t r = 0; r < c.nnz; ++r) positions[r] = r % 4 == 0 ? pos(rng) : (r > 0 ? positions[r - 1] + 1 : 0);
    for (auto& p : positions) p = std::min(p, max_position - 1);
  }

  tessera_ref::StandaloneRope rope;
  rope.rotary_dim = c.rotary_dim;
  rope.interleave = c.interleave;
  rope.llama31 = c.llama31;
  rope.rope_scale = c.llama31 ? 8.0 : (c.nnz % 2 ? 1.0 : 2.5);
  rope.rope_theta = c.llama31 ? 5e5 : 1e4;

  // A cos/sin table of random fp32 values: nothing in the kernel may assume cos^2 + sin^2 = 1.
  std::vector<double> table;
  std::vector<float> table_f32;
  if (uses_cache(c.api)) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    table_f32.resize(max_position * c.rotary_dim);
    for (float& v : table_f32) v = u(rng);
    table.assign(table_f32.begin(), table_f32.end());
  }

  std::vector<double> q_ref, k_ref;
  if (uses_cache(c.api)) {
    q_ref = tessera_ref::apply_rope_cos_sin_table(q, c.nnz, c.num_q_heads, c.head_dim, positions, table, max_position,
                                                  c.rotary_dim, c.interleave);
    k_ref = tessera_ref::apply_rope_cos_sin_table(k, c.nnz, c.num_k_heads, c.head_dim, positions, table, max_position,
                                                  c.rotary_dim, c.interleave);
  } else {
    q_ref = tessera_ref::apply_standalone_rope(q, c.nnz, c.num_q_heads, c.head_dim, positions, rope, &has_position);
    k_ref = tessera_ref::apply_standalone_rope(k, c.nnz, c.num_k_heads, c.head_dim, positions, rope, &has_position);
  }

  // Device buffers: the input, and (out of place) an output of the same layout full of NaN.
  DeviceBuffer d_in = upload_as(c.dtype, buffer);
  DeviceBuffer d_out;
  if (!c.in_place) {
    d_out = DeviceBuffer(d_in.bytes());
    d_out.poison();
  }
  void* out_base = c.in_place ? d_in.get() : d_out.get();
  const TensorView tq = view_of(c, layout, d_in.get(), 0), tk = view_of(c, layout, d_in.get(), 1);
  const TensorView tq_out = view_of(c, layout, out_base, 0), tk_out = view_of(c, layout, out_base, 1);

  DeviceBuffer d_indptr, d_offsets, d_pos, d_table;
  const Device gpu = Device::cuda(0);
  TensorView pos_view;
  if (c.api == Api::kIndptr) {
    d_indptr = upload_i32(indptr);
    d_offsets = upload_i32(offsets);
  } else if (c.api == Api::kPosIdsI64 || c.api == Api::kCacheI64) {
    d_pos = upload_i64(positions);
    pos_view = TensorView(d_pos.get(), DType::kI64, {c.nnz}, gpu);
  } else {
    d_pos = upload_i32(std::vector<int32_t>(positions.begin(), positions.end()));
    pos_view = TensorView(d_pos.get(), DType::kI32, {c.nnz}, gpu);
  }
  const TensorView indptr_view(d_indptr.get(), DType::kI32, {static_cast<int64_t>(indptr.size())}, gpu);
  const TensorView offsets_view(d_offsets.get(), DType::kI32, {static_cast<int64_t>(offsets.size())}, gpu);

  tessera::ApplyRopeOptions plain;
  plain.rotary_dim = c.rotary_dim == c.head_dim ? 0 : c.rotary_dim;  // 0: the default, head_dim
  plain.interleave = c.interleave;
  plain.rope_scale = rope.rope_scale;
  plain.rope_theta = rope.rope_theta;
  tessera::ApplyLlama31RopeOptions llama;
  llama.rotary_dim = c.rotary_dim;
  llama.interleave = c.interleave;
  llama.rope_scale = rope.rope_scale;
  llama.rope_theta = rope.rope_theta;

  switch (c.api) {
    case Api::kIndptr:
      if (c.llama31 && c.in_place) tessera::apply_llama31_rope_inplace(tq, tk, indptr_view, offsets_view, llama);
      else if (c.llama31) tessera::apply_llama31_rope(tq, tk, tq_out, tk_out, indptr_view, offsets_view, llama);
      else if (c.in_place) tessera::apply_rope_inplace(tq, tk, indptr_view, offsets_view, plain);
      else tessera::apply_rope(tq, tk, tq_out, tk_out, indptr_view, offsets_view, plain);
      break;
    case Api::kPosIdsI32:
    case Api::kPosIdsI64:
      if (c.llama31 && c.in_place) tessera::apply_llama31_rope_pos_ids_inplace(tq, tk, pos_view, llama);
      else if (c.llama31) tessera::apply_llama31_rope_pos_ids(tq, tk, tq_out, tk_out, pos_view, llama);
      else if (c.in_place) tessera::apply_rope_pos_ids_inplace(tq, tk, pos_view, plain);
      else tessera::apply_rope_pos_ids(tq, tk, tq_out, tk_out, pos_view, plain);
      break;
    case Api::kCacheI32:
    case Api::kCacheI64: {
      d_table = DeviceBuffer(table_f32.size() * sizeof(float));
      d_table.upload(table_f32.data(), table_f32.size() * sizeof(float));
      const TensorView cache(d_table.get(), DType::kF32, {max_position, c.rotary_dim}, gpu);
      const bool is_neox = !c.interleave;
      if (c.in_place) {
        tessera::apply_rope_with_cos_sin_cache_inplace(pos_view, flat(tq), flat(tk), c.head_dim, cache, is_neox);
      } else {
        tessera::apply_rope_with_cos_sin_cache(pos_view, flat(tq), flat(tk), c.head_dim, cache, is_neox, flat(tq_out),
                                               flat(tk_out));
      }
      break;
    }
  }
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<double> got = download_as(c.dtype, out_base, layout.size());

  // Expected buffer: rotated rows where q and k live; elsewhere what the buffer held before.
  std::vector<double> expected(layout.size(), c.in_place ? sentinel : std::numeric_limits<double>::quiet_NaN());
  scatter(expected, q_ref, 0, c.num_q_heads);
  scatter(expected, k_ref, 1, c.num_k_heads);
  std::vector<double> tol(layout.size(), 0.0);  // 0: exact (copies and padding)
  const double frequency_unit = 1.0;  // angles at position 1: f_i (over rope_scale for plain RoPE)
  const std::vector<double> f = tessera_ref::rope_angles(rope, frequency_unit);
  const int64_t half = c.rotary_dim / 2;
  for (int tensor = 0; tensor < 2; ++tensor) {
    const int64_t heads = tensor == 0 ? c.num_q_heads : c.num_k_heads;
    const std::vector<double>& in = tensor == 0 ? q : k;
    for (int64_t r = 0; r < c.nnz; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const double* x = &in[(r * heads + h) * c.head_dim];
        for (int64_t i = 0; i < half; ++i) {
          const int64_t a = c.interleave ? 2 * i : i, b = c.interleave ? 2 * i + 1 : i + half;
          const double norm = std::hypot(x[a], x[b]);
          double angle_error = std::ldexp(1.0, -22);
          if (!uses_cache(c.api)) {
            const double angle = has_position[r] ? std::abs(f[i] * static_cast<double>(positions[r])) : 0.0;
            angle_error = std::ldexp(1.0, -20) + angle * (4.0 + std::abs(std::log2(f[i]))) * std::ldexp(1.0, -22);
          }
          for (int64_t d : {a, b}) {
            const int64_t at = buffer_index(c, layout, tensor, r, h, d);
            tol[at] = 2 * ulp(c.dtype, std::max(std::abs(expected[at]), std::abs(got[at]))) + norm * angle_error;
          }
        }
      }
    }
  }

  int64_t bad = 0;
  double worst_ratio = 0;
  std::ostringstream first_bad;
  for (int64_t i = 0; i < layout.size(); ++i) {
    const bool both_nan = std::isnan(expected[i]) && std::isnan(got[i]);
    const double err = std::abs(got[i] - expected[i]);
    const bool ok = both_nan || err <= tol[i];  // NaN got: err is NaN, never ok
    if (tol[i] > 0 && !std::isnan(err)) worst_ratio = std::max(worst_ratio, err / tol[i]);
    if (!ok && bad++ < 8) first_bad << "\n  element " << i << ": got " << got[i] << ", expected " << expected[i]
                                    << " (tolerance " << tol[i] << ")";
  }
  EXPECT_EQ(bad, 0) << "elements outside tolerance:" << first_bad.str();
  RecordProperty("worst_error_over_tolerance", std::to_string(worst_ratio));
}

std::vector<RopeCase> rope_cases() {
  struct Shape {
    int64_t nnz, hq, hk, d, rd;
  };
  // Odd sizes: one row, 7 rows, 1000 rows; 1, 3 and 32 heads; head dims 64, 128, 256; partial
  // rotary dims (a multiple of 16: vectors; 24: the element-wise path).
  const Shape shapes[] = {{1, 1, 1, 64, 64},    {7, 3, 1, 128, 128},  {1000, 32, 8, 128, 128},
                          {7, 32, 3, 256, 256}, {1000, 3, 3, 64, 32}, {7, 1, 1, 256, 96},
                          {1000, 8, 1, 128, 24}};
  std::vector<RopeCase> cases;
  int n = 0;
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (Api api : {Api::kIndptr, Api::kPosIdsI32, Api::kPosIdsI64, Api::kCacheI32, Api::kCacheI64})
      for (bool llama31 : {false, true}) {
        if (llama31 && uses_cache(api)) continue;
        for (bool interleave : {false, true})
          for (bool in_place : {false, true}) {
            const Shape s = shapes[n % (sizeof(shapes) / sizeof(shapes[0]))];
            const Placement placement = n % 3 == 0 ? Placement::kContiguous
                                                   : (n % 3 == 1 ? Placement::kPackedQkv : Placement::kMisaligned);
            ++n;
            cases.push_back({dtype, api, llama31, interleave, in_place, placement, s.nnz, s.hq, s.hk, s.d, s.rd});
          }
      }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Grid, RopeTest, ::testing::ValuesIn(rope_cases()), case_name);

/// Small cases for compute-sanitizer (docs/development.md: *_sanitize*).
INSTANTIATE_TEST_SUITE_P(
    Grid_sanitize, RopeTest,
    ::testing::Values(RopeCase{DType::kBF16, Api::kIndptr, false, false, false, Placement::kPackedQkv, 7, 3, 1, 64, 64},
                      RopeCase{DType::kF16, Api::kPosIdsI64, true, true, true, Placement::kMisaligned, 7, 3, 1, 64, 48},
                      RopeCase{DType::kF16, Api::kCacheI32, false, false, false, Placement::kContiguous, 7, 2, 1, 128,
                               64}),
    case_name);

// ------------------------------------------------------------------------------------------------

/// Restores unchecked mode when a test that turned checked mode on ends, however it ends.
struct CheckedModeScope {
  CheckedModeScope() { tessera::set_checked_mode(true); }
  ~CheckedModeScope() { tessera::set_checked_mode(false); }
};

// A row no request owns, and a cache position outside the table, are written unrotated (never
// read out of bounds); checked mode reports both before the launch.
TEST(RopeErrors, RowsWithoutAPositionAreCopiedOrReported) {
  const Device gpu = Device::cuda(0);
  const int64_t nnz = 5, heads = 2, dim = 64;
  const std::vector<double> x = round_to(DType::kBF16, std::vector<double>(nnz * heads * dim, 0.75));
  DeviceBuffer d_q = upload_as(DType::kBF16, x), d_k = upload_as(DType::kBF16, x);
  DeviceBuffer d_qo(d_q.bytes()), d_ko(d_k.bytes());
  d_qo.poison();
  d_ko.poison();
  const TensorView q(d_q.get(), DType::kBF16, {nnz, heads, dim}, gpu), k(d_k.get(), DType::kBF16, {nnz, heads, dim}, gpu);
  const TensorView qo(d_qo.get(), DType::kBF16, {nnz, heads, dim}, gpu), ko(d_ko.get(), DType::kBF16, {nnz, heads, dim}, gpu);
  auto d_indptr = upload_i32({0, 3}), d_offsets = upload_i32({0});  // rows 3 and 4 belong to no request
  const TensorView indptr(d_indptr.get(), DType::kI32, {2}, gpu), offsets(d_offsets.get(), DType::kI32, {1}, gpu);
  {
    const CheckedModeScope checked;
    expect_error([&] { tessera::apply_rope(q, k, qo, ko, indptr, offsets); }, "indptr[1] = 3, expected 5");
  }
  tessera::apply_rope(q, k, qo, ko, indptr, offsets);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<double> got = download_as(DType::kBF16, d_qo.get(), x.size());
  for (int64_t i = 3 * heads * dim; i < nnz * heads * dim; ++i) ASSERT_EQ(got[i], x[i]) << i;
  for (int64_t i = 0; i < 3 * heads * dim; ++i) ASSERT_FALSE(std::isnan(got[i])) << i;

  std::vector<float> table(10 * 32, 0.5f);
  DeviceBuffer d_table(table.size() * sizeof(float));
  d_table.upload(table.data(), table.size() * sizeof(float));
  const TensorView cache(d_table.get(), DType::kF32, {10, 32}, gpu);
  auto d_pos = upload_i32({0, 9, 10, -1, 3});
  const TensorView pos(d_pos.get(), DType::kI32, {nnz}, gpu);
  const TensorView flat_q(d_q.get(), DType::kBF16, {nnz, heads * dim}, gpu), flat_k(d_k.get(), DType::kBF16, {nnz, heads * dim}, gpu);
  const TensorView flat_qo(d_qo.get(), DType::kBF16, {nnz, heads * dim}, gpu), flat_ko(d_ko.get(), DType::kBF16, {nnz, heads * dim}, gpu);
  {
    const CheckedModeScope checked;
    expect_error([&] { tessera::apply_rope_with_cos_sin_cache(pos, flat_q, flat_k, dim, cache, true, flat_qo, flat_ko); },
                 "positions[2] = 10 is out of range [0, 10)");
  }
  d_qo.poison();
  tessera::apply_rope_with_cos_sin_cache(pos, flat_q, flat_k, dim, cache, true, flat_qo, flat_ko);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<double> got2 = download_as(DType::kBF16, d_qo.get(), x.size());
  for (int64_t i = 2 * heads * dim; i < 4 * heads * dim; ++i) ASSERT_EQ(got2[i], x[i]) << i;  // rows 2 and 3
  // Row 0: cos = sin = 0.5 on the first 32 dims: x cos - y sin = 0 and y cos + x sin = 0.75.
  EXPECT_EQ(got2[0], 0.0);
  EXPECT_EQ(got2[16], 0.75);
  EXPECT_EQ(got2[40], 0.75);  // past rotary_dim 32: copied
}

TEST(RopeErrors, BadArgumentsAreNamedOnTheGpuToo) {
  const Device gpu = Device::cuda(0);
  DeviceBuffer buf(1 << 16);
  const TensorView q(buf.get(), DType::kF16, {4, 2, 64}, gpu), k(buf.get(), DType::kF16, {4, 1, 64}, gpu);
  auto d_pos = upload_i32({0, 1, 2, 3});
  const TensorView pos(d_pos.get(), DType::kI32, {4}, gpu);
  tessera::ApplyRopeOptions o;
  o.rotary_dim = 66;
  expect_error([&] { tessera::apply_rope_pos_ids_inplace(q, k, pos, o); }, "rotary_dim = 66, expected an even value in [2, 64]");
  expect_error([&] { tessera::apply_rope_pos_ids_inplace(q, k, TensorView(d_pos.get(), DType::kI32, {3}, gpu)); },
               "pos_ids.shape[0] = 3, expected 4");
}

// The standalone RoPE and the RoPE fused into the attention kernels (tessera/variant.h) agree:
// attention over q and k rotated by apply_rope_pos_ids equals attention that rotates them itself.
TEST(RopeAgreesWithFusedRope, SinglePrefill) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Device gpu = Device::cuda(0);
  const int64_t qo_len = 37, kv_len = 300, hq = 4, hkv = 2, dim = 128;
  const DType dtype = DType::kF16;
  for (bool llama31 : {false, true}) {
    SCOPED_TRACE(llama31 ? "llama31" : "llama");
    const std::vector<double> q = round_to(dtype, random_normal(qo_len * hq * dim, rng));
    const std::vector<double> k = round_to(dtype, random_normal(kv_len * hkv * dim, rng));
    const std::vector<double> v = round_to(dtype, random_normal(kv_len * hkv * dim, rng));
    DeviceBuffer d_q = upload_as(dtype, q), d_k = upload_as(dtype, k), d_v = upload_as(dtype, v);
    DeviceBuffer d_qr(d_q.bytes()), d_kr(d_k.bytes()), d_o1(d_q.bytes()), d_o2(d_q.bytes());
    const TensorView tq(d_q.get(), dtype, {qo_len, hq, dim}, gpu), tk(d_k.get(), dtype, {kv_len, hkv, dim}, gpu),
        tv(d_v.get(), dtype, {kv_len, hkv, dim}, gpu), tqr(d_qr.get(), dtype, {qo_len, hq, dim}, gpu),
        tkr(d_kr.get(), dtype, {kv_len, hkv, dim}, gpu), o1(d_o1.get(), dtype, {qo_len, hq, dim}, gpu),
        o2(d_o2.get(), dtype, {qo_len, hq, dim}, gpu);
    // Queries sit at kv_len - qo_len + i, keys at j (tessera/attention.h). q and k have different
    // row counts, so each is rotated with an empty partner ([rows, 0 heads, dim]).
    std::vector<int32_t> q_pos(qo_len), k_pos(kv_len);
    for (int64_t i = 0; i < qo_len; ++i) q_pos[i] = static_cast<int32_t>(kv_len - qo_len + i);
    for (int64_t j = 0; j < kv_len; ++j) k_pos[j] = static_cast<int32_t>(j);
    auto d_qpos = upload_i32(q_pos), d_kpos = upload_i32(k_pos);
    const TensorView qpos(d_qpos.get(), DType::kI32, {qo_len}, gpu), kpos(d_kpos.get(), DType::kI32, {kv_len}, gpu);
    const TensorView no_q_heads(d_q.get(), dtype, {qo_len, 0, dim}, gpu), no_k_heads(d_k.get(), dtype, {kv_len, 0, dim}, gpu);
    tessera::AttentionOptions fused;
    fused.causal = true;
    fused.variant.rope.theta = 5e5;
    if (llama31) {
      tessera::ApplyLlama31RopeOptions o;  // factor 8, theta 5e5, 1, 4, 8192: the variant's defaults
      tessera::apply_llama31_rope_pos_ids(tq, no_q_heads, tqr, no_q_heads, qpos, o);
      tessera::apply_llama31_rope_pos_ids(tk, no_k_heads, tkr, no_k_heads, kpos, o);
      fused.variant.rope.mode = tessera::PosEncoding::kRopeLlama31;
    } else {
      tessera::ApplyRopeOptions o;
      o.rope_theta = 5e5;
      o.rope_scale = 1.5;
      fused.variant.rope.scale = 1.5;
      tessera::apply_rope_pos_ids(tq, no_q_heads, tqr, no_q_heads, qpos, o);
      tessera::apply_rope_pos_ids(tk, no_k_heads, tkr, no_k_heads, kpos, o);
      fused.variant.rope.mode = tessera::PosEncoding::kRopeLlama;
    }
    tessera::AttentionOptions plain;
    plain.causal = true;
    tessera::single_prefill(tqr, tkr, tv, tessera::Layout::kNHD, o1, TensorView(), plain);
    tessera::single_prefill(tq, tk, tv, tessera::Layout::kNHD, o2, TensorView(), fused);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<double> a = download_as(dtype, d_o1.get(), qo_len * hq * dim);
    const std::vector<double> b = download_as(dtype, d_o2.get(), qo_len * hq * dim);
    // The standalone path rounds the rotated q and k to f16 before the attention; the fused one
    // does not: the outputs differ by the attention tolerance, not more.
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_ref = std::max(max_ref, std::abs(b[i]));
      max_err = std::max(max_err, std::abs(a[i] - b[i]));
    }
    EXPECT_LE(max_err, 2 * rel_tolerance(dtype) * max_ref);
  }
}

}  // namespace
