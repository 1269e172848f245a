// Attention-state merge (tessera/merge.h). Memory-bound: bytes = every input byte read once (V and
// LSE) + every output byte written once; reported in GB/s against the copy ceiling.
#include <cstdint>
#include <vector>

#include "harness.h"
#include "tessera/merge.h"

namespace tessera_bench {
namespace {

using tessera::DType;

constexpr DType kDType = DType::kBF16;
constexpr int64_t kHeads = 32;
constexpr int64_t kHeadDim = 128;

Params merge_params(int64_t rows) {
  return {{"rows", rows}, {"H", kHeads}, {"D", kHeadDim}, {"dtype", tessera::dtype_name(kDType)}};
}

// Two states of [32768, 32, 128] bf16 (256 MiB each) plus their f32 LSEs -> one state.
void bench_merge_state(BenchContext& ctx) {
  constexpr int64_t kRows = 32768;
  DeviceTensor v_a = ctx.random_tensor(kDType, {kRows, kHeads, kHeadDim});
  DeviceTensor s_a = ctx.random_tensor(DType::kF32, {kRows, kHeads});
  DeviceTensor v_b = ctx.random_tensor(kDType, {kRows, kHeads, kHeadDim});
  DeviceTensor s_b = ctx.random_tensor(DType::kF32, {kRows, kHeads});
  DeviceTensor v_out = ctx.empty_tensor(kDType, {kRows, kHeads, kHeadDim});
  DeviceTensor s_out = ctx.empty_tensor(DType::kF32, {kRows, kHeads});

  const Timing t = ctx.measure([&](cudaStream_t stream) {
    tessera::merge_state(v_a.view, s_a.view, v_b.view, s_b.view, v_out.view, s_out.view, stream);
  });
  const double bytes = static_cast<double>(v_a.nbytes() + s_a.nbytes() + v_b.nbytes() +
                                           s_b.nbytes() + v_out.nbytes() + s_out.nbytes());
  ctx.report_gbps(t, bytes, merge_params(kRows));
}

// 8 states per row: [8192, 8, 32, 128] bf16 (512 MiB) -> [8192, 32, 128].
void bench_merge_states(BenchContext& ctx) {
  constexpr int64_t kRows = 8192;
  constexpr int64_t kStates = 8;
  DeviceTensor v = ctx.random_tensor(kDType, {kRows, kStates, kHeads, kHeadDim});
  DeviceTensor s = ctx.random_tensor(DType::kF32, {kRows, kStates, kHeads});
  DeviceTensor v_out = ctx.empty_tensor(kDType, {kRows, kHeads, kHeadDim});
  DeviceTensor s_out = ctx.empty_tensor(DType::kF32, {kRows, kHeads});

  const Timing t = ctx.measure([&](cudaStream_t stream) {
    tessera::merge_states(v.view, s.view, v_out.view, s_out.view, stream);
  });
  const double bytes =
      static_cast<double>(v.nbytes() + s.nbytes() + v_out.nbytes() + s_out.nbytes());
  Params params = merge_params(kRows);
  params.insert(params.begin() + 1, {"num_states", kStates});
  ctx.report_gbps(t, bytes, std::move(params));
}

// 8192 rows, row r merging 1 + (r * 7919) % 16 states (1..16, 8.5 on average; 69632 in all).
void bench_merge_states_ragged(BenchContext& ctx) {
  constexpr int64_t kRows = 8192;
  std::vector<int32_t> indptr(kRows + 1, 0);
  for (int64_t r = 0; r < kRows; ++r) {
    indptr[r + 1] = indptr[r] + static_cast<int32_t>(1 + (r * 7919) % 16);
  }
  const int64_t total_states = indptr[kRows];

  DeviceTensor d_indptr = ctx.upload_i32(indptr);
  DeviceTensor v = ctx.random_tensor(kDType, {total_states, kHeads, kHeadDim});
  DeviceTensor s = ctx.random_tensor(DType::kF32, {total_states, kHeads});
  DeviceTensor v_out = ctx.empty_tensor(kDType, {kRows, kHeads, kHeadDim});
  DeviceTensor s_out = ctx.empty_tensor(DType::kF32, {kRows, kHeads});

  const Timing t = ctx.measure([&](cudaStream_t stream) {
    tessera::merge_states_ragged(v.view, s.view, d_indptr.view, v_out.view, s_out.view, stream);
  });
  const double bytes =
      static_cast<double>(v.nbytes() + s.nbytes() + v_out.nbytes() + s_out.nbytes());
  Params params = merge_params(kRows);
  params.insert(params.begin() + 1, {"states_per_row", "1+(r*7919)%16"});
  params.insert(params.begin() + 2, {"total_states", total_states});
  ctx.report_gbps(t, bytes, std::move(params));
}

}  // namespace

TESSERA_BENCH_WORKLOAD(bench_merge_state, "merge_state",
                       "merge two states, rows=32768 H=32 D=128 bf16", "merge", "quick");
TESSERA_BENCH_WORKLOAD(bench_merge_states, "merge_states",
                       "merge 8 states per row, rows=8192 H=32 D=128 bf16", "merge", "quick");
TESSERA_BENCH_WORKLOAD(bench_merge_states_ragged, "merge_states_ragged",
                       "merge 1..16 states per row, rows=8192 H=32 D=128 bf16", "merge", "quick");

}  // namespace tessera_bench
