// The plan/run runtime (include/tessera/runtime.h): workspace layout, plan upload and the launch
// of the persistent kernels. The planner itself is host-only code (src/runtime/planner.cpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention/contraction.cuh"
#include "src/attention_args.h"
#include "src/check.h"
#include "src/env.h"
#include "src/cuda_utils.h"
#include "src/dispatch.h"
#include "src/fp8_attention.h"
#include "src/prefill_config.h"
#include "src/runtime/device_errors.h"
#include "src/runtime/plan_channel.h"
#include "src/runtime/plan_inputs.h"
#include "src/runtime/planner.h"
#include "src/tensor_checks.h"
#include "src/variant/jit_variant.h"
#include "tessera/runtime.h"

namespace tessera {
namespace detail {
namespace {

using kernels::KVFormatKind;

// The host planner and the kernels read the same bytes.
static_assert(sizeof(runtime::WorkItem) == sizeof(kernels::PlannedItem), "WorkItem layout");
static_assert(offsetof(runtime::WorkItem, request) == offsetof(kernels::PlannedItem, request), "WorkItem layout");
static_assert(offsetof(runtime::WorkItem, packed_begin) == offsetof(kernels::PlannedItem, packed_begin), "layout");
static_assert(offsetof(runtime::WorkItem, kv_begin) == offsetof(kernels::PlannedItem, kv_begin), "WorkItem layout");
static_assert(offsetof(runtime::WorkItem, kv_end) == offsetof(kernels::PlannedItem, kv_end), "WorkItem layout");
static_assert(offsetof(runtime::WorkItem, partial) == offsetof(kernels::PlannedItem, partial), "WorkItem layout");
static_assert(sizeof(runtime::MergeItem) == sizeof(kernels::PlannedMerge), "MergeItem layout");
static_assert(offsetof(runtime::MergeItem, partial_begin) == offsetof(kernels::PlannedMerge, partial_begin), "layout");
static_assert(offsetof(runtime::MergeItem, partial_end) == offsetof(kernels::PlannedMerge, partial_end), "layout");

constexpr int64_t kAlign = 256;
constexpr int kMinTileRows = 16;       // the smallest query tile
constexpr int kSplitMultiple = 128;    // fixed split sizes are multiples of every KV tile
// Cost model of docs/design.md §6 in KV-row units: an item's fixed work (query tile load, output
// store, pipeline fill) is charged per valid packed query row. The wgmma tile's fixed work is a
// larger share of a short item (its tile loop is faster, and its first Q K^T and last P V do not
// overlap the softmax), so it is charged more: on W4 the runtime was best at 2 and 3 and lost
// clearly below 2, and 3 keeps that margin for variants with longer per-item work. The mma.sync
// tiles were best at 1 (bench/results/LOG.md). TESSERA_PLAN_ALPHA overrides both (a tuning aid
// for benchmarks, like TESSERA_PREFILL_QTILE).
constexpr int64_t kCostAlpha = 1;
constexpr int64_t kCostAlphaWgmma = 3;
constexpr int64_t kCostBeta = 1;

int64_t cost_alpha(QTile t) {
  static const int64_t forced = [] {
    const char* text = std::getenv("TESSERA_PLAN_ALPHA");
    if (text == nullptr || *text == '\0') return int64_t{-1};
    char* end = nullptr;
    const long long v = std::strtoll(text, &end, 10);
    TESSERA_CHECK_ARG(end != text && *end == '\0' && v >= 0 && v <= 1000000)
        << "TESSERA_PLAN_ALPHA = " << text << ", expected an integer in [0, 1000000]";
    return static_cast<int64_t>(v);
  }();
  if (forced >= 0) return forced;
  return t == QTile::k128Wgmma ? kCostAlphaWgmma : kCostAlpha;
}

// TESSERA_PLAN_ORDER=cost turns off the planner's request-grouped assignment
// (PlannerConfig::group_by_request), =request (the default) keeps it: a tuning aid for the ablation.
bool plan_group_by_request() {
  static const bool grouped = env_choice("TESSERA_PLAN_ORDER", {"request", "cost"}) == "request";
  return grouped;
}

// TESSERA_PLAN_EXCHANGES=0 turns off the planner's exchange pass (PlannerConfig::exchanges), =1
// (the default) keeps it: a tuning aid for the ablation.
bool plan_exchanges() {
  static const bool on = env_choice("TESSERA_PLAN_EXCHANGES", {"1", "0"}) == "1";
  return on;
}

// TESSERA_PLAN_HEAD_GROUPS=0 keeps one KV head per CTA of the persistent grid (=1, the default,
// lets grid_shape group heads): a tuning aid for the ablation.
bool plan_head_groups() {
  static const bool allowed = env_choice("TESSERA_PLAN_HEAD_GROUPS", {"1", "0"}) == "1";
  return allowed;
}

// Splitting a batch whose (query tile, KV head) pairs already occupy at least half the SMs buys
// little balance but costs the merge and a start-up per chunk: the chunk size then stays >= this
// many KV rows (W1 B=16 L=1k, 128 pairs on 132 SMs, ran slower split than whole:
// bench/results/LOG.md).
constexpr int32_t kMinChunkWhenBusy = 1024;

int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

int q_tile_rows(PrefillHeadDims dims, QTile t) {
  const int rows = prefill_q_tile_rows(dims, t);
  TESSERA_CHECK(rows > 0, StatusCode::kInternal) << "no prefill configuration for head_dim " << dims.qk << " / "
                                                  << dims.vo << ", query tile " << q_tile_name(t);
  return rows;
}


int kv_tile_rows(PrefillHeadDims dims, QTile t) {
  const int rows = prefill_kv_tile_rows(dims, t);
  TESSERA_CHECK(rows > 0, StatusCode::kInternal) << "no prefill configuration for head_dim " << dims.qk << " / "
                                                  << dims.vo << ", query tile " << q_tile_name(t);
  return rows;
}

/// The head dims of a plan shape or bounds: (head_dim, head_dim_vo), head_dim_vo 0 meaning equal.
PrefillHeadDims head_dims_of(int64_t head_dim, int64_t head_dim_vo) {
  return PrefillHeadDims(static_cast<int>(head_dim), static_cast<int>(head_dim_vo == 0 ? head_dim : head_dim_vo));
}

/// CTAs of the persistent kernel per SM, from the occupancy API once per (device, dtype, head
/// dim, format, tile): plan() asks on every call.
int ctas_per_sm(DType dtype, DType kv_dtype, PrefillHeadDims head_dim, KVFormatKind format, QTile t) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int, int, int, int>, int> cache;
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  const auto key = std::make_tuple(device, static_cast<int>(dtype), static_cast<int>(kv_dtype), head_dim.qk,
                                   head_dim.vo, static_cast<int>(format), static_cast<int>(t));
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  int result = 0;
  if (is_fp8(dtype)) {
    result = fp8_attention_ctas_per_sm(head_dim.qk, format);  // plan() checked the FP8 attention call
  } else {
  TESSERA_DISPATCH_HALF_DTYPE(dtype, "dtype", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(kv_dtype, T, "kv_dtype", KVT, [&] {
      with_prefill_head_dim(head_dim, [&](auto head_dims_tag) {
        constexpr int kHeadDim = decltype(head_dims_tag)::kQk, kHeadDimVo = decltype(head_dims_tag)::kVo;
        constexpr PrefillHeadDims kDims(kHeadDim, kHeadDimVo);
        if constexpr (has_prefill_kv_storage(kDims, kv_storage_of<KVT, T>())) {
          result = persistent_ctas_per_sm<T, KVT, kHeadDim, kHeadDimVo>(format, t);
        } else {
          fail_no_prefill_config(kDims, t, cuda_type_name<KVT>());  // plan() checks first
        }
      });
    });
  });
  }
  TESSERA_CHECK(result >= 1, StatusCode::kInternal) << "the persistent kernel does not fit an SM (head_dim "
                                                     << head_dim.qk << " / " << head_dim.vo << ", query tile "
                                                     << q_tile_name(t) << ")";
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, result);
  return result;
}

/// The KVStorage of a validated K/V dtype under q's.
KVStorage kv_storage(DType kv_dtype, DType dtype) {
  return kv_dtype == dtype ? KVStorage::kSame : kv_dtype == DType::kE4M3 ? KVStorage::kE4M3 : KVStorage::kE5M2;
}

/// K/V's dtype: `kv_dtype` when set, else q's.
DType resolved_kv_dtype(const std::optional<DType>& kv_dtype, DType dtype) { return kv_dtype.value_or(dtype); }

/// A K/V dtype for q's `dtype` and head_dim: the same, or fp8 where the table builds it.
void check_kv_dtype(DType kv_dtype, DType dtype, PrefillHeadDims head_dim, const char* name) {
  TESSERA_CHECK_ARG(kv_dtype == dtype || is_fp8(kv_dtype))
      << name << " = " << kv_dtype << ", expected " << dtype << " (the dtype of q) or e4m3 / e5m2";
  TESSERA_CHECK(kv_dtype == dtype || has_prefill_kv_storage(head_dim, kv_storage(kv_dtype, dtype)),
                StatusCode::kUnsupported)
      << name << " = " << kv_dtype << ": fp8 K/V is not built for head_dim " << head_dim.qk
      << (head_dim.split() ? " with head_dim_vo " + std::to_string(head_dim.vo) : std::string())
      << " (src/config/attention_configs.txt lists the head dims: 64, 128, 256)";
}

/// An FP8 attention plan (shape.dtype e4m3): K/V e4m3, equal head dims of kFp8AttentionHeadDims,
/// ragged or paged KV, a device with wgmma, no CUDA graphs (options.dtype stays 16-bit), the query
/// tile auto or 128; the variant is checked once resolved (check_fp8_plan_variant).
void check_fp8_plan(const PlanShape& shape, DType kv_dtype, PrefillHeadDims head_dim, KVFormatKind format,
                    const RuntimeOptions& options) {
  TESSERA_CHECK(shape.dtype == DType::kE4M3, StatusCode::kUnsupported)
      << "shape.dtype = " << shape.dtype << ": FP8 attention takes e4m3 q, k and v";
  TESSERA_CHECK(kv_dtype == DType::kE4M3, StatusCode::kUnsupported)
      << "shape.kv_dtype = " << kv_dtype << " with shape.dtype = e4m3: FP8 attention takes K/V of q's dtype";
  TESSERA_CHECK(!head_dim.split() && std::find(std::begin(kFp8AttentionHeadDims), std::end(kFp8AttentionHeadDims),
                                               head_dim.qk) != std::end(kFp8AttentionHeadDims),
                StatusCode::kUnsupported)
      << "shape.head_dim = " << head_dim.qk << " with shape.dtype = e4m3: FP8 attention is built for head dims "
      << kFp8AttentionHeadDimsText << " (equal for q, k and v)";
  TESSERA_CHECK(format == KVFormatKind::kRagged || format == KVFormatKind::kPaged, StatusCode::kUnsupported)
      << "shape.dtype = e4m3: FP8 attention runs over ragged and paged KV only (not block-sparse)";
  TESSERA_CHECK(current_device_has_wgmma(), StatusCode::kUnsupported)
      << "shape.dtype = e4m3: FP8 attention runs on sm_90a (Hopper) only; this device or build has no wgmma";
  TESSERA_CHECK_ARG(options.q_tile == QueryTile::kAuto || options.q_tile == QueryTile::k128)
      << "options.q_tile = " << static_cast<int>(options.q_tile)
      << " with shape.dtype = e4m3: FP8 attention has the 128-row tile only (kAuto or k128)";
}

QTile to_qtile(QueryTile t, PrefillHeadDims head_dim, KVStorage kv) {
  TESSERA_CHECK_ARG(t != QueryTile::k128 || q_tile_128(head_dim, kv) != QTile::k64)
      << "options.q_tile = 128 with head_dim " << head_dim.qk << ", expected 16 or 64 (no 128-row tile at head_dim "
      << head_dim.qk << ")";
  switch (t) {
    case QueryTile::k16: return QTile::k16;
    case QueryTile::k64: return QTile::k64;
    case QueryTile::k128: return q_tile_128(head_dim, kv);
    case QueryTile::kAuto: break;
  }
  TESSERA_FAIL(StatusCode::kInternal) << "unresolved query tile";
}

int sm_budget(const RuntimeOptions& options) {
  const int sms = current_device_sm_count();
  TESSERA_CHECK_ARG(options.sm_budget >= 0) << "options.sm_budget = " << options.sm_budget << ", expected >= 0";
  return options.sm_budget == 0 ? sms : static_cast<int>(std::min<int64_t>(options.sm_budget, sms));
}

/// Whether the runtime's launches with `variant` skip the KV tiles its custom mask hides from a
/// whole work item (mask tile lists, docs/design.md §6.5): custom masks without a sliding window
/// (kernels::kVisitsMaskTileLists, which the kernels check too). TESSERA_MASK_TILE_SKIP=0 visits
/// every tile, for comparison.
bool visits_mask_tile_lists(const ResolvedVariant& variant) {
  static const bool enabled = env_choice("TESSERA_MASK_TILE_SKIP", {"1", "0"}) == "1";
  const uint32_t f = variant.features;
  return enabled && !variant.is_default && (f & kernels::feature::kCustomMask) != 0 &&
         (f & kernels::feature::kWindow) == 0;
}

void check_bounds(const RuntimeBounds& b) {
  TESSERA_CHECK_ARG(b.max_batch_size >= 1 && b.max_batch_size < INT32_MAX)
      << "bounds.max_batch_size = " << b.max_batch_size << ", expected in [1, 2^31 - 1)";
  TESSERA_CHECK_ARG(b.max_total_qo_tokens >= 1 && b.max_total_qo_tokens < INT32_MAX)
      << "bounds.max_total_qo_tokens = " << b.max_total_qo_tokens << ", expected in [1, 2^31 - 1)";
  check_prefill_heads(b.num_qo_heads, b.num_kv_heads, b.head_dim, b.head_dim_vo == 0 ? b.head_dim : b.head_dim_vo,
                      "bounds.head_dim_vo");
}

/// Byte offsets of the workspace sections, fixed by the bounds so a captured run() always finds
/// the plan at the same addresses. Sections [0, items + items capacity) mirror the pinned buffer.
struct WorkspaceLayout {
  int64_t num_merges = 0;     // i32 scalar
  int64_t num_segments = 0;   // i32 scalar: requests (block rows) of the plan, for device-side checks
  int64_t cta_indptr = 0;     // i32 [max_cols + 1]
  int64_t qo_indptr = 0;      // i32 [max_batch + 1]
  int64_t kv_indptr = 0;      // i32 [max_batch + 1]
  int64_t last_page_len = 0;  // i32 [max_batch]
  int64_t mask_indptr = 0;    // i32 [max_batch + 1]: a custom mask's byte offsets per request
  // Block-sparse KV over a paged cache (BatchBlockSparsePagedWrapper); empty for other formats:
  int64_t num_requests = 0;   // i32 scalar: the requests the block rows cut from
  int64_t page_indptr = 0;    // i32 [max_batch + 1]: pages per request
  int64_t segments = 0;       // BlockRowSegment [max_batch]: each block row's request
  int64_t merges = 0;         // PlannedMerge [max_merges]
  int64_t items = 0;          // PlannedItem [max_items]
  // u8 [max_items][kMaskTileListBytes]: written by mask_tile_lists_kernel at run(), never uploaded
  // (empty for block-sparse KV, which takes no custom mask)
  int64_t mask_tile_lists = 0;
  int64_t plan_end = 0;
  int64_t partial_lse = 0;    // f32 [partial_lse_floats]
  int64_t partial_o = 0;      // f32 [partial_floats]
  int64_t total = 0;
  int32_t max_cols = 0;
  int32_t max_batch = 0;
  int32_t max_items = 0;
  int32_t max_merges = 0;
  int64_t partial_floats = 0;
  int64_t partial_lse_floats = 0;
};

/// The index array a run() reads page ids (paged) or column blocks (block-sparse) from.
struct RunIds {
  /// Whose ranges segment the array: the plan's KV ranges (pages per request, column blocks per
  /// block row), or, for block-sparse KV over a paged cache, the pages of its requests.
  enum class Ranges { kPlanKV, kRequestPages };
  const TensorView* view = nullptr;
  const char* name = "";
  const int32_t* device_data = nullptr;  // the address the kernels read it through
  int64_t bound = 0;                     // ids in [0, bound)
  bool increasing = false;               // block-sparse: strictly increasing within a block row
  Ranges ranges = Ranges::kPlanKV;
};

}  // namespace

/// Everything the four wrappers share: bounds, workspace, pinned plan buffer, the last plan.
class AttentionRuntime {
 public:
  struct PlanInput {
    std::vector<int32_t> qo_indptr;      // [B + 1], host
    std::vector<int32_t> kv_indptr;      // [B + 1]: KV rows (ragged), pages (paged), blocks (BSR)
    std::vector<int32_t> last_page_len;  // [B] (paged only)
    std::vector<int32_t> qo_len, kv_len;  // per request (BSR: block row)
    int64_t page_size = 0;               // paged: page size; BSR: Bc
    int64_t block_rows = 0, num_rows = 0, num_cols = 0;  // BSR
    // BSR over a paged cache (empty otherwise): each block row's request and where its KV is, the
    // pages of the requests ([requests + 1]), and each block row's bound on its column blocks.
    std::vector<kernels::BlockRowSegment> segments;
    std::vector<int32_t> page_indptr;
    std::vector<int32_t> column_block_bounds;
    int64_t paged_block_size = 0;  // BSR over a paged cache: the page size
  };

  /// shared_partials: null, or where the split states live instead of the workspace's end
  /// (partial_bytes() of the same bounds and options), a region that wrappers whose runs never
  /// overlap may share (BatchCascadePagedWrapper's levels); the workspace then needs plan_bytes().
  AttentionRuntime(KVFormatKind format, bool decode, const TensorView& workspace, const RuntimeBounds& bounds,
                   const RuntimeOptions& options, char* shared_partials = nullptr)
      : format_(format), decode_(decode), bounds_(bounds), options_(options) {
    check_options();
    TESSERA_CHECK(!bounds_dims().split() || (!decode_ && format_ != KVFormatKind::kBlockSparse),
                  StatusCode::kUnsupported)
        << "bounds.head_dim_vo = " << bounds_.head_dim_vo << " != head_dim " << bounds_.head_dim << ": "
        << (decode_ ? "decode" : "block-sparse attention") << " takes equal head dims only";
    layout_ = compute_layout(format, decode, bounds, options);
    check_ndim(workspace, "workspace", 1);
    check_on_cuda(workspace, "workspace");
    check_contiguous(workspace, "workspace");
    if (shared_partials != nullptr) {
      TESSERA_CHECK_ARG(workspace.nbytes() >= layout_.plan_end)
          << "workspace has " << workspace.nbytes() << " bytes, expected >= " << layout_.plan_end
          << " (plan_workspace_size of these bounds)";
    } else {
      // Between min_workspace_size and workspace_size the split states' outputs take what is left:
      // plan() then caps the partial states at what fits (config.max_partials) and splits less.
      TESSERA_CHECK_ARG(workspace.nbytes() >= layout_.partial_o)
          << "workspace has " << workspace.nbytes() << " bytes, expected >= " << layout_.partial_o
          << " (min_workspace_size of these bounds; workspace_size, " << layout_.total
          << " bytes, holds the split states of the most split plans)";
      if (workspace.nbytes() < layout_.total) {
        layout_.partial_floats = (workspace.nbytes() - layout_.partial_o) / static_cast<int64_t>(sizeof(float));
        layout_.total = layout_.partial_o + layout_.partial_floats * static_cast<int64_t>(sizeof(float));
      }
    }
    TESSERA_CHECK_ARG(reinterpret_cast<uintptr_t>(workspace.data) % kAlign == 0)
        << "workspace.data is not 256-byte aligned";
    int device = 0;
    TESSERA_CUDA_CHECK(cudaGetDevice(&device));
    TESSERA_CHECK_ARG(workspace.device.id == device)
        << "workspace is on cuda:" << workspace.device.id << " but the current device is cuda:" << device;
    device_ = device;
    workspace_ = static_cast<char*>(workspace.data);
    partials_ = shared_partials != nullptr ? shared_partials : workspace_ + layout_.plan_end;
    channel_ = std::make_unique<PlanChannel>(workspace_, layout_.plan_end);
    if (options_.cuda_graph) {
      graph_tile_ = resolve_graph_tile();
      graph_grid_ = grid_shape(ctas_per_sm(options_.dtype, graph_kv_dtype(), bounds_dims(), format_, graph_tile_),
                               static_cast<int>(bounds_.num_kv_heads), graph_tile_);
    }
  }

  // The channel's destructor waits for the last upload and run (the Python wrappers build a new
  // wrapper over the same workspace when they grow).
  ~AttentionRuntime() = default;
  AttentionRuntime(const AttentionRuntime&) = delete;
  AttentionRuntime& operator=(const AttentionRuntime&) = delete;

  static int64_t workspace_size(KVFormatKind format, bool decode, const RuntimeBounds& bounds,
                                const RuntimeOptions& options) {
    return compute_layout(format, decode, bounds, options).total;
  }
  /// The smallest workspace a wrapper takes: the plan and the split states' LSEs, with no room
  /// for their outputs (plans that fit then split no KV range).
  static int64_t min_workspace_size(KVFormatKind format, bool decode, const RuntimeBounds& bounds,
                                    const RuntimeOptions& options) {
    return compute_layout(format, decode, bounds, options).partial_o;
  }
  /// The plan's part of workspace_size (the split states follow it).
  static int64_t plan_bytes(KVFormatKind format, bool decode, const RuntimeBounds& bounds,
                            const RuntimeOptions& options) {
    return compute_layout(format, decode, bounds, options).plan_end;
  }

  /// A plan for one side of a POD launch (BatchPODPagedWrapper): the query tile and the CTA
  /// slots of the grid are the POD wrapper's, not this runtime's choice.
  struct PlanSide {
    QTile q_tile;
    int ctas;  // CTA slots of the side (0: a side without requests, no CTAs)
  };

  /// The plan's K/V dtype, after checking shape.dtype and shape.kv_dtype with the head dims and
  /// the scales: an e4m3 q is FP8 attention (check_fp8_plan), through the prefill wrappers only.
  DType check_plan_dtypes(const PlanShape& shape, PrefillHeadDims head_dim, const PlanSide* side) const {
    const bool fp8_q = is_fp8(shape.dtype);
    TESSERA_CHECK_ARG(shape.dtype == DType::kF16 || shape.dtype == DType::kBF16 || fp8_q)
        << "shape.dtype = " << shape.dtype << ", expected f16 or bf16 (or e4m3: FP8 attention)";
    const DType kv_dtype = resolved_kv_dtype(shape.kv_dtype, shape.dtype);
    if (fp8_q) {
      TESSERA_CHECK(side == nullptr && !decode_, StatusCode::kUnsupported)
          << "shape.dtype = " << shape.dtype << ": FP8 attention runs through the prefill wrappers (the "
          << (decode_ ? "decode" : "POD") << " wrapper takes f16 or bf16 q)";
      check_fp8_plan(shape, kv_dtype, head_dim, format_, options_);
    } else {
      check_kv_dtype(kv_dtype, shape.dtype, head_dim, "shape.kv_dtype");
    }
    check_kv_scales(shape.attention.kv_scales, "shape.attention.kv_scales", kv_dtype, shape.num_kv_heads,
                    Device::cuda(device_), fp8_q);
    return kv_dtype;
  }

  /// The plan's batch, query rows and heads against the bounds the workspace was sized for.
  void check_plan_bounds(int64_t batch, int64_t total_qo, const HeadConfig& heads) const {
    TESSERA_CHECK_ARG(batch <= bounds_.max_batch_size)
        << "batch size " << batch << " exceeds bounds.max_batch_size = " << bounds_.max_batch_size;
    TESSERA_CHECK_ARG(total_qo <= bounds_.max_total_qo_tokens)
        << "the plan has " << total_qo << " query rows, exceeding bounds.max_total_qo_tokens = "
        << bounds_.max_total_qo_tokens;
    TESSERA_CHECK_ARG(heads.num_qo_heads <= bounds_.num_qo_heads)
        << "shape.num_qo_heads = " << heads.num_qo_heads << " exceeds bounds.num_qo_heads = " << bounds_.num_qo_heads;
    TESSERA_CHECK_ARG(heads.num_kv_heads <= bounds_.num_kv_heads)
        << "shape.num_kv_heads = " << heads.num_kv_heads << " exceeds bounds.num_kv_heads = " << bounds_.num_kv_heads;
    TESSERA_CHECK_ARG(heads.head_dim <= bounds_.head_dim)
        << "shape.head_dim = " << heads.head_dim << " exceeds bounds.head_dim = " << bounds_.head_dim;
  }

  /// side: null, or the POD side this plan is for.
  void plan(const PlanInput& in, const PlanShape& shape, StreamHandle stream, const PlanSide* side = nullptr) {
    raise_device_error(device_);
    const int64_t batch = static_cast<int64_t>(in.qo_len.size());
    const PrefillHeadDims head_dim = check_plan_head_dims(shape);
    const HeadConfig heads{shape.num_qo_heads, shape.num_kv_heads, shape.head_dim};
    // An e4m3 q is FP8 attention (src/fp8_attention.h): its own tile, not the configuration table's.
    const bool fp8_q = is_fp8(shape.dtype);
    const DType kv_dtype = check_plan_dtypes(shape, head_dim, side);
    // FP8 attention plans as the 16-bit wgmma tile, whose query and KV tile rows its tiles share.
    const KVStorage kv = fp8_q ? KVStorage::kSame : kv_storage(kv_dtype, shape.dtype);
    const int64_t total_qo = in.qo_indptr.empty() ? 0 : in.qo_indptr.back();
    check_plan_bounds(batch, total_qo, heads);
    TESSERA_CHECK_ARG(static_cast<int64_t>(in.page_indptr.size()) <= bounds_.max_batch_size + 1)
        << "batch size " << static_cast<int64_t>(in.page_indptr.size()) - 1
        << " exceeds bounds.max_batch_size = " << bounds_.max_batch_size;
    const int group = static_cast<int>(heads.num_qo_heads / heads.num_kv_heads);
    // sm_scale is checked here, not first at run().
    const double sm_scale = shape.attention.sm_scale < 0 ? -1.0 : shape.attention.sm_scale;
    TESSERA_CHECK_ARG(sm_scale != 0.0 && std::isfinite(sm_scale))
        << "shape.attention.sm_scale = " << shape.attention.sm_scale
        << ", expected a finite value > 0 (or < 0 for 1/sqrt(head_dim))";
    const ResolvedVariant variant = plan_variant(shape, heads, batch, in);
    check_split_head_dims_variant(head_dim, variant);
    TESSERA_CHECK(!fp8_q || variant.is_default, StatusCode::kUnsupported)
        << "shape.attention.variant is set with shape.dtype = e4m3: FP8 attention runs the default variant only "
           "(causal masking and sm_scale)";
    if (options_.cuda_graph) check_graph_invariants(in, shape, variant);

    const QTile q_tile = side != nullptr ? side->q_tile
                         : fp8_q         ? QTile::k128Wgmma
                                         : plan_q_tile(in, head_dim, kv, group, heads.num_kv_heads, variant);
    const GridShape grid =
        side != nullptr        ? grid_for_slots(side->ctas, static_cast<int>(heads.num_kv_heads), q_tile)
        : options_.cuda_graph ? graph_grid_
                              : grid_shape(ctas_per_sm(shape.dtype, kv_dtype, head_dim, format_, q_tile),
                                           static_cast<int>(heads.num_kv_heads), q_tile);
    const int cols = grid.cols;

    runtime::PlannerConfig config;
    config.group_size = group;
    config.q_tile_rows = q_tile_rows(head_dim, q_tile);
    config.kv_tile_rows = kv_tile_rows(head_dim, q_tile);
    config.num_ctas = std::max(1, cols);  // a POD side without CTAs has no requests either
    config.causal = shape.attention.causal && format_ != KVFormatKind::kBlockSparse;
    config.split_mode = plan_split_mode(variant);
    config.fixed_split_size = static_cast<int32_t>(options_.fixed_split_size);
    config.alpha = cost_alpha(q_tile);
    config.group_by_request = plan_group_by_request();
    config.exchanges = plan_exchanges();
    const std::vector<int32_t> kv_group = block_row_kv_groups(in);
    if (!kv_group.empty()) config.kv_group = kv_group.data();
    int64_t tile_pairs = 0;
    for (const int32_t qo : in.qo_len) {
      tile_pairs += (static_cast<int64_t>(qo) * group + config.q_tile_rows - 1) / config.q_tile_rows;
    }
    tile_pairs *= heads.num_kv_heads;
    if (2 * tile_pairs >= (side != nullptr ? side->ctas : sm_budget(options_))) {
      config.min_chunk_rows = kMinChunkWhenBusy;
    }
    config.beta = kCostBeta;
    const int64_t slot_floats = heads.num_kv_heads * config.q_tile_rows * static_cast<int64_t>(head_dim.vo);
    const int64_t slot_capacity =
        std::min(layout_.partial_floats / slot_floats,
                 layout_.partial_lse_floats / (heads.num_kv_heads * static_cast<int64_t>(config.q_tile_rows)));
    config.max_partials = static_cast<int32_t>(std::min<int64_t>(slot_capacity, INT32_MAX));
    runtime::Plan plan = runtime::plan_work(in.qo_len, in.kv_len, config);
    TESSERA_CHECK_ARG(plan.ok) << plan.error << " (the workspace holds " << slot_capacity
                               << " partial states for this shape; raise the bounds or the split size)";
    TESSERA_CHECK_ARG(static_cast<int64_t>(plan.items.size()) <= layout_.max_items)
        << "the plan has " << plan.items.size() << " work items, the workspace holds " << layout_.max_items
        << " (bounds.max_total_qo_tokens / max_batch_size too small for this batch?)";
    TESSERA_CHECK_ARG(static_cast<int64_t>(plan.merges.size()) <= layout_.max_merges)
        << "the plan has " << plan.merges.size() << " split tiles, the workspace holds " << layout_.max_merges;
    TESSERA_CHECK(cols <= layout_.max_cols, StatusCode::kInternal)
        << "grid of " << cols << " columns exceeds the workspace's " << layout_.max_cols;

    const int64_t plan_bytes = upload_plan(in, plan, stream);
    keep_plan(in, shape, kv_dtype, variant, q_tile);
    info_ = PlanInfo{};
    info_.batch_size = batch;
    info_.q_tile_rows = config.q_tile_rows;
    info_.kv_tile_rows = config.kv_tile_rows;
    info_.grid_cols = cols;
    info_.heads_per_cta = grid.heads_per_cta;
    info_.num_items = static_cast<int32_t>(plan.items.size());
    info_.num_partials = plan.num_partials;
    info_.num_merges = static_cast<int32_t>(plan.merges.size());
    info_.chunk_size = plan.chunk_size;
    info_.makespan = plan.makespan;
    info_.lower_bound = plan.lower_bound;
    info_.plan_bytes = plan_bytes;
    info_.grouped_by_request = plan.grouped_by_request;
  }

  /// options.split_kv as the planner's mode. Split chunks are merged by their log-sum-exp, which
  /// softmax-free attention (sigmoid, user variants with use_softmax = false) does not have: such
  /// a plan gives each query tile its whole KV range in one item, whatever split_kv says.
  runtime::SplitMode plan_split_mode(const ResolvedVariant& variant) const {
    if (!variant.use_softmax) return runtime::SplitMode::kNone;
    return options_.split_kv == SplitKV::kAuto    ? runtime::SplitMode::kAuto
           : options_.split_kv == SplitKV::kFixed ? runtime::SplitMode::kFixed
                                                  : runtime::SplitMode::kNone;
  }

  /// Block rows over a paged cache read their request's K/V: the planner groups them by it (the
  /// groups numbered densely, in the block rows' request order). Empty for the other formats.
  static std::vector<int32_t> block_row_kv_groups(const PlanInput& in) {
    std::vector<int32_t> groups;
    groups.reserve(in.segments.size());
    for (size_t g = 0; g < in.segments.size(); ++g) {
      const bool same = g > 0 && in.segments[g].request == in.segments[g - 1].request;
      groups.push_back(g == 0 ? 0 : groups.back() + (same ? 0 : 1));
    }
    return groups;
  }

  /// Writes the plan and the index arrays it keeps into the staging buffer and uploads them into
  /// the workspace's plan sections with one copy on `stream`; returns the bytes uploaded.
  int64_t upload_plan(const PlanInput& in, const runtime::Plan& plan, StreamHandle stream) {
    char* host = channel_->staging();
    const auto put = [&](int64_t section, const auto& values) {
      if (!values.empty()) std::memcpy(host + section, values.data(), values.size() * sizeof(values[0]));
    };
    const int32_t num_merges = static_cast<int32_t>(plan.merges.size());
    std::memcpy(host + layout_.num_merges, &num_merges, sizeof(num_merges));
    const int32_t num_segments = static_cast<int32_t>(in.qo_len.size());
    std::memcpy(host + layout_.num_segments, &num_segments, sizeof(num_segments));
    put(layout_.cta_indptr, plan.cta_indptr);
    put(layout_.qo_indptr, in.qo_indptr);
    put(layout_.kv_indptr, in.kv_indptr);
    put(layout_.last_page_len, in.last_page_len);
    put(layout_.mask_indptr, mask_indptr_host_);
    if (!in.segments.empty() || !in.page_indptr.empty()) {
      const int32_t requests = static_cast<int32_t>(in.page_indptr.size()) - 1;
      std::memcpy(host + layout_.num_requests, &requests, sizeof(requests));
      put(layout_.page_indptr, in.page_indptr);
      put(layout_.segments, in.segments);
    }
    put(layout_.merges, plan.merges);
    put(layout_.items, plan.items);
    const int64_t plan_bytes = layout_.items + static_cast<int64_t>(plan.items.size() * sizeof(runtime::WorkItem));
    channel_->upload(plan_bytes, reinterpret_cast<cudaStream_t>(stream));
    return plan_bytes;
  }

  /// What run() checks its arguments against and launches with, from the last plan.
  void keep_plan(const PlanInput& in, const PlanShape& shape, DType kv_dtype, const ResolvedVariant& variant,
                 QTile q_tile) {
    planned_ = true;
    kv_indptr_host_ = in.kv_indptr;
    page_indptr_host_ = in.page_indptr;
    column_block_bounds_ = in.column_block_bounds;
    paged_block_size_ = in.paged_block_size;
    shape_ = shape;
    kv_dtype_ = kv_dtype;
    keep_variant(variant);
    q_tile_ = q_tile;
    batch_ = static_cast<int64_t>(in.qo_len.size());
    total_qo_ = in.qo_indptr.empty() ? 0 : in.qo_indptr.back();
    total_kv_units_ = in.kv_indptr.empty() ? 0 : in.kv_indptr.back();
    page_size_ = in.page_size;
    block_rows_ = in.block_rows;
    num_rows_ = in.num_rows;
    num_cols_ = in.num_cols;
  }

  /// The plan's variant for its runs, which compile and launch a user variant's kernel from its
  /// spec: a copy of it (the caller's may be a temporary, e.g. the Python binding's), not a
  /// pointer to the caller's.
  void keep_variant(const ResolvedVariant& variant) {
    variant_ = variant;
    if (variant_.user != nullptr) {
      user_variant_ = std::make_shared<const VariantSpec>(*variant_.user);
      variant_.user = user_variant_.get();
    } else {
      user_variant_.reset();
    }
    shape_.attention.variant.user = variant_.user;
  }

  /// Checks run()'s common arguments against the plan: q [rows, Hq, D], o like q, lse.
  void check_run_queries(const TensorView& q, const TensorView& o, const TensorView& lse) const {
    raise_device_error(device_);
    TESSERA_CHECK_ARG(planned_) << "run() before plan(): call plan() with this batch's index arrays first";
    check_prefill_query(q, 3);
    TESSERA_CHECK_ARG(q.dtype == shape_.dtype) << "q.dtype = " << q.dtype << ", but the plan was made for "
                                               << shape_.dtype;
    check_size(q, "q", 1, shape_.num_qo_heads);
    check_size(q, "q", 2, shape_.head_dim);
    const int64_t needed = options_.cuda_graph ? bounds_.max_total_qo_tokens : total_qo_;
    TESSERA_CHECK_ARG(q.shape[0] >= needed && q.shape[0] <= INT32_MAX)
        << "q.shape[0] = " << q.shape[0] << ", expected >= " << needed
        << (options_.cuda_graph ? " (cuda_graph: bounds.max_total_qo_tokens)" : " (the plan's query rows)");
    check_outputs(q, o, lse, q.shape[0], plan_dims().vo);
  }

  /// Checks K [rows or pages..., Hkv, D] (V: is_v, its head dim head_dim_vo) against the plan.
  void check_run_kv_heads(const TensorView& k, const char* name, int64_t head_axis, bool is_v = false) const {
    check_size(k, name, static_cast<int>(head_axis), shape_.num_kv_heads);
    check_size(k, name, k.ndim - 1, is_v ? plan_dims().vo : shape_.head_dim);
  }
  /// The last plan's head dims.
  PrefillHeadDims plan_dims() const { return head_dims_of(shape_.head_dim, shape_.head_dim_vo); }
  /// The bounds' head dims.
  PrefillHeadDims bounds_dims() const { return head_dims_of(bounds_.head_dim, bounds_.head_dim_vo); }

  int64_t page_size() const { return page_size_; }
  /// Block-sparse KV over a paged cache: the plan's page size, and its pages (page_indptr[last]).
  int64_t paged_block_size() const { return paged_block_size_; }
  int64_t total_pages() const { return page_indptr_host_.empty() ? 0 : page_indptr_host_.back(); }
  /// Block-sparse KV over a paged cache: where the plan keeps its block rows' segments.
  const kernels::BlockRowSegment* device_segments() const {
    return reinterpret_cast<const kernels::BlockRowSegment*>(workspace_ + layout_.segments);
  }
  int64_t total_kv_units() const { return total_kv_units_; }
  int64_t num_cols() const { return num_cols_; }
  int64_t num_rows() const { return num_rows_; }
  int64_t block_rows() const { return block_rows_; }
  const PlanShape& shape() const { return shape_; }
  DType kv_dtype() const { return kv_dtype_; }  // of the last plan
  const PlanInfo& info() const { return info_; }

  /// Builds the query part of the kernel parameters from run()'s tensors and the plan.
  template <typename T, typename KVT, typename OT = T>
  kernels::AttentionParams<T, KVT, OT> query_part(const TensorView& q, const TensorView& o,
                                                  const TensorView& lse) const {
    const HeadConfig heads{shape_.num_qo_heads, shape_.num_kv_heads, shape_.head_dim};
    kernels::AttentionParams<T, KVT, OT> p = query_params<T, KVT, OT>(q, o, lse, heads, shape_.attention);
    p.qo_indptr = reinterpret_cast<const int32_t*>(workspace_ + layout_.qo_indptr);
    // The plan's KV ranges per request: rows (ragged), pages (paged) or column blocks (block-sparse).
    const int32_t* kv_indptr = reinterpret_cast<const int32_t*>(workspace_ + layout_.kv_indptr);
    switch (format_) {
      case KVFormatKind::kRagged: p.ragged.indptr = kv_indptr; break;
      case KVFormatKind::kPaged:
        p.paged.indptr = kv_indptr;
        p.paged.last_page_len = reinterpret_cast<const int32_t*>(workspace_ + layout_.last_page_len);
        break;
      case KVFormatKind::kBlockSparse: p.block_sparse.indptr = kv_indptr; break;
    }
    // The workspace's index arrays hold max_batch entries: every request index of any later
    // plan is inside them, so a captured launch stays valid.
    p.batch_size = layout_.max_batch;
    return p;
  }

  /// Launches the plan's kernels with `p` on `stream`, after the last plan upload and the last
  /// run, and records the run's completion. `ids` (paged and block-sparse runs): the index array
  /// run() was given, checked on the host first or, inside a capture, by a captured device check
  /// (check_run_ids_on_host, enqueue_run_ids_check).
  template <typename T, typename KVT, typename OT>
  void launch(const kernels::AttentionParams<T, KVT, OT>& p, const RunIds* ids, StreamHandle stream,
              const RunIds* more_ids = nullptr) {
    launch_ordered(
        ids, stream, [&](cudaStream_t s, bool capturing) { launch_kernels(p, s, capturing); }, more_ids);
  }

  /// Enqueues enqueue(stream, capturing) as this runtime's run: after the checks of `ids` (see launch), the
  /// last plan upload and the last run, and recorded as the last run. The POD wrapper nests two
  /// runtimes' calls around its one launch.
  /// more_ids: a second index array of the run (block-sparse KV over a paged cache: the pages).
  template <typename F>
  void launch_ordered(const RunIds* ids, StreamHandle stream, F&& enqueue, const RunIds* more_ids = nullptr) {
    const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    const bool capturing = PlanChannel::capturing(s);
    for (const RunIds* i : {ids, more_ids}) {
      if (i != nullptr && !capturing) check_run_ids_on_host(*i);
    }
    channel_->order_run(s, capturing);
    for (const RunIds* i : {ids, more_ids}) {
      if (capturing && i != nullptr) enqueue_run_ids_check(*i, stream);
    }
    enqueue(s, capturing);
    channel_->record_run(s, capturing);
    captured_ = captured_ || capturing;
  }

  /// New values of the last plan's user-variant parameters for the runs that follow (FlashInfer's
  /// JIT variants take them at run()): the names, kinds and tensor dtypes of the planned spec, in
  /// its order. With cuda_graph, once a run was captured the values are baked in: changing them
  /// is an error.
  void set_variant_params(const std::vector<VariantParam>& params) {
    raise_device_error(device_);
    TESSERA_CHECK_ARG(planned_) << "set_variant_params() before plan(): plan with the variant first";
    TESSERA_CHECK_ARG(user_variant_ != nullptr)
        << "set_variant_params(): the plan has no user variant (shape.attention.variant.user is null)";
    const VariantSpec& spec = *user_variant_;
    const std::vector<VariantParam>& planned = spec.params;
    TESSERA_CHECK_ARG(params.size() == planned.size())
        << "params has " << params.size() << " entries, expected " << planned.size() << " (variant '" << spec.name
        << "' of the plan)";
    for (size_t i = 0; i < params.size(); ++i) {
      const VariantParam& a = params[i];
      const VariantParam& b = planned[i];
      TESSERA_CHECK_ARG(a.name == b.name && a.kind == b.kind &&
                        (a.kind != VariantParam::Kind::kTensor || a.tensor.dtype == b.tensor.dtype))
          << "params[" << i << "] is '" << a.name << "' (kind " << static_cast<int>(a.kind) << "), expected '"
          << b.name << "' (kind " << static_cast<int>(b.kind)
          << (b.kind == VariantParam::Kind::kTensor ? std::string(", dtype ") + dtype_name(b.tensor.dtype) : "")
          << ") as variant '" << spec.name << "' of the plan declares it";
    }
    TensorView on_device;  // the tensors must be on the workspace's device
    on_device.device = Device::cuda(device_);
    kernels::VariantParams next = variant_.params;
    fill_param_slots(params, "variant '" + spec.name + "'", "variant param ", on_device, "the workspace", next.extra);
    TESSERA_CHECK_ARG(!(options_.cuda_graph && captured_) ||
                      std::memcmp(next.extra, variant_.params.extra, sizeof(next.extra)) == 0)
        << "cuda_graph: set_variant_params() changes the values of variant '" << spec.name
        << "', which a captured run() has baked in (keep the values; change a tensor's contents instead)";
    variant_.params = next;
    auto kept = std::make_shared<VariantSpec>(spec);
    kept->params = params;
    user_variant_ = std::move(kept);
    variant_.user = user_variant_.get();
    shape_.attention.variant.user = variant_.user;
  }

  /// The last plan's persistent launch: its work in the workspace, its grid and its contraction.
  /// `capturing`: the launch is being captured into a CUDA graph.
  PersistentLaunch persistent_launch(bool capturing) const {
    PersistentLaunch launch;
    launch.work.cta_indptr = reinterpret_cast<const int32_t*>(workspace_ + layout_.cta_indptr);
    launch.work.items = reinterpret_cast<const kernels::PlannedItem*>(workspace_ + layout_.items);
    launch.work.num_merges = reinterpret_cast<const int32_t*>(workspace_ + layout_.num_merges);
    launch.work.merges = reinterpret_cast<const kernels::PlannedMerge*>(workspace_ + layout_.merges);
    launch.work.partial_o = reinterpret_cast<float*>(partials_ + (layout_.partial_o - layout_.plan_end));
    launch.work.partial_lse = reinterpret_cast<float*>(partials_ + (layout_.partial_lse - layout_.plan_end));
    launch.work.heads_per_cta = info_.heads_per_cta;
    launch.grid_cols = info_.grid_cols;
    if (visits_mask_tile_lists(variant_)) {
      launch.mask_tile_lists = reinterpret_cast<uint8_t*>(workspace_ + layout_.mask_tile_lists);
      launch.work.mask_tile_lists = launch.mask_tile_lists;
      launch.mask_list_items = options_.cuda_graph && capturing ? layout_.max_items : info_.num_items;
    }
    // A captured launch must also contract for later plans that split (a replay runs the plan
    // current then); an eager one contracts this plan's splits only, none when it has none.
    const int64_t merges = options_.cuda_graph && capturing ? layout_.max_merges : info_.num_merges;
    const int64_t merge_threads = merges *
                                  shape_.num_kv_heads * info_.q_tile_rows * (plan_dims().vo / 8);
    launch.contraction_blocks =
        merge_threads == 0 ? 0 : grid_stride_blocks(merge_threads, kernels::ContractionTraits::kThreadsPerBlock);
    return launch;
  }
  QTile q_tile() const { return q_tile_; }
  const ResolvedVariant& variant() const { return variant_; }

  /// The device address a kernel reads `ids` through: the data pointer for device memory, the
  /// mapped address for pinned host memory.
  const int32_t* device_ids(const TensorView& ids, const char* name) const {
    if (ids.device.type == DeviceType::kCUDA) return ids.data_as<const int32_t>();
    cudaPointerAttributes attributes{};
    TESSERA_CUDA_CHECK(cudaPointerGetAttributes(&attributes, ids.data)) << " (" << name << ")";
    TESSERA_CHECK_ARG(attributes.type == cudaMemoryTypeHost && attributes.devicePointer != nullptr)
        << name << " is on " << ids.device << " but its memory is not pinned host memory the GPU can read "
        << "(allocate it with cudaHostAlloc / cudaMallocHost or register it with cudaHostRegister)";
    return static_cast<const int32_t*>(attributes.devicePointer);
  }

 private:
  /// Page ids or column blocks of run() in host memory (always) or in device memory (checked
  /// mode), checked against the plan's ranges before the launch. Host memory is read directly;
  /// device memory after a device-wide synchronisation (validation.cpp's checked mode).
  void check_run_ids_on_host(const RunIds& ids) const {
    if (!ids.view->device.is_host() && !checked_mode()) return;
    const bool request_pages = ids.ranges == RunIds::Ranges::kRequestPages;
    const std::vector<int32_t>& indptr = request_pages ? page_indptr_host_ : kv_indptr_host_;
    const std::vector<int32_t> values = read_index_values(*ids.view, ids.name, indptr.empty() ? 0 : indptr.back());
    if (ids.increasing) {
      check_column_blocks(indptr, values.data(), ids.bound, ids.name,
                          column_block_bounds_.empty() ? nullptr : &column_block_bounds_);
    } else {
      check_page_ids(indptr, values.data(), ids.bound, ids.name);
    }
  }

  /// Inside a capture the values the replays will read do not exist yet: the same check runs on
  /// the device at every replay, against the plan current then (the workspace's page ranges), and
  /// reports through device_errors.h.
  void enqueue_run_ids_check(const RunIds& ids, StreamHandle stream) const {
    if (!ids.view->device.is_host() && !checked_mode()) return;
    const bool request_pages = ids.ranges == RunIds::Ranges::kRequestPages;
    SegmentedIds c;
    c.ids = ids.device_data;
    c.indptr = reinterpret_cast<const int32_t*>(workspace_ + (request_pages ? layout_.page_indptr : layout_.kv_indptr));
    c.num_segments =
        reinterpret_cast<const int32_t*>(workspace_ + (request_pages ? layout_.num_requests : layout_.num_segments));
    c.max_segments = layout_.max_batch;
    c.capacity = ids.view->shape[0];
    c.bound = ids.bound;
    c.increasing = ids.increasing;
    enqueue_segmented_ids_check(
        c, ids.increasing ? DeviceCheckSite::kRuntimeColumnBlocks : DeviceCheckSite::kRuntimePageIds, stream);
  }

  /// The plan's persistent kernel (and contraction): the configuration table's tile, or for FP8
  /// attention (an fp8 q) its tile of the plan's head dim.
  template <typename Params>
  void launch_kernels(const Params& p, cudaStream_t s, bool capturing) {
    using T = typename Params::QType;
    using KVT = typename Params::KVType;
    if constexpr (kernels::IsFp8<T>::value) {
      launch_fp8_attention_persistent(p, format_, plan_dims().qk, persistent_launch(capturing), s);
    } else {
      launch_table_kernels<T, KVT>(p, s, capturing);
    }
  }
  template <typename T, typename KVT>
  void launch_table_kernels(const kernels::AttentionParams<T, KVT>& p, cudaStream_t s, bool capturing) {
    const PersistentLaunch launch = persistent_launch(capturing);
    with_prefill_head_dim(plan_dims(), [&](auto head_dims_tag) {
      constexpr int kHeadDim = decltype(head_dims_tag)::kQk, kHeadDimVo = decltype(head_dims_tag)::kVo;
      constexpr PrefillHeadDims kDims(kHeadDim, kHeadDimVo);
      if constexpr (has_prefill_kv_storage(kDims, kv_storage_of<KVT, T>())) {
        launch_persistent_head_dim<T, KVT, kHeadDim, kHeadDimVo>(p, variant_, format_, q_tile_, launch, s);
      } else {
        fail_no_prefill_config(kDims, q_tile_, cuda_type_name<KVT>());  // plan() checks first
      }
    });
  }

  /// The plan's query tile: the construction's with cuda_graph, options.q_tile when set, else
  /// chosen from the plan's rows.
  QTile plan_q_tile(const PlanInput& in, PrefillHeadDims head_dim, KVStorage kv, int group, int64_t num_kv_heads,
                    const ResolvedVariant& variant) const {
    if (options_.cuda_graph) return graph_tile_;
    if (options_.q_tile != QueryTile::kAuto) return to_qtile(options_.q_tile, head_dim, kv);
    const int64_t batch = static_cast<int64_t>(in.qo_len.size());
    const int64_t total_qo = in.qo_indptr.empty() ? 0 : in.qo_indptr.back();
    const double avg_rows = batch > 0 ? static_cast<double>(total_qo) / static_cast<double>(batch) : 1.0;
    QTile q_tile;
    if (options_.split_kv == SplitKV::kAuto) {
      int64_t pairs_at_16 = 0;
      for (const int32_t qo : in.qo_len) pairs_at_16 += (static_cast<int64_t>(qo) * group + 15) / 16;
      q_tile = choose_runtime_q_tile(head_dim, avg_rows * group, pairs_at_16 * num_kv_heads, sm_budget(options_), kv);
    } else {
      // kFixed / kNone promise a request the same bits in any batch: the tile (hence the KV tile
      // width and the accumulation order) must not depend on the batch's size.
      q_tile = choose_q_tile(head_dim, avg_rows * group, kv);
    }
    // A custom mask is read for every (row, key) of a tile whose bytes are not all set, valid row
    // or not: a 64-row tile over requests of <= 32 packed rows pays for its padding rows too
    // (W5's 8-token trees, bench/results/LOG.md, session 30).
    if ((variant.features & kernels::feature::kCustomMask) != 0 && q_tile == QTile::k64 && avg_rows * group <= 32) {
      q_tile = QTile::k16;
    }
    return q_tile;
  }

  /// The plan's variant: the built-in masks and logit transforms, RoPE, custom masks, sigmoid
  /// attention, and user variants whose hooks transform q, k, v or the logits or mask them (one
  /// that defines output_transform fails its JIT compile with a message naming the hook: split KV
  /// tiles are merged by their log-sum-exp, which a transformed output no longer carries).
  ResolvedVariant plan_variant(const PlanShape& shape, const HeadConfig& heads, int64_t batch, const PlanInput& in) {
    mask_indptr_host_.clear();
    const VariantOptions& given = shape.attention.variant;
    if (given.is_default()) return ResolvedVariant{};  // plan() is a hot path: nothing to resolve
    VariantOptions v = given;
    if (v.custom_mask.defined()) v.custom_mask_indptr = plan_custom_mask(given, in);
    int device = 0;
    TESSERA_CUDA_CHECK(cudaGetDevice(&device));
    TensorView on_device;  // stands for the tensors of run(): variant tensors must be on this device
    on_device.device = Device::cuda(device);
    VariantContext ctx;
    ctx.q = &on_device;
    ctx.batch_size = batch;
    ctx.num_qo_heads = heads.num_qo_heads;
    ctx.head_dim = heads.head_dim;
    ctx.sm_scale = resolved_sm_scale(shape.attention, heads.head_dim);
    ctx.block_sparse = format_ == KVFormatKind::kBlockSparse;
    const ResolvedVariant resolved = resolve_variant(v, ctx);
    // Not yet run against the oracle over block-sparse KV (the other formats are): refused rather
    // than offered untested.
    TESSERA_CHECK(resolved.use_softmax || format_ != KVFormatKind::kBlockSparse, StatusCode::kUnsupported)
        << "shape.attention.variant: attention without softmax (sigmoid, or a user variant with use_softmax = "
           "false) over block-sparse KV is not supported by the runtime yet (supported: softmax variants; the "
           "decode and prefill wrappers run it over ragged and paged KV)";
    return resolved;
  }

  /// A custom mask's byte offsets come to plan() on the host, as FlashInfer's plan computes them:
  /// checked against the mask's size and the plan's lengths, uploaded with the plan, and read by
  /// the kernels from the workspace (so a captured run() reads every later plan's). Returns the
  /// device view the variant takes.
  TensorView plan_custom_mask(const VariantOptions& v, const PlanInput& in) {
    const char* name = "shape.attention.variant.custom_mask_indptr";
    TESSERA_CHECK(format_ != KVFormatKind::kBlockSparse, StatusCode::kUnsupported)
        << "shape.attention.variant.custom_mask is not supported with block-sparse KV (mask with the block set)";
    TESSERA_CHECK_ARG(v.custom_mask_indptr.defined())
        << name << " is undefined but variant.custom_mask is set, expected both (host i32 [batch_size + 1])";
    const int64_t batch = static_cast<int64_t>(in.qo_len.size());
    mask_indptr_host_ = read_host_array(v.custom_mask_indptr, name, batch + 1);
    detail::check_view(v.custom_mask, "shape.attention.variant.custom_mask");
    const int64_t mask_bytes = v.custom_mask.numel();
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t bits = static_cast<int64_t>(in.qo_len[b]) * in.kv_len[b];
      const int64_t begin = mask_indptr_host_[b];
      TESSERA_CHECK_ARG(begin >= 0 && begin + (bits + 7) / 8 <= mask_bytes)
          << name << "[" << b << "] = " << begin << ": request " << b << "'s mask of " << in.qo_len[b] << " x "
          << in.kv_len[b] << " bits needs bytes [" << begin << ", " << begin + (bits + 7) / 8
          << "), expected within variant.custom_mask's " << mask_bytes << " bytes";
    }
    return TensorView(workspace_ + layout_.mask_indptr, DType::kI32, {batch + 1}, Device::cuda(device_));
  }

  void check_options() const {
    TESSERA_CHECK_ARG(options_.split_kv == SplitKV::kAuto || options_.split_kv == SplitKV::kFixed ||
                      options_.split_kv == SplitKV::kNone)
        << "options.split_kv = " << static_cast<int>(options_.split_kv) << ", expected kAuto, kFixed or kNone";
    if (options_.split_kv == SplitKV::kFixed) {
      TESSERA_CHECK_ARG(options_.fixed_split_size > 0 && options_.fixed_split_size % kSplitMultiple == 0 &&
                        options_.fixed_split_size < INT32_MAX)
          << "options.fixed_split_size = " << options_.fixed_split_size << ", expected a positive multiple of "
          << kSplitMultiple << " with split_kv = kFixed";
    }
    TESSERA_CHECK_ARG(options_.q_tile == QueryTile::kAuto || options_.q_tile == QueryTile::k16 ||
                      options_.q_tile == QueryTile::k64 || options_.q_tile == QueryTile::k128)
        << "options.q_tile = " << static_cast<int>(options_.q_tile) << ", expected kAuto, 16, 64 or 128";
    if (options_.cuda_graph) {
      TESSERA_CHECK_ARG(options_.dtype == DType::kF16 || options_.dtype == DType::kBF16)
          << "options.dtype = " << options_.dtype << ", expected f16 or bf16 (the dtype a captured run() uses)";
      check_kv_dtype(graph_kv_dtype(), options_.dtype, bounds_dims(), "options.kv_dtype");
    }
  }

  QTile resolve_graph_tile() const {
    const PrefillHeadDims head_dim = bounds_dims();
    const KVStorage kv = kv_storage(graph_kv_dtype(), options_.dtype);
    if (options_.q_tile != QueryTile::kAuto) return to_qtile(options_.q_tile, head_dim, kv);
    const double group = static_cast<double>(bounds_.num_qo_heads / bounds_.num_kv_heads);
    const double avg_rows = decode_ ? 1.0
                                    : static_cast<double>(bounds_.max_total_qo_tokens) /
                                          static_cast<double>(bounds_.max_batch_size);
    return choose_q_tile(head_dim, avg_rows * group, kv);
  }

  /// With cuda_graph: K/V's dtype (options.kv_dtype, or options.dtype).
  DType graph_kv_dtype() const { return resolved_kv_dtype(options_.kv_dtype, options_.dtype); }

  // The persistent grid: `cols` columns of one KV head's plan, each CTA running its column for
  // heads_per_cta KV heads in turn. One head per CTA leaves slots idle when num_kv_heads does not
  // divide the CTA slots (132 SMs, 8 heads: 16 x 8 = 128 CTAs); a group of heads per CTA fills
  // them (33 columns x 4 groups of 2). Only for the warp-specialised tile, whose ring carries
  // across items and heads (the next item's copies overlap the current one); the mma.sync tiles
  // refill their pipeline at every item, and more, shorter columns would add fills.
  struct GridShape {
    int cols;
    int heads_per_cta;
  };
  GridShape grid_shape(int per_sm, int num_kv_heads, QTile t) const {
    return grid_for_slots(per_sm * sm_budget(options_), num_kv_heads, t);
  }
  /// The grid of `slots` CTAs at most (0 slots: no columns).
  static GridShape grid_for_slots(int slots, int num_kv_heads, QTile t) {
    const int heads = std::max(1, num_kv_heads);
    if (slots == 0) return GridShape{0, 1};
    GridShape best{std::max(1, slots / heads), 1};
    if (t != QTile::k128Wgmma || !plan_head_groups()) return best;
    int best_used = (slots / heads) * heads;
    for (int hp = 2; hp <= heads; ++hp) {
      if (heads % hp != 0) continue;
      const int groups = heads / hp, cols = slots / groups;
      if (cols * groups > best_used) {
        best = GridShape{cols, hp};
        best_used = cols * groups;
      }
    }
    return best;
  }

  /// The plan's head dims (shape.head_dim, shape.head_dim_vo): equal, or (prefill over ragged or
  /// paged KV) a pair of kSupportedPrefillSplitHeadDims.
  PrefillHeadDims check_plan_head_dims(const PlanShape& shape) const {
    const PrefillHeadDims dims = head_dims_of(shape.head_dim, shape.head_dim_vo);
    TESSERA_CHECK_ARG(shape.head_dim_vo >= 0) << "shape.head_dim_vo = " << shape.head_dim_vo
                                              << ", expected >= 0 (0: head_dim)";
    if (dims.split()) {
      TESSERA_CHECK(!decode_ && format_ != KVFormatKind::kBlockSparse, StatusCode::kUnsupported)
          << "shape.head_dim_vo = " << shape.head_dim_vo << " != head_dim " << shape.head_dim << ": "
          << (decode_ ? "decode" : "block-sparse attention") << " takes equal head dims only";
    }
    check_prefill_heads(shape.num_qo_heads, shape.num_kv_heads, shape.head_dim, dims.vo, "shape.head_dim_vo");
    const PrefillHeadDims bounds = bounds_dims();
    TESSERA_CHECK_ARG((!dims.split() && !bounds.split()) || (dims.qk == bounds.qk && dims.vo == bounds.vo))
        << "shape.head_dim / head_dim_vo = " << dims.qk << " / " << dims.vo << ", expected the bounds' " << bounds.qk
        << " / " << bounds.vo << " (split head dims are planned at the bounds' pair)";
    return dims;
  }

  /// Split head dims run the default variant only (causal masking and sm_scale).
  static void check_split_head_dims_variant(PrefillHeadDims dims, const ResolvedVariant& variant) {
    TESSERA_CHECK(!dims.split() || variant.is_default, StatusCode::kUnsupported)
        << "shape.attention.variant is set: head_dim " << dims.qk << " != head_dim_vo " << dims.vo
        << " runs the default variant only (causal masking and sm_scale)";
  }

  void check_graph_invariants(const PlanInput& in, const PlanShape& shape, const ResolvedVariant& variant) const {
    TESSERA_CHECK_ARG(shape.num_kv_heads == bounds_.num_kv_heads && shape.head_dim == bounds_.head_dim)
        << "cuda_graph: shape has num_kv_heads = " << shape.num_kv_heads << ", head_dim = " << shape.head_dim
        << ", expected the bounds' " << bounds_.num_kv_heads << " and " << bounds_.head_dim
        << " (the captured grid is fixed)";
    TESSERA_CHECK_ARG(shape.dtype == options_.dtype)
        << "cuda_graph: shape.dtype = " << shape.dtype << ", expected options.dtype = " << options_.dtype;
    TESSERA_CHECK_ARG(resolved_kv_dtype(shape.kv_dtype, shape.dtype) == graph_kv_dtype())
        << "cuda_graph: shape.kv_dtype = " << resolved_kv_dtype(shape.kv_dtype, shape.dtype)
        << ", expected options.kv_dtype = " << graph_kv_dtype();
    if (!planned_) return;
    TESSERA_CHECK_ARG(shape.num_qo_heads == shape_.num_qo_heads && shape.attention.causal == shape_.attention.causal &&
                      shape.attention.sm_scale == shape_.attention.sm_scale && in.page_size == page_size_ &&
                      in.block_rows == block_rows_ && in.num_rows == num_rows_ && in.num_cols == num_cols_ &&
                      in.paged_block_size == paged_block_size_)
        << "cuda_graph: this plan changes num_qo_heads, causal, sm_scale, the page size or the block-sparse "
           "shape, which a captured run() has baked in (first plan: num_qo_heads = "
        << shape_.num_qo_heads << ", causal = " << shape_.attention.causal << ", page_size = " << page_size_
        << "; this plan: " << shape.num_qo_heads << ", " << shape.attention.causal << ", " << in.page_size << ")";
    const bool same_user = variant.user == nullptr
                               ? variant_.user == nullptr
                               : variant_.user != nullptr && variant.user->source == variant_.user->source &&
                                     variant.user->name == variant_.user->name;
    TESSERA_CHECK_ARG(variant.features == variant_.features && same_user &&
                      std::memcmp(&variant.params, &variant_.params, sizeof(variant.params)) == 0)
        << "cuda_graph: this plan changes shape.attention.variant (features " << variant.features << ", first plan "
        << variant_.features << ", its user variant or one of its values), which a captured run() has baked in";
    const KVScales& a = shape.attention.kv_scales;
    const KVScales& b = shape_.attention.kv_scales;
    TESSERA_CHECK_ARG(a.k == b.k && a.v == b.v && a.k_device.data == b.k_device.data &&
                      a.v_device.data == b.v_device.data && a.k_device.numel() == b.k_device.numel() &&
                      a.v_device.numel() == b.v_device.numel())
        << "cuda_graph: this plan changes shape.attention.kv_scales (host factors k = " << a.k << ", v = " << a.v
        << "; first plan " << b.k << ", " << b.v << ", or the device tensors), which a captured run() has baked in; "
           "keep the factors and change the values in the device tensors instead";
  }

  static WorkspaceLayout compute_layout(KVFormatKind format, bool decode, const RuntimeBounds& bounds,
                                        const RuntimeOptions& options) {
    check_bounds(bounds);
    WorkspaceLayout l;
    // The most CTAs any configuration of these bounds can put on the device (fp8 K/V's tiles
    // hold fewer bytes per stage, so they count too; e5m2's are e4m3's sizes).
    int per_sm = 1;
    for (int d : kPrefillHeadDims) {
      if (d > bounds.head_dim) continue;
      for (QTile t : {QTile::k16, QTile::k64, QTile::k128}) {
        for (DType kv : {DType::kBF16, DType::kE4M3}) {
          if (!has_prefill_config(d, t, kv_storage(kv, DType::kBF16))) continue;
          per_sm = std::max(per_sm, ctas_per_sm(DType::kBF16, kv, d, format, t));
        }
      }
    }
    const int64_t max_ctas = std::max<int64_t>(static_cast<int64_t>(per_sm) * sm_budget(options), bounds.num_kv_heads);
    const int64_t max_group = bounds.num_qo_heads;  // MQA: every query head in one group
    const int64_t max_tiles =
        (bounds.max_total_qo_tokens * max_group + kMinTileRows - 1) / kMinTileRows + bounds.max_batch_size;
    // Partial states: a plan with chunk size L = total / CTAs splits at most 2 chunks per CTA
    // (docs/design.md §6); tile rows of the largest tile the wrapper uses.
    const int64_t max_tile_rows =
        decode ? std::min<int64_t>(kMaxPrefillQTileRows, std::max<int64_t>(16, max_group)) : kMaxPrefillQTileRows;
    l.partial_floats = 2 * max_ctas * max_tile_rows * bounds.head_dim;
    l.partial_lse_floats = 2 * max_ctas * max_tile_rows;
    const int64_t max_partials = l.partial_lse_floats / kMinTileRows;
    const int64_t max_items = max_tiles + max_partials;
    TESSERA_CHECK_ARG(max_items < INT32_MAX / 32) << "bounds too large: " << max_items << " work items";
    l.max_cols = static_cast<int32_t>(max_ctas);
    l.max_batch = static_cast<int32_t>(bounds.max_batch_size);
    l.max_items = static_cast<int32_t>(max_items);
    l.max_merges = static_cast<int32_t>(max_partials / 2 + 1);
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
    l.mask_indptr = section((l.max_batch + 1) * sizeof(int32_t));
    const bool paged_blocks = format == KVFormatKind::kBlockSparse;
    l.num_requests = section(paged_blocks ? sizeof(int32_t) : 0);
    l.page_indptr = section(paged_blocks ? (l.max_batch + 1) * sizeof(int32_t) : 0);
    l.segments = section(paged_blocks ? l.max_batch * sizeof(kernels::BlockRowSegment) : 0);
    l.merges = section(l.max_merges * sizeof(kernels::PlannedMerge));
    l.items = section(l.max_items * sizeof(kernels::PlannedItem));
    l.mask_tile_lists = section(paged_blocks ? 0 : static_cast<int64_t>(l.max_items) * kernels::kMaskTileListBytes);
    l.plan_end = at;
    l.partial_lse = section(l.partial_lse_floats * sizeof(float));
    l.partial_o = section(l.partial_floats * sizeof(float));
    l.total = at;
    return l;
  }

  KVFormatKind format_;
  bool decode_;
  RuntimeBounds bounds_;
  RuntimeOptions options_;
  WorkspaceLayout layout_;
  char* workspace_ = nullptr;
  char* partials_ = nullptr;  // the split states: the workspace's end, or a shared region
  std::unique_ptr<PlanChannel> channel_;  // plan uploads and the ordering of runs
  int device_ = 0;
  QTile graph_tile_ = QTile::k16;
  GridShape graph_grid_{0, 1};

  bool planned_ = false;
  std::vector<int32_t> kv_indptr_host_;  // the plan's page (block) ranges, for run()'s id checks
  std::vector<int32_t> mask_indptr_host_;  // the plan's custom-mask byte offsets (empty: no mask)
  // Block-sparse KV over a paged cache (else empty / 0): the plan's pages per request, each block
  // row's bound on its column blocks, the page size.
  std::vector<int32_t> page_indptr_host_;
  std::vector<int32_t> column_block_bounds_;
  int64_t paged_block_size_ = 0;
  PlanShape shape_;
  DType kv_dtype_ = DType::kBF16;  // K/V's dtype in the last plan (shape_.kv_dtype resolved)
  ResolvedVariant variant_;
  std::shared_ptr<const VariantSpec> user_variant_;  // the last plan's user variant, owned
  bool captured_ = false;                             // a run() was captured into a CUDA graph
  QTile q_tile_ = QTile::k16;
  int64_t batch_ = 0, total_qo_ = 0, total_kv_units_ = 0;
  int64_t page_size_ = 0, block_rows_ = 0, num_rows_ = 0, num_cols_ = 0;
  PlanInfo info_;
};

namespace {

/// Paged plan input: page ranges to KV lengths.
void paged_lengths(AttentionRuntime::PlanInput& in, const TensorView& kv_indptr, const TensorView& last_page_len,
                   int64_t page_size, int64_t batch) {
  const PagedLengths paged = read_paged_lengths(kv_indptr, last_page_len, page_size, batch);
  in.kv_indptr = paged.kv_indptr;
  in.last_page_len = paged.last_page_len;
  in.kv_len = paged.kv_len;
  in.page_size = page_size;
}

/// run()'s page ids or column blocks: contiguous 1-D i32 with at least `needed` entries (the plan's
/// total), in device memory on q's device or in pinned host memory (read by the kernels through
/// its mapped address, and checked on the host at every run()).
void check_run_index_array(const TensorView& t, const char* name, const TensorView& q, int64_t needed,
                           const char* needed_meaning) {
  check_ndim(t, name, 1);
  check_dtype(t, name, {DType::kI32});
  TESSERA_CHECK_ARG(t.device == q.device || t.device.type == DeviceType::kCUDAHost)
      << name << ".device = " << t.device << ", expected " << q.device
      << " (the device of q) or cuda_host (pinned host memory)";
  TESSERA_CHECK_ARG(t.shape[0] <= 1 || t.strides[0] == 1)
      << name << ".strides[0] = " << t.strides[0] << ", expected 1 (index arrays must be contiguous)";
  TESSERA_CHECK_ARG(t.shape[0] >= needed && t.shape[0] < INT32_MAX)
      << name << " has " << t.shape[0] << " entries, expected >= " << needed_meaning << " = " << needed
      << " of the plan (and < 2^31)";
  TESSERA_CHECK_ARG(t.defined()) << name << ".data = null, expected " << t.shape[0] << " entries";
}

/// run()'s K/V in the dtype the plan was made for.
void check_plan_kv_dtype(const AttentionRuntime& rt, const TensorView& k, const TensorView& v) {
  TESSERA_CHECK_ARG(k.dtype == rt.kv_dtype() && v.dtype == rt.kv_dtype())
      << "k.dtype = " << k.dtype << ", v.dtype = " << v.dtype << ", but the plan was made for " << rt.kv_dtype()
      << " K/V (shape.kv_dtype)";
}

/// run()'s paged cache against the plan (page_size and total_pages: the plan's; block-sparse KV
/// over a paged cache keeps them apart from its column blocks).
void check_paged_cache(const AttentionRuntime& rt, const TensorView& q, const PagedKVCache& kv, int64_t page_size,
                       int64_t total_pages) {
  TESSERA_CHECK_ARG(kv.layout == Layout::kNHD || kv.layout == Layout::kHND)
      << "kv.layout = " << static_cast<int>(kv.layout) << ", expected NHD or HND";
  check_kv_operand(kv.k, "kv.k", 4, q);
  check_kv_operand(kv.v, "kv.v", 4, q);
  TESSERA_CHECK_ARG(kv.k.dtype == rt.kv_dtype() && kv.v.dtype == rt.kv_dtype())
      << "kv.k.dtype = " << kv.k.dtype << ", kv.v.dtype = " << kv.v.dtype << ", but the plan was made for "
      << rt.kv_dtype() << " K/V (shape.kv_dtype)";
  check_same_device(q, "q", kv.k, "kv.k");
  check_same_device(q, "q", kv.v, "kv.v");
  for (int d = 0; d < 3; ++d) check_size(kv.v, "kv.v", d, kv.k.shape[d]);
  const int slot_axis = kv.layout == Layout::kNHD ? 1 : 2;
  TESSERA_CHECK_ARG(kv.k.shape[slot_axis] == page_size)
      << "kv.k has page size " << kv.k.shape[slot_axis] << " (shape[" << slot_axis << "]), but the plan was made for "
      << page_size;
  rt.check_run_kv_heads(kv.k, "kv.k", kv.layout == Layout::kNHD ? 2 : 1);
  rt.check_run_kv_heads(kv.v, "kv.v", kv.layout == Layout::kNHD ? 2 : 1, /*is_v=*/true);
  TESSERA_CHECK_ARG(kv.k.shape[0] < INT32_MAX) << "kv.k has " << kv.k.shape[0] << " pages, expected < 2^31";
  check_run_index_array(kv.indices, "kv.indices", q, total_pages, "kv_indptr[B]");
}

template <typename Params>
void paged_cache_params(Params& p, const PagedKVCache& kv) {
  PagedKV view;
  view.k = kv.k;
  view.v = kv.v;
  view.layout = kv.layout;
  view.indices = kv.indices;
  // The page ranges, last-page lengths and batch bound come from the plan (query_part).
  const int32_t* indptr = p.paged.indptr;
  const int32_t* last_page_len = p.paged.last_page_len;
  const int32_t batch = p.batch_size;
  paged_kv_params(p, view);
  p.paged.indptr = indptr;
  p.paged.last_page_len = last_page_len;
  p.batch_size = batch;
}

/// Runs f(p) with the kernel parameters of run()'s q, o and lse (the query part; the caller adds the
/// KV's): AttentionParams<T, KVT> for an f16/bf16 q, KVT the plan's K/V type (`kv_name` in its
/// error), or AttentionParams<e4m3, e4m3, OT> for FP8 attention, OT o's type (the plan checked it).
template <typename F>
void with_run_params(AttentionRuntime& rt, const TensorView& q, const TensorView& o, const TensorView& lse,
                     const char* kv_name, F&& f) {
  if (is_fp8(q.dtype)) {
    using F8 = __nv_fp8_e4m3;
    TESSERA_DISPATCH_HALF_DTYPE(o.dtype, "o", OT, [&] { f(rt.query_part<F8, F8, OT>(q, o, lse)); });
    return;
  }
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(rt.kv_dtype(), T, kv_name, KVT, [&] { f(rt.query_part<T, KVT>(q, o, lse)); });
  });
}

/// run()'s index array `ids` (page ids, or increasing column blocks) as the checks and the kernels
/// take it: its device address and the bound of its values.
RunIds run_ids(const AttentionRuntime& rt, const TensorView& ids, const char* name, int64_t bound,
               bool increasing = false, RunIds::Ranges ranges = RunIds::Ranges::kPlanKV) {
  RunIds r;
  r.view = &ids;
  r.name = name;
  r.device_data = rt.device_ids(ids, name);
  r.bound = bound;
  r.increasing = increasing;
  r.ranges = ranges;
  return r;
}

void run_paged(AttentionRuntime& rt, const TensorView& q, const PagedKVCache& kv, const TensorView& o,
               const TensorView& lse, StreamHandle stream) {
  rt.check_run_queries(q, o, lse);
  check_paged_cache(rt, q, kv, rt.page_size(), rt.total_kv_units());
  const RunIds ids = run_ids(rt, kv.indices, "kv.indices", kv.k.shape[0]);
  with_run_params(rt, q, o, lse, "kv.k", [&](auto p) {
    paged_cache_params(p, kv);
    p.paged.indices = ids.device_data;
    rt.launch(p, &ids, stream);
  });
}

}  // namespace
}  // namespace detail

PagedKVCache PagedKVCache::from_combined(const TensorView& kv, Layout layout, const TensorView& indices) {
  const PagedKV split = PagedKV::from_combined(kv, layout, TensorView{}, indices, TensorView{});
  PagedKVCache out;
  out.k = split.k;
  out.v = split.v;
  out.layout = layout;
  out.indices = indices;
  return out;
}

using detail::AttentionRuntime;
using kernels::KVFormatKind;

// --- BatchDecodeWrapper ----------------------------------------------------------------------

BatchDecodeWrapper::BatchDecodeWrapper(const TensorView& workspace, const RuntimeBounds& bounds,
                                       const RuntimeOptions& options)
    : impl_(std::make_unique<AttentionRuntime>(KVFormatKind::kPaged, true, workspace, bounds, options)) {}
BatchDecodeWrapper::~BatchDecodeWrapper() = default;
BatchDecodeWrapper::BatchDecodeWrapper(BatchDecodeWrapper&&) noexcept = default;
BatchDecodeWrapper& BatchDecodeWrapper::operator=(BatchDecodeWrapper&&) noexcept = default;

int64_t BatchDecodeWrapper::workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::workspace_size(KVFormatKind::kPaged, true, bounds, options);
}
int64_t BatchDecodeWrapper::min_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::min_workspace_size(KVFormatKind::kPaged, true, bounds, options);
}

void BatchDecodeWrapper::plan(const TensorView& kv_indptr, const TensorView& last_page_len, int64_t page_size,
                              const PlanShape& shape, StreamHandle stream) {
  AttentionRuntime::PlanInput in;
  TESSERA_CHECK_ARG(kv_indptr.ndim == 1 && kv_indptr.shape[0] >= 1)
      << "kv_indptr must be 1-D with batch_size + 1 >= 1 entries, got " << kv_indptr.describe();
  const int64_t batch = kv_indptr.shape[0] - 1;
  detail::paged_lengths(in, kv_indptr, last_page_len, page_size, batch);
  in.qo_indptr.resize(static_cast<size_t>(batch + 1));
  for (int64_t b = 0; b <= batch; ++b) in.qo_indptr[b] = static_cast<int32_t>(b);
  in.qo_len.assign(static_cast<size_t>(batch), 1);
  impl_->plan(in, shape, stream);
}

void BatchDecodeWrapper::run(const TensorView& q, const PagedKVCache& kv, const TensorView& o, const TensorView& lse,
                             StreamHandle stream) {
  detail::run_paged(*impl_, q, kv, o, lse, stream);
}

const PlanInfo& BatchDecodeWrapper::plan_info() const { return impl_->info(); }
void BatchDecodeWrapper::set_variant_params(const std::vector<VariantParam>& params) {
  impl_->set_variant_params(params);
}

// --- BatchPrefillPagedWrapper ----------------------------------------------------------------

BatchPrefillPagedWrapper::BatchPrefillPagedWrapper(const TensorView& workspace, const RuntimeBounds& bounds,
                                                   const RuntimeOptions& options)
    : impl_(std::make_unique<AttentionRuntime>(KVFormatKind::kPaged, false, workspace, bounds, options)) {}
BatchPrefillPagedWrapper::~BatchPrefillPagedWrapper() = default;
BatchPrefillPagedWrapper::BatchPrefillPagedWrapper(BatchPrefillPagedWrapper&&) noexcept = default;
BatchPrefillPagedWrapper& BatchPrefillPagedWrapper::operator=(BatchPrefillPagedWrapper&&) noexcept = default;

int64_t BatchPrefillPagedWrapper::workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::workspace_size(KVFormatKind::kPaged, false, bounds, options);
}
int64_t BatchPrefillPagedWrapper::min_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::min_workspace_size(KVFormatKind::kPaged, false, bounds, options);
}

BatchPrefillPagedWrapper::BatchPrefillPagedWrapper(const TensorView& plan_workspace, char* shared_partials,
                                                   const RuntimeBounds& bounds, const RuntimeOptions& options)
    : impl_(std::make_unique<AttentionRuntime>(KVFormatKind::kPaged, false, plan_workspace, bounds, options,
                                               shared_partials)) {}

int64_t BatchPrefillPagedWrapper::plan_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::plan_bytes(KVFormatKind::kPaged, false, bounds, options);
}

void BatchPrefillPagedWrapper::plan(const TensorView& qo_indptr, const TensorView& kv_indptr,
                                    const TensorView& last_page_len, int64_t page_size, const PlanShape& shape,
                                    StreamHandle stream) {
  AttentionRuntime::PlanInput in;
  in.qo_indptr = detail::read_host_indptr(qo_indptr, "qo_indptr");
  const int64_t batch = static_cast<int64_t>(in.qo_indptr.size()) - 1;
  detail::fill_lengths(in.qo_indptr, in.qo_len);
  detail::paged_lengths(in, kv_indptr, last_page_len, page_size, batch);
  impl_->plan(in, shape, stream);
}

void BatchPrefillPagedWrapper::run(const TensorView& q, const PagedKVCache& kv, const TensorView& o,
                                   const TensorView& lse, StreamHandle stream) {
  detail::run_paged(*impl_, q, kv, o, lse, stream);
}

const PlanInfo& BatchPrefillPagedWrapper::plan_info() const { return impl_->info(); }
void BatchPrefillPagedWrapper::set_variant_params(const std::vector<VariantParam>& params) {
  impl_->set_variant_params(params);
}

// --- BatchPrefillRaggedWrapper ---------------------------------------------------------------

BatchPrefillRaggedWrapper::BatchPrefillRaggedWrapper(const TensorView& workspace, const RuntimeBounds& bounds,
                                                     const RuntimeOptions& options)
    : impl_(std::make_unique<AttentionRuntime>(KVFormatKind::kRagged, false, workspace, bounds, options)) {}
BatchPrefillRaggedWrapper::~BatchPrefillRaggedWrapper() = default;
BatchPrefillRaggedWrapper::BatchPrefillRaggedWrapper(BatchPrefillRaggedWrapper&&) noexcept = default;
BatchPrefillRaggedWrapper& BatchPrefillRaggedWrapper::operator=(BatchPrefillRaggedWrapper&&) noexcept = default;

int64_t BatchPrefillRaggedWrapper::workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::workspace_size(KVFormatKind::kRagged, false, bounds, options);
}
int64_t BatchPrefillRaggedWrapper::min_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::min_workspace_size(KVFormatKind::kRagged, false, bounds, options);
}

void BatchPrefillRaggedWrapper::plan(const TensorView& qo_indptr, const TensorView& kv_indptr, const PlanShape& shape,
                                     StreamHandle stream) {
  AttentionRuntime::PlanInput in;
  in.qo_indptr = detail::read_host_indptr(qo_indptr, "qo_indptr");
  in.kv_indptr = detail::read_host_indptr(kv_indptr, "kv_indptr");
  TESSERA_CHECK_ARG(in.kv_indptr.size() == in.qo_indptr.size())
      << "kv_indptr has " << in.kv_indptr.size() << " entries, expected " << in.qo_indptr.size()
      << " (batch_size + 1 of qo_indptr)";
  detail::fill_lengths(in.qo_indptr, in.qo_len);
  detail::fill_lengths(in.kv_indptr, in.kv_len);
  impl_->plan(in, shape, stream);
}

void BatchPrefillRaggedWrapper::run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                                    const TensorView& lse, StreamHandle stream) {
  AttentionRuntime& rt = *impl_;
  rt.check_run_queries(q, o, lse);
  detail::check_dense_kv(q, k, v, Layout::kNHD);
  detail::check_plan_kv_dtype(rt, k, v);
  rt.check_run_kv_heads(k, "k", 1);
  rt.check_run_kv_heads(v, "v", 1, /*is_v=*/true);
  TESSERA_CHECK_ARG(k.shape[0] >= rt.total_kv_units())
      << "k has " << k.shape[0] << " rows, expected >= kv_indptr[B] = " << rt.total_kv_units() << " of the plan";
  detail::with_run_params(rt, q, o, lse, "k", [&](auto p) {
    detail::kv_row_tensors(p, k, v, 0);
    p.ragged.num_rows = static_cast<int32_t>(k.shape[0]);
    rt.launch(p, nullptr, stream);
  });
}

const PlanInfo& BatchPrefillRaggedWrapper::plan_info() const { return impl_->info(); }
void BatchPrefillRaggedWrapper::set_variant_params(const std::vector<VariantParam>& params) {
  impl_->set_variant_params(params);
}

// --- BlockSparseWrapper ----------------------------------------------------------------------

BlockSparseWrapper::BlockSparseWrapper(const TensorView& workspace, const RuntimeBounds& bounds,
                                       const RuntimeOptions& options)
    : impl_(std::make_unique<AttentionRuntime>(KVFormatKind::kBlockSparse, false, workspace, bounds, options)) {}
BlockSparseWrapper::~BlockSparseWrapper() = default;
BlockSparseWrapper::BlockSparseWrapper(BlockSparseWrapper&&) noexcept = default;
BlockSparseWrapper& BlockSparseWrapper::operator=(BlockSparseWrapper&&) noexcept = default;

int64_t BlockSparseWrapper::workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::workspace_size(KVFormatKind::kBlockSparse, false, bounds, options);
}
int64_t BlockSparseWrapper::min_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::min_workspace_size(KVFormatKind::kBlockSparse, false, bounds, options);
}

void BlockSparseWrapper::plan(const TensorView& indptr, int64_t block_rows, int64_t block_cols, int64_t num_rows,
                              int64_t num_cols, const PlanShape& shape, StreamHandle stream) {
  TESSERA_CHECK_ARG(block_rows >= 1 && block_rows < INT32_MAX) << "block_rows = " << block_rows << ", expected >= 1";
  TESSERA_CHECK_ARG(block_cols >= 1 && block_cols < INT32_MAX) << "block_cols = " << block_cols << ", expected >= 1";
  TESSERA_CHECK_ARG(num_rows >= 0 && num_rows < INT32_MAX) << "num_rows = " << num_rows << ", expected in [0, 2^31)";
  TESSERA_CHECK_ARG(num_cols >= 0 && num_cols < INT32_MAX) << "num_cols = " << num_cols << ", expected in [0, 2^31)";
  AttentionRuntime::PlanInput in;
  in.kv_indptr = detail::read_host_indptr(indptr, "indptr");
  const int64_t row_blocks = (num_rows + block_rows - 1) / block_rows;
  TESSERA_CHECK_ARG(static_cast<int64_t>(in.kv_indptr.size()) == row_blocks + 1)
      << "indptr has " << in.kv_indptr.size() << " entries, expected ceil(num_rows / block_rows) + 1 = "
      << row_blocks + 1;
  in.page_size = block_cols;
  in.block_rows = block_rows;
  in.num_rows = num_rows;
  in.num_cols = num_cols;
  in.qo_indptr.resize(static_cast<size_t>(row_blocks + 1));
  in.qo_len.resize(static_cast<size_t>(row_blocks));
  in.kv_len.resize(static_cast<size_t>(row_blocks));
  for (int64_t r = 0; r < row_blocks; ++r) {
    in.qo_indptr[r] = static_cast<int32_t>(r * block_rows);
    in.qo_len[r] = static_cast<int32_t>(std::min(block_rows, num_rows - r * block_rows));
    const int64_t kv = static_cast<int64_t>(in.kv_indptr[r + 1] - in.kv_indptr[r]) * block_cols;
    TESSERA_CHECK_ARG(kv < INT32_MAX) << "block row " << r << " sees " << kv << " KV columns, expected < 2^31";
    in.kv_len[r] = static_cast<int32_t>(kv);
  }
  in.qo_indptr[row_blocks] = static_cast<int32_t>(num_rows);
  impl_->plan(in, shape, stream);
}

void BlockSparseWrapper::run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& indices,
                             const TensorView& o, const TensorView& lse, StreamHandle stream) {
  AttentionRuntime& rt = *impl_;
  rt.check_run_queries(q, o, lse);
  check_size(q, "q", 0, rt.num_rows());
  detail::check_dense_kv(q, k, v, Layout::kNHD);
  detail::check_plan_kv_dtype(rt, k, v);
  rt.check_run_kv_heads(k, "k", 1);
  rt.check_run_kv_heads(v, "v", 1, /*is_v=*/true);
  check_size(k, "k", 0, rt.num_cols());
  detail::check_run_index_array(indices, "indices", q, rt.total_kv_units(), "indptr[last]");
  const detail::RunIds ids =
      detail::run_ids(rt, indices, "indices", (rt.num_cols() + rt.page_size() - 1) / rt.page_size(), true);
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(rt.kv_dtype(), T, "k", KVT, [&] {
      // indptr and the batch bound come from the plan (query_part); no block flags (every tile masked).
      kernels::AttentionParams<T, KVT> p = rt.query_part<T, KVT>(q, o, lse);
      detail::block_sparse_kv_params(p, k, v, ids.device_data, indices.shape[0], rt.block_rows(), rt.page_size(),
                                     rt.num_rows(), rt.num_cols());
      rt.launch(p, &ids, stream);
    });
  });
}

const PlanInfo& BlockSparseWrapper::plan_info() const { return impl_->info(); }

// --- BatchBlockSparsePagedWrapper ------------------------------------------------------------

namespace {
/// Column blocks of Bc columns that int32 columns can number: a listed id past a request's own
/// blocks is masked in the kernels (its columns are past the request's KV), so this bound, not the
/// plan's, is what a captured run() bakes in.
int64_t max_column_blocks(int64_t block_cols) { return (INT32_MAX - block_cols) / block_cols; }
}  // namespace

BatchBlockSparsePagedWrapper::BatchBlockSparsePagedWrapper(const TensorView& workspace, const RuntimeBounds& bounds,
                                                           const RuntimeOptions& options)
    : impl_(std::make_unique<AttentionRuntime>(KVFormatKind::kBlockSparse, false, workspace, bounds, options)) {}
BatchBlockSparsePagedWrapper::~BatchBlockSparsePagedWrapper() = default;
BatchBlockSparsePagedWrapper::BatchBlockSparsePagedWrapper(BatchBlockSparsePagedWrapper&&) noexcept = default;
BatchBlockSparsePagedWrapper& BatchBlockSparsePagedWrapper::operator=(BatchBlockSparsePagedWrapper&&) noexcept =
    default;

int64_t BatchBlockSparsePagedWrapper::workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::workspace_size(KVFormatKind::kBlockSparse, false, bounds, options);
}
int64_t BatchBlockSparsePagedWrapper::min_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return AttentionRuntime::min_workspace_size(KVFormatKind::kBlockSparse, false, bounds, options);
}

void BatchBlockSparsePagedWrapper::plan(const TensorView& qo_indptr, const TensorView& kv_indptr,
                                        const TensorView& last_page_len, int64_t page_size,
                                        const TensorView& mask_indptr, int64_t block_rows, int64_t block_cols,
                                        const PlanShape& shape, StreamHandle stream) {
  TESSERA_CHECK_ARG(block_rows >= 1 && block_rows < INT32_MAX) << "block_rows = " << block_rows << ", expected >= 1";
  TESSERA_CHECK_ARG(block_cols >= 1 && block_cols < INT32_MAX) << "block_cols = " << block_cols << ", expected >= 1";
  const std::vector<int32_t> q_indptr = detail::read_host_indptr(qo_indptr, "qo_indptr");
  const int64_t batch = static_cast<int64_t>(q_indptr.size()) - 1;
  const detail::PagedLengths paged = detail::read_paged_lengths(kv_indptr, last_page_len, page_size, batch);
  AttentionRuntime::PlanInput in;
  in.kv_indptr = detail::read_host_indptr(mask_indptr, "mask_indptr");
  int64_t rows = 0;
  for (int64_t b = 0; b < batch; ++b) rows += (q_indptr[b + 1] - q_indptr[b] + block_rows - 1) / block_rows;
  TESSERA_CHECK_ARG(static_cast<int64_t>(in.kv_indptr.size()) == rows + 1)
      << "mask_indptr has " << in.kv_indptr.size() << " entries, expected " << rows + 1
      << " (the block rows of the requests, sum of ceil(qo_len / block_rows) = " << rows << ", plus one)";
  // The block rows, request by request: their query rows tile each request's, so their offsets
  // are an indptr over q's rows (the kernels' qo_indptr).
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t qo_len = q_indptr[b + 1] - q_indptr[b], kv_len = paged.kv_len[b];
    for (int64_t first = 0; first < qo_len; first += block_rows) {
      const size_t g = in.qo_len.size();
      const int64_t kv = static_cast<int64_t>(in.kv_indptr[g + 1] - in.kv_indptr[g]) * block_cols;
      TESSERA_CHECK_ARG(kv < INT32_MAX) << "block row " << g << " sees " << kv << " KV columns, expected < 2^31";
      in.qo_indptr.push_back(static_cast<int32_t>(q_indptr[b] + first));
      in.qo_len.push_back(static_cast<int32_t>(std::min(block_rows, qo_len - first)));
      in.kv_len.push_back(static_cast<int32_t>(kv));
      in.segments.push_back(kernels::BlockRowSegment{static_cast<int32_t>(b), paged.kv_indptr[b],
                                                     static_cast<int32_t>(kv_len),
                                                     static_cast<int32_t>(kv_len - qo_len + first)});
      in.column_block_bounds.push_back(static_cast<int32_t>((kv_len + block_cols - 1) / block_cols));
    }
  }
  in.qo_indptr.push_back(q_indptr[batch]);
  in.page_size = block_cols;
  in.block_rows = block_rows;
  in.page_indptr = paged.kv_indptr;
  in.paged_block_size = page_size;
  impl_->plan(in, shape, stream);
}

void BatchBlockSparsePagedWrapper::run(const TensorView& q, const PagedKVCache& kv, const TensorView& mask_indices,
                                       const TensorView& mask_flags, const TensorView& o, const TensorView& lse,
                                       StreamHandle stream) {
  AttentionRuntime& rt = *impl_;
  rt.check_run_queries(q, o, lse);
  detail::check_paged_cache(rt, q, kv, rt.paged_block_size(), rt.total_pages());
  const detail::RunIds pages = detail::run_ids(rt, kv.indices, "kv.indices", kv.k.shape[0], false,
                                               detail::RunIds::Ranges::kRequestPages);
  detail::check_run_index_array(mask_indices, "mask_indices", q, rt.total_kv_units(), "mask_indptr[R]");
  const detail::RunIds blocks =
      detail::run_ids(rt, mask_indices, "mask_indices", max_column_blocks(rt.page_size()), true);
  if (mask_flags.defined()) {
    check_ndim(mask_flags, "mask_flags", 1);
    check_dtype(mask_flags, "mask_flags", {DType::kU8});
    check_same_device(q, "q", mask_flags, "mask_flags");
    TESSERA_CHECK_ARG(mask_flags.shape[0] == mask_indices.shape[0] && (mask_flags.shape[0] <= 1 || mask_flags.strides[0] == 1))
        << "mask_flags has " << mask_flags.shape[0] << " entries (stride " << mask_flags.strides[0]
        << "), expected " << mask_indices.shape[0] << " contiguous entries (one per entry of mask_indices)";
  }
  // f16 / bf16 q only: plan() refuses FP8 attention over block-sparse KV.
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
  TESSERA_DISPATCH_KV_DTYPE(rt.kv_dtype(), T, "kv.k", KVT, [&] {
    kernels::AttentionParams<T, KVT> p = rt.query_part<T, KVT>(q, o, lse);
    detail::paged_cache_params(p, kv);
    p.paged.indices = pages.device_data;
    kernels::BlockSparseKVParams<int32_t>& bs = p.block_sparse;
    bs.indices = blocks.device_data;
    bs.block_flags = mask_flags.defined() ? mask_flags.data_as<const uint8_t>() : nullptr;
    bs.num_indices = static_cast<int32_t>(mask_indices.shape[0]);
    bs.num_blocks = static_cast<int32_t>(blocks.bound);
    bs.block_cols = static_cast<int32_t>(rt.page_size());
    bs.block_cols_div = kernels::FastDivisor::make(rt.page_size());
    bs.block_rows = static_cast<int32_t>(rt.block_rows());
    bs.segments = rt.device_segments();
    rt.launch(p, &blocks, stream, &pages);
  });
  });
}

const PlanInfo& BatchBlockSparsePagedWrapper::plan_info() const { return impl_->info(); }

// --- BatchPODPagedWrapper --------------------------------------------------------------------
// Two runtimes over halves of one workspace, each planning one side of the batch (the other
// side's requests given qo_len 0, so every item keeps the batch's request index and both plans
// read the same query and KV extents), and one launch of the POD kernel over both plans
// (docs/design.md §6.10).

namespace detail {
namespace {

/// Packed rows up to which a request is a decode request (one 16-row tile).
constexpr int64_t kPodDecodeRows = 16;

/// The split model's one constant: the FLOP/s a prefill CTA (128-row tile, an SM to itself)
/// sustains over the K/V bytes/s a decode CTA (its copies of the 16-row tile together) streams,
/// so that prefill FLOPs and decode bytes compare in one unit of CTA time. On the H100 (W11,
/// bench/results/LOG.md, session 32): 4.25 TFLOP/s per prefill CTA (the prefill alone on 132),
/// 49-56 GB/s per decode CTA (the decode-bound end of the decode_sms sweep, 32-40 CTAs); with it
/// the model picks 52 decode CTAs, the fastest division measured.
constexpr double kPodFlopsPerDecodeByte = 87.0;

/// The POD launch's shape on this device for a tile pair: CTA slots (CTAs per SM x SMs), decode
/// tile copies per CTA, CTAs per SM.
struct PodGrid {
  int slots;
  int copies;
  int per_sm;

  /// The decode plan's CTA slots (one KV head each: a multiple of kv_heads) that `ctas` decode
  /// CTAs run, and the CTAs those slots take.
  int plan_slots(int ctas, int kv_heads) const { return ctas * copies / kv_heads * kv_heads; }
  int ctas_of(int plan_slots) const { return (plan_slots + copies - 1) / copies; }
  /// The fewest decode CTAs that run one slot per KV head.
  int min_decode_ctas(int kv_heads) const { return (kv_heads + copies - 1) / copies; }
};

PodGrid pod_grid(DType dtype, PrefillHeadDims dims, PodTiles tiles) {
  PodOccupancy occupancy{0, 0};
  TESSERA_DISPATCH_HALF_DTYPE(dtype, "dtype", T, [&] {
    with_prefill_head_dim(dims, [&](auto head_dims_tag) {
      constexpr int kQk = decltype(head_dims_tag)::kQk, kVo = decltype(head_dims_tag)::kVo;
      if constexpr (kQk == kVo) {
        occupancy = pod_occupancy<T, T, kQk, kVo>(tiles);
      } else {
        TESSERA_FAIL(StatusCode::kUnsupported) << "the POD kernel takes equal head dims";
      }
    });
  });
  TESSERA_CHECK(occupancy.ctas_per_sm >= 1 && occupancy.decode_copies >= 1, StatusCode::kInternal)
      << "the POD kernel does not fit an SM";
  return PodGrid{occupancy.ctas_per_sm * current_device_sm_count(), occupancy.decode_copies, occupancy.ctas_per_sm};
}

/// Decode CTAs for a batch of `prefill_flops` and `decode_bytes`: the division of the grid's
/// slots that minimises the slower side's time under the model above, the prefill side keeping at
/// least `min_prefill` slots.
int pod_decode_ctas(double prefill_flops, double decode_bytes, const PodGrid& g, int kv_heads, int min_prefill) {
  const int least = g.min_decode_ctas(kv_heads), most = g.slots - min_prefill;
  if (decode_bytes <= 0 || most <= least) return least;  // requests without keys still write o = 0
  const double decode_cost = decode_bytes * kPodFlopsPerDecodeByte;
  int best = least;
  double best_time = -1;
  for (int n = least; n <= most; ++n) {
    const int used = g.plan_slots(n, kv_heads);  // slots the plan can use: whole columns of heads
    const double decode_time = decode_cost * g.copies / used;
    const double t = std::max(prefill_flops / (g.slots - g.ctas_of(used)), decode_time);
    if (best_time < 0 || t < best_time) {
      best = n;
      best_time = t;
    }
  }
  return best;
}

/// A POD batch as its two sides: each side's plan input (the whole batch, the other side's requests
/// given qo_len 0, so every item keeps its batch request index), the requests of each and the
/// work the division weighs (prefill FLOPs, causal-aware; decode K/V bytes).
struct PodBatch {
  AttentionRuntime::PlanInput prefill, decode;
  int64_t num_prefill = 0, num_decode = 0;
  double prefill_flops = 0, decode_bytes = 0;
};

PodBatch split_pod_batch(const AttentionRuntime::PlanInput& in, const PlanShape& shape) {
  PodBatch pod;
  pod.prefill = in;
  pod.decode = in;
  const int64_t group = shape.num_qo_heads / shape.num_kv_heads;
  for (size_t b = 0; b < in.qo_len.size(); ++b) {
    const int64_t qo = in.qo_len[b], kv = in.kv_len[b];
    if (qo * group <= kPodDecodeRows) {
      pod.prefill.qo_len[b] = 0;
      pod.num_decode += qo > 0 ? 1 : 0;
      pod.decode_bytes += static_cast<double>(kv) * shape.num_kv_heads * shape.head_dim * 2 * 2;
    } else {
      pod.decode.qo_len[b] = 0;
      ++pod.num_prefill;
      // Visible (query, key) pairs: causal rows see keys up to kv - qo + row.
      double pairs = static_cast<double>(qo) * kv;
      if (shape.attention.causal) {
        const double hidden_rows = static_cast<double>(std::min(qo, kv));
        pairs -= hidden_rows * (hidden_rows - 1) / 2 + (qo > kv ? static_cast<double>(qo - kv) * kv : 0.0);
      }
      pod.prefill_flops += 4.0 * pairs * shape.num_qo_heads * shape.head_dim;
    }
  }
  return pod;
}

/// Decode CTAs of a plan without cuda_graph: none without decode requests, all but the prefill's
/// minimum with decode_sms set or without prefill requests, else the model's division.
int pod_decode_ctas_for(const PodBatch& pod, const PodGrid& grid, PodTiles tiles, int kv_heads, int64_t decode_sms) {
  const int min_prefill = pod.num_prefill == 0 ? 0 : tiles.prefill == QTile::k128Wgmma ? 1 : kv_heads;
  if (pod.num_decode == 0) return 0;
  if (decode_sms > 0 || pod.num_prefill == 0) {
    const int64_t wanted = pod.num_prefill == 0 ? grid.slots : decode_sms * grid.per_sm;
    return static_cast<int>(
        std::max<int64_t>(std::min<int64_t>(wanted, grid.slots - min_prefill), grid.min_decode_ctas(kv_heads)));
  }
  return pod_decode_ctas(pod.prefill_flops, pod.decode_bytes, grid, kv_heads, min_prefill);
}

}  // namespace
}  // namespace detail

struct BatchPODPagedWrapper::Impl {
  RuntimeBounds bounds;
  PodOptions options;
  std::unique_ptr<AttentionRuntime> prefill, decode;
  bool planned = false;
  detail::PodTiles tiles{};
  detail::PodGrid graph_grid{0, 1, 0};  // with cuda_graph: the grid and its fixed division
  int graph_decode_ctas = 0;
  PodPlanInfo info;

  static RuntimeOptions side_options(const PodOptions& o) {
    RuntimeOptions r;
    r.cuda_graph = o.cuda_graph;
    r.split_kv = o.split_kv;
    r.fixed_split_size = o.fixed_split_size;
    r.dtype = o.dtype;
    return r;
  }
  static int64_t prefill_bytes(const RuntimeBounds& b, const PodOptions& o) {
    return (AttentionRuntime::workspace_size(KVFormatKind::kPaged, false, b, side_options(o)) + 255) / 256 * 256;
  }
  static int64_t decode_bytes(const RuntimeBounds& b, const PodOptions& o) {
    return AttentionRuntime::workspace_size(KVFormatKind::kPaged, true, b, side_options(o));
  }
};

BatchPODPagedWrapper::BatchPODPagedWrapper(const TensorView& workspace, const RuntimeBounds& bounds,
                                           const PodOptions& options)
    : impl_(std::make_unique<Impl>()) {
  TESSERA_CHECK_ARG(options.decode_sms >= 0) << "options.decode_sms = " << options.decode_sms << ", expected >= 0";
  TESSERA_CHECK_ARG(bounds.head_dim_vo == 0 || bounds.head_dim_vo == bounds.head_dim)
      << "bounds.head_dim_vo = " << bounds.head_dim_vo << " != head_dim " << bounds.head_dim
      << ": the POD kernel takes equal head dims (split head dims run through BatchPrefillPagedWrapper)";
  impl_->bounds = bounds;
  impl_->options = options;
  const int64_t needed = workspace_size(bounds, options);
  check_ndim(workspace, "workspace", 1);
  TESSERA_CHECK_ARG(workspace.nbytes() >= needed)
      << "workspace has " << workspace.nbytes() << " bytes, expected >= " << needed << " (workspace_size of these bounds)";
  const int64_t split = Impl::prefill_bytes(bounds, options);
  char* base = static_cast<char*>(workspace.data);
  const RuntimeOptions side = Impl::side_options(options);
  impl_->prefill = std::make_unique<AttentionRuntime>(
      KVFormatKind::kPaged, false, TensorView(base, DType::kU8, {split}, workspace.device), bounds, side);
  impl_->decode = std::make_unique<AttentionRuntime>(
      KVFormatKind::kPaged, true, TensorView(base + split, DType::kU8, {needed - split}, workspace.device), bounds, side);
  if (options.cuda_graph) {
    // The grid a captured run() bakes in: the tiles of the bounds' head dim and a fixed division.
    impl_->tiles = detail::pod_tiles(detail::head_dims_of(bounds.head_dim, bounds.head_dim));
    const detail::PodGrid g =
        detail::pod_grid(options.dtype, detail::head_dims_of(bounds.head_dim, bounds.head_dim), impl_->tiles);
    const int heads = static_cast<int>(bounds.num_kv_heads);
    const int64_t wanted = options.decode_sms > 0 ? options.decode_sms * g.per_sm : g.slots / 3;
    impl_->graph_grid = g;
    impl_->graph_decode_ctas = static_cast<int>(std::min<int64_t>(wanted, g.slots - 1));
    TESSERA_CHECK_ARG(g.plan_slots(impl_->graph_decode_ctas, heads) >= heads)
        << "options.decode_sms = " << options.decode_sms << " gives the decode side fewer tile slots than "
        << "bounds.num_kv_heads = " << heads << " (a decode tile runs one KV head)";
  }
}
BatchPODPagedWrapper::~BatchPODPagedWrapper() = default;
BatchPODPagedWrapper::BatchPODPagedWrapper(BatchPODPagedWrapper&&) noexcept = default;
BatchPODPagedWrapper& BatchPODPagedWrapper::operator=(BatchPODPagedWrapper&&) noexcept = default;

int64_t BatchPODPagedWrapper::workspace_size(const RuntimeBounds& bounds, const PodOptions& options) {
  return Impl::prefill_bytes(bounds, options) + Impl::decode_bytes(bounds, options);
}

void BatchPODPagedWrapper::plan(const TensorView& qo_indptr, const TensorView& kv_indptr,
                                const TensorView& last_page_len, int64_t page_size, const PlanShape& shape,
                                StreamHandle stream) {
  Impl& m = *impl_;
  TESSERA_CHECK(!shape.kv_dtype.has_value() || *shape.kv_dtype == shape.dtype, StatusCode::kUnsupported)
      << "shape.kv_dtype = " << *shape.kv_dtype << ": the POD kernel reads K/V of q's dtype " << shape.dtype
      << " (fp8 caches run through BatchPrefillPagedWrapper)";
  TESSERA_CHECK(shape.head_dim_vo == 0 || shape.head_dim_vo == shape.head_dim, StatusCode::kUnsupported)
      << "shape.head_dim_vo = " << shape.head_dim_vo << " != head_dim " << shape.head_dim
      << ": the POD kernel takes equal head dims";
  TESSERA_CHECK(shape.attention.variant.is_default(), StatusCode::kUnsupported)
      << "shape.attention.variant is set: the POD kernel runs the default variant (causal masking and sm_scale); "
         "other variants run through BatchPrefillPagedWrapper";
  detail::check_prefill_heads(shape.num_qo_heads, shape.num_kv_heads, shape.head_dim, shape.head_dim,
                              "shape.head_dim_vo");
  AttentionRuntime::PlanInput in;
  in.qo_indptr = detail::read_host_indptr(qo_indptr, "qo_indptr");
  const int64_t batch = static_cast<int64_t>(in.qo_indptr.size()) - 1;
  detail::fill_lengths(in.qo_indptr, in.qo_len);
  detail::paged_lengths(in, kv_indptr, last_page_len, page_size, batch);

  const detail::PodBatch pod = detail::split_pod_batch(in, shape);
  PodPlanInfo info;
  info.num_prefill_requests = pod.num_prefill;
  info.num_decode_requests = pod.num_decode;
  const detail::PrefillHeadDims dims = detail::head_dims_of(shape.head_dim, shape.head_dim);
  detail::PodGrid grid = m.graph_grid;
  int decode_ctas = m.graph_decode_ctas;
  detail::PodTiles tiles = m.tiles;
  if (m.options.cuda_graph) {
    TESSERA_CHECK_ARG(shape.dtype == m.options.dtype && shape.head_dim == m.bounds.head_dim &&
                      shape.num_kv_heads == m.bounds.num_kv_heads)
        << "cuda_graph: shape has dtype " << shape.dtype << ", head_dim " << shape.head_dim << ", num_kv_heads "
        << shape.num_kv_heads << ", expected options.dtype = " << m.options.dtype << " and the bounds' "
        << m.bounds.head_dim << " and " << m.bounds.num_kv_heads << " (the captured grid is fixed)";
  } else {
    tiles = detail::pod_tiles(dims);
    grid = detail::pod_grid(shape.dtype, dims, tiles);
    decode_ctas =
        detail::pod_decode_ctas_for(pod, grid, tiles, static_cast<int>(shape.num_kv_heads), m.options.decode_sms);
  }
  const int decode_slots = grid.plan_slots(decode_ctas, static_cast<int>(shape.num_kv_heads));
  const int prefill_slots =
      m.options.cuda_graph || info.num_prefill_requests > 0 ? grid.slots - grid.ctas_of(decode_slots) : 0;
  // A side with requests and no CTAs would leave its rows unwritten.
  TESSERA_CHECK_ARG((info.num_prefill_requests == 0 || prefill_slots >= 1) &&
                    (info.num_decode_requests == 0 || decode_slots >= shape.num_kv_heads))
      << "options.decode_sms = " << m.options.decode_sms << " leaves " << prefill_slots << " CTA slots for "
      << info.num_prefill_requests << " prefill requests and " << decode_slots << " tile slots for "
      << info.num_decode_requests << " decode requests over " << shape.num_kv_heads << " KV heads (of "
      << grid.slots << " slots): expected at least one for the prefill and one per KV head for the decodes";
  const AttentionRuntime::PlanSide prefill_side{tiles.prefill, prefill_slots};
  const AttentionRuntime::PlanSide decode_side{tiles.decode, decode_slots};
  m.planned = false;
  m.prefill->plan(pod.prefill, shape, stream, &prefill_side);
  m.decode->plan(pod.decode, shape, stream, &decode_side);
  m.tiles = tiles;
  info.prefill = m.prefill->info();
  info.decode = m.decode->info();
  info.prefill_ctas = info.prefill.grid_cols * static_cast<int32_t>(shape.num_kv_heads / info.prefill.heads_per_cta);
  info.decode_copies = grid.copies;
  info.decode_ctas = grid.ctas_of(info.decode.grid_cols * static_cast<int32_t>(shape.num_kv_heads));
  m.info = info;
  m.planned = true;
}

void BatchPODPagedWrapper::run(const TensorView& q, const PagedKVCache& kv, const TensorView& o, const TensorView& lse,
                               StreamHandle stream) {
  Impl& m = *impl_;
  AttentionRuntime& prefill = *m.prefill;
  AttentionRuntime& decode = *m.decode;
  prefill.check_run_queries(q, o, lse);
  TESSERA_CHECK_ARG(m.planned) << "run() before plan(): call plan() with this batch's index arrays first";
  detail::check_paged_cache(prefill, q, kv, prefill.page_size(), prefill.total_kv_units());
  const detail::RunIds ids = detail::run_ids(prefill, kv.indices, "kv.indices", kv.k.shape[0]);
  const detail::PrefillHeadDims dims = prefill.plan_dims();
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
    kernels::AttentionParams<T, T> p = prefill.query_part<T, T>(q, o, lse);
    detail::paged_cache_params(p, kv);
    p.paged.indices = ids.device_data;
    // The decode side's run is ordered inside the prefill side's: one launch waits for both plans'
    // uploads and both sides' last runs, and is recorded as the last run of each.
    prefill.launch_ordered(&ids, stream, [&](cudaStream_t s, bool capturing) {
      const detail::PodLaunch launch{prefill.persistent_launch(capturing), decode.persistent_launch(capturing)};
      decode.launch_ordered(nullptr, stream, [&](cudaStream_t, bool) {
        detail::with_prefill_head_dim(dims, [&](auto head_dims_tag) {
          constexpr int kQk = decltype(head_dims_tag)::kQk, kVo = decltype(head_dims_tag)::kVo;
          if constexpr (kQk == kVo) {
            detail::launch_pod_head_dim<T, T, kQk, kVo>(p, prefill.variant(), m.tiles, launch, s);
          } else {
            TESSERA_FAIL(StatusCode::kInternal) << "the POD kernel takes equal head dims";  // plan() checks first
          }
        });
      });
    });
  });
}

const PodPlanInfo& BatchPODPagedWrapper::plan_info() const { return impl_->info; }

}  // namespace tessera
