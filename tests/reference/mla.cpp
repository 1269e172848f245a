#include "reference/mla.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace tessera_ref {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mla reference: " + what);
}

}  // namespace

State mla_attention_single(const std::vector<double>& q_nope, const std::vector<double>& q_pe,
                           const std::vector<double>& ckv, const std::vector<double>& kpe, int64_t qo_len,
                           int64_t kv_len, const MlaShape& shape, double sm_scale, bool causal) {
  const int64_t H = shape.num_heads, dc = shape.latent_dim, dr = shape.rope_dim;
  require(H >= 1 && dc >= 1 && dr >= 0 && qo_len >= 0 && kv_len >= 0, "shape");
  require(static_cast<int64_t>(q_nope.size()) == qo_len * H * dc, "q_nope has the wrong size");
  require(static_cast<int64_t>(q_pe.size()) == qo_len * H * dr, "q_pe has the wrong size");
  require(static_cast<int64_t>(ckv.size()) == kv_len * dc, "ckv has the wrong size");
  require(static_cast<int64_t>(kpe.size()) == kv_len * dr, "kpe has the wrong size");
  require(std::isfinite(sm_scale) && sm_scale > 0, "sm_scale must be finite and > 0");
  State s;
  s.rows = qo_len;
  s.heads = H;
  s.head_dim = dc;
  s.o.assign(static_cast<size_t>(qo_len * H * dc), 0.0);
  s.lse.assign(static_cast<size_t>(qo_len * H), -std::numeric_limits<double>::infinity());
  std::vector<double> x(static_cast<size_t>(kv_len));
  for (int64_t i = 0; i < qo_len; ++i) {
    const int64_t pos = kv_len - qo_len + i;
    const int64_t visible = causal ? std::min<int64_t>(kv_len, pos + 1) : kv_len;
    for (int64_t h = 0; h < H; ++h) {
      const double* qn = &q_nope[static_cast<size_t>((i * H + h) * dc)];
      const double* qp = &q_pe[static_cast<size_t>((i * H + h) * dr)];
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < dc; ++e) dot += qn[e] * ckv[static_cast<size_t>(j * dc + e)];
        for (int64_t e = 0; e < dr; ++e) dot += qp[e] * kpe[static_cast<size_t>(j * dr + e)];
        x[static_cast<size_t>(j)] = sm_scale * dot;
        m = std::max(m, x[static_cast<size_t>(j)]);
      }
      if (visible <= 0) continue;  // o = 0, lse = -inf
      double sum = 0;
      for (int64_t j = 0; j < visible; ++j) sum += std::exp(x[static_cast<size_t>(j)] - m);
      double* o = &s.o[static_cast<size_t>((i * H + h) * dc)];
      for (int64_t j = 0; j < visible; ++j) {
        const double p = std::exp(x[static_cast<size_t>(j)] - m) / sum;
        for (int64_t e = 0; e < dc; ++e) o[e] += p * ckv[static_cast<size_t>(j * dc + e)];
      }
      s.lse[static_cast<size_t>(i * H + h)] = m + std::log(sum);
    }
  }
  return s;
}

MlaPagedCache build_mla_paged(const std::vector<std::vector<double>>& ckv,
                              const std::vector<std::vector<double>>& kpe, const std::vector<int64_t>& kv_lens,
                              const MlaShape& shape, int64_t page_size, uint64_t shuffle_seed) {
  // The same seed gives both caches the same page table.
  MlaPagedCache c;
  c.ckv = build_paged(ckv, ckv, kv_lens, 1, shape.latent_dim, page_size, Layout::NHD, shuffle_seed);
  c.kpe = build_paged(kpe, kpe, kv_lens, 1, shape.rope_dim, page_size, Layout::NHD, shuffle_seed);
  require(c.ckv.indices == c.kpe.indices && c.ckv.indptr == c.kpe.indptr, "the two caches' page tables differ");
  return c;
}

State mla_attention_paged(const std::vector<double>& q_nope, const std::vector<double>& q_pe,
                          const std::vector<int32_t>& qo_indptr, const MlaPagedCache& cache, const MlaShape& shape,
                          double sm_scale, bool causal) {
  const int64_t B = cache.ckv.batch_size(), H = shape.num_heads, dc = shape.latent_dim, dr = shape.rope_dim;
  require(static_cast<int64_t>(qo_indptr.size()) == B + 1 && qo_indptr.front() == 0, "qo_indptr");
  require(cache.kpe.batch_size() == B, "the two caches hold different batches");
  const int64_t total = qo_indptr.back();
  require(static_cast<int64_t>(q_nope.size()) == total * H * dc && static_cast<int64_t>(q_pe.size()) == total * H * dr,
          "q_nope / q_pe sizes");
  State s;
  s.rows = total;
  s.heads = H;
  s.head_dim = dc;
  s.o.assign(static_cast<size_t>(total * H * dc), 0.0);
  s.lse.assign(static_cast<size_t>(total * H), -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t lo = qo_indptr[static_cast<size_t>(b)], hi = qo_indptr[static_cast<size_t>(b + 1)];
    require(hi >= lo, "qo_indptr must be non-decreasing");
    const DenseKV latent = gather_paged(cache.ckv, b), rope = gather_paged(cache.kpe, b);
    const std::vector<double> qn(q_nope.begin() + lo * H * dc, q_nope.begin() + hi * H * dc);
    const std::vector<double> qp(q_pe.begin() + lo * H * dr, q_pe.begin() + hi * H * dr);
    const State r = mla_attention_single(qn, qp, latent.k, rope.k, hi - lo, latent.kv_len, shape, sm_scale, causal);
    std::copy(r.o.begin(), r.o.end(), s.o.begin() + lo * H * dc);
    std::copy(r.lse.begin(), r.lse.end(), s.lse.begin() + lo * H);
  }
  return s;
}

}  // namespace tessera_ref
