// GPU tests of the decode entry points (single_decode, batch_decode_paged, batch_decode_ragged)
// against the fp64 oracle, with each kernel family (CUDA cores, tensor cores, auto) for every group
// size; plus argument errors and determinism. The case grid and the runner live in
// attention_test_utils.cpp.
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

using tessera::DecodeKernel;
using tessera::Device;
using tessera::DType;
using tessera::Layout;
using tessera::StatusCode;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

class DecodeTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(DecodeTest, MatchesOracle) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  run_attention_case(GetParam(), seed);
}

INSTANTIATE_TEST_SUITE_P(Grid, DecodeTest, ::testing::ValuesIn(decode_cases()),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) { return case_name(info.param); });

// ---------------------------------------------------------------------------------------------
// Argument errors. Views point into one zeroed buffer, so a call that wrongly passes validation
// reads zeros instead of faulting.

struct ErrorFixture {
  static constexpr int64_t kB = 4, kHq = 8, kHkv = 2, kD = 128, kLen = 64, kPageSize = 16;
  static constexpr size_t kRegion = 2 << 20;  // bytes per tensor

  DeviceBuffer buf{8 * kRegion};
  DeviceBuffer indptr = upload_i32({0, 4, 8, 12, 16});
  DeviceBuffer indptr_long = upload_i32({0, 4, 8, 12, 16, 16});
  DeviceBuffer pages = upload_i32({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  DeviceBuffer last = upload_i32({16, 16, 16, 16});

  ErrorFixture() { cudaMemset(buf.get(), 0, buf.bytes()); }
  char* region(int i) const { return static_cast<char*>(buf.get()) + i * kRegion; }
  TensorView t(int i, DType dtype, std::initializer_list<int64_t> shape) const {
    return TensorView(region(i), dtype, shape, Device::cuda(0));
  }
  tessera::PagedKV paged(int64_t hkv, int64_t d) const {
    tessera::PagedKV kv;
    kv.k = t(1, DType::kBF16, {16, kPageSize, hkv, d});
    kv.v = t(2, DType::kBF16, {16, kPageSize, hkv, d});
    kv.layout = Layout::kNHD;
    kv.indptr = i32_view(indptr, kB + 1);
    kv.indices = i32_view(pages, 16);
    kv.last_page_len = i32_view(last, kB);
    return kv;
  }
};

TEST(DecodeErrors, SingleDecodeNamesTheArgument) {
  ErrorFixture f;
  const DType bf = DType::kBF16;
  constexpr int64_t Hq = ErrorFixture::kHq, Hkv = ErrorFixture::kHkv, D = ErrorFixture::kD, L = ErrorFixture::kLen;
  const TensorView q = f.t(0, bf, {Hq, D}), k = f.t(1, bf, {L, Hkv, D}), v = f.t(2, bf, {L, Hkv, D});
  const TensorView o = f.t(3, bf, {Hq, D}), lse = f.t(4, DType::kF32, {Hq});
  EXPECT_NO_THROW(tessera::single_decode(q, k, v, Layout::kNHD, o, lse));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  expect_error_any([&] {
    tessera::single_decode(f.t(0, bf, {Hq, 80}), f.t(1, bf, {L, Hkv, 80}), f.t(2, bf, {L, Hkv, 80}), Layout::kNHD,
                           f.t(3, bf, {Hq, 80}), lse);
  }, {"head_dim"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::single_decode(f.t(0, bf, {6, D}), f.t(1, bf, {L, 4, D}), f.t(2, bf, {L, 4, D}), Layout::kNHD,
                           f.t(3, bf, {6, D}), f.t(4, DType::kF32, {6}));
  }, {"num_qo_heads", "num_kv_heads"}, StatusCode::kInvalidArgument);
  expect_error_any([&] { tessera::single_decode(f.t(0, DType::kF32, {Hq, D}), k, v, Layout::kNHD, o, lse); },
                   {"q.dtype", "dtype of q"});
  expect_error_any([&] { tessera::single_decode(q, k, v, Layout::kNHD, f.t(3, bf, {Hq, 64}), lse); }, {"o.shape"});
  expect_error_any([&] { tessera::single_decode(q, k, v, Layout::kNHD, o, f.t(4, DType::kF32, {Hq + 1})); },
                   {"lse.shape"});
  for (DecodeKernel kernel : {DecodeKernel::kCudaCores, DecodeKernel::kTensorCores}) {
    expect_error_any([&] {
      tessera::single_decode(f.t(0, bf, {Hq, 80}), f.t(1, bf, {L, Hkv, 80}), f.t(2, bf, {L, Hkv, 80}), Layout::kNHD,
                             f.t(3, bf, {Hq, 80}), lse, {}, nullptr, kernel);
    }, {"head_dim"}, StatusCode::kUnsupported);
  }
}

TEST(DecodeErrors, BatchDecodePagedNamesTheArgument) {
  ErrorFixture f;
  const DType bf = DType::kBF16;
  constexpr int64_t B = ErrorFixture::kB, Hq = ErrorFixture::kHq, Hkv = ErrorFixture::kHkv, D = ErrorFixture::kD;
  const TensorView q = f.t(0, bf, {B, Hq, D}), o = f.t(3, bf, {B, Hq, D}), lse = f.t(4, DType::kF32, {B, Hq});
  const tessera::PagedKV kv = f.paged(Hkv, D);
  EXPECT_NO_THROW(tessera::batch_decode_paged(q, kv, o, lse));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  expect_error_any([&] {
    tessera::batch_decode_paged(f.t(0, bf, {B, Hq, 80}), f.paged(Hkv, 80), f.t(3, bf, {B, Hq, 80}), lse);
  }, {"head_dim"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::batch_decode_paged(f.t(0, bf, {B, 6, D}), f.paged(4, D), f.t(3, bf, {B, 6, D}),
                                f.t(4, DType::kF32, {B, 6}));
  }, {"num_qo_heads", "num_kv_heads"}, StatusCode::kInvalidArgument);
  expect_error_any([&] { tessera::batch_decode_paged(f.t(0, DType::kF32, {B, Hq, D}), kv, o, lse); },
                   {"q.dtype", "dtype of q"});
  expect_error_any([&] { tessera::batch_decode_paged(q, kv, f.t(3, bf, {B, Hq + 1, D}), lse); }, {"o.shape"});
  expect_error_any([&] { tessera::batch_decode_paged(q, kv, o, f.t(4, DType::kF32, {B, Hq + 1})); }, {"lse.shape"});
  // One query row per request: B + 1 rows for B requests.
  expect_error_any([&] {
    tessera::batch_decode_paged(f.t(0, bf, {B + 1, Hq, D}), kv, f.t(3, bf, {B + 1, Hq, D}),
                                f.t(4, DType::kF32, {B + 1, Hq}));
  }, {"q.shape[0]", "indptr"});
}

TEST(DecodeErrors, BatchDecodeRaggedNamesTheArgument) {
  ErrorFixture f;
  const DType bf = DType::kBF16;
  constexpr int64_t B = ErrorFixture::kB, Hq = ErrorFixture::kHq, Hkv = ErrorFixture::kHkv, D = ErrorFixture::kD;
  const TensorView q = f.t(0, bf, {B, Hq, D}), k = f.t(1, bf, {16, Hkv, D}), v = f.t(2, bf, {16, Hkv, D});
  const TensorView o = f.t(3, bf, {B, Hq, D}), lse = f.t(4, DType::kF32, {B, Hq});
  const TensorView kv_indptr = i32_view(f.indptr, B + 1);
  EXPECT_NO_THROW(tessera::batch_decode_ragged(q, k, v, kv_indptr, o, lse));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  expect_error_any([&] {
    tessera::batch_decode_ragged(f.t(0, bf, {B, Hq, 80}), f.t(1, bf, {16, Hkv, 80}), f.t(2, bf, {16, Hkv, 80}),
                                 kv_indptr, f.t(3, bf, {B, Hq, 80}), lse);
  }, {"head_dim"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::batch_decode_ragged(f.t(0, bf, {B, 6, D}), f.t(1, bf, {16, 4, D}), f.t(2, bf, {16, 4, D}), kv_indptr,
                                 f.t(3, bf, {B, 6, D}), f.t(4, DType::kF32, {B, 6}));
  }, {"num_qo_heads", "num_kv_heads"}, StatusCode::kInvalidArgument);
  expect_error_any([&] { tessera::batch_decode_ragged(f.t(0, DType::kF32, {B, Hq, D}), k, v, kv_indptr, o, lse); },
                   {"q.dtype", "dtype of q"});
  expect_error_any([&] { tessera::batch_decode_ragged(q, k, v, kv_indptr, f.t(3, bf, {B - 1, Hq, D}), lse); },
                   {"o.shape"});
  expect_error_any([&] { tessera::batch_decode_ragged(q, k, v, kv_indptr, o, f.t(4, DType::kF32, {B, Hq - 1})); },
                   {"lse.shape"});
  expect_error_any([&] { tessera::batch_decode_ragged(q, k, v, i32_view(f.indptr_long, B + 2), o, lse); },
                   {"kv_indptr"});
}

// ---------------------------------------------------------------------------------------------
// Determinism: the same call twice gives bit-identical o and lse, for each kernel family.

TEST(DecodeDeterminism, RepeatedCallsAreBitIdentical) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const DType dtype = DType::kBF16;
  const int64_t B = 7, Hkv = 2, group = 4, Hq = Hkv * group, D = 128, page_size = 16;
  std::vector<int64_t> kv_lens = {2049, 0, 1, 700, 1500, 33, 16};
  std::vector<std::vector<double>> k(B), v(B);
  for (int64_t b = 0; b < B; ++b) {
    k[b] = round_to(dtype, random_normal(kv_lens[b] * Hkv * D, rng));
    v[b] = round_to(dtype, random_normal(kv_lens[b] * Hkv * D, rng));
  }
  const auto cache = tessera_ref::build_paged(k, v, kv_lens, Hkv, D, page_size, tessera_ref::Layout::NHD, seed | 1, 2);
  DevicePaged paged = upload_paged(dtype, cache, Layout::kNHD, false);
  DeviceTensor q = upload_tensor(dtype, round_to(dtype, random_normal(B * Hq * D, rng)), {B, Hq, D});
  DeviceTensor o = make_output(dtype, {B, Hq, D});
  DeviceTensor lse = make_output(DType::kF32, {B, Hq});

  for (DecodeKernel kernel : {DecodeKernel::kCudaCores, DecodeKernel::kTensorCores, DecodeKernel::kAuto}) {
    SCOPED_TRACE("kernel " + std::to_string(static_cast<int>(kernel)));
    std::vector<unsigned char> first_o, first_lse;
    for (int run = 0; run < 2; ++run) {
      o.buf.poison();
      lse.buf.poison();
      tessera::batch_decode_paged(q.view, paged.view, o.view, lse.view, {}, nullptr, kernel);
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      if (run == 0) {
        first_o = read_bytes(o);
        first_lse = read_bytes(lse);
        const auto values = read_tensor(o);
        for (double x : values) ASSERT_FALSE(std::isnan(x)) << "o left unwritten (NaN)";
      } else {
        EXPECT_TRUE(read_bytes(o) == first_o) << "o differs between two identical calls";
        EXPECT_TRUE(read_bytes(lse) == first_lse) << "lse differs between two identical calls";
      }
    }
  }
}

}  // namespace
