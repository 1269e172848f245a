// GPU tests of the attention-state merge kernels against the fp64 oracle (base-2 LSE).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "reference/oracle.h"
#include "tessera/merge.h"
#include "tessera/validate.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::TensorView;
using namespace tessera_test;

constexpr double kLseAbsTol = 1e-3;
constexpr double kInf = std::numeric_limits<double>::infinity();

/// Base-2 LSE values spread over a wide range, with a fraction of empty (-inf) states.
std::vector<double> random_lse(size_t n, std::mt19937_64& rng, double empty_fraction) {
  std::normal_distribution<double> dist(0.0, 6.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> s(n);
  for (auto& x : s) x = u(rng) < empty_fraction ? -kInf : dist(rng);
  return s;
}

std::vector<double> f32_round(const std::vector<double>& v) { return round_to(DType::kF32, v); }

/// rel_tol <= 0 skips the relative check: LSE is judged by absolute error (docs/design.md §8), its
/// values near zero make relative error meaningless.
void expect_close(const std::vector<double>& out, const std::vector<double>& ref, double rel_tol, double abs_tol,
                  const std::string& what) {
  const double rel = tessera_ref::rel_error(out, ref);
  const double max_abs = tessera_ref::max_abs_error(out, ref);
  if (rel_tol > 0) EXPECT_LE(rel, rel_tol) << what << ": relative error";
  if (abs_tol > 0) EXPECT_LE(max_abs, abs_tol) << what << ": max abs error";
}

class MergeStatePairTest : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t, int64_t>> {};

TEST_P(MergeStatePairTest, MatchesOracle) {
  const auto [dtype, rows, heads, dim] = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const size_t nv = rows * heads * dim, ns = rows * heads;
  const auto va = round_to(dtype, random_normal(nv, rng));
  const auto vb = round_to(dtype, random_normal(nv, rng));
  const auto sa = f32_round(random_lse(ns, rng, 0.1));
  const auto sb = f32_round(random_lse(ns, rng, 0.1));

  auto d_va = upload_as(dtype, va), d_vb = upload_as(dtype, vb);
  auto d_sa = upload_as(DType::kF32, sa), d_sb = upload_as(DType::kF32, sb);
  DeviceBuffer d_vo(nv * tessera::dtype_size(dtype)), d_so(ns * sizeof(float));
  d_vo.poison();
  d_so.poison();
  const Device gpu = Device::cuda(0);
  tessera::merge_state(TensorView(d_va.get(), dtype, {rows, heads, dim}, gpu),
                       TensorView(d_sa.get(), DType::kF32, {rows, heads}, gpu),
                       TensorView(d_vb.get(), dtype, {rows, heads, dim}, gpu),
                       TensorView(d_sb.get(), DType::kF32, {rows, heads}, gpu),
                       TensorView(d_vo.get(), dtype, {rows, heads, dim}, gpu),
                       TensorView(d_so.get(), DType::kF32, {rows, heads}, gpu));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  tessera_ref::State a{rows, heads, dim, va, sa}, b{rows, heads, dim, vb, sb};
  const tessera_ref::State ref = tessera_ref::merge_state(a, b, /*lse_base2=*/true);
  expect_close(download_as(dtype, d_vo.get(), nv), ref.o, rel_tolerance(dtype), 0, "v_out");
  expect_close(download_as(DType::kF32, d_so.get(), ns), ref.lse, 0, kLseAbsTol, "s_out");
}

INSTANTIATE_TEST_SUITE_P(Shapes, MergeStatePairTest,
                         ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16, DType::kF32),
                                            ::testing::Values<int64_t>(1, 7, 513),
                                            ::testing::Values<int64_t>(1, 5, 32),
                                            ::testing::Values<int64_t>(64, 128, 256)));

TEST(MergeStatePair, StridedInPlaceWithoutLse) {
  // v_a lives inside a wider buffer (head stride padded); the result overwrites v_a.
  const DType dtype = DType::kBF16;
  const int64_t rows = 37, heads = 3, dim = 128, head_stride = dim + 64, row_stride = heads * head_stride;
  std::mt19937_64 rng(test_seed());
  const auto wide = round_to(dtype, random_normal(rows * row_stride, rng));
  const auto vb = round_to(dtype, random_normal(rows * heads * dim, rng));
  const auto sa = f32_round(random_lse(rows * heads, rng, 0.0));
  const auto sb = f32_round(random_lse(rows * heads, rng, 0.0));
  auto d_wide = upload_as(dtype, wide), d_vb = upload_as(dtype, vb);
  auto d_sa = upload_as(DType::kF32, sa), d_sb = upload_as(DType::kF32, sb);
  const Device gpu = Device::cuda(0);
  const TensorView va_view(d_wide.get(), dtype, {rows, heads, dim}, {row_stride, head_stride, 1}, gpu);
  tessera::merge_state(va_view, TensorView(d_sa.get(), DType::kF32, {rows, heads}, gpu),
                       TensorView(d_vb.get(), dtype, {rows, heads, dim}, gpu),
                       TensorView(d_sb.get(), DType::kF32, {rows, heads}, gpu), va_view, TensorView());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  std::vector<double> va(rows * heads * dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < dim; ++d) va[(r * heads + h) * dim + d] = wide[r * row_stride + h * head_stride + d];
  const auto ref = tessera_ref::merge_state({rows, heads, dim, va, sa}, {rows, heads, dim, vb, sb}, true);
  const auto out_wide = download_as(dtype, d_wide.get(), rows * row_stride);
  std::vector<double> out(rows * heads * dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < row_stride / heads; ++d) {
        const double x = out_wide[r * row_stride + h * head_stride + d];
        if (d < dim) out[(r * heads + h) * dim + d] = x;
        else EXPECT_EQ(x, wide[r * row_stride + h * head_stride + d]) << "padding written at row " << r;
      }
  expect_close(out, ref.o, rel_tolerance(dtype), 0, "in-place v_a");
}

/// Packs a [rows, S, H, D] fixed-count problem or a ragged one into the oracle's varlen form.
struct RaggedStates {
  std::vector<int32_t> indptr;
  std::vector<double> v, s;
};

RaggedStates random_ragged_states(DType dtype, const std::vector<int32_t>& counts, int64_t heads, int64_t dim,
                                  std::mt19937_64& rng) {
  RaggedStates r;
  r.indptr.push_back(0);
  for (int32_t c : counts) r.indptr.push_back(r.indptr.back() + c);
  const int64_t total = r.indptr.back();
  r.v = round_to(dtype, random_normal(total * heads * dim, rng));
  r.s = f32_round(random_lse(total * heads, rng, 0.15));
  return r;
}

class MergeStatesTest : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t>> {};

TEST_P(MergeStatesTest, FixedCountMatchesOracle) {
  const auto [dtype, num_states, dim] = GetParam();
  const int64_t rows = 77, heads = 7;
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto st = random_ragged_states(dtype, std::vector<int32_t>(rows, static_cast<int32_t>(num_states)), heads,
                                       dim, rng);
  auto d_v = upload_as(dtype, st.v), d_s = upload_as(DType::kF32, st.s);
  DeviceBuffer d_vo(rows * heads * dim * tessera::dtype_size(dtype)), d_so(rows * heads * sizeof(float));
  d_vo.poison();
  d_so.poison();
  const Device gpu = Device::cuda(0);
  tessera::merge_states(TensorView(d_v.get(), dtype, {rows, num_states, heads, dim}, gpu),
                        TensorView(d_s.get(), DType::kF32, {rows, num_states, heads}, gpu),
                        TensorView(d_vo.get(), dtype, {rows, heads, dim}, gpu),
                        TensorView(d_so.get(), DType::kF32, {rows, heads}, gpu));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const auto ref = tessera_ref::merge_states_varlen(st.v, st.s, st.indptr, heads, dim, true);
  expect_close(download_as(dtype, d_vo.get(), rows * heads * dim), ref.o, rel_tolerance(dtype), 0, "v_out");
  expect_close(download_as(DType::kF32, d_so.get(), rows * heads), ref.lse, 0, kLseAbsTol, "s_out");
}

INSTANTIATE_TEST_SUITE_P(Shapes, MergeStatesTest,
                         ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16, DType::kF32),
                                            ::testing::Values<int64_t>(1, 2, 5, 8, 33),
                                            ::testing::Values<int64_t>(64, 128, 256)));

class MergeStatesRaggedTest : public ::testing::TestWithParam<DType> {};

TEST_P(MergeStatesRaggedTest, VariableCountsMatchOracleAndAreDeterministic) {
  const DType dtype = GetParam();
  const int64_t rows = 513, heads = 5, dim = 128;
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> count_dist(0, 12);
  std::vector<int32_t> counts(rows);
  for (auto& c : counts) c = count_dist(rng);
  counts[0] = 0;  // an empty row: V = 0, LSE = -inf
  const auto st = random_ragged_states(dtype, counts, heads, dim, rng);
  const int64_t total = st.indptr.back();
  auto d_v = upload_as(dtype, st.v), d_s = upload_as(DType::kF32, st.s);
  auto d_indptr = upload_i32(st.indptr);
  DeviceBuffer d_vo(rows * heads * dim * tessera::dtype_size(dtype)), d_so(rows * heads * sizeof(float));
  const Device gpu = Device::cuda(0);
  const TensorView v(d_v.get(), dtype, {total, heads, dim}, gpu), s(d_s.get(), DType::kF32, {total, heads}, gpu);
  const TensorView indptr(d_indptr.get(), DType::kI32, {rows + 1}, gpu);
  const TensorView vo(d_vo.get(), dtype, {rows, heads, dim}, gpu), so(d_so.get(), DType::kF32, {rows, heads}, gpu);

  std::vector<double> first_v, first_s;
  for (int run = 0; run < 3; ++run) {
    d_vo.poison();
    d_so.poison();
    tessera::merge_states_ragged(v, s, indptr, vo, so);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    auto out_v = download_as(dtype, d_vo.get(), rows * heads * dim);
    auto out_s = download_as(DType::kF32, d_so.get(), rows * heads);
    if (run == 0) {
      const auto ref = tessera_ref::merge_states_varlen(st.v, st.s, st.indptr, heads, dim, true);
      expect_close(out_v, ref.o, rel_tolerance(dtype), 0, "v_out");
      expect_close(out_s, ref.lse, 0, kLseAbsTol, "s_out");
      for (int64_t i = 0; i < heads * dim; ++i) ASSERT_EQ(out_v[i], 0.0) << "empty row must be zero";
      for (int64_t h = 0; h < heads; ++h) ASSERT_EQ(out_s[h], -kInf) << "empty row LSE must be -inf";
      first_v = out_v;
      first_s = out_s;
    } else {
      // Bit-identical: the fold order is fixed by the index order.
      ASSERT_EQ(out_v, first_v) << "run " << run;
      ASSERT_EQ(out_s, first_s) << "run " << run;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MergeStatesRaggedTest, ::testing::Values(DType::kF16, DType::kBF16, DType::kF32));

TEST(MergeStatesErrors, RejectsBadArgumentsWithNamedMessages) {
  const Device gpu = Device::cuda(0);
  DeviceBuffer buf(1 << 20);
  auto* base = static_cast<char*>(buf.get());
  const TensorView v(base, DType::kBF16, {4, 2, 128}, gpu), s(base + 4096, DType::kF32, {4, 2}, gpu);
  const TensorView vo(base + 8192, DType::kBF16, {4, 2, 128}, gpu), so(base + 16384, DType::kF32, {4, 2}, gpu);

  expect_error([&] { tessera::merge_state(v, s, TensorView(base, DType::kF16, {4, 2, 128}, gpu), s, vo, so); },
               "v_b.dtype = f16");
  expect_error([&] { tessera::merge_state(v, s, v, s, vo, s); }, "s_out aliases s_a");
  expect_error([&] { tessera::merge_state(v, s, v, s, TensorView(base + 2, DType::kBF16, {4, 2, 128}, gpu), so); },
               "v_out.data");
  expect_error([&] { tessera::merge_state(v, s, v, TensorView(base, DType::kF32, {4, 3}, gpu), vo, so); },
               "s_b.shape[1] = 3");
  expect_error([&] { tessera::merge_state(v, s, v, s, TensorView(base, DType::kBF16, {4, 2, 100}, gpu), so); },
               "v_out.shape[2] = 100");
  // Indptr past the packed states, caught in checked mode.
  std::vector<int32_t> bad = {0, 2, 9};
  auto d_bad = upload_i32(bad);
  tessera::set_checked_mode(true);
  expect_error([&] {
    tessera::merge_states_ragged(v, s, TensorView(d_bad.get(), DType::kI32, {3}, gpu),
                                 TensorView(base + 8192, DType::kBF16, {2, 2, 128}, gpu),
                                 TensorView(base + 16384, DType::kF32, {2, 2}, gpu));
  }, "indptr[2] = 9");
  tessera::set_checked_mode(false);
}

TEST(MergeStatesRagged, MalformedIndptrIsClampedNotOutOfBounds) {
  // Unchecked mode trusts device index arrays but must never read outside v/s (compute-sanitizer
  // runs this test): rows whose range leaves [0, total) are clamped to it.
  const Device gpu = Device::cuda(0);
  const int64_t total = 3, heads = 1, dim = 64;
  std::mt19937_64 rng(test_seed());
  auto d_v = upload_as(DType::kF32, random_normal(total * heads * dim, rng));
  auto d_s = upload_as(DType::kF32, random_normal(total * heads, rng));
  auto d_indptr = upload_i32({0, 2, 1000000, -5});
  DeviceBuffer d_vo(3 * heads * dim * sizeof(float)), d_so(3 * heads * sizeof(float));
  tessera::set_checked_mode(false);
  tessera::merge_states_ragged(TensorView(d_v.get(), DType::kF32, {total, heads, dim}, gpu),
                               TensorView(d_s.get(), DType::kF32, {total, heads}, gpu),
                               TensorView(d_indptr.get(), DType::kI32, {4}, gpu),
                               TensorView(d_vo.get(), DType::kF32, {3, heads, dim}, gpu),
                               TensorView(d_so.get(), DType::kF32, {3, heads}, gpu));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
