// BatchCascadePagedWrapper (include/tessera/runtime.h): shared-prefix attention as a composition
// of the runtime's paged prefill plans, one per level, over slices of one workspace, and the
// state merge. docs/design.md §6.9.
//
// Workspace (each part 256-byte aligned):
//   [plan]        i32 rows of the last plan (the merge launches read it on the GPU)
//   [lse_running] 2 x f32 [max rows, Hq]: the merged LSE so far, ping-ponged (the merge cannot
//                 write the LSE it reads: the vector threads of one head all read it)
//   [level_lse]   f32 [max rows, Hq]: the LSE of the level being added
//   [level_o]     16-bit [max rows, Hq, Dv]: the output of the level being added
//   [partials]    the split states of a BatchPrefillPagedWrapper, which the levels share
//   [levels]      each level's plan (a BatchPrefillPagedWrapper workspace without its states)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "src/check.h"
#include "src/merge_launch.h"
#include "src/runtime/plan_channel.h"
#include "src/runtime/plan_inputs.h"
#include "src/tensor_checks.h"
#include "tessera/runtime.h"
#include "tessera/validate.h"

namespace tessera {
namespace {

constexpr int64_t kAlign = 256;
constexpr int64_t kPlanBytes = kAlign;  // the row count, padded

int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

int64_t value_dim(const RuntimeBounds& b) { return b.head_dim_vo == 0 ? b.head_dim : b.head_dim_vo; }

/// The options of level `level`: the caller's, except that with cuda_graph and an automatic
/// query tile a shared level takes the large tile. Its groups hold the rows of many requests
/// (decode: all of them) over one long KV range, a compute-bound tile that the bounds' average
/// rows per group (the last level's shape) would make a 16-row one.
RuntimeOptions level_options(const RuntimeOptions& options, const RuntimeBounds& bounds, int64_t level,
                             int64_t num_levels) {
  RuntimeOptions o = options;
  if (options.cuda_graph && options.q_tile == QueryTile::kAuto && level + 1 < num_levels) {
    o.q_tile = std::max(bounds.head_dim, value_dim(bounds)) <= 128 ? QueryTile::k128 : QueryTile::k64;
  }
  return o;
}

struct CascadeLayout {
  int64_t lse_running[2] = {0, 0};
  int64_t level_lse = 0;
  int64_t level_o = 0;
  int64_t partials = 0;              // the split states every level's plan uses in turn
  std::vector<int64_t> level_plan;   // offset of each level's plan workspace
  std::vector<int64_t> level_bytes;  // its size
  int64_t total = 0;
};

/// level_plan_size: BatchPrefillPagedWrapper's plan section (a private size the wrapper passes in).
CascadeLayout compute_layout(int64_t num_levels, const RuntimeBounds& bounds, const RuntimeOptions& options,
                             int64_t (*level_plan_size)(const RuntimeBounds&, const RuntimeOptions&)) {
  TESSERA_CHECK_ARG(num_levels >= 1 && num_levels <= 64) << "num_levels = " << num_levels << ", expected in [1, 64]";
  TESSERA_CHECK_ARG(bounds.max_total_qo_tokens >= 0 && bounds.num_qo_heads >= 0 && bounds.head_dim >= 0)
      << "bounds: max_total_qo_tokens = " << bounds.max_total_qo_tokens << ", num_qo_heads = " << bounds.num_qo_heads
      << ", head_dim = " << bounds.head_dim << ", expected >= 0";
  CascadeLayout l;
  const int64_t lse_bytes = align_up(bounds.max_total_qo_tokens * bounds.num_qo_heads * 4);
  int64_t at = kPlanBytes;
  l.lse_running[0] = at;
  l.lse_running[1] = at + lse_bytes;
  l.level_lse = at + 2 * lse_bytes;
  l.level_o = at + 3 * lse_bytes;
  at = l.level_o + align_up(bounds.max_total_qo_tokens * bounds.num_qo_heads * value_dim(bounds) * 2);
  int64_t partial_bytes = 0;
  for (int64_t i = 0; i < num_levels; ++i) {
    const RuntimeOptions o = level_options(options, bounds, i, num_levels);
    const int64_t plan = level_plan_size(bounds, o);
    partial_bytes = std::max(partial_bytes, BatchPrefillPagedWrapper::workspace_size(bounds, o) - plan);
    l.level_bytes.push_back(align_up(plan));
  }
  l.partials = at;
  at += align_up(partial_bytes);
  for (int64_t i = 0; i < num_levels; ++i) {
    l.level_plan.push_back(at);
    at += l.level_bytes[i];
  }
  l.total = at;
  return l;
}

/// Runs `f`, prefixing the message of a tessera::Error it throws with "levels[i]: ".
template <typename F>
void for_level(int64_t i, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    throw Error(e.code(), "levels[" + std::to_string(i) + "]: " + e.what());
  }
}

/// Rejects what a level cannot compute: a variant that depends on positions (a shared level's KV
/// positions are not the sequence's) or that is merged otherwise than by its LSE.
void check_cascade_variant(const VariantOptions& v) {
  const char* what = nullptr;
  if (v.window_left >= 0) what = "shape.attention.variant.window_left";
  if (v.num_sink_tokens != 0) what = "shape.attention.variant.num_sink_tokens";
  if (v.alibi_slopes.data != nullptr) what = "shape.attention.variant.alibi_slopes";
  if (v.rope.mode != PosEncoding::kNone) what = "shape.attention.variant.rope.mode";
  if (v.custom_mask.data != nullptr || v.custom_mask_indptr.data != nullptr) what = "shape.attention.variant.custom_mask";
  if (v.sigmoid) what = "shape.attention.variant.sigmoid";
  if (v.user != nullptr) what = "shape.attention.variant.user";
  TESSERA_CHECK(what == nullptr, StatusCode::kUnsupported)
      << what << " is set: BatchCascadePagedWrapper takes sm_scale, logits_soft_cap and fp8 KV scales only "
      << "(a shared level's KV positions are not the sequence's; sigmoid and user variants do not merge by LSE)";
}

/// A [rows, heads(, dim)] view of workspace bytes at `offset`.
TensorView scratch_view(char* base, int64_t offset, DType dtype, int64_t rows, int64_t heads, int64_t dim, int device) {
  if (dim == 0) return TensorView(base + offset, dtype, {rows, heads}, Device::cuda(device));
  return TensorView(base + offset, dtype, {rows, heads, dim}, Device::cuda(device));
}

/// The first `rows` rows of a [rows, ...] view (undefined stays undefined).
TensorView first_rows(TensorView t, int64_t rows) {
  if (t.data != nullptr) t.shape[0] = rows;
  return t;
}

}  // namespace

struct BatchCascadePagedWrapper::Impl {
  int64_t num_levels = 0;
  RuntimeBounds bounds;
  RuntimeOptions options;
  CascadeLayout layout;
  int device = 0;
  char* workspace = nullptr;
  std::unique_ptr<detail::PlanChannel> channel;
  std::vector<std::unique_ptr<BatchPrefillPagedWrapper>> levels;
  bool planned = false;
  int64_t rows = 0;  // query rows of the last plan
  PlanShape shape;   // of the last plan
};

BatchCascadePagedWrapper::BatchCascadePagedWrapper(const TensorView& workspace, int64_t num_levels,
                                                   const RuntimeBounds& bounds, const RuntimeOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.layout = compute_layout(num_levels, bounds, options, &level_plan_size);
  m.num_levels = num_levels;
  m.bounds = bounds;
  m.options = options;
  check_ndim(workspace, "workspace", 1);
  check_on_cuda(workspace, "workspace");
  check_contiguous(workspace, "workspace");
  TESSERA_CHECK_ARG(workspace.nbytes() >= m.layout.total)
      << "workspace has " << workspace.nbytes() << " bytes, expected >= " << m.layout.total
      << " (workspace_size of these levels and bounds)";
  TESSERA_CHECK_ARG(reinterpret_cast<uintptr_t>(workspace.data) % kAlign == 0)
      << "workspace.data is not 256-byte aligned";
  m.device = workspace.device.id;
  m.workspace = static_cast<char*>(workspace.data);
  for (int64_t i = 0; i < num_levels; ++i) {
    const TensorView plan(m.workspace + m.layout.level_plan[i], DType::kU8, {m.layout.level_bytes[i]},
                          workspace.device);
    for_level(i, [&] {
      m.levels.push_back(
          make_level(plan, m.workspace + m.layout.partials, bounds, level_options(options, bounds, i, num_levels)));
    });
  }
  m.channel = std::make_unique<detail::PlanChannel>(m.workspace, kPlanBytes);
}

int64_t BatchCascadePagedWrapper::level_plan_size(const RuntimeBounds& bounds, const RuntimeOptions& options) {
  return BatchPrefillPagedWrapper::plan_workspace_size(bounds, options);
}

std::unique_ptr<BatchPrefillPagedWrapper> BatchCascadePagedWrapper::make_level(const TensorView& plan_workspace,
                                                                               char* shared_partials,
                                                                               const RuntimeBounds& bounds,
                                                                               const RuntimeOptions& options) {
  return std::unique_ptr<BatchPrefillPagedWrapper>(
      new BatchPrefillPagedWrapper(plan_workspace, shared_partials, bounds, options));
}

BatchCascadePagedWrapper::~BatchCascadePagedWrapper() = default;
BatchCascadePagedWrapper::BatchCascadePagedWrapper(BatchCascadePagedWrapper&&) noexcept = default;
BatchCascadePagedWrapper& BatchCascadePagedWrapper::operator=(BatchCascadePagedWrapper&&) noexcept = default;

int64_t BatchCascadePagedWrapper::workspace_size(int64_t num_levels, const RuntimeBounds& bounds,
                                                 const RuntimeOptions& options) {
  return compute_layout(num_levels, bounds, options, &level_plan_size).total;
}

int64_t BatchCascadePagedWrapper::num_levels() const { return impl_->num_levels; }

void BatchCascadePagedWrapper::plan(const std::vector<CascadeLevel>& levels, int64_t page_size,
                                    const PlanShape& shape, StreamHandle stream) {
  Impl& m = *impl_;
  TESSERA_CHECK_ARG(static_cast<int64_t>(levels.size()) == m.num_levels)
      << "levels has " << levels.size() << " entries, expected num_levels = " << m.num_levels;
  check_cascade_variant(shape.attention.variant);
  // A plan that fails part-way leaves some levels re-planned: run() must not mix them.
  m.planned = false;
  // Every level covers the same rows: a row missing from a level would silently lose that
  // level's keys.
  int64_t rows = -1;
  for (int64_t i = 0; i < m.num_levels; ++i) {
    for_level(i, [&] {
      const std::vector<int32_t> qo = detail::read_host_indptr(levels[i].qo_indptr, "qo_indptr");
      if (rows < 0) rows = qo.back();
      TESSERA_CHECK_ARG(qo.back() == rows)
          << "qo_indptr ends at " << qo.back() << ", expected " << rows
          << " (levels[0]'s rows: every level partitions the same query rows)";
    });
  }
  // The shared levels are fully visible; causal masking is the last level's.
  PlanShape shared = shape;
  shared.attention.causal = false;
  for (int64_t i = 0; i < m.num_levels; ++i) {
    const CascadeLevel& l = levels[i];
    for_level(i, [&] {
      m.levels[i]->plan(l.qo_indptr, l.kv_indptr, l.last_page_len, page_size, i + 1 < m.num_levels ? shared : shape,
                        stream);
    });
  }
  const auto s = static_cast<cudaStream_t>(stream);
  char* staging = m.channel->staging();
  const int32_t rows32 = static_cast<int32_t>(rows);
  std::memcpy(staging, &rows32, sizeof(rows32));
  m.channel->upload(sizeof(rows32), s);
  m.rows = rows;
  m.shape = shape;
  m.planned = true;
}

void BatchCascadePagedWrapper::run(const TensorView& q, const std::vector<PagedKVCache>& kv, const TensorView& o,
                                   const TensorView& lse, StreamHandle stream) {
  Impl& m = *impl_;
  TESSERA_CHECK_ARG(m.planned) << "run() before plan(): call plan() with this batch's levels first";
  TESSERA_CHECK_ARG(static_cast<int64_t>(kv.size()) == m.num_levels)
      << "kv has " << kv.size() << " caches, expected num_levels = " << m.num_levels;
  check_ndim(q, "q", 3);
  // The levels' own run() checks q, o and lse in full. Without cuda_graph they see the plan's
  // rows only, so q and o may be longer than the workspace's per-level outputs.
  const int64_t rows = m.options.cuda_graph ? m.bounds.max_total_qo_tokens : m.rows;
  TESSERA_CHECK_ARG(q.shape[0] >= rows) << "q.shape[0] = " << q.shape[0] << ", expected >= " << rows
                                        << (m.options.cuda_graph ? " (cuda_graph: bounds.max_total_qo_tokens)"
                                                                 : " (the plan's query rows)");
  const TensorView q_rows = first_rows(q, rows), o_rows = first_rows(o, rows), lse_rows = first_rows(lse, rows);
  const int64_t heads = m.shape.num_qo_heads;
  const int64_t dv = m.shape.head_dim_vo == 0 ? m.shape.head_dim : m.shape.head_dim_vo;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool capturing = detail::PlanChannel::capturing(s);
  // After the last plan's upload and the last run (whose merges read the level scratch that this
  // run's levels overwrite).
  m.channel->order_run(s, capturing);
  const auto lse_buffer = [&](int which) {
    return scratch_view(m.workspace, m.layout.lse_running[which], DType::kF32, rows, heads, 0, m.device);
  };
  const int64_t last = m.num_levels - 1;
  TensorView running_lse = last == 0 ? lse_rows : lse_buffer(0);
  for_level(0, [&] { m.levels[0]->run(q_rows, kv[0], o_rows, running_lse, stream); });
  const TensorView level_o = scratch_view(m.workspace, m.layout.level_o, m.shape.dtype, rows, heads, dv, m.device);
  const TensorView level_lse = scratch_view(m.workspace, m.layout.level_lse, DType::kF32, rows, heads, 0, m.device);
  const auto* device_rows = reinterpret_cast<const int32_t*>(m.workspace);
  // One level after another on one stream: they share the split states (and level_o). Running
  // level 0 beside level 1 on a second stream saved 2-6 us on W6 but needs a second region of
  // split states, which FlashInfer-sized workspaces (128 MB for two levels) do not hold
  // (bench/results/LOG.md, session 31).
  for (int64_t i = 1; i <= last; ++i) {
    for_level(i, [&] { m.levels[i]->run(q_rows, kv[i], level_o, level_lse, stream); });
    const TensorView merged_lse = i == last ? lse_rows : lse_buffer(static_cast<int>(i % 2));
    detail::merge_state_rows_on_device(o_rows, running_lse, level_o, level_lse, o_rows, merged_lse, device_rows,
                                       stream);
    running_lse = merged_lse;
  }
  m.channel->record_run(s, capturing);
}

const PlanInfo& BatchCascadePagedWrapper::plan_info(int64_t level) const {
  TESSERA_CHECK_ARG(level >= 0 && level < impl_->num_levels)
      << "level = " << level << ", expected in [0, " << impl_->num_levels << ")";
  return impl_->levels[level]->plan_info();
}

}  // namespace tessera
