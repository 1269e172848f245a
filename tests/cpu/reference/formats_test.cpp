// The same logical attention through every KV format of the oracle: dense per request, ragged,
// paged (NHD / HND, several page sizes, shuffled pages), block-sparse and composable levels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "test_helpers.h"
#include "reference/oracle.h"

namespace {

using namespace tessera_ref;
using namespace tessera_ref_test;

constexpr double kSame = 1e-13;   // same arithmetic, different data movement
constexpr double kMerged = 1e-12; // results that go through the state merge

// Expects two states to agree: O by relative error, LSE by max absolute error (-inf rows must match).
void expect_states_near(const State& got, const State& want, double tol, const std::string& what) {
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.o.size(), want.o.size()) << what;
  ASSERT_EQ(got.lse.size(), want.lse.size()) << what;
  EXPECT_LE(rel_error(got.o, want.o), tol) << what;
  EXPECT_LE(max_abs_error(got.lse, want.lse), tol) << what;
}

// Options of request b of a batch, re-indexed as request 0 (for the single-request BSR format).
Options options_for_request(const Options& o, int64_t b) {
  Options r = o;
  auto pick = [b](std::vector<int64_t>& v) {
    if (!v.empty()) v = {v[b]};
  };
  pick(r.rope_q_offset);
  pick(r.rope_k_offset);
  pick(r.kv_position_offset);
  pick(r.logical_kv_len);
  if (!o.custom_mask_indptr.empty()) {
    r.custom_mask.assign(o.custom_mask.begin() + o.custom_mask_indptr[b],
                         o.custom_mask.begin() + o.custom_mask_indptr[b + 1]);
    r.custom_mask_indptr = {0, o.custom_mask_indptr[b + 1] - o.custom_mask_indptr[b]};
  }
  return r;
}

// BSR with every block present for an M x N request.
BlockSparse full_bsr(int64_t M, int64_t N, int64_t Br, int64_t Bc) {
  BlockSparse bsr{Br, Bc, {0}, {}};
  const int64_t rb = (M + Br - 1) / Br, cb = (N + Bc - 1) / Bc;
  for (int64_t r = 0; r < rb; ++r) {
    // Listed in reverse order: the order of a block row's blocks must not matter.
    for (int64_t c = cb - 1; c >= 0; --c) bsr.indices.push_back(static_cast<int32_t>(c));
    bsr.indptr.push_back(static_cast<int32_t>(bsr.indices.size()));
  }
  return bsr;
}

// Runs the batch through every format and compares with the per-request dense reference.
void check_all_formats(const Batch& b, const Options& opts, uint64_t seed, const std::string& tag) {
  const State ref = per_request_reference(b, opts);
  const int64_t qrow = b.heads.num_qo_heads * b.heads.head_dim;
  const int64_t kvrow = b.heads.num_kv_heads * b.heads.head_dim;

  // Ragged.
  expect_states_near(attention_ragged(b.q_packed, b.qo_indptr, b.k_packed, b.v_packed, b.kv_indptr,
                                      b.heads, opts),
                     ref, kSame, tag + " ragged");

  // Paged: both layouts, page sizes 1, 3, 16, pages in order and shuffled with spare pages.
  for (Layout layout : {Layout::NHD, Layout::HND}) {
    for (int64_t ps : {1, 3, 16}) {
      for (uint64_t shuffle : {uint64_t{0}, seed + 17}) {
        const PagedCache cache = build_paged(b.k, b.v, b.kv_lens, b.heads.num_kv_heads,
                                             b.heads.head_dim, ps, layout, shuffle,
                                             shuffle ? 5 : 0);
        const std::string what = tag + " paged layout=" + (layout == Layout::NHD ? "NHD" : "HND") +
                                 " page_size=" + std::to_string(ps) +
                                 " shuffle=" + std::to_string(shuffle);
        expect_states_near(attention_paged(b.q_packed, b.qo_indptr, cache, b.heads, opts), ref,
                           kSame, what);
      }
    }
  }

  // Block-sparse with all blocks present, one request at a time.
  const int64_t shapes[][2] = {{1, 1}, {3, 5}, {16, 16}, {4, 2}, {64, 7}};
  for (int64_t r = 0; r < b.size(); ++r) {
    const Options ro = options_for_request(opts, r);
    const State want = attention_single(b.q[r], b.k[r], b.v[r], b.qo_lens[r], b.kv_lens[r],
                                        b.heads, ro, 0);
    for (const auto& shape : shapes) {
      const BlockSparse bsr = full_bsr(b.qo_lens[r], b.kv_lens[r], shape[0], shape[1]);
      expect_states_near(attention_block_sparse(b.q[r], b.k[r], b.v[r], b.qo_lens[r],
                                                b.kv_lens[r], bsr, b.heads, ro),
                         want, kSame,
                         tag + " bsr request " + std::to_string(r) + " Br=" +
                             std::to_string(shape[0]) + " Bc=" + std::to_string(shape[1]));
    }
  }

  // Composable: per request a prefix [0, P) in a ragged level and a suffix [P, kv_len) in a paged
  // level, each placed at its absolute positions, merged with merge_levels.
  std::mt19937_64 gen(seed);
  std::vector<double> k_pre, v_pre;
  std::vector<int32_t> pre_indptr{0};
  std::vector<std::vector<double>> k_suf, v_suf;
  std::vector<int64_t> suf_lens, prefix_offsets, suffix_offsets, logical;
  for (int64_t r = 0; r < b.size(); ++r) {
    const int64_t P = static_cast<int64_t>(gen() % static_cast<uint64_t>(b.kv_lens[r] + 1));
    k_pre.insert(k_pre.end(), b.k[r].begin(), b.k[r].begin() + P * kvrow);
    v_pre.insert(v_pre.end(), b.v[r].begin(), b.v[r].begin() + P * kvrow);
    pre_indptr.push_back(static_cast<int32_t>(pre_indptr.back() + P));
    k_suf.push_back(slice_rows(b.k[r], kvrow, P, b.kv_lens[r]));
    v_suf.push_back(slice_rows(b.v[r], kvrow, P, b.kv_lens[r]));
    suf_lens.push_back(b.kv_lens[r] - P);
    prefix_offsets.push_back(0);
    suffix_offsets.push_back(P);
    logical.push_back(b.kv_lens[r]);
  }
  Options o1 = opts, o2 = opts;
  o1.kv_position_offset = prefix_offsets;
  o1.logical_kv_len = logical;
  o2.kv_position_offset = suffix_offsets;
  o2.logical_kv_len = logical;
  const State level1 = attention_ragged(b.q_packed, b.qo_indptr, k_pre, v_pre, pre_indptr, b.heads, o1);
  const PagedCache suffix_cache = build_paged(k_suf, v_suf, suf_lens, b.heads.num_kv_heads,
                                              b.heads.head_dim, 3, Layout::HND, seed + 5, 2);
  const State level2 = attention_paged(b.q_packed, b.qo_indptr, suffix_cache, b.heads, o2);
  expect_states_near(merge_levels({level1, level2}), ref, kMerged, tag + " composable prefix+suffix");
  expect_states_near(merge_levels({level2, level1}), ref, kMerged, tag + " composable suffix+prefix");
  (void)qrow;
}

// (Hq, Hkv): group sizes 1, 4, 5, 8 and MQA (Hkv = 1) with 6 and 7 query heads.
class FormatEquivalence
    : public ::testing::TestWithParam<std::tuple<std::tuple<int64_t, int64_t>, bool>> {};

TEST_P(FormatEquivalence, SameAttentionThroughEveryFormat) {
  const auto [hq, hkv] = std::get<0>(GetParam());
  const bool causal = std::get<1>(GetParam());
  const HeadConfig heads{hq, hkv, 8};
  // Includes empty requests (qo_len 0, kv_len 0), qo_len > kv_len (fully masked causal rows),
  // qo_len == kv_len and long KV.
  const std::vector<int64_t> qo_lens = {1, 0, 7, 5, 3, 13, 4, 0};
  const std::vector<int64_t> kv_lens = {9, 4, 0, 5, 2, 13, 33, 0};
  const uint64_t seed = static_cast<uint64_t>(hq * 31 + hkv * 7 + (causal ? 1 : 0));
  const Batch b = make_batch(heads, qo_lens, kv_lens, seed);
  Options opts;
  opts.causal = causal;
  const State ref = per_request_reference(b, opts);
  // The reference is not degenerate: finite outputs and, with causal, some empty rows.
  ASSERT_GT(ref.rows, 0);
  for (double x : ref.o) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(count_empty_rows(ref) > 7 * hq, causal);  // kv_len 0 request: 7 rows always empty
  check_all_formats(b, opts, seed, causal ? "causal" : "non-causal");
}

INSTANTIATE_TEST_SUITE_P(
    HeadsAndMask, FormatEquivalence,
    ::testing::Combine(::testing::Values(std::make_tuple(int64_t{3}, int64_t{3}),
                                         std::make_tuple(int64_t{8}, int64_t{2}),
                                         std::make_tuple(int64_t{10}, int64_t{2}),
                                         std::make_tuple(int64_t{16}, int64_t{2}),
                                         std::make_tuple(int64_t{6}, int64_t{1}),
                                         std::make_tuple(int64_t{7}, int64_t{1})),
                       ::testing::Bool()));

TEST(FormatEquivalence, EveryVariantThroughEveryFormat) {
  // Per-request options (custom mask, RoPE offsets) must follow their request through the batch
  // functions; position-dependent variants must see absolute positions in the split levels.
  const HeadConfig heads{10, 2, 8};
  const std::vector<int64_t> qo_lens = {3, 0, 6, 1, 9};
  const std::vector<int64_t> kv_lens = {11, 3, 6, 17, 9};
  const Batch b = make_batch(heads, qo_lens, kv_lens, 99);
  Options opts;
  opts.causal = true;
  opts.window_left = 4;
  opts.num_sink_tokens = 2;
  opts.logits_soft_cap = 3.0;
  opts.alibi_slopes = alibi_slopes(10);
  opts.rope = RopeMode::Llama31;
  opts.rope_params.theta = 1000.0;
  opts.rope_params.llama31_original_max_position = 32.0;
  opts.rope_q_offset = {0, 1, 2, 3, 4};
  opts.rope_k_offset = {7, 0, 3, 0, 1};
  add_random_mask(opts, b, 0.7, 5);
  check_all_formats(b, opts, 3, "all variants");
  // Softmax-free: every format except the merged composable one (no LSE to merge).
  Options sig = opts;
  sig.use_softmax = false;
  sig.sigmoid_bias = 0.25;
  const State ref = per_request_reference(b, sig);
  EXPECT_LE(rel_error(attention_ragged(b.q_packed, b.qo_indptr, b.k_packed, b.v_packed,
                                       b.kv_indptr, heads, sig).o,
                      ref.o),
            kSame);
  const PagedCache cache = build_paged(b.k, b.v, b.kv_lens, 2, 8, 3, Layout::NHD, 4, 1);
  EXPECT_LE(rel_error(attention_paged(b.q_packed, b.qo_indptr, cache, heads, sig).o, ref.o), kSame);
}

// ------------------------------------------------------------------------------------------------
// Paged cache construction
// ------------------------------------------------------------------------------------------------

TEST(PagedCache, LayoutAddressingAndShuffle) {
  // Hkv = 2, D = 3, page size 4, requests of 6, 0 and 9 tokens -> 2 + 0 + 3 pages (+ 2 spare).
  const std::vector<int64_t> lens = {6, 0, 9};
  std::vector<std::vector<double>> k, v;
  for (size_t r = 0; r < lens.size(); ++r) {
    k.push_back(random_normal(lens[r] * 2 * 3, 500 + r));
    v.push_back(random_normal(lens[r] * 2 * 3, 600 + r));
  }
  for (Layout layout : {Layout::NHD, Layout::HND}) {
    const PagedCache c = build_paged(k, v, lens, 2, 3, 4, layout, 12345, 2);
    EXPECT_EQ(c.num_pages, 7);
    EXPECT_EQ(c.indptr, (std::vector<int32_t>{0, 2, 2, 5}));
    EXPECT_EQ(c.last_page_len, (std::vector<int32_t>{2, 0, 1}));
    EXPECT_EQ(paged_kv_len(c, 0), 6);
    EXPECT_EQ(paged_kv_len(c, 1), 0);
    EXPECT_EQ(paged_kv_len(c, 2), 9);
    // Pages are distinct and, with this seed, not simply 0..4 in order.
    std::set<int32_t> distinct(c.indices.begin(), c.indices.end());
    EXPECT_EQ(distinct.size(), c.indices.size());
    EXPECT_NE(c.indices, (std::vector<int32_t>{0, 1, 2, 3, 4}));
    // Token t of request r, head h, element d sits where the layout formula says.
    for (size_t r = 0; r < lens.size(); ++r) {
      for (int64_t t = 0; t < lens[r]; ++t) {
        const int64_t page = c.indices[c.indptr[r] + t / 4], slot = t % 4;
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t d = 0; d < 3; ++d) {
            const int64_t at = layout == Layout::NHD ? ((page * 4 + slot) * 2 + h) * 3 + d
                                                     : ((page * 2 + h) * 4 + slot) * 3 + d;
            EXPECT_EQ(c.k_pages[at], k[r][(t * 2 + h) * 3 + d]);
            EXPECT_EQ(c.v_pages[at], v[r][(t * 2 + h) * 3 + d]);
          }
        }
      }
      const DenseKV g = gather_paged(c, static_cast<int64_t>(r));
      EXPECT_EQ(g.kv_len, lens[r]);
      EXPECT_EQ(g.k, k[r]);
      EXPECT_EQ(g.v, v[r]);
    }
    // Slots that hold no token are poisoned with NaN: 7 pages * 4 slots - 15 tokens = 13 slots.
    int64_t nans = 0;
    for (double x : c.k_pages) nans += std::isnan(x) ? 1 : 0;
    EXPECT_EQ(nans, 13 * 2 * 3);
  }
  // Seed 0 keeps the pages in order; a finite fill value is honoured.
  const PagedCache plain = build_paged(k, v, lens, 2, 3, 4, Layout::NHD, 0, 0, -7.0);
  EXPECT_EQ(plain.indices, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(plain.k_pages.back(), -7.0);  // last page holds 1 token of 4
}

// ------------------------------------------------------------------------------------------------
// Shared-prefix (cascade) composable attention
// ------------------------------------------------------------------------------------------------

TEST(Composable, SharedPrefixLevelPlusUniqueSuffixes) {
  // B requests share a prefix of P tokens (one copy of its KV) and have unique suffixes; each
  // request's queries are its last qo_len positions, inside its suffix, so every prefix key
  // precedes every query. Reference: dense causal attention over prefix ++ suffix per request.
  const HeadConfig heads{8, 2, 16};
  const int64_t P = 21;
  const std::vector<int64_t> qo_lens = {1, 4, 0, 7, 2};
  const std::vector<int64_t> suf_lens = {3, 4, 2, 9, 5};
  const int64_t kvrow = heads.num_kv_heads * heads.head_dim;
  const auto k_prefix = random_normal(P * kvrow, 71), v_prefix = random_normal(P * kvrow, 72);
  const Batch suffix = make_batch(heads, qo_lens, suf_lens, 73);

  Batch full = suffix;  // same queries, KV = prefix ++ suffix
  for (int64_t r = 0; r < full.size(); ++r) {
    full.k[r].insert(full.k[r].begin(), k_prefix.begin(), k_prefix.end());
    full.v[r].insert(full.v[r].begin(), v_prefix.begin(), v_prefix.end());
    full.kv_lens[r] += P;
  }
  Options causal;
  causal.causal = true;
  const State ref = per_request_reference(full, causal);

  // Suffix level: ragged, causal, keys placed after the prefix.
  Options suf_opts = causal;
  suf_opts.kv_position_offset.assign(suffix.size(), P);
  suf_opts.logical_kv_len = full.kv_lens;
  const State suffix_level = attention_ragged(suffix.q_packed, suffix.qo_indptr, suffix.k_packed,
                                              suffix.v_packed, suffix.kv_indptr, heads, suf_opts);

  // Prefix level (a): block-sparse with all queries of all requests as M rows and the prefix as N
  // columns in one large row block (Br = 64 >= M), no causal mask needed.
  const int64_t M = suffix.qo_indptr.back();
  const State bsr_prefix = attention_block_sparse(suffix.q_packed, k_prefix, v_prefix, M, P,
                                                  full_bsr(M, P, 64, 8), heads, Options{});
  expect_states_near(merge_levels({bsr_prefix, suffix_level}), ref, kMerged, "bsr prefix level");

  // Prefix level (b): paged, every request's page list points at the same prefix pages (no KV is
  // copied), causal mask and absolute positions kept.
  const PagedCache one = build_paged({k_prefix}, {v_prefix}, {P}, 2, 16, 4, Layout::NHD, 9, 3);
  PagedCache shared = one;
  shared.indptr = {0};
  shared.indices.clear();
  shared.last_page_len.clear();
  for (int64_t r = 0; r < suffix.size(); ++r) {
    shared.indices.insert(shared.indices.end(), one.indices.begin(), one.indices.end());
    shared.indptr.push_back(static_cast<int32_t>(shared.indices.size()));
    shared.last_page_len.push_back(one.last_page_len[0]);
  }
  Options pre_opts = causal;
  pre_opts.logical_kv_len = full.kv_lens;  // keys at positions 0..P-1
  const State paged_prefix = attention_paged(suffix.q_packed, suffix.qo_indptr, shared, heads, pre_opts);
  expect_states_near(merge_levels({paged_prefix, suffix_level}), ref, kMerged, "paged prefix level");
  // The two prefix levels agree with each other as well.
  expect_states_near(paged_prefix, bsr_prefix, kSame, "prefix levels");
}

// ------------------------------------------------------------------------------------------------
// Block-sparse with missing blocks
// ------------------------------------------------------------------------------------------------

TEST(BlockSparse, RandomBlockSubsetEqualsDenseWithElementMask) {
  std::mt19937_64 gen(8);
  struct Case { int64_t M, N, Br, Bc, hq, hkv; };
  const Case cases[] = {{23, 37, 4, 5, 4, 1}, {16, 16, 16, 1, 5, 5}, {9, 40, 1, 8, 8, 2},
                        {30, 7, 7, 3, 10, 2}, {1, 13, 2, 4, 3, 1}};
  for (const Case& cs : cases) {
    for (bool causal : {false, true}) {
      const HeadConfig heads{cs.hq, cs.hkv, 8};
      const auto q = random_normal(cs.M * cs.hq * 8, gen());
      const auto k = random_normal(cs.N * cs.hkv * 8, gen());
      const auto v = random_normal(cs.N * cs.hkv * 8, gen());
      const int64_t rb = (cs.M + cs.Br - 1) / cs.Br, cb = (cs.N + cs.Bc - 1) / cs.Bc;
      // Random block subset (about half), and the equivalent element mask built directly.
      BlockSparse bsr{cs.Br, cs.Bc, {0}, {}};
      std::vector<uint8_t> mask(cs.M * cs.N, 0);
      for (int64_t r = 0; r < rb; ++r) {
        for (int64_t c = 0; c < cb; ++c) {
          if (gen() % 2 == 0) continue;
          bsr.indices.push_back(static_cast<int32_t>(c));
          for (int64_t i = r * cs.Br; i < std::min(cs.M, (r + 1) * cs.Br); ++i) {
            for (int64_t j = c * cs.Bc; j < std::min(cs.N, (c + 1) * cs.Bc); ++j) mask[i * cs.N + j] = 1;
          }
        }
        bsr.indptr.push_back(static_cast<int32_t>(bsr.indices.size()));
      }
      Options opts;
      opts.causal = causal;
      const State got = attention_block_sparse(q, k, v, cs.M, cs.N, bsr, heads, opts);
      Options masked = opts;
      masked.custom_mask = mask;
      masked.custom_mask_indptr = {0, cs.M * cs.N};
      const State want = attention_single(q, k, v, cs.M, cs.N, heads, masked);
      expect_states_near(got, want, kSame, "M=" + std::to_string(cs.M) + " N=" + std::to_string(cs.N) +
                                               (causal ? " causal" : ""));
      // And it differs from attention with every block present (the subset matters).
      ASSERT_LT(static_cast<int64_t>(bsr.indices.size()), rb * cb) << "subset happens to be full";
      const State dense = attention_single(q, k, v, cs.M, cs.N, heads, opts);
      EXPECT_GT(rel_error(got.o, dense.o), 1e-6);
    }
  }
}

TEST(BlockSparse, EmptyBlockRowAndPartialLastBlock) {
  // M = 5, N = 5, Br = 2, Bc = 3: row blocks {0,1}, {2,3}, {4}; column blocks {0,1,2}, {3,4}.
  // Block row 0: nothing; block row 1: column block 1 (keys 3, 4); block row 2: column block 0.
  // Zero queries: O = mean of the visible values (v_j = j), LSE = ln(#visible).
  const HeadConfig heads{1, 1, 1};
  const std::vector<double> q(5, 0.0), k(5, 1.0), v = {0, 1, 2, 3, 4};
  BlockSparse bsr{2, 3, {0, 0, 1, 2}, {1, 0}};
  const State s = attention_block_sparse(q, k, v, 5, 5, bsr, heads, Options{});
  EXPECT_EQ(s.lse[0], -kInf);
  EXPECT_EQ(s.lse[1], -kInf);
  EXPECT_EQ(s.o[0], 0.0);
  EXPECT_NEAR(s.o[2], 3.5, 1e-14);
  EXPECT_NEAR(s.lse[3], std::log(2.0), 1e-14);
  EXPECT_NEAR(s.o[4], 1.0, 1e-14);
  EXPECT_NEAR(s.lse[4], std::log(3.0), 1e-14);
  // Sinks do not reach outside the block set: key 0 stays invisible to rows 2 and 3.
  Options sinks;
  sinks.causal = true;
  sinks.window_left = 0;
  sinks.num_sink_tokens = 1;
  const State w = attention_block_sparse(q, k, v, 5, 5, bsr, heads, sinks);
  // Rows 2, 3 have p = 2, 3; causal with window 0 leaves only j = p, which must also be in {3, 4}.
  EXPECT_EQ(w.lse[2], -kInf);
  EXPECT_NEAR(w.o[3], 3.0, 1e-14);
  EXPECT_NEAR(w.lse[3], 0.0, 1e-14);
  // Row 4 (p = 4): block {0,1,2}, window {4}, sink {0}: key 0.
  EXPECT_NEAR(w.o[4], 0.0, 1e-14);
  EXPECT_NEAR(w.lse[4], 0.0, 1e-14);
}

}  // namespace
