// The load-balancing planner (docs/design.md §1.3, §6): pure host code, no CUDA. From the query and KV
// lengths of a batch it builds the work list of a persistent attention kernel with a fixed grid
// of `num_ctas` columns (every column is replicated over the KV heads by the kernel's grid, a CTA
// running its column for one KV head or, grouped, several in turn, so the plan is computed once
// for one KV head), and the index map that merges split items.
//
// Units. A request's query rows are packed with its GQA group: packed row r is query r / group_size
// of head r % group_size within the KV head's group, so a request has qo_len * group_size packed
// rows, cut into query tiles of q_tile_rows packed rows (the last one partial). A tile's KV range
// is [0, kv_end) with kv_end = kv_len, or under causal masking the keys its last query can see.
// Each range is cut into chunks (work items); the cost of an item is
//     alpha * (valid packed rows of its tile) + beta * (KV rows of the chunk).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {
namespace runtime {

enum class SplitMode : int32_t {
  kAuto = 0,   ///< chunk size chosen per batch for balance (docs/design.md §6); when no uniform
               ///< chunk size is within 10% of the lower bound, a water-filling plan with chunks
               ///< of varying length may replace it (see planner.cpp)
  kFixed = 1,  ///< chunk boundaries at multiples of fixed_split_size: a request's result depends
               ///< only on the request (batch-invariant bits)
  kNone = 2,   ///< one item per query tile (batch-invariant, no merge)
};

struct PlannerConfig {
  int32_t group_size = 1;      ///< num_qo_heads / num_kv_heads, >= 1
  int32_t q_tile_rows = 16;    ///< packed rows per query tile (16, 64, 128 or 192)
  int32_t kv_tile_rows = 64;   ///< the kernel's KV tile: chunk sizes are multiples of it
  int32_t num_ctas = 1;        ///< grid columns (CTAs per KV head), >= 1
  bool causal = false;         ///< clip each tile's KV range to what its last query sees
  SplitMode split_mode = SplitMode::kAuto;
  int32_t fixed_split_size = 0;  ///< kFixed: KV rows per chunk, a positive multiple of kv_tile_rows
  /// kAuto: the smallest chunk size L the search may choose (rounded up to kv_tile_rows; 0 means
  /// kv_tile_rows). Above kv_tile_rows it also disables the fill fallback (whose pieces may be
  /// shorter). For batches whose unsplit work already fills the GPU, where a split costs more
  /// (merge, per-item start-up) than the balance it buys.
  int32_t min_chunk_rows = 0;
  int64_t alpha = 1;           ///< cost per valid packed query row of an item, >= 0
  int64_t beta = 1;            ///< cost per KV row of an item, >= 1
  /// kAuto may not produce more split chunks (items with partial >= 0) than this; candidates
  /// that would are skipped. kFixed plans that need more fail (Plan::ok = false).
  int32_t max_partials = INT32_MAX;
  /// Keep the query tiles of one request, which read the same KV, running at the same time on
  /// different CTAs, so their K/V stays in L2: when some request has two or more tiles, the items
  /// are also assigned request by request (requests in decreasing total cost, each request's items
  /// in decreasing cost, each to the least loaded CTA), and that assignment replaces the LPT one
  /// when its makespan is at most 1/32 above it and within 10% of the lower bound whenever the LPT
  /// plan is. Under LPT, all CTAs run the same cost level at once, i.e. one tile of every request:
  /// the whole batch's KV is live, which can exceed L2 (it did on W4: bench/results/LOG.md).
  /// Fill plans (see planner.cpp) keep their order.
  bool group_by_request = true;
  /// After the assignment, exchange items at the ends of the CTAs' lists to lower the makespan
  /// when it is more than 1/128 above the lower bound (planner.cpp, balance_by_exchanges).
  bool exchanges = true;
  /// Whose KV each request reads, for group_by_request: kv_group[b] in [0, B) names request b's
  /// group, whose items are then assigned together (block-sparse KV over a paged cache: a block
  /// row's real request, so the block rows of one request share its K/V in L2). nullptr: each
  /// request is its own group.
  const int32_t* kv_group = nullptr;
};

/// One chunk of one query tile. The kernel computes query tile rows [packed_begin,
/// packed_begin + q_tile_rows) of `request` against KV positions [kv_begin, kv_end) for the KV
/// head of its grid row.
struct WorkItem {
  int32_t request;
  int32_t packed_begin;  ///< first packed row of the tile
  int32_t kv_begin;      ///< first KV position of the chunk (a multiple of kv_tile_rows)
  int32_t kv_end;        ///< one past the last; kv_begin == kv_end only for a tile with no keys
  int32_t partial;       ///< -1: write the final output (tile not split); else the partial-state
                         ///< slot (per KV head) this chunk writes, merged by a MergeItem
};

/// A split query tile: its chunks wrote partial slots [partial_begin, partial_end), in KV order;
/// the merge combines them in that order into the final output rows of the tile.
struct MergeItem {
  int32_t request;
  int32_t packed_begin;
  int32_t partial_begin;
  int32_t partial_end;
};

struct Plan {
  bool ok = true;          ///< false: kFixed needed more than max_partials slots (see `error`);
                           ///< the plan then has no items (cta_indptr all 0, lower_bound set)
  const char* error = "";  ///< why ok is false
  std::vector<int32_t> cta_indptr;  ///< [num_ctas + 1]: CTA c runs items[cta_indptr[c] .. cta_indptr[c+1])
  std::vector<WorkItem> items;      ///< grouped by CTA; each CTA's in decreasing cost, or with
                                    ///< grouped_by_request in the request-grouped order
  std::vector<MergeItem> merges;    ///< one per split tile, in (request, packed_begin) order
  int32_t num_partials = 0;         ///< partial slots used (per KV head)
  bool grouped_by_request = false;  ///< the request-grouped assignment (PlannerConfig::group_by_request)
  int32_t chunk_size = 0;           ///< the chunk size L chosen (KV rows), 0 with kNone; no chunk is
                                    ///< longer. kAuto fallbacks: the no-split plan reports the
                                    ///< smallest multiple of kv_tile_rows covering every tile, the
                                    ///< fill plan its longest chunk rounded up to kv_tile_rows
                                    ///< (both saturate at the largest multiple in int32)
  // Balance statistics, in cost units.
  int64_t makespan = 0;        ///< the largest per-CTA total cost
  int64_t total_cost = 0;      ///< sum of the items' costs
  int64_t lower_bound = 0;     ///< max(ceil(unsplit cost / num_ctas), largest indivisible item): no
                               ///< plan with chunks of >= kv_tile_rows can have a smaller makespan
};

/// Builds the plan for a batch of qo_len.size() requests (qo_len[b], kv_len[b] >= 0). Requests
/// with qo_len 0 produce nothing; a tile whose KV range is empty gets one item with kv_begin ==
/// kv_end (the kernel writes o = 0, lse = -inf). Deterministic: identical inputs give identical
/// plans. Throws tessera::Error (kInvalidArgument, naming the field and its value) on a malformed
/// config or a negative length.
Plan plan_work(const std::vector<int32_t>& qo_len, const std::vector<int32_t>& kv_len, const PlannerConfig& config);

}  // namespace runtime
}  // namespace tessera
