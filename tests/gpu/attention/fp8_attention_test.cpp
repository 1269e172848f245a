// GPU tests of FP8 attention (q, k and v e4m3, o f16 or bf16; the wgmma tile of sm_90a): single,
// ragged and paged prefill (page sizes 1, 16, 64), head dims 128 and 256, GQA groups 1 to 8,
// causal or not, scales per tensor (host or device) and per KV head, odd lengths and requests
// without queries or keys, against the fp64 oracle on the dequantized q, k and v. P is rounded to
// e4m3 for P V (as fp8 wgmma takes it), so o is held to kFp8AttentionRelTolerance, not the 16-bit
// thresholds, and the LSE to kFp8AttentionLseTolerance. The error against the unquantized inputs
// is printed per case. Also: the errors of every unsupported combination,
// and, on a GPU without wgmma, the error that says so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "tessera/attention.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::Layout;
using tessera::StatusCode;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

/// o's relative error bound of FP8 attention against the oracle on the dequantized inputs: e4m3
/// keeps 3 mantissa bits, so each P element is rounded by up to 2^-4 of itself (~2.4% rms), and o,
/// a weighted mean of V rows, carries a relative error of that order when attention is spread over
/// many keys. (The 16-bit kernels' 1e-2 bound is for P in f16 / bf16.)
constexpr double kFp8AttentionRelTolerance = 4e-2;
/// The base-2 LSE's absolute error bound: the logits are exact products of fp8 codes, but Hopper's
/// fp8 MMAs accumulate them with fewer bits than fp32 (measured: up to 2.3e-3 where the f16
/// kernels' LSE is within 1e-3), so both output dtypes take the bf16 bound.
constexpr double kFp8AttentionLseTolerance = 8e-3;

bool device_has_wgmma() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
}

/// An FP8 attention case: e4m3 q, k and v, the FP8 attention tolerances.
AttentionCase fp8_attention_case() {
  AttentionCase c;
  c.fp8 = Fp8KV::kE4M3;
  c.fp8_q = true;
  c.fp8_rel_tolerance = kFp8AttentionRelTolerance;
  c.fp8_lse_tolerance = kFp8AttentionLseTolerance;
  return c;
}

std::vector<AttentionCase> fp8_attention_cases() {
  std::vector<AttentionCase> cases;
  const KVScaleMode modes[] = {KVScaleMode::kHost, KVScaleMode::kDevice, KVScaleMode::kPerHead};
  const int64_t groups[] = {1, 4, 5, 8};
  const int64_t pages[] = {1, 16, 64};
  int n = 0;  // walks the lists at different strides, so the grid mixes them
  for (Entry entry : {Entry::kSingle, Entry::kRagged, Entry::kPaged}) {
    for (int64_t dim : {128, 256}) {
      for (bool causal : {false, true}) {
        AttentionCase c = fp8_attention_case();
        c.entry = entry;
        c.head_dim = dim;
        c.dtype = n % 2 ? DType::kBF16 : DType::kF16;
        c.kv_scales = modes[n % 3];
        c.group = groups[(n / 2) % 4];
        c.num_kv_heads = 1 + n % 3;
        c.layout = (entry != Entry::kRagged && (n / 3) % 2) ? Layout::kHND : Layout::kNHD;
        c.batch = entry == Entry::kSingle ? 1 : 4 + n % 3;
        c.qo_len = n % 2 ? 300 : 129;
        c.kv_len = c.qo_len + (n % 3) * 517;
        c.causal = causal;
        if (entry == Entry::kPaged) {
          c.page_size = pages[n % 3];
          c.nan_unused = n % 2 == 0;
        }
        c.strided = n % 4 == 1;
        ++n;
        cases.push_back(c);
      }
    }
  }
  // Long: many KV tiles per query tile, every raw stage and ring slot reused.
  AttentionCase long_causal = fp8_attention_case();
  long_causal.entry = Entry::kRagged;
  long_causal.dtype = DType::kBF16;
  long_causal.batch = 2;
  long_causal.qo_len = 1500;
  long_causal.kv_len = 4100;
  long_causal.group = 4;
  long_causal.num_kv_heads = 2;
  long_causal.causal = true;
  long_causal.kv_scales = KVScaleMode::kPerHead;
  cases.push_back(long_causal);
  // No LSE output; f16 o; groups of 3 query heads per KV head (rows of a tile mix heads).
  AttentionCase no_lse = fp8_attention_case();
  no_lse.entry = Entry::kPaged;
  no_lse.dtype = DType::kF16;
  no_lse.batch = 3;
  no_lse.qo_len = 200;
  no_lse.kv_len = 900;
  no_lse.page_size = 16;
  no_lse.group = 3;
  no_lse.num_kv_heads = 3;
  no_lse.head_dim = 256;
  no_lse.with_lse = false;
  no_lse.kv_scales = KVScaleMode::kDevice;
  cases.push_back(no_lse);
  // The compute-sanitizer subset: odd lengths, page size 1, NaN page tails, strides.
  AttentionCase s1 = fp8_attention_case();
  s1.entry = Entry::kPaged;
  s1.dtype = DType::kBF16;
  s1.batch = 4;
  s1.qo_len = 70;
  s1.kv_len = 333;
  s1.page_size = 1;
  s1.group = 5;
  s1.num_kv_heads = 2;
  s1.nan_unused = true;
  s1.kv_scales = KVScaleMode::kPerHead;
  s1.causal = true;
  s1.sanitize = true;
  AttentionCase s2 = s1;
  s2.entry = Entry::kRagged;
  s2.dtype = DType::kF16;
  s2.head_dim = 256;
  s2.qo_len = 33;
  s2.kv_len = 150;
  s2.strided = true;
  s2.causal = false;
  s2.kv_scales = KVScaleMode::kDevice;
  cases.push_back(s1);
  cases.push_back(s2);
  return cases;
}

class Fp8AttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(Fp8AttentionTest, MatchesOracleOnDequantizedInputs) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  if (!device_has_wgmma()) {
    // Without wgmma the call is a named error (kUnsupported), never a fallback.
    expect_error_any([&] { run_attention_case(GetParam(), seed); }, {"sm_90a", "wgmma"}, StatusCode::kUnsupported);
    return;
  }
  AttentionCase::Fp8Errors errors;
  run_attention_case(GetParam(), seed, &errors);
  std::printf("[fp8 attention] %s: relative error of o against the dequantized inputs %.2e, against the "
              "unquantized (16-bit) inputs %.2e\n",
              case_name(GetParam()).c_str(), errors.dequantized, errors.unquantized);
  // Rounding q, k and v to e4m3 adds an error of the same order; a misread code, scale or
  // permutation gives errors of order 1.
  EXPECT_LT(errors.unquantized, 0.12) << case_name(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Grid, Fp8AttentionTest, ::testing::ValuesIn(fp8_attention_cases()),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) { return case_name(info.param); });

// ---------------------------------------------------------------------------------------------
// Errors: dtypes, head dims, variants, scales, the KV format, the device.

TEST(Fp8AttentionErrors, UnsupportedCombinationsAreNamed) {
  constexpr int64_t Hq = 8, Hkv = 2, D = 128, L = 64, S = 4;
  DeviceBuffer buf(8 << 20);
  cudaMemset(buf.get(), 0, buf.bytes());
  auto region = [&](int i) { return static_cast<char*>(buf.get()) + i * (1 << 20); };
  auto t = [&](int i, DType dtype, std::initializer_list<int64_t> shape) {
    return TensorView(region(i), dtype, shape, Device::cuda(0));
  };
  const DType bf = DType::kBF16, e4 = DType::kE4M3, e5 = DType::kE5M2;
  const TensorView q = t(0, e4, {S, Hq, D}), k = t(1, e4, {L, Hkv, D}), v = t(2, e4, {L, Hkv, D});
  const TensorView o = t(3, bf, {S, Hq, D}), lse = t(4, DType::kF32, {S, Hq});
  if (!device_has_wgmma()) {
    expect_error_any([&] { tessera::single_prefill(q, k, v, Layout::kNHD, o, lse); }, {"sm_90a", "wgmma"},
                     StatusCode::kUnsupported);
    return;
  }
  tessera::AttentionOptions ok;
  ok.kv_scales.q = 0.5;
  ok.kv_scales.k = 0.25;
  EXPECT_NO_THROW(tessera::single_prefill(q, k, v, Layout::kNHD, o, lse, ok));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  // e5m2 q; k of another fp8 type or 16-bit; o fp8.
  expect_error_any([&] {
    tessera::single_prefill(t(0, e5, {S, Hq, D}), t(1, e5, {L, Hkv, D}), t(2, e5, {L, Hkv, D}), Layout::kNHD, o, lse);
  }, {"q.dtype"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::single_prefill(q, t(1, e5, {L, Hkv, D}), t(2, e5, {L, Hkv, D}), Layout::kNHD, o, lse);
  }, {"k.dtype"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::single_prefill(q, t(1, bf, {L, Hkv, D}), t(2, bf, {L, Hkv, D}), Layout::kNHD, o, lse);
  }, {"k.dtype", "k"});
  expect_error_any([&] { tessera::single_prefill(q, k, v, Layout::kNHD, t(3, e4, {S, Hq, D}), lse); }, {"o.dtype", "o"});
  // Head dim 64 is not built for FP8 attention.
  expect_error_any([&] {
    tessera::single_prefill(t(0, e4, {S, Hq, 64}), t(1, e4, {L, Hkv, 64}), t(2, e4, {L, Hkv, 64}), Layout::kNHD,
                            t(3, bf, {S, Hq, 64}), TensorView());
  }, {"head_dim = 64"}, StatusCode::kUnsupported);
  // A variant.
  tessera::AttentionOptions capped;
  capped.variant.logits_soft_cap = 30.0;
  expect_error_any([&] { tessera::single_prefill(q, k, v, Layout::kNHD, o, lse, capped); }, {"options.variant"},
                   StatusCode::kUnsupported);
  // Bad q scales; a q scale with a 16-bit q.
  for (double bad : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    tessera::AttentionOptions opt;
    opt.kv_scales.q = bad;
    expect_error_any([&] { tessera::single_prefill(q, k, v, Layout::kNHD, o, lse, opt); }, {"options.kv_scales.q"},
                     StatusCode::kInvalidArgument);
  }
  tessera::AttentionOptions three;
  three.kv_scales.q_device = t(5, DType::kF32, {3});
  expect_error_any([&] { tessera::single_prefill(q, k, v, Layout::kNHD, o, lse, three); },
                   {"options.kv_scales.q_device"}, StatusCode::kInvalidArgument);
  expect_error_any([&] {
    tessera::single_prefill(t(0, bf, {S, Hq, D}), k, v, Layout::kNHD, o, lse, ok);
  }, {"options.kv_scales.q"}, StatusCode::kInvalidArgument);
  // Block-sparse KV has no FP8 attention (its q must be 16-bit).
  tessera::BlockSparse bsr;
  bsr.k = k;
  bsr.v = v;
  bsr.indptr = t(6, DType::kI32, {2});
  bsr.indices = t(7, DType::kI32, {1});
  bsr.block_rows = S;
  bsr.block_cols = L;
  bsr.num_rows = S;
  expect_error_any([&] { tessera::block_sparse_attention(q, bsr, o, lse); }, {"q.dtype", "q"});
}

}  // namespace
