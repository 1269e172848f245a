// GPU tests of fp8 (e4m3, e5m2) K/V in the one-shot entry points: decode (both kernels) and
// prefill over dense, ragged and paged (page sizes 1, 16, 64) KV (block-sparse: the runtime's
// tests), f16 and bf16 queries, head dims 64 / 128 / 256, GQA groups 1 to 8, scales per tensor
// (host or device) and per KV head, with and without variants, against the fp64 oracle run on the dequantized K/V (code x scale); the error of
// fp8 against the unquantized K/V, printed per format; changed device scales between calls;
// and the errors of bad scales, dtype pairs and head dims.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "reference/fp8.h"
#include "reference/oracle.h"
#include "tessera/attention.h"

namespace {

using tessera::DecodeKernel;
using tessera::Device;
using tessera::DType;
using tessera::Layout;
using tessera::StatusCode;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

std::vector<AttentionCase> fp8_cases() {
  std::vector<AttentionCase> cases;
  const Fp8KV formats[] = {Fp8KV::kE4M3, Fp8KV::kE5M2};
  const KVScaleMode modes[] = {KVScaleMode::kHost, KVScaleMode::kDevice, KVScaleMode::kPerHead};
  const int64_t dims[] = {64, 128, 256};
  const int64_t groups[] = {1, 4, 5, 8};
  const int64_t pages[] = {1, 16, 64};
  int n = 0;  // walks the lists at different strides, so the grid mixes them
  for (bool decode : {true, false}) {
    for (Entry entry : {Entry::kSingle, Entry::kRagged, Entry::kPaged}) {
      for (int64_t dim : dims) {
        for (Fp8KV fp8 : formats) {
          AttentionCase c;
          c.decode = decode;
          c.entry = entry;
          c.fp8 = fp8;
          c.head_dim = dim;
          c.dtype = n % 2 ? DType::kBF16 : DType::kF16;
          c.kv_scales = modes[n % 3];
          c.group = groups[(n / 2) % 4];
          c.num_kv_heads = 1 + n % 3;
          c.layout = (entry != Entry::kRagged && (n / 3) % 2) ? Layout::kHND : Layout::kNHD;
          c.batch = entry == Entry::kSingle ? 1 : 5 + n % 3;
          c.kv_len = decode ? (n % 2 ? 2049 : 517) : 777;
          c.qo_len = decode ? 1 : (n % 2 ? 129 : 40);
          c.causal = !decode && n % 2 == 0;
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
  }
  // A long decode context (split into many KV tiles) and a long prefill (the 128-row tile).
  AttentionCase long_decode;
  long_decode.decode = true;
  long_decode.entry = Entry::kPaged;
  long_decode.fp8 = Fp8KV::kE4M3;
  long_decode.dtype = DType::kBF16;
  long_decode.batch = 3;
  long_decode.kv_len = 16384;
  long_decode.page_size = 16;
  long_decode.group = 8;
  long_decode.num_kv_heads = 2;
  long_decode.kv_scales = KVScaleMode::kPerHead;
  cases.push_back(long_decode);
  AttentionCase long_prefill = long_decode;
  long_prefill.decode = false;
  long_prefill.entry = Entry::kRagged;
  long_prefill.fp8 = Fp8KV::kE5M2;
  long_prefill.dtype = DType::kF16;
  long_prefill.batch = 2;
  long_prefill.qo_len = 1000;
  long_prefill.kv_len = 3000;
  long_prefill.group = 4;
  long_prefill.causal = true;
  cases.push_back(long_prefill);
  // bf16 queries beyond f16's range either way (the decode tiles run their MMAs in f16 and scale
  // the query tile by a power of two into it), with sm_scale bringing the logits back to O(1):
  // logits of 1e6 would leave the LSE only fp32's absolute accuracy (0.1), whatever the kernel.
  AttentionCase q_big = long_decode;
  q_big.kv_len = 1000;
  q_big.q_stddev = std::ldexp(1.0, 20);
  q_big.sm_scale = std::ldexp(1.0, -23);
  q_big.tag = "_qbig";
  AttentionCase q_tiny = q_big;
  q_tiny.entry = Entry::kSingle;
  q_tiny.batch = 1;
  q_tiny.fp8 = Fp8KV::kE5M2;
  q_tiny.q_stddev = std::ldexp(1.0, -30);
  q_tiny.sm_scale = std::ldexp(1.0, 27);
  q_tiny.tag = "_qtiny";
  cases.push_back(q_big);
  cases.push_back(q_tiny);
  // The same magnitudes through the prefill tiles (a tile that ran its MMAs in f16 would have to
  // rescale the query tile as the decode tiles do; on Hopper this is the wgmma tile).
  AttentionCase q_big_prefill = q_big;
  q_big_prefill.decode = false;
  q_big_prefill.entry = Entry::kRagged;
  q_big_prefill.qo_len = 300;
  q_big_prefill.causal = true;
  q_big_prefill.tag = "_qbig_prefill";
  AttentionCase q_tiny_prefill = q_tiny;
  q_tiny_prefill.decode = false;
  q_tiny_prefill.entry = Entry::kPaged;
  q_tiny_prefill.batch = 2;
  q_tiny_prefill.qo_len = 257;
  q_tiny_prefill.head_dim = 64;
  q_tiny_prefill.tag = "_qtiny_prefill";
  cases.push_back(q_big_prefill);
  cases.push_back(q_tiny_prefill);
  // The CUDA-core decode kernel (8 fp8 elements per thread and row, converted as they are read).
  const Entry cc_entries[] = {Entry::kSingle, Entry::kRagged, Entry::kPaged};
  const int64_t cc_groups[] = {1, 3, 8};
  int m = 0;
  for (int64_t dim : dims) {
    for (Fp8KV fp8 : formats) {
      AttentionCase c;
      c.decode = true;
      c.kernel = DecodeKernel::kCudaCores;
      c.entry = cc_entries[m % 3];
      c.fp8 = fp8;
      c.head_dim = dim;
      c.dtype = m % 2 ? DType::kF16 : DType::kBF16;
      c.kv_scales = modes[m % 3];
      c.group = cc_groups[(m / 2) % 3];
      c.num_kv_heads = 1 + m % 2;
      c.batch = c.entry == Entry::kSingle ? 1 : 3 + m % 3;
      c.kv_len = m % 2 ? 1031 : 260;
      if (c.entry == Entry::kPaged) {
        c.page_size = pages[(m / 3) % 3];  // 1 and 16 (the sanitize case below: 1)
        c.nan_unused = true;
      }
      c.layout = (c.entry != Entry::kRagged && m % 2) ? Layout::kHND : Layout::kNHD;
      c.strided = m % 3 == 2;
      ++m;
      cases.push_back(c);
    }
  }
  AttentionCase cc_sanitize;
  cc_sanitize.decode = true;
  cc_sanitize.kernel = DecodeKernel::kCudaCores;
  cc_sanitize.entry = Entry::kPaged;
  cc_sanitize.fp8 = Fp8KV::kE5M2;
  cc_sanitize.dtype = DType::kBF16;
  cc_sanitize.batch = 4;
  cc_sanitize.kv_len = 45;
  cc_sanitize.page_size = 1;
  cc_sanitize.group = 5;
  cc_sanitize.num_kv_heads = 2;
  cc_sanitize.kv_scales = KVScaleMode::kPerHead;
  cc_sanitize.nan_unused = true;
  cc_sanitize.sanitize = true;
  cases.push_back(cc_sanitize);
  // Variants (JIT-compiled): their hooks see dequantized logits, keys and values, so the tiles
  // hold code x scale (no folded scales). Soft-cap with ALiBi on the per-warp decode tile and a
  // prefill tile; RoPE (a key transform) keeps the CTA-wide dequantization even in decode tiles.
  AttentionCase v1;
  v1.decode = true;
  v1.entry = Entry::kPaged;
  v1.fp8 = Fp8KV::kE4M3;
  v1.dtype = DType::kBF16;
  v1.batch = 4;
  v1.kv_len = 700;
  v1.page_size = 16;
  v1.group = 4;
  v1.num_kv_heads = 2;
  v1.kv_scales = KVScaleMode::kPerHead;
  v1.variant.soft_cap = 30.0;
  v1.variant.alibi = true;
  AttentionCase v2 = v1;
  v2.decode = false;
  v2.entry = Entry::kRagged;
  v2.fp8 = Fp8KV::kE5M2;
  v2.dtype = DType::kF16;
  v2.qo_len = 150;
  v2.causal = true;
  v2.variant = VariantDesc{};
  v2.variant.rope = tessera::PosEncoding::kRopeLlama;
  v2.variant.window_left = 200;
  AttentionCase v3 = v2;
  v3.decode = true;
  v3.entry = Entry::kSingle;
  v3.qo_len = 1;
  v3.causal = false;
  v3.batch = 1;
  // Head dim 256 with a variant: on Hopper its wgmma tile converts in place, code x scale.
  AttentionCase v4 = v2;
  v4.fp8 = Fp8KV::kE4M3;
  v4.dtype = DType::kBF16;
  v4.head_dim = 256;
  v4.qo_len = 200;
  v4.variant = VariantDesc{};
  v4.variant.soft_cap = 30.0;
  cases.push_back(v1);
  cases.push_back(v2);
  cases.push_back(v3);
  cases.push_back(v4);
  // The compute-sanitizer subset: odd lengths, page size 1, NaN page tails, strides.
  AttentionCase s1;
  s1.decode = true;
  s1.entry = Entry::kPaged;
  s1.fp8 = Fp8KV::kE4M3;
  s1.dtype = DType::kBF16;
  s1.batch = 5;
  s1.kv_len = 77;
  s1.page_size = 1;
  s1.group = 5;
  s1.head_dim = 64;
  s1.nan_unused = true;
  s1.kv_scales = KVScaleMode::kPerHead;
  s1.num_kv_heads = 2;
  s1.sanitize = true;
  AttentionCase s2 = s1;
  s2.decode = false;
  s2.entry = Entry::kRagged;
  s2.fp8 = Fp8KV::kE5M2;
  s2.dtype = DType::kF16;
  s2.qo_len = 33;
  s2.kv_len = 150;
  s2.head_dim = 256;
  s2.causal = true;
  s2.strided = true;
  s2.kv_scales = KVScaleMode::kDevice;
  AttentionCase s3 = s1;
  s3.decode = false;
  s3.qo_len = 70;
  s3.page_size = 16;
  s3.head_dim = 128;
  s3.kv_scales = KVScaleMode::kHost;
  cases.push_back(s1);
  cases.push_back(s2);
  cases.push_back(s3);
  return cases;
}

class Fp8KVTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(Fp8KVTest, MatchesOracleOnDequantizedKV) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  run_attention_case(GetParam(), seed);
}

INSTANTIATE_TEST_SUITE_P(Grid, Fp8KVTest, ::testing::ValuesIn(fp8_cases()),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) { return case_name(info.param); });

// ---------------------------------------------------------------------------------------------
// One request (bf16 q, NHD K/V) with its K/V in memory as fp8 codes; helpers for the tests below.

struct DenseFp8 {
  static constexpr int64_t kHq = 8, kHkv = 2, kD = 128;
  int64_t qo_len, kv_len;
  DType kv_dtype;
  std::vector<double> q, k, v;  // q as rounded to bf16; k, v unquantized (N(0, 1))
  DeviceTensor dq, dk, dv, dout, dlse;

  DenseFp8(int64_t qo, int64_t kv, DType fp8, double scale, std::mt19937_64& rng)
      : qo_len(qo), kv_len(kv), kv_dtype(fp8) {
    q = round_to(DType::kBF16, random_normal(qo * kHq * kD, rng));
    k = random_normal(kv * kHkv * kD, rng);
    v = random_normal(kv * kHkv * kD, rng);
    dq = upload_tensor(DType::kBF16, q, {qo, kHq, kD});
    dk = upload_tensor(fp8, divided(k, scale), {kv, kHkv, kD});
    dv = upload_tensor(fp8, divided(v, scale), {kv, kHkv, kD});
    dout = make_output(DType::kBF16, {qo, kHq, kD});
    dlse = make_output(DType::kF32, {qo, kHq});
  }
  static std::vector<double> divided(const std::vector<double>& x, double s) {
    std::vector<double> out(x);
    for (double& e : out) e /= s;
    return out;
  }
  /// What the stored codes stand for with `scale`.
  std::vector<double> dequantized(const std::vector<double>& x, double stored_scale, double scale) const {
    std::vector<double> out = round_to(kv_dtype, divided(x, stored_scale));
    for (double& e : out) e *= scale;
    return out;
  }
  tessera_ref::State oracle(const std::vector<double>& kk, const std::vector<double>& vv) const {
    tessera_ref::Options o;
    return tessera_ref::attention_single(q, kk, vv, qo_len, kv_len, tessera_ref::HeadConfig{kHq, kHkv, kD}, o);
  }
  void run(const tessera::AttentionOptions& opt) {
    tessera::single_prefill(dq.view, dk.view, dv.view, Layout::kNHD, dout.view, dlse.view, opt);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
  }
};

double relative_error(const std::vector<double>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

/// The quantization error itself: outputs of fp8 K/V (scaled so N(0, 1) K/V span the format)
/// against the oracle on the unquantized K/V, printed for the docs; bounded loosely, so that a
/// kernel that ignored the scales or misread the codes fails.
TEST(Fp8KVAccuracy, ErrorAgainstUnquantizedKVIsReported) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType fp8 : {DType::kE4M3, DType::kE5M2}) {
    std::mt19937_64 rng(seed);
    // K/V ~ N(0, 1): a scale of 1/64 puts 4 sigma at 256 (e4m3's range is 448).
    const double scale = 1.0 / 64;
    DenseFp8 t(300, 2000, fp8, scale, rng);
    tessera::AttentionOptions opt;
    opt.kv_scales.k = scale;
    opt.kv_scales.v = scale;
    t.run(opt);
    const std::vector<double> o = read_tensor(t.dout);
    const tessera_ref::State exact = t.oracle(t.k, t.v);
    const tessera_ref::State dequant = t.oracle(t.dequantized(t.k, scale, scale), t.dequantized(t.v, scale, scale));
    const double vs_dequant = relative_error(o, dequant.o), vs_exact = relative_error(o, exact.o);
    std::printf("[fp8 accuracy] %s K/V (per-tensor scale 1/64, N(0,1) K/V, 300 x 2000, D 128, bf16 q/o): "
                "relative error of o against the dequantized K/V %.2e, against the unquantized K/V %.2e\n",
                tessera::dtype_name(fp8), vs_dequant, vs_exact);
    EXPECT_LT(vs_dequant, rel_tolerance(DType::kBF16));
    // e4m3 rounds to 3 mantissa bits (a relative error of up to 2^-4 per element), e5m2 to 2
    // (2^-3); the output's relative error is of that order (a few percent), while ignored or
    // misapplied scales or misread codes give errors of order 1.
    EXPECT_LT(vs_exact, fp8 == DType::kE4M3 ? 0.08 : 0.16);
  }
}

/// Device scales are read when the kernel runs: the same call with new values in the scale
/// tensors gives the output of the new scales (what a replayed CUDA Graph relies on).
TEST(Fp8KVScales, DeviceScalesAreReadAtRunTime) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  DenseFp8 t(20, 300, DType::kE4M3, 1.0 / 64, rng);
  DeviceBuffer k_scale = upload_as(DType::kF32, {1.0 / 64, 1.0 / 32});  // per KV head
  DeviceBuffer v_scale = upload_as(DType::kF32, {1.0 / 64});
  tessera::AttentionOptions opt;
  opt.kv_scales.k_device = make_view(k_scale.get(), DType::kF32, {2}, {1});
  opt.kv_scales.v_device = make_view(v_scale.get(), DType::kF32, {1}, {1});
  const std::vector<double> codes_k = t.dequantized(t.k, 1.0 / 64, 1.0), codes_v = t.dequantized(t.v, 1.0 / 64, 1.0);
  for (const auto& [ks0, ks1, vs] : {std::tuple<double, double, double>{1.0 / 64, 1.0 / 32, 1.0 / 64},
                                     std::tuple<double, double, double>{1.0 / 16, 1.0 / 128, 1.0 / 8}}) {
    k_scale.upload(std::vector<float>{static_cast<float>(ks0), static_cast<float>(ks1)}.data(), 8);
    const float vsf = static_cast<float>(vs);
    v_scale.upload(&vsf, 4);
    t.run(opt);
    std::vector<double> kk = codes_k, vv = codes_v;
    for (size_t i = 0; i < kk.size(); ++i) {
      kk[i] *= (i / DenseFp8::kD) % DenseFp8::kHkv == 0 ? ks0 : ks1;
      vv[i] *= vs;
    }
    const std::vector<double> o = read_tensor(t.dout), lse = read_tensor(t.dlse);
    expect_matches_oracle(DType::kBF16, o, &lse, t.oracle(kk, vv), "device scales " + std::to_string(ks0));
  }
}

// ---------------------------------------------------------------------------------------------
// Errors: scales, dtype pairs, head dims, kernel families.

TEST(Fp8KVErrors, BadScalesAndPairsAreNamed) {
  constexpr int64_t Hq = 8, Hkv = 2, D = 128, L = 64;
  DeviceBuffer buf(8 << 20);
  cudaMemset(buf.get(), 0, buf.bytes());
  auto region = [&](int i) { return static_cast<char*>(buf.get()) + i * (1 << 20); };
  auto t = [&](int i, DType dtype, std::initializer_list<int64_t> shape) {
    return TensorView(region(i), dtype, shape, Device::cuda(0));
  };
  const DType bf = DType::kBF16, e4 = DType::kE4M3;
  const TensorView q = t(0, bf, {Hq, D}), k = t(1, e4, {L, Hkv, D}), v = t(2, e4, {L, Hkv, D});
  const TensorView o = t(3, bf, {Hq, D}), lse = t(4, DType::kF32, {Hq});
  tessera::AttentionOptions ok;
  ok.kv_scales.k = 0.5;
  EXPECT_NO_THROW(tessera::single_decode(q, k, v, Layout::kNHD, o, lse, ok));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  for (double bad : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY), 1e300}) {
    tessera::AttentionOptions opt;
    opt.kv_scales.v = bad;
    expect_error_any([&] { tessera::single_decode(q, k, v, Layout::kNHD, o, lse, opt); }, {"options.kv_scales.v"},
                     StatusCode::kInvalidArgument);
  }
  // A device scale of 3 elements for 2 KV heads; of the wrong dtype.
  tessera::AttentionOptions three;
  three.kv_scales.k_device = t(5, DType::kF32, {3});
  expect_error_any([&] { tessera::single_decode(q, k, v, Layout::kNHD, o, lse, three); },
                   {"options.kv_scales.k_device"}, StatusCode::kInvalidArgument);
  tessera::AttentionOptions wrong_dtype;
  wrong_dtype.kv_scales.v_device = t(5, DType::kBF16, {2});
  expect_error_any([&] { tessera::single_decode(q, k, v, Layout::kNHD, o, lse, wrong_dtype); },
                   {"options.kv_scales.v_device"});
  // Scales with 16-bit K/V.
  expect_error_any([&] {
    tessera::single_decode(q, t(1, bf, {L, Hkv, D}), t(2, bf, {L, Hkv, D}), Layout::kNHD, o, lse, ok);
  }, {"options.kv_scales"}, StatusCode::kInvalidArgument);
  // K and V of different dtypes; f16 K/V under bf16 q; fp8 q.
  expect_error_any([&] { tessera::single_decode(q, k, t(2, DType::kE5M2, {L, Hkv, D}), Layout::kNHD, o, lse); },
                   {"v.dtype", "v"});
  expect_error_any([&] {
    tessera::single_decode(q, t(1, DType::kF16, {L, Hkv, D}), t(2, DType::kF16, {L, Hkv, D}), Layout::kNHD, o, lse);
  }, {"k.dtype", "k"});
  expect_error_any([&] { tessera::single_decode(t(0, e4, {Hq, D}), k, v, Layout::kNHD, t(3, e4, {Hq, D}), lse); },
                   {"q.dtype", "q"});
  // The CUDA-core decode kernel runs the default variant only, fp8 K/V included.
  tessera::AttentionOptions capped = ok;
  capped.variant.logits_soft_cap = 30.0;
  expect_error_any([&] {
    tessera::single_decode(q, k, v, Layout::kNHD, o, lse, capped, nullptr, DecodeKernel::kCudaCores);
  }, {"kCudaCores"}, StatusCode::kUnsupported);
  // Head dim 96 has no fp8 configuration.
  expect_error_any([&] {
    tessera::single_prefill(t(0, bf, {4, Hq, 96}), t(1, e4, {L, Hkv, 96}), t(2, e4, {L, Hkv, 96}), Layout::kNHD,
                            t(3, bf, {4, Hq, 96}), TensorView());
  }, {"head_dim 96"}, StatusCode::kUnsupported);
}

}  // namespace
