// Attention-state merge: hand values, algebraic laws, split-KV equivalence, variable-length and
// base-2 merges.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "test_helpers.h"
#include "reference/oracle.h"

namespace {

using namespace tessera_ref;
using namespace tessera_ref_test;

State make(int64_t rows, int64_t heads, int64_t D, std::vector<double> o, std::vector<double> lse) {
  State s;
  s.rows = rows;
  s.heads = heads;
  s.head_dim = D;
  s.o = std::move(o);
  s.lse = std::move(lse);
  return s;
}

// Random state [rows, heads, D] with LSE in [-6, 6] and about 1 in 8 entries empty (-inf, O = 0).
State random_state(int64_t rows, int64_t heads, int64_t D, uint64_t seed) {
  State s = make(rows, heads, D, random_normal(rows * heads * D, seed),
                 random_normal(rows * heads, seed + 1, 0.0, 3.0));
  std::mt19937_64 gen(seed + 2);
  for (int64_t n = 0; n < rows * heads; ++n) {
    if (gen() % 8 == 0) {
      s.lse[n] = -kInf;
      for (int64_t d = 0; d < D; ++d) s.o[n * D + d] = 0.0;
    }
  }
  return s;
}

void expect_near(const State& a, const State& b, double tol, const std::string& what) {
  ASSERT_EQ(a.o.size(), b.o.size()) << what;
  EXPECT_LE(max_abs_error(a.o, b.o), tol) << what;
  EXPECT_LE(max_abs_error(a.lse, b.lse), tol) << what;
}

TEST(Merge, HandComputed) {
  // a: LSE = 0 (sum e^x = 1), O = (1, 2); b: LSE = ln 3, O = (5, 6).
  // LSE = ln(1 + 3) = ln 4; O = 1/4 (1, 2) + 3/4 (5, 6) = (4, 5).
  const State a = make(1, 1, 2, {1, 2}, {0.0});
  const State b = make(1, 1, 2, {5, 6}, {std::log(3.0)});
  const State m = merge_state(a, b);
  EXPECT_NEAR(m.lse[0], std::log(4.0), 1e-15);
  EXPECT_NEAR(m.o[0], 4.0, 1e-14);
  EXPECT_NEAR(m.o[1], 5.0, 1e-14);
  // Base 2: LSE_a = 0, LSE_b = log2 3 -> log2 4 = 2, same O.
  const State m2 = merge_state(make(1, 1, 2, {1, 2}, {0.0}), make(1, 1, 2, {5, 6}, {std::log2(3.0)}), true);
  EXPECT_NEAR(m2.lse[0], 2.0, 1e-15);
  EXPECT_NEAR(m2.o[0], 4.0, 1e-14);
  EXPECT_NEAR(m2.o[1], 5.0, 1e-14);
}

TEST(Merge, EmptyStates) {
  const State a = random_state(5, 3, 4, 1);
  State empty = make(5, 3, 4, std::vector<double>(5 * 3 * 4, 0.0), std::vector<double>(5 * 3, -kInf));
  // Identity, exactly, on either side.
  const State l = merge_state(empty, a), r = merge_state(a, empty);
  EXPECT_EQ(l.o, a.o);
  EXPECT_EQ(l.lse, a.lse);
  EXPECT_EQ(r.o, a.o);
  EXPECT_EQ(r.lse, a.lse);
  // Both empty: O = 0, LSE = -inf (no NaN from -inf - -inf).
  const State e = merge_state(empty, empty);
  for (double x : e.o) EXPECT_EQ(x, 0.0);
  for (double x : e.lse) EXPECT_EQ(x, -kInf);
  EXPECT_EQ(merge_state(empty, empty, true).lse, empty.lse);
}

TEST(Merge, CommutativeAndAssociative) {
  for (uint64_t seed = 10; seed < 20; ++seed) {
    const State a = random_state(6, 4, 8, seed * 3), b = random_state(6, 4, 8, seed * 3 + 100),
                c = random_state(6, 4, 8, seed * 3 + 200);
    for (bool base2 : {false, true}) {
      const std::string what = "seed " + std::to_string(seed) + (base2 ? " base2" : "");
      expect_near(merge_state(a, b, base2), merge_state(b, a, base2), 1e-12, what + " commutative");
      expect_near(merge_state(merge_state(a, b, base2), c, base2),
                  merge_state(a, merge_state(b, c, base2), base2), 1e-12, what + " associative");
      expect_near(merge_states({a, b, c}, base2), merge_states({c, a, b}, base2), 1e-12,
                  what + " order");
    }
  }
}

TEST(Merge, MergeLevelsIsTheOrderedFold) {
  const State a = random_state(3, 2, 5, 1), b = random_state(3, 2, 5, 2), c = random_state(3, 2, 5, 3);
  const State fold = merge_state(merge_state(a, b), c);
  const State levels = merge_levels({a, b, c});
  EXPECT_EQ(levels.o, fold.o);
  EXPECT_EQ(levels.lse, fold.lse);
  const State single = merge_levels({a});
  EXPECT_EQ(single.o, a.o);
}

TEST(Merge, Base2AgreesWithNaturalAfterConversion) {
  const State a = random_state(7, 3, 6, 40), b = random_state(7, 3, 6, 41);
  const State nat = merge_state(a, b);
  State a2 = a, b2 = b;
  a2.lse = lse_natural_to_log2(a.lse);
  b2.lse = lse_natural_to_log2(b.lse);
  const State m2 = merge_state(a2, b2, true);
  EXPECT_LE(max_abs_error(m2.o, nat.o), 1e-12);
  EXPECT_LE(max_abs_error(lse_log2_to_natural(m2.lse), nat.lse), 1e-12);
  // Mixing bases is wrong, and the test can tell.
  EXPECT_GT(max_abs_error(merge_state(a2, b2, false).o, nat.o), 1e-3);
}

// Splits each request's KV into 1..5 random chunks, computes each chunk's state at its absolute
// positions and merges: the result equals attention over the whole KV.
void check_split_kv(const Options& opts, uint64_t seed, const std::string& tag) {
  std::mt19937_64 gen(seed);
  const HeadConfig heads{8, 2, 8};
  const std::vector<int64_t> qo_lens = {1, 5, 9, 3, 0, 2};
  const std::vector<int64_t> kv_lens = {40, 5, 23, 1, 6, 0};
  const Batch b = make_batch(heads, qo_lens, kv_lens, seed);
  Options with_mask = opts;
  if (!opts.custom_mask.empty()) add_random_mask(with_mask, b, 0.6, seed + 1);
  const int64_t kvrow = heads.num_kv_heads * heads.head_dim;
  for (int64_t r = 0; r < b.size(); ++r) {
    const State whole = attention_single(b.q[r], b.k[r], b.v[r], qo_lens[r], kv_lens[r], heads,
                                         with_mask, r);
    const int64_t chunks = 1 + static_cast<int64_t>(gen() % 5);
    std::vector<int64_t> cuts = {0, kv_lens[r]};
    for (int64_t c = 1; c < chunks; ++c) cuts.push_back(static_cast<int64_t>(gen() % (kv_lens[r] + 1)));
    std::sort(cuts.begin(), cuts.end());  // empty chunks are allowed
    std::vector<State> parts;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      Options o = with_mask;
      o.kv_position_offset.assign(b.size(), 0);
      o.logical_kv_len = kv_lens;
      o.kv_position_offset[r] = cuts[c];
      parts.push_back(attention_single(b.q[r], slice_rows(b.k[r], kvrow, cuts[c], cuts[c + 1]),
                                       slice_rows(b.v[r], kvrow, cuts[c], cuts[c + 1]), qo_lens[r],
                                       cuts[c + 1] - cuts[c], heads, o, r));
    }
    const std::string what = tag + " request " + std::to_string(r) + " chunks " + std::to_string(chunks);
    expect_near(merge_states(parts), whole, 1e-12, what);

    // Same through merge_states_varlen: states of row i are the chunks' row i, in chunk order.
    std::vector<double> v, s;
    std::vector<int32_t> indptr = {0};
    for (int64_t i = 0; i < qo_lens[r]; ++i) {
      for (const State& p : parts) {
        v.insert(v.end(), p.o.begin() + i * heads.num_qo_heads * heads.head_dim,
                 p.o.begin() + (i + 1) * heads.num_qo_heads * heads.head_dim);
        s.insert(s.end(), p.lse.begin() + i * heads.num_qo_heads,
                 p.lse.begin() + (i + 1) * heads.num_qo_heads);
      }
      indptr.push_back(static_cast<int32_t>(indptr.back() + parts.size()));
    }
    expect_near(merge_states_varlen(v, s, indptr, heads.num_qo_heads, heads.head_dim), whole,
                1e-12, what + " varlen");
    const State v2 = merge_states_varlen(v, lse_natural_to_log2(s), indptr, heads.num_qo_heads,
                                         heads.head_dim, true);
    EXPECT_LE(max_abs_error(v2.o, whole.o), 1e-12) << what << " varlen base2";
    EXPECT_LE(max_abs_error(lse_log2_to_natural(v2.lse), whole.lse), 1e-12) << what << " varlen base2";
  }
}

TEST(SplitKv, NonCausal) { check_split_kv(Options{}, 1, "non-causal"); }

TEST(SplitKv, Causal) {
  Options o;
  o.causal = true;
  check_split_kv(o, 2, "causal");
}

TEST(SplitKv, CausalSlidingWindowWithSinks) {
  Options o;
  o.causal = true;
  o.window_left = 6;
  o.num_sink_tokens = 2;
  check_split_kv(o, 3, "window");
}

TEST(SplitKv, NonCausalWindow) {
  Options o;
  o.window_left = 3;
  check_split_kv(o, 4, "non-causal window");
}

TEST(SplitKv, PositionDependentVariants) {
  Options o;
  o.causal = true;
  o.alibi_slopes = alibi_slopes(8);
  o.logits_soft_cap = 5.0;
  o.rope = RopeMode::Llama;
  o.rope_q_offset = {1, 2, 3, 4, 5, 6};
  o.rope_k_offset = {0, 0, 9, 0, 0, 0};
  o.custom_mask = {1};  // replaced by a random mask for the batch
  check_split_kv(o, 5, "alibi+softcap+rope+mask");
}

TEST(MergeVarlen, MatchesFoldAndHandlesRowsWithoutStates) {
  std::mt19937_64 gen(77);
  const int64_t H = 3, D = 4, rows = 9;
  std::vector<int32_t> indptr = {0};
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t n = r == 0 || r == 5 ? 0 : static_cast<int32_t>(gen() % 5);  // rows 0, 5: empty
    indptr.push_back(indptr.back() + n);
  }
  const int64_t total = indptr.back();
  const State packed = random_state(total, H, D, 78);
  const State got = merge_states_varlen(packed.o, packed.lse, indptr, H, D);
  ASSERT_EQ(got.rows, rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = indptr[r + 1] - indptr[r];
    std::vector<double> o_row(got.o.begin() + r * H * D, got.o.begin() + (r + 1) * H * D);
    std::vector<double> l_row(got.lse.begin() + r * H, got.lse.begin() + (r + 1) * H);
    if (n == 0) {
      for (double x : o_row) EXPECT_EQ(x, 0.0);
      for (double x : l_row) EXPECT_EQ(x, -kInf);
      continue;
    }
    std::vector<State> states;
    for (int64_t t = indptr[r]; t < indptr[r + 1]; ++t) {
      states.push_back(make(1, H, D, slice_rows(packed.o, H * D, t, t + 1),
                            slice_rows(packed.lse, H, t, t + 1)));
    }
    const State fold = merge_states(states);
    EXPECT_LE(max_abs_error(o_row, fold.o), 1e-13) << "row " << r;
    EXPECT_LE(max_abs_error(l_row, fold.lse), 1e-13) << "row " << r;
  }
  // Base 2 after conversion.
  const State got2 = merge_states_varlen(packed.o, lse_natural_to_log2(packed.lse), indptr, H, D, true);
  EXPECT_LE(max_abs_error(got2.o, got.o), 1e-12);
  EXPECT_LE(max_abs_error(lse_log2_to_natural(got2.lse), got.lse), 1e-12);
}

}  // namespace
