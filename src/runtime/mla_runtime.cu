// BatchMLAPagedWrapper (include/tessera/runtime.h): multi-head latent attention through the
// plan/run runtime. The load-balancing planner (src/runtime/planner.h) plans MLA as attention with
// one KV head whose group is every query head; the persistent MLA kernel
// (kernels/attention/mla/decode.cuh, MlaPlannedSchedule) runs the plan's columns and the MLA
// contraction (kernels/attention/mla/contraction.cuh) merges the split tiles.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/attention/mla/contraction.cuh"
#include "kernels/attention/mla/decode.cuh"
#include "kernels/attention/mla/narrow.cuh"
#include "src/check.h"
#include "src/cuda_utils.h"
#include "src/dispatch.h"
#include "src/mla_host.h"
#include "src/kv_scales.h"
#include "src/runtime/device_errors.h"
#include "src/runtime/plan_channel.h"
#include "src/runtime/plan_inputs.h"
#include "src/runtime/planner.h"
#include "src/tensor_checks.h"
#include "tessera/runtime.h"
#include "tessera/validate.h"

namespace tessera {
namespace detail {
namespace {

using Tile = kernels::MlaTraits<__nv_bfloat16>;  // tile sizes and shared memory are the same for f16
using NarrowTile = kernels::MlaNarrowTraits<__nv_bfloat16>;
static_assert(kernels::MlaTraits<__half>::kSmemBytes == Tile::kSmemBytes, "one grid for both dtypes");
static_assert(NarrowTile::CTA_TILE_KV == Tile::CTA_TILE_KV && NarrowTile::CTA_TILE_Q < Tile::CTA_TILE_Q,
              "the two tiles cut the KV alike; the workspace is sized by the narrow tile's items and the wide "
              "tile's state slots");

constexpr int64_t kAlign = 256;
constexpr int kSplitMultiple = 128;  // fixed split sizes, as the other wrappers (RuntimeOptions)

// Cost model (planner.h: alpha per valid query row of an item, beta per KV row). A KV row costs
// the same in every item: the tile multiplies it into all 64 rows whether they are valid or not,
// and reads its 576 values from DRAM or, for the request's other tiles, from L2; so beta = 1 and a
// request's cost grows with its tiles (heads x tokens / 64), which is what makes many-head MLA
// compute-bound. alpha prices an item's fixed part per valid row: its Q rows (576 values, like a
// KV row), its output or fp32 state (512 values, written; a split state is read again by the
// merge) and the pipeline's fill: about 4 KV rows a query row.
constexpr int64_t kCostAlpha = 4;
constexpr int64_t kCostBeta = 1;
// A batch whose tiles already fill the GPU gains little balance from short chunks and pays for
// each split's state and merge: its chunks are at least this long (as the other wrappers).
constexpr int32_t kMinChunkWhenBusy = 1024;
// What a plan with splits pays beyond its makespan: the states' fp32 writes and reads and the
// merge launch, about four KV tiles of one CTA.
constexpr int64_t kSplitPenalty = 4 * 64;

int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

int grid_ctas(const RuntimeOptions& options) {
  const int sms = current_device_sm_count();
  TESSERA_CHECK_ARG(options.sm_budget >= 0) << "options.sm_budget = " << options.sm_budget << ", expected >= 0";
  return options.sm_budget == 0 ? sms : static_cast<int>(std::min<int64_t>(options.sm_budget, sms));
}

void check_bounds(const MlaRuntimeBounds& b) {
  TESSERA_CHECK_ARG(b.max_batch_size >= 1 && b.max_batch_size < INT32_MAX)
      << "bounds.max_batch_size = " << b.max_batch_size << ", expected in [1, 2^31 - 1)";
  TESSERA_CHECK_ARG(b.max_total_qo_tokens >= 1 && b.max_total_qo_tokens < INT32_MAX)
      << "bounds.max_total_qo_tokens = " << b.max_total_qo_tokens << ", expected in [1, 2^31 - 1)";
  TESSERA_CHECK_ARG(b.num_heads >= 1 && b.num_heads <= 4096)
      << "bounds.num_heads = " << b.num_heads << ", expected in [1, 4096]";
  TESSERA_CHECK_ARG(b.max_total_qo_tokens * b.num_heads < INT32_MAX)
      << "bounds.max_total_qo_tokens * num_heads = " << b.max_total_qo_tokens * b.num_heads
      << ", expected < 2^31 (packed query rows)";
}

void check_options(const RuntimeOptions& o) {
  TESSERA_CHECK_ARG(o.split_kv == SplitKV::kAuto || o.split_kv == SplitKV::kFixed || o.split_kv == SplitKV::kNone)
      << "options.split_kv = " << static_cast<int>(o.split_kv) << ", expected kAuto, kFixed or kNone";
  if (o.split_kv == SplitKV::kFixed) {
    TESSERA_CHECK_ARG(o.fixed_split_size > 0 && o.fixed_split_size % kSplitMultiple == 0 &&
                      o.fixed_split_size < INT32_MAX)
        << "options.fixed_split_size = " << o.fixed_split_size << ", expected a positive multiple of "
        << kSplitMultiple << " with split_kv = kFixed";
  }
  TESSERA_CHECK_ARG(o.q_tile == QueryTile::kAuto || o.q_tile == QueryTile::k16 || o.q_tile == QueryTile::k64)
      << "options.q_tile = " << static_cast<int>(o.q_tile)
      << ", expected kAuto, 16 or 64 (the MLA tiles: 16 rows as the MMAs' N, or 64)";
  TESSERA_CHECK_ARG(o.dtype == DType::kF16 || o.dtype == DType::kBF16)
      << "options.dtype = " << o.dtype << ", expected f16 or bf16";
  TESSERA_CHECK_ARG(!o.kv_dtype.has_value() || *o.kv_dtype == o.dtype || is_fp8(*o.kv_dtype))
      << "options.kv_dtype = " << *o.kv_dtype << ", expected unset, options.dtype (" << o.dtype
      << "), e4m3 or e5m2 (the latent cache's dtype)";
}

/// The query tile's rows for a plan whose largest request has max_rows packed rows: the narrow
/// tile (16 rows, kernels/attention/mla/narrow.cuh) when every request fits it, since it reads a
/// request's KV once at a quarter of the MMA work; else the 64-row tile, which also reads it once
/// per 64 rows where the narrow one would per 16.
int32_t tile_rows_for(QueryTile q_tile, int64_t max_rows) {
  switch (q_tile) {
    case QueryTile::k16: return NarrowTile::CTA_TILE_Q;
    case QueryTile::k64: return Tile::CTA_TILE_Q;
    default: return max_rows <= NarrowTile::CTA_TILE_Q ? NarrowTile::CTA_TILE_Q : Tile::CTA_TILE_Q;
  }
}

/// With cuda_graph the kernel is captured once, so kAuto is resolved from the bounds: the
/// requests' rows when the tokens are spread evenly (decode bounds: one token a request).
int32_t graph_tile_rows(const MlaRuntimeBounds& b, QueryTile q_tile) {
  const int64_t tokens = (b.max_total_qo_tokens + b.max_batch_size - 1) / b.max_batch_size;
  return tile_rows_for(q_tile, tokens * b.num_heads);
}

runtime::Plan plan_with_mode(const std::vector<int32_t>& qo_len, const std::vector<int32_t>& kv_len,
                             runtime::PlannerConfig config, runtime::SplitMode mode) {
  config.split_mode = mode;
  return runtime::plan_work(qo_len, kv_len, config);
}

bool within_10_percent(int64_t makespan, int64_t lower_bound) { return makespan * 10 <= lower_bound * 11; }

/// The smallest chunk length (a multiple of the KV tile) that cuts every query tile into at most as
/// many chunks as there are CTAs, counting a tile's KV as its request's whole length (causal tiles
/// see less, so the count is an upper bound); 0 when even one chunk per tile is too many.
int64_t one_wave_chunk(const std::vector<int32_t>& qo_len, const std::vector<int32_t>& kv_len, int64_t heads,
                       int64_t tile_rows, int64_t ctas) {
  auto chunks = [&](int64_t L) {
    int64_t n = 0;
    for (size_t b = 0; b < qo_len.size(); ++b) {
      const int64_t tiles = (qo_len[b] * heads + tile_rows - 1) / tile_rows;
      n += tiles * std::max<int64_t>(1, (kv_len[b] + L - 1) / L);
    }
    return n;
  };
  int64_t max_kv = Tile::CTA_TILE_KV;
  for (const int32_t k : kv_len) max_kv = std::max<int64_t>(max_kv, k);
  int64_t hi = (max_kv + Tile::CTA_TILE_KV - 1) / Tile::CTA_TILE_KV;  // in KV tiles; one chunk per tile
  if (chunks(hi * Tile::CTA_TILE_KV) > ctas) return 0;
  int64_t lo = 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (chunks(mid * Tile::CTA_TILE_KV) <= ctas) hi = mid; else lo = mid + 1;
  }
  return lo * Tile::CTA_TILE_KV;
}

/// SplitKV::kAuto. The planner's own search halves its chunk length from the batch's average per
/// CTA, and its fill fallback pours tiles into CTAs in pieces of any length; MLA adds what that
/// misses (bench/results/LOG.md, session 30):
/// - the plan without a split, taken when within 10% of the lower bound: a split costs a state
///   write and a merge pass the cost model does not see (W9a: 128 equal requests on 132 SMs were
///   split for a 4% better makespan and ran 7% slower);
/// - chunks of the length that gives one wave of items (8 requests x 2 tiles x 32k keys: chunks
///   of 4096 on 128 CTAs, which the halving from 4032 skips);
/// - no fill fallback when a request has several query tiles: its pieces start at different
///   offsets for each tile, so the tiles no longer read the same keys at the same time and each
///   reads the whole KV from DRAM instead of sharing it in L2 (B=8 x 128 heads ran 38% slower).
/// Of the candidates, the smallest makespan wins, a split one charged kSplitPenalty.
runtime::Plan plan_balanced(const std::vector<int32_t>& qo_len, const std::vector<int32_t>& kv_len,
                            runtime::PlannerConfig config, int64_t heads) {
  runtime::Plan best = plan_with_mode(qo_len, kv_len, config, runtime::SplitMode::kNone);
  if (within_10_percent(best.makespan, best.lower_bound)) return best;
  auto score = [](const runtime::Plan& p) { return p.makespan + (p.merges.empty() ? 0 : kSplitPenalty); };
  auto consider = [&](runtime::Plan&& p) {
    if (p.ok && score(p) < score(best)) best = std::move(p);
  };
  int64_t tiles = 0;
  bool shared_kv = false;
  for (const int32_t len : qo_len) {
    const int64_t t = (len * heads + config.q_tile_rows - 1) / config.q_tile_rows;
    tiles += t;
    shared_kv = shared_kv || t >= 2;
  }
  const int64_t wave = one_wave_chunk(qo_len, kv_len, heads, config.q_tile_rows, config.num_ctas);
  if (wave > 0 && wave < INT32_MAX) {
    runtime::PlannerConfig fixed = config;
    fixed.fixed_split_size = static_cast<int32_t>(wave);
    consider(plan_with_mode(qo_len, kv_len, fixed, runtime::SplitMode::kFixed));
  }
  if (2 * tiles >= config.num_ctas) config.min_chunk_rows = kMinChunkWhenBusy;
  if (shared_kv) config.min_chunk_rows = std::max(config.min_chunk_rows, 2 * Tile::CTA_TILE_KV);
  consider(plan_with_mode(qo_len, kv_len, config, runtime::SplitMode::kAuto));
  return best;
}

/// Byte offsets of the workspace sections, fixed by the bounds (a captured run() finds every later
/// plan at the same addresses); [0, plan_end) mirrors the pinned staging buffer.
struct MlaWorkspaceLayout {
  int64_t num_merges = 0;     // i32 scalar
  int64_t num_segments = 0;   // i32 scalar: requests of the plan, for the captured page-id check
  int64_t cta_indptr = 0;     // i32 [max_cols + 1]
  int64_t qo_indptr = 0;      // i32 [max_batch + 1]
  int64_t kv_indptr = 0;      // i32 [max_batch + 1]
  int64_t last_page_len = 0;  // i32 [max_batch]
  int64_t merges = 0;         // PlannedMerge [max_merges]
  int64_t items = 0;          // PlannedItem [max_items]
  int64_t plan_end = 0;
  int64_t partial_lse = 0;    // f32 [max_partials, 64]: a slot of either tile
  int64_t partial_o = 0;      // f32 [max_partials, 64, 512]
  int64_t total = 0;
  int32_t max_cols = 0, max_batch = 0, max_items = 0, max_merges = 0, max_partials = 0;

  static MlaWorkspaceLayout of(const MlaRuntimeBounds& bounds, const RuntimeOptions& options) {
    check_bounds(bounds);
    check_options(options);
    MlaWorkspaceLayout l;
    l.max_cols = grid_ctas(options);
    l.max_batch = static_cast<int32_t>(bounds.max_batch_size);
    const int64_t max_tiles =  // of the narrow tile, the most of either
        (bounds.max_total_qo_tokens * bounds.num_heads + NarrowTile::CTA_TILE_Q - 1) / NarrowTile::CTA_TILE_Q +
        bounds.max_batch_size;
    // A plan whose chunks are at least total / CTAs long splits at most two chunks per CTA
    // (docs/design.md §6); kFixed plans that need more slots fail with a named error.
    l.max_partials = 2 * l.max_cols;
    const int64_t max_items = max_tiles + l.max_partials;
    TESSERA_CHECK_ARG(max_items < INT32_MAX / 32) << "bounds too large: " << max_items << " work items";
    l.max_items = static_cast<int32_t>(max_items);
    l.max_merges = l.max_partials / 2 + 1;
    int64_t at = 0;
    auto section = [&](int64_t bytes) {
      const int64_t offset = at;
      at = align_up(at + bytes);
      return offset;
    };
    l.num_merges = section(sizeof(int32_t));
    l.num_segments = section(sizeof(int32_t));
    l.cta_indptr = section((l.max_cols + 1) * sizeof(int32_t));
    l.qo_indptr = section((l.max_batch + 1) * sizeof(int32_t));
    l.kv_indptr = section((l.max_batch + 1) * sizeof(int32_t));
    l.last_page_len = section(l.max_batch * sizeof(int32_t));
    l.merges = section(l.max_merges * sizeof(kernels::PlannedMerge));
    l.items = section(l.max_items * sizeof(kernels::PlannedItem));
    l.plan_end = at;
    l.partial_lse = section(static_cast<int64_t>(l.max_partials) * Tile::CTA_TILE_Q * sizeof(float));
    l.partial_o = section(static_cast<int64_t>(l.max_partials) * Tile::CTA_TILE_Q * Tile::kLatentDim * sizeof(float));
    l.total = at;
    return l;
  }
};

}  // namespace

class MlaRuntime {
 public:
  MlaRuntime(const TensorView& workspace, const MlaRuntimeBounds& bounds, const RuntimeOptions& options)
      : bounds_(bounds), options_(options), layout_(MlaWorkspaceLayout::of(bounds, options)) {
    check_ndim(workspace, "workspace", 1);
    check_on_cuda(workspace, "workspace");
    check_contiguous(workspace, "workspace");
    TESSERA_CHECK_ARG(workspace.nbytes() >= layout_.total)
        << "workspace has " << workspace.nbytes() << " bytes, expected >= " << layout_.total
        << " (workspace_size of these bounds)";
    TESSERA_CHECK_ARG(reinterpret_cast<uintptr_t>(workspace.data) % kAlign == 0)
        << "workspace.data is not 256-byte aligned";
    TESSERA_CUDA_CHECK(cudaGetDevice(&device_));
    TESSERA_CHECK_ARG(workspace.device.id == device_)
        << "workspace is on cuda:" << workspace.device.id << " but the current device is cuda:" << device_;
    workspace_ = static_cast<char*>(workspace.data);
    channel_ = std::make_unique<PlanChannel>(workspace_, layout_.plan_end);
  }

  static int64_t workspace_size(const MlaRuntimeBounds& bounds, const RuntimeOptions& options) {
    return MlaWorkspaceLayout::of(bounds, options).total;
  }

  void plan(const TensorView& qo_indptr, const TensorView& kv_indptr, const TensorView& last_page_len,
            int64_t page_size, const MlaPlanShape& shape, StreamHandle stream) {
    raise_device_error(device_);
    const std::vector<int32_t> qo = read_host_indptr(qo_indptr, "qo_indptr");
    const int64_t batch = static_cast<int64_t>(qo.size()) - 1;
    TESSERA_CHECK_ARG(batch <= bounds_.max_batch_size)
        << "batch size " << batch << " exceeds bounds.max_batch_size = " << bounds_.max_batch_size;
    PagedLengths paged = read_paged_lengths(kv_indptr, last_page_len, page_size, batch);
    const int64_t total_q = qo.back();
    TESSERA_CHECK_ARG(total_q <= bounds_.max_total_qo_tokens)
        << "the plan has " << total_q << " query tokens, exceeding bounds.max_total_qo_tokens = "
        << bounds_.max_total_qo_tokens;
    check_shape(shape, page_size);
    std::vector<int32_t> qo_len;
    fill_lengths(qo, qo_len);
    int64_t max_qo_len = 0;
    for (const int32_t len : qo_len) max_qo_len = std::max<int64_t>(max_qo_len, len);
    const int32_t tile_rows = options_.cuda_graph ? graph_tile_rows(bounds_, options_.q_tile)
                                                  : tile_rows_for(options_.q_tile, max_qo_len * shape.num_heads);

    runtime::PlannerConfig config;
    config.group_size = static_cast<int32_t>(shape.num_heads);
    config.q_tile_rows = tile_rows;
    config.kv_tile_rows = Tile::CTA_TILE_KV;
    config.num_ctas = layout_.max_cols;
    config.causal = shape.causal;
    config.fixed_split_size = static_cast<int32_t>(options_.fixed_split_size);
    config.alpha = kCostAlpha;
    config.beta = kCostBeta;
    config.max_partials = layout_.max_partials;
    const runtime::Plan plan =
        options_.split_kv == SplitKV::kAuto ? plan_balanced(qo_len, paged.kv_len, config, shape.num_heads)
        : options_.split_kv == SplitKV::kFixed
            ? plan_with_mode(qo_len, paged.kv_len, config, runtime::SplitMode::kFixed)
            : plan_with_mode(qo_len, paged.kv_len, config, runtime::SplitMode::kNone);
    TESSERA_CHECK_ARG(plan.ok) << plan.error << " (the workspace holds " << layout_.max_partials
                               << " partial states; raise the split size)";
    TESSERA_CHECK(static_cast<int64_t>(plan.items.size()) <= layout_.max_items &&
                      static_cast<int64_t>(plan.merges.size()) <= layout_.max_merges,
                  StatusCode::kInternal)
        << "the plan has " << plan.items.size() << " items and " << plan.merges.size()
        << " merges, beyond the workspace's " << layout_.max_items << " and " << layout_.max_merges;

    char* host = channel_->staging();
    const int32_t num_merges = static_cast<int32_t>(plan.merges.size());
    const int32_t num_segments = static_cast<int32_t>(batch);
    std::memcpy(host + layout_.num_merges, &num_merges, sizeof(num_merges));
    std::memcpy(host + layout_.num_segments, &num_segments, sizeof(num_segments));
    std::memcpy(host + layout_.cta_indptr, plan.cta_indptr.data(), plan.cta_indptr.size() * sizeof(int32_t));
    std::memcpy(host + layout_.qo_indptr, qo.data(), qo.size() * sizeof(int32_t));
    std::memcpy(host + layout_.kv_indptr, paged.kv_indptr.data(), paged.kv_indptr.size() * sizeof(int32_t));
    std::memcpy(host + layout_.last_page_len, paged.last_page_len.data(), paged.last_page_len.size() * sizeof(int32_t));
    std::memcpy(host + layout_.merges, plan.merges.data(), plan.merges.size() * sizeof(runtime::MergeItem));
    std::memcpy(host + layout_.items, plan.items.data(), plan.items.size() * sizeof(runtime::WorkItem));
    const int64_t plan_bytes = layout_.items + static_cast<int64_t>(plan.items.size() * sizeof(runtime::WorkItem));
    channel_->upload(plan_bytes, reinterpret_cast<cudaStream_t>(stream));

    planned_ = true;
    shape_ = shape;
    page_size_ = page_size;
    total_q_ = total_q;
    tile_rows_ = tile_rows;
    kv_indptr_host_ = std::move(paged.kv_indptr);
    info_ = PlanInfo{};
    info_.batch_size = batch;
    info_.q_tile_rows = tile_rows;
    info_.kv_tile_rows = Tile::CTA_TILE_KV;
    info_.grid_cols = layout_.max_cols;
    info_.heads_per_cta = 1;
    info_.num_items = static_cast<int32_t>(plan.items.size());
    info_.num_partials = plan.num_partials;
    info_.num_merges = num_merges;
    info_.chunk_size = plan.chunk_size;
    info_.makespan = plan.makespan;
    info_.lower_bound = plan.lower_bound;
    info_.plan_bytes = plan_bytes;
    info_.grouped_by_request = plan.grouped_by_request;
  }

  void run(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv, const TensorView& kpe,
           const TensorView& kv_indices, const TensorView& o, const TensorView& lse, StreamHandle stream) {
    raise_device_error(device_);
    TESSERA_CHECK_ARG(planned_) << "run() before plan(): call plan() with this batch's index arrays first";
    check_run_tensors(q_nope, q_pe, ckv, kpe, kv_indices, o, lse);
    TESSERA_CHECK(current_device_has_wgmma(), StatusCode::kUnsupported)
        << "BatchMLAPagedWrapper runs on sm_90 GPUs (wgmma) in a library built with sm_90a kernels; this device "
           "or build has none (no sm_80-class MLA kernel yet)";
    const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    const bool capturing = PlanChannel::capturing(s);
    if (!capturing && checked_mode()) {
      const std::vector<int32_t> ids = read_index_values(kv_indices, "kv_indices", kv_indptr_host_.back());
      check_page_ids(kv_indptr_host_, ids.data(), ckv.shape[0], "kv_indices");
    }
    channel_->order_run(s, capturing);
    if (capturing && checked_mode()) {
      // The ids the replays read do not exist yet: a captured check runs at every replay.
      SegmentedIds c;
      c.ids = kv_indices.data_as<const int32_t>();
      c.indptr = reinterpret_cast<const int32_t*>(workspace_ + layout_.kv_indptr);
      c.num_segments = reinterpret_cast<const int32_t*>(workspace_ + layout_.num_segments);
      c.max_segments = layout_.max_batch;
      c.capacity = kv_indices.shape[0];
      c.bound = ckv.shape[0];
      c.increasing = false;
      enqueue_segmented_ids_check(c, DeviceCheckSite::kRuntimePageIds, stream);
    }
    TESSERA_DISPATCH_HALF_DTYPE(q_nope.dtype, "q_nope", T, [&] {
      TESSERA_DISPATCH_KV_DTYPE(ckv.dtype, T, "ckv", KVT, [&] {
        if (tile_rows_ == NarrowTile::CTA_TILE_Q) {
          launch<kernels::MlaNarrowTraits<T, KVT>>(q_nope, q_pe, ckv, kpe, kv_indices, o, lse, s);
        } else {
          launch<kernels::MlaTraits<T, KVT>>(q_nope, q_pe, ckv, kpe, kv_indices, o, lse, s);
        }
      });
    });
    channel_->record_run(s, capturing);
  }

  const PlanInfo& info() const { return info_; }

 private:
  void check_shape(const MlaPlanShape& shape, int64_t page_size) const {
    TESSERA_CHECK_ARG(shape.num_heads >= 1 && shape.num_heads <= bounds_.num_heads)
        << "shape.num_heads = " << shape.num_heads << ", expected in [1, bounds.num_heads = " << bounds_.num_heads
        << "]";
    TESSERA_CHECK_ARG(shape.dtype == DType::kF16 || shape.dtype == DType::kBF16)
        << "shape.dtype = " << shape.dtype << ", expected f16 or bf16";
    TESSERA_CHECK_ARG(std::isfinite(shape.sm_scale) && shape.sm_scale > 0)
        << "shape.sm_scale = " << shape.sm_scale << ", expected finite and > 0 (MLA has no default scale)";
    const DType kv_dtype = shape.kv_dtype.value_or(shape.dtype);
    TESSERA_CHECK_ARG(kv_dtype == shape.dtype || is_fp8(kv_dtype))
        << "shape.kv_dtype = " << kv_dtype << ", expected unset, shape.dtype (" << shape.dtype
        << "), e4m3 or e5m2 (the latent cache's dtype)";
    check_kv_scales(shape.kv_scales, "shape.kv_scales", kv_dtype, 1, Device::cuda(device_));
    if (!options_.cuda_graph) return;
    TESSERA_CHECK_ARG(shape.num_heads == bounds_.num_heads && shape.dtype == options_.dtype)
        << "cuda_graph: shape has num_heads = " << shape.num_heads << ", dtype = " << shape.dtype
        << ", expected the bounds' " << bounds_.num_heads << " and options.dtype = " << options_.dtype;
    TESSERA_CHECK_ARG(!planned_ || (shape.causal == shape_.causal && shape.sm_scale == shape_.sm_scale &&
                                    page_size == page_size_))
        << "cuda_graph: this plan changes causal, sm_scale or the page size, which a captured run() has baked in "
           "(first plan: causal = "
        << shape_.causal << ", sm_scale = " << shape_.sm_scale << ", page_size = " << page_size_ << "; this plan: "
        << shape.causal << ", " << shape.sm_scale << ", " << page_size << ")";
    TESSERA_CHECK_ARG(kv_dtype == options_.kv_dtype.value_or(options_.dtype))
        << "cuda_graph: shape.kv_dtype = " << kv_dtype << ", expected options.kv_dtype = "
        << options_.kv_dtype.value_or(options_.dtype) << " (fixed by a captured run())";
    const KVScales& a = shape.kv_scales;
    const KVScales& b = shape_.kv_scales;
    TESSERA_CHECK_ARG(!planned_ || (a.k == b.k && a.v == b.v && a.k_device.data == b.k_device.data &&
                                    a.v_device.data == b.v_device.data))
        << "cuda_graph: this plan changes shape.kv_scales' factors (k = " << a.k << ", v = " << a.v
        << ") or device tensors, which a captured run() has baked in (first plan: k = " << b.k << ", v = " << b.v
        << "); change the values in the device tensors instead";
  }

  void check_run_tensors(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv,
                         const TensorView& kpe, const TensorView& kv_indices, const TensorView& o,
                         const TensorView& lse) const {
    check_latent_operand(q_nope, "q_nope", kMlaLatentDim, "[rows, num_heads, 512]");
    TESSERA_CHECK_ARG(q_nope.dtype == shape_.dtype)
        << "q_nope.dtype = " << q_nope.dtype << ", but the plan was made for " << shape_.dtype;
    TESSERA_CHECK_ARG(q_nope.device.id == device_)
        << "q_nope is on cuda:" << q_nope.device.id << ", expected the workspace's cuda:" << device_;
    check_size(q_nope, "q_nope", 1, shape_.num_heads);
    const int64_t needed = options_.cuda_graph ? bounds_.max_total_qo_tokens : total_q_;
    TESSERA_CHECK_ARG(q_nope.shape[0] >= needed && q_nope.shape[0] <= INT32_MAX)
        << "q_nope.shape[0] = " << q_nope.shape[0] << ", expected >= " << needed
        << (options_.cuda_graph ? " (cuda_graph: bounds.max_total_qo_tokens)" : " (the plan's query tokens)");
    check_latent_operand(q_pe, "q_pe", kMlaRopeDim, "[rows, num_heads, 64]");
    check_latent_matches(q_pe, "q_pe", q_nope, "q_nope", 2);
    check_latent_operand(ckv, "ckv", kMlaLatentDim, "[num_pages, page_size, 512]", true);
    const DType kv_dtype = shape_.kv_dtype.value_or(shape_.dtype);
    TESSERA_CHECK_ARG(ckv.dtype == kv_dtype)
        << "ckv.dtype = " << ckv.dtype << ", but the plan was made for a latent cache of " << kv_dtype;
    check_same_device(q_nope, "q_nope", ckv, "ckv");
    check_size(ckv, "ckv", 1, page_size_);
    check_latent_operand(kpe, "kpe", kMlaRopeDim, "[num_pages, page_size, 64]", true);
    check_latent_matches(kpe, "kpe", ckv, "ckv", 2);
    check_latent_operand(o, "o", kMlaLatentDim, "[rows, num_heads, 512]");
    check_latent_matches(o, "o", q_nope, "q_nope", 2);
    check_latent_lse(lse, q_nope, q_nope.shape[0], shape_.num_heads);
    check_ndim(kv_indices, "kv_indices", 1);
    check_dtype(kv_indices, "kv_indices", {DType::kI32});
    check_contiguous(kv_indices, "kv_indices");
    check_same_device(q_nope, "q_nope", kv_indices, "kv_indices");
    TESSERA_CHECK_ARG(kv_indices.shape[0] >= kv_indptr_host_.back())
        << "kv_indices has " << kv_indices.shape[0] << " entries, expected >= " << kv_indptr_host_.back()
        << " (kv_indptr[batch_size] of the plan)";
  }

  /// The plan's tile: Traits is MlaTraits or MlaNarrowTraits of the run's dtypes.
  template <typename Traits>
  static void launch_tile(const kernels::MlaParamsOf<Traits>& p, const kernels::PlannedWork& work, int grid,
                          cudaStream_t s) {
    if constexpr (Traits::CTA_TILE_Q == NarrowTile::CTA_TILE_Q) {
      const auto kernel = kernels::mla_paged_narrow_kernel<Traits, kernels::MlaPlannedSchedule<Traits>>;
      ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
      kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, s>>>(p, work);
    } else {
      const auto kernel = kernels::mla_paged_kernel<Traits, kernels::MlaPlannedSchedule<Traits>>;
      ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
      kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, s>>>(p, work);
    }
    TESSERA_CHECK_LAUNCH();
  }

  template <typename Traits>
  void launch(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv, const TensorView& kpe,
              const TensorView& kv_indices, const TensorView& o, const TensorView& lse, cudaStream_t s) const {
    kernels::MlaParamsOf<Traits> p{};
    set_mla_tensor_params(p, q_nope, q_pe, ckv, kpe, o, lse);
    p.scales = kv_scale_params(shape_.kv_scales);
    p.qo_indptr = reinterpret_cast<const int32_t*>(workspace_ + layout_.qo_indptr);
    p.kv_indptr = reinterpret_cast<const int32_t*>(workspace_ + layout_.kv_indptr);
    p.kv_last_page_len = reinterpret_cast<const int32_t*>(workspace_ + layout_.last_page_len);
    p.kv_indices = kv_indices.data_as<const int32_t>();
    p.num_kv_splits = 1;  // the plan's items carry their own KV ranges and state slots
    // Every request index of any later plan is below max_batch (a captured launch stays valid).
    p.batch_size = layout_.max_batch;
    p.sm_scale_log2 = static_cast<float>(shape_.sm_scale * 1.4426950408889634);
    p.causal = shape_.causal;
    kernels::PlannedWork work{};
    work.cta_indptr = reinterpret_cast<const int32_t*>(workspace_ + layout_.cta_indptr);
    work.items = reinterpret_cast<const kernels::PlannedItem*>(workspace_ + layout_.items);
    work.num_merges = reinterpret_cast<const int32_t*>(workspace_ + layout_.num_merges);
    work.merges = reinterpret_cast<const kernels::PlannedMerge*>(workspace_ + layout_.merges);
    work.partial_o = reinterpret_cast<float*>(workspace_ + layout_.partial_o);
    work.partial_lse = reinterpret_cast<float*>(workspace_ + layout_.partial_lse);
    work.heads_per_cta = 1;

    launch_tile<Traits>(p, work, layout_.max_cols, s);
    // A captured launch must also merge for later plans that split.
    const int64_t merges = options_.cuda_graph ? layout_.max_merges : info_.num_merges;
    if (merges == 0) return;
    constexpr int kThreads = kernels::ContractionTraits::kThreadsPerBlock;
    const int64_t threads = merges * Traits::CTA_TILE_Q * (Traits::kLatentDim / kernels::ContractionTraits::kFloatsPerThread);
    kernels::mla_merge_planned_kernel<Traits><<<grid_stride_blocks(threads, kThreads), kThreads, 0, s>>>(p, work);
    TESSERA_CHECK_LAUNCH();
  }

  MlaRuntimeBounds bounds_;
  RuntimeOptions options_;
  MlaWorkspaceLayout layout_;
  char* workspace_ = nullptr;
  int device_ = 0;
  std::unique_ptr<PlanChannel> channel_;

  bool planned_ = false;
  MlaPlanShape shape_;
  int64_t page_size_ = 0;
  int64_t total_q_ = 0;
  int32_t tile_rows_ = 0;  // the plan's query tile (16: the narrow tile, 64)
  std::vector<int32_t> kv_indptr_host_;  // the plan's page ranges, for run()'s page-id checks
  PlanInfo info_;
};

}  // namespace detail

BatchMLAPagedWrapper::BatchMLAPagedWrapper(const TensorView& workspace, const MlaRuntimeBounds& bounds,
                                           const RuntimeOptions& options)
    : impl_(std::make_unique<detail::MlaRuntime>(workspace, bounds, options)) {}
BatchMLAPagedWrapper::~BatchMLAPagedWrapper() = default;
BatchMLAPagedWrapper::BatchMLAPagedWrapper(BatchMLAPagedWrapper&&) noexcept = default;
BatchMLAPagedWrapper& BatchMLAPagedWrapper::operator=(BatchMLAPagedWrapper&&) noexcept = default;

int64_t BatchMLAPagedWrapper::workspace_size(const MlaRuntimeBounds& bounds, const RuntimeOptions& options) {
  return detail::MlaRuntime::workspace_size(bounds, options);
}

void BatchMLAPagedWrapper::plan(const TensorView& qo_indptr, const TensorView& kv_indptr,
                                const TensorView& last_page_len, int64_t page_size, const MlaPlanShape& shape,
                                StreamHandle stream) {
  impl_->plan(qo_indptr, kv_indptr, last_page_len, page_size, shape, stream);
}

void BatchMLAPagedWrapper::run(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv,
                               const TensorView& kpe, const TensorView& kv_indices, const TensorView& o,
                               const TensorView& lse, StreamHandle stream) {
  impl_->run(q_nope, q_pe, ckv, kpe, kv_indices, o, lse, stream);
}

const PlanInfo& BatchMLAPagedWrapper::plan_info() const { return impl_->info(); }

}  // namespace tessera
