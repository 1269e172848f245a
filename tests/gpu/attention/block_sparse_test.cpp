// GPU tests of block_sparse_attention against the fp64 oracle (attention_block_sparse): block
// shapes (Br, Bc) from vector sparsity (1, 1) to (128, 64) and odd ones (7, 3), random sorted block
// subsets with empty block rows, partial last blocks, causal on and off; plus argument errors and
// determinism.
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
using tessera::StatusCode;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

/// A random block set: each column block is listed for a block row with probability `density`
/// (ascending, so strictly increasing); every fifth block row (1, 6, 11, ...) is left empty.
tessera_ref::BlockSparse random_blocks(int64_t br, int64_t bc, int64_t rows, int64_t cols, double density,
                                       std::mt19937_64& rng) {
  tessera_ref::BlockSparse bsr;
  bsr.block_rows = br;
  bsr.block_cols = bc;
  const int64_t row_blocks = (rows + br - 1) / br, col_blocks = (cols + bc - 1) / bc;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  bsr.indptr.push_back(0);
  for (int64_t r = 0; r < row_blocks; ++r) {
    if (r % 5 != 1) {
      for (int64_t c = 0; c < col_blocks; ++c)
        if (u(rng) < density) bsr.indices.push_back(static_cast<int32_t>(c));
    }
    bsr.indptr.push_back(static_cast<int32_t>(bsr.indices.size()));
  }
  return bsr;
}

class BlockSparseTest : public ::testing::TestWithParam<BlockSparseCase> {};

TEST_P(BlockSparseTest, MatchesOracle) {
  const BlockSparseCase c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  const int64_t M = c.rows, N = c.cols, Hq = c.num_qo_heads(), Hkv = c.num_kv_heads, D = c.head_dim;
  const std::string what = block_sparse_case_name(c) + " (seed " + std::to_string(seed) + ")";

  const auto q = round_to(c.dtype, random_normal(M * Hq * D, rng));
  const auto k = round_to(c.dtype, random_normal(N * Hkv * D, rng));
  const auto v = round_to(c.dtype, random_normal(N * Hkv * D, rng));
  const tessera_ref::BlockSparse bsr = random_blocks(c.block_rows, c.block_cols, M, N, c.density, rng);

  const std::vector<int64_t> q_shape = {M, Hq, D}, kv_shape = {N, Hkv, D};
  const std::vector<int64_t> none;
  DeviceTensor dq = upload_tensor(c.dtype, q, q_shape, c.strided ? padded_strides(q_shape, 0, 64) : none);
  DeviceTensor dk = upload_tensor(c.dtype, k, kv_shape, c.strided ? padded_strides(kv_shape, 8, 0) : none);
  DeviceTensor dv = upload_tensor(c.dtype, v, kv_shape, c.strided ? padded_strides(kv_shape, 0, 32) : none);
  DeviceTensor dout = make_output(c.dtype, q_shape, c.strided ? padded_strides(q_shape, 8, 0) : none);
  DeviceTensor dlse;
  TensorView lse_view;
  if (c.with_lse) {
    dlse = make_output(DType::kF32, {M, Hq});
    lse_view = dlse.view;
  }
  DeviceBuffer d_indptr = upload_i32(bsr.indptr), d_indices = upload_i32(bsr.indices);

  tessera::BlockSparse bs;
  bs.block_rows = c.block_rows;
  bs.block_cols = c.block_cols;
  bs.num_rows = M;
  bs.k = dk.view;
  bs.v = dv.view;
  bs.indptr = i32_view(d_indptr, static_cast<int64_t>(bsr.indptr.size()));
  bs.indices = i32_view(d_indices, static_cast<int64_t>(bsr.indices.size()));
  tessera::AttentionOptions opt;
  opt.causal = c.causal;
  tessera::block_sparse_attention(dq.view, bs, dout.view, lse_view, opt);
  ASSERT_CUDA_OK(cudaGetLastError());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  const auto o = read_tensor(dout);
  const auto lse = c.with_lse ? read_tensor(dlse) : std::vector<double>{};
  EXPECT_EQ(padding_changes(dout), 0u) << what << ": elements of o's buffer outside the view were written";

  tessera_ref::Options ropt;
  ropt.causal = c.causal;
  const auto ref = tessera_ref::attention_block_sparse(q, k, v, M, N, bsr, {Hq, Hkv, D}, ropt);
  expect_matches_oracle(c.dtype, o, c.with_lse ? &lse : nullptr, ref, what);
}

INSTANTIATE_TEST_SUITE_P(Grid, BlockSparseTest, ::testing::ValuesIn(block_sparse_cases()),
                         [](const ::testing::TestParamInfo<BlockSparseCase>& info) {
                           return block_sparse_case_name(info.param);
                         });

// ---------------------------------------------------------------------------------------------
// Argument errors.

TEST(BlockSparseErrors, BadArgumentsAreNamed) {
  constexpr size_t kRegion = 2 << 20;
  DeviceBuffer buf(8 * kRegion);
  cudaMemset(buf.get(), 0, buf.bytes());
  auto t = [&](int i, DType dtype, std::initializer_list<int64_t> shape) {
    return TensorView(static_cast<char*>(buf.get()) + i * kRegion, dtype, shape, Device::cuda(0));
  };
  const DType bf = DType::kBF16;
  constexpr int64_t M = 64, N = 128, Hq = 8, Hkv = 2, D = 128;
  // Br = Bc = 16: 4 block rows, each seeing column blocks 0 and 3.
  DeviceBuffer indptr = upload_i32({0, 2, 4, 6, 8}), indices = upload_i32({0, 3, 0, 3, 0, 3, 0, 3});
  auto blocks = [&](int64_t hkv, int64_t d) {
    tessera::BlockSparse bs;
    bs.block_rows = 16;
    bs.block_cols = 16;
    bs.num_rows = M;
    bs.k = t(1, bf, {N, hkv, d});
    bs.v = t(2, bf, {N, hkv, d});
    bs.indptr = i32_view(indptr, 5);
    bs.indices = i32_view(indices, 8);
    return bs;
  };
  const TensorView q = t(0, bf, {M, Hq, D}), o = t(3, bf, {M, Hq, D}), lse = t(4, DType::kF32, {M, Hq});
  EXPECT_NO_THROW(tessera::block_sparse_attention(q, blocks(Hkv, D), o, lse));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  expect_error_any([&] {
    tessera::block_sparse_attention(t(0, bf, {M, Hq, 80}), blocks(Hkv, 80), t(3, bf, {M, Hq, 80}), lse);
  }, {"head_dim"}, StatusCode::kUnsupported);
  expect_error_any([&] {
    tessera::block_sparse_attention(t(0, bf, {M, 6, D}), blocks(4, D), t(3, bf, {M, 6, D}), t(4, DType::kF32, {M, 6}));
  }, {"num_qo_heads", "num_kv_heads"}, StatusCode::kInvalidArgument);
  expect_error_any([&] { tessera::block_sparse_attention(t(0, DType::kF32, {M, Hq, D}), blocks(Hkv, D), o, lse); },
                   {"q.dtype", "dtype of q"});
  expect_error_any([&] { tessera::block_sparse_attention(q, blocks(Hkv, D), t(3, bf, {M, Hq, 64}), lse); },
                   {"o.shape"});
  expect_error_any([&] { tessera::block_sparse_attention(q, blocks(Hkv, D), o, t(4, DType::kF32, {M - 1, Hq})); },
                   {"lse.shape"});
  // q has M + 16 rows but the block structure describes M.
  expect_error_any([&] {
    tessera::block_sparse_attention(t(0, bf, {M + 16, Hq, D}), blocks(Hkv, D), t(3, bf, {M + 16, Hq, D}),
                                    t(4, DType::kF32, {M + 16, Hq}));
  }, {"q.shape[0]", "num_rows"});
}

// ---------------------------------------------------------------------------------------------
// Determinism.

TEST(BlockSparseDeterminism, RepeatedCallsAreBitIdentical) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const DType dtype = DType::kBF16;
  const int64_t M = 300, N = 1000, Hkv = 2, Hq = 8, D = 128;
  const auto bsr = random_blocks(64, 16, M, N, 0.4, rng);
  DeviceTensor q = upload_tensor(dtype, round_to(dtype, random_normal(M * Hq * D, rng)), {M, Hq, D});
  DeviceTensor k = upload_tensor(dtype, round_to(dtype, random_normal(N * Hkv * D, rng)), {N, Hkv, D});
  DeviceTensor v = upload_tensor(dtype, round_to(dtype, random_normal(N * Hkv * D, rng)), {N, Hkv, D});
  DeviceBuffer d_indptr = upload_i32(bsr.indptr), d_indices = upload_i32(bsr.indices);
  tessera::BlockSparse bs;
  bs.block_rows = 64;
  bs.block_cols = 16;
  bs.num_rows = M;
  bs.k = k.view;
  bs.v = v.view;
  bs.indptr = i32_view(d_indptr, static_cast<int64_t>(bsr.indptr.size()));
  bs.indices = i32_view(d_indices, static_cast<int64_t>(bsr.indices.size()));
  DeviceTensor o = make_output(dtype, {M, Hq, D});
  DeviceTensor lse = make_output(DType::kF32, {M, Hq});
  tessera::AttentionOptions opt;
  opt.causal = true;

  std::vector<unsigned char> first_o, first_lse;
  for (int run = 0; run < 2; ++run) {
    o.buf.poison();
    lse.buf.poison();
    tessera::block_sparse_attention(q.view, bs, o.view, lse.view, opt);
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
