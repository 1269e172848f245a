// GPU tests of attention variants (tessera/variant.h) against the fp64 oracle: every built-in
// variant (sliding window, soft-cap, ALiBi, custom bit mask including tree attention, RoPE Llama
// and Llama 3.1 with and without per-request offsets, sigmoid, attention sinks) in decode
// (batch_decode_paged, batch_decode_ragged, single_decode) and prefill (batch_prefill_ragged,
// batch_prefill_paged, single_prefill), some combinations, two user variants given only as source
// text, block_sparse_attention with a user logits_mask (with and without block flags), and the
// errors (CUDA-core decode with a variant, the plan/run runtime with a variant it does not take,
// a user snippet that does not compile).
//
// The variant cases use the decode/prefill runner of attention_test_utils.cpp (AttentionCase::
// variant): fresh random inputs rounded to the dtype, poisoned outputs, odd lengths, empty
// requests (request 1 has no keys, request 2 no queries in prefill, request 3 one key), and the
// docs/design.md §8 tolerances. Non-default variants are compiled with NVRTC on first use (cached in
// $TESSERA_CACHE_DIR, default ~/.cache/tessera): the case list keeps the distinct (features, head
// dim, dtype, format, query tile) kernels to about one per case.
//
// Names ending in _sanitize form the compute-sanitizer subset:
//   compute-sanitizer gpu_variant_tests --gtest_filter='*_sanitize*:*Errors*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "reference/oracle.h"
#include "tessera/attention.h"
#include "tessera/runtime.h"
#include "tessera/variant.h"

namespace {

using tessera::DecodeKernel;
using tessera::Device;
using tessera::DType;
using tessera::Layout;
using tessera::PosEncoding;
using tessera::StatusCode;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

// ---------------------------------------------------------------------------------------------
// The case list.

VariantDesc window(int64_t w) {
  VariantDesc v;
  v.window_left = w;
  return v;
}
VariantDesc soft_cap(double cap = 30.0) {
  VariantDesc v;
  v.soft_cap = cap;
  return v;
}
VariantDesc alibi() {
  VariantDesc v;
  v.alibi = true;
  return v;
}
VariantDesc mask(MaskKind kind) {
  VariantDesc v;
  v.mask = kind;
  return v;
}
VariantDesc rope(PosEncoding mode, bool offsets, double theta = 1e4, double scale = 1.0) {
  VariantDesc v;
  v.rope = mode;
  v.rope_offsets = offsets;
  v.rope_theta = theta;
  v.rope_scale = scale;
  return v;
}
VariantDesc sigmoid(double bias) {
  VariantDesc v;
  v.sigmoid = true;
  v.sigmoid_bias = bias;
  return v;
}
VariantDesc sinks(int64_t n, int64_t w) {
  VariantDesc v = window(w);
  v.sinks = n;
  return v;
}
VariantDesc user(UserVariant u) {
  VariantDesc v;
  v.user = u;
  return v;
}

struct Shape {
  DType dtype;
  int64_t dim, group, hkv, batch, qo, kv, page;
  bool causal;
};

AttentionCase make(bool decode, Entry entry, Layout layout, const Shape& s, const VariantDesc& v) {
  AttentionCase c;
  c.decode = decode;
  c.entry = entry;
  c.kernel = DecodeKernel::kAuto;  // variants run on the tensor-core family
  c.layout = layout;
  c.dtype = s.dtype;
  c.head_dim = s.dim;
  c.group = s.group;
  c.num_kv_heads = s.hkv;
  c.batch = entry == Entry::kSingle ? 1 : s.batch;
  c.qo_len = decode ? 1 : s.qo;
  c.kv_len = s.kv;
  c.page_size = entry == Entry::kPaged ? s.page : 0;
  c.causal = s.causal;
  c.variant = v;
  return c;
}

AttentionCase decode_paged(Layout layout, const Shape& s, const VariantDesc& v) {
  return make(true, Entry::kPaged, layout, s, v);
}
AttentionCase decode_ragged(const Shape& s, const VariantDesc& v) {
  return make(true, Entry::kRagged, Layout::kNHD, s, v);
}
AttentionCase decode_single(Layout layout, const Shape& s, const VariantDesc& v) {
  return make(true, Entry::kSingle, layout, s, v);
}
AttentionCase prefill_ragged(const Shape& s, const VariantDesc& v) {
  return make(false, Entry::kRagged, Layout::kNHD, s, v);
}
AttentionCase prefill_paged(Layout layout, const Shape& s, const VariantDesc& v) {
  return make(false, Entry::kPaged, layout, s, v);
}
AttentionCase prefill_single(Layout layout, const Shape& s, const VariantDesc& v) {
  return make(false, Entry::kSingle, layout, s, v);
}

constexpr DType f16 = DType::kF16, bf16 = DType::kBF16;
constexpr Layout NHD = Layout::kNHD, HND = Layout::kHND;
constexpr bool causal = true, nocausal = false;

std::vector<AttentionCase> variant_cases() {
  std::vector<AttentionCase> cases;
  auto add = [&](AttentionCase c) { cases.push_back(c); };
  auto nan_pad = [](AttentionCase c) {
    c.nan_unused = true;
    return c;
  };
  auto tensor_cores = [](AttentionCase c) {
    c.kernel = DecodeKernel::kTensorCores;
    return c;
  };
  auto combined = [](AttentionCase c) {
    c.combined_kv = true;
    return c;
  };
  //                      dtype  dim g  hkv b  qo   kv    page causal
  // Sliding window (with causal).
  add(nan_pad(decode_paged(NHD, {f16, 128, 4, 2, 7, 1, 2049, 16, causal}, window(300))));
  add(decode_ragged({bf16, 64, 1, 3, 5, 1, 513, 0, nocausal}, window(37)));
  add(prefill_ragged({bf16, 256, 5, 1, 4, 513, 2049, 0, causal}, window(100)));
  add(prefill_paged(HND, {f16, 128, 1, 2, 7, 17, 513, 3, causal}, window(37)));
  // Soft-cap 30, without and with causal.
  add(decode_paged(HND, {bf16, 256, 5, 1, 7, 1, 513, 1, nocausal}, soft_cap()));
  add(decode_single(NHD, {f16, 128, 4, 2, 1, 1, 2049, 0, nocausal}, soft_cap()));
  add(prefill_ragged({f16, 64, 4, 2, 5, 17, 513, 0, nocausal}, soft_cap()));
  add(nan_pad(prefill_paged(NHD, {bf16, 128, 1, 4, 4, 513, 2049, 16, causal}, soft_cap())));
  // bf16 soft-cap uses a fixed softmax reference while cap * log2(e) <= 64 (cap 1.5 saturates
  // the tanh, cap 44 is the edge) and the running max beyond it (cap 50).
  add(prefill_ragged({bf16, 64, 1, 4, 4, 129, 513, 0, nocausal}, soft_cap(1.5)));
  add(decode_paged(NHD, {bf16, 128, 4, 2, 7, 1, 16384, 16, nocausal}, soft_cap(44.0)));
  add(prefill_ragged({bf16, 128, 4, 2, 5, 577, 2049, 0, causal}, soft_cap(50.0)));
  // ALiBi (standard slopes).
  add(decode_paged(NHD, {f16, 64, 5, 1, 7, 1, 2049, 3, nocausal}, alibi()));
  add(decode_ragged({bf16, 128, 1, 4, 7, 1, 513, 0, causal}, alibi()));
  add(prefill_ragged({bf16, 128, 4, 2, 4, 513, 513, 0, causal}, alibi()));
  add(combined(prefill_paged(HND, {f16, 256, 1, 2, 5, 17, 2049, 1, nocausal}, alibi())));
  // Custom bit mask (random, with fully hidden rows).
  add(decode_paged(HND, {bf16, 128, 4, 1, 7, 1, 513, 16, nocausal}, mask(MaskKind::kRandom)));
  add(decode_ragged({f16, 256, 1, 2, 5, 1, 17, 0, nocausal}, mask(MaskKind::kRandom)));
  add(prefill_ragged({f16, 128, 5, 1, 5, 513, 513, 0, nocausal}, mask(MaskKind::kRandom)));
  add(nan_pad(prefill_paged(NHD, {bf16, 64, 1, 2, 7, 17, 2049, 3, causal}, mask(MaskKind::kRandom))));
  // Tree attention: decode of several draft tokens per request through batch_prefill_paged.
  add(nan_pad(prefill_paged(NHD, {f16, 128, 4, 2, 7, 7, 513, 16, causal}, mask(MaskKind::kTree))));
  add(prefill_paged(HND, {bf16, 64, 5, 1, 5, 13, 2049, 1, causal}, mask(MaskKind::kTree)));
  // RoPE Llama, with and without per-request offsets.
  add(decode_paged(NHD, {bf16, 128, 1, 2, 7, 1, 2049, 16, nocausal}, rope(PosEncoding::kRopeLlama, true)));
  add(decode_ragged({f16, 64, 4, 2, 5, 1, 513, 0, nocausal}, rope(PosEncoding::kRopeLlama, false)));
  add(prefill_ragged({f16, 256, 4, 1, 4, 513, 513, 0, causal}, rope(PosEncoding::kRopeLlama, true)));
  add(nan_pad(prefill_paged(HND, {bf16, 128, 5, 1, 7, 17, 2049, 3, causal}, rope(PosEncoding::kRopeLlama, false))));
  // RoPE Llama 3.1 (theta 5e5, the standard frequency scaling; one case with rope_scale 2).
  add(decode_paged(HND, {f16, 128, 5, 1, 7, 1, 2049, 3, nocausal}, rope(PosEncoding::kRopeLlama31, true, 5e5)));
  add(decode_single(HND, {bf16, 256, 1, 2, 1, 1, 513, 0, nocausal}, rope(PosEncoding::kRopeLlama31, false, 5e5)));
  add(prefill_ragged({bf16, 64, 1, 4, 5, 17, 2049, 0, nocausal}, rope(PosEncoding::kRopeLlama31, true, 5e5)));
  add(prefill_paged(NHD, {f16, 128, 4, 2, 4, 513, 513, 16, causal}, rope(PosEncoding::kRopeLlama31, false, 5e5, 2.0)));
  // Sigmoid attention (no softmax) with a bias.
  add(decode_paged(NHD, {bf16, 64, 4, 2, 7, 1, 513, 1, nocausal}, sigmoid(-1.5)));
  add(decode_ragged({f16, 128, 5, 1, 5, 1, 2049, 0, nocausal}, sigmoid(-1.5)));
  add(prefill_ragged({bf16, 128, 1, 2, 4, 513, 513, 0, causal}, sigmoid(0.5)));
  add(nan_pad(prefill_paged(HND, {f16, 256, 4, 1, 5, 17, 513, 16, nocausal}, sigmoid(-1.5))));
  // Attention sinks (sinks + window + causal).
  add(decode_paged(HND, {f16, 256, 4, 1, 7, 1, 2049, 16, causal}, sinks(4, 64)));
  add(decode_ragged({bf16, 128, 1, 2, 5, 1, 513, 0, causal}, sinks(4, 64)));
  add(prefill_ragged({f16, 64, 5, 2, 5, 513, 2049, 0, causal}, sinks(4, 64)));
  add(nan_pad(prefill_paged(NHD, {bf16, 128, 4, 1, 7, 17, 513, 3, causal}, sinks(4, 64))));
  add(prefill_single(HND, {f16, 64, 4, 2, 1, 513, 2049, 0, causal}, sinks(7, 100)));
  // Combinations: window + soft-cap + ALiBi.
  {
    VariantDesc v = window(200);
    v.soft_cap = 30.0;
    v.alibi = true;
    add(tensor_cores(decode_paged(NHD, {bf16, 128, 5, 1, 7, 1, 2049, 16, causal}, v)));
    v.window_left = 300;
    add(prefill_ragged({f16, 128, 4, 2, 4, 513, 2049, 0, causal}, v));
    v.window_left = 50;
    add(prefill_paged(HND, {bf16, 64, 1, 2, 5, 17, 513, 3, nocausal}, v));
  }
  // ALiBi with masks and no soft-cap: the kernels' split key bias, visiting the nearest keys
  // first, with a window and over the two segments of sinks + window.
  {
    VariantDesc v = sinks(4, 100);
    v.alibi = true;
    add(prefill_ragged({bf16, 128, 4, 2, 4, 513, 2049, 0, causal}, v));
    add(nan_pad(decode_paged(NHD, {f16, 64, 5, 1, 7, 1, 2049, 3, causal}, v)));
    VariantDesc w = window(300);
    w.alibi = true;
    add(prefill_paged(HND, {f16, 128, 1, 2, 5, 17, 2049, 16, causal}, w));
  }
  // RoPE + window + sinks.
  {
    VariantDesc v = sinks(4, 128);
    v.rope = PosEncoding::kRopeLlama31;
    v.rope_theta = 5e5;
    v.rope_offsets = true;
    add(nan_pad(decode_paged(NHD, {f16, 64, 4, 2, 7, 1, 2049, 1, causal}, v)));
    add(prefill_ragged({f16, 256, 1, 2, 4, 17, 513, 0, causal}, v));
    v.rope = PosEncoding::kRopeLlama;
    v.rope_theta = 1e4;
    v.rope_offsets = false;
    add(prefill_paged(HND, {bf16, 128, 5, 1, 5, 513, 2049, 16, causal}, v));
  }
  // Custom mask + soft-cap.
  {
    VariantDesc v = mask(MaskKind::kRandom);
    v.soft_cap = 30.0;
    add(decode_ragged({bf16, 64, 5, 1, 7, 1, 2049, 0, nocausal}, v));
    add(prefill_paged(NHD, {f16, 128, 4, 2, 5, 513, 513, 3, causal}, v));
  }
  // User variant (a): document mask (device tensor of ids) + score transform (scalar params).
  add(decode_paged(NHD, {f16, 128, 4, 2, 7, 1, 2049, 16, causal}, user(UserVariant::kDocumentMask)));
  add(decode_single(NHD, {bf16, 64, 1, 2, 1, 1, 513, 0, nocausal}, user(UserVariant::kDocumentMask)));
  add(prefill_ragged({bf16, 128, 5, 1, 5, 513, 2049, 0, causal}, user(UserVariant::kDocumentMask)));
  add(prefill_paged(HND, {f16, 256, 1, 2, 7, 17, 513, 3, nocausal}, user(UserVariant::kDocumentMask)));
  // User variant (b): query / key / value / output transforms.
  add(decode_paged(HND, {bf16, 256, 5, 1, 7, 1, 513, 3, nocausal}, user(UserVariant::kTransforms)));
  add(decode_ragged({f16, 128, 4, 2, 5, 1, 2049, 0, nocausal}, user(UserVariant::kTransforms)));
  add(prefill_ragged({f16, 64, 1, 4, 5, 513, 513, 0, causal}, user(UserVariant::kTransforms)));
  add(nan_pad(prefill_paged(NHD, {bf16, 128, 4, 1, 4, 17, 2049, 16, nocausal}, user(UserVariant::kTransforms))));
  // Head dim 96 on the long-query tile (on sm_90 the wgmma tile, its operands in 64-byte swizzled
  // blocks) under each family of hooks: built-in logits transforms and masks, RoPE (pair
  // transforms across the row's column blocks), a value transform, a JIT mask over page size 1.
  {
    VariantDesc v = window(200);
    v.soft_cap = 30.0;
    v.alibi = true;
    add(prefill_ragged({bf16, 96, 4, 2, 3, 513, 2049, 0, causal}, v));
    add(nan_pad(prefill_paged(HND, {f16, 96, 5, 1, 4, 257, 1025, 16, causal}, rope(PosEncoding::kRopeLlama, true))));
    add(prefill_paged(NHD, {bf16, 96, 4, 2, 4, 129, 513, 16, nocausal}, user(UserVariant::kTransforms)));
    add(prefill_paged(HND, {f16, 96, 8, 1, 5, 65, 700, 1, causal}, user(UserVariant::kDocumentMask)));
  }

  // The compute-sanitizer subset: small, odd shapes, NaN page tails, each family of hooks.
  auto small = [](AttentionCase c) {
    c.sanitize = true;
    return c;
  };
  add(small(nan_pad(decode_paged(NHD, {f16, 128, 5, 1, 7, 1, 37, 3, causal}, sinks(2, 8)))));
  {
    VariantDesc v = mask(MaskKind::kRandom);
    v.soft_cap = 30.0;
    add(small(nan_pad(prefill_paged(HND, {bf16, 64, 4, 1, 5, 17, 40, 3, causal}, v))));
  }
  add(small(prefill_ragged({f16, 256, 1, 2, 5, 17, 20, 0, nocausal}, rope(PosEncoding::kRopeLlama, true))));
  add(small(prefill_ragged({bf16, 128, 4, 1, 5, 9, 33, 0, causal}, user(UserVariant::kTransforms))));
  add(small(decode_ragged({f16, 64, 1, 2, 5, 1, 17, 0, nocausal}, sigmoid(-1.5))));
  add(small(nan_pad(prefill_paged(NHD, {f16, 128, 1, 2, 5, 5, 30, 1, causal}, mask(MaskKind::kTree)))));
  add(small(decode_single(NHD, {bf16, 64, 4, 1, 1, 1, 21, 0, nocausal}, user(UserVariant::kDocumentMask))));
  add(small(prefill_ragged({bf16, 96, 5, 1, 3, 29, 70, 0, causal}, user(UserVariant::kTransforms))));
  return cases;
}

class VariantTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(VariantTest, MatchesOracle) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  run_attention_case(GetParam(), seed);
}

INSTANTIATE_TEST_SUITE_P(Grid, VariantTest, ::testing::ValuesIn(variant_cases()),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) { return case_name(info.param); });

// ---------------------------------------------------------------------------------------------
// Block-sparse attention with a user logits_mask.
//
// The mask (a FlexAttention-style mask_mod over a device tensor of document ids): key kv_idx is
// visible to query position qo_idx = N - M + row when both lie in documents with the same id and,
// when `params.causal_in_mask`, kv_idx <= qo_idx. The reference expresses it as an oracle custom
// mask of [M, N] over the one block-sparse "request".

constexpr const char* kBlockMaskSource = R"(// block-sparse document mask (variant tests)
bool doc_mask(const Params& params, int b, int h, int q_idx, int kv_idx) {
  if (params.causal_in_mask != 0 && kv_idx > q_idx) return false;
  return params.docs[q_idx] == params.docs[kv_idx];
}
)";

struct BlockMaskCase {
  DType dtype = DType::kF16;
  int64_t block_rows = 16, block_cols = 16;
  int64_t rows = 64, cols = 64;  ///< M <= N: every query position is >= 0
  int64_t num_kv_heads = 1, group = 1, head_dim = 128;
  /// true: the block set is every block with a visible pair and the flags mark the blocks whose
  /// existing pairs are all visible (the causal mask is part of the user mask, options.causal is on
  /// too); false: a random block set (density 0.5), no flags, causal from options.causal only.
  bool flags = false;
  bool sanitize = false;
  /// A built-in logits transform beside the user mask: ALiBi (standard slopes; the kernels split
  /// it per row and column where a KV tile lies inside one column block and add it per logit
  /// where it crosses blocks) or soft-cap 30 (bounded logits: no running max in bf16).
  enum class Builtin { kNone, kAlibi, kSoftCap } builtin = Builtin::kNone;

  int64_t num_qo_heads() const { return num_kv_heads * group; }
};

std::string block_mask_name(const BlockMaskCase& c) {
  std::string s = std::string(tessera::dtype_name(c.dtype)) + "_br" + std::to_string(c.block_rows) + "_bc" +
                  std::to_string(c.block_cols) + "_m" + std::to_string(c.rows) + "_n" + std::to_string(c.cols) +
                  "_g" + std::to_string(c.group) + "_hkv" + std::to_string(c.num_kv_heads) + "_d" +
                  std::to_string(c.head_dim) + (c.flags ? "_flags" : "_randomblocks");
  if (c.builtin == BlockMaskCase::Builtin::kAlibi) s += "_alibi";
  if (c.builtin == BlockMaskCase::Builtin::kSoftCap) s += "_softcap";
  if (c.sanitize) s += "_sanitize";
  return s;
}

void PrintTo(const BlockMaskCase& c, std::ostream* os) { *os << block_mask_name(c); }

std::vector<BlockMaskCase> block_mask_cases() {
  std::vector<BlockMaskCase> cases;
  BlockMaskCase c;
  c.dtype = DType::kF16;
  c.block_rows = 16;
  c.block_cols = 16;
  c.rows = 300;
  c.cols = 1000;
  c.num_kv_heads = 2;
  c.group = 4;
  c.head_dim = 128;
  c.flags = true;
  cases.push_back(c);
  c.flags = false;
  c.dtype = DType::kBF16;
  c.head_dim = 64;
  c.group = 5;
  c.num_kv_heads = 1;
  c.block_rows = 64;
  c.rows = 513;
  c.cols = 2049;
  cases.push_back(c);
  c.flags = true;
  c.dtype = DType::kBF16;
  c.block_rows = 1;
  c.block_cols = 16;
  c.rows = 17;
  c.cols = 2049;
  c.group = 1;
  c.num_kv_heads = 2;
  c.head_dim = 256;
  cases.push_back(c);
  BlockMaskCase s;
  s.dtype = DType::kF16;
  s.block_rows = 7;
  s.block_cols = 3;
  s.rows = 40;
  s.cols = 50;
  s.group = 4;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  s.flags = true;
  s.sanitize = true;
  cases.push_back(s);
  // Built-in ALiBi and soft-cap beside the user mask, FlexAttention's 128-wide blocks (each KV
  // tile inside one block: the split ALiBi) and blocks narrower than a tile (ALiBi per logit).
  using Builtin = BlockMaskCase::Builtin;
  struct Row {
    DType dtype;
    int64_t block_cols, rows, cols, group, head_dim;
    bool flags, sanitize;
    Builtin builtin;
  };
  const Row rows[] = {
      {DType::kBF16, 128, 700, 700, 4, 128, true, false, Builtin::kAlibi},
      {DType::kF16, 64, 300, 1000, 4, 128, true, false, Builtin::kAlibi},
      {DType::kF16, 256, 300, 1000, 4, 64, false, true, Builtin::kAlibi},
      {DType::kF16, 16, 300, 1000, 1, 256, true, false, Builtin::kAlibi},
      {DType::kBF16, 128, 700, 700, 4, 128, true, false, Builtin::kSoftCap},
  };
  for (const Row& r : rows) {
    BlockMaskCase b;
    b.dtype = r.dtype;
    b.block_rows = 128;
    b.block_cols = r.block_cols;
    b.rows = r.rows;
    b.cols = r.cols;
    b.num_kv_heads = 2;
    b.group = r.group;
    b.head_dim = r.head_dim;
    b.flags = r.flags;
    b.sanitize = r.sanitize;
    b.builtin = r.builtin;
    cases.push_back(b);
  }
  return cases;
}

class BlockSparseUserMaskTest : public ::testing::TestWithParam<BlockMaskCase> {};

TEST_P(BlockSparseUserMaskTest, MatchesOracle) {
  const BlockMaskCase c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  const int64_t M = c.rows, N = c.cols, Hq = c.num_qo_heads(), Hkv = c.num_kv_heads, D = c.head_dim;
  const int64_t Br = c.block_rows, Bc = c.block_cols;
  const int64_t row_blocks = (M + Br - 1) / Br, col_blocks = (N + Bc - 1) / Bc;
  const std::string what = block_mask_name(c) + " (seed " + std::to_string(seed) + ")";

  const auto q = round_to(c.dtype, random_normal(M * Hq * D, rng));
  const auto k = round_to(c.dtype, random_normal(N * Hkv * D, rng));
  const auto v = round_to(c.dtype, random_normal(N * Hkv * D, rng));

  // Document ids: segments of 1 .. N/5 positions, ids cycling through 3 values. With flags, drawn
  // again (deterministically) until the block set has both full and partial blocks, so that both
  // kinds of KV tiles (mask skipped, mask evaluated) are exercised.
  std::vector<int32_t> docs(N);
  std::vector<uint8_t> visible(M * N);  // the user mask, [M, N]
  tessera_ref::BlockSparse bsr;
  std::vector<uint8_t> flags;
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  size_t full = 0;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int32_t seg = 0;
    for (int64_t j = 0; j < N; ++seg) {
      const int64_t n = std::uniform_int_distribution<int64_t>(1, std::max<int64_t>(1, N / 5))(rng);
      for (int64_t t = 0; t < n && j < N; ++t, ++j) docs[j] = seg % 3;
    }
    for (int64_t r = 0; r < M; ++r) {
      const int64_t p = N - M + r;
      for (int64_t j = 0; j < N; ++j) {
        // With flags the user mask includes causal (the flags must describe every mask in effect).
        visible[r * N + j] = docs[p] == docs[j] && (!c.flags || j <= p);
      }
    }
    bsr = tessera_ref::BlockSparse{};
    bsr.block_rows = Br;
    bsr.block_cols = Bc;
    bsr.indptr.push_back(0);
    flags.clear();
    for (int64_t rb = 0; rb < row_blocks; ++rb) {
      for (int64_t cb = 0; cb < col_blocks; ++cb) {
        if (c.flags) {
          // The blocks with a visible pair (causal included), flagged full when every pair that
          // exists (rows < M, columns < N) is visible, as a block-mask builder writes them: a last
          // column block cut by N can be flagged full, and the kernel must still keep its missing
          // columns out of the softmax.
          bool any = false, all = true;
          for (int64_t r = rb * Br; r < std::min(M, rb * Br + Br); ++r) {
            for (int64_t j = cb * Bc; j < std::min(N, cb * Bc + Bc); ++j) {
              any = any || visible[r * N + j];
              all = all && visible[r * N + j];
            }
          }
          if (!any) continue;
          bsr.indices.push_back(static_cast<int32_t>(cb));
          flags.push_back(all ? 1 : 0);
        } else if (rb % 5 != 1 && u01(rng) < 0.5) {
          bsr.indices.push_back(static_cast<int32_t>(cb));
        }
      }
      bsr.indptr.push_back(static_cast<int32_t>(bsr.indices.size()));
    }
    full = 0;
    for (uint8_t fl : flags) full += fl;
    if (!c.flags || (full > 0 && full < flags.size())) break;
  }
  if (c.flags) {
    ASSERT_GT(full, 0u) << what << ": no full block (the case would not test the flags)";
    ASSERT_LT(full, flags.size()) << what << ": no partial block";
  }

  const std::vector<int64_t> q_shape = {M, Hq, D}, kv_shape = {N, Hkv, D};
  DeviceTensor dq = upload_tensor(c.dtype, q, q_shape);
  DeviceTensor dk = upload_tensor(c.dtype, k, kv_shape);
  DeviceTensor dv = upload_tensor(c.dtype, v, kv_shape);
  DeviceTensor dout = make_output(c.dtype, q_shape);
  DeviceTensor dlse = make_output(DType::kF32, {M, Hq});
  DeviceBuffer d_indptr = upload_i32(bsr.indptr), d_indices = upload_i32(bsr.indices);
  DeviceBuffer d_flags(std::max<size_t>(1, flags.size()));
  d_flags.upload(flags.data(), flags.size());
  DeviceBuffer d_docs = upload_i32(docs);

  tessera::BlockSparse bs;
  bs.block_rows = Br;
  bs.block_cols = Bc;
  bs.num_rows = M;
  bs.k = dk.view;
  bs.v = dv.view;
  bs.indptr = i32_view(d_indptr, static_cast<int64_t>(bsr.indptr.size()));
  bs.indices = i32_view(d_indices, static_cast<int64_t>(bsr.indices.size()));
  if (c.flags) bs.block_flags = TensorView(d_flags.get(), DType::kU8, {static_cast<int64_t>(flags.size())}, Device::cuda(0));

  tessera::MaskMod mask_mod{kBlockMaskSource, "doc_mask"};
  const tessera::VariantSpec spec = tessera::flex_variant(
      "test_block_doc_mask", &mask_mod, nullptr,
      {tessera::VariantParam::device_tensor("docs", i32_view(d_docs, N)),
       tessera::VariantParam::scalar_i32("causal_in_mask", c.flags ? 1 : 0)});
  tessera::AttentionOptions opt;
  opt.causal = true;
  opt.variant.user = &spec;
  tessera_ref::Options ropt;
  DeviceBuffer d_slopes;
  if (c.builtin == BlockMaskCase::Builtin::kAlibi) {
    const std::vector<float> slopes = tessera::alibi_slopes(Hq);
    d_slopes = DeviceBuffer(slopes.size() * sizeof(float));
    d_slopes.upload(slopes.data(), slopes.size() * sizeof(float));
    opt.variant.alibi_slopes = TensorView(d_slopes.get(), DType::kF32, {Hq}, Device::cuda(0));
    ropt.alibi_slopes = tessera_ref::alibi_slopes(Hq);
  } else if (c.builtin == BlockMaskCase::Builtin::kSoftCap) {
    opt.variant.logits_soft_cap = 30.0;
    ropt.logits_soft_cap = 30.0;
  }
  tessera::block_sparse_attention(dq.view, bs, dout.view, dlse.view, opt);
  ASSERT_CUDA_OK(cudaGetLastError());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  const auto o = read_tensor(dout);
  const auto lse = read_tensor(dlse);
  ropt.causal = true;
  ropt.custom_mask = visible;
  ropt.custom_mask_indptr = {0, M * N};
  const auto ref = tessera_ref::attention_block_sparse(q, k, v, M, N, bsr, {Hq, Hkv, D}, ropt);
  expect_matches_oracle(c.dtype, o, &lse, ref, what);
}

INSTANTIATE_TEST_SUITE_P(Grid, BlockSparseUserMaskTest, ::testing::ValuesIn(block_mask_cases()),
                         [](const ::testing::TestParamInfo<BlockMaskCase>& info) {
                           return block_mask_name(info.param);
                         });

// ---------------------------------------------------------------------------------------------
// Errors.

/// Small valid tensors (random contents) for calls that are expected to fail before (or instead
/// of) launching, and for the calls that must still work afterwards.
struct VariantErrorFixture {
  static constexpr int64_t kB = 2, kQ = 8, kHq = 4, kHkv = 1, kD = 64, kLen = 32, kPageSize = 16;
  std::mt19937_64 rng{test_seed()};
  DeviceTensor q = upload_tensor(DType::kF16, round_to(DType::kF16, random_normal(kQ * kHq * kD, rng)), {kQ, kHq, kD});
  DeviceTensor q_dec =
      upload_tensor(DType::kF16, round_to(DType::kF16, random_normal(kB * kHq * kD, rng)), {kB, kHq, kD});
  DeviceTensor k =
      upload_tensor(DType::kF16, round_to(DType::kF16, random_normal(kLen * kHkv * kD, rng)), {kLen, kHkv, kD});
  DeviceTensor v =
      upload_tensor(DType::kF16, round_to(DType::kF16, random_normal(kLen * kHkv * kD, rng)), {kLen, kHkv, kD});
  DeviceTensor o = make_output(DType::kF16, {kQ, kHq, kD});
  DeviceTensor o_dec = make_output(DType::kF16, {kB, kHq, kD});
  DeviceTensor lse = make_output(DType::kF32, {kQ, kHq});
  DeviceBuffer qo_indptr = upload_i32({0, 3, 8});
  DeviceBuffer kv_indptr = upload_i32({0, 16, 32});
  DeviceBuffer page_indptr = upload_i32({0, 1, 2});
  DeviceBuffer pages = upload_i32({1, 0});
  DeviceBuffer last = upload_i32({16, 16});

  tessera::PagedKV paged() const {
    tessera::PagedKV kv;
    kv.k = TensorView(k.view.data, DType::kF16, {2, kPageSize, kHkv, kD}, Device::cuda(0));
    kv.v = TensorView(v.view.data, DType::kF16, {2, kPageSize, kHkv, kD}, Device::cuda(0));
    kv.layout = Layout::kNHD;
    kv.indptr = i32_view(page_indptr, kB + 1);
    kv.indices = i32_view(pages, 2);
    kv.last_page_len = i32_view(last, kB);
    return kv;
  }
  void prefill(const tessera::AttentionOptions& opt) {
    tessera::batch_prefill_ragged(q.view, i32_view(qo_indptr, kB + 1), 5, k.view, v.view, i32_view(kv_indptr, kB + 1),
                                  o.view, lse.view, opt);
  }
};

TEST(VariantErrors, CudaCoreDecodeRejectsVariants) {
  VariantErrorFixture f;
  tessera::AttentionOptions opt;
  opt.variant.window_left = 8;
  expect_error_any([&] {
    tessera::batch_decode_paged(f.q_dec.view, f.paged(), f.o_dec.view, {}, opt, nullptr, DecodeKernel::kCudaCores);
  }, {"kCudaCores"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::batch_decode_ragged(f.q_dec.view, f.k.view, f.v.view, i32_view(f.kv_indptr, 3), f.o_dec.view, {}, opt,
                                 nullptr, DecodeKernel::kCudaCores);
  }, {"kCudaCores"}, StatusCode::kUnsupported);
  const TensorView q1(f.q_dec.view.data, DType::kF16, {VariantErrorFixture::kHq, VariantErrorFixture::kD},
                      Device::cuda(0));
  const TensorView o1(f.o_dec.view.data, DType::kF16, {VariantErrorFixture::kHq, VariantErrorFixture::kD},
                      Device::cuda(0));
  tessera::AttentionOptions cap;
  cap.variant.logits_soft_cap = 30.0;
  expect_error_any([&] {
    tessera::single_decode(q1, f.k.view, f.v.view, Layout::kNHD, o1, {}, cap, nullptr, DecodeKernel::kCudaCores);
  }, {"kCudaCores"}, StatusCode::kUnsupported);
  // The same calls with kAuto run (on the tensor-core family).
  EXPECT_NO_THROW(tessera::batch_decode_paged(f.q_dec.view, f.paged(), f.o_dec.view, {}, opt));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  for (double x : read_tensor(f.o_dec)) ASSERT_FALSE(std::isnan(x)) << "o left unwritten (NaN)";
}

// The plan/run runtime takes the built-in softmax variants, custom masks (their offsets on the
// host) and softmax user variants; sigmoid, use_softmax = false and a user output_transform are
// errors there (tessera/runtime.h, PlanShape::attention).
TEST(VariantErrors, RuntimeRejectsUnsupportedVariants) {
  tessera::RuntimeBounds bounds{4, 4, 8, 2, 128};
  DeviceBuffer ws(static_cast<size_t>(tessera::BatchDecodeWrapper::workspace_size(bounds)));
  const TensorView ws_view(ws.get(), DType::kU8, {static_cast<int64_t>(ws.bytes())}, Device::cuda(0));
  tessera::BatchDecodeWrapper w(ws_view, bounds);
  std::vector<int32_t> indptr = {0, 1, 2}, last = {5, 16};
  const TensorView h_indptr(indptr.data(), DType::kI32, {3}, Device::cpu());
  const TensorView h_last(last.data(), DType::kI32, {2}, Device::cpu());
  tessera::PlanShape shape;
  shape.num_qo_heads = 8;
  shape.num_kv_heads = 2;
  shape.head_dim = 128;
  shape.dtype = DType::kF16;

  // Softmax-free variants plan (without split KV; gpu_runtime_tests' RuntimeSoftmaxFree runs them).
  tessera::PlanShape sig = shape;
  sig.attention.variant.sigmoid = true;
  EXPECT_NO_THROW(w.plan(h_indptr, h_last, 16, sig));
  tessera::VariantSpec spec;
  spec.name = "test_runtime_user";
  spec.source = "float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx,\n"
                "                       int qo_head, int kv_head) { return logits; }\n";
  tessera::PlanShape usr = shape;
  usr.attention.variant.user = &spec;
  EXPECT_NO_THROW(w.plan(h_indptr, h_last, 16, usr));
  tessera::VariantSpec no_softmax = spec;
  no_softmax.name = "test_runtime_no_softmax";
  no_softmax.use_softmax = false;
  usr.attention.variant.user = &no_softmax;
  EXPECT_NO_THROW(w.plan(h_indptr, h_last, 16, usr));
  // An output_transform needs the whole row's output: its persistent kernel does not compile.
  tessera::VariantSpec out_transform;
  out_transform.name = "test_runtime_output_transform";
  out_transform.source = "float output_transform(const Params& params, float value, int batch, int qo_idx,\n"
                         "                       int qo_head, int dim) { return 2.f * value; }\n";
  usr.attention.variant.user = &out_transform;
  w.plan(h_indptr, h_last, 16, usr);
  {
    std::mt19937_64 rng(test_seed());
    DeviceTensor q = upload_tensor(DType::kF16, round_to(DType::kF16, random_normal(2 * 8 * 128, rng)), {2, 8, 128});
    DeviceTensor kv = upload_tensor(DType::kF16, round_to(DType::kF16, random_normal(2 * 16 * 2 * 128, rng)),
                                    {2, 16, 2, 128});
    DeviceTensor o = make_output(DType::kF16, {2, 8, 128});
    DeviceBuffer pages = upload_i32({1, 0});
    tessera::PagedKVCache cache{kv.view, kv.view, Layout::kNHD, i32_view(pages, 2)};
    expect_error_any([&] { w.run(q.view, cache, o.view); }, {"defines output_transform"});
  }
  DeviceBuffer mask_bits(64);
  DeviceBuffer mask_indptr = upload_i32({0, 2, 4});
  tessera::PlanShape msk = shape;
  msk.attention.variant.custom_mask = TensorView(mask_bits.get(), DType::kU8, {64}, Device::cuda(0));
  msk.attention.variant.custom_mask_indptr = i32_view(mask_indptr, 3);
  // The runtime takes custom masks with their byte offsets on the host (plan() uploads them).
  expect_error_any([&] { w.plan(h_indptr, h_last, 16, msk); }, {"variant.custom_mask_indptr is on cuda:0"},
                   StatusCode::kInvalidArgument);
  std::vector<int32_t> short_offsets = {0, 2};
  msk.attention.variant.custom_mask_indptr = TensorView(short_offsets.data(), DType::kI32, {2}, Device::cpu());
  expect_error_any([&] { w.plan(h_indptr, h_last, 16, msk); }, {"variant.custom_mask_indptr.shape[0] = 2"},
                   StatusCode::kInvalidArgument);
  std::vector<int32_t> past_the_end = {0, 63, 65};  // request 1 (16 keys) needs bytes [63, 65) of 64
  msk.attention.variant.custom_mask_indptr = TensorView(past_the_end.data(), DType::kI32, {3}, Device::cpu());
  expect_error_any([&] { w.plan(h_indptr, h_last, 16, msk); }, {"variant.custom_mask_indptr[1] = 63"},
                   StatusCode::kInvalidArgument);
  std::vector<int32_t> fits = {0, 1, 3};
  msk.attention.variant.custom_mask_indptr = TensorView(fits.data(), DType::kI32, {3}, Device::cpu());
  EXPECT_NO_THROW(w.plan(h_indptr, h_last, 16, msk));
  // The default variant still plans after the errors.
  EXPECT_NO_THROW(w.plan(h_indptr, h_last, 16, shape));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  tessera::RuntimeBounds pbounds{4, 64, 8, 2, 128};
  DeviceBuffer pws(static_cast<size_t>(tessera::BatchPrefillRaggedWrapper::workspace_size(pbounds)));
  tessera::BatchPrefillRaggedWrapper pw(
      TensorView(pws.get(), DType::kU8, {static_cast<int64_t>(pws.bytes())}, Device::cuda(0)), pbounds);
  std::vector<int32_t> qo = {0, 7, 20}, kv = {0, 30, 50};
  tessera::PlanShape psig = sig;
  psig.attention.causal = true;
  EXPECT_NO_THROW(pw.plan(TensorView(qo.data(), DType::kI32, {3}, Device::cpu()),
                          TensorView(kv.data(), DType::kI32, {3}, Device::cpu()), psig));
  EXPECT_EQ(pw.plan_info().num_partials, 0);
}

TEST(VariantErrors, UserSnippetCompileErrorsNameTheLine) {
  VariantErrorFixture f;
  // A syntax error on line 3 of the snippet.
  tessera::VariantSpec bad;
  bad.name = "test_syntax_error";
  bad.source =
      "// line 1: a score transform with a typo\n"
      "float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head) {\n"
      "  return logits +* 2.f;\n"
      "}\n";
  tessera::AttentionOptions opt;
  opt.variant.user = &bad;
  expect_error_any([&] { f.prefill(opt); }, {"user_snippet line 3"}, StatusCode::kInvalidArgument);
  // A name the snippet does not declare, on line 5 (the parameter block has only `scale`).
  tessera::VariantSpec undeclared;
  undeclared.name = "test_undeclared_param";
  undeclared.params = {tessera::VariantParam::scalar_f32("scale", 2.f)};
  undeclared.source =
      "// line 1\n"
      "// line 2\n"
      "float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx, int qo_head,\n"
      "                       int kv_head) {\n"
      "  return logits * params.scale + params.offset;\n"
      "}\n";
  opt.variant.user = &undeclared;
  expect_error_any([&] { f.prefill(opt); }, {"user_snippet line 5"}, StatusCode::kInvalidArgument);
  // A failed compile leaves the library usable: a correct snippet compiles and runs.
  tessera::VariantSpec good = undeclared;
  good.name = "test_after_errors";
  good.source =
      "float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx, int qo_head,\n"
      "                       int kv_head) {\n"
      "  return logits * params.scale;\n"
      "}\n";
  opt.variant.user = &good;
  f.o.buf.poison();
  EXPECT_NO_THROW(f.prefill(opt));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  for (double x : read_tensor(f.o)) ASSERT_FALSE(std::isnan(x)) << "o left unwritten (NaN)";
}

TEST(VariantErrors, BlockSparseRejectsPerRequestOptions) {
  VariantErrorFixture f;
  DeviceBuffer indptr = upload_i32({0, 2}), indices = upload_i32({0, 1}), mask_indptr = upload_i32({0, 1});
  DeviceBuffer mask_bits(64);
  tessera::BlockSparse bs;
  bs.block_rows = 8;
  bs.block_cols = 16;
  bs.num_rows = VariantErrorFixture::kQ;
  bs.k = f.k.view;
  bs.v = f.v.view;
  bs.indptr = i32_view(indptr, 2);
  bs.indices = i32_view(indices, 2);
  tessera::AttentionOptions opt;
  opt.variant.custom_mask = TensorView(mask_bits.get(), DType::kU8, {64}, Device::cuda(0));
  opt.variant.custom_mask_indptr = i32_view(mask_indptr, 2);
  expect_error_any([&] { tessera::block_sparse_attention(f.q.view, bs, f.o.view, f.lse.view, opt); },
                   {"variant.custom_mask"}, StatusCode::kUnsupported);
}

}  // namespace
