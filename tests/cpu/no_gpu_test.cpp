// Every GPU entry point of the public API on a machine without a usable GPU (no NVIDIA driver, or
// a driver and no device): the error says what is missing and what to do ("no CUDA driver: ..." /
// "no CUDA device: ...") instead of a bare CUDA error name. Skipped where a GPU is visible: the
// GPU suites run there.
//
// The arguments are valid except that their device memory does not exist: every call must fail on
// the first CUDA call, before any kernel could touch that memory. The test links the shared library
// and uses only the public API, as a user's program does.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "tessera/runtime.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

class NoGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_unavailable_reason().empty()) GTEST_SKIP() << "a CUDA device is visible: the GPU suites cover it";
  }
};

/// Device memory that is never dereferenced (256-byte aligned, as the kernels require).
void* const kNowhere = reinterpret_cast<void*>(uintptr_t{1} << 40);

TensorView device(DType dtype, std::initializer_list<int64_t> shape) {
  return TensorView(kNowhere, dtype, shape, Device::cuda(0));
}

/// The call throws kCudaError whose message starts by naming what is missing and says what to do.
template <typename F>
::testing::AssertionResult FailsForWantOfAGpu(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    if (e.code() != StatusCode::kCudaError) {
      return ::testing::AssertionFailure() << "code " << status_code_name(e.code()) << ": " << message;
    }
    const bool names_what_is_missing =
        message.rfind("no CUDA driver: ", 0) == 0 || message.rfind("no CUDA device: ", 0) == 0;
    if (!names_what_is_missing || message.find("nvidia-smi") == std::string::npos) {
      return ::testing::AssertionFailure() << "unclear message: " << message;
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

TEST_F(NoGpu, ReasonIsReported) {
  const std::string reason = cuda_unavailable_reason();
  EXPECT_TRUE(reason.rfind("no CUDA driver: ", 0) == 0 || reason.rfind("no CUDA device: ", 0) == 0) << reason;
  EXPECT_NE(reason.find("cudaGetDeviceCount"), std::string::npos) << reason;
}

TEST_F(NoGpu, Merge) {
  const TensorView v = device(DType::kF16, {4, 2, 64});
  const TensorView s = device(DType::kF32, {4, 2});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { merge_state(v, s, v, s, v, TensorView{}); }));
  const TensorView vs = device(DType::kF16, {4, 3, 2, 64});
  const TensorView ss = device(DType::kF32, {4, 3, 2});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { merge_states(vs, ss, v, s); }));
  const TensorView packed_v = device(DType::kF16, {6, 2, 64});
  const TensorView packed_s = device(DType::kF32, {6, 2});
  const TensorView indptr = device(DType::kI32, {5});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { merge_states_ragged(packed_v, packed_s, indptr, v, s); }));
}

PagedKV paged_cache(DType dtype, int64_t head_dim) {
  PagedKV kv;
  kv.layout = Layout::kNHD;
  kv.k = device(dtype, {8, 16, 2, head_dim});
  kv.v = kv.k;
  kv.indptr = device(DType::kI32, {3});
  kv.indices = device(DType::kI32, {4});
  kv.last_page_len = device(DType::kI32, {2});
  return kv;
}

TEST_F(NoGpu, Append) {
  const PagedKV cache = paged_cache(DType::kF16, 64);
  const TensorView rows = device(DType::kF16, {5, 2, 64});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { append_paged_kv_cache(rows, rows, device(DType::kI32, {3}), cache); }));
  const TensorView per_row = device(DType::kI32, {5});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { append_paged_kv_cache_at(rows, rows, per_row, per_row, cache); }));
  // MLA latent rows (DeepSeek's widths) into 8 pages of 16 slots, 2 requests.
  const TensorView ckv = device(DType::kBF16, {5, 512}), kpe = device(DType::kBF16, {5, 64});
  const TensorView ckv_cache = device(DType::kBF16, {8, 16, 512}), kpe_cache = device(DType::kBF16, {8, 16, 64});
  EXPECT_TRUE(FailsForWantOfAGpu([&] {
    append_paged_mla_kv_cache(ckv, kpe, per_row, per_row, ckv_cache, kpe_cache, device(DType::kI32, {3}),
                              device(DType::kI32, {4}), device(DType::kI32, {2}));
  }));
}

TEST_F(NoGpu, Rope) {
  const TensorView q = device(DType::kBF16, {5, 4, 128}), k = device(DType::kBF16, {5, 2, 128});
  const TensorView pos_ids = device(DType::kI64, {5});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { apply_rope_inplace(q, k, device(DType::kI32, {3}), device(DType::kI32, {2})); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { apply_llama31_rope_pos_ids_inplace(q, k, pos_ids); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] {
    apply_rope_with_cos_sin_cache_inplace(pos_ids, device(DType::kBF16, {5, 512}), device(DType::kBF16, {5, 256}), 128,
                                          device(DType::kF32, {4096, 64}));
  }));
}

TEST_F(NoGpu, Attention) {
  const DType bf16 = DType::kBF16;
  const TensorView q1 = device(bf16, {8, 128});
  const TensorView k1 = device(bf16, {33, 2, 128});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { single_decode(q1, k1, k1, Layout::kNHD, q1, TensorView{}); }));
  const TensorView q = device(bf16, {5, 8, 128});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { single_prefill(q, k1, k1, Layout::kNHD, q, TensorView{}); }));

  const TensorView qb = device(bf16, {2, 8, 128});
  const PagedKV cache = paged_cache(bf16, 128);
  EXPECT_TRUE(FailsForWantOfAGpu([&] { batch_decode_paged(qb, cache, qb, TensorView{}); }));
  const TensorView indptr = device(DType::kI32, {3});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { batch_decode_ragged(qb, k1, k1, indptr, qb, TensorView{}); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { batch_prefill_ragged(q, indptr, 4, k1, k1, indptr, q, TensorView{}); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { batch_prefill_paged(q, indptr, 4, cache, q, TensorView{}); }));

  BlockSparse bs;
  bs.block_rows = 4;
  bs.block_cols = 8;
  bs.num_rows = 5;
  bs.k = k1;
  bs.v = k1;
  bs.indptr = indptr;
  bs.indices = device(DType::kI32, {4});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { block_sparse_attention(q, bs, q, TensorView{}); }));
}

TEST_F(NoGpu, RuntimeWrappers) {
  // max_batch_size, max_total_qo_tokens, num_qo_heads, num_kv_heads, head_dim
  const RuntimeBounds bounds{4, 64, 8, 2, 128};
  const TensorView workspace = device(DType::kU8, {int64_t{64} << 20});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { BatchDecodeWrapper::workspace_size(bounds); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { BatchDecodeWrapper w(workspace, bounds); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { BatchPrefillPagedWrapper::workspace_size(bounds); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { BatchPrefillPagedWrapper w(workspace, bounds); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { BatchPrefillRaggedWrapper::workspace_size(bounds); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { BatchPrefillRaggedWrapper w(workspace, bounds); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { BlockSparseWrapper::workspace_size(bounds); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { BlockSparseWrapper w(workspace, bounds); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { BatchBlockSparsePagedWrapper::workspace_size(bounds); }));
  EXPECT_TRUE(FailsForWantOfAGpu([&] { BatchBlockSparsePagedWrapper w(workspace, bounds); }));
}

TEST_F(NoGpu, BuildBlockMask) {
  MaskMod causal{"bool causal(const Params&, int, int, int q_idx, int kv_idx) { return kv_idx <= q_idx; }",
                 "causal"};
  const TensorView indptr = device(DType::kI32, {3});
  const TensorView indices = device(DType::kI32, {4});
  const TensorView flags = device(DType::kU8, {4});
  EXPECT_TRUE(FailsForWantOfAGpu([&] { build_block_mask(causal, {}, 5, 9, 4, 8, 0, 0, indptr, indices, flags); }));
}

}  // namespace
}  // namespace tessera
