// Tests of the fp64 reference oracle: hand-derived cases, variant helpers, an independent naive
// cross-check, argument validation and the comparison utilities.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "test_helpers.h"
#include "reference/oracle.h"

namespace {

using namespace tessera_ref;
using tessera_ref_test::kInf;

constexpr double kTol = 1e-14;
const double kLn2 = std::log(2.0);
const double kNaN = std::numeric_limits<double>::quiet_NaN();

HeadConfig one_head(int64_t D) { return HeadConfig{1, 1, D}; }

// ------------------------------------------------------------------------------------------------
// Hand-derived attention cases
// ------------------------------------------------------------------------------------------------

TEST(HandComputed, OneQueryTwoKeys) {
  // q = (1, 2), k0 = (0, 0), k1 = (ln 2, 0), sm_scale = 1:
  //   x0 = 0, x1 = ln 2  ->  exp: 1, 2; sum 3; P = (1/3, 2/3).
  //   v0 = (3, 0), v1 = (0, 6)  ->  O = (1/3*3, 2/3*6) = (1, 4);  LSE = ln 3.
  Options opts;
  opts.sm_scale = 1.0;
  State s = attention_single({1, 2}, {0, 0, kLn2, 0}, {3, 0, 0, 6}, 1, 2, one_head(2), opts);
  ASSERT_EQ(s.o.size(), 2u);
  EXPECT_NEAR(s.o[0], 1.0, kTol);
  EXPECT_NEAR(s.o[1], 4.0, kTol);
  EXPECT_NEAR(s.lse[0], std::log(3.0), kTol);
}

TEST(HandComputed, DefaultScaleIsInverseSqrtD) {
  // Same as above with k1 = (sqrt(2) ln 2, 0) and the default scale 1/sqrt(2): x1 = ln 2 again.
  Options opts;  // sm_scale < 0 -> 1/sqrt(D)
  State s = attention_single({1, 2}, {0, 0, std::sqrt(2.0) * kLn2, 0}, {3, 0, 0, 6}, 1, 2,
                             one_head(2), opts);
  EXPECT_NEAR(s.o[0], 1.0, kTol);
  EXPECT_NEAR(s.o[1], 4.0, kTol);
  EXPECT_NEAR(s.lse[0], std::log(3.0), kTol);
}

TEST(HandComputed, FullyMaskedRowHasZeroOutputAndMinusInfLse) {
  // qo_len = 2, kv_len = 1, causal: p_0 = 1 - 2 + 0 = -1 sees nothing; p_1 = 0 sees key 0.
  // Row 1: single key, P = 1: O = v0, LSE = x0 = q1.k0 = 1*0.5 + 1*0.25 = 0.75.
  Options opts;
  opts.sm_scale = 1.0;
  opts.causal = true;
  State s = attention_single({7, 7, 1, 1}, {0.5, 0.25}, {2, -3}, 2, 1, one_head(2), opts);
  EXPECT_EQ(s.o[0], 0.0);
  EXPECT_EQ(s.o[1], 0.0);
  EXPECT_EQ(s.lse[0], -kInf);
  EXPECT_NEAR(s.o[2], 2.0, kTol);
  EXPECT_NEAR(s.o[3], -3.0, kTol);
  EXPECT_NEAR(s.lse[1], 0.75, kTol);
}

TEST(HandComputed, EmptyKvGivesEmptyRowsEvenWithoutCausal) {
  Options opts;
  State s = attention_single({1, 2, 3, 4}, {}, {}, 2, 0, one_head(2), opts);
  for (double x : s.o) EXPECT_EQ(x, 0.0);
  for (double x : s.lse) EXPECT_EQ(x, -kInf);
  // qo_len = 0 gives an empty state.
  State e = attention_single({}, {1, 2}, {3, 4}, 0, 1, one_head(2), opts);
  EXPECT_EQ(e.rows, 0);
  EXPECT_TRUE(e.o.empty());
}

// Zero queries give zero logits, so every visible key has the same weight and O is the mean of the
// visible values, LSE = ln(#visible). v_j = (j, 1) for key j.
std::vector<double> ramp_values(int64_t n) {
  std::vector<double> v;
  for (int64_t j = 0; j < n; ++j) {
    v.push_back(static_cast<double>(j));
    v.push_back(1.0);
  }
  return v;
}

TEST(HandComputed, CausalOffsetWhenQueriesAreTheLastPositions) {
  // qo_len = 2, kv_len = 4: p = 2, 3. Row 0 sees keys 0..2: O = (mean(0,1,2), 1) = (1, 1),
  // LSE = ln 3. Row 1 sees keys 0..3: O = (1.5, 1), LSE = ln 4.
  Options opts;
  opts.causal = true;
  const std::vector<double> q(2 * 2, 0.0), k(4 * 2, 0.5);
  State s = attention_single(q, k, ramp_values(4), 2, 4, one_head(2), opts);
  EXPECT_NEAR(s.o[0], 1.0, kTol);
  EXPECT_NEAR(s.o[1], 1.0, kTol);
  EXPECT_NEAR(s.lse[0], std::log(3.0), kTol);
  EXPECT_NEAR(s.o[2], 1.5, kTol);
  EXPECT_NEAR(s.lse[1], std::log(4.0), kTol);
  // Without causal both rows see all 4 keys.
  opts.causal = false;
  State n = attention_single(q, k, ramp_values(4), 2, 4, one_head(2), opts);
  EXPECT_NEAR(n.o[0], 1.5, kTol);
  EXPECT_NEAR(n.lse[0], std::log(4.0), kTol);
}

TEST(HandComputed, SlidingWindowBoundaryAndSinks) {
  const std::vector<double> q1(2, 0.0), k5(5 * 2, 0.5);
  Options opts;
  opts.causal = true;
  // qo_len = 1, kv_len = 5: p = 4. window_left = 2: keys j >= 2 -> {2,3,4}: O = 3, LSE = ln 3.
  opts.window_left = 2;
  State s = attention_single(q1, k5, ramp_values(5), 1, 5, one_head(2), opts);
  EXPECT_NEAR(s.o[0], 3.0, kTol);
  EXPECT_NEAR(s.lse[0], std::log(3.0), kTol);
  // window_left = 0: only the query's own position 4: O = 4, LSE = ln 1 = 0.
  opts.window_left = 0;
  s = attention_single(q1, k5, ramp_values(5), 1, 5, one_head(2), opts);
  EXPECT_NEAR(s.o[0], 4.0, kTol);
  EXPECT_NEAR(s.lse[0], 0.0, kTol);
  // window_left = 2 plus 1 sink token: {0} u {2,3,4}: O = 9/4, LSE = ln 4.
  opts.window_left = 2;
  opts.num_sink_tokens = 1;
  s = attention_single(q1, k5, ramp_values(5), 1, 5, one_head(2), opts);
  EXPECT_NEAR(s.o[0], 9.0 / 4.0, kTol);
  EXPECT_NEAR(s.lse[0], std::log(4.0), kTol);
  // 3 sinks: {0,1,2} u {2,3,4} = all five: O = 2, LSE = ln 5.
  opts.num_sink_tokens = 3;
  s = attention_single(q1, k5, ramp_values(5), 1, 5, one_head(2), opts);
  EXPECT_NEAR(s.o[0], 2.0, kTol);
  EXPECT_NEAR(s.lse[0], std::log(5.0), kTol);
}

TEST(HandComputed, SinksStillObeyCausal) {
  // qo_len = kv_len = 5, causal, window_left = 0, 2 sinks. p_i = i.
  //   row 0: {0} (sink 1 is in the future)   -> O = 0,   LSE = 0
  //   row 1: {0, 1}                          -> O = 0.5, LSE = ln 2
  //   row 4: {0, 1} u {4}                    -> O = 5/3, LSE = ln 3
  Options opts;
  opts.causal = true;
  opts.window_left = 0;
  opts.num_sink_tokens = 2;
  const std::vector<double> q(5 * 2, 0.0), k(5 * 2, 0.5);
  State s = attention_single(q, k, ramp_values(5), 5, 5, one_head(2), opts);
  EXPECT_NEAR(s.o[0 * 2], 0.0, kTol);
  EXPECT_NEAR(s.lse[0], 0.0, kTol);
  EXPECT_NEAR(s.o[1 * 2], 0.5, kTol);
  EXPECT_NEAR(s.lse[1], kLn2, kTol);
  EXPECT_NEAR(s.o[4 * 2], 5.0 / 3.0, kTol);
  EXPECT_NEAR(s.lse[4], std::log(3.0), kTol);
}

TEST(HandComputed, NonCausalWindowOnlyBoundsTheLeft) {
  // qo_len = 2, kv_len = 5, window_left = 2, no causal: row 0 (p = 3) sees j >= 1 = {1,2,3,4}:
  // O = 2.5, LSE = ln 4; row 1 (p = 4) sees {2,3,4}: O = 3, LSE = ln 3.
  Options opts;
  opts.window_left = 2;
  const std::vector<double> q(2 * 2, 0.0), k(5 * 2, 0.5);
  State s = attention_single(q, k, ramp_values(5), 2, 5, one_head(2), opts);
  EXPECT_NEAR(s.o[0], 2.5, kTol);
  EXPECT_NEAR(s.lse[0], std::log(4.0), kTol);
  EXPECT_NEAR(s.o[2], 3.0, kTol);
  EXPECT_NEAR(s.lse[1], std::log(3.0), kTol);
}

TEST(HandComputed, LogitsSoftCap) {
  // One key: q = (3, 0), k = (1, 0), scale 1: x = 3, cap 2: 2 tanh(1.5) = 1.8102965072897328.
  // With a single key P = 1, so LSE is the capped logit.
  Options opts;
  opts.sm_scale = 1.0;
  opts.logits_soft_cap = 2.0;
  State s = attention_single({3, 0}, {1, 0}, {5, 6}, 1, 1, one_head(2), opts);
  EXPECT_NEAR(s.lse[0], 1.8102965072897328, kTol);
  EXPECT_NEAR(s.o[0], 5.0, kTol);
  // Two keys, x = (0, 3) -> capped (0, c), c = 1.8102965072897328, e^c = 6.1124...
  //   P0 = 1/(1+e^c) = 0.14060229396501833, P1 = 0.8593977060349817, LSE = ln(1+e^c) = 1.9618199841979986.
  // v0 = (1, 0), v1 = (0, 1) -> O = (P0, P1).
  s = attention_single({3, 0}, {0, 0, 1, 0}, {1, 0, 0, 1}, 1, 2, one_head(2), opts);
  EXPECT_NEAR(s.o[0], 0.14060229396501833, kTol);
  EXPECT_NEAR(s.o[1], 0.8593977060349817, kTol);
  EXPECT_NEAR(s.lse[0], 1.9618199841979986, kTol);
  // Without the cap x1 = 3: LSE = ln(1 + e^3), which differs.
  opts.logits_soft_cap = 0.0;
  s = attention_single({3, 0}, {0, 0, 1, 0}, {1, 0, 0, 1}, 1, 2, one_head(2), opts);
  EXPECT_NEAR(s.lse[0], std::log(1.0 + std::exp(3.0)), kTol);
}

TEST(HandComputed, AlibiBiasPerHead) {
  // Two heads (Hq = Hkv = 2), D = 1, zero queries, qo_len = 1, kv_len = 2, p = 1.
  // Bias = slope * (j - p): key 0 gets -slope, key 1 gets 0. v = 1 for key 0, 0 for key 1, so
  // O = P0 = e^-s / (1 + e^-s), LSE = ln(1 + e^-s).
  //   s = 0.5: P0 = 0.37754066879814546, LSE = 0.4740769841801067
  //   s = 2:   P0 = 0.11920292202211755, LSE = 0.1269280110429726
  Options opts;
  opts.alibi_slopes = {0.5, 2.0};
  HeadConfig h{2, 2, 1};
  State s = attention_single({0, 0}, {1, 1, 1, 1}, {1, 1, 0, 0}, 1, 2, h, opts);
  EXPECT_NEAR(s.o[0], 0.37754066879814546, kTol);
  EXPECT_NEAR(s.lse[0], 0.4740769841801067, kTol);
  EXPECT_NEAR(s.o[1], 0.11920292202211755, kTol);
  EXPECT_NEAR(s.lse[1], 0.1269280110429726, kTol);
  // A future key (non-causal) gets a positive bias: qo_len = 2, kv_len = 2, row 0 has p = 0, so
  // head 0 has logits (0, +0.5): O = P0 = 1 / (1 + e^0.5) = 0.37754066879814546 (a symmetric
  // -|j - p| bias would give 0.6224593312018546), LSE = ln(1 + e^0.5) = 0.9740769841801067.
  State f = attention_single({0, 0, 0, 0}, {1, 1, 1, 1}, {1, 1, 0, 0}, 2, 2, h, opts);
  EXPECT_NEAR(f.o[0], 0.37754066879814546, kTol);
  EXPECT_NEAR(f.lse[0], 0.9740769841801067, kTol);
}

TEST(HandComputed, SigmoidMode) {
  // D = 1, zero queries: x = 0. bias 0: P = 1/2 per key; v = (2, 4): O = 3, LSE = NaN.
  Options opts;
  opts.use_softmax = false;
  State s = attention_single({0}, {1, 1}, {2, 4}, 1, 2, one_head(1), opts);
  EXPECT_NEAR(s.o[0], 3.0, kTol);
  EXPECT_TRUE(std::isnan(s.lse[0]));
  // bias ln 3: P = 1/(1 + 1/3) = 3/4 -> O = 4.5 (weights are not normalised).
  opts.sigmoid_bias = std::log(3.0);
  s = attention_single({0}, {1, 1}, {2, 4}, 1, 2, one_head(1), opts);
  EXPECT_NEAR(s.o[0], 4.5, kTol);
  // Logit ln 3 with bias 0 (q = ln 3, k = 1, scale 1): P = 3/4 for the single key: O = 3/4 * 2.
  opts.sigmoid_bias = 0.0;
  opts.sm_scale = 1.0;
  s = attention_single({std::log(3.0)}, {1}, {2}, 1, 1, one_head(1), opts);
  EXPECT_NEAR(s.o[0], 1.5, kTol);
  // A masked row contributes nothing: O = 0.
  opts.causal = true;
  s = attention_single({0, 0}, {1}, {2}, 2, 1, one_head(1), opts);
  EXPECT_EQ(s.o[0], 0.0);
  EXPECT_NEAR(s.o[1], 1.0, kTol);  // x = 0: P = 1/2, v = 2
}

TEST(HandComputed, CustomMaskPicksKeys) {
  // qo_len = 2, kv_len = 3, zero queries, mask rows: row 0 = {1, 0, 1}, row 1 = {0, 0, 0}.
  // Row 0 averages keys 0 and 2: O = (0 + 2)/2 = 1, LSE = ln 2. Row 1: empty.
  Options opts;
  opts.custom_mask = {1, 0, 1, 0, 0, 0};
  opts.custom_mask_indptr = {0, 6};
  const std::vector<double> q(2 * 2, 0.0), k(3 * 2, 0.5);
  State s = attention_single(q, k, ramp_values(3), 2, 3, one_head(2), opts);
  EXPECT_NEAR(s.o[0], 1.0, kTol);
  EXPECT_NEAR(s.lse[0], kLn2, kTol);
  EXPECT_EQ(s.lse[1], -kInf);
}

TEST(HandComputed, GqaUsesKvHeadOfTheGroup) {
  // Hq = 4, Hkv = 2 (group 2): heads 0,1 read KV head 0, heads 2,3 read KV head 1.
  // One key; O of each query head equals its KV head's value.
  HeadConfig h{4, 2, 1};
  Options opts;
  State s = attention_single({1, 2, 3, 4}, {1, 1}, {10, 20}, 1, 1, h, opts);
  EXPECT_EQ(s.o[0], 10.0);
  EXPECT_EQ(s.o[1], 10.0);
  EXPECT_EQ(s.o[2], 20.0);
  EXPECT_EQ(s.o[3], 20.0);
}

// ------------------------------------------------------------------------------------------------
// Variant helpers
// ------------------------------------------------------------------------------------------------

TEST(Alibi, SlopesForPowerOfTwoHeads) {
  const std::vector<double> s = alibi_slopes(8);
  const std::vector<double> expected = {1.0 / 2, 1.0 / 4, 1.0 / 8, 1.0 / 16,
                                        1.0 / 32, 1.0 / 64, 1.0 / 128, 1.0 / 256};
  ASSERT_EQ(s.size(), expected.size());
  for (size_t i = 0; i < s.size(); ++i) EXPECT_DOUBLE_EQ(s[i], expected[i]) << i;
  EXPECT_DOUBLE_EQ(alibi_slopes(1)[0], 1.0 / 256);
  const std::vector<double> s2 = alibi_slopes(2);
  EXPECT_DOUBLE_EQ(s2[0], 1.0 / 16);
  EXPECT_DOUBLE_EQ(s2[1], 1.0 / 256);
}

TEST(Alibi, SlopesForTwelveHeads) {
  // Known HF values: the 8 power-of-two slopes, then every other slope of the 16-head series:
  // 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  const std::vector<double> s = alibi_slopes(12);
  const std::vector<double> expected = {0.5,    0.25,    0.125,   0.0625,
                                        0.03125, 0.015625, 0.0078125, 0.00390625,
                                        0.7071067811865476, 0.3535533905932738,
                                        0.1767766952966369, 0.08838834764831845};
  ASSERT_EQ(s.size(), expected.size());
  for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(s[i], expected[i], 1e-15) << i;
  // 3 heads: {2^-4, 2^-8} + {2^-2}.
  const std::vector<double> s3 = alibi_slopes(3);
  EXPECT_DOUBLE_EQ(s3[2], 0.25);
}

TEST(Rope, KnownVectorAtPositionOne) {
  // D = 4, theta = 1e4: freq_0 = 1, freq_1 = 1e4^(-2/4) = 0.01. x = (1, 2, 3, 4), t = 1:
  //   out0 = 1 cos 1 - 3 sin 1        = -1.9841106485555495
  //   out2 = 3 cos 1 + 1 sin 1        =  2.4623779024123156
  //   out1 = 2 cos .01 - 4 sin .01    =  1.959900667496664
  //   out3 = 4 cos .01 + 2 sin .01    =  4.019799668334994
  const std::vector<double> x = {1, 2, 3, 4};
  std::vector<double> r = apply_rope(x, 1, 1, 4, {1}, RopeMode::Llama);
  EXPECT_NEAR(r[0], -1.9841106485555495, kTol);
  EXPECT_NEAR(r[1], 1.959900667496664, kTol);
  EXPECT_NEAR(r[2], 2.4623779024123156, kTol);
  EXPECT_NEAR(r[3], 4.019799668334994, kTol);
  // Position 0 is the identity; position 2 with rope_scale 2 equals position 1.
  std::vector<double> r0 = apply_rope(x, 1, 1, 4, {0}, RopeMode::Llama);
  for (int d = 0; d < 4; ++d) EXPECT_EQ(r0[d], x[d]);
  RopeParams scaled;
  scaled.scale = 2.0;
  std::vector<double> r2 = apply_rope(x, 1, 1, 4, {2}, RopeMode::Llama, scaled);
  for (int d = 0; d < 4; ++d) EXPECT_NEAR(r2[d], r[d], kTol);
  // None leaves x as is.
  EXPECT_EQ(apply_rope(x, 1, 1, 4, {5}, RopeMode::None), x);
}

TEST(Rope, PerRowPositionsAndHeads) {
  // Two rows x two heads: each (row, head) is rotated by its row's position only.
  const std::vector<double> x = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4};
  std::vector<double> r = apply_rope(x, 2, 2, 4, {0, 1}, RopeMode::Llama);
  const std::vector<double> at1 = apply_rope({1, 2, 3, 4}, 1, 1, 4, {1}, RopeMode::Llama);
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(r[0 + d], x[d]);
    EXPECT_EQ(r[4 + d], x[d]);
    EXPECT_NEAR(r[8 + d], at1[d], kTol);
    EXPECT_NEAR(r[12 + d], at1[d], kTol);
  }
}

TEST(Rope, Llama31FrequencyScaling) {
  // D = 6 and theta = (4096 / 2pi)^3 give freq = 1, 2pi/4096, (2pi/4096)^2, i.e. wavelengths
  // 2pi, 4096 and 4096^2/(2pi). Defaults: factor 8, low_ff 1, high_ff 4, original 8192:
  // high-frequency wavelength bound 8192/4 = 2048, low-frequency bound 8192/1 = 8192.
  //   2pi < 2048          -> kept: 1
  //   2048 <= 4096 <= 8192 -> smooth = (8192/4096 - 1) / (4 - 1) = 1/3,
  //                          freq' = (2/3) f / 8 + (1/3) f = 5/12 f
  //   4096^2/(2pi) > 8192 -> f / 8
  const double two_pi = 2.0 * 3.14159265358979323846;
  const double f1 = two_pi / 4096.0;
  RopeParams p;
  p.theta = std::pow(4096.0 / two_pi, 3.0);
  const std::vector<double> f = rope_frequencies(6, RopeMode::Llama31, p);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_NEAR(f[0], 1.0, 1e-15);
  EXPECT_NEAR(f[1] / (f1 * 5.0 / 12.0), 1.0, 1e-12);
  EXPECT_NEAR(f[2] / (f1 * f1 / 8.0), 1.0, 1e-12);
  // Plain Llama mode keeps all three.
  const std::vector<double> g = rope_frequencies(6, RopeMode::Llama, p);
  EXPECT_NEAR(g[1] / f1, 1.0, 1e-12);
  EXPECT_NEAR(g[2] / (f1 * f1), 1.0, 1e-12);
  // apply_rope uses the scaled frequencies: position 1 rotates pair (1, 4) by angle f[1].
  std::vector<double> x(6, 0.0);
  x[1] = 1.0;
  std::vector<double> r = apply_rope(x, 1, 1, 6, {1}, RopeMode::Llama31, p);
  EXPECT_NEAR(r[1], std::cos(f1 * 5.0 / 12.0), 1e-15);
  EXPECT_NEAR(r[4], std::sin(f1 * 5.0 / 12.0), 1e-15);
}

TEST(Rope, AttentionRotatesQueriesAndKeysAtAbsolutePositions) {
  // attention_single with RoPE equals attention without RoPE on q, k rotated by apply_rope at
  // q positions p_i + q_offset and k positions j + k_offset.
  const HeadConfig h{4, 2, 8};
  const int64_t qo = 3, kv = 7, b = 1;
  const auto q = random_normal(qo * 4 * 8, 11), k = random_normal(kv * 2 * 8, 12),
             v = random_normal(kv * 2 * 8, 13);
  Options opts;
  opts.causal = true;
  opts.rope = RopeMode::Llama;
  opts.rope_q_offset = {0, 5};
  opts.rope_k_offset = {0, -2};
  State with = attention_single(q, k, v, qo, kv, h, opts, b);
  std::vector<int64_t> qpos, kpos;
  for (int64_t i = 0; i < qo; ++i) qpos.push_back(kv - qo + i + 5);
  for (int64_t j = 0; j < kv; ++j) kpos.push_back(j - 2);
  Options plain = opts;
  plain.rope = RopeMode::None;
  State manual = attention_single(apply_rope(q, qo, 4, 8, qpos, RopeMode::Llama),
                                  apply_rope(k, kv, 2, 8, kpos, RopeMode::Llama), v, qo, kv, h,
                                  plain, b);
  EXPECT_LE(rel_error(with.o, manual.o), 1e-13);
  EXPECT_LE(max_abs_error(with.lse, manual.lse), 1e-13);
  // RoPE only sees relative positions: shifting both offsets by the same amount changes nothing,
  // while shifting only one does.
  Options shifted = opts;
  shifted.rope_q_offset = {0, 105};
  shifted.rope_k_offset = {0, 98};
  State s2 = attention_single(q, k, v, qo, kv, h, shifted, b);
  EXPECT_LE(rel_error(s2.o, with.o), 1e-10);
  shifted.rope_k_offset = {0, 0};
  State s3 = attention_single(q, k, v, qo, kv, h, shifted, b);
  EXPECT_GT(rel_error(s3.o, with.o), 1e-3);
}

TEST(Lse, BaseConversion) {
  const std::vector<double> nat = {std::log(8.0), 0.0, -kInf, 1.0};
  const std::vector<double> l2 = lse_natural_to_log2(nat);
  EXPECT_NEAR(l2[0], 3.0, kTol);
  EXPECT_EQ(l2[1], 0.0);
  EXPECT_EQ(l2[2], -kInf);
  EXPECT_NEAR(l2[3], 1.0 / kLn2, kTol);
  const std::vector<double> back = lse_log2_to_natural(l2);
  EXPECT_LE(max_abs_error(back, nat), kTol);
  EXPECT_TRUE(std::isnan(lse_natural_to_log2({kNaN})[0]));
}

// ------------------------------------------------------------------------------------------------
// Independent naive cross-check: dense logits from the formulas, exp without max subtraction.
// ------------------------------------------------------------------------------------------------

State naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, int64_t qo, int64_t kv, const HeadConfig& hc,
                      const Options& o, int64_t b) {
  const int64_t Hq = hc.num_qo_heads, Hkv = hc.num_kv_heads, D = hc.head_dim;
  std::vector<double> qr = q, kr = k;
  if (o.rope != RopeMode::None) {
    std::vector<int64_t> qp(qo), kp(kv);
    for (int64_t i = 0; i < qo; ++i) qp[i] = kv - qo + i + (o.rope_q_offset.empty() ? 0 : o.rope_q_offset[b]);
    for (int64_t j = 0; j < kv; ++j) kp[j] = j + (o.rope_k_offset.empty() ? 0 : o.rope_k_offset[b]);
    qr = apply_rope(q, qo, Hq, D, qp, o.rope, o.rope_params);
    kr = apply_rope(k, kv, Hkv, D, kp, o.rope, o.rope_params);
  }
  const double scale = o.sm_scale < 0 ? 1.0 / std::sqrt(double(D)) : o.sm_scale;
  State s;
  s.rows = qo;
  s.heads = Hq;
  s.head_dim = D;
  s.o.assign(qo * Hq * D, 0.0);
  s.lse.assign(qo * Hq, 0.0);
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t g = h / (Hq / Hkv);
    for (int64_t i = 0; i < qo; ++i) {
      const int64_t p = kv - qo + i;
      double denom = 0.0;
      std::vector<double> num(D, 0.0);
      for (int64_t j = 0; j < kv; ++j) {
        bool vis = true;
        if (o.causal) vis = vis && j <= p;
        if (o.window_left >= 0) vis = vis && (j >= p - o.window_left || j < o.num_sink_tokens);
        if (!o.custom_mask_indptr.empty()) vis = vis && o.custom_mask[o.custom_mask_indptr[b] + i * kv + j];
        if (!vis) continue;
        double x = 0.0;
        for (int64_t d = 0; d < D; ++d) x += qr[(i * Hq + h) * D + d] * kr[(j * Hkv + g) * D + d];
        x *= scale;
        if (!o.alibi_slopes.empty()) x += o.alibi_slopes[h] * double(j - p);
        if (o.logits_soft_cap > 0) x = o.logits_soft_cap * std::tanh(x / o.logits_soft_cap);
        const double w = o.use_softmax ? std::exp(x) : 1.0 / (1.0 + std::exp(-x - o.sigmoid_bias));
        denom += w;
        for (int64_t d = 0; d < D; ++d) num[d] += w * v[(j * Hkv + g) * D + d];
      }
      for (int64_t d = 0; d < D; ++d) {
        s.o[(i * Hq + h) * D + d] = o.use_softmax ? (denom > 0 ? num[d] / denom : 0.0) : num[d];
      }
      s.lse[i * Hq + h] = o.use_softmax ? std::log(denom) : kNaN;  // log(0) = -inf
    }
  }
  return s;
}

TEST(NaiveCrossCheck, RandomVariantsAgree) {
  std::mt19937_64 gen(2024);
  auto uni = [&](int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(gen() % static_cast<uint64_t>(hi - lo + 1));
  };
  const int64_t groups[] = {1, 2, 4, 5, 7, 8};
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t Hkv = uni(1, 2), g = groups[uni(0, 5)], D = 2 * uni(1, 8);
    const HeadConfig hc{Hkv * g, Hkv, D};
    const int64_t kv = uni(0, 20), qo = uni(0, 8);
    const int64_t B = 3, b = uni(0, B - 1);
    Options o;
    o.causal = uni(0, 1) == 1;
    o.window_left = uni(0, 2) == 0 ? uni(0, 6) : -1;
    o.num_sink_tokens = uni(0, 2) == 0 ? uni(0, 3) : 0;
    o.logits_soft_cap = uni(0, 2) == 0 ? 1.5 : 0.0;
    if (uni(0, 2) == 0) o.alibi_slopes = alibi_slopes(hc.num_qo_heads);
    o.use_softmax = uni(0, 3) != 0;
    o.sigmoid_bias = uni(0, 1) ? -0.7 : 0.0;
    if (uni(0, 2) == 0) o.sm_scale = 0.3;
    if (uni(0, 1) == 1) {
      o.rope = uni(0, 1) ? RopeMode::Llama : RopeMode::Llama31;
      o.rope_params.theta = 500.0;
      o.rope_params.llama31_original_max_position = 64.0;  // puts frequencies in all 3 ranges
      o.rope_q_offset = {uni(0, 9), uni(0, 9), uni(0, 9)};
      o.rope_k_offset = {uni(0, 9), uni(0, 9), uni(0, 9)};
    }
    if (uni(0, 2) == 0) {
      // Masks for 3 requests; only request b's has the right size (others are 1 entry each).
      o.custom_mask_indptr = {0};
      for (int64_t r = 0; r < B; ++r) {
        const int64_t n = r == b ? qo * kv : 1;
        for (int64_t e = 0; e < n; ++e) o.custom_mask.push_back(static_cast<uint8_t>(uni(0, 3) != 0));
        o.custom_mask_indptr.push_back(static_cast<int64_t>(o.custom_mask.size()));
      }
    }
    const auto q = random_normal(qo * hc.num_qo_heads * D, 100 + trial);
    const auto k = random_normal(kv * Hkv * D, 200 + trial);
    const auto v = random_normal(kv * Hkv * D, 300 + trial);
    const State got = attention_single(q, k, v, qo, kv, hc, o, b);
    const State want = naive_attention(q, k, v, qo, kv, hc, o, b);
    EXPECT_LE(rel_error(got.o, want.o), 1e-12) << "trial " << trial;
    if (o.use_softmax) {
      EXPECT_LE(max_abs_error(got.lse, want.lse), 1e-12) << "trial " << trial;
    } else {
      for (double x : got.lse) EXPECT_TRUE(std::isnan(x));
    }
  }
}

TEST(NaiveCrossCheck, LargeLogitsStayFinite) {
  // Logits around 1000 overflow a naive exp; the oracle subtracts the maximum.
  Options opts;
  opts.sm_scale = 1.0;
  State s = attention_single({1000, 0}, {1, 0, 0.999, 0}, {1, 0, 0, 1}, 1, 2, one_head(2), opts);
  // x = (1000, 999): P = (1/(1+e^-1), e^-1/(1+e^-1)), LSE = 1000 + ln(1 + e^-1).
  EXPECT_NEAR(s.o[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-12);
  EXPECT_NEAR(s.lse[0], 1000.0 + std::log(1.0 + std::exp(-1.0)), 1e-10);
}

TEST(NaiveCrossCheck, ThreadedRequestEqualsRowByRow) {
  // A request large enough for the oracle to split it over host threads (GQA, causal, ALiBi)
  // gives the same bits as each query row computed alone as a one-row request over the keys it
  // may see: the split never mixes up rows or heads.
  const int64_t qo_len = 37, kv_len = 301, Hq = 6, Hkv = 2, D = 64;
  const HeadConfig heads{Hq, Hkv, D};
  const std::vector<double> q = random_normal(qo_len * Hq * D, 11);
  const std::vector<double> k = random_normal(kv_len * Hkv * D, 12);
  const std::vector<double> v = random_normal(kv_len * Hkv * D, 13);
  Options opts;
  opts.causal = true;
  opts.alibi_slopes = alibi_slopes(Hq);
  const State all = attention_single(q, k, v, qo_len, kv_len, heads, opts);
  for (int64_t i = 0; i < qo_len; ++i) {
    const int64_t visible = kv_len - qo_len + i + 1;  // keys 0 .. position of row i
    const std::vector<double> qi(q.begin() + i * Hq * D, q.begin() + (i + 1) * Hq * D);
    const std::vector<double> ki(k.begin(), k.begin() + visible * Hkv * D);
    const std::vector<double> vi(v.begin(), v.begin() + visible * Hkv * D);
    const State row = attention_single(qi, ki, vi, 1, visible, heads, opts);
    for (int64_t x = 0; x < Hq * D; ++x) ASSERT_EQ(row.o[x], all.o[i * Hq * D + x]) << "row " << i;
    for (int64_t h = 0; h < Hq; ++h) ASSERT_EQ(row.lse[h], all.lse[i * Hq + h]) << "row " << i;
  }
}

// ------------------------------------------------------------------------------------------------
// Argument validation
// ------------------------------------------------------------------------------------------------

TEST(Validation, RejectsInconsistentArguments) {
  Options opts;
  // Hq not a multiple of Hkv.
  EXPECT_THROW(attention_single({0, 0, 0}, {0, 0}, {0, 0}, 1, 1, HeadConfig{3, 2, 1}, opts),
               std::invalid_argument);
  // Wrong q size.
  EXPECT_THROW(attention_single({0, 0, 0}, {0, 0}, {0, 0}, 1, 1, one_head(2), opts),
               std::invalid_argument);
  // ALiBi slope count.
  Options alibi;
  alibi.alibi_slopes = {0.5, 0.25};
  EXPECT_THROW(attention_single({0, 0}, {0, 0}, {0, 0}, 1, 1, one_head(2), alibi),
               std::invalid_argument);
  // Custom mask of the wrong size.
  Options mask;
  mask.custom_mask = {1, 1, 1};
  mask.custom_mask_indptr = {0, 3};
  EXPECT_THROW(attention_single({0, 0}, {0, 0}, {0, 0}, 1, 1, one_head(2), mask),
               std::invalid_argument);
  // Ragged indptr that does not cover the packed tensor.
  EXPECT_THROW(attention_ragged({0, 0, 0, 0}, {0, 1}, {0, 0}, {0, 0}, {0, 1}, one_head(2), opts),
               std::invalid_argument);
  // Decreasing indptr.
  EXPECT_THROW(attention_ragged({0, 0}, {0, 1, 0, 1}, {0, 0}, {0, 0}, {0, 1, 1, 1}, one_head(2), opts),
               std::invalid_argument);
  // Per-request option vector of the wrong length in a batch call.
  Options bad_offsets;
  bad_offsets.rope_q_offset = {0, 0};
  EXPECT_THROW(attention_ragged({0, 0}, {0, 1}, {0, 0}, {0, 0}, {0, 1}, one_head(2), bad_offsets),
               std::invalid_argument);
  // Paged cache with a bad last_page_len and an out-of-range page index.
  PagedCache c = build_paged({{1, 2, 3, 4}}, {{1, 2, 3, 4}}, {2}, 1, 2, 4, Layout::NHD);
  EXPECT_NO_THROW(attention_paged({0, 0}, {0, 1}, c, one_head(2), opts));
  PagedCache bad = c;
  bad.last_page_len = {5};
  EXPECT_THROW(attention_paged({0, 0}, {0, 1}, bad, one_head(2), opts), std::invalid_argument);
  bad = c;
  bad.last_page_len = {0};
  EXPECT_THROW(attention_paged({0, 0}, {0, 1}, bad, one_head(2), opts), std::invalid_argument);
  bad = c;
  bad.indices = {1};
  EXPECT_THROW(attention_paged({0, 0}, {0, 1}, bad, one_head(2), opts), std::invalid_argument);
  // Block-sparse: duplicate block, out-of-range block, wrong indptr length.
  BlockSparse bsr{2, 2, {0, 2}, {0, 0}};
  EXPECT_THROW(attention_block_sparse({0, 0}, {0, 0}, {0, 0}, 1, 1, bsr, one_head(2), opts),
               std::invalid_argument);
  bsr.indptr = {0, 1};
  bsr.indices = {1};
  EXPECT_THROW(attention_block_sparse({0, 0}, {0, 0}, {0, 0}, 1, 1, bsr, one_head(2), opts),
               std::invalid_argument);
  bsr.indptr = {0, 0, 0};
  EXPECT_THROW(attention_block_sparse({0, 0}, {0, 0}, {0, 0}, 1, 1, bsr, one_head(2), opts),
               std::invalid_argument);
  // kv placement that does not fit.
  Options place;
  place.kv_position_offset = {3};
  place.logical_kv_len = {3};
  EXPECT_THROW(attention_single({0, 0}, {0, 0}, {0, 0}, 1, 1, one_head(2), place),
               std::invalid_argument);
  // Merge of states with different shapes.
  State a = attention_single({0, 0}, {0, 0}, {0, 0}, 1, 1, one_head(2), opts);
  State b2 = attention_single({0, 0, 0, 0}, {0, 0}, {0, 0}, 2, 1, one_head(2), opts);
  EXPECT_THROW(merge_state(a, b2), std::invalid_argument);
  EXPECT_THROW(merge_states({}), std::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// Utilities
// ------------------------------------------------------------------------------------------------

TEST(Utilities, RelativeAndMaxAbsError) {
  EXPECT_DOUBLE_EQ(rel_error(std::vector<double>{1, 1}, std::vector<double>{1, 0}), 1.0);
  EXPECT_DOUBLE_EQ(rel_error(std::vector<double>{3, 4}, std::vector<double>{0, 0}), kInf);
  EXPECT_DOUBLE_EQ(rel_error(std::vector<double>{0, 0}, std::vector<double>{0, 0}), 0.0);
  EXPECT_DOUBLE_EQ(max_abs_error(std::vector<double>{1, 5}, std::vector<double>{1.5, 3}), 2.0);
  // NaN anywhere fails.
  EXPECT_EQ(rel_error(std::vector<double>{kNaN, 1}, std::vector<double>{1, 1}), kInf);
  EXPECT_EQ(rel_error(std::vector<double>{1, 1}, std::vector<double>{1, kNaN}), kInf);
  EXPECT_EQ(max_abs_error(std::vector<double>{kNaN}, std::vector<double>{1}), kInf);
  // Equal -inf entries (empty rows) are 0 error; a mismatch is infinite.
  EXPECT_DOUBLE_EQ(max_abs_error(std::vector<double>{-kInf, 2}, std::vector<double>{-kInf, 2.5}), 0.5);
  EXPECT_DOUBLE_EQ(rel_error(std::vector<double>{-kInf, 2}, std::vector<double>{-kInf, 2}), 0.0);
  EXPECT_EQ(max_abs_error(std::vector<double>{-kInf}, std::vector<double>{1}), kInf);
  EXPECT_EQ(max_abs_error(std::vector<double>{-kInf}, std::vector<double>{kInf}), kInf);
  // float outputs.
  EXPECT_NEAR(rel_error(std::vector<float>{1.0f, 1.0f}, std::vector<double>{1, 0}), 1.0, 1e-7);
  EXPECT_EQ(max_abs_error(std::vector<float>{std::numeric_limits<float>::quiet_NaN()},
                          std::vector<double>{0}),
            kInf);
}

TEST(Utilities, RandomNormalIsDeterministicAndStandard) {
  const auto a = random_normal(100000, 42), b = random_normal(100000, 42), c = random_normal(10, 43);
  EXPECT_EQ(a, b);
  EXPECT_NE(std::vector<double>(a.begin(), a.begin() + 10), c);
  double mean = 0, var = 0;
  for (double x : a) mean += x;
  mean /= a.size();
  for (double x : a) var += (x - mean) * (x - mean);
  var /= a.size();
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 1.0, 0.03);
  const auto shifted = random_normal(3, 42, 10.0, 2.0);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(shifted[i], 10.0 + 2.0 * a[i], 1e-12);
  std::mt19937_64 gen(42);
  std::vector<double> odd(5);
  fill_normal(odd, gen);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(odd[i], a[i]);
}

}  // namespace
