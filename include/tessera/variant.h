// Attention variants (docs/design.md §1.2, §7): the built-in variants every entry point accepts through
// AttentionOptions::variant, user variants given as CUDA source text, and the FlexAttention-style
// front end (mask_mod / score_mod).
//
// How a call runs: the default variant (softmax attention, optional causal mask) is compiled
// ahead of time into libtessera. Any other variant — a built-in option set here, a user snippet,
// or both — is compiled just in time with NVRTC for the current GPU on first use, cached in
// memory and on disk under $TESSERA_CACHE_DIR (default ~/.cache/tessera), and launched through
// the driver API (src/jit). The first use logs one line with the compile time to stderr
// (TESSERA_JIT_QUIET=1 silences it). Compile errors in user code are tessera::Error
// (kInvalidArgument) carrying NVRTC's log with the line numbers of the user's snippet.
//
// Variant formula (docs/design.md §1.2), per query row i (position p_i = kv_len - qo_len + i) and key j:
//   q' = QueryTransform(q), k' = KeyTransform(k), v' = ValueTransform(v)     (built-in: RoPE)
//   x  = LogitsTransform(sm_scale * q'.k')          (built-in: ALiBi, then soft-cap; then user)
//   visible = causal && window && sinks && custom mask && user LogitsMask
//   softmax on:  O = sum_j softmax_j(x) v'_j over visible j; LSE (base 2) of the visible x
//   softmax off: O = sum_j x_j v'_j over visible j (with sigmoid: x = sigmoid(x + bias)); LSE = NaN
//   O' = OutputTransform(O)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/export.h"
#include "tessera/stream.h"
#include "tessera/tensor.h"

namespace tessera {

/// Rotary position embedding fused into the attention kernels (applied to q and k as they are
/// loaded; the cache keeps un-rotated keys).
enum class PosEncoding : int32_t {
  kNone = 0,
  kRopeLlama = 1,    ///< non-interleaved ("rotate half") RoPE, freq_d = theta^(-2d/D)
  kRopeLlama31 = 2,  ///< the same rotation with Llama 3.1 frequency scaling
};

struct RopeOptions {
  PosEncoding mode = PosEncoding::kNone;
  double theta = 1e4;  ///< rope_theta, > 1
  double scale = 1.0;  ///< rope_scale, > 0: the position t is used as t / scale
  // Llama 3.1 scaling (mode kRopeLlama31): wavelengths above original_max_position / low_freq_factor
  // are divided by `factor`, those below original_max_position / high_freq_factor kept, and the
  // band between interpolated smoothly.
  double llama31_factor = 8.0;
  double llama31_low_freq_factor = 1.0;
  double llama31_high_freq_factor = 4.0;
  double llama31_original_max_position = 8192.0;
  /// Optional i32 [batch] on the device: request b's queries are rotated at position
  /// p_i + q_offset[b] and its keys at j + k_offset[b] (undefined: 0).
  TensorView q_offset;
  TensorView k_offset;
};

/// An extra parameter of a user variant: a scalar or a device tensor, visible in the user's source
/// as `params.<name>` (scalar: float, int32_t or int64_t; tensor: `const E*` where E is the
/// tensor's element type: float, int32_t, uint8_t, __half or __nv_bfloat16).
struct TESSERA_API VariantParam {
  enum class Kind : int32_t { kF32 = 0, kI32 = 1, kI64 = 2, kTensor = 3 };
  std::string name;  ///< a C identifier, unique within the variant
  Kind kind = Kind::kF32;
  double f32 = 0.0;
  int64_t i64 = 0;    ///< value of kI32 / kI64
  TensorView tensor;  ///< kTensor: any dtype above, on the device of q

  static VariantParam scalar_f32(std::string name, float value);
  static VariantParam scalar_i32(std::string name, int32_t value);
  static VariantParam scalar_i64(std::string name, int64_t value);
  static VariantParam device_tensor(std::string name, const TensorView& tensor);
};

/// At most this many extra parameters per variant.
inline constexpr int kMaxVariantParams = 16;

/// A user variant: CUDA C++ source that defines any subset of these hooks as free functions
/// (every index is an int; `Params` is the generated struct of the variant's `params`):
///
///   float2 query_transform(const Params& params, float2 value, int batch, int qo_idx, int kv_idx,
///                          int qo_head, int kv_head, int dim);
///   float2 key_transform(...same...);
///   float2 value_transform(...same...);
///       `value` holds elements dim and dim + head_dim / 2 of one row (pairs, so a rotation
///       such as RoPE sees both halves); return the transformed pair. kv_idx is -1 in
///       query_transform, qo_idx is -1 in key/value_transform.
///   float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx,
///                          int qo_head, int kv_head);
///       `logits` is sm_scale * q.k after the built-in transforms (natural units).
///   bool logits_mask(const Params& params, int batch, int qo_idx, int kv_idx, int qo_head,
///                    int kv_head);
///       false hides key kv_idx from the query (ANDed with the built-in masks).
///   float output_transform(const Params& params, float value, int batch, int qo_idx, int qo_head,
///                          int dim);
///       applied to each element of the final (normalised) output.
///
/// qo_idx is the query's position in its request's sequence (kv_len - qo_len + i, so causal is
/// `kv_idx <= qo_idx` for prefill, decode and append alike); for block-sparse attention it is
/// N - M + row and kv_idx the column. batch is the request (block-sparse: 0, one sequence).
/// Any hook may take one more, last argument `const Request& request` (a generated struct with
/// `int qo_len, kv_len`: the request's query rows and KV length, in block-sparse attention the
/// block row's rows and its listed columns; and `bool padding_row`: the logits hooks' call is for
/// a padding row of the request's last query tile, whose qo_idx is the last real row's and whose
/// result is never stored, so a hook with side effects skips it); a hook defined both ways is
/// called with it.
/// Functions are device functions (NVRTC compiles with -default-device); <cuda_fp16.h>,
/// <cuda_bf16.h> and the CUDA math functions are available.
struct VariantSpec {
  std::string name;    ///< for log lines and errors, e.g. "my_alibi"
  std::string source;  ///< the hooks; may be empty (built-in options only)
  std::vector<VariantParam> params;
  /// false: no softmax; the logits after logits_transform are the weights (O = sum x_j v_j,
  /// no normalisation, LSE output NaN).
  bool use_softmax = true;
};

/// Built-in variants, combinable with each other and with one user variant. Defaults: none.
struct TESSERA_API VariantOptions {
  /// Sliding window: key j visible to query position p only if j >= p - window_left. -1: off.
  int64_t window_left = -1;
  /// Attention sinks (StreamingLLM): keys j < num_sink_tokens stay visible outside the window
  /// (they still obey causal and the other masks). Needs window_left >= 0.
  int64_t num_sink_tokens = 0;
  /// Logits soft-cap: x = cap * tanh(x / cap) after ALiBi. 0: off; else > 0.
  double logits_soft_cap = 0.0;
  /// ALiBi: f32 [num_qo_heads] device slopes (alibi_slopes() gives the standard ones);
  /// x += slope[h] * (j - p). Undefined: off.
  TensorView alibi_slopes;
  /// Sigmoid attention: softmax off, weights sigmoid(x + sigmoid_bias) (x = sm_scale * q.k).
  bool sigmoid = false;
  double sigmoid_bias = 0.0;
  /// Custom mask (tree attention): u8 packed bits on the device, bit order little (bit k of a byte
  /// is element 8 * byte + k); request b's mask is a row-major [qo_len_b, kv_len_b] bit matrix
  /// starting at byte custom_mask_indptr[b]; 1 = visible. custom_mask_indptr: i32 [batch + 1] on
  /// the device, byte offsets (FlashInfer's packed_custom_mask / mask_indptr; in the plan/run
  /// runtime's PlanShape a HOST array, uploaded by plan()). Prefill and decode over ragged or paged
  /// KV only. Undefined: off.
  TensorView custom_mask;
  TensorView custom_mask_indptr;
  RopeOptions rope;
  /// A user variant (its hooks run after the built-in ones); nullptr: none. Must outlive the call.
  const VariantSpec* user = nullptr;

  /// True when nothing is set: the ahead-of-time kernels run.
  bool is_default() const;
};

/// Standard ALiBi slopes for `num_heads` heads, host values (upload them as f32 [num_heads]).
TESSERA_API std::vector<float> alibi_slopes(int64_t num_heads);

// ---------------------------------------------------------------------------------------------
// FlexAttention-style front end.

/// A mask_mod: `source` defines `bool <function>(const Params& params, int b, int h, int q_idx,
/// int kv_idx)` (true = visible; indices as for VariantSpec hooks).
struct MaskMod {
  std::string source;
  std::string function;
};

/// A score_mod: `source` defines `float <function>(const Params& params, float score, int b,
/// int h, int q_idx, int kv_idx)` returning the new logit (score = sm_scale * q.k).
struct ScoreMod {
  std::string source;
  std::string function;
};

/// `a && b` and `a || b` as a new MaskMod (function names must differ).
TESSERA_API MaskMod and_masks(const MaskMod& a, const MaskMod& b);
TESSERA_API MaskMod or_masks(const MaskMod& a, const MaskMod& b);

/// A VariantSpec whose logits_mask is `mask` and whose logits_transform is `score` (either may be
/// null). h is the query head.
TESSERA_API VariantSpec flex_variant(std::string name, const MaskMod* mask, const ScoreMod* score,
                                     std::vector<VariantParam> params = {});

/// Block mask of `mask` (FlexAttention's create_block_mask): evaluates mask_mod on the GPU for
/// every (query row, key) pair of a q_len x kv_len grid cut into (block_rows, block_cols) blocks
/// and writes the BSR of the blocks with at least one visible pair, in increasing column order,
/// with a flag per block: 1 = every pair visible (the kernels skip mask evaluation there), 0 =
/// partial. In the last block row, rows past q_len do not exist (they neither list nor keep a
/// block from being full); in the last column block, columns past kv_len count as hidden pairs, so
/// such a block is at most partial (the kernels rely on mask evaluation to hide those columns).
/// Query row r is passed as q_idx = kv_len - q_len + r; `batch` and `head` are passed as
/// b and h. block_sparse_attention shares one block set among all heads and passes b = 0: for a
/// mask that depends on h (or on b), build with block_flags left undefined in the BlockSparse (the
/// mask is then evaluated in every block) or make sure the set covers every head. Full flags skip
/// every mask, so fold causal into the mask (and_masks) rather than setting options.causal.
///   indptr:      i32 [ceil(q_len / block_rows) + 1] on the device (written)
///   indices:     i32 [>= ceil(q_len / block_rows) * ceil(kv_len / block_cols)] (written; entries
///                past indptr[last] are left as they were)
///   block_flags: u8, the same length as indices (written likewise)
/// The result plugs into BlockSparse (with the same block sizes) for block_sparse_attention with
/// AttentionOptions::variant.user = flex_variant(..., &mask, ...), which applies the mask in
/// partial blocks. Queued on `stream`; uses a temporary device allocation on that stream.
TESSERA_API void build_block_mask(const MaskMod& mask, const std::vector<VariantParam>& params, int64_t q_len,
                                  int64_t kv_len, int64_t block_rows, int64_t block_cols, int32_t batch,
                                  int32_t head, const TensorView& indptr, const TensorView& indices,
                                  const TensorView& block_flags, StreamHandle stream = nullptr);

}  // namespace tessera
