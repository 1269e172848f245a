// GPU tests of the prefill / append entry points (single_prefill, batch_prefill_ragged,
// batch_prefill_paged) against the fp64 oracle; plus argument errors and determinism. The case
// grid and the runner live in attention_test_utils.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "reference/oracle.h"
#include "tessera/attention.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::Layout;
using tessera::StatusCode;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

class PrefillTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(PrefillTest, MatchesOracle) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  run_attention_case(GetParam(), seed);
}

INSTANTIATE_TEST_SUITE_P(Grid, PrefillTest, ::testing::ValuesIn(prefill_cases()),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(SplitHeadDims, PrefillTest, ::testing::ValuesIn(split_head_dim_prefill_cases()),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) { return case_name(info.param); });

// ---------------------------------------------------------------------------------------------
// Argument errors. Views point into one zeroed buffer, so a call that wrongly passes validation
// reads zeros instead of faulting.

struct PrefillErrorFixture {
  static constexpr int64_t kB = 4, kQ = 16, kHq = 8, kHkv = 2, kD = 128, kLen = 64, kPageSize = 16;
  static constexpr size_t kRegion = 2 << 20;  // bytes per tensor

  DeviceBuffer buf{8 * kRegion};
  DeviceBuffer qo_indptr = upload_i32({0, 4, 8, 12, 16});
  DeviceBuffer qo_indptr_long = upload_i32({0, 4, 8, 12, 16, 16});
  DeviceBuffer kv_indptr = upload_i32({0, 16, 32, 48, 64});
  DeviceBuffer page_indptr = upload_i32({0, 1, 2, 3, 4});
  DeviceBuffer pages = upload_i32({3, 1, 0, 2});
  DeviceBuffer last = upload_i32({16, 16, 16, 16});

  PrefillErrorFixture() { cudaMemset(buf.get(), 0, buf.bytes()); }
  TensorView t(int i, DType dtype, std::initializer_list<int64_t> shape) const {
    return TensorView(static_cast<char*>(buf.get()) + i * kRegion, dtype, shape, Device::cuda(0));
  }
  TensorView qo() const { return i32_view(qo_indptr, kB + 1); }
  TensorView qo_long() const { return i32_view(qo_indptr_long, kB + 2); }
  TensorView kv() const { return i32_view(kv_indptr, kB + 1); }
  tessera::PagedKV paged(int64_t hkv, int64_t d) const {
    tessera::PagedKV kv;
    kv.k = t(1, DType::kBF16, {4, kPageSize, hkv, d});
    kv.v = t(2, DType::kBF16, {4, kPageSize, hkv, d});
    kv.layout = Layout::kNHD;
    kv.indptr = i32_view(page_indptr, kB + 1);
    kv.indices = i32_view(pages, 4);
    kv.last_page_len = i32_view(last, kB);
    return kv;
  }
};

TEST(PrefillErrors, SinglePrefillNamesTheArgument) {
  PrefillErrorFixture f;
  const DType bf = DType::kBF16;
  constexpr int64_t Q = PrefillErrorFixture::kQ, Hq = PrefillErrorFixture::kHq, Hkv = PrefillErrorFixture::kHkv,
                    D = PrefillErrorFixture::kD, L = PrefillErrorFixture::kLen;
  const TensorView q = f.t(0, bf, {Q, Hq, D}), k = f.t(1, bf, {L, Hkv, D}), v = f.t(2, bf, {L, Hkv, D});
  const TensorView o = f.t(3, bf, {Q, Hq, D}), lse = f.t(4, DType::kF32, {Q, Hq});
  EXPECT_NO_THROW(tessera::single_prefill(q, k, v, Layout::kNHD, o, lse));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  expect_error_any([&] {
    tessera::single_prefill(f.t(0, bf, {Q, Hq, 80}), f.t(1, bf, {L, Hkv, 80}), f.t(2, bf, {L, Hkv, 80}), Layout::kNHD,
                            f.t(3, bf, {Q, Hq, 80}), lse);
  }, {"head_dim"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::single_prefill(f.t(0, bf, {Q, 6, D}), f.t(1, bf, {L, 4, D}), f.t(2, bf, {L, 4, D}), Layout::kNHD,
                            f.t(3, bf, {Q, 6, D}), f.t(4, DType::kF32, {Q, 6}));
  }, {"num_qo_heads", "num_kv_heads"}, StatusCode::kInvalidArgument);
  expect_error_any([&] { tessera::single_prefill(f.t(0, DType::kF32, {Q, Hq, D}), k, v, Layout::kNHD, o, lse); },
                   {"q.dtype", "dtype of q"});
  expect_error_any([&] { tessera::single_prefill(q, k, v, Layout::kNHD, f.t(3, bf, {Q - 1, Hq, D}), lse); },
                   {"o.shape"});
  expect_error_any([&] { tessera::single_prefill(q, k, v, Layout::kNHD, o, f.t(4, DType::kF32, {Q, Hq + 1})); },
                   {"lse.shape"});
}

TEST(PrefillErrors, BatchPrefillRaggedNamesTheArgument) {
  PrefillErrorFixture f;
  const DType bf = DType::kBF16;
  constexpr int64_t Q = PrefillErrorFixture::kQ, Hq = PrefillErrorFixture::kHq, Hkv = PrefillErrorFixture::kHkv,
                    D = PrefillErrorFixture::kD, L = PrefillErrorFixture::kLen;
  const TensorView q = f.t(0, bf, {Q, Hq, D}), k = f.t(1, bf, {L, Hkv, D}), v = f.t(2, bf, {L, Hkv, D});
  const TensorView o = f.t(3, bf, {Q, Hq, D}), lse = f.t(4, DType::kF32, {Q, Hq});
  EXPECT_NO_THROW(tessera::batch_prefill_ragged(q, f.qo(), 4, k, v, f.kv(), o, lse));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  expect_error_any([&] {
    tessera::batch_prefill_ragged(f.t(0, bf, {Q, Hq, 80}), f.qo(), 4, f.t(1, bf, {L, Hkv, 80}),
                                  f.t(2, bf, {L, Hkv, 80}), f.kv(), f.t(3, bf, {Q, Hq, 80}), lse);
  }, {"head_dim"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::batch_prefill_ragged(f.t(0, bf, {Q, 6, D}), f.qo(), 4, f.t(1, bf, {L, 4, D}), f.t(2, bf, {L, 4, D}),
                                  f.kv(), f.t(3, bf, {Q, 6, D}), f.t(4, DType::kF32, {Q, 6}));
  }, {"num_qo_heads", "num_kv_heads"}, StatusCode::kInvalidArgument);
  expect_error_any([&] {
    tessera::batch_prefill_ragged(f.t(0, DType::kF32, {Q, Hq, D}), f.qo(), 4, k, v, f.kv(), o, lse);
  }, {"q.dtype", "dtype of q"});
  expect_error_any([&] {
    tessera::batch_prefill_ragged(q, f.qo(), 4, k, v, f.kv(), f.t(3, bf, {Q, Hq, 64}), lse);
  }, {"o.shape"});
  expect_error_any([&] {
    tessera::batch_prefill_ragged(q, f.qo(), 4, k, v, f.kv(), o, f.t(4, DType::kF32, {Q + 1, Hq}));
  }, {"lse.shape"});
  // qo_indptr describes 5 requests, kv_indptr 4: either may be blamed. Then a qo_indptr that is
  // wrong on its own (f32).
  expect_error_any([&] { tessera::batch_prefill_ragged(q, f.qo_long(), 4, k, v, f.kv(), o, lse); },
                   {"qo_indptr", "kv_indptr"});
  expect_error_any([&] {
    tessera::batch_prefill_ragged(q, TensorView(f.qo_indptr.get(), DType::kF32, {5}, Device::cuda(0)), 4, k, v,
                                  f.kv(), o, lse);
  }, {"qo_indptr"});
}

TEST(PrefillErrors, BatchPrefillPagedNamesTheArgument) {
  PrefillErrorFixture f;
  const DType bf = DType::kBF16;
  constexpr int64_t Q = PrefillErrorFixture::kQ, Hq = PrefillErrorFixture::kHq, Hkv = PrefillErrorFixture::kHkv,
                    D = PrefillErrorFixture::kD;
  const TensorView q = f.t(0, bf, {Q, Hq, D}), o = f.t(3, bf, {Q, Hq, D}), lse = f.t(4, DType::kF32, {Q, Hq});
  const tessera::PagedKV kv = f.paged(Hkv, D);
  EXPECT_NO_THROW(tessera::batch_prefill_paged(q, f.qo(), 4, kv, o, lse));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  expect_error_any([&] {
    tessera::batch_prefill_paged(f.t(0, bf, {Q, Hq, 80}), f.qo(), 4, f.paged(Hkv, 80), f.t(3, bf, {Q, Hq, 80}), lse);
  }, {"head_dim"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::batch_prefill_paged(f.t(0, bf, {Q, 6, D}), f.qo(), 4, f.paged(4, D), f.t(3, bf, {Q, 6, D}),
                                 f.t(4, DType::kF32, {Q, 6}));
  }, {"num_qo_heads", "num_kv_heads"}, StatusCode::kInvalidArgument);
  expect_error_any([&] { tessera::batch_prefill_paged(f.t(0, DType::kF32, {Q, Hq, D}), f.qo(), 4, kv, o, lse); },
                   {"q.dtype", "dtype of q"});
  expect_error_any([&] { tessera::batch_prefill_paged(q, f.qo(), 4, kv, f.t(3, bf, {Q, Hq - 1, D}), lse); },
                   {"o.shape"});
  expect_error_any([&] { tessera::batch_prefill_paged(q, f.qo(), 4, kv, o, f.t(4, DType::kF32, {Q})); },
                   {"lse.shape", "lse.ndim"});
  expect_error_any([&] { tessera::batch_prefill_paged(q, f.qo_long(), 4, kv, o, lse); },
                   {"qo_indptr", "paged_kv.indptr", "kv.indptr"});
  expect_error_any([&] {
    tessera::batch_prefill_paged(q, TensorView(f.qo_indptr.get(), DType::kF32, {5}, Device::cuda(0)), 4, kv, o, lse);
  }, {"qo_indptr"});
}

TEST(PrefillErrors, SplitHeadDimsNameTheArgument) {
  PrefillErrorFixture f;
  const DType bf = DType::kBF16;
  constexpr int64_t Q = PrefillErrorFixture::kQ, Hq = PrefillErrorFixture::kHq, Hkv = PrefillErrorFixture::kHkv,
                    L = PrefillErrorFixture::kLen;
  const TensorView q = f.t(0, bf, {Q, Hq, 192}), k = f.t(1, bf, {L, Hkv, 192}), v = f.t(2, bf, {L, Hkv, 128});
  const TensorView o = f.t(3, bf, {Q, Hq, 128}), lse = f.t(4, DType::kF32, {Q, Hq});
  EXPECT_NO_THROW(tessera::batch_prefill_ragged(q, f.qo(), 4, k, v, f.kv(), o, lse));
  EXPECT_NO_THROW(tessera::single_prefill(q, k, v, Layout::kNHD, o, lse));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  // A pair the table does not build, named by v's head dim.
  expect_error_any([&] {
    tessera::batch_prefill_ragged(q, f.qo(), 4, k, f.t(2, bf, {L, Hkv, 64}), f.kv(), f.t(3, bf, {Q, Hq, 64}), lse);
  }, {"v.shape[-1] = 64"}, StatusCode::kUnsupported);
  // o takes V's head dim.
  expect_error_any([&] { tessera::batch_prefill_ragged(q, f.qo(), 4, k, v, f.kv(), f.t(3, bf, {Q, Hq, 192}), lse); },
                   {"o.shape"}, StatusCode::kInvalidArgument);
  // Decode and block-sparse attention take equal head dims only.
  expect_error_any([&] {
    tessera::batch_decode_ragged(f.t(0, bf, {4, Hq, 128}), f.t(1, bf, {L, Hkv, 128}), f.t(2, bf, {L, Hkv, 64}),
                                 f.kv(), f.t(3, bf, {4, Hq, 128}), f.t(4, DType::kF32, {4, Hq}));
  }, {"v.shape"}, StatusCode::kInvalidArgument);
  // Variants and fp8 K/V are not built for split head dims.
  tessera::AttentionOptions window;
  window.variant.window_left = 16;
  expect_error_any([&] { tessera::single_prefill(q, k, v, Layout::kNHD, o, lse, window); },
                   {"options.variant"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::single_prefill(q, f.t(1, DType::kE4M3, {L, Hkv, 192}), f.t(2, DType::kE4M3, {L, Hkv, 128}),
                            Layout::kNHD, o, lse);
  }, {"k.dtype"}, StatusCode::kUnsupported);
  // Paged: V pages of the narrower head dim.
  tessera::PagedKV kv = f.paged(Hkv, 192);
  kv.v = f.t(2, bf, {4, PrefillErrorFixture::kPageSize, Hkv, 128});
  EXPECT_NO_THROW(tessera::batch_prefill_paged(q, f.qo(), 4, kv, o, lse));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  kv.v = f.t(2, bf, {4, PrefillErrorFixture::kPageSize, Hkv, 96});
  expect_error_any([&] { tessera::batch_prefill_paged(q, f.qo(), 4, kv, f.t(3, bf, {Q, Hq, 96}), lse); },
                   {"paged_kv.v.shape[-1] = 96"}, StatusCode::kUnsupported);
}

// ---------------------------------------------------------------------------------------------
// Determinism: the same call twice gives bit-identical o and lse.

TEST(PrefillDeterminism, RepeatedCallsAreBitIdentical) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const DType dtype = DType::kF16;
  const int64_t B = 7, Hkv = 2, group = 5, Hq = Hkv * group, D = 128, page_size = 16;
  const std::vector<int64_t> qo_lens = {128, 0, 1, 77, 128, 17, 3}, kv_lens = {2049, 0, 1, 700, 1500, 33, 16};
  std::vector<int32_t> qo_indptr = {0};
  for (int64_t n : qo_lens) qo_indptr.push_back(qo_indptr.back() + static_cast<int32_t>(n));
  const int64_t total_q = qo_indptr.back();
  std::vector<std::vector<double>> k(B), v(B);
  for (int64_t b = 0; b < B; ++b) {
    k[b] = round_to(dtype, random_normal(kv_lens[b] * Hkv * D, rng));
    v[b] = round_to(dtype, random_normal(kv_lens[b] * Hkv * D, rng));
  }
  const auto cache = tessera_ref::build_paged(k, v, kv_lens, Hkv, D, page_size, tessera_ref::Layout::HND, seed | 1, 2);
  DevicePaged paged = upload_paged(dtype, cache, Layout::kHND, true);
  DeviceTensor q = upload_tensor(dtype, round_to(dtype, random_normal(total_q * Hq * D, rng)), {total_q, Hq, D});
  DeviceBuffer d_qo_indptr = upload_i32(qo_indptr);
  DeviceTensor o = make_output(dtype, {total_q, Hq, D});
  DeviceTensor lse = make_output(DType::kF32, {total_q, Hq});
  tessera::AttentionOptions opt;
  opt.causal = true;

  std::vector<unsigned char> first_o, first_lse;
  for (int run = 0; run < 2; ++run) {
    o.buf.poison();
    lse.buf.poison();
    tessera::batch_prefill_paged(q.view, i32_view(d_qo_indptr, B + 1), 128, paged.view, o.view, lse.view, opt);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    if (run == 0) {
      first_o = read_bytes(o);
      first_lse = read_bytes(lse);
      for (double x : read_tensor(o)) ASSERT_FALSE(std::isnan(x)) << "o left unwritten (NaN)";
    } else {
      EXPECT_TRUE(read_bytes(o) == first_o) << "o differs between two identical calls";
      EXPECT_TRUE(read_bytes(lse) == first_lse) << "lse differs between two identical calls";
    }
  }
}

}  // namespace
