// fp64 reference oracle: attention-state merge (DESIGN section 2).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "reference/oracle.h"
#include "reference/oracle_internal.h"

namespace tessera_ref {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string str(int64_t x) { return std::to_string(x); }

// Merges one (row, head) pair of states into (lse_out, o_out):
//   LSE = log(e^a + e^b) = m + log(e^(a-m) + e^(b-m)) with m = max(a, b),
//   O   = (e^(a-m) O_a + e^(b-m) O_b) / (e^(a-m) + e^(b-m))   (= e^(a-LSE) O_a + e^(b-LSE) O_b).
// In base 2, e is replaced by 2 and log by log2. Both -inf: O = 0, LSE = -inf.
void merge_one(double lse_a, const double* o_a, double lse_b, const double* o_b, int64_t D,
               bool base2, double* lse_out, double* o_out) {
  if (lse_a == -kInf && lse_b == -kInf) {
    std::fill(o_out, o_out + D, 0.0);
    *lse_out = -kInf;
    return;
  }
  const double m = (std::isnan(lse_a) || std::isnan(lse_b)) ? std::numeric_limits<double>::quiet_NaN()
                                                            : std::max(lse_a, lse_b);
  const double w_a = base2 ? std::exp2(lse_a - m) : std::exp(lse_a - m);
  const double w_b = base2 ? std::exp2(lse_b - m) : std::exp(lse_b - m);
  const double sum = w_a + w_b;
  for (int64_t d = 0; d < D; ++d) o_out[d] = (w_a * o_a[d] + w_b * o_b[d]) / sum;
  *lse_out = m + (base2 ? std::log2(sum) : std::log(sum));
}

void check_state(const State& s, const char* name) {
  detail::require(s.rows >= 0 && s.heads >= 1 && s.head_dim >= 1,
                  std::string(name) + ": rows, heads, head_dim must be set (rows >= 0, others >= 1)");
  detail::require(static_cast<int64_t>(s.o.size()) == s.rows * s.heads * s.head_dim &&
                      static_cast<int64_t>(s.lse.size()) == s.rows * s.heads,
                  std::string(name) + ": o/lse sizes do not match rows = " + str(s.rows) +
                      ", heads = " + str(s.heads) + ", head_dim = " + str(s.head_dim));
}

}  // namespace

State merge_state(const State& a, const State& b, bool lse_base2) {
  check_state(a, "merge_state: a");
  check_state(b, "merge_state: b");
  detail::require(a.rows == b.rows && a.heads == b.heads && a.head_dim == b.head_dim,
                  "merge_state: shapes differ ([" + str(a.rows) + ", " + str(a.heads) + ", " +
                      str(a.head_dim) + "] vs [" + str(b.rows) + ", " + str(b.heads) + ", " +
                      str(b.head_dim) + "])");
  State out = a;
  const int64_t D = a.head_dim;
  for (int64_t n = 0; n < a.rows * a.heads; ++n) {
    merge_one(a.lse[n], a.o.data() + n * D, b.lse[n], b.o.data() + n * D, D, lse_base2,
              &out.lse[n], out.o.data() + n * D);
  }
  return out;
}

State merge_states(const std::vector<State>& states, bool lse_base2) {
  detail::require(!states.empty(), "merge_states: empty list of states");
  State acc = states[0];
  check_state(acc, "merge_states: states[0]");
  for (size_t n = 1; n < states.size(); ++n) acc = merge_state(acc, states[n], lse_base2);
  return acc;
}

State merge_states_varlen(const std::vector<double>& v, const std::vector<double>& s,
                          const std::vector<int32_t>& indptr, int64_t num_heads, int64_t head_dim,
                          bool lse_base2) {
  detail::require(num_heads >= 1 && head_dim >= 1,
                  "merge_states_varlen: num_heads and head_dim must be >= 1");
  detail::require(!indptr.empty(), "merge_states_varlen: indptr is empty");
  const int64_t total = detail::packed_rows(v, num_heads, head_dim, "merge_states_varlen: v");
  detail::require(static_cast<int64_t>(s.size()) == total * num_heads,
                  "merge_states_varlen: s has " + str(s.size()) + " elements, expected " +
                      str(total * num_heads));
  const int64_t rows = static_cast<int64_t>(indptr.size()) - 1;
  detail::check_indptr(indptr, rows + 1, total, true, "merge_states_varlen: indptr");

  State out;
  out.rows = rows;
  out.heads = num_heads;
  out.head_dim = head_dim;
  out.o.assign(rows * num_heads * head_dim, 0.0);
  out.lse.assign(rows * num_heads, -kInf);  // the empty state: O = 0, LSE = -inf
  std::vector<double> tmp(head_dim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < num_heads; ++h) {
      double* o = out.o.data() + (r * num_heads + h) * head_dim;
      double* lse = &out.lse[r * num_heads + h];
      for (int32_t n = indptr[r]; n < indptr[r + 1]; ++n) {
        double merged_lse = 0.0;
        merge_one(*lse, o, s[n * num_heads + h], v.data() + (n * num_heads + h) * head_dim,
                  head_dim, lse_base2, &merged_lse, tmp.data());
        std::copy(tmp.begin(), tmp.end(), o);
        *lse = merged_lse;
      }
    }
  }
  return out;
}

}  // namespace tessera_ref
