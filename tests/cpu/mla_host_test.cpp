// Host-side arithmetic of the MLA entry point (tessera/mla.h), no GPU: the KV split count the
// wrappers and the benchmark choose, the workspace size of the split states, and the argument
// checks of batch_mla_paged's latent cache and dtypes (made before any device access, so views of
// unallocated device addresses reach them).
#include <gtest/gtest.h>

#include <cstdint>

#include "expect_invalid.h"
#include "tessera/mla.h"

namespace {

using tessera_cpu_test::expect_invalid;
using tessera::batch_mla_paged_num_kv_splits;
using tessera::batch_mla_paged_workspace_bytes;
using tessera::DType;
using tessera::TensorView;

TEST(MlaNumKvSplits, FillsTheSmsABatchLeavesIdle) {
  // W9a: 128 requests x 16 heads are 128 CTAs on 132 SMs: no split.
  EXPECT_EQ(batch_mla_paged_num_kv_splits(128, 1, 16, 4096, 132), 1);
  // 8 requests x 128 heads (2 row tiles each) are 16 CTAs: 132 / 16 = 8 splits.
  EXPECT_EQ(batch_mla_paged_num_kv_splits(8, 1, 128, 32768, 132), 8);
  // Two tokens of 128 heads are 4 row tiles a request.
  EXPECT_EQ(batch_mla_paged_num_kv_splits(2, 2, 128, 32768, 132), 16);
  // One request: every SM, as long as each split keeps 4 tiles.
  EXPECT_EQ(batch_mla_paged_num_kv_splits(1, 1, 16, 65536, 132), 132);
}

TEST(MlaNumKvSplits, KeepsFourTilesASplitAndAtMost256) {
  EXPECT_EQ(batch_mla_paged_num_kv_splits(1, 1, 16, 1000, 132), 3);   // 15 tiles
  EXPECT_EQ(batch_mla_paged_num_kv_splits(4, 1, 16, 255, 132), 1);    // 3 tiles
  EXPECT_EQ(batch_mla_paged_num_kv_splits(1, 1, 16, 0, 132), 1);
  EXPECT_EQ(batch_mla_paged_num_kv_splits(0, 1, 16, 4096, 132), 16);  // an empty batch counts one CTA
  EXPECT_EQ(batch_mla_paged_num_kv_splits(1, 1, 16, int64_t{1} << 24, 1000), 256);
}

TEST(MlaNumKvSplits, BadArgumentsAreNamed) {
  expect_invalid([] { batch_mla_paged_num_kv_splits(-1, 1, 16, 64, 132); }, "batch_size = -1");
  expect_invalid([] { batch_mla_paged_num_kv_splits(1, 0, 16, 64, 132); }, "max_qo_len = 0");
  expect_invalid([] { batch_mla_paged_num_kv_splits(1, 1, 0, 64, 132); }, "num_heads = 0");
  expect_invalid([] { batch_mla_paged_num_kv_splits(1, 1, 16, -5, 132); }, "max_kv_len = -5");
  expect_invalid([] { batch_mla_paged_num_kv_splits(1, 1, 16, 64, 0); }, "sm_count = 0");
}

TEST(MlaWorkspaceBytes, SplitStatesInTheQueriesDtypeThenAlignedLse) {
  EXPECT_EQ(batch_mla_paged_workspace_bytes(3, 16, 1, DType::kBF16), 0);
  // 3 tokens x 4 splits x 16 heads = 192 states: 192 x 512 x 2 bytes, then 192 f32 LSEs.
  EXPECT_EQ(batch_mla_paged_workspace_bytes(3, 16, 4, DType::kBF16), 192 * 512 * 2 + 192 * 4);
  EXPECT_EQ(batch_mla_paged_workspace_bytes(3, 16, 4, DType::kF16), 192 * 512 * 2 + 192 * 4);
  // 1 x 2 x 1 = 2 states: 2048 bytes of output (a multiple of 256), then 8 bytes.
  EXPECT_EQ(batch_mla_paged_workspace_bytes(1, 1, 2, DType::kBF16), 2048 + 8);
  expect_invalid([] { batch_mla_paged_workspace_bytes(3, 16, 4, DType::kF32); }, "dtype = f32");
  expect_invalid([] { batch_mla_paged_workspace_bytes(3, 16, 0, DType::kBF16); }, "num_kv_splits = 0");
  expect_invalid([] { batch_mla_paged_workspace_bytes(3, 16, 257, DType::kBF16); }, "num_kv_splits = 257");
  expect_invalid([] { batch_mla_paged_workspace_bytes(-1, 16, 2, DType::kBF16); }, "total_q = -1");
}

/// Views of a batch of 2 requests, 16 heads, one token each, page size 16, over device addresses
/// nothing reads (the checks below fail first).
struct FakeMlaBatch {
  static void* at(uintptr_t offset) { return reinterpret_cast<void*>(uintptr_t{1} << 32 | offset); }
  const tessera::Device gpu = tessera::Device::cuda(0);
  TensorView q_nope{at(0x000000), DType::kBF16, {2, 16, 512}, gpu};
  TensorView q_pe{at(0x100000), DType::kBF16, {2, 16, 64}, gpu};
  TensorView o{at(0x200000), DType::kBF16, {2, 16, 512}, gpu};
  tessera::PagedLatentCache kv;
  tessera::MlaOptions options;
  FakeMlaBatch() {
    kv.ckv = TensorView(at(0x300000), DType::kBF16, {4, 16, 512}, gpu);
    kv.kpe = TensorView(at(0x400000), DType::kBF16, {4, 16, 64}, gpu);
    kv.indptr = TensorView(at(0x500000), DType::kI32, {3}, gpu);
    kv.indices = TensorView(at(0x500100), DType::kI32, {4}, gpu);
    kv.last_page_len = TensorView(at(0x500200), DType::kI32, {2}, gpu);
    options.sm_scale = 0.1;
  }
  void as_fp8(DType dtype) { kv.ckv.dtype = kv.kpe.dtype = dtype; }
  void call() const { tessera::batch_mla_paged(q_nope, q_pe, TensorView(), 1, kv, o, TensorView(), options); }
};

TEST(MlaLatentCacheChecks, Fp8CachesAndTheirScalesAreChecked) {
  expect_invalid([] {
    FakeMlaBatch b;
    b.kv.scales.k = 0.5;
    b.call();
  }, "kv.scales: scales apply to fp8 (e4m3, e5m2) KV caches only; this cache is bf16");
  expect_invalid([] {
    FakeMlaBatch b;
    b.as_fp8(DType::kE4M3);
    b.kv.scales.q = 2.0;
    b.call();
  }, "kv.scales.q = 2");
  expect_invalid([] {
    FakeMlaBatch b;
    b.as_fp8(DType::kE5M2);
    b.kv.scales.v = -1.0;
    b.call();
  }, "kv.scales.v = -1");
  expect_invalid([] {
    FakeMlaBatch b;
    b.as_fp8(DType::kE4M3);
    b.kv.scales.k_device = TensorView(FakeMlaBatch::at(0x600000), DType::kF32, {2}, tessera::Device::cuda(0));
    b.call();
  }, "kv.scales.k_device has 2 elements, expected 1 (per tensor)");
  expect_invalid([] {
    FakeMlaBatch b;
    b.kv.kpe.dtype = DType::kE4M3;
    b.call();
  }, "kv.kpe.dtype");
  expect_invalid([] {
    FakeMlaBatch b;
    b.as_fp8(DType::kF16);
    b.call();
  }, "kv.ckv.dtype = f16, expected q_nope.dtype (bf16), e4m3 or e5m2");
  expect_invalid([] {
    FakeMlaBatch b;
    b.as_fp8(DType::kE4M3);
    b.q_nope.dtype = b.q_pe.dtype = DType::kE4M3;
    b.call();
  }, "q_nope.dtype = e4m3");
  expect_invalid([] {
    FakeMlaBatch b;
    b.as_fp8(DType::kF32);
    b.call();
  }, "kv.ckv.dtype = f32");
}

}  // namespace
