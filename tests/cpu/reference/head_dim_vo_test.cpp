// The oracle with different Q/K and V/O head dims (HeadConfig::head_dim_vo; DeepSeek's prefill
// uses 192 / 128), against the same attention with one head dim made by zero padding: padding V
// with zero columns leaves the first Dv output columns unchanged (and the rest 0), padding Q and K
// with zero columns leaves every logit unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "reference/oracle.h"

namespace {

using tessera_ref::HeadConfig;
using tessera_ref::Options;
using tessera_ref::State;

/// [rows, heads, from] -> [rows, heads, to] (to >= from), zero-padded.
std::vector<double> pad_rows(const std::vector<double>& x, int64_t heads, int64_t from, int64_t to) {
  const int64_t rows = static_cast<int64_t>(x.size()) / (heads * from);
  std::vector<double> out(static_cast<size_t>(rows * heads * to), 0.0);
  for (int64_t r = 0; r < rows * heads; ++r)
    for (int64_t d = 0; d < from; ++d) out[r * to + d] = x[r * from + d];
  return out;
}

/// [rows, heads, from] -> [rows, heads, to] (to <= from), the first `to` columns.
std::vector<double> cut_rows(const std::vector<double>& x, int64_t heads, int64_t from, int64_t to) {
  const int64_t rows = static_cast<int64_t>(x.size()) / (heads * from);
  std::vector<double> out(static_cast<size_t>(rows * heads * to));
  for (int64_t r = 0; r < rows * heads; ++r)
    for (int64_t d = 0; d < to; ++d) out[r * to + d] = x[r * from + d];
  return out;
}

void expect_same(const State& a, const State& b) {
  ASSERT_EQ(a.o.size(), b.o.size());
  for (size_t i = 0; i < a.o.size(); ++i) EXPECT_NEAR(a.o[i], b.o[i], 1e-12) << "o[" << i << "]";
  ASSERT_EQ(a.lse.size(), b.lse.size());
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(b.lse[i])) {
      EXPECT_EQ(a.lse[i], b.lse[i]);
    } else {
      EXPECT_NEAR(a.lse[i], b.lse[i], 1e-12);
    }
  }
}

TEST(HeadDimVo, SmallerValueDimEqualsZeroPaddedValues) {
  const int64_t Hq = 4, Hkv = 2, D = 12, Dv = 8, qo = 3, kv = 9;
  const std::vector<double> q = tessera_ref::random_normal(qo * Hq * D, 1);
  const std::vector<double> k = tessera_ref::random_normal(kv * Hkv * D, 2);
  const std::vector<double> v = tessera_ref::random_normal(kv * Hkv * Dv, 3);
  for (bool causal : {false, true}) {
    Options opts;
    opts.causal = causal;
    const State split = tessera_ref::attention_single(q, k, v, qo, kv, {Hq, Hkv, D, Dv}, opts);
    EXPECT_EQ(split.head_dim, Dv);
    State padded = tessera_ref::attention_single(q, k, pad_rows(v, Hkv, Dv, D), qo, kv, {Hq, Hkv, D}, opts);
    padded.o = cut_rows(padded.o, Hq, D, Dv);
    padded.head_dim = Dv;
    expect_same(split, padded);
  }
}

TEST(HeadDimVo, LargerValueDimEqualsZeroPaddedQueriesAndKeys) {
  const int64_t Hq = 2, Hkv = 1, D = 6, Dv = 10, qo = 4, kv = 7;
  const std::vector<double> q = tessera_ref::random_normal(qo * Hq * D, 4);
  const std::vector<double> k = tessera_ref::random_normal(kv * Hkv * D, 5);
  const std::vector<double> v = tessera_ref::random_normal(kv * Hkv * Dv, 6);
  Options opts;
  opts.causal = true;
  opts.sm_scale = 0.3;  // padding changes D, so the default 1/sqrt(D) would differ
  const State split = tessera_ref::attention_single(q, k, v, qo, kv, {Hq, Hkv, D, Dv}, opts);
  const State padded = tessera_ref::attention_single(pad_rows(q, Hq, D, Dv), pad_rows(k, Hkv, D, Dv), v, qo, kv,
                                                     {Hq, Hkv, Dv}, opts);
  expect_same(split, padded);
}

TEST(HeadDimVo, RaggedBatchEqualsEachRequestAlone) {
  const int64_t Hq = 4, Hkv = 4, D = 24, Dv = 16;
  const std::vector<int32_t> qo_indptr = {0, 2, 2, 7}, kv_indptr = {0, 5, 8, 20};
  const int64_t total_q = 7, total_kv = 20;
  const std::vector<double> q = tessera_ref::random_normal(total_q * Hq * D, 7);
  const std::vector<double> k = tessera_ref::random_normal(total_kv * Hkv * D, 8);
  const std::vector<double> v = tessera_ref::random_normal(total_kv * Hkv * Dv, 9);
  Options opts;
  opts.causal = true;
  const HeadConfig heads{Hq, Hkv, D, Dv};
  const State batch = tessera_ref::attention_ragged(q, qo_indptr, k, v, kv_indptr, heads, opts);
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t q0 = qo_indptr[b], qn = qo_indptr[b + 1] - q0, k0 = kv_indptr[b], kn = kv_indptr[b + 1] - k0;
    const State one = tessera_ref::attention_single(
        std::vector<double>(q.begin() + q0 * Hq * D, q.begin() + (q0 + qn) * Hq * D),
        std::vector<double>(k.begin() + k0 * Hkv * D, k.begin() + (k0 + kn) * Hkv * D),
        std::vector<double>(v.begin() + k0 * Hkv * Dv, v.begin() + (k0 + kn) * Hkv * Dv), qn, kn, heads, opts, b);
    for (int64_t i = 0; i < qn * Hq * Dv; ++i) EXPECT_DOUBLE_EQ(batch.o[q0 * Hq * Dv + i], one.o[i]);
    for (int64_t i = 0; i < qn * Hq; ++i) EXPECT_DOUBLE_EQ(batch.lse[q0 * Hq + i], one.lse[i]);
  }
}

TEST(HeadDimVo, PagedCacheEqualsRaggedForBothLayouts) {
  const int64_t Hq = 4, Hkv = 2, D = 12, Dv = 4;
  const std::vector<int64_t> kv_lens = {9, 0, 21};
  const std::vector<int32_t> qo_indptr = {0, 3, 4, 6}, kv_indptr = {0, 9, 9, 30};
  std::vector<std::vector<double>> k, v;
  std::vector<double> k_all, v_all;
  for (size_t b = 0; b < kv_lens.size(); ++b) {
    k.push_back(tessera_ref::random_normal(kv_lens[b] * Hkv * D, 20 + b));
    v.push_back(tessera_ref::random_normal(kv_lens[b] * Hkv * Dv, 30 + b));
    k_all.insert(k_all.end(), k.back().begin(), k.back().end());
    v_all.insert(v_all.end(), v.back().begin(), v.back().end());
  }
  const std::vector<double> q = tessera_ref::random_normal(6 * Hq * D, 40);
  Options opts;
  opts.causal = true;
  const HeadConfig heads{Hq, Hkv, D, Dv};
  const State ragged = tessera_ref::attention_ragged(q, qo_indptr, k_all, v_all, kv_indptr, heads, opts);
  for (tessera_ref::Layout layout : {tessera_ref::Layout::NHD, tessera_ref::Layout::HND}) {
    const tessera_ref::PagedCache cache =
        tessera_ref::build_paged(k, v, kv_lens, Hkv, D, 4, layout, 11, 2, 0.0, Dv);
    EXPECT_EQ(cache.v_pages.size(), cache.k_pages.size() / D * Dv);
    const State paged = tessera_ref::attention_paged(q, qo_indptr, cache, heads, opts);
    expect_same(paged, ragged);
    // The heads' value dim must match the cache's.
    EXPECT_THROW(tessera_ref::attention_paged(q, qo_indptr, cache, {Hq, Hkv, D}, opts), std::invalid_argument);
  }
}

TEST(HeadDimVo, ShapesAreChecked) {
  const std::vector<double> q(2 * 8), k(3 * 8), v_wrong(3 * 8), v(3 * 4);
  EXPECT_THROW(tessera_ref::attention_single(q, k, v_wrong, 2, 3, {1, 1, 8, 4}, Options{}), std::invalid_argument);
  EXPECT_NO_THROW(tessera_ref::attention_single(q, k, v, 2, 3, {1, 1, 8, 4}, Options{}));
  EXPECT_THROW(tessera_ref::attention_single(q, k, v, 2, 3, {1, 1, 8, -1}, Options{}), std::invalid_argument);
  // Formats with one head dim per cache reject a different Dv.
  tessera_ref::BlockSparse bsr;
  bsr.block_rows = 1;
  bsr.block_cols = 1;
  bsr.indptr = {0, 0, 0};
  EXPECT_THROW(tessera_ref::attention_block_sparse(q, k, v, 2, 3, bsr, {1, 1, 8, 4}, Options{}),
               std::invalid_argument);
}

}  // namespace
