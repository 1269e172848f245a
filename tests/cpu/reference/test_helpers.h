// Helpers shared by the reference-oracle tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference/oracle.h"

namespace tessera_ref_test {

using tessera_ref::HeadConfig;
using tessera_ref::State;

constexpr double kInf = std::numeric_limits<double>::infinity();

// A batch of requests with random q, k, v, kept both per request and packed.
struct Batch {
  HeadConfig heads;
  std::vector<int64_t> qo_lens, kv_lens;
  std::vector<std::vector<double>> q, k, v;  // per request: [qo_len, Hq, D], [kv_len, Hkv, D]
  std::vector<double> q_packed, k_packed, v_packed;
  std::vector<int32_t> qo_indptr, kv_indptr;
  int64_t size() const { return static_cast<int64_t>(qo_lens.size()); }
};

inline Batch make_batch(const HeadConfig& heads, const std::vector<int64_t>& qo_lens,
                        const std::vector<int64_t>& kv_lens, uint64_t seed) {
  Batch b;
  b.heads = heads;
  b.qo_lens = qo_lens;
  b.kv_lens = kv_lens;
  b.qo_indptr.assign(1, 0);
  b.kv_indptr.assign(1, 0);
  const int64_t qrow = heads.num_qo_heads * heads.head_dim;
  const int64_t kvrow = heads.num_kv_heads * heads.head_dim;
  for (size_t r = 0; r < qo_lens.size(); ++r) {
    b.q.push_back(tessera_ref::random_normal(qo_lens[r] * qrow, seed * 1000 + 3 * r + 0));
    b.k.push_back(tessera_ref::random_normal(kv_lens[r] * kvrow, seed * 1000 + 3 * r + 1));
    b.v.push_back(tessera_ref::random_normal(kv_lens[r] * kvrow, seed * 1000 + 3 * r + 2));
    b.q_packed.insert(b.q_packed.end(), b.q.back().begin(), b.q.back().end());
    b.k_packed.insert(b.k_packed.end(), b.k.back().begin(), b.k.back().end());
    b.v_packed.insert(b.v_packed.end(), b.v.back().begin(), b.v.back().end());
    b.qo_indptr.push_back(static_cast<int32_t>(b.qo_indptr.back() + qo_lens[r]));
    b.kv_indptr.push_back(static_cast<int32_t>(b.kv_indptr.back() + kv_lens[r]));
  }
  return b;
}

// Concatenates per-request states (rows stacked in order).
inline State concat_states(const std::vector<State>& parts, const HeadConfig& heads) {
  State s;
  s.heads = heads.num_qo_heads;
  s.head_dim = heads.head_dim;
  for (const State& p : parts) {
    s.rows += p.rows;
    s.o.insert(s.o.end(), p.o.begin(), p.o.end());
    s.lse.insert(s.lse.end(), p.lse.begin(), p.lse.end());
  }
  return s;
}

// Reference for a batch: attention_single on each request's dense tensors.
inline State per_request_reference(const Batch& b, const tessera_ref::Options& opts) {
  std::vector<State> parts;
  for (int64_t r = 0; r < b.size(); ++r) {
    parts.push_back(tessera_ref::attention_single(b.q[r], b.k[r], b.v[r], b.qo_lens[r],
                                                  b.kv_lens[r], b.heads, opts, r));
  }
  return concat_states(parts, b.heads);
}

// Rows [begin, end) of a [rows, H, D] tensor.
inline std::vector<double> slice_rows(const std::vector<double>& t, int64_t row_elems,
                                      int64_t begin, int64_t end) {
  return std::vector<double>(t.begin() + begin * row_elems, t.begin() + end * row_elems);
}

// A random custom mask for every request of `b` (rows of width kv_len), density ~ p.
inline void add_random_mask(tessera_ref::Options& opts, const Batch& b, double p, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::bernoulli_distribution coin(p);
  opts.custom_mask.clear();
  opts.custom_mask_indptr.assign(1, 0);
  for (int64_t r = 0; r < b.size(); ++r) {
    for (int64_t n = 0; n < b.qo_lens[r] * b.kv_lens[r]; ++n) {
      opts.custom_mask.push_back(coin(gen) ? 1 : 0);
    }
    opts.custom_mask_indptr.push_back(static_cast<int64_t>(opts.custom_mask.size()));
  }
}

// Number of (row, head) entries with LSE == -inf (rows that saw no key).
inline int64_t count_empty_rows(const State& s) {
  int64_t n = 0;
  for (double x : s.lse) n += (x == -kInf) ? 1 : 0;
  return n;
}

}  // namespace tessera_ref_test
