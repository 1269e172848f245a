// fp64 reference oracle: variant helpers, the single-request core and test utilities.
#include "reference/oracle.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "reference/oracle_internal.h"

namespace tessera_ref {

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kLog2E = 1.44269504088896340736;  // log2(e) = 1 / ln(2)
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string str(int64_t x) { return std::to_string(x); }

// Value of a per-request option vector, or `fallback` when the vector is empty.
int64_t per_request(const std::vector<int64_t>& values, int64_t b, int64_t fallback,
                    const char* name) {
  if (values.empty()) return fallback;
  detail::require(b >= 0 && b < static_cast<int64_t>(values.size()),
                  std::string("Options::") + name + " has " + str(values.size()) +
                      " entries, no entry for request " + str(b));
  return values[b];
}

// Rotates rows x[n, num_heads, head_dim] into out (same shape); see apply_rope.
void rope_rows(const double* x, int64_t n, int64_t num_heads, int64_t head_dim,
               const int64_t* positions, RopeMode mode, const RopeParams& params, double* out) {
  detail::require(params.scale > 0, "RopeParams::scale must be > 0");
  const std::vector<double> freq = rope_frequencies(head_dim, mode, params);
  const int64_t half = head_dim / 2;
  std::vector<double> cos_t(half), sin_t(half);
  for (int64_t r = 0; r < n; ++r) {
    const double t = static_cast<double>(positions[r]) / params.scale;
    for (int64_t d = 0; d < half; ++d) {  // angles of this row's position, shared by all heads
      cos_t[d] = std::cos(t * freq[d]);
      sin_t[d] = std::sin(t * freq[d]);
    }
    for (int64_t h = 0; h < num_heads; ++h) {
      const double* in = x + (r * num_heads + h) * head_dim;
      double* res = out + (r * num_heads + h) * head_dim;
      for (int64_t d = 0; d < half; ++d) {
        res[d] = in[d] * cos_t[d] - in[d + half] * sin_t[d];
        res[d + half] = in[d + half] * cos_t[d] + in[d] * sin_t[d];
      }
    }
  }
}

}  // namespace

namespace detail {

void require(bool cond, const std::string& message) {
  if (!cond) throw std::invalid_argument("tessera_ref: " + message);
}

void check_heads(const HeadConfig& heads) {
  require(heads.num_qo_heads >= 1, "num_qo_heads = " + str(heads.num_qo_heads) + " must be >= 1");
  require(heads.num_kv_heads >= 1, "num_kv_heads = " + str(heads.num_kv_heads) + " must be >= 1");
  require(heads.head_dim >= 1, "head_dim = " + str(heads.head_dim) + " must be >= 1");
  require(heads.head_dim_vo >= 0, "head_dim_vo = " + str(heads.head_dim_vo) + " must be >= 1 (or 0: head_dim)");
  require(heads.num_qo_heads % heads.num_kv_heads == 0,
          "num_qo_heads = " + str(heads.num_qo_heads) + " is not a multiple of num_kv_heads = " +
              str(heads.num_kv_heads));
}

void check_indptr(const std::vector<int32_t>& indptr, size_t expected_size, int64_t last,
                  bool allow_shorter, const char* name) {
  require(indptr.size() == expected_size, std::string(name) + " has " + str(indptr.size()) +
                                              " entries, expected " + str(expected_size));
  require(indptr[0] == 0, std::string(name) + "[0] = " + str(indptr[0]) + ", expected 0");
  for (size_t i = 1; i < indptr.size(); ++i) {
    require(indptr[i] >= indptr[i - 1], std::string(name) + "[" + str(i) + "] = " +
                                            str(indptr[i]) + " is smaller than " + name + "[" +
                                            str(i - 1) + "] = " + str(indptr[i - 1]));
  }
  if (allow_shorter) {
    require(indptr.back() <= last, std::string(name) + ".back() = " + str(indptr.back()) +
                                       " exceeds " + str(last));
  } else {
    require(indptr.back() == last, std::string(name) + ".back() = " + str(indptr.back()) +
                                       ", expected " + str(last));
  }
}

void check_batch_options(const Options& opts, int64_t batch_size) {
  auto check = [&](size_t size, const char* name, int64_t expected) {
    require(size == 0 || static_cast<int64_t>(size) == expected,
            std::string("Options::") + name + " has " + str(size) + " entries, expected 0 or " +
                str(expected));
  };
  check(opts.rope_q_offset.size(), "rope_q_offset", batch_size);
  check(opts.rope_k_offset.size(), "rope_k_offset", batch_size);
  check(opts.kv_position_offset.size(), "kv_position_offset", batch_size);
  check(opts.logical_kv_len.size(), "logical_kv_len", batch_size);
  check(opts.custom_mask_indptr.size(), "custom_mask_indptr", batch_size + 1);
}

int64_t packed_rows(const std::vector<double>& t, int64_t heads, int64_t dim, const char* name) {
  const int64_t row = heads * dim;
  require(static_cast<int64_t>(t.size()) % row == 0,
          std::string(name) + " has " + str(t.size()) + " elements, not a multiple of heads*dim = " +
              str(row));
  return static_cast<int64_t>(t.size()) / row;
}

/// Runs fn(begin, end) over [0, n) split into contiguous ranges, one per host thread, when the
/// work (about `cost` multiply-adds) is large enough to pay for the threads; results do not depend
/// on the split (every unit is computed the same way by whichever thread owns it).
void parallel_ranges(int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kMinCostPerThread = int64_t{1} << 20;
  const int64_t hw = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  const int64_t threads = std::min({hw, n, std::max<int64_t>(1, cost / kMinCostPerThread)});
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back(fn, n * t / threads, n * (t + 1) / threads);
  for (std::thread& th : pool) th.join();
}

void attend_request(const double* q, const double* k, const double* v, int64_t qo_len,
                    int64_t kv_len, const HeadConfig& heads, const Options& opts,
                    int64_t request_index, const KeyFilter* filter, double* o, double* lse) {
  check_heads(heads);
  require(qo_len >= 0 && kv_len >= 0, "qo_len = " + str(qo_len) + " and kv_len = " + str(kv_len) +
                                          " must be >= 0");
  const int64_t Hq = heads.num_qo_heads, Hkv = heads.num_kv_heads, D = heads.head_dim;
  const int64_t Dv = heads.value_dim();  // v and o rows; q and k rows are D
  const int64_t group = Hq / Hkv;
  const double scale = opts.sm_scale < 0 ? 1.0 / std::sqrt(static_cast<double>(D)) : opts.sm_scale;
  const int64_t b = request_index;

  // Placement of this call's keys within the logical sequence.
  const int64_t kv_off = per_request(opts.kv_position_offset, b, 0, "kv_position_offset");
  const int64_t logical_len = per_request(opts.logical_kv_len, b, kv_off + kv_len, "logical_kv_len");
  require(kv_off >= 0, "kv_position_offset[" + str(b) + "] = " + str(kv_off) + " must be >= 0");
  require(logical_len >= kv_off + kv_len,
          "logical_kv_len[" + str(b) + "] = " + str(logical_len) + " is smaller than " +
              "kv_position_offset + kv_len = " + str(kv_off + kv_len));
  const int64_t q_pos0 = logical_len - qo_len;  // absolute position of query row 0

  // Options that do not depend on the request.
  require(opts.window_left >= -1, "window_left = " + str(opts.window_left) + " must be >= -1");
  require(opts.num_sink_tokens >= 0, "num_sink_tokens must be >= 0");
  require(opts.logits_soft_cap >= 0, "logits_soft_cap must be >= 0");
  const bool use_alibi = !opts.alibi_slopes.empty();
  require(!use_alibi || static_cast<int64_t>(opts.alibi_slopes.size()) == Hq,
          "alibi_slopes has " + str(opts.alibi_slopes.size()) + " entries, expected num_qo_heads = " +
              str(Hq));

  // Custom mask of this request: [qo_len, logical_len] at mask_base.
  const bool use_mask = !opts.custom_mask_indptr.empty();
  require(use_mask || opts.custom_mask.empty(),
          "Options::custom_mask is set but custom_mask_indptr is empty");
  const uint8_t* mask = nullptr;
  if (use_mask) {
    require(b >= 0 && b + 1 < static_cast<int64_t>(opts.custom_mask_indptr.size()),
            "custom_mask_indptr has " + str(opts.custom_mask_indptr.size()) +
                " entries, none for request " + str(b));
    const int64_t begin = opts.custom_mask_indptr[b], end = opts.custom_mask_indptr[b + 1];
    require(end - begin == qo_len * logical_len,
            "custom mask of request " + str(b) + " has " + str(end - begin) +
                " entries, expected qo_len * logical_kv_len = " + str(qo_len * logical_len));
    require(begin >= 0 && end <= static_cast<int64_t>(opts.custom_mask.size()),
            "custom_mask_indptr[" + str(b) + ".." + str(b + 1) + "] = [" + str(begin) + ", " +
                str(end) + ") is outside custom_mask of size " + str(opts.custom_mask.size()));
    mask = opts.custom_mask.data() + begin;
  }

  // RoPE: rotate q and k once, at their absolute positions plus the per-request offsets.
  std::vector<double> q_rot, k_rot;
  if (opts.rope != RopeMode::None) {
    const int64_t q_shift = per_request(opts.rope_q_offset, b, 0, "rope_q_offset");
    const int64_t k_shift = per_request(opts.rope_k_offset, b, 0, "rope_k_offset");
    std::vector<int64_t> q_positions(qo_len), k_positions(kv_len);
    for (int64_t i = 0; i < qo_len; ++i) q_positions[i] = q_pos0 + i + q_shift;
    for (int64_t j = 0; j < kv_len; ++j) k_positions[j] = kv_off + j + k_shift;
    q_rot.resize(qo_len * Hq * D);
    k_rot.resize(kv_len * Hkv * D);
    rope_rows(q, qo_len, Hq, D, q_positions.data(), opts.rope, opts.rope_params, q_rot.data());
    rope_rows(k, kv_len, Hkv, D, k_positions.data(), opts.rope, opts.rope_params, k_rot.data());
    q = q_rot.data();
    k = k_rot.data();
  }

  // One unit = (query row i, query head h); units are independent, so large requests spread
  // over the host's cores (the GPU tests spend most of their time here).
  auto attend_units = [&](int64_t unit_begin, int64_t unit_end) {
    std::vector<int64_t> visible;  // local key indices visible to row i
    std::vector<double> logits;    // logits of the visible keys, same order
    std::vector<double> acc(Dv);
    int64_t visible_row = -1;      // the row `visible` was built for
    for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
      const int64_t i = unit / Hq, h = unit % Hq;
      const int64_t p = q_pos0 + i;

      // Mask: which keys does row i see? (Independent of the head.)
      if (visible_row != i) {
        visible.clear();
        for (int64_t j = 0; j < kv_len; ++j) {
          const int64_t t = kv_off + j;  // absolute key position
          if (filter != nullptr && !(*filter)(i, j)) continue;
          if (opts.causal && t > p) continue;
          const bool is_sink = t < opts.num_sink_tokens;
          if (opts.window_left >= 0 && t < p - opts.window_left && !is_sink) continue;
          if (mask != nullptr && mask[i * logical_len + t] == 0) continue;
          visible.push_back(j);
        }
        visible_row = i;
      }

      const int64_t kvh = h / group;
      const double* qi = q + (i * Hq + h) * D;
      double* out = o + (i * Hq + h) * Dv;

      // Logits of visible keys.
      logits.resize(visible.size());
      for (size_t n = 0; n < visible.size(); ++n) {
        const int64_t j = visible[n];
        const double* kj = k + (j * Hkv + kvh) * D;
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
        double x = scale * dot;
        if (use_alibi) x += opts.alibi_slopes[h] * static_cast<double>((kv_off + j) - p);
        if (opts.logits_soft_cap > 0) x = opts.logits_soft_cap * std::tanh(x / opts.logits_soft_cap);
        logits[n] = x;
      }

      // Weights P_ij and output O_i = sum_j P_ij v_j.
      std::fill(acc.begin(), acc.end(), 0.0);
      if (opts.use_softmax) {
        if (visible.empty()) {
          std::fill(out, out + Dv, 0.0);
          lse[i * Hq + h] = -kInf;
          continue;
        }
        const double m = *std::max_element(logits.begin(), logits.end());
        double sum = 0.0;
        for (size_t n = 0; n < visible.size(); ++n) {
          const double w = std::exp(logits[n] - m);
          sum += w;
          const double* vj = v + (visible[n] * Hkv + kvh) * Dv;
          for (int64_t d = 0; d < Dv; ++d) acc[d] += w * vj[d];
        }
        for (int64_t d = 0; d < Dv; ++d) out[d] = acc[d] / sum;
        lse[i * Hq + h] = m + std::log(sum);
      } else {
        for (size_t n = 0; n < visible.size(); ++n) {
          const double w = 1.0 / (1.0 + std::exp(-(logits[n] + opts.sigmoid_bias)));
          const double* vj = v + (visible[n] * Hkv + kvh) * Dv;
          for (int64_t d = 0; d < Dv; ++d) acc[d] += w * vj[d];
        }
        for (int64_t d = 0; d < Dv; ++d) out[d] = acc[d];
        lse[i * Hq + h] = std::numeric_limits<double>::quiet_NaN();
      }
    }
  };
  parallel_ranges(qo_len * Hq, qo_len * Hq * std::max<int64_t>(kv_len, 1) * (D + Dv), attend_units);
}

}  // namespace detail

// ------------------------------------------------------------------------------------------------
// Variant helpers
// ------------------------------------------------------------------------------------------------

std::vector<double> alibi_slopes(int64_t num_heads) {
  detail::require(num_heads >= 1, "alibi_slopes: num_heads = " + str(num_heads) + " must be >= 1");
  int64_t n = 1;
  while (n * 2 <= num_heads) n *= 2;  // largest power of two <= num_heads
  std::vector<double> slopes;
  slopes.reserve(num_heads);
  for (int64_t k = 1; k <= n; ++k) slopes.push_back(std::pow(2.0, -8.0 * k / n));
  // Remaining heads: every other slope of the 2n-head series, starting with its first.
  for (int64_t k = 1; k <= num_heads - n; ++k) {
    slopes.push_back(std::pow(2.0, -4.0 * (2 * k - 1) / n));
  }
  return slopes;
}

std::vector<double> rope_frequencies(int64_t head_dim, RopeMode mode, const RopeParams& params) {
  detail::require(mode != RopeMode::None, "rope_frequencies: mode is None");
  detail::require(head_dim >= 2 && head_dim % 2 == 0,
                  "rope_frequencies: head_dim = " + str(head_dim) + " must be even and >= 2");
  detail::require(params.theta > 0, "RopeParams::theta must be > 0");
  const int64_t half = head_dim / 2;
  std::vector<double> freq(half);
  for (int64_t d = 0; d < half; ++d) {
    freq[d] = std::pow(params.theta, -2.0 * static_cast<double>(d) / static_cast<double>(head_dim));
  }
  if (mode == RopeMode::Llama31) {
    const double factor = params.llama31_factor;
    const double low_ff = params.llama31_low_freq_factor;
    const double high_ff = params.llama31_high_freq_factor;
    const double orig = params.llama31_original_max_position;
    detail::require(factor > 0 && high_ff > low_ff && low_ff > 0 && orig > 0,
                    "RopeParams: Llama 3.1 parameters need factor > 0, high_freq_factor > "
                    "low_freq_factor > 0, original_max_position > 0");
    const double high_freq_wavelen = orig / high_ff;  // shorter wavelengths: unchanged
    const double low_freq_wavelen = orig / low_ff;    // longer wavelengths: divided by factor
    for (int64_t d = 0; d < half; ++d) {
      const double wavelen = 2.0 * kPi / freq[d];
      if (wavelen < high_freq_wavelen) {
        // keep
      } else if (wavelen > low_freq_wavelen) {
        freq[d] = freq[d] / factor;
      } else {
        const double smooth = (orig / wavelen - low_ff) / (high_ff - low_ff);
        freq[d] = (1.0 - smooth) * freq[d] / factor + smooth * freq[d];
      }
    }
  }
  return freq;
}

std::vector<double> apply_rope(const std::vector<double>& x, int64_t n, int64_t num_heads,
                               int64_t head_dim, const std::vector<int64_t>& positions,
                               RopeMode mode, const RopeParams& params) {
  detail::require(n >= 0 && num_heads >= 1 && head_dim >= 1, "apply_rope: bad sizes");
  detail::require(static_cast<int64_t>(x.size()) == n * num_heads * head_dim,
                  "apply_rope: x has " + str(x.size()) + " elements, expected n*H*D = " +
                      str(n * num_heads * head_dim));
  detail::require(static_cast<int64_t>(positions.size()) == n,
                  "apply_rope: positions has " + str(positions.size()) + " entries, expected " +
                      str(n));
  if (mode == RopeMode::None) return x;
  std::vector<double> out(x.size());
  rope_rows(x.data(), n, num_heads, head_dim, positions.data(), mode, params, out.data());
  return out;
}

std::vector<double> lse_natural_to_log2(const std::vector<double>& lse) {
  std::vector<double> out(lse.size());
  for (size_t i = 0; i < lse.size(); ++i) out[i] = lse[i] * kLog2E;  // keeps +-inf and NaN
  return out;
}

std::vector<double> lse_log2_to_natural(const std::vector<double>& lse) {
  std::vector<double> out(lse.size());
  for (size_t i = 0; i < lse.size(); ++i) out[i] = lse[i] / kLog2E;
  return out;
}

// ------------------------------------------------------------------------------------------------
// Core
// ------------------------------------------------------------------------------------------------

State attention_single(const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, int64_t qo_len, int64_t kv_len,
                       const HeadConfig& heads, const Options& opts, int64_t request_index) {
  detail::check_heads(heads);
  const int64_t Hq = heads.num_qo_heads, Hkv = heads.num_kv_heads, D = heads.head_dim;
  detail::require(qo_len >= 0 && kv_len >= 0, "attention_single: negative length");
  detail::require(static_cast<int64_t>(q.size()) == qo_len * Hq * D,
                  "attention_single: q has " + str(q.size()) + " elements, expected qo_len*Hq*D = " +
                      str(qo_len * Hq * D));
  detail::require(static_cast<int64_t>(k.size()) == kv_len * Hkv * D,
                  "attention_single: k has " + str(k.size()) + " elements, expected kv_len*Hkv*D = " +
                      str(kv_len * Hkv * D));
  const int64_t Dv = heads.value_dim();
  detail::require(static_cast<int64_t>(v.size()) == kv_len * Hkv * Dv,
                  "attention_single: v has " + str(v.size()) + " elements, expected kv_len*Hkv*Dv = " +
                      str(kv_len * Hkv * Dv));
  State s;
  s.rows = qo_len;
  s.heads = Hq;
  s.head_dim = Dv;
  s.o.assign(qo_len * Hq * Dv, 0.0);
  s.lse.assign(qo_len * Hq, 0.0);
  detail::attend_request(q.data(), k.data(), v.data(), qo_len, kv_len, heads, opts, request_index,
                         nullptr, s.o.data(), s.lse.data());
  return s;
}

// ------------------------------------------------------------------------------------------------
// Utilities
// ------------------------------------------------------------------------------------------------

namespace {

// Classifies one element pair. Returns false if the pair makes the error infinite; otherwise sets
// `skip` when it is an equal-infinity pair that contributes nothing.
bool compare_element(double a, double r, bool& skip) {
  skip = false;
  if (std::isnan(a) || std::isnan(r)) return false;
  if (std::isinf(a) || std::isinf(r)) {
    if (a == r) {
      skip = true;
      return true;
    }
    return false;
  }
  return true;
}

}  // namespace

double rel_error(const double* out, const double* ref, size_t n) {
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < n; ++i) {
    bool skip = false;
    if (!compare_element(out[i], ref[i], skip)) return kInf;
    if (skip) continue;
    const double d = out[i] - ref[i];
    diff2 += d * d;
    ref2 += ref[i] * ref[i];
  }
  if (ref2 == 0.0) return diff2 == 0.0 ? 0.0 : kInf;
  return std::sqrt(diff2) / std::sqrt(ref2);
}

double rel_error(const std::vector<double>& out, const std::vector<double>& ref) {
  detail::require(out.size() == ref.size(), "rel_error: sizes differ (" + str(out.size()) +
                                                " vs " + str(ref.size()) + ")");
  return rel_error(out.data(), ref.data(), out.size());
}

double rel_error(const std::vector<float>& out, const std::vector<double>& ref) {
  return rel_error(std::vector<double>(out.begin(), out.end()), ref);
}

double max_abs_error(const double* out, const double* ref, size_t n) {
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    bool skip = false;
    if (!compare_element(out[i], ref[i], skip)) return kInf;
    if (skip) continue;
    worst = std::max(worst, std::fabs(out[i] - ref[i]));
  }
  return worst;
}

double max_abs_error(const std::vector<double>& out, const std::vector<double>& ref) {
  detail::require(out.size() == ref.size(), "max_abs_error: sizes differ (" + str(out.size()) +
                                                " vs " + str(ref.size()) + ")");
  return max_abs_error(out.data(), ref.data(), out.size());
}

double max_abs_error(const std::vector<float>& out, const std::vector<double>& ref) {
  return max_abs_error(std::vector<double>(out.begin(), out.end()), ref);
}

void fill_normal(std::vector<double>& out, std::mt19937_64& gen, double mean, double stddev) {
  const double two_pow_minus_53 = 1.0 / 9007199254740992.0;
  for (size_t i = 0; i < out.size(); i += 2) {
    // Box-Muller: u1 in (0, 1], u2 in [0, 1), from the top 53 bits of the raw output.
    const double u1 = static_cast<double>((gen() >> 11) + 1) * two_pow_minus_53;
    const double u2 = static_cast<double>(gen() >> 11) * two_pow_minus_53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = mean + stddev * r * std::cos(2.0 * kPi * u2);
    if (i + 1 < out.size()) out[i + 1] = mean + stddev * r * std::sin(2.0 * kPi * u2);
  }
}

std::vector<double> random_normal(size_t n, uint64_t seed, double mean, double stddev) {
  std::mt19937_64 gen(seed);
  std::vector<double> out(n);
  fill_normal(out, gen, mean, stddev);
  return out;
}

}  // namespace tessera_ref
