// Standalone RoPE (tessera/rope.h): memory-bound, every element of q and k read once and written
// once. GB/s = (q and k bytes read + the same bytes written + position arrays and, with a cos/sin
// table, one table row per token) / time, against the copy ceiling. Llama-3-8B heads (Hq 32, Hk 8,
// D 128), bf16:
//   prefill: 16 requests x 1024 tokens (nnz 16384), in place and out of place, positions from
//            pos_ids (i64), from indptr + offsets (Llama 3.1 frequencies), or read from a vLLM-style
//            cos/sin table with q and k slices of one packed qkv tensor;
//   decode:  64 requests x 1 token (nnz 64), in place: a launch-latency-bound cell.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"
#include "tessera/rope.h"

namespace tessera_bench {
namespace {

using tessera::DType;
using tessera::TensorView;

constexpr DType kDType = DType::kBF16;
constexpr int64_t kQHeads = 32;
constexpr int64_t kKHeads = 8;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kRequestLen = 1024;
constexpr int64_t kMaxPosition = 32768;

enum class Positions { kPosIds, kIndptrLlama31, kCosSinCache };

const char* positions_name(Positions p) {
  switch (p) {
    case Positions::kPosIds: return "pos_ids_i64";
    case Positions::kIndptrLlama31: return "indptr_offsets_llama31";
    case Positions::kCosSinCache: return "cos_sin_cache_i64";
  }
  return "?";
}

DeviceTensor upload_i64(BenchContext& ctx, const std::vector<int64_t>& host) {
  DeviceTensor t = ctx.empty_tensor(DType::kI64, {static_cast<int64_t>(host.size())});
  BENCH_CUDA(cudaMemcpyAsync(t.buffer.get(), host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                             ctx.stream()));
  ctx.synchronize();  // `host` is pageable and dies with the caller's frame
  return t;
}

void run_rope(BenchContext& ctx, int64_t nnz, Positions positions, bool in_place) {
  const int64_t batch = nnz >= kRequestLen ? nnz / kRequestLen : nnz;  // prefill requests, or one token each
  const int64_t per_request = nnz / batch;
  // q, k and v of one projection, [nnz, (Hq + 2 Hk) * D]: q and k are strided slices of it.
  const int64_t row = (kQHeads + 2 * kKHeads) * kHeadDim;
  DeviceTensor qkv = ctx.random_tensor(kDType, {nnz, row});
  DeviceTensor out = in_place ? DeviceTensor{} : ctx.empty_tensor(kDType, {nnz, row});
  auto heads_view = [&](const DeviceTensor& t, int64_t first_head, int64_t heads) {
    return TensorView(static_cast<char*>(t.buffer.get()) + first_head * kHeadDim * tessera::dtype_size(kDType), kDType,
                      {nnz, heads, kHeadDim}, {row, kHeadDim, 1}, ctx.tensor_device());
  };
  const TensorView q = heads_view(qkv, 0, kQHeads), k = heads_view(qkv, kQHeads, kKHeads);
  const TensorView q_out = in_place ? q : heads_view(out, 0, kQHeads);
  const TensorView k_out = in_place ? k : heads_view(out, kQHeads, kKHeads);

  std::vector<int32_t> indptr(batch + 1), offsets(batch);
  std::vector<int64_t> pos_ids(nnz);
  for (int64_t b = 0; b <= batch; ++b) indptr[b] = static_cast<int32_t>(b * per_request);
  for (int64_t b = 0; b < batch; ++b) {
    // Decode tokens sit at the end of long contexts; prefill chunks after a prefix.
    offsets[b] = static_cast<int32_t>(per_request == 1 ? 4096 + 61 * b : 512 * (b % 8));
    for (int64_t j = 0; j < per_request; ++j) pos_ids[b * per_request + j] = offsets[b] + j;
  }
  DeviceTensor d_indptr = ctx.upload_i32(indptr), d_offsets = ctx.upload_i32(offsets);
  DeviceTensor d_pos = upload_i64(ctx, pos_ids);
  DeviceTensor table = ctx.random_tensor(DType::kF32, {kMaxPosition, kHeadDim});

  const auto flat = [](const TensorView& t) {
    return TensorView(t.data, t.dtype, {t.shape[0], t.shape[1] * t.shape[2]}, {t.strides[0], 1}, t.device);
  };
  const Timing t = ctx.measure([&](cudaStream_t stream) {
    const auto s = reinterpret_cast<tessera::StreamHandle>(stream);
    switch (positions) {
      case Positions::kPosIds:
        tessera::apply_rope_pos_ids(q, k, q_out, k_out, d_pos.view, tessera::ApplyRopeOptions{}, s);
        break;
      case Positions::kIndptrLlama31:
        tessera::apply_llama31_rope(q, k, q_out, k_out, d_indptr.view, d_offsets.view,
                                    tessera::ApplyLlama31RopeOptions{}, s);
        break;
      case Positions::kCosSinCache:
        tessera::apply_rope_with_cos_sin_cache(d_pos.view, flat(q), flat(k), kHeadDim, table.view, true, flat(q_out),
                                               flat(k_out), s);
        break;
    }
  });
  const double qk_bytes = static_cast<double>(nnz * (kQHeads + kKHeads) * kHeadDim) * tessera::dtype_size(kDType);
  double bytes = 2 * qk_bytes;
  if (positions == Positions::kIndptrLlama31) {
    bytes += static_cast<double>(d_indptr.nbytes() + d_offsets.nbytes());
  } else {
    bytes += static_cast<double>(d_pos.nbytes());
  }
  if (positions == Positions::kCosSinCache) bytes += static_cast<double>(nnz * kHeadDim * sizeof(float));
  Params params = {{"nnz", nnz},
                   {"Hq", kQHeads},
                   {"Hk", kKHeads},
                   {"D", kHeadDim},
                   {"rotary_dim", kHeadDim},
                   {"dtype", tessera::dtype_name(kDType)},
                   {"positions", positions_name(positions)},
                   {"in_place", static_cast<int64_t>(in_place)},
                   {"layout", "q, k slices of a packed qkv [nnz, (Hq + 2 Hk) * D]"},
                   {"bytes", "q and k read + written, positions, cos/sin rows read"}};
  ctx.report_gbps(t, bytes, std::move(params));
}

void rope_pos_ids_inplace(BenchContext& ctx) { run_rope(ctx, 16 * kRequestLen, Positions::kPosIds, true); }
void rope_pos_ids_out(BenchContext& ctx) { run_rope(ctx, 16 * kRequestLen, Positions::kPosIds, false); }
void rope_llama31_indptr_inplace(BenchContext& ctx) {
  run_rope(ctx, 16 * kRequestLen, Positions::kIndptrLlama31, true);
}
void rope_cos_sin_cache_inplace(BenchContext& ctx) { run_rope(ctx, 16 * kRequestLen, Positions::kCosSinCache, true); }
void rope_decode_pos_ids_inplace(BenchContext& ctx) { run_rope(ctx, 64, Positions::kPosIds, true); }

}  // namespace

TESSERA_BENCH_WORKLOAD(rope_pos_ids_inplace, "rope_pos_ids_inplace_n16384",
                       "apply_rope_pos_ids_inplace, nnz 16384, Hq 32 Hk 8 D 128 bf16, i64 positions", "rope");
TESSERA_BENCH_WORKLOAD(rope_pos_ids_out, "rope_pos_ids_n16384",
                       "apply_rope_pos_ids out of place, nnz 16384, Hq 32 Hk 8 D 128 bf16, i64 positions", "rope");
TESSERA_BENCH_WORKLOAD(rope_llama31_indptr_inplace, "rope_llama31_indptr_inplace_n16384",
                       "apply_llama31_rope_inplace, 16 x 1024 tokens by indptr + offsets, Hq 32 Hk 8 D 128 bf16",
                       "rope");
TESSERA_BENCH_WORKLOAD(rope_cos_sin_cache_inplace, "rope_cos_sin_cache_inplace_n16384",
                       "apply_rope_with_cos_sin_cache_inplace (neox), nnz 16384, Hq 32 Hk 8 D 128 bf16, f32 table",
                       "rope");
TESSERA_BENCH_WORKLOAD(rope_decode_pos_ids_inplace, "rope_decode_pos_ids_inplace_n64",
                       "apply_rope_pos_ids_inplace, 64 decode tokens, Hq 32 Hk 8 D 128 bf16", "rope");

}  // namespace tessera_bench
