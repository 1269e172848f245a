// Host-side arithmetic of the MLA entry point (tessera/mla.h), no GPU: the KV split count the
// wrappers and the benchmark choose, and the workspace size of the split states.
#include <gtest/gtest.h>

#include <cstdint>

#include "expect_invalid.h"
#include "tessera/mla.h"

namespace {

using tessera_cpu_test::expect_invalid;
using tessera::batch_mla_paged_num_kv_splits;
using tessera::batch_mla_paged_workspace_bytes;
using tessera::DType;

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

}  // namespace
