// The standalone RoPE reference (reference/rope.h) against hand values and the properties a
// rotation by position must have: identity at position 0, norms kept, scores that depend only on
// the distance between positions, interleaving as a permutation of rotate-half, and the Llama 3.1
// smoothing's limits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/oracle.h"
#include "reference/rope.h"

namespace {

using namespace tessera_ref;

StandaloneRope plain(int64_t rotary_dim, bool interleave = false) {
  StandaloneRope r;
  r.rotary_dim = rotary_dim;
  r.interleave = interleave;
  return r;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

TEST(ReferenceRope, HandValues) {
  // One pair (D = 2): frequency theta^0 = 1, so the angle is the position (over rope_scale).
  const std::vector<double> x = {1.0, 2.0};
  std::vector<double> y = apply_standalone_rope(x, 1, 1, 2, {3}, plain(2));
  EXPECT_NEAR(y[0], std::cos(3.0) - 2 * std::sin(3.0), 1e-15);
  EXPECT_NEAR(y[1], 2 * std::cos(3.0) + std::sin(3.0), 1e-15);
  StandaloneRope scaled = plain(2);
  scaled.rope_scale = 2.0;
  y = apply_standalone_rope(x, 1, 1, 2, {3}, scaled);
  EXPECT_NEAR(y[0], std::cos(1.5) - 2 * std::sin(1.5), 1e-15);
  // D = 4, theta = 100: pair 1 turns at 100^(-2/4) = 0.1 radians per position.
  const std::vector<double> a = rope_angles([] {
    StandaloneRope r = plain(4);
    r.rope_theta = 100.0;
    return r;
  }(), 5.0);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_NEAR(a[0], 5.0, 1e-15);
  EXPECT_NEAR(a[1], 0.5, 1e-15);
}

TEST(ReferenceRope, PositionZeroIsIdentityAndDimsPastRotaryDimAreKept) {
  const std::vector<double> x = random_normal(2 * 3 * 16, 7);
  for (bool interleave : {false, true}) {
    EXPECT_EQ(apply_standalone_rope(x, 2, 3, 16, {0, 0}, plain(16, interleave)), x);
    const std::vector<double> y = apply_standalone_rope(x, 2, 3, 16, {5, 9}, plain(6, interleave));
    for (int64_t h = 0; h < 6; ++h) {
      for (int64_t d = 6; d < 16; ++d) EXPECT_EQ(y[h * 16 + d], x[h * 16 + d]);
    }
  }
}

TEST(ReferenceRope, RotationKeepsEveryPairsNorm) {
  const std::vector<double> x = random_normal(4 * 2 * 32, 11);
  for (bool interleave : {false, true}) {
    const std::vector<double> y = apply_standalone_rope(x, 4, 2, 32, {1, 100, 4096, 123456}, plain(32, interleave));
    for (int64_t v = 0; v < 8; ++v) {
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t a = v * 32 + (interleave ? 2 * i : i), b = v * 32 + (interleave ? 2 * i + 1 : i + 16);
        EXPECT_NEAR(std::hypot(y[a], y[b]), std::hypot(x[a], x[b]), 1e-12);
      }
    }
  }
}

TEST(ReferenceRope, ScoresDependOnlyOnTheDistance) {
  // RoPE's point: q at m and k at n score as if at m + s and n + s, for any shift s.
  const std::vector<double> q = random_normal(64, 3), k = random_normal(64, 4);
  for (bool llama31 : {false, true}) {
    StandaloneRope r = plain(64);
    r.llama31 = llama31;
    r.rope_scale = llama31 ? 8.0 : 2.0;
    r.rope_theta = 5e5;
    const double s0 = dot(apply_standalone_rope(q, 1, 1, 64, {37}, r), apply_standalone_rope(k, 1, 1, 64, {12}, r));
    const double s1 =
        dot(apply_standalone_rope(q, 1, 1, 64, {1037}, r), apply_standalone_rope(k, 1, 1, 64, {1012}, r));
    EXPECT_NEAR(s0, s1, 1e-9);
  }
}

TEST(ReferenceRope, InterleavedIsRotateHalfOnPermutedDims) {
  // Interleaved pair i is (2i, 2i+1); gathering even dims then odd dims makes it (i, i + D/2).
  const int64_t D = 8;
  const std::vector<double> x = random_normal(D, 5);
  std::vector<double> permuted(D);
  for (int64_t i = 0; i < D / 2; ++i) {
    permuted[i] = x[2 * i];
    permuted[i + D / 2] = x[2 * i + 1];
  }
  const std::vector<double> a = apply_standalone_rope(x, 1, 1, D, {17}, plain(D, true));
  const std::vector<double> b = apply_standalone_rope(permuted, 1, 1, D, {17}, plain(D, false));
  for (int64_t i = 0; i < D / 2; ++i) {
    EXPECT_NEAR(a[2 * i], b[i], 1e-14);
    EXPECT_NEAR(a[2 * i + 1], b[i + D / 2], 1e-14);
  }
}

TEST(ReferenceRope, Llama31SmoothingLimits) {
  StandaloneRope unscaled = plain(128);
  unscaled.rope_theta = 5e5;
  StandaloneRope r = unscaled;
  r.llama31 = true;
  r.rope_scale = 8.0;
  const std::vector<double> f = rope_angles(unscaled, 1.0), smoothed = rope_angles(r, 1.0);
  const double two_pi = 2.0 * 3.14159265358979323846;
  for (size_t i = 0; i < f.size(); ++i) {
    const double wavelen = two_pi / f[i];
    if (wavelen < 8192.0 / 4.0) EXPECT_DOUBLE_EQ(smoothed[i], f[i]) << i;        // high frequency: kept
    if (wavelen > 8192.0 / 1.0) EXPECT_DOUBLE_EQ(smoothed[i], f[i] / 8.0) << i;  // low: divided
    EXPECT_LE(smoothed[i], f[i]);
    EXPECT_GE(smoothed[i], f[i] / 8.0 * (1 - 1e-15));
  }
  // Factor 1 smooths nothing: Llama 3.1 with rope_scale 1 is plain RoPE, and positions are never
  // divided by the factor.
  r.rope_scale = 1.0;
  const std::vector<double> a = rope_angles(r, 77.0), b = rope_angles(unscaled, 77.0);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-12 * (1 + b[i]));
}

TEST(ReferenceRope, CosSinTableOfTheAnglesMatchesComputedRope) {
  const int64_t D = 16, rd = 8, max_pos = 50;
  StandaloneRope r = plain(rd);
  std::vector<double> table(max_pos * rd);
  for (int64_t p = 0; p < max_pos; ++p) {
    const std::vector<double> a = rope_angles(r, static_cast<double>(p));
    for (int64_t i = 0; i < rd / 2; ++i) {
      table[p * rd + i] = std::cos(a[i]);
      table[p * rd + rd / 2 + i] = std::sin(a[i]);
    }
  }
  const std::vector<double> x = random_normal(3 * 2 * D, 9);
  for (bool interleave : {false, true}) {
    r.interleave = interleave;
    const std::vector<int64_t> pos = {4, 49, 0};
    const std::vector<double> a = apply_rope_cos_sin_table(x, 3, 2, D, pos, table, max_pos, rd, interleave);
    const std::vector<double> b = apply_standalone_rope(x, 3, 2, D, pos, r);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-14);
  }
  // A position outside the table leaves the row as it is.
  const std::vector<double> out = apply_rope_cos_sin_table(x, 3, 2, D, {-1, 50, 3}, table, max_pos, rd, false);
  for (int64_t i = 0; i < 2 * 2 * D; ++i) EXPECT_EQ(out[i], x[i]);
}

TEST(ReferenceRope, PositionsFromIndptr) {
  std::vector<bool> has;
  const std::vector<int64_t> pos = positions_from_indptr({0, 2, 2, 5}, {10, 0, 7}, 6, &has);
  EXPECT_EQ(pos, (std::vector<int64_t>{10, 11, 7, 8, 9, -1}));
  EXPECT_EQ(has, (std::vector<bool>{true, true, true, true, true, false}));
}

}  // namespace
