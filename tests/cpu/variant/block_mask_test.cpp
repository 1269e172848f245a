// build_block_mask on the CPU (NVRTC needs no GPU): the generated builder unit compiles for sm_80
// and sm_90a for plain, parameterised and combined masks, a mask with a syntax error reports the
// user's line, and every invalid argument is rejected, before any CUDA call, with a message that
// names it. The GPU results are checked in tests/gpu/attention/block_mask_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "src/jit/nvrtc_compiler.h"
#include "src/variant/block_mask.h"
#include "tessera/error.h"
#include "tessera/variant.h"

namespace tessera {
namespace {

TensorView fake_device_tensor(DType dtype, int64_t n, int device = 0) {
  TensorView t;
  t.data = reinterpret_cast<void*>(uintptr_t{0x10000});
  t.dtype = dtype;
  t.ndim = 1;
  t.shape[0] = n;
  t.strides[0] = 1;
  t.device = Device::cuda(device);
  return t;
}

const MaskMod kCausal{
    "bool causal(const Params& params, int b, int h, int q_idx, int kv_idx) { return kv_idx <= q_idx; }\n", "causal"};
const MaskMod kWindow{"bool window(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
                      "  return q_idx - kv_idx <= params.window;\n}\n",
                      "window"};
const MaskMod kDocument{"bool document(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
                        "  return q_idx >= 0 && params.doc_ids[q_idx] == params.doc_ids[kv_idx];\n}\n",
                        "document"};

jit::CompileResult compile(const MaskMod& mask, const std::vector<VariantParam>& params, const std::string& arch) {
  const detail::BlockMaskSource src = detail::block_mask_source(mask, params);
  jit::CompileRequest req;
  req.name = "block mask test";
  req.source = src.source;
  req.arch = arch;
  req.name_expressions = src.name_expressions;
  return jit::compile_to_cubin(req);
}

TEST(BlockMaskJit, BuilderCompiles) {
  const std::vector<VariantParam> params = {VariantParam::scalar_i32("window", 128),
                                            VariantParam::device_tensor("doc_ids", fake_device_tensor(DType::kI32, 9))};
  struct Case {
    MaskMod mask;
    std::vector<VariantParam> params;
  };
  const Case cases[] = {
      {kCausal, {}},
      {and_masks(kCausal, kWindow), params},
      {or_masks(and_masks(kCausal, kDocument), kWindow), params},
  };
  for (const Case& c : cases) {
    for (const char* arch : {"80", "90a"}) {
      const jit::CompileResult r = compile(c.mask, c.params, arch);
      EXPECT_FALSE(r.cubin.empty()) << c.mask.function << " sm_" << arch;
      ASSERT_EQ(r.lowered_names.size(), 3u) << c.mask.function << " sm_" << arch;
      for (const jit::LoweredName& n : r.lowered_names) EXPECT_FALSE(n.lowered.empty()) << n.expression;
    }
  }
  const detail::BlockMaskSource src = detail::block_mask_source(kWindow, params);
  EXPECT_TRUE(src.source.has_user_snippet);
  EXPECT_NE(src.source.text.find("alignas(8) int32_t window;"), std::string::npos);
  EXPECT_NE(src.source.text.find("alignas(8) const int32_t* doc_ids;"), std::string::npos);
  EXPECT_NE(src.source.text.find("tessera_user::window("), std::string::npos);
}

TEST(BlockMaskJit, SnippetErrorCarriesUserLine) {
  const MaskMod broken{"bool broken(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
                       "  return kv_idx <= q_idx + params.missing;\n"  // line 2: no such member
                       "}\n",
                       "broken"};
  try {
    compile(broken, {VariantParam::scalar_i32("present", 1)}, "90a");
    ADD_FAILURE() << "no compile error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(StatusCode::kInvalidArgument)) << msg;
    EXPECT_NE(msg.find("user_snippet line 2"), std::string::npos) << msg;
  }
}

TEST(BlockMaskJit, LanesPerBlock) {
  EXPECT_EQ(detail::block_mask_lanes_per_block(1, 1), 1);
  EXPECT_EQ(detail::block_mask_lanes_per_block(5, 3), 16);
  EXPECT_EQ(detail::block_mask_lanes_per_block(16, 1), 16);
  EXPECT_EQ(detail::block_mask_lanes_per_block(1, 17), 32);
  EXPECT_EQ(detail::block_mask_lanes_per_block(128, 64), 32);
}

/// One call's arguments, valid by default (q_len 300, kv_len 1000, blocks (64, 64): 5 x 16).
struct Call {
  MaskMod mask = kWindow;
  std::vector<VariantParam> params = {VariantParam::scalar_i32("window", 64)};
  int64_t q_len = 300, kv_len = 1000, block_rows = 64, block_cols = 64;
  TensorView indptr = fake_device_tensor(DType::kI32, 6);
  TensorView indices = fake_device_tensor(DType::kI32, 80);
  TensorView block_flags = fake_device_tensor(DType::kU8, 80);

  void run() const {
    build_block_mask(mask, params, q_len, kv_len, block_rows, block_cols, 0, 0, indptr, indices, block_flags);
  }
};

void expect_invalid(const Call& call, const std::string& needle) {
  try {
    call.run();
    ADD_FAILURE() << "no error, expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(StatusCode::kInvalidArgument)) << e.what();
  }
}

TEST(BlockMaskArgs, Errors) {
  Call c;
  c.mask.function = "not a name";
  expect_invalid(c, "mask.function = 'not a name'");
  c = {};
  c.mask.source.clear();
  expect_invalid(c, "mask.source is empty");

  c = {};
  c.q_len = 0;
  expect_invalid(c, "q_len = 0, expected in [1, 2^31)");
  c = {};
  c.kv_len = -3;
  expect_invalid(c, "kv_len = -3");
  c = {};
  c.q_len = int64_t{1} << 31;
  expect_invalid(c, "q_len = 2147483648");
  c = {};
  c.block_rows = 0;
  expect_invalid(c, "block_rows = 0");
  c = {};
  c.block_cols = -1;
  expect_invalid(c, "block_cols = -1");
  c = {};
  c.q_len = c.kv_len = 100000;
  c.block_rows = c.block_cols = 1;
  expect_invalid(c, "= 10000000000 blocks");

  c = {};
  c.indptr = fake_device_tensor(DType::kI32, 5);
  expect_invalid(c, "indptr.shape[0] = 5, expected 6");
  c = {};
  c.indptr.dtype = DType::kF32;
  expect_invalid(c, "indptr.dtype");
  c = {};
  c.indptr.device = Device::cpu();
  expect_invalid(c, "indptr.device = cpu");
  c = {};
  c.indptr.strides[0] = 2;
  expect_invalid(c, "indptr.strides");
  c = {};
  c.indptr = TensorView();
  expect_invalid(c, "indptr.ndim = 0");
  c = {};
  c.indptr.data = nullptr;
  expect_invalid(c, "indptr.data is null");

  c = {};
  c.indices = fake_device_tensor(DType::kI32, 79);
  c.block_flags = fake_device_tensor(DType::kU8, 79);
  expect_invalid(c, "indices.shape[0] = 79, expected >= 80");
  c = {};
  c.indices.dtype = DType::kU8;
  expect_invalid(c, "indices.dtype");
  c = {};
  c.indices.device = Device::cuda(1);
  expect_invalid(c, "indices");
  c = {};
  c.block_flags.dtype = DType::kI32;
  expect_invalid(c, "block_flags.dtype");
  c = {};
  c.block_flags = fake_device_tensor(DType::kU8, 81);
  expect_invalid(c, "block_flags.shape[0] = 81, expected 80");
  c = {};
  c.block_flags.device = Device::cpu();
  expect_invalid(c, "block_flags.device = cpu");

  c = {};
  c.params = {VariantParam::scalar_i32("window", 1), VariantParam::scalar_f32("window", 2.f)};
  expect_invalid(c, "params[1].name = 'window' is declared twice");
  c = {};
  c.params = {VariantParam::scalar_f32("2x", 1.f)};
  expect_invalid(c, "params[0].name = '2x'");
  c = {};
  c.params = {VariantParam::scalar_i64("window", 0)};
  c.params[0].kind = VariantParam::Kind::kI32;
  c.params[0].i64 = int64_t{1} << 40;
  expect_invalid(c, "params.window = 1099511627776, expected a 32-bit integer");
  c = {};
  c.params = {VariantParam::device_tensor("doc_ids", fake_device_tensor(DType::kI32, 4))};
  c.params[0].tensor.device = Device::cpu();
  expect_invalid(c, "params.doc_ids.device = cpu");
  c = {};
  c.params = {VariantParam::device_tensor("doc_ids", fake_device_tensor(DType::kE4M3, 4))};
  expect_invalid(c, "params.doc_ids.dtype");
  c = {};
  c.params = {VariantParam::device_tensor("doc_ids", fake_device_tensor(DType::kI32, 4, 1))};
  expect_invalid(c, "params.doc_ids");
  c = {};
  c.params.clear();
  for (int i = 0; i < 17; ++i) c.params.push_back(VariantParam::scalar_i32("p" + std::to_string(i), i));
  expect_invalid(c, "build_block_mask: 17 params, expected at most 16");
}

}  // namespace
}  // namespace tessera
