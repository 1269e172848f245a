// Tessera fp64 CPU reference oracle.
//
// This is the independent oracle that every Tessera GPU kernel is checked against. It is written
// straight from the mathematics of attention and shares no code with the Tessera library or its
// kernels (nothing from include/tessera or kernels/ is used). Everything is computed in double
// precision with plain loops; clarity is preferred over speed.
//
// Conventions used throughout this header:
//   * Tensors are std::vector<double>, row-major and contiguous. Their shapes are written as
//     `// [dim0, dim1, ...]`, last dimension fastest.
//   * Hq  = number of query/output heads, Hkv = number of KV heads, D = head dimension.
//     Hq % Hkv == 0; with group size g = Hq / Hkv, query head h reads KV head h / g
//     (GQA; MQA when Hkv == 1; plain multi-head when Hkv == Hq).
//   * Positions: for one request with `qo_len` queries over a logical KV sequence of length
//     `kv_len`, query row i sits at absolute position p_i = kv_len - qo_len + i (the queries are
//     the last qo_len positions) and key j sits at position j.
//   * The oracle's LSE is in NATURAL log: LSE_i = log(sum over visible j of exp(x_ij)).
//     Tessera's public API reports base-2 LSE (natural LSE * log2(e)); convert with
//     lse_natural_to_log2 / lse_log2_to_natural.
//   * Index arrays that mirror GPU index arrays (indptr, indices, last_page_len) are int32_t like
//     Tessera's; custom-mask offsets, which can exceed 2^31, are int64_t.
//   * Invalid arguments (inconsistent sizes, out-of-range indices, ...) throw
//     std::invalid_argument with a message that names the argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace tessera_ref {

// ------------------------------------------------------------------------------------------------
// Basic types
// ------------------------------------------------------------------------------------------------

// Head configuration shared by queries, keys and values.
struct HeadConfig {
  int64_t num_qo_heads = 1;  // Hq, number of query (and output) heads, >= 1
  int64_t num_kv_heads = 1;  // Hkv, number of key/value heads, >= 1, divides Hq
  int64_t head_dim = 1;      // D, elements per query and key head vector, >= 1 (even when RoPE is used)
  // Dv, elements per value and output head vector (DeepSeek prefill: D = 192, Dv = 128); 0 means
  // D. Dense and ragged attention take any Dv >= 1; the paged and block-sparse functions need
  // Dv == D.
  int64_t head_dim_vo = 0;
  int64_t value_dim() const { return head_dim_vo == 0 ? head_dim : head_dim_vo; }
};

// Attention state: output and log-sum-exp per (row, query head).
struct State {
  int64_t rows = 0;          // number of query rows
  int64_t heads = 0;         // number of query heads (Hq)
  int64_t head_dim = 0;      // the output's head dim (HeadConfig::value_dim())
  std::vector<double> o;     // [rows, heads, head_dim]
  std::vector<double> lse;   // [rows, heads]; natural log unless a function says otherwise;
                             // -inf for a row that saw no key; NaN in softmax-free mode
};

// Page layout of a paged KV cache.
enum class Layout {
  NHD,  // [num_pages, page_size, Hkv, D]
  HND,  // [num_pages, Hkv, page_size, D]
};

// Rotary position embedding variant.
enum class RopeMode {
  None,     // no rotary embedding
  Llama,    // non-interleaved ("rotate half", Llama / GPT-NeoX style)
  Llama31,  // same rotation with Llama 3.1 frequency scaling
};

struct RopeParams {
  double theta = 1e4;     // base: freq_d = theta^(-2d/D) for d in [0, D/2)
  double scale = 1.0;     // rope_scale: the position t is divided by it before use (t / scale)
  // Llama 3.1 frequency scaling (used only with RopeMode::Llama31):
  double llama31_factor = 8.0;                // divides low frequencies
  double llama31_low_freq_factor = 1.0;       // low_ff
  double llama31_high_freq_factor = 4.0;      // high_ff
  double llama31_original_max_position = 8192.0;
};

// Attention variant and masking options. One Options object applies to a whole batch call; the
// per-request vectors are indexed by request (batch) index b.
struct Options {
  // Logit scale: x = sm_scale * dot(q', k'). A negative value (the default) means 1/sqrt(D).
  double sm_scale = -1.0;

  // Causal mask: key j visible to row i only if j <= p_i.
  bool causal = false;

  // Sliding window: if >= 0, key j visible to row i only if j >= p_i - window_left.
  // -1 disables the window.
  int64_t window_left = -1;

  // Logits soft-cap: if > 0, x = cap * tanh(x / cap) (applied after ALiBi). 0 disables it.
  double logits_soft_cap = 0.0;

  // ALiBi: empty = off; otherwise one slope per query head ([Hq]); x += slope[h] * (j - p_i).
  // Use alibi_slopes(Hq) for the standard slopes.
  std::vector<double> alibi_slopes;

  // true: softmax attention. false: softmax-free (sigmoid) attention,
  // P_ij = 1 / (1 + exp(-(x_ij + sigmoid_bias))) for visible keys, 0 otherwise; O_i = sum_j P_ij v_j;
  // the LSE output is filled with NaN.
  bool use_softmax = true;
  double sigmoid_bias = 0.0;

  // Attention sinks: keys j < num_sink_tokens stay visible even outside the sliding window
  // (they still obey the causal mask, the custom mask and, for block-sparse, the block set).
  int64_t num_sink_tokens = 0;

  // Rotary embedding applied to q at positions p_i + rope_q_offset[b] and to k at positions
  // j + rope_k_offset[b], before the dot product. Offsets: empty = 0 for every request, else [B].
  RopeMode rope = RopeMode::None;
  RopeParams rope_params;
  std::vector<int64_t> rope_q_offset;  // [B] or empty
  std::vector<int64_t> rope_k_offset;  // [B] or empty

  // Custom mask, 1 = visible, 0 = masked. Active iff custom_mask_indptr is non-empty, in which case
  // it has B+1 entries and request b's mask is a row-major [qo_len_b, logical_kv_len_b] array of
  // uint8 at custom_mask[custom_mask_indptr[b] ...]. Columns are absolute key positions.
  std::vector<uint8_t> custom_mask;
  std::vector<int64_t> custom_mask_indptr;  // [B+1] or empty

  // Placement of this call's KV inside a larger logical request (split-KV chunks, composable
  // levels). Both empty by default, meaning that the call's KV is the whole logical sequence.
  //   kv_position_offset[b]: key j of this call's KV for request b has absolute position
  //                          kv_position_offset[b] + j (default 0).
  //   logical_kv_len[b]:     length of request b's whole logical KV sequence, which places the
  //                          queries (p_i = logical_kv_len - qo_len + i) and is the custom-mask row
  //                          width (default: this call's kv_len for b). Must be
  //                          >= kv_position_offset[b] + kv_len_b.
  // Masks, ALiBi and RoPE all use absolute positions, so the states of disjoint chunks computed
  // with the same Options (apart from these two vectors) merge into the state of the whole.
  std::vector<int64_t> kv_position_offset;  // [B] or empty
  std::vector<int64_t> logical_kv_len;      // [B] or empty
};

// ------------------------------------------------------------------------------------------------
// Variant helpers
// ------------------------------------------------------------------------------------------------

// Standard ALiBi slopes for `num_heads` heads (ALiBi paper / HF get_alibi_slopes): with n the
// largest power of two <= num_heads, heads 0..n-1 get 2^(-8k/n) for k = 1..n, and the remaining
// num_heads - n heads get 2^(-4(2k-1)/n) for k = 1..num_heads-n. Returns [num_heads].
std::vector<double> alibi_slopes(int64_t num_heads);

// The D/2 rotary frequencies (radians per position unit) for head_dim D (even), after Llama 3.1
// scaling when mode == Llama31. mode must not be None. Returns [D/2].
std::vector<double> rope_frequencies(int64_t head_dim, RopeMode mode, const RopeParams& params);

// Applies rotary embedding to x [n, num_heads, head_dim]; row r uses position positions[r]
// (positions has n entries; the angle for frequency d is (positions[r] / params.scale) * freq_d).
// Non-interleaved rotation: for d < D/2, out[d] = x[d] cos - x[d+D/2] sin,
// out[d+D/2] = x[d+D/2] cos + x[d] sin. mode == None returns x unchanged. Returns [n, H, D].
std::vector<double> apply_rope(const std::vector<double>& x, int64_t n, int64_t num_heads,
                               int64_t head_dim, const std::vector<int64_t>& positions,
                               RopeMode mode, const RopeParams& params = RopeParams{});

// Elementwise LSE base conversion: log2-LSE = natural-LSE * log2(e). +-inf and NaN are kept.
std::vector<double> lse_natural_to_log2(const std::vector<double>& lse);
std::vector<double> lse_log2_to_natural(const std::vector<double>& lse);

// ------------------------------------------------------------------------------------------------
// Core: one request over dense tensors
// ------------------------------------------------------------------------------------------------

// Attention for one request.
//   q: [qo_len, Hq, D]; k, v: [kv_len, Hkv, D]  (kv_len = KV rows in this call; see
//   Options::kv_position_offset / logical_kv_len for a chunk of a larger logical sequence).
//   request_index selects this request's entries in the per-request Options vectors (custom mask,
//   RoPE offsets, kv placement).
// Returns a State with rows = qo_len, natural-log LSE (NaN when !use_softmax).
State attention_single(const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, int64_t qo_len, int64_t kv_len,
                       const HeadConfig& heads, const Options& opts, int64_t request_index = 0);

// ------------------------------------------------------------------------------------------------
// Formats. Every batch function returns a State over all packed query rows [total_q, Hq, D],
// in the order of qo_indptr.
// ------------------------------------------------------------------------------------------------

// 1. Ragged: q [total_q, Hq, D] with qo_indptr [B+1]; k, v [total_kv, Hkv, D] with kv_indptr [B+1].
//    Request b owns query rows qo_indptr[b]..qo_indptr[b+1]-1 and KV rows
//    kv_indptr[b]..kv_indptr[b+1]-1. Both indptr arrays start at 0, are non-decreasing and end at
//    the packed tensors' row counts.
State attention_ragged(const std::vector<double>& q, const std::vector<int32_t>& qo_indptr,
                       const std::vector<double>& k, const std::vector<double>& v,
                       const std::vector<int32_t>& kv_indptr, const HeadConfig& heads,
                       const Options& opts);

// 2. Paged KV cache.
struct PagedCache {
  Layout layout = Layout::NHD;
  int64_t page_size = 1;      // slots per page, >= 1
  int64_t num_pages = 0;      // pages in k_pages / v_pages
  int64_t num_kv_heads = 1;   // Hkv
  int64_t head_dim = 1;       // D, of k_pages
  int64_t head_dim_vo = 0;    // Dv, of v_pages; 0 means D
  std::vector<double> k_pages;  // NHD: [num_pages, page_size, Hkv, D]; HND: [num_pages, Hkv, page_size, D]
  std::vector<double> v_pages;  // the same with Dv for D
  std::vector<int32_t> indptr;         // [B+1], request b uses indices[indptr[b] .. indptr[b+1]-1]
  std::vector<int32_t> indices;        // [nnz_pages], page ids in [0, num_pages), in logical order
  std::vector<int32_t> last_page_len;  // [B], slots used in b's last page, in [1, page_size] when
                                       // b has >= 1 page (ignored, may be anything, when it has none)
  // Request b's kv_len = (num_pages_b - 1) * page_size + last_page_len[b], or 0 without pages.
  int64_t batch_size() const { return indptr.empty() ? 0 : static_cast<int64_t>(indptr.size()) - 1; }
  int64_t value_dim() const { return head_dim_vo == 0 ? head_dim : head_dim_vo; }
};

// kv_len of request b in the cache.
int64_t paged_kv_len(const PagedCache& cache, int64_t b);

// Dense K and V of one request gathered from the cache.
struct DenseKV {
  int64_t kv_len = 0;
  std::vector<double> k;  // [kv_len, Hkv, D]
  std::vector<double> v;  // [kv_len, Hkv, Dv]
};
DenseKV gather_paged(const PagedCache& cache, int64_t b);

// Builds a paged cache holding the given requests (k[b], v[b]: [kv_lens[b], Hkv, D]).
// Pages are allocated in logical order, then relabelled by a permutation of the page ids:
// shuffle_seed == 0 keeps pages 0, 1, 2, ... in order; any other seed shuffles them
// deterministically (std::mt19937_64 + Fisher-Yates). extra_pages unused pages are added to the
// pool (and shuffled with it). Slots that hold no token (tails of last pages, unused pages) are
// filled with `unused_fill` (NaN by default, so any read of them poisons the result; pass a finite
// value for kernels that are allowed to read, but not use, those slots). A request with kv_len 0
// gets no pages and last_page_len 0. head_dim_vo (0: head_dim) is the head dim of v[b] and of the
// V pages.
PagedCache build_paged(const std::vector<std::vector<double>>& k,
                       const std::vector<std::vector<double>>& v,
                       const std::vector<int64_t>& kv_lens, int64_t num_kv_heads,
                       int64_t head_dim, int64_t page_size, Layout layout,
                       uint64_t shuffle_seed = 0, int64_t extra_pages = 0,
                       double unused_fill = std::numeric_limits<double>::quiet_NaN(), int64_t head_dim_vo = 0);

// Paged attention: q [total_q, Hq, D] with qo_indptr [B+1] (B = cache.batch_size()).
// heads.num_kv_heads and heads.head_dim must match the cache.
State attention_paged(const std::vector<double>& q, const std::vector<int32_t>& qo_indptr,
                      const PagedCache& cache, const HeadConfig& heads, const Options& opts);

// 3. Block-sparse row (BSR) matrix over one "request" with M query rows and N KV slots.
struct BlockSparse {
  int64_t block_rows = 1;        // Br >= 1
  int64_t block_cols = 1;        // Bc >= 1
  std::vector<int32_t> indptr;   // [ceil(M/Br) + 1], non-decreasing, indptr[0] == 0
  std::vector<int32_t> indices;  // [nnz_blocks], column-block ids in [0, ceil(N/Bc)); duplicates
                                 // within a block row are rejected
};

// q [M, Hq, D], k, v [N, Hkv, D]. Query row r sees the KV columns of the column blocks listed for
// its block row r / Br (columns >= N of a partial last block do not exist); then the Options masks
// apply with qo_len = M, kv_len = N, request index 0 (so per-request Options vectors, including
// custom_mask_indptr, describe one request). Sink tokens never add keys outside the block set.
State attention_block_sparse(const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, int64_t M, int64_t N,
                             const BlockSparse& bsr, const HeadConfig& heads, const Options& opts);

// 4. Composable formats. A composable KV is an ordered list of levels, each one of the formats
//    above over the same packed query rows and a disjoint part of the logical KV. Compute each
//    level's State with the function for its format (placing its KV with
//    Options::kv_position_offset / logical_kv_len, or, for a level whose keys precede every query
//    and use no position-dependent variant, e.g. a shared prefix, any placement), then combine
//    them with merge_levels, which folds merge_state over the list in order. The result equals
//    attention over the union of the levels' KV sets. Softmax mode only.
State merge_levels(const std::vector<State>& levels);

// ------------------------------------------------------------------------------------------------
// Attention-state merge (DESIGN section 2)
// ------------------------------------------------------------------------------------------------

// Merges two states of identical shape over disjoint KV sets:
//   LSE = log(exp(LSE_a) + exp(LSE_b)),  O = exp(LSE_a - LSE) O_a + exp(LSE_b - LSE) O_b.
// Both LSE = -inf gives O = 0, LSE = -inf. With lse_base2 the LSEs are base 2 throughout
// (LSE = log2(2^a + 2^b), weights 2^(LSE_a - LSE)). Only meaningful for softmax states.
State merge_state(const State& a, const State& b, bool lse_base2 = false);

// Folds merge_state over `states` in the given order (states[0] merged with states[1], the result
// with states[2], ...). An empty list is rejected (the shape would be unknown).
State merge_states(const std::vector<State>& states, bool lse_base2 = false);

// Variable-length merge over packed states: v [total_states, H, D], s [total_states, H] and
// indptr [num_rows+1]; output row r merges states indptr[r] .. indptr[r+1]-1 in that order.
// A row with zero states gets O = 0, LSE = -inf. LSEs (in and out) are base 2 iff lse_base2.
State merge_states_varlen(const std::vector<double>& v, const std::vector<double>& s,
                          const std::vector<int32_t>& indptr, int64_t num_heads, int64_t head_dim,
                          bool lse_base2 = false);

// ------------------------------------------------------------------------------------------------
// Comparison and input utilities for tests
// ------------------------------------------------------------------------------------------------

// Relative error ||out - ref||_2 / ||ref||_2 over n elements. Rules per element: NaN in either
// => +inf; equal infinities (same sign, e.g. -inf LSE of empty rows) => 0 error and excluded from
// both norms; an infinity on one side only, or opposite infinities => +inf. If ||ref|| == 0 the
// result is 0 when ||out - ref|| == 0 and +inf otherwise.
double rel_error(const double* out, const double* ref, size_t n);
double rel_error(const std::vector<double>& out, const std::vector<double>& ref);
double rel_error(const std::vector<float>& out, const std::vector<double>& ref);

// Maximum absolute difference, same NaN / infinity rules as rel_error.
double max_abs_error(const double* out, const double* ref, size_t n);
double max_abs_error(const std::vector<double>& out, const std::vector<double>& ref);
double max_abs_error(const std::vector<float>& out, const std::vector<double>& ref);

// Deterministic normal(mean, stddev) values from std::mt19937_64 seeded with `seed`, using
// Box-Muller on the generator's raw 64-bit output (so the values are the same with every C++
// standard library).
std::vector<double> random_normal(size_t n, uint64_t seed, double mean = 0.0, double stddev = 1.0);
void fill_normal(std::vector<double>& out, std::mt19937_64& gen, double mean = 0.0,
                 double stddev = 1.0);

}  // namespace tessera_ref
