// Variants on the CPU (NVRTC needs no GPU): option validation, the generated translation units of
// built-in and user variants compiled for sm_80 and sm_90a, hook detection, snippet errors with
// the user's line numbers, and the FlexAttention combinators.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "src/jit/kernel_cache.h"
#include "src/jit/nvrtc_compiler.h"
#include "src/variant/jit_variant.h"
#include "src/variant/variant_config.h"
#include "tessera/error.h"
#include "tessera/variant.h"

namespace tessera {
namespace {

using detail::ResolvedVariant;
using detail::VariantKernelRequest;
namespace feature = kernels::feature;

TensorView fake_device_tensor(DType dtype, int64_t n) {
  TensorView t;
  t.data = reinterpret_cast<void*>(uintptr_t{0x10000});
  t.dtype = dtype;
  t.ndim = 1;
  t.shape[0] = n;
  t.strides[0] = 1;
  t.device = Device::cuda(0);
  return t;
}

detail::VariantContext context(const TensorView& q) {
  detail::VariantContext ctx;
  ctx.q = &q;
  ctx.batch_size = 3;
  ctx.num_qo_heads = 8;
  ctx.head_dim = 128;
  ctx.sm_scale = 0.125;
  return ctx;
}

VariantKernelRequest prefill_request(const char* dtype, const char* format) {
  VariantKernelRequest r;
  r.header = "kernels/attention/prefill.cuh";
  r.kernel = "tessera::kernels::attention_prefill_kernel";
  r.args_before = std::string("tessera::kernels::PrefillTraits<") + dtype +
                  ", 128, 128, 64, 8, 1, 2, 2>, tessera::kernels::KVFormatKind::" + format;
  r.args_after = std::string("tessera::kernels::OneShotScheduler, ") +
                 (std::string(dtype) == "__half" ? detail::params_type_name<__half>()
                                                 : detail::params_type_name<__nv_bfloat16>());
  r.description = "test prefill";
  return r;
}

jit::CompileResult compile(const ResolvedVariant& v, const std::string& arch, const char* format = "kPaged") {
  const detail::VariantSource src = detail::variant_source(v, prefill_request("__nv_bfloat16", format));
  jit::CompileRequest req;
  req.name = "variant test";
  req.source = jit::GeneratedSource{src.text, src.has_user_snippet};
  req.arch = arch;
  req.name_expressions = {src.name_expression};
  return jit::compile_to_cubin(req);
}

TEST(VariantOptions, DefaultIsDefault) {
  VariantOptions o;
  EXPECT_TRUE(o.is_default());
  o.window_left = 0;
  EXPECT_FALSE(o.is_default());
  TensorView q = fake_device_tensor(DType::kBF16, 1);
  const ResolvedVariant r = detail::resolve_variant(VariantOptions{}, context(q));
  EXPECT_TRUE(r.is_default);
}

TEST(VariantOptions, FeaturesAndParams) {
  TensorView q = fake_device_tensor(DType::kBF16, 1);
  VariantOptions o;
  o.window_left = 1024;
  o.num_sink_tokens = 4;
  o.logits_soft_cap = 30.0;
  o.alibi_slopes = fake_device_tensor(DType::kF32, 8);
  o.rope.mode = PosEncoding::kRopeLlama31;
  const ResolvedVariant r = detail::resolve_variant(o, context(q));
  EXPECT_FALSE(r.is_default);
  EXPECT_EQ(r.features, feature::kWindow | feature::kSinks | feature::kSoftCap | feature::kAlibi | feature::kRope);
  EXPECT_EQ(r.params.window_left, 1024);
  EXPECT_EQ(r.params.num_sink_tokens, 4);
  EXPECT_FLOAT_EQ(r.params.soft_cap, 30.f);
  EXPECT_FLOAT_EQ(r.params.inv_soft_cap, 1.f / 30.f);
  EXPECT_FLOAT_EQ(r.params.sm_scale, 0.125f);
  EXPECT_FLOAT_EQ(r.params.llama31_low_freq_wavelen, 8192.f);
  EXPECT_FLOAT_EQ(r.params.llama31_high_freq_wavelen, 2048.f);
  EXPECT_TRUE(r.use_softmax);
}

void expect_invalid(const VariantOptions& o, const char* needle, StatusCode code = StatusCode::kInvalidArgument,
                    bool block_sparse = false) {
  TensorView q = fake_device_tensor(DType::kBF16, 1);
  detail::VariantContext ctx = context(q);
  ctx.block_sparse = block_sparse;
  try {
    detail::resolve_variant(o, ctx);
    ADD_FAILURE() << "no error, expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
  }
}

TEST(VariantOptions, Errors) {
  VariantOptions o;
  o.window_left = -2;
  expect_invalid(o, "variant.window_left = -2");
  o = {};
  o.num_sink_tokens = 4;
  expect_invalid(o, "variant.num_sink_tokens = 4 needs a sliding window");
  o = {};
  o.logits_soft_cap = -1;
  expect_invalid(o, "variant.logits_soft_cap = -1");
  o = {};
  o.alibi_slopes = fake_device_tensor(DType::kF32, 7);
  expect_invalid(o, "variant.alibi_slopes");
  o = {};
  o.alibi_slopes = fake_device_tensor(DType::kF16, 8);
  expect_invalid(o, "variant.alibi_slopes");
  o = {};
  o.custom_mask = fake_device_tensor(DType::kU8, 100);
  expect_invalid(o, "variant.custom_mask_indptr is unset");
  o.custom_mask_indptr = fake_device_tensor(DType::kI32, 4);
  expect_invalid(o, "variant.custom_mask is not supported with block-sparse", StatusCode::kUnsupported, true);
  o = {};
  o.rope.mode = PosEncoding::kRopeLlama;
  o.rope.theta = 0.5;
  expect_invalid(o, "variant.rope.theta = 0.5");
  o = {};
  o.rope.q_offset = fake_device_tensor(DType::kI32, 3);
  expect_invalid(o, "variant.rope.mode = kNone");
  o = {};
  o.rope.mode = PosEncoding::kRopeLlama;
  o.rope.k_offset = fake_device_tensor(DType::kI32, 2);
  expect_invalid(o, "variant.rope.k_offset");
  VariantSpec spec;
  spec.name = "bad";
  spec.params = {VariantParam::scalar_f32("1x", 1.f)};
  o = {};
  o.user = &spec;
  expect_invalid(o, "params[0].name = '1x'");
  spec.params = {VariantParam::scalar_f32("a", 1.f), VariantParam::scalar_i32("a", 2)};
  expect_invalid(o, "params[1].name = 'a' is declared twice");
  spec.params = {VariantParam::device_tensor("t", fake_device_tensor(DType::kE4M3, 2))};
  expect_invalid(o, "variant param t");
}

TEST(VariantOptions, UserParamsFillSlots) {
  TensorView q = fake_device_tensor(DType::kBF16, 1);
  VariantSpec spec;
  spec.name = "p";
  const TensorView t = fake_device_tensor(DType::kF32, 5);
  spec.params = {VariantParam::scalar_f32("a", 2.5f), VariantParam::scalar_i32("b", -7),
                 VariantParam::device_tensor("c", t)};
  VariantOptions o;
  o.user = &spec;
  const ResolvedVariant r = detail::resolve_variant(o, context(q));
  float a;
  int32_t b;
  const void* c;
  std::memcpy(&a, &r.params.extra[0], sizeof(a));
  std::memcpy(&b, &r.params.extra[1], sizeof(b));
  std::memcpy(&c, &r.params.extra[2], sizeof(c));
  EXPECT_EQ(a, 2.5f);
  EXPECT_EQ(b, -7);
  EXPECT_EQ(c, t.data);
}

// Every built-in feature, alone and all together, compiles for both architectures.
TEST(VariantJit, BuiltinVariantsCompile) {
  const uint32_t all = feature::kWindow | feature::kSinks | feature::kSoftCap | feature::kAlibi | feature::kCustomMask |
                       feature::kRope;
  for (uint32_t f : {feature::kWindow, feature::kSoftCap, feature::kSigmoid, all}) {
    ResolvedVariant v;
    v.is_default = false;
    v.features = f;
    for (const char* arch : {"80", "90a"}) {
      const jit::CompileResult r = compile(v, arch);
      EXPECT_FALSE(r.cubin.empty()) << "features " << f << " sm_" << arch;
      EXPECT_EQ(r.lowered_names.size(), 1u);
    }
  }
}

// The runtime's persistent kernel and the 16-row decode tile take the same variants.
TEST(VariantJit, PersistentAndDecodeTilesCompile) {
  ResolvedVariant v;
  v.is_default = false;
  v.features = feature::kWindow | feature::kSinks | feature::kSoftCap | feature::kAlibi | feature::kRope |
               feature::kCustomMask;
  VariantKernelRequest persistent = prefill_request("__half", "kPaged");
  persistent.args_after = "tessera::kernels::PlannedScheduler, " + detail::params_type_name<__half>();
  VariantKernelRequest decode = prefill_request("__nv_bfloat16", "kPaged");
  decode.args_before = "tessera::kernels::PrefillTraits<__nv_bfloat16, 128, 16, 64, 1, 4, 3, 1>, "
                       "tessera::kernels::KVFormatKind::kPaged";
  for (const VariantKernelRequest& r : {persistent, decode}) {
    const detail::VariantSource src = detail::variant_source(v, r);
    jit::CompileRequest req;
    req.name = "variant test " + r.args_after;
    req.source = jit::GeneratedSource{src.text, src.has_user_snippet};
    req.arch = "90a";
    req.name_expressions = {src.name_expression};
    const jit::CompileResult res = jit::compile_to_cubin(req);
    EXPECT_FALSE(res.cubin.empty()) << r.kernel;
  }
}

const char* kAllHooks = R"(
float2 query_transform(const Params& params, float2 value, int batch, int qo_idx, int kv_idx, int qo_head,
                       int kv_head, int dim) {
  return make_float2(value.x * params.scale, value.y * params.scale);
}
float2 key_transform(const Params& params, float2 value, int batch, int qo_idx, int kv_idx, int qo_head,
                     int kv_head, int dim) {
  return value;
}
float2 value_transform(const Params& params, float2 value, int batch, int qo_idx, int kv_idx, int qo_head,
                       int kv_head, int dim) {
  return make_float2(value.x + params.table[dim], value.y);
}
float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx, int qo_head,
                       int kv_head) {
  return logits + params.bias;
}
bool logits_mask(const Params& params, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head) {
  return (kv_idx % params.stride) == 0;
}
float output_transform(const Params& params, float value, int batch, int qo_idx, int qo_head, int dim) {
  return value * 2.f;
}
)";

TEST(VariantJit, UserVariantWithEveryHookCompiles) {
  TensorView q = fake_device_tensor(DType::kBF16, 1);
  VariantSpec spec;
  spec.name = "all_hooks";
  spec.source = kAllHooks;
  spec.params = {VariantParam::scalar_f32("scale", 0.5f), VariantParam::device_tensor("table", fake_device_tensor(DType::kF32, 128)),
                 VariantParam::scalar_f32("bias", 0.f), VariantParam::scalar_i32("stride", 2)};
  VariantOptions o;
  o.user = &spec;
  o.logits_soft_cap = 20;
  const ResolvedVariant v = detail::resolve_variant(o, context(q));
  for (const char* arch : {"80", "90a"}) EXPECT_FALSE(compile(v, arch, "kRagged").cubin.empty());
  // The generated adapter reports each hook the user defined.
  const std::string text = detail::variant_source(v, prefill_request("__half", "kRagged")).text;
  EXPECT_NE(text.find("k_has_logits_mask"), std::string::npos);
  EXPECT_NE(text.find("alignas(8) const float* table;"), std::string::npos);
}

// Hooks that take the request's lengths as a last argument are detected and called with them; a
// hook without it next to them still is.
TEST(VariantJit, HooksWithTheRequestCompileAndAreDetected) {
  TensorView q = fake_device_tensor(DType::kBF16, 1);
  VariantSpec spec;
  spec.name = "with_request";
  spec.source =
      "float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx, int qo_head,\n"
      "                       int kv_head, const Request& request) {\n"
      "  return logits * static_cast<float>(request.kv_len - kv_idx);\n"
      "}\n"
      "bool logits_mask(const Params& params, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head,\n"
      "                 const Request& request) {\n"
      "  return qo_idx - (request.kv_len - request.qo_len) >= 0;\n"
      "}\n"
      "float2 key_transform(const Params& params, float2 value, int batch, int qo_idx, int kv_idx, int qo_head,\n"
      "                     int kv_head, int dim) {\n"
      "  return value;\n"
      "}\n";
  spec.use_softmax = false;
  VariantOptions o;
  o.user = &spec;
  const ResolvedVariant v = detail::resolve_variant(o, context(q));
  for (const char* format : {"kRagged", "kPaged"}) {
    detail::VariantSource src = detail::variant_source(v, prefill_request("__half", format));
    src.text += "static_assert(tessera_user::k_has_logits_transform && tessera_user::k_has_logits_mask &&\n"
                "              tessera_user::k_has_key_transform && !tessera_user::k_has_value_transform,\n"
                "              \"the hooks with and without the request are detected\");\n";
    jit::CompileRequest req;
    req.name = std::string("variant test with request ") + format;
    req.source = jit::GeneratedSource{src.text, src.has_user_snippet};
    req.arch = "90a";
    req.name_expressions = {src.name_expression};
    EXPECT_FALSE(jit::compile_to_cubin(req).cubin.empty()) << format;
  }
}

TEST(VariantJit, SnippetErrorCarriesUserLine) {
  TensorView q = fake_device_tensor(DType::kBF16, 1);
  VariantSpec spec;
  spec.name = "broken";
  spec.source = "bool logits_mask(const Params& params, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head) {\n"
                "  return kv_idx <= qo_idx\n"  // line 2: missing semicolon, reported on line 3
                "}\n";
  VariantOptions o;
  o.user = &spec;
  const ResolvedVariant v = detail::resolve_variant(o, context(q));
  try {
    compile(v, "90a");
    ADD_FAILURE() << "no compile error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(StatusCode::kInvalidArgument)) << msg;
    EXPECT_NE(msg.find("user_snippet line 3"), std::string::npos) << msg;
  }
}

// The disk cache with a real variant unit: a second request is a memory hit, a new cache object
// over the same directory (a restarted process) loads it from disk without compiling. (Two
// processes racing for one entry: jit_tests JitCacheConcurrency.TwoProcessesCompileOnce.)
TEST(VariantJit, CacheHitAndRestart) {
  char pattern[] = "/tmp/tessera-variant-cache-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  TensorView q = fake_device_tensor(DType::kBF16, 1);
  VariantSpec spec;
  spec.name = "cached";
  spec.source = "float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx,\n"
                "                       int qo_head, int kv_head) { return logits * params.s; }\n";
  spec.params = {VariantParam::scalar_f32("s", 0.5f)};
  VariantOptions o;
  o.user = &spec;
  const ResolvedVariant v = detail::resolve_variant(o, context(q));
  const detail::VariantSource src = detail::variant_source(v, prefill_request("__nv_bfloat16", "kRagged"));
  jit::CompileRequest req;
  req.name = "variant cache test";
  req.source = jit::GeneratedSource{src.text, src.has_user_snippet};
  req.arch = "90a";
  req.name_expressions = {src.name_expression};
  {
    jit::KernelCache cache(dir);
    const auto first = cache.get_or_compile(req);
    const auto second = cache.get_or_compile(req);
    EXPECT_EQ(first.get(), second.get());
    EXPECT_EQ(cache.stats().compiles, 1u);
    EXPECT_EQ(cache.stats().memory_hits, 1u);
  }
  jit::KernelCache restarted(dir);
  const auto third = restarted.get_or_compile(req);
  EXPECT_EQ(restarted.stats().compiles, 0u);
  EXPECT_EQ(restarted.stats().disk_hits, 1u);
  EXPECT_FALSE(third->lowered_name(src.name_expression).empty());
  // A different parameter value is the same unit (values travel in VariantParams at launch).
  spec.params[0].f32 = 2.0;
  const ResolvedVariant v2 = detail::resolve_variant(o, context(q));
  EXPECT_EQ(detail::variant_source(v2, prefill_request("__nv_bfloat16", "kRagged")).text, src.text);
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST(FlexFrontEnd, CombinatorsAndVariant) {
  const MaskMod causal{"bool causal_mask(const Params& params, int b, int h, int q_idx, int kv_idx) { return kv_idx <= q_idx; }\n",
                       "causal_mask"};
  const MaskMod window{"bool window_mask(const Params& params, int b, int h, int q_idx, int kv_idx) { return q_idx - kv_idx <= params.w; }\n",
                       "window_mask"};
  const MaskMod both = and_masks(causal, window);
  EXPECT_EQ(both.function, "causal_mask_and_window_mask");
  const MaskMod either = or_masks(causal, window);
  EXPECT_NE(either.source.find("||"), std::string::npos);
  const ScoreMod cap{"float tanh_cap(const Params& params, float score, int b, int h, int q_idx, int kv_idx) { return 30.f * tanhf(score / 30.f); }\n",
                     "tanh_cap"};
  VariantSpec spec = flex_variant("flex", &both, &cap, {VariantParam::scalar_i32("w", 256)});
  TensorView q = fake_device_tensor(DType::kBF16, 1);
  VariantOptions o;
  o.user = &spec;
  const ResolvedVariant v = detail::resolve_variant(o, context(q));
  EXPECT_FALSE(compile(v, "90a", "kBlockSparse").cubin.empty());
  EXPECT_THROW(and_masks(causal, causal), Error);
}

TEST(Alibi, StandardSlopes) {
  const std::vector<float> s8 = alibi_slopes(8);
  ASSERT_EQ(s8.size(), 8u);
  EXPECT_FLOAT_EQ(s8[0], 0.5f);
  EXPECT_FLOAT_EQ(s8[7], 1.f / 256.f);
  const std::vector<float> s12 = alibi_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  EXPECT_FLOAT_EQ(s12[8], std::exp2(-0.5f));  // heads past the power of two: 2^(-4 (2k - 1) / 8), k = 1
  EXPECT_FLOAT_EQ(s12[11], std::exp2(-3.5f));  // k = 4
}

}  // namespace
}  // namespace tessera
