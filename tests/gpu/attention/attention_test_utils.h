// Shared pieces of the attention GPU tests (decode_test.cpp, prefill_test.cpp,
// block_sparse_test.cpp, variant_test.cpp): the case lists, device tensors with arbitrary strides and padding, paged
// cache upload in both layouts (separate or combined K/V), ragged packing, the runner that checks
// one decode/prefill case against the fp64 oracle, and the comparison against the oracle's state.
//
// Every case draws fresh random inputs from test_seed() (set TESSERA_TEST_SEED to replay one),
// rounds them to the case's dtype BEFORE the reference is computed (both sides see the same
// inputs), poisons o and lse (NaN) before the call, and compares o by relative error
// (rel_tolerance: 1e-2 bf16, 4e-3 f16) and the base-2 LSE by absolute error (1e-3 f16, 8e-3 bf16)
// with the oracle's natural LSE converted by lse_natural_to_log2.
//
// Case names end in "_sanitize" for a small representative subset meant for compute-sanitizer:
//   compute-sanitizer gpu_attention_tests --gtest_filter='*_sanitize*:*Errors*'
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "reference/oracle.h"
#include "tessera/attention.h"
#include "tessera/formats.h"

namespace tessera_test {
namespace attn {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
/// Value of output padding (exact in f16, bf16 and f32): a kernel writing outside o's view shows.
constexpr double kPadSentinel = -512.0;

/// LSE absolute tolerance (base 2) for inputs of `dtype`: 1e-3 for f16, scaled by 8 for bf16.
double lse_tolerance(tessera::DType dtype);

tessera_ref::Layout ref_layout(tessera::Layout layout);
/// [len, heads, dim] -> [heads, len, dim].
std::vector<double> nhd_to_hnd(const std::vector<double>& x, int64_t len, int64_t heads, int64_t dim);

// ---------------------------------------------------------------------------------------------
// Device tensors with arbitrary strides.

/// Row-major strides for `shape` where the last-but-one dimension's stride is padded by
/// `inner_pad` elements and dimension 0's stride by `outer_pad` (both 0: contiguous). Keep the pads
/// multiples of 8 elements so rows stay 16-byte aligned.
std::vector<int64_t> padded_strides(const std::vector<int64_t>& shape, int64_t inner_pad, int64_t outer_pad);

/// A tensor in device memory, possibly inside a wider buffer.
struct DeviceTensor {
  DeviceBuffer buf;
  tessera::TensorView view;
  std::vector<double> image;  ///< outputs only: the whole buffer as uploaded (padding check)
  std::vector<char> covered;  ///< outputs only: which buffer elements belong to the view
};

tessera::TensorView make_view(void* data, tessera::DType dtype, const std::vector<int64_t>& shape,
                              const std::vector<int64_t>& strides);

/// Uploads row-major `values` of `shape` into a buffer laid out with `strides` (empty: contiguous);
/// buffer elements outside the view hold `pad_fill` (NaN: a kernel reading padding fails).
DeviceTensor upload_tensor(tessera::DType dtype, const std::vector<double>& values, const std::vector<int64_t>& shape,
                           const std::vector<int64_t>& strides = {}, double pad_fill = kNaN);
/// An output tensor: every element of the view is NaN (contiguous: DeviceBuffer::poison()),
/// padding holds kPadSentinel.
DeviceTensor make_output(tessera::DType dtype, const std::vector<int64_t>& shape,
                         const std::vector<int64_t>& strides = {});
/// The view's elements, row-major.
std::vector<double> read_tensor(const DeviceTensor& t);
/// Number of padding elements of an output that differ from kPadSentinel after the call.
size_t padding_changes(const DeviceTensor& t);
/// The raw bytes of the whole buffer (bit-exact comparisons).
std::vector<unsigned char> read_bytes(const DeviceTensor& t);

tessera::TensorView i32_view(const DeviceBuffer& buf, int64_t n);

// ---------------------------------------------------------------------------------------------
// Paged caches and ragged packing.

/// Device copy of an oracle paged cache. With `combined`, K and V live in one tensor
/// [num_pages, 2, ...] and the PagedKV comes from PagedKV::from_combined. `page_pad` pads the page
/// stride, `slot_pad` the stride of the last-but-one dimension (head in NHD, slot in HND).
struct DevicePaged {
  DeviceTensor k, v, kv;
  DeviceBuffer indptr, indices, last_page_len;
  tessera::PagedKV view;
};
DevicePaged upload_paged(tessera::DType dtype, const tessera_ref::PagedCache& cache, tessera::Layout layout,
                         bool combined, int64_t page_pad = 0, int64_t slot_pad = 0);

/// Concatenates per-request [len_b, ...] arrays; indptr counts rows of `row_elems` elements.
struct Packed {
  std::vector<double> values;
  std::vector<int32_t> indptr;
};
Packed pack_rows(const std::vector<std::vector<double>>& parts, int64_t row_elems);

// ---------------------------------------------------------------------------------------------
// Comparison with the oracle.

/// Expects o [rows, Hq, D] (and, when lse is non-null, the base-2 lse [rows, Hq]) to match the
/// oracle's state: relative error of o <= rel_tolerance(dtype), max |lse - ref| <=
/// lse_tolerance(dtype), and every (row, head) that sees no key has o exactly 0 and lse -inf. A
/// positive rel_tolerance_o / lse_tolerance_override replaces the dtype's bound (FP8 attention).
void expect_matches_oracle(tessera::DType dtype, const std::vector<double>& o, const std::vector<double>* lse,
                           const tessera_ref::State& ref, const std::string& what, double rel_tolerance_o = 0.0,
                           double lse_tolerance_override = 0.0);

/// Runs `f`, expecting a tessera::Error whose message contains at least one of `needles` (the
/// argument's name, in the spellings an implementation may reasonably use) and, unless `code` is
/// kOk, has that status code.
template <typename F>
void expect_error_any(F&& f, std::initializer_list<const char*> needles,
                      tessera::StatusCode code = tessera::StatusCode::kOk) {
  std::string wanted;
  for (const char* n : needles) wanted += std::string(wanted.empty() ? "" : " or ") + "'" + n + "'";
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << wanted;
  } catch (const tessera::Error& e) {
    const std::string msg = e.what();
    bool found = false;
    for (const char* n : needles) found = found || msg.find(n) != std::string::npos;
    EXPECT_TRUE(found) << "message does not mention " << wanted << ": " << msg;
    if (code != tessera::StatusCode::kOk) {
      EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code))
          << "status " << tessera::status_code_name(e.code()) << ", expected " << tessera::status_code_name(code)
          << ": " << msg;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Decode and prefill cases.

enum class Entry {
  kSingle,  ///< single_decode / single_prefill
  kRagged,  ///< batch_decode_ragged / batch_prefill_ragged
  kPaged,   ///< batch_decode_paged / batch_prefill_paged
};

/// Custom bit mask of a variant case (tessera::VariantOptions::custom_mask).
enum class MaskKind {
  kNone,
  kRandom,  ///< each (query, key) bit visible with probability 0.7; every 5th query row hides all keys
  kTree,    ///< tree attention: a query sees the whole prefix, its ancestors in a random tree over
            ///< the request's last qo_len positions, and itself
};

/// Tree masks (MaskKind::kTree) of requests with these lengths, one byte per (query, key),
/// row-major [qo_len_b, kv_len_b]: a query sees the whole prefix, itself and its ancestors in a
/// random tree (parents at most 4 back) over the request's last qo_len positions.
std::vector<std::vector<uint8_t>> tree_masks(const std::vector<int64_t>& qo_len, const std::vector<int64_t>& kv_len,
                                             std::mt19937_64& rng);

/// Tessera's packed custom mask: request b from byte byte_indptr[b], little bit order; the bits
/// past a request's last element are random (a kernel must not read them).
struct PackedMasks {
  std::vector<uint8_t> bytes;
  std::vector<int32_t> byte_indptr;  // [B + 1]
};
PackedMasks pack_masks(const std::vector<std::vector<uint8_t>>& masks, std::mt19937_64& rng);

/// User variants defined only as source text (attention_test_utils.cpp holds the snippets).
enum class UserVariant {
  kNone,
  /// logits_transform x * temperature + slope * (qo_head + 1) * (kv_idx - qo_idx) + bias and a
  /// logits_mask "same document" over an i32 device tensor of document ids (scalars f32/i32,
  /// one tensor). Reference: sm_scale * temperature, ALiBi slopes slope * (h + 1), a custom mask,
  /// LSE + bias.
  kDocumentMask,
  /// query/key/value/output transforms: q scaled per head, k sheared per pair and scaled by key
  /// parity, v plus a per-(KV head, dim) f32 device tensor, o times (2 + (qo_idx & 1)).
  /// Reference: the same math on the CPU (transformed operands rounded to the dtype, as the
  /// kernel's shared-memory tiles are), the oracle, then the output factor.
  kTransforms,
};

/// An attention variant of a case: turned by run_attention_case into tessera::VariantOptions for
/// the kernel and into tessera_ref::Options (plus reference-side input/output transforms) for the
/// oracle. The default describes no variant (the existing decode/prefill grids).
struct VariantDesc {
  int64_t window_left = -1;
  int64_t sinks = 0;
  double soft_cap = 0.0;
  bool alibi = false;  ///< standard slopes (tessera::alibi_slopes)
  bool sigmoid = false;
  double sigmoid_bias = 0.0;
  MaskKind mask = MaskKind::kNone;
  tessera::PosEncoding rope = tessera::PosEncoding::kNone;
  bool rope_offsets = false;  ///< random per-request q_offset / k_offset in [0, 1000]
  double rope_theta = 1e4;
  double rope_scale = 1.0;
  UserVariant user = UserVariant::kNone;

  bool any() const {
    return window_left >= 0 || sinks > 0 || soft_cap > 0 || alibi || sigmoid || mask != MaskKind::kNone ||
           rope != tessera::PosEncoding::kNone || user != UserVariant::kNone;
  }
};

/// "_win37_cap30_alibi_mask_rope31off_sigmoid_sinks4_udoc"-style name suffix ("" for none).
std::string variant_suffix(const VariantDesc& v);

/// fp8 K/V of a case: none (K/V in the case's dtype), e4m3 or e5m2.
enum class Fp8KV { kNone, kE4M3, kE5M2 };
/// How an fp8 case passes its dequantization scales (tessera::KVScales).
enum class KVScaleMode {
  kHost,     ///< k and v only
  kDevice,   ///< host factors times a one-element device tensor each
  kPerHead,  ///< host factors times a [num_kv_heads] device tensor each
};

struct AttentionCase {
  bool decode = false;  ///< decode entry points (one query per request) or prefill
  Entry entry = Entry::kSingle;
  tessera::DecodeKernel kernel = tessera::DecodeKernel::kAuto;  ///< decode only
  tessera::DType dtype = tessera::DType::kF16;
  tessera::Layout layout = tessera::Layout::kNHD;  ///< single: K/V layout; paged: page layout
  int64_t batch = 1;
  int64_t qo_len = 1;     ///< request 0's query length (the maximum); decode: 1
  int64_t kv_len = 0;     ///< request 0's KV length (the maximum)
  int64_t page_size = 0;  ///< paged only
  int64_t num_kv_heads = 1;
  int64_t group = 1;  ///< num_qo_heads / num_kv_heads
  int64_t head_dim = 128;
  int64_t head_dim_vo = 0;    ///< prefill: v's and o's head dim (0: head_dim), e.g. 128 under head_dim 192
  bool causal = false;
  bool combined_kv = false;   ///< paged: one [pages, 2, ...] tensor through PagedKV::from_combined
  bool nan_unused = false;    ///< paged: unused slots (last-page tails, spare pages) hold NaN, else 0
  bool with_lse = true;       ///< false: lse is an undefined TensorView
  bool strided = false;       ///< q, o (and K/V rows or pages) inside wider buffers
  bool loose_max_qo = false;  ///< batch prefill: max_qo_len passed as an upper bound, not exact
  double sm_scale = -1.0;
  bool sanitize = false;  ///< member of the compute-sanitizer subset (name suffix _sanitize)
  std::string tag;        ///< extra name suffix (keeps names unique)
  VariantDesc variant;    ///< attention variant (default: none)
  /// fp8 K/V: stored codes are drawn as N(0, 16^2) rounded to the format, scales around 1/16 per
  /// tensor or KV head; the oracle sees code x scale in fp64.
  Fp8KV fp8 = Fp8KV::kNone;
  KVScaleMode kv_scales = KVScaleMode::kHost;
  /// FP8 attention (with fp8 set): q stored in the same fp8 format as K/V (codes N(0, 16^2), a
  /// scale per tensor or KV head like K's), o in `dtype`; compared with the oracle on the
  /// dequantized q, k and v at fp8_rel_tolerance (P is rounded to fp8 for P V) and the LSE at
  /// fp8_lse_tolerance (the fp8 MMAs accumulate the logits at reduced precision).
  bool fp8_q = false;
  double fp8_rel_tolerance = 0.0;
  double fp8_lse_tolerance = 0.0;
  /// Filled by run_attention_case for FP8 attention: o's relative error against the oracle on the
  /// dequantized inputs and against the unquantized ones (the tests print both).
  struct Fp8Errors {
    double dequantized = 0.0, unquantized = 0.0;
  };
  /// Queries drawn as N(0, q_stddev^2): far from 1 they leave f16's range, which the fp8 decode
  /// tiles (f16 MMAs) rescale bf16 query tiles into.
  double q_stddev = 1.0;

  tessera::DType q_dtype() const { return fp8_q ? kv_dtype() : dtype; }
  tessera::DType kv_dtype() const {
    return fp8 == Fp8KV::kE4M3 ? tessera::DType::kE4M3 : fp8 == Fp8KV::kE5M2 ? tessera::DType::kE5M2 : dtype;
  }

  int64_t num_qo_heads() const { return num_kv_heads * group; }
  int64_t value_dim() const { return head_dim_vo == 0 ? head_dim : head_dim_vo; }
};

std::string case_name(const AttentionCase& c);
/// gtest prints a failing case's parameter through this (its name).
void PrintTo(const AttentionCase& c, std::ostream* os);
std::vector<AttentionCase> decode_cases();
std::vector<AttentionCase> prefill_cases();
/// Prefill with head_dim_qk 192 and head_dim_vo 128 (non-absorbed MLA) over every entry point.
std::vector<AttentionCase> split_head_dim_prefill_cases();

/// Per-request lengths drawn for one run of a case: request 0 has (qo_len, kv_len); with batch >=
/// 2, request 1 has no keys (kv 0), request 2 no queries (prefill), request 3 one key; the others are
/// random in [0, max] (qo >= 1, and qo <= kv when causal).
struct Lengths {
  std::vector<int64_t> qo, kv;
};
Lengths request_lengths(const AttentionCase& c, std::mt19937_64& rng);

/// Estimated fp64 oracle multiply-adds of one run (expected value over the random lengths).
double oracle_cost(const AttentionCase& c);
/// Elements of K of one case (upper bound), to keep host memory modest.
double kv_elements(const AttentionCase& c);

/// Runs one decode or prefill case on fresh inputs drawn from `seed` and checks it against the
/// oracle (gtest expectations). With a variant, o is compared as usual; the LSE too, except for
/// sigmoid (softmax off), where every LSE element must be NaN.
/// FP8 attention cases (c.fp8_q) also return o's errors (fp8_errors, when given).
void run_attention_case(const AttentionCase& c, uint64_t seed, AttentionCase::Fp8Errors* fp8_errors = nullptr);

// ---------------------------------------------------------------------------------------------
// Block-sparse cases.

struct BlockSparseCase {
  tessera::DType dtype = tessera::DType::kF16;
  int64_t block_rows = 1, block_cols = 1;
  int64_t rows = 1, cols = 1;  ///< M query rows, N KV columns
  int64_t num_kv_heads = 1, group = 1, head_dim = 128;
  double density = 0.5;  ///< probability that a column block is listed for a block row
  bool causal = false;
  bool with_lse = true;
  bool strided = false;
  bool sanitize = false;
  std::string tag;

  int64_t num_qo_heads() const { return num_kv_heads * group; }
};

std::string block_sparse_case_name(const BlockSparseCase& c);
void PrintTo(const BlockSparseCase& c, std::ostream* os);
std::vector<BlockSparseCase> block_sparse_cases();
double oracle_cost(const BlockSparseCase& c);

}  // namespace attn
}  // namespace tessera_test
