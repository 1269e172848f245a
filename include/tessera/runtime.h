// The plan/run runtime (docs/design.md §1.3, §6): wrappers that keep every SM busy whatever mix of
// lengths a serving step brings, and stay valid inside a captured CUDA Graph.
//
// Use
//   1. Once: allocate a device workspace of workspace_size(bounds, options) bytes (at least
//      min_workspace_size: a smaller one splits KV less) and construct a wrapper with it. The
//      wrapper also owns a small pinned host buffer.
//   2. Per step (per batch shape): plan(...) with HOST index arrays. It splits long KV ranges into
//      chunks, balances them over a fixed grid of CTAs and copies the plan into the workspace with
//      one cudaMemcpyAsync on `stream`. plan() also copies the index arrays it was given (indptr,
//      last_page_len) into the workspace: run() never needs device copies of them.
//   3. Per layer: run(...) with the tensors. It launches the persistent attention kernel and, when
//      the plan split a tile, the contraction that merges the partial states in a fixed order.
//      Every layer of a step reuses the same plan.
//
// Conventions are those of tessera/attention.h: q, k, v, o f16 or bf16 with a contiguous last
// dimension and 16-byte aligned rows; lse (optional) f32 [rows, num_qo_heads], BASE-2; head_dim 64,
// 128 or 256; causal masking with the offset kv_len - qo_len.
//
// Determinism: the result of a plan does not depend on which CTA ran which chunk: run() twice on
// the same inputs gives the same bits. With SplitKV::kFixed or kNone and a fixed query tile, a
// request's bits do not depend on the other requests of the batch either.
//
// CUDA Graphs (options.cuda_graph = true): capture run() once and replay it after any later
// plan() within the bounds. The grid, the query tile and the kernel are fixed at construction,
// and the first plan fixes what the captured launch bakes in (heads, head_dim, dtype, page size,
// causal, sm_scale): a later plan that changes one of them is an error. Every pointer given to
// run() is baked into the graph too: keep q, o, lse, the KV cache and the page table in fixed
// buffers and update their contents between replays. q and o must then have
// bounds.max_total_qo_tokens rows. Call plan() outside the capture, on any stream.
//
// Streams. plan() and run() may use any streams of the workspace's device; a wrapper orders its
// own work on the GPU in the order of the calls, without blocking the host:
//   - run() records its completion (a CUDA event); plan() makes its upload wait for the last run
//     (and for the last replay of a captured run), so it never overwrites a plan that a run still
//     reads, and run() waits for the last plan upload and the last run (they share the partial
//     states in the workspace);
//   - a captured run() carries these waits and the record into the graph as external event nodes:
//     each replay waits for the plan upload and the run that are the latest when it is launched,
//     and the next plan() waits for it.
// plan() blocks the host only until the previous plan's upload has left its pinned buffer (which,
// under the rule above, may wait for the run before it). The workspace, q, k, v, o, lse and the
// page table must stay alive and unchanged until the work that reads them has run: order writes
// to them after run() on the run's stream (or with an event). Destroying a wrapper waits for its
// last upload and its last run. A graph that captured run() refers to the wrapper's events: keep
// the wrapper alive as long as the graph may be replayed.
//
// Threads. A wrapper is not thread-safe: plan(), run() and plan_info() of one wrapper must not
// run concurrently (serialise them, e.g. one wrapper per thread or a mutex); successive calls may
// come from different threads. Different wrappers are independent and may be used concurrently,
// also over separate workspaces on one device. workspace_size() may be called from any thread.
// docs/threading.md covers every public object.
//
// Validation of run()'s page table (PagedKVCache::indices; BlockSparseWrapper::run's indices):
// against the plan's page ranges, page ids in [0, num_pages) (column blocks in [0, ceil(N / Bc)),
// strictly increasing within a block row). In device memory it is checked in checked mode
// (set_checked_mode / TESSERA_CHECKED=1, tessera/validate.h: a copy after a device-wide
// synchronisation, before the launch); otherwise out-of-range ids are skipped by the kernels (the
// output is then wrong, not out of bounds). In pinned host memory (Device type kCUDAHost; the
// kernels read it through its mapped address) it is checked on every run(). Inside a capture
// neither can be read yet: the check is captured as a kernel that runs at every replay and reports
// through the device-check mechanism of tessera/validate.h (raised by the next plan()/run() or by
// check_device_errors).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tessera/export.h"
#include "tessera/attention.h"
#include "tessera/formats.h"
#include "tessera/mla.h"
#include "tessera/stream.h"
#include "tessera/tensor.h"

namespace tessera {

/// How long KV ranges are cut into chunks whose partial states are merged.
enum class SplitKV : int32_t {
  kAuto = 0,   ///< per plan, for balance (docs/design.md §6)
  kFixed = 1,  ///< at multiples of RuntimeOptions::fixed_split_size: batch-invariant results
  kNone = 2,   ///< never: one work item per query tile (batch-invariant, no merge)
};

/// Query tile of the runtime's kernels: packed (query, head-in-group) rows per CTA.
enum class QueryTile : int32_t {
  kAuto = 0,  ///< the kernels' heuristic (tessera/attention.h) from the plan's average rows; with
              ///< split_kv = kAuto, a plan with fewer 16-row (tile, KV head) pairs than SMs gets
              ///< the wide 16-row tile (8 warps over 128 KV rows; PlanInfo::kv_tile_rows = 128)
  k16 = 16,
  k64 = 64,
  k128 = 128,  ///< not with head_dim 256; on sm_90 with head_dim 128 the wgmma kernel
};

/// Upper bounds a wrapper is built for; they size the workspace (workspace_size). A plan beyond
/// them is an error that names the bound, never an overflow.
struct RuntimeBounds {
  int64_t max_batch_size = 0;       ///< requests per plan (block-sparse: query block rows)
  int64_t max_total_qo_tokens = 0;  ///< query rows of all requests together (decode: = batch)
  int64_t num_qo_heads = 0;         ///< plans use at most this many query heads
  int64_t num_kv_heads = 0;         ///< plans use at most this many KV heads (exactly, with cuda_graph)
  int64_t head_dim = 0;             ///< plans use at most this head dim (exactly, with cuda_graph)
  /// V's and o's head dim when it differs from head_dim (prefill wrappers only; a pair of
  /// kSupportedPrefillSplitHeadDims, e.g. 192 / 128): plans then use exactly these head dims. 0:
  /// head_dim.
  int64_t head_dim_vo = 0;
};

struct RuntimeOptions {
  bool cuda_graph = false;         ///< see the header comment
  SplitKV split_kv = SplitKV::kAuto;
  int64_t fixed_split_size = 0;    ///< kFixed: KV positions per chunk, a positive multiple of 128
  int64_t sm_budget = 0;           ///< SMs the persistent kernel may fill (0: the whole device), for
                                   ///< overlap with other kernels
  QueryTile q_tile = QueryTile::kAuto;  ///< with cuda_graph, kAuto is resolved at construction
                                        ///< from the bounds
  DType dtype = DType::kBF16;      ///< with cuda_graph: the dtype of q and o (fixed)
  /// With cuda_graph: the dtype of k and v (fixed); unset: dtype. e4m3 / e5m2 for an fp8 cache.
  std::optional<DType> kv_dtype;
};

/// What a plan needs besides its index arrays.
struct PlanShape {
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  ///< of q and k (and of v and o unless head_dim_vo says otherwise)
  DType dtype = DType::kBF16;   ///< of q and o (f16 or bf16)
  /// Of k and v: unset means dtype; e4m3 / e5m2 for an fp8 cache (head dims 64, 128, 256; the
  /// mma.sync tiles dequantize it with attention.kv_scales, on every GPU).
  std::optional<DType> kv_dtype;
  /// sm_scale, causal and the variant: the built-in variants (window_left, num_sink_tokens,
  /// logits_soft_cap, alibi_slopes, rope, sigmoid) and custom masks (tree attention) are
  /// supported, JIT-compiled on first use, and so are user variants (variant.user, e.g. a
  /// FlexAttention mod traced by the Python front end) whose hooks transform q, k, v or the
  /// logits or mask them. Split chunks are merged by their log-sum-exp: attention without softmax
  /// (sigmoid, user variants with use_softmax = false) has none, so its plans never split KV
  /// (one work item per query tile, whatever options.split_kv says; not over block-sparse KV yet:
  /// kUnsupported) and its LSE output is NaN; a
  /// user output_transform fails the variant's JIT compile (at the first run()) with a message
  /// naming it (the one-shot entry points of tessera/attention.h run it). plan() keeps a copy of the user
  /// variant's spec (its tensor parameters stay the caller's). A custom mask's bits (variant.custom_mask, u8 on the device, request b's
  /// [qo_len_b, kv_len_b] bit matrix from byte custom_mask_indptr[b]) stay where they are, but
  /// variant.custom_mask_indptr is a HOST i32 [B + 1] array here, as FlashInfer's plan computes
  /// it: plan() checks it against the lengths and the mask's size and uploads it with the plan.
  /// run() skips the KV tiles the mask hides from all rows of a work item (without a sliding
  /// window), reading the mask's bits at each run(). Not with BlockSparseWrapper. With cuda_graph the first plan fixes the variant and its tensors
  /// (keep the mask bits in one buffer and change its contents; the offsets may change per plan).
  AttentionOptions attention;
  /// Of v and o when it differs from head_dim (BatchPrefillPagedWrapper and
  /// BatchPrefillRaggedWrapper; a pair of kSupportedPrefillSplitHeadDims, 16-bit K/V, the default
  /// variant; equal to the bounds' pair): then v is [.., Hkv, head_dim_vo] and o [rows, Hq,
  /// head_dim_vo]. 0: head_dim. Last, so positional initialisers of the fields above still work.
  int64_t head_dim_vo = 0;
};

/// What the last plan() decided (for tests, benchmarks and logs).
struct PlanInfo {
  int64_t batch_size = 0;
  int32_t q_tile_rows = 0;     ///< packed rows per query tile
  int32_t kv_tile_rows = 0;    ///< KV rows per tile of the kernel
  int32_t grid_cols = 0;       ///< columns of the plan (grid = grid_cols x num_kv_heads / heads_per_cta)
  int32_t heads_per_cta = 0;   ///< KV heads each CTA runs its column's items for, one after another
  int32_t num_items = 0;       ///< work items per KV head
  int32_t num_partials = 0;    ///< split chunks per KV head
  int32_t num_merges = 0;      ///< split tiles per KV head
  int32_t chunk_size = 0;      ///< KV positions per chunk (0: no split)
  int64_t makespan = 0;        ///< largest per-column cost (cost units of docs/design.md §6; a CTA
                               ///< runs heads_per_cta of them)
  int64_t lower_bound = 0;     ///< max(average cost per column, largest indivisible item)
  int64_t plan_bytes = 0;      ///< bytes the plan's cudaMemcpyAsync moved
  bool grouped_by_request = false;  ///< items assigned request by request, so a request's query tiles
                                    ///< run together and share its K/V in L2 (else longest first)
};

/// The device side of a paged KV cache at run(): the page pool and the page table. The page
/// ranges (indptr) and last-page lengths come from plan().
struct TESSERA_API PagedKVCache {
  TensorView k;  ///< NHD [num_pages, page_size, H_kv, D] or HND [num_pages, H_kv, page_size, D]
  TensorView v;  ///< same shape and dtype as k; strides may differ
  Layout layout = Layout::kNHD;
  TensorView indices;  ///< i32 [>= kv_indptr[B] of the plan] page ids in [0, num_pages), contiguous, in
                       ///< device memory or pinned host memory (kCUDAHost; see the header comment)
  /// From one tensor holding both: NHD [num_pages, 2, page_size, H_kv, D] or HND [num_pages, 2,
  /// H_kv, page_size, D].
  static PagedKVCache from_combined(const TensorView& kv, Layout layout, const TensorView& indices);
};

namespace detail {
class AttentionRuntime;
class MlaRuntime;
}

/// Batch decode over a paged KV cache: one query token per request.
class TESSERA_API BatchDecodeWrapper {
 public:
  /// workspace: u8 (or any dtype) device tensor of at least min_workspace_size(bounds, options)
  /// bytes (workspace_size for the most split plans), 256-byte aligned, owned by the caller and
  /// kept alive while the wrapper is used.
  BatchDecodeWrapper(const TensorView& workspace, const RuntimeBounds& bounds, const RuntimeOptions& options = {});
  ~BatchDecodeWrapper();
  BatchDecodeWrapper(BatchDecodeWrapper&&) noexcept;
  BatchDecodeWrapper& operator=(BatchDecodeWrapper&&) noexcept;

  /// Bytes of device workspace the wrapper needs on the current device for the split states of
  /// the most split plans of these bounds.
  static int64_t workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options = {});
  /// The smallest workspace it takes (the plan and the split states' LSEs). Between the two, the
  /// split states' outputs get what is left and plan() caps the KV splits to fit them: a smaller
  /// workspace only means fewer split chunks (a fixed split size that needs more is an error at
  /// plan()). E.g. head_dim 256's workspace_size is ~150 MiB at any bounds (its split states are
  /// sized for the largest tile); a 128 MiB buffer (FlashInfer's customary size) splits a little less.
  static int64_t min_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options = {});

  /// kv_indptr: host i32 [B + 1] (pages per request); last_page_len: host i32 [B] in
  /// [1, page_size] (ignored for requests without pages); page_size >= 1.
  void plan(const TensorView& kv_indptr, const TensorView& last_page_len, int64_t page_size, const PlanShape& shape,
            StreamHandle stream = nullptr);
  /// q: [B, Hq, D]; o: [B, Hq, D]; lse: [B, Hq] or undefined.
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& o, const TensorView& lse = {},
           StreamHandle stream = nullptr);
  /// New values for the parameters of the plan's user variant (shape.attention.variant.user), used
  /// by the runs that follow until the next plan() (which takes its spec's values again), as
  /// FlashInfer's JIT variants take theirs at run(): one entry per parameter of the planned spec,
  /// same names, kinds and tensor dtypes, in its order; tensors on the workspace's device and kept
  /// alive by the caller. kInvalidArgument without a user variant, for a mismatch naming the entry,
  /// and with cuda_graph for changed values once a run() was captured (they are baked in).
  void set_variant_params(const std::vector<VariantParam>& params);
  const PlanInfo& plan_info() const;

 private:
  std::unique_ptr<detail::AttentionRuntime> impl_;
};

/// Batch prefill / append over a paged KV cache (any query length per request).
class TESSERA_API BatchPrefillPagedWrapper {
 public:
  BatchPrefillPagedWrapper(const TensorView& workspace, const RuntimeBounds& bounds,
                           const RuntimeOptions& options = {});
  ~BatchPrefillPagedWrapper();
  BatchPrefillPagedWrapper(BatchPrefillPagedWrapper&&) noexcept;
  BatchPrefillPagedWrapper& operator=(BatchPrefillPagedWrapper&&) noexcept;
  static int64_t workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options = {});
  /// As BatchDecodeWrapper::min_workspace_size.
  static int64_t min_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options = {});

  /// qo_indptr: host i32 [B + 1] (query rows per request); kv_indptr, last_page_len as for decode.
  void plan(const TensorView& qo_indptr, const TensorView& kv_indptr, const TensorView& last_page_len,
            int64_t page_size, const PlanShape& shape, StreamHandle stream = nullptr);
  /// q: [>= qo_indptr[B], Hq, D]; o like q; lse [rows of q, Hq] or undefined.
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& o, const TensorView& lse = {},
           StreamHandle stream = nullptr);
  /// New values for the parameters of the plan's user variant (shape.attention.variant.user), used
  /// by the runs that follow until the next plan() (which takes its spec's values again), as
  /// FlashInfer's JIT variants take theirs at run(): one entry per parameter of the planned spec,
  /// same names, kinds and tensor dtypes, in its order; tensors on the workspace's device and kept
  /// alive by the caller. kInvalidArgument without a user variant, for a mismatch naming the entry,
  /// and with cuda_graph for changed values once a run() was captured (they are baked in).
  void set_variant_params(const std::vector<VariantParam>& params);
  const PlanInfo& plan_info() const;

 private:
  // BatchCascadePagedWrapper's levels: each keeps its plan in plan_workspace (plan_workspace_size
  // bytes) and all share one region of split states (workspace_size - plan_workspace_size bytes),
  // as their runs follow one another on one stream.
  friend class BatchCascadePagedWrapper;
  BatchPrefillPagedWrapper(const TensorView& plan_workspace, char* shared_partials, const RuntimeBounds& bounds,
                           const RuntimeOptions& options);
  static int64_t plan_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options);

  std::unique_ptr<detail::AttentionRuntime> impl_;
};

/// Batch prefill over ragged (packed) KV: request b owns KV rows kv_indptr[b] .. kv_indptr[b+1]-1.
class TESSERA_API BatchPrefillRaggedWrapper {
 public:
  BatchPrefillRaggedWrapper(const TensorView& workspace, const RuntimeBounds& bounds,
                            const RuntimeOptions& options = {});
  ~BatchPrefillRaggedWrapper();
  BatchPrefillRaggedWrapper(BatchPrefillRaggedWrapper&&) noexcept;
  BatchPrefillRaggedWrapper& operator=(BatchPrefillRaggedWrapper&&) noexcept;
  static int64_t workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options = {});
  /// As BatchDecodeWrapper::min_workspace_size.
  static int64_t min_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options = {});

  /// qo_indptr, kv_indptr: host i32 [B + 1].
  void plan(const TensorView& qo_indptr, const TensorView& kv_indptr, const PlanShape& shape,
            StreamHandle stream = nullptr);
  /// q: [>= qo_indptr[B], Hq, D]; k, v: [>= kv_indptr[B], Hkv, D]; o like q; lse or undefined.
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
           const TensorView& lse = {}, StreamHandle stream = nullptr);
  /// New values for the parameters of the plan's user variant (shape.attention.variant.user), used
  /// by the runs that follow until the next plan() (which takes its spec's values again), as
  /// FlashInfer's JIT variants take theirs at run(): one entry per parameter of the planned spec,
  /// same names, kinds and tensor dtypes, in its order; tensors on the workspace's device and kept
  /// alive by the caller. kInvalidArgument without a user variant, for a mismatch naming the entry,
  /// and with cuda_graph for changed values once a run() was captured (they are baked in).
  void set_variant_params(const std::vector<VariantParam>& params);
  const PlanInfo& plan_info() const;

 private:
  std::unique_ptr<detail::AttentionRuntime> impl_;
};

/// Block-sparse attention (the format of tessera/formats.h BlockSparse): query block row r (rows
/// r*Br .. r*Br+Br-1) sees the listed KV column blocks of Bc columns.
class TESSERA_API BlockSparseWrapper {
 public:
  BlockSparseWrapper(const TensorView& workspace, const RuntimeBounds& bounds, const RuntimeOptions& options = {});
  ~BlockSparseWrapper();
  BlockSparseWrapper(BlockSparseWrapper&&) noexcept;
  BlockSparseWrapper& operator=(BlockSparseWrapper&&) noexcept;
  /// bounds.max_batch_size bounds the block rows, max_total_qo_tokens the rows M.
  static int64_t workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options = {});
  /// As BatchDecodeWrapper::min_workspace_size.
  static int64_t min_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options = {});

  /// indptr: host i32 [ceil(M / Br) + 1], column blocks per block row; M = num_rows query rows,
  /// N = num_cols KV columns; Br, Bc >= 1. Causal (shape.attention) masks with offset N - M.
  void plan(const TensorView& indptr, int64_t block_rows, int64_t block_cols, int64_t num_rows, int64_t num_cols,
            const PlanShape& shape, StreamHandle stream = nullptr);
  /// q: [M, Hq, D]; k, v: [N, Hkv, D]; indices: i32 [>= indptr[last]] column blocks in
  /// [0, ceil(N / Bc)), strictly increasing within a block row, in device memory or pinned host
  /// memory (as PagedKVCache::indices); o like q; lse or undefined.
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& indices,
           const TensorView& o, const TensorView& lse = {}, StreamHandle stream = nullptr);
  const PlanInfo& plan_info() const;

 private:
  std::unique_ptr<detail::AttentionRuntime> impl_;
};

/// Block-sparse attention over a paged KV cache: a block mask at each request's LOGICAL positions
/// decides which KV a query block reads, so blocks outside the mask are never loaded (FlexAttention's
/// block masks over a serving engine's page table, or KV selection that keeps some blocks).
/// Request b (query rows qo_indptr[b] .. qo_indptr[b+1]-1, paged KV as for
/// BatchPrefillPagedWrapper) is cut into block rows of `block_rows` queries (the last may have
/// fewer); block row j sees the listed column blocks of its request, block c being KV positions
/// c*Bc .. c*Bc+Bc-1 of the request (positions at or past its KV length are masked). Block rows
/// are numbered request by request: R = sum over b of ceil(qo_len_b / block_rows) of them.
/// Causal masking (shape.attention.causal) and variants apply at logical positions (query i of a
/// request is at kv_len - qo_len + i), with the request as the variant's batch index; a block
/// flagged full skips every mask, as in tessera/formats.h BlockSparse.
class TESSERA_API BatchBlockSparsePagedWrapper {
 public:
  BatchBlockSparsePagedWrapper(const TensorView& workspace, const RuntimeBounds& bounds,
                               const RuntimeOptions& options = {});
  ~BatchBlockSparsePagedWrapper();
  BatchBlockSparsePagedWrapper(BatchBlockSparsePagedWrapper&&) noexcept;
  BatchBlockSparsePagedWrapper& operator=(BatchBlockSparsePagedWrapper&&) noexcept;
  /// bounds.max_batch_size bounds both the requests and the block rows R of a plan.
  static int64_t workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options = {});
  /// As BatchDecodeWrapper::min_workspace_size.
  static int64_t min_workspace_size(const RuntimeBounds& bounds, const RuntimeOptions& options = {});

  /// qo_indptr, kv_indptr, last_page_len, page_size: as BatchPrefillPagedWrapper::plan.
  /// mask_indptr: host i32 [R + 1], column blocks per block row (offsets into run()'s
  /// mask_indices); block_rows (Br), block_cols (Bc) >= 1.
  void plan(const TensorView& qo_indptr, const TensorView& kv_indptr, const TensorView& last_page_len,
            int64_t page_size, const TensorView& mask_indptr, int64_t block_rows, int64_t block_cols,
            const PlanShape& shape, StreamHandle stream = nullptr);
  /// q: [>= qo_indptr[B], Hq, D]; kv: the paged cache (kv.indices: the plan's pages); mask_indices:
  /// i32 [>= mask_indptr[R]] column blocks, strictly increasing within a block row and below
  /// ceil(kv_len_b / Bc) of the block row's request (device or pinned host memory, as
  /// kv.indices); mask_flags: u8 [entries of mask_indices] (1: every pair of the block is visible,
  /// the masks are skipped) on q's device, or undefined (every block masked); o like q; lse or undefined.
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& mask_indices, const TensorView& mask_flags,
           const TensorView& o, const TensorView& lse = {}, StreamHandle stream = nullptr);
  const PlanInfo& plan_info() const;

 private:
  std::unique_ptr<detail::AttentionRuntime> impl_;
};

/// Options of a BatchPODPagedWrapper.
struct PodOptions {
  /// As RuntimeOptions::cuda_graph (the header comment's rules): the grid and both tiles are fixed
  /// at construction, and so is the division of the SMs (decode_sms, or a third of them for the
  /// decode side when 0, rounded to whole columns of KV heads).
  bool cuda_graph = false;
  DType dtype = DType::kBF16;  ///< with cuda_graph: the dtype of q, o, k and v (fixed)
  /// SMs whose CTAs run the decode requests (the rest run the prefill requests); 0: chosen per
  /// plan from the two sides' estimated times (docs/design.md §6.10). Kept below the device's SM
  /// count; a decode CTA runs several 16-row tiles, each over one KV head, and only whole columns
  /// of KV heads are used.
  int64_t decode_sms = 0;
  SplitKV split_kv = SplitKV::kAuto;  ///< as RuntimeOptions (kFixed: fixed_split_size)
  int64_t fixed_split_size = 0;
};

/// What the last BatchPODPagedWrapper::plan decided.
struct PodPlanInfo {
  int64_t num_prefill_requests = 0;  ///< requests with more than 16 packed rows (qo_len x group)
  int64_t num_decode_requests = 0;   ///< requests with 1 to 16 packed rows
  int32_t prefill_ctas = 0;          ///< CTAs of the launch that run the prefill plan
  int32_t decode_ctas = 0;           ///< CTAs that run the decode plan, decode_copies tiles each
  int32_t decode_copies = 0;         ///< copies of the 16-row tile a decode CTA runs side by side
  PlanInfo prefill;                  ///< the prefill side's plan (grid_cols 0: no prefill CTAs)
  PlanInfo decode;                   ///< the decode side's plan (grid_cols 0: no decode CTAs)
};

/// Prefill and decode in one launch (POD) over a paged KV cache: a batch that mixes prefill
/// chunks and decode requests, as chunked-prefill schedulers build it, planned as two plans with
/// the query tile that suits each (the 128-row tile for requests with more than 16 packed rows,
/// a 16-row tile for the others) and run by one persistent launch whose CTAs are divided between
/// them, so the decode requests' memory-bound K/V streaming runs on some SMs while the prefill's
/// compute-bound tiles run on the others (docs/design.md §6.10). The same plan through
/// BatchPrefillPagedWrapper puts every request into one tile size: decode rows then pad 128-row
/// tiles, or prefill rows run in 16-row ones.
///
/// plan() and run() take BatchPrefillPagedWrapper's arguments and semantics (one batch, request b
/// classified by its packed rows qo_len_b x group_size). Supported: f16 / bf16 q, k, v and o,
/// equal head dims (tessera/head_dims.h), NHD / HND, any page size, causal or not, sm_scale; fp8
/// K/V, other variants and split head dims are kUnsupported (they run through
/// BatchPrefillPagedWrapper). The workspace holds both plans and their split states.
class TESSERA_API BatchPODPagedWrapper {
 public:
  BatchPODPagedWrapper(const TensorView& workspace, const RuntimeBounds& bounds, const PodOptions& options = {});
  ~BatchPODPagedWrapper();
  BatchPODPagedWrapper(BatchPODPagedWrapper&&) noexcept;
  BatchPODPagedWrapper& operator=(BatchPODPagedWrapper&&) noexcept;
  static int64_t workspace_size(const RuntimeBounds& bounds, const PodOptions& options = {});

  /// As BatchPrefillPagedWrapper::plan: qo_indptr, kv_indptr host i32 [B + 1], last_page_len host
  /// i32 [B], page_size >= 1.
  void plan(const TensorView& qo_indptr, const TensorView& kv_indptr, const TensorView& last_page_len,
            int64_t page_size, const PlanShape& shape, StreamHandle stream = nullptr);
  /// As BatchPrefillPagedWrapper::run: q [>= qo_indptr[B], Hq, D], kv's page table in
  /// kv.indices, o like q, lse [rows of q, Hq] (base 2) or undefined.
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& o, const TensorView& lse = {},
           StreamHandle stream = nullptr);
  const PodPlanInfo& plan_info() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One level of a cascade plan (BatchCascadePagedWrapper::plan): the level cuts the batch's query
/// rows into groups and gives each group one page range. HOST i32 arrays.
struct CascadeLevel {
  TensorView qo_indptr;      ///< [groups + 1]: group g owns query rows qo_indptr[g] .. qo_indptr[g+1]-1;
                             ///< starts at 0, ends at the batch's row count (the same at every level)
  TensorView kv_indptr;      ///< [groups + 1]: group g's pages are that level's page-table entries
                             ///< kv_indptr[g] .. kv_indptr[g+1]-1
  TensorView last_page_len;  ///< [groups]: used slots of each group's last page, in [1, page_size]
                             ///< (ignored for a group without pages)
};

/// Shared-prefix (cascade) attention over a paged KV cache: one logical KV per query row, stored
/// as an ordered list of levels (tessera/formats.h Composable). Typically level 0 holds a prefix
/// shared by many requests as one group of all their query rows, and the last level each
/// request's own pages, one group per request. Each level is planned by the load-balancing
/// planner with its groups as requests, so a shared level's KV is read once for all the rows of
/// its group, packed into the same query tiles (for decode with a GQA group of 4 and 64 requests,
/// 256 rows per KV head: compute-bound tiles instead of 64 reads of the prefix). run() computes
/// the levels one after the other and merges their states in level order with the state merge
/// (tessera/merge.h), all in this wrapper's workspace, so it is deterministic and capturable in a
/// CUDA Graph (options.cuda_graph: the rules of the header comment, with q and o of
/// bounds.max_total_qo_tokens rows).
///
/// Semantics (FlashInfer's MultiLevelCascadeAttentionWrapper): causal masking (shape.attention)
/// applies to the last level only, with the offset kv_len - qo_len of the row's group there; the
/// other levels are fully visible. Supported variants: sm_scale, logits_soft_cap and fp8 KV with
/// its scales; position-dependent ones (window, sinks, ALiBi, RoPE, custom masks) and sigmoid or
/// user variants are kUnsupported: a level's KV positions are not the sequence's. The output of
/// each level after the first and the running LSE live in the workspace (16-bit and f32), so the
/// result carries one 16-bit rounding per level, as merging FlashInfer's level outputs does.
/// bounds: max_batch_size bounds the groups of any level, max_total_qo_tokens the rows.
/// options: as for BatchPrefillPagedWrapper, applied to every level; with cuda_graph and
/// QueryTile::kAuto, the shared levels take the 128-row tile (64 rows for head dims above 128),
/// the last level the tile its bounds resolve to.
class TESSERA_API BatchCascadePagedWrapper {
 public:
  /// num_levels >= 1 (1: plain paged prefill through one level).
  BatchCascadePagedWrapper(const TensorView& workspace, int64_t num_levels, const RuntimeBounds& bounds,
                           const RuntimeOptions& options = {});
  ~BatchCascadePagedWrapper();
  BatchCascadePagedWrapper(BatchCascadePagedWrapper&&) noexcept;
  BatchCascadePagedWrapper& operator=(BatchCascadePagedWrapper&&) noexcept;
  static int64_t workspace_size(int64_t num_levels, const RuntimeBounds& bounds, const RuntimeOptions& options = {});

  /// levels: num_levels entries, outermost (shared) first; page_size >= 1, the same for every
  /// level. Errors inside a level's plan name the level (e.g. "levels[1]: ...").
  void plan(const std::vector<CascadeLevel>& levels, int64_t page_size, const PlanShape& shape,
            StreamHandle stream = nullptr);
  /// q: [>= rows, Hq, D]; kv: num_levels caches, level i's page table in kv[i].indices (the page
  /// pools may be one tensor or several); o like q; lse [rows of q, Hq] (base 2) or undefined.
  /// Without cuda_graph, rows of q and o beyond the plan's are left alone.
  void run(const TensorView& q, const std::vector<PagedKVCache>& kv, const TensorView& o, const TensorView& lse = {},
           StreamHandle stream = nullptr);
  int64_t num_levels() const;
  /// What the last plan decided for level `level` (0 <= level < num_levels).
  const PlanInfo& plan_info(int64_t level) const;

 private:
  struct Impl;
  // The levels' wrappers, over their plan sections and the shared split states.
  static int64_t level_plan_size(const RuntimeBounds& bounds, const RuntimeOptions& options);
  static std::unique_ptr<BatchPrefillPagedWrapper> make_level(const TensorView& plan_workspace, char* shared_partials,
                                                              const RuntimeBounds& bounds,
                                                              const RuntimeOptions& options);
  std::unique_ptr<Impl> impl_;
};

/// Upper bounds of a BatchMLAPagedWrapper; they size its workspace.
struct MlaRuntimeBounds {
  int64_t max_batch_size = 0;       ///< requests per plan
  int64_t max_total_qo_tokens = 0;  ///< query tokens of all requests together (decode: = batch)
  int64_t num_heads = 0;            ///< plans use at most this many query heads (exactly, with cuda_graph)
};

/// What an MLA plan needs besides its index arrays.
struct MlaPlanShape {
  int64_t num_heads = 0;        ///< query heads, in [1, bounds.num_heads]
  DType dtype = DType::kBF16;   ///< of q_nope, q_pe and o (f16 or bf16), and of the latent cache unless kv_dtype
  double sm_scale = 0.0;        ///< logit scale, finite and > 0 (no default: see MlaOptions)
  bool causal = false;          ///< hide keys after each query's position (tessera/mla.h)
  /// The latent cache's dtype: unset means dtype; e4m3 / e5m2 for an fp8 cache (with cuda_graph,
  /// options.kv_dtype's).
  std::optional<DType> kv_dtype;
  /// An fp8 cache's dequantization scales (tessera/mla.h's PagedLatentCache::scales: k for the
  /// key, v for the value, device tensors of one element; q stays 1); defaults for a 16-bit
  /// cache. Device tensors are read at every run (a captured run() reads their values at replay);
  /// with cuda_graph every plan keeps the first one's factors and tensors.
  KVScales kv_scales;
};

/// Multi-head latent attention (tessera/mla.h) through the plan/run runtime: decode and
/// append-style prefill over a paged latent cache, with the load-balanced split over the KV
/// length and CUDA Graphs of the other wrappers (the header comment's rules hold). sm_90 GPUs.
///
/// The plan treats MLA as attention with one KV head shared by all num_heads query heads: a
/// request's (token, head) rows are cut into query tiles, each tile's visible KV range into chunks
/// of whole 64-token tiles, and the chunks are balanced over one persistent CTA per SM. The tile
/// has 16 rows (the narrow tile: the rows are the MMAs' N) when every request of the plan has at
/// most 16 rows, else 64 (PlanInfo::q_tile_rows; options.q_tile = k16 or k64 forces one). Every
/// tile reads the request's whole latent row (576 values) per key and multiplies it into all its
/// rows whether or not all are valid, so an item costs its KV length whatever its rows: a request
/// with many heads or tokens is several tiles over the same KV (the compute-bound regime), whose
/// chunks the plan keeps aligned so that the tiles read the same keys at the same time and share
/// them in L2. With SplitKV::kAuto a plan without splits is kept when it is within 10% of
/// the balanced lower bound (a split costs its state's write and merge), else the best of chunks
/// that give one wave of items and the planner's own search (docs/design.md §6).
/// options: cuda_graph, split_kv (kFixed: fixed_split_size a multiple of 128), sm_budget and,
/// with cuda_graph, dtype and kv_dtype; q_tile kAuto, k16 or k64 (with cuda_graph, kAuto takes the
/// narrow tile when bounds.num_heads x ceil(max_total_qo_tokens / max_batch_size) <= 16, e.g.
/// decode with up to 16 heads; a later plan with more rows a request then runs several narrow
/// tiles over its KV).
class TESSERA_API BatchMLAPagedWrapper {
 public:
  BatchMLAPagedWrapper(const TensorView& workspace, const MlaRuntimeBounds& bounds, const RuntimeOptions& options = {});
  ~BatchMLAPagedWrapper();
  BatchMLAPagedWrapper(BatchMLAPagedWrapper&&) noexcept;
  BatchMLAPagedWrapper& operator=(BatchMLAPagedWrapper&&) noexcept;
  static int64_t workspace_size(const MlaRuntimeBounds& bounds, const RuntimeOptions& options = {});

  /// qo_indptr: host i32 [B + 1] (query tokens per request); kv_indptr: host i32 [B + 1] (pages
  /// per request); last_page_len: host i32 [B] in [1, page_size] (ignored for requests without
  /// pages); page_size >= 1.
  void plan(const TensorView& qo_indptr, const TensorView& kv_indptr, const TensorView& last_page_len,
            int64_t page_size, const MlaPlanShape& shape, StreamHandle stream = nullptr);
  /// q_nope: [>= qo_indptr[B], num_heads, 512]; q_pe: [.., num_heads, 64]; ckv: [num_pages,
  /// page_size, 512]; kpe: [num_pages, page_size, 64] (tessera/mla.h's layouts and strides);
  /// kv_indices: i32 [>= kv_indptr[B]] page ids as PagedKVCache::indices; o: [rows of q_nope,
  /// num_heads, 512]; lse: f32 [rows, num_heads] base 2, or undefined. With cuda_graph, q_nope
  /// has bounds.max_total_qo_tokens rows.
  void run(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv, const TensorView& kpe,
           const TensorView& kv_indices, const TensorView& o, const TensorView& lse = {},
           StreamHandle stream = nullptr);
  const PlanInfo& plan_info() const;

 private:
  std::unique_ptr<detail::MlaRuntime> impl_;
};

}  // namespace tessera
