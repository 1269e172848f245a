// The MLA reference (tests/reference/mla.h): a hand-computed case; the absorbed form against
// standard multi-head attention over the decompressed keys and values (small random projection
// matrices), which is what makes the absorbed form MLA; and the paged batch against one request at
// a time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference/mla.h"
#include "reference/oracle.h"

namespace {

using tessera_ref::MlaShape;
using tessera_ref::State;

std::vector<double> normal(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

TEST(MlaReference, HandComputedOneQueryTwoKeys) {
  // d_c = 2, d_r = 1, one head: x_0 = (1*1 + 0*0) + 1*1 = 2, x_1 = (1*0 + 0*1) + 1*(-1) = -1.
  const MlaShape shape{1, 2, 1};
  const State s = tessera_ref::mla_attention_single({1, 0}, {1}, {1, 0, 0, 1}, {1, -1}, 1, 2, shape, 1.0, false);
  const double e0 = std::exp(2.0), e1 = std::exp(-1.0);
  EXPECT_NEAR(s.o[0], e0 / (e0 + e1), 1e-15);
  EXPECT_NEAR(s.o[1], e1 / (e0 + e1), 1e-15);
  EXPECT_NEAR(s.lse[0], std::log(e0 + e1), 1e-15);
  // Causal with two new tokens over two keys: the first sees key 0 only.
  const State c = tessera_ref::mla_attention_single({1, 0, 1, 0}, {1, 1}, {1, 0, 0, 1}, {1, -1}, 2, 2, shape, 1.0, true);
  EXPECT_DOUBLE_EQ(c.o[0], 1.0);
  EXPECT_DOUBLE_EQ(c.o[1], 0.0);
  EXPECT_DOUBLE_EQ(c.lse[0], 2.0);
}

TEST(MlaReference, AbsorbedFormEqualsAttentionOverDecompressedKV) {
  std::mt19937_64 rng(2411);
  const int64_t H = 3, dc = 12, dr = 4, dn = 6, dv = 5;  // d_nope + d_r = 10 >= d_v
  const MlaShape shape{H, dc, dr};
  for (bool causal : {false, true}) {
    for (int64_t qo_len : {1, 2, 4}) {
      const int64_t kv_len = 9;
      const std::vector<double> w_uk = normal(H * dn * dc, rng);  // [H, d_nope, d_c]
      const std::vector<double> w_uv = normal(H * dv * dc, rng);  // [H, d_v, d_c]
      const std::vector<double> q_head = normal(qo_len * H * dn, rng), q_pe = normal(qo_len * H * dr, rng);
      const std::vector<double> ckv = normal(kv_len * dc, rng), kpe = normal(kv_len * dr, rng);
      const double sm_scale = 1.0 / std::sqrt(static_cast<double>(dn + dr));
      // Absorbed: q_nope = W_UK,h^T q_head.
      std::vector<double> q_abs(static_cast<size_t>(qo_len * H * dc), 0.0);
      for (int64_t i = 0; i < qo_len; ++i)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t n = 0; n < dn; ++n)
            for (int64_t c = 0; c < dc; ++c)
              q_abs[(i * H + h) * dc + c] += w_uk[(h * dn + n) * dc + c] * q_head[(i * H + h) * dn + n];
      const State mla = tessera_ref::mla_attention_single(q_abs, q_pe, ckv, kpe, qo_len, kv_len, shape, sm_scale, causal);
      // Decompressed: per-head keys [W_UK,h ckv ; kpe] and values W_UV,h ckv (zero-padded to D).
      const int64_t D = dn + dr;
      std::vector<double> q(static_cast<size_t>(qo_len * H * D)), k(static_cast<size_t>(kv_len * H * D), 0.0),
          v(static_cast<size_t>(kv_len * H * D), 0.0);
      for (int64_t i = 0; i < qo_len; ++i)
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t n = 0; n < dn; ++n) q[(i * H + h) * D + n] = q_head[(i * H + h) * dn + n];
          for (int64_t r = 0; r < dr; ++r) q[(i * H + h) * D + dn + r] = q_pe[(i * H + h) * dr + r];
        }
      for (int64_t j = 0; j < kv_len; ++j)
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t n = 0; n < dn; ++n)
            for (int64_t c = 0; c < dc; ++c) k[(j * H + h) * D + n] += w_uk[(h * dn + n) * dc + c] * ckv[j * dc + c];
          for (int64_t r = 0; r < dr; ++r) k[(j * H + h) * D + dn + r] = kpe[j * dr + r];
          for (int64_t e = 0; e < dv; ++e)
            for (int64_t c = 0; c < dc; ++c) v[(j * H + h) * D + e] += w_uv[(h * dv + e) * dc + c] * ckv[j * dc + c];
        }
      tessera_ref::Options opts;
      opts.sm_scale = sm_scale;
      opts.causal = causal;
      const State ref = tessera_ref::attention_single(q, k, v, qo_len, kv_len, {H, H, D}, opts);
      for (int64_t i = 0; i < qo_len; ++i)
        for (int64_t h = 0; h < H; ++h) {
          EXPECT_NEAR(mla.lse[i * H + h], ref.lse[i * H + h], 1e-12) << "row " << i << " head " << h;
          for (int64_t e = 0; e < dv; ++e) {
            double o = 0;  // W_UV,h o_latent
            for (int64_t c = 0; c < dc; ++c) o += w_uv[(h * dv + e) * dc + c] * mla.o[(i * H + h) * dc + c];
            EXPECT_NEAR(o, ref.o[(i * H + h) * D + e], 1e-12 * (1 + std::fabs(o))) << "row " << i << " head " << h;
          }
        }
    }
  }
}

TEST(MlaReference, PagedBatchEqualsEachRequestAlone) {
  std::mt19937_64 rng(2412);
  const MlaShape shape{4, 16, 8};
  const std::vector<int64_t> kv_lens = {0, 1, 17, 40, 3}, qo_lens = {1, 1, 4, 2, 3};
  std::vector<std::vector<double>> ckv, kpe;
  std::vector<int32_t> qo_indptr = {0};
  for (size_t b = 0; b < kv_lens.size(); ++b) {
    ckv.push_back(normal(kv_lens[b] * shape.latent_dim, rng));
    kpe.push_back(normal(kv_lens[b] * shape.rope_dim, rng));
    qo_indptr.push_back(qo_indptr.back() + static_cast<int32_t>(qo_lens[b]));
  }
  const int64_t total = qo_indptr.back();
  const std::vector<double> q_nope = normal(total * shape.num_heads * shape.latent_dim, rng);
  const std::vector<double> q_pe = normal(total * shape.num_heads * shape.rope_dim, rng);
  for (int64_t page_size : {1, 3, 16}) {
    const tessera_ref::MlaPagedCache cache = tessera_ref::build_mla_paged(ckv, kpe, kv_lens, shape, page_size, 7);
    const State paged = tessera_ref::mla_attention_paged(q_nope, q_pe, qo_indptr, cache, shape, 0.1, true);
    for (size_t b = 0; b < kv_lens.size(); ++b) {
      const int64_t lo = qo_indptr[b], n = qo_lens[b], H = shape.num_heads;
      const std::vector<double> qn(q_nope.begin() + lo * H * shape.latent_dim,
                                   q_nope.begin() + (lo + n) * H * shape.latent_dim);
      const std::vector<double> qp(q_pe.begin() + lo * H * shape.rope_dim, q_pe.begin() + (lo + n) * H * shape.rope_dim);
      const State one = tessera_ref::mla_attention_single(qn, qp, ckv[b], kpe[b], n, kv_lens[b], shape, 0.1, true);
      for (int64_t r = 0; r < n * H; ++r) {
        if (std::isinf(one.lse[r])) {
          EXPECT_TRUE(std::isinf(paged.lse[lo * H + r]) && paged.lse[lo * H + r] < 0);
        } else {
          EXPECT_DOUBLE_EQ(paged.lse[lo * H + r], one.lse[r]) << "page size " << page_size << ", request " << b;
        }
        for (int64_t e = 0; e < shape.latent_dim; ++e) {
          EXPECT_DOUBLE_EQ(paged.o[(lo * H + r) * shape.latent_dim + e], one.o[r * shape.latent_dim + e]);
        }
      }
    }
  }
}

TEST(MlaReference, BadShapesAreNamed) {
  const MlaShape shape{2, 4, 2};
  EXPECT_THROW(tessera_ref::mla_attention_single(std::vector<double>(7), std::vector<double>(4), std::vector<double>(4),
                                                 std::vector<double>(2), 1, 1, shape, 1.0, false),
               std::invalid_argument);
  EXPECT_THROW(tessera_ref::mla_attention_single(std::vector<double>(8), std::vector<double>(4), std::vector<double>(4),
                                                 std::vector<double>(2), 1, 1, shape, 0.0, false),
               std::invalid_argument);
}

}  // namespace
