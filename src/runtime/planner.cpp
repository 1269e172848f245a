// The load-balancing planner (docs/design.md §6); the contract is in planner.h.
//
// Outline of plan_work:
//   1. Validate the config and lengths, cut every request into query tiles and compute each tile's
//      KV end (clipped under causal masking). All cost arithmetic is int64; a batch whose worst-case
//      total cost (every tile cut into kv_tile_rows chunks) overflows int64 is rejected up front, so
//      no later sum can overflow.
//   2. Chunk the tiles: kNone one item per tile, kFixed at multiples of fixed_split_size, kAuto with a
//      chunk size L chosen per batch: candidates L0 = round_up(ceil(sum kv_end / num_ctas),
//      kv_tile_rows), then halving (rounded up to kv_tile_rows) down to kv_tile_rows; each tile is cut
//      into ceil(kv_end / L) chunks of even size (rounded up to kv_tile_rows). The first candidate
//      whose LPT makespan is within 10% of the lower bound wins, else the one with the smallest
//      makespan (ties: the larger L).
//   3. LPT: items sorted by cost descending (ties in (request, packed_begin, kv_begin) order, which is
//      the order items are generated in), each given to the least loaded CTA (ties: lowest index)
//      through a binary min-heap; then items are emitted grouped by CTA in assignment order.
//   4. Locality (PlannerConfig::group_by_request): when a request has several query tiles, the
//      chosen LPT candidate is also assigned request by request, and that assignment kept if its
//      makespan is within 1/32 of LPT's (regroup_by_request).
//   5. Exchanges (balance_by_exchanges): when the assignment's makespan is more than 1/128 above the
//      lower bound, items at the ends of the most loaded CTA's list move to, or swap with items at
//      the ends of, the least loaded CTAs' lists while that lowers the makespan. With a dozen
//      items a CTA (W4: 404 items on 33 CTAs) LPT and the grouped assignment leave 1-3% above the
//      bound, which the GPU pays as a tail of idle SMs.
//
// kAuto fallback: water-filling. When no candidate is within 10% (uniform chunks can pack badly
// when a CTA gets only a few items: e.g. 215 equal tiles on 132 CTAs, or 5 long decode requests on
// 33 CTAs, where every uniform L leaves some CTA one chunk too many), the planner also tries a fill
// plan and keeps it if its makespan is strictly smaller: tiles in decreasing cost order are poured
// into CTA 0, 1, ... up to a capacity T; the tile that overflows a CTA is cut at the last multiple of
// kv_tile_rows that fits and continues on the next CTA, and the space left at the end of a CTA is
// filled with whole tiles taken from the cheap end of the order. T is binary-searched between the
// lower bound and the best LPT makespan. Each CTA boundary cuts at most one tile, so a fill plan has
// at most 2 * num_ctas partial slots; its chunks differ in length and its chunk_size reports the
// longest chunk rounded up to kv_tile_rows. Fill plans keep their items grouped by CTA in
// decreasing cost, with partial slots in (request, tile, chunk) order.
//
// kAuto with a small max_partials: the number of partial slots a candidate needs only grows as L
// shrinks (per tile, fewer KV rows per chunk never means fewer chunks), so once a candidate needs
// more than max_partials every later one does too and the search stops there. If even L0 needs too
// many, no candidate fits and the plan falls back to the no-split plan (every tile one write-through
// item), with chunk_size the smallest multiple of kv_tile_rows that covers the longest tile's KV
// range (an L that splits nothing); the fill fallback above may then still replace it if it fits in
// max_partials.
//
// Hot path. plan_work runs once per batch on the serving loop's CPU thread, so: no std::function,
// per-thread scratch vectors reused across candidates and calls (no allocation in steady state
// apart from the returned Plan's vectors), sorting on a precomputed 64-bit key (inverted cost in
// the high bits, generation index in the low bits; an LSD radix sort for long lists), and
// candidates that provably can neither be accepted nor beat the best so far are ruled out from
// their totals, computed without building their items.
#include "src/runtime/planner.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "src/check.h"

namespace tessera {
namespace runtime {
namespace {

struct Tile {
  int32_t request;
  int32_t packed_begin;
  int32_t rows;    // valid packed rows
  int32_t kv_end;  // KV range [0, kv_end)
};

/// One candidate plan before emission: items in generation order ((request, tile, chunk) order),
/// their costs, the merges, and the assignment (generation indices in assignment order, i.e. cost
/// descending, and the CTA of each).
struct Candidate {
  std::vector<WorkItem> items;
  std::vector<int64_t> cost;
  std::vector<MergeItem> merges;
  std::vector<int32_t> order;  // generation index of the k-th assigned item
  std::vector<int32_t> cta;    // CTA of the k-th assigned item
  int64_t L = 0;               // chunk size reported as Plan::chunk_size
  int64_t total = 0;
  int64_t makespan = 0;
  int32_t num_partials = 0;
  bool grouped = false;        // order is by request (regroup_by_request), not by cost
  bool fill = false;           // a fill plan (fill_to_candidate): its CTAs are cut to capacity
};

/// A piece of a fill plan: KV range [kv_begin, kv_end) of tile `tile` on CTA `cta`.
struct Piece {
  int32_t tile;
  int32_t kv_begin;
  int32_t kv_end;
  int32_t cta;
};

struct HeapEntry {
  int64_t load;
  int32_t cta;
};

inline bool heap_less(const HeapEntry& a, const HeapEntry& b) {
  return a.load < b.load || (a.load == b.load && a.cta < b.cta);
}

struct Scratch {
  std::vector<Tile> tiles;
  std::vector<int64_t> tile_cost;
  std::vector<int32_t> tile_order;
  Candidate cand[2];
  std::vector<Piece> pieces[2];
  std::vector<int32_t> piece_first;
  std::vector<uint64_t> keys, keys_tmp;
  std::vector<HeapEntry> heap;
  std::vector<uint64_t> packed_heap;
  std::vector<int32_t> counts;
  std::vector<int64_t> request_total;
  std::vector<int32_t> request_rank_order, request_rank;
  std::vector<int32_t> saved_order, saved_cta;
  std::vector<int64_t> loads;                  // balance_by_exchanges: per CTA
  std::vector<std::vector<int32_t>> cta_items;  // ... the assignment positions k of each CTA, ascending
  std::vector<int64_t> item_cost;              // ... the cost of the item at each position k

  /// Drops buffers that a huge batch grew, so one outlier does not pin memory for the thread's life.
  void trim() {
    constexpr size_t kKeep = size_t{1} << 20;
    auto trim_one = [](auto& v) {
      if (v.capacity() > kKeep) std::decay_t<decltype(v)>().swap(v);
    };
    trim_one(tiles);
    trim_one(tile_cost);
    trim_one(tile_order);
    for (Candidate& c : cand) {
      trim_one(c.items);
      trim_one(c.cost);
      trim_one(c.merges);
      trim_one(c.order);
      trim_one(c.cta);
    }
    trim_one(pieces[0]);
    trim_one(pieces[1]);
    trim_one(piece_first);
    trim_one(keys);
    trim_one(keys_tmp);
    trim_one(request_total);
    trim_one(request_rank_order);
    trim_one(request_rank);
    trim_one(saved_order);
    trim_one(saved_cta);
    trim_one(loads);
    trim_one(item_cost);
    if (cta_items.size() > kKeep / 64) std::vector<std::vector<int32_t>>().swap(cta_items);
    for (std::vector<int32_t>& v : cta_items) trim_one(v);
  }
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }

inline int bit_width(uint64_t v) {
  int w = 0;
  while (v != 0) {
    ++w;
    v >>= 1;
  }
  return w;
}

/// How a tile is cut. kAuto: even chunks of at most L; kFixed: at multiples of L; kNone: not at all.
struct ChunkRule {
  SplitMode mode;
  int64_t L;
};

/// Number of chunks of a tile with `kv` keys and the length of all but the last.
inline void tile_chunks(int64_t kv, const ChunkRule& rule, int64_t kvt, int64_t& n, int64_t& size) {
  n = 1;
  size = kv;
  if (kv <= rule.L || rule.mode == SplitMode::kNone) return;
  if (rule.mode == SplitMode::kAuto) {
    n = ceil_div(kv, rule.L);
    size = round_up(ceil_div(kv, n), kvt);  // <= L < kv, so still at least 2 chunks
    n = ceil_div(kv, size);
  } else {
    size = rule.L;
    n = ceil_div(kv, size);
  }
}

/// Total cost, largest item and partial slots of the plan `rule` gives, without building it.
void count_chunks(const std::vector<Tile>& tiles, const PlannerConfig& cfg, const ChunkRule& rule, int64_t& total,
                  int64_t& max_item, int64_t& partials) {
  total = max_item = partials = 0;
  for (const Tile& t : tiles) {
    int64_t n, size;
    tile_chunks(t.kv_end, rule, cfg.kv_tile_rows, n, size);
    total += n * cfg.alpha * t.rows + cfg.beta * t.kv_end;
    max_item = std::max(max_item, cfg.alpha * t.rows + cfg.beta * size);  // the first chunk is the longest
    if (n > 1) partials += n;
  }
}

/// Cuts every tile into chunks by `rule`. Returns false (leaving `c` partly filled) as soon as more
/// than max_partials partial slots would be needed.
bool chunk_tiles(const std::vector<Tile>& tiles, const PlannerConfig& cfg, const ChunkRule& rule, int64_t max_partials,
                 Candidate& c) {
  c.items.clear();
  c.cost.clear();
  c.merges.clear();
  c.fill = false;
  const int64_t kvt = cfg.kv_tile_rows;
  const int64_t alpha = cfg.alpha;
  const int64_t beta = cfg.beta;
  int64_t total = 0;
  int64_t partials = 0;
  for (const Tile& t : tiles) {
    const int64_t kv = t.kv_end;
    const int64_t q_cost = alpha * t.rows;
    int64_t n, size;
    tile_chunks(kv, rule, kvt, n, size);
    if (n == 1) {
      const int64_t cost = q_cost + beta * kv;
      c.items.push_back(WorkItem{t.request, t.packed_begin, 0, t.kv_end, -1});
      c.cost.push_back(cost);
      total += cost;
      continue;
    }
    if (partials + n > max_partials) return false;
    const int32_t first = static_cast<int32_t>(partials);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = i * size;
      const int64_t e = std::min(b + size, kv);
      const int64_t cost = q_cost + beta * (e - b);
      c.items.push_back(WorkItem{t.request, t.packed_begin, static_cast<int32_t>(b), static_cast<int32_t>(e),
                                 static_cast<int32_t>(partials + i)});
      c.cost.push_back(cost);
      total += cost;
    }
    partials += n;
    c.merges.push_back(MergeItem{t.request, t.packed_begin, first, static_cast<int32_t>(partials)});
  }
  c.L = rule.L;
  c.total = total;
  c.num_partials = static_cast<int32_t>(partials);
  return true;
}

/// LSD radix sort of 64-bit keys on 11-bit digits, skipping digits that are equal in every key.
void radix_sort(std::vector<uint64_t>& keys, std::vector<uint64_t>& tmp, int key_bits) {
  constexpr int kDigit = 11;
  constexpr uint32_t kBuckets = 1u << kDigit;
  const size_t n = keys.size();
  tmp.resize(n);
  uint32_t hist[kBuckets];
  for (int shift = 0; shift < key_bits; shift += kDigit) {
    std::fill(hist, hist + kBuckets, 0u);
    for (size_t i = 0; i < n; ++i) ++hist[(keys[i] >> shift) & (kBuckets - 1)];
    if (hist[(keys[0] >> shift) & (kBuckets - 1)] == n) continue;  // one bucket: nothing to do
    uint32_t sum = 0;
    for (uint32_t b = 0; b < kBuckets; ++b) {
      const uint32_t h = hist[b];
      hist[b] = sum;
      sum += h;
    }
    for (size_t i = 0; i < n; ++i) tmp[hist[(keys[i] >> shift) & (kBuckets - 1)]++] = keys[i];
    keys.swap(tmp);
  }
}

/// order = 0 .. n-1 sorted by cost descending, ties by index ascending.
void sort_by_cost_desc(const std::vector<int64_t>& cost, std::vector<int32_t>& order, Scratch& s) {
  const size_t n = cost.size();
  order.resize(n);
  if (n == 0) return;
  int64_t min_cost = cost[0];
  int64_t max_cost = cost[0];
  for (size_t i = 1; i < n; ++i) {
    min_cost = std::min(min_cost, cost[i]);
    max_cost = std::max(max_cost, cost[i]);
  }
  const int idx_bits = bit_width(n - 1);
  const int range_bits = bit_width(static_cast<uint64_t>(max_cost - min_cost));
  if (range_bits == 0) {  // all costs equal
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  } else if (idx_bits + range_bits <= 64) {
    // Key: (max_cost - cost) above the index, so ascending keys are cost descending, index ascending.
    s.keys.resize(n);
    for (size_t i = 0; i < n; ++i) s.keys[i] = (static_cast<uint64_t>(max_cost - cost[i]) << idx_bits) | i;
    if (n < 256) {
      std::sort(s.keys.begin(), s.keys.end());
    } else {
      radix_sort(s.keys, s.keys_tmp, idx_bits + range_bits);
    }
    const uint64_t idx_mask = (uint64_t{1} << idx_bits) - 1;
    for (size_t k = 0; k < n; ++k) order[k] = static_cast<int32_t>(s.keys[k] & idx_mask);
  } else {
    // Costs too spread out to share 64 bits with the index (alpha or beta near int64 limits).
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
    const int64_t* c = cost.data();
    std::sort(order.begin(), order.end(), [c](int32_t a, int32_t b) { return c[a] > c[b] || (c[a] == c[b] && a < b); });
  }
}

/// 10 * makespan <= 11 * bound without overflow (both >= 0).
inline bool within_10_percent(int64_t makespan, int64_t bound) {
  return makespan <= bound || makespan - bound <= bound / 10;
}

/// Assigns c's items, taken in c.order, each to the least loaded CTA (ties: lowest index): fills
/// c.cta and c.makespan. c.total must be set.
void assign_greedy(Candidate& c, int32_t num_ctas, Scratch& s) {
  const size_t n = c.items.size();
  c.cta.resize(n);
  c.makespan = 0;
  if (n == 0) return;
  const int32_t C = num_ctas;
  const int cta_bits = bit_width(static_cast<uint64_t>(C - 1));
  int64_t makespan = 0;
  if (cta_bits == 0) {  // one CTA
    std::fill(c.cta.begin(), c.cta.end(), 0);
    makespan = c.total;
  } else if (bit_width(static_cast<uint64_t>(c.total)) + cta_bits <= 63) {
    // Min-heap of (load << cta_bits | cta): one integer compare orders by load, then CTA. All loads 0
    // in CTA order is already a heap; a sentinel after the last entry saves a bounds check.
    s.packed_heap.resize(static_cast<size_t>(C) + 1);
    uint64_t* heap = s.packed_heap.data();
    for (int32_t i = 0; i < C; ++i) heap[i] = static_cast<uint64_t>(i);
    heap[C] = ~uint64_t{0};
    const uint64_t cta_mask = (uint64_t{1} << cta_bits) - 1;
    for (size_t k = 0; k < n; ++k) {
      const uint64_t top = heap[0] + (static_cast<uint64_t>(c.cost[c.order[k]]) << cta_bits);
      c.cta[k] = static_cast<int32_t>(heap[0] & cta_mask);
      // Sift the grown root down.
      int32_t i = 0;
      for (;;) {
        int32_t child = 2 * i + 1;
        if (child >= C) break;
        if (heap[child + 1] < heap[child]) ++child;
        if (heap[child] >= top) break;
        heap[i] = heap[child];
        i = child;
      }
      heap[i] = top;
    }
    for (int32_t i = 0; i < C; ++i) makespan = std::max(makespan, static_cast<int64_t>(heap[i] >> cta_bits));
  } else {
    // Loads too large to pack with the CTA index: compare (load, cta) pairs.
    s.heap.resize(C);
    HeapEntry* heap = s.heap.data();
    for (int32_t i = 0; i < C; ++i) heap[i] = HeapEntry{0, i};
    for (size_t k = 0; k < n; ++k) {
      HeapEntry top = heap[0];
      c.cta[k] = top.cta;
      top.load += c.cost[c.order[k]];
      int32_t i = 0;
      for (;;) {
        int32_t child = 2 * i + 1;
        if (child >= C) break;
        if (child + 1 < C && heap_less(heap[child + 1], heap[child])) ++child;
        if (!heap_less(heap[child], top)) break;
        heap[i] = heap[child];
        i = child;
      }
      heap[i] = top;
    }
    for (int32_t i = 0; i < C; ++i) makespan = std::max(makespan, heap[i].load);
  }
  c.makespan = makespan;
}

/// Longest-processing-time-first assignment of c's items to num_ctas CTAs: fills c.order, c.cta
/// and c.makespan. c.total must be set.
void run_lpt(Candidate& c, int32_t num_ctas, Scratch& s) {
  sort_by_cost_desc(c.cost, c.order, s);
  c.grouped = false;
  assign_greedy(c, num_ctas, s);
}

/// c.order (the LPT order: cost descending, ties in generation order) regrouped by request (by
/// KV group, kv_group): groups in decreasing total cost (ties: lower group first), each group's
/// items in their LPT order. A stable counting sort of the LPT order on the group's rank.
void order_by_request(Candidate& c, int32_t num_requests, const int32_t* kv_group, Scratch& s) {
  const size_t n = c.items.size();
  const size_t B = static_cast<size_t>(num_requests);
  const auto group = [&](size_t i) {
    const int32_t r = c.items[i].request;
    return kv_group != nullptr ? kv_group[r] : r;
  };
  s.request_total.assign(B, 0);
  s.counts.assign(B + 1, 0);
  for (size_t i = 0; i < n; ++i) s.request_total[group(i)] += c.cost[i];
  sort_by_cost_desc(s.request_total, s.request_rank_order, s);  // rank -> group
  s.request_rank.resize(B);
  for (size_t k = 0; k < B; ++k) s.request_rank[s.request_rank_order[k]] = static_cast<int32_t>(k);
  for (size_t i = 0; i < n; ++i) ++s.counts[s.request_rank[group(i)] + 1];
  for (size_t k = 0; k < B; ++k) s.counts[k + 1] += s.counts[k];  // first position of each rank
  s.saved_order.swap(c.order);
  c.order.resize(n);
  for (size_t k = 0; k < n; ++k) {
    const int32_t i = s.saved_order[k];
    c.order[s.counts[s.request_rank[group(i)]]++] = i;
  }
}

/// The request-grouped assignment (see planner.h, PlannerConfig::group_by_request) of an LPT
/// candidate: kept when its makespan is at most 1/32 above the LPT one and it stays within 10% of
/// the lower bound whenever the LPT plan is; else the LPT assignment is restored.
void regroup_by_request(Candidate& c, int32_t num_ctas, int32_t num_requests, const int32_t* kv_group, int64_t lb,
                        Scratch& s) {
  s.saved_cta.assign(c.cta.begin(), c.cta.end());
  const int64_t lpt_makespan = c.makespan;
  order_by_request(c, num_requests, kv_group, s);  // the LPT order moves to s.saved_order
  assign_greedy(c, num_ctas, s);
  const bool keep = c.makespan - lpt_makespan <= lpt_makespan / 32 &&
                    (within_10_percent(c.makespan, lb) || !within_10_percent(lpt_makespan, lb));
  if (keep) {
    c.grouped = true;
    return;
  }
  c.order.swap(s.saved_order);
  c.cta.swap(s.saved_cta);
  c.makespan = lpt_makespan;
  c.grouped = false;
}

/// An exchange of balance_by_exchanges: item `a` of the most loaded CTA goes to CTA `j`, and item
/// `b` of CTA j (-1: none, a move) comes back; positions in the CTAs' lists. `peak`: the larger of
/// the two CTAs' loads after it.
struct Exchange {
  int64_t peak;
  int32_t a = -1, j = -1, b = -1;
};

/// The exchange between CTA m's last `tail` items and those of the CTAs `light[0..count)` whose two
/// new loads have the smallest maximum below m's load (ties: scan order); a = -1 if none lowers it.
Exchange best_exchange(const Scratch& s, int32_t m, const int32_t* light, int32_t count, int32_t tail) {
  const int64_t* cost = s.item_cost.data();
  const int64_t* load = s.loads.data();
  const int64_t top = load[m];
  Exchange best{top};
  const std::vector<int32_t>& from = s.cta_items[m];
  const int32_t from_n = static_cast<int32_t>(from.size());
  for (int32_t r = 0; r < count; ++r) {
    const int32_t j = light[r];
    if (j == m) continue;
    const int64_t room = top - load[j];  // an exchange moving d in (0, room) lowers the peak
    const std::vector<int32_t>& to = s.cta_items[j];
    const int32_t to_n = static_cast<int32_t>(to.size());
    for (int32_t a = std::max(0, from_n - tail); a < from_n; ++a) {
      const int64_t x = cost[from[a]];
      if (x < room && std::max(top - x, load[j] + x) < best.peak) best = Exchange{std::max(top - x, load[j] + x), a, j, -1};
      for (int32_t b = std::max(0, to_n - tail); b < to_n; ++b) {
        const int64_t d = x - cost[to[b]];
        if (d > 0 && d < room && std::max(top - d, load[j] + d) < best.peak) {
          best = Exchange{std::max(top - d, load[j] + d), a, j, b};
        }
      }
    }
  }
  return best;
}

/// Applies exchange e out of CTA m: c.cta, the loads and both CTAs' lists (kept ascending).
void apply_exchange(const Exchange& e, int32_t m, Candidate& c, Scratch& s) {
  const auto insert_sorted = [](std::vector<int32_t>& v, int32_t k) {
    v.insert(std::upper_bound(v.begin(), v.end(), k), k);
  };
  std::vector<int32_t>& src = s.cta_items[m];
  std::vector<int32_t>& dst = s.cta_items[e.j];
  const int32_t ka = src[e.a];
  src.erase(src.begin() + e.a);
  int64_t d = s.item_cost[ka];
  if (e.b >= 0) {
    const int32_t kb = dst[e.b];
    dst.erase(dst.begin() + e.b);
    d -= s.item_cost[kb];
    c.cta[kb] = m;
    insert_sorted(src, kb);
  }
  c.cta[ka] = e.j;
  insert_sorted(dst, ka);
  s.loads[m] -= d;
  s.loads[e.j] += d;
}

/// After LPT or the request-grouped assignment, when the makespan is more than 1/128 above the
/// lower bound: moves an item of the most loaded CTA to another CTA, or swaps it for a cheaper item
/// there, while that lowers the most loaded CTA's load and leaves the other's below it (see the top
/// of the file). Each exchange lowers the sum of squared loads, so the loop ends; it stops when the
/// most loaded CTA has no such exchange with the kExchangeCtas least loaded CTAs, is within 1/256
/// of the lower bound, or after kMaxExchanges. Items keep their place in the assignment order
/// (positions k), so each CTA still runs its items in that order. Only the last kTail items of
/// each CTA are exchanged: an item moved into the middle of a CTA's list delays everything after
/// it there, out of step with the other tiles of their requests, which then stop sharing their K/V
/// in L2 (W5 q512, 537 MB of K/V: 2% slower with exchanges anywhere; bench/results/LOG.md). Plans
/// with more than kMaxItemsPerCta items a CTA on average are left as they are: LPT's excess over
/// the bound is at most one item's cost, a small share there. An assignment that gained 1/256 of
/// the bound or less is restored.
void balance_by_exchanges(Candidate& c, int32_t num_ctas, int64_t lb, Scratch& s) {
  constexpr int32_t kExchangeCtas = 4;
  constexpr int32_t kTail = 4;
  constexpr int32_t kMaxExchanges = 64;  // bounds plan() time (~50 ns an exchange)
  constexpr int64_t kMaxItemsPerCta = 32;
  const size_t n = c.items.size();
  const int32_t C = num_ctas;
  if (C < 2 || n < 2 || c.makespan - lb <= lb / 128 || static_cast<int64_t>(n) > kMaxItemsPerCta * C) return;
  s.loads.assign(static_cast<size_t>(C), 0);
  if (s.cta_items.size() < static_cast<size_t>(C)) s.cta_items.resize(static_cast<size_t>(C));
  for (int32_t j = 0; j < C; ++j) s.cta_items[j].clear();
  const int64_t before = c.makespan;
  s.saved_cta.assign(c.cta.begin(), c.cta.end());
  s.item_cost.resize(n);  // by position k
  for (size_t k = 0; k < n; ++k) {
    s.item_cost[k] = c.cost[c.order[k]];
    s.loads[c.cta[k]] += s.item_cost[k];
    s.cta_items[c.cta[k]].push_back(static_cast<int32_t>(k));
  }
  const int64_t* load = s.loads.data();
  const int32_t R = std::min(kExchangeCtas, C - 1);
  for (int32_t round = 0; round < kMaxExchanges; ++round) {
    // The most loaded CTA m and the R least loaded ones, lightest first (ties: lower index first).
    int32_t m = 0, found = 0;
    int32_t light[kExchangeCtas];
    for (int32_t j = 0; j < C; ++j) {
      if (load[j] > load[m]) m = j;
      int32_t at = found;
      while (at > 0 && load[light[at - 1]] > load[j]) --at;
      if (at < R) {
        for (int32_t q = std::min(found, R - 1); q > at; --q) light[q] = light[q - 1];
        light[at] = j;
        found = std::min(found + 1, R);
      }
    }
    if (load[m] - lb <= lb / 256) break;
    const Exchange e = best_exchange(s, m, light, found, kTail);
    if (e.a < 0) break;
    apply_exchange(e, m, c, s);
  }
  c.makespan = *std::max_element(s.loads.begin(), s.loads.end());
  // A gain within 1/256 of the bound is below what the GPU resolves, while every exchange moves
  // tiles of a request out of step with its others (W5 q128: 0.2% of modelled gain measured 0.8%
  // slower): the assignment is kept only for more.
  if ((before - c.makespan) * 256 <= lb) {
    c.cta.swap(s.saved_cta);
    c.makespan = before;
  }
}

/// Water-filling with CTA capacity T (see the top of the file): fills `pieces` in placement order and
/// returns the makespan, or -1 if the tiles do not fit in num_ctas CTAs or need more than
/// max_partials partial slots. `order` lists the tiles by decreasing cost.
int64_t fill_tiles(const std::vector<Tile>& tiles, const std::vector<int32_t>& order, const PlannerConfig& cfg,
                   int64_t T, int64_t max_partials, std::vector<Piece>& pieces) {
  pieces.clear();
  const int64_t a = cfg.alpha;
  const int64_t b = cfg.beta;
  const int64_t kvt = cfg.kv_tile_rows;
  int64_t front = 0;                                     // next tile (in `order`) to pour
  int64_t back = static_cast<int64_t>(order.size()) - 1;  // cheapest whole tile left
  int64_t pos = 0;                                       // KV rows of the front tile already placed
  int64_t front_pieces = 0;
  int64_t partials = 0;
  int64_t makespan = 0;
  for (int32_t cta = 0; cta < cfg.num_ctas && front <= back; ++cta) {
    int64_t room = T;
    while (front <= back) {
      const Tile& t = tiles[order[front]];
      const int64_t q_cost = a * t.rows;
      const int64_t whole = q_cost + b * (t.kv_end - pos);
      if (whole <= room) {
        pieces.push_back(Piece{order[front], static_cast<int32_t>(pos), t.kv_end, cta});
        room -= whole;
        if (front_pieces > 0) partials += front_pieces + 1;
        front_pieces = 0;
        pos = 0;
        ++front;
        continue;
      }
      // Cut: the longest multiple of kv_tile_rows that fits (shorter than what is left, since the
      // rest did not fit).
      const int64_t k = room > q_cost ? (room - q_cost) / b / kvt * kvt : 0;
      if (k > 0) {
        pieces.push_back(Piece{order[front], static_cast<int32_t>(pos), static_cast<int32_t>(pos + k), cta});
        room -= q_cost + b * k;
        pos += k;
        ++front_pieces;
      }
      break;
    }
    // Top up with whole tiles from the cheap end (never the front tile itself).
    while (back > front) {
      const Tile& t = tiles[order[back]];
      const int64_t whole = a * t.rows + b * t.kv_end;
      if (whole > room) break;
      pieces.push_back(Piece{order[back], 0, t.kv_end, cta});
      room -= whole;
      --back;
    }
    makespan = std::max(makespan, T - room);
    if (partials > max_partials) return -1;
  }
  if (front <= back) return -1;
  return makespan;
}

/// Turns a fill plan's pieces into a candidate: items in generation order with partial slots and
/// merges, and the assignment in decreasing cost order.
void fill_to_candidate(const std::vector<Tile>& tiles, const std::vector<Piece>& pieces, const PlannerConfig& cfg,
                       int64_t makespan, Scratch& s, Candidate& c) {
  // Stable counting sort of the pieces by tile: a tile's pieces were placed in KV order.
  const size_t T = tiles.size();
  const size_t n = pieces.size();
  s.piece_first.assign(T + 1, 0);
  for (const Piece& p : pieces) ++s.piece_first[p.tile + 1];
  for (size_t t = 0; t < T; ++t) s.piece_first[t + 1] += s.piece_first[t];
  s.counts.assign(s.piece_first.begin(), s.piece_first.end() - 1);  // next free position per tile
  std::vector<int32_t>& piece_cta = c.cta;                           // reused as scratch below
  piece_cta.resize(n);
  c.items.resize(n);
  c.cost.resize(n);
  c.merges.clear();
  for (const Piece& p : pieces) {
    const int32_t i = s.counts[p.tile]++;
    const Tile& t = tiles[p.tile];
    c.items[i] = WorkItem{t.request, t.packed_begin, p.kv_begin, p.kv_end, -1};
    c.cost[i] = cfg.alpha * t.rows + cfg.beta * (int64_t{p.kv_end} - p.kv_begin);
    piece_cta[i] = p.cta;
  }
  int32_t partials = 0;
  int64_t total = 0, longest = 1;
  for (size_t t = 0; t < T; ++t) {
    const int32_t first = s.piece_first[t];
    const int32_t end = s.piece_first[t + 1];
    if (end - first > 1) {
      for (int32_t i = first; i < end; ++i) c.items[i].partial = partials + (i - first);
      c.merges.push_back(MergeItem{tiles[t].request, tiles[t].packed_begin, partials, partials + (end - first)});
      partials += end - first;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    total += c.cost[i];
    longest = std::max<int64_t>(longest, c.items[i].kv_end - c.items[i].kv_begin);
  }
  sort_by_cost_desc(c.cost, c.order, s);
  s.counts.resize(n);
  for (size_t k = 0; k < n; ++k) s.counts[k] = piece_cta[c.order[k]];
  piece_cta.swap(s.counts);  // c.cta[k] = CTA of the k-th item in cost order
  c.L = round_up(longest, cfg.kv_tile_rows);
  c.total = total;
  c.makespan = makespan;
  c.num_partials = partials;
  c.grouped = false;
  c.fill = true;
}

void emit_plan(const Candidate& c, const PlannerConfig& cfg, Scratch& s, Plan& plan) {
  const int32_t num_ctas = cfg.num_ctas;
  const size_t n = c.items.size();
  s.counts.assign(static_cast<size_t>(num_ctas) + 1, 0);
  for (size_t k = 0; k < n; ++k) ++s.counts[c.cta[k] + 1];
  plan.cta_indptr.resize(static_cast<size_t>(num_ctas) + 1);
  plan.cta_indptr[0] = 0;
  for (int32_t i = 0; i < num_ctas; ++i) {
    s.counts[i + 1] += s.counts[i];
    plan.cta_indptr[i + 1] = s.counts[i + 1];
  }
  plan.items.resize(n);
  for (size_t k = 0; k < n; ++k) plan.items[s.counts[c.cta[k]]++] = c.items[c.order[k]];
  plan.merges.assign(c.merges.begin(), c.merges.end());
  plan.num_partials = c.num_partials;
  plan.makespan = c.makespan;
  plan.total_cost = c.total;
  // An L beyond int32 splits nothing; it is reported as the largest multiple of kv_tile_rows in int32.
  plan.chunk_size = static_cast<int32_t>(
      c.L <= INT32_MAX ? c.L : int64_t{INT32_MAX} / cfg.kv_tile_rows * cfg.kv_tile_rows);
}

void validate(const std::vector<int32_t>& qo_len, const std::vector<int32_t>& kv_len, const PlannerConfig& cfg) {
  TESSERA_CHECK_ARG(cfg.num_ctas >= 1) << "config.num_ctas = " << cfg.num_ctas << ", expected >= 1";
  TESSERA_CHECK_ARG(cfg.group_size >= 1) << "config.group_size = " << cfg.group_size << ", expected >= 1";
  TESSERA_CHECK_ARG(cfg.q_tile_rows >= 1) << "config.q_tile_rows = " << cfg.q_tile_rows << ", expected >= 1";
  TESSERA_CHECK_ARG(cfg.kv_tile_rows >= 1) << "config.kv_tile_rows = " << cfg.kv_tile_rows << ", expected >= 1";
  TESSERA_CHECK_ARG(cfg.alpha >= 0) << "config.alpha = " << cfg.alpha << ", expected >= 0";
  TESSERA_CHECK_ARG(cfg.beta >= 1) << "config.beta = " << cfg.beta << ", expected >= 1";
  TESSERA_CHECK_ARG(cfg.max_partials >= 0) << "config.max_partials = " << cfg.max_partials << ", expected >= 0";
  const int32_t mode = static_cast<int32_t>(cfg.split_mode);
  TESSERA_CHECK_ARG(mode >= 0 && mode <= 2)
      << "config.split_mode = " << mode << ", expected kAuto (0), kFixed (1) or kNone (2)";
  if (cfg.split_mode == SplitMode::kFixed) {
    TESSERA_CHECK_ARG(cfg.fixed_split_size >= 1 && cfg.fixed_split_size % cfg.kv_tile_rows == 0)
        << "config.fixed_split_size = " << cfg.fixed_split_size
        << ", expected a positive multiple of config.kv_tile_rows = " << cfg.kv_tile_rows << " with kFixed";
  }
  TESSERA_CHECK_ARG(qo_len.size() == kv_len.size())
      << "qo_len.size() = " << qo_len.size() << ", expected kv_len.size() = " << kv_len.size();
  TESSERA_CHECK_ARG(qo_len.size() <= static_cast<size_t>(INT32_MAX))
      << "qo_len.size() = " << qo_len.size() << ", expected <= " << INT32_MAX;
  const size_t B = qo_len.size();
  for (size_t b = 0; b < B; ++b) {
    TESSERA_CHECK_ARG(qo_len[b] >= 0) << "qo_len[" << b << "] = " << qo_len[b] << ", expected >= 0";
    TESSERA_CHECK_ARG(kv_len[b] >= 0) << "kv_len[" << b << "] = " << kv_len[b] << ", expected >= 0";
    const int64_t packed = static_cast<int64_t>(qo_len[b]) * cfg.group_size;
    TESSERA_CHECK_ARG(packed <= INT32_MAX)
        << "qo_len[" << b << "] * config.group_size = " << qo_len[b] << " * " << cfg.group_size << " = "
        << packed << " packed rows, expected <= " << INT32_MAX;
  }
}

/// kAuto: the halving search of docs/design.md §6, then the fill fallback. Returns the chosen candidate.
Candidate* plan_auto(const PlannerConfig& config, int64_t lb, int64_t sum_kv, int64_t max_kv, int64_t max_partials,
                     Scratch& s) {
  const int64_t C = config.num_ctas;
  const int64_t kvt = config.kv_tile_rows;
  Candidate* best = &s.cand[0];
  Candidate* cur = &s.cand[1];
  bool have_best = false;
  const int64_t min_L = round_up(std::max<int64_t>(kvt, config.min_chunk_rows), kvt);
  const int64_t L0 = std::max(min_L, round_up(std::max<int64_t>(1, ceil_div(sum_kv, C)), kvt));
  for (int64_t L = L0;;) {
    const ChunkRule rule{SplitMode::kAuto, L};
    bool skip = false;
    if (have_best) {
      // A candidate whose own bound is out of the 10% band and no better than the best so far can
      // neither be accepted nor replace the best: skip it without building it. Totals only grow as
      // L shrinks (and so do partial slots), so if its total alone rules it out, or it needs too
      // many slots, every later candidate is ruled out too.
      int64_t total, max_item, partials;
      count_chunks(s.tiles, config, rule, total, max_item, partials);
      if (partials > max_partials) break;
      const int64_t total_bound = ceil_div(total, C);
      const int64_t bound = std::max(total_bound, max_item);
      if (!within_10_percent(bound, lb) && bound >= best->makespan) {
        if (!within_10_percent(total_bound, lb) && total_bound >= best->makespan) break;
        skip = true;
      }
    }
    if (!skip) {
      if (!chunk_tiles(s.tiles, config, rule, max_partials, *cur)) break;  // smaller L need more slots
      run_lpt(*cur, config.num_ctas, s);
      if (!have_best || cur->makespan < best->makespan) {
        std::swap(cur, best);
        have_best = true;
      }
      if (best->L == L && within_10_percent(best->makespan, lb)) return best;  // accepted
    }
    const int64_t next = std::max(min_L, round_up(L / 2, kvt));
    if (next >= L) break;
    L = next;
  }
  if (!have_best) {
    // Even L0 needs more than max_partials slots: the no-split plan.
    chunk_tiles(s.tiles, config, ChunkRule{SplitMode::kNone, 0}, max_partials, *best);
    run_lpt(*best, config.num_ctas, s);
    best->L = round_up(std::max<int64_t>(1, max_kv), kvt);
    if (within_10_percent(best->makespan, lb)) return best;
  }

  if (min_L > kvt) return best;  // fill pieces could be shorter than the minimum chunk

  // Fill fallback: binary search for the smallest capacity T in [lb, best makespan) whose fill plan
  // fits, down to a resolution of lb / 512.
  const size_t T_count = s.tiles.size();
  s.tile_cost.resize(T_count);
  for (size_t t = 0; t < T_count; ++t) {
    s.tile_cost[t] = config.alpha * s.tiles[t].rows + config.beta * s.tiles[t].kv_end;
  }
  sort_by_cost_desc(s.tile_cost, s.tile_order, s);
  int64_t lo = lb;                     // below lb nothing fits
  int64_t hi = best->makespan - 1;     // the fill plan must beat the best LPT plan
  int64_t fill_makespan = -1;          // of the plan in pieces[found]
  int found = 0;
  const int64_t resolution = std::max<int64_t>(1, lb / 512);
  if (hi >= lo) {
    fill_makespan = fill_tiles(s.tiles, s.tile_order, config, hi, max_partials, s.pieces[found]);
    if (fill_makespan >= 0) {
      hi = std::min(hi, fill_makespan);
      while (hi - lo > resolution) {
        const int64_t mid = lo + (hi - lo) / 2;
        const int64_t m = fill_tiles(s.tiles, s.tile_order, config, mid, max_partials, s.pieces[1 - found]);
        if (m >= 0) {
          found = 1 - found;
          fill_makespan = m;
          hi = std::min(mid, m);
        } else {
          lo = mid + 1;
        }
      }
    }
  }
  if (fill_makespan >= 0 && fill_makespan < best->makespan) {
    fill_to_candidate(s.tiles, s.pieces[found], config, fill_makespan, s, *cur);
    return cur;
  }
  return best;
}

/// The batch's query-tile count and whether some tiles share their KV (a request with two or more
/// tiles, or consecutive requests of one kv_group), after the overflow guard: no plan has more
/// than ceil(kv_len / kv_tile_rows) chunks for a tile (kAuto and kFixed chunks and fill pieces
/// hold >= kv_tile_rows keys except a tile's last), so the worst total checked here bounds every
/// total and load computed later, which then need no checks.
struct TileCount {
  int64_t num_tiles = 0;
  bool shared_kv = false;
};

TileCount count_tiles(const std::vector<int32_t>& qo_len, const std::vector<int32_t>& kv_len,
                      const PlannerConfig& config) {
  const int64_t Tq = config.q_tile_rows, G = config.group_size, kvt = config.kv_tile_rows;
  const int64_t alpha = config.alpha, beta = config.beta;
  const int32_t B = static_cast<int32_t>(qo_len.size());
  TileCount count;
  int64_t worst_total = 0;
  for (int32_t b = 0; b < B; ++b) {
    const int64_t kv = kv_len[b];
    const int64_t tiles = ceil_div(int64_t{qo_len[b]} * G, Tq);
    const int64_t max_chunks = std::max<int64_t>(1, ceil_div(kv, kvt));
    int64_t q_cost, k_cost, tile_worst, request_worst;
    bool overflow = __builtin_mul_overflow(alpha, Tq * max_chunks, &q_cost);
    overflow |= __builtin_mul_overflow(beta, kv, &k_cost);
    overflow |= __builtin_add_overflow(q_cost, k_cost, &tile_worst);
    overflow |= __builtin_mul_overflow(tile_worst, tiles, &request_worst);
    overflow |= __builtin_add_overflow(worst_total, request_worst, &worst_total);
    TESSERA_CHECK_ARG(!overflow) << "config.alpha = " << alpha << ", config.beta = " << beta
                                 << ": the plan's cost up to request " << b << " overflows int64";
    count.num_tiles += tiles;
    count.shared_kv |= tiles >= 2;
    if (config.kv_group != nullptr) {
      TESSERA_CHECK_ARG(config.kv_group[b] >= 0 && config.kv_group[b] < B)
          << "config.kv_group[" << b << "] = " << config.kv_group[b] << ", expected in [0, " << B << ")";
      count.shared_kv |= b > 0 && config.kv_group[b] == config.kv_group[b - 1];
    }
  }
  TESSERA_CHECK_ARG(count.num_tiles <= INT32_MAX)
      << "batch of " << B << " requests has " << count.num_tiles << " query tiles, expected <= " << INT32_MAX;
  return count;
}

/// What the search needs of the tiles besides the tiles themselves.
struct TileTotals {
  int64_t unsplit_cost = 0;         // U: every tile unsplit
  int64_t largest_indivisible = 0;  // the costliest tile's first kv_tile_rows keys
  int64_t sum_kv = 0;
  int64_t max_kv = 0;
};

/// Fills s.tiles (num_tiles of them, request by request) with each query tile's rows and KV end
/// (clipped to what its last query sees under a causal mask) and returns their totals.
TileTotals build_tiles(const std::vector<int32_t>& qo_len, const std::vector<int32_t>& kv_len,
                       const PlannerConfig& config, int64_t num_tiles, Scratch& s) {
  const int64_t Tq = config.q_tile_rows, G = config.group_size, kvt = config.kv_tile_rows;
  s.tiles.resize(static_cast<size_t>(num_tiles));
  Tile* tile = s.tiles.data();
  TileTotals totals;
  const int64_t step_q = Tq / G;  // causal: a full tile moves its last query by Tq / G, Tq % G
  const int64_t step_r = Tq % G;
  for (int32_t b = 0; b < static_cast<int32_t>(qo_len.size()); ++b) {
    const int64_t qo = qo_len[b];
    const int64_t kv = kv_len[b];
    const int64_t packed = qo * G;
    // last packed row of the current full tile = last_q * G + last_r
    int64_t last_q = (Tq - 1) / G;
    int64_t last_r = (Tq - 1) % G;
    for (int64_t begin = 0; begin < packed; begin += Tq) {
      const int64_t rows = std::min(Tq, packed - begin);
      int64_t kv_end = kv;
      if (config.causal) {
        const int64_t last_qo = rows == Tq ? last_q : (begin + rows - 1) / G;
        kv_end = std::clamp<int64_t>(kv - qo + last_qo + 1, 0, kv);
        last_q += step_q;
        last_r += step_r;
        if (last_r >= G) {
          last_r -= G;
          ++last_q;
        }
      }
      *tile++ = Tile{b, static_cast<int32_t>(begin), static_cast<int32_t>(rows), static_cast<int32_t>(kv_end)};
      const int64_t q_cost = config.alpha * rows;
      totals.unsplit_cost += q_cost + config.beta * kv_end;
      totals.largest_indivisible =
          std::max(totals.largest_indivisible, q_cost + config.beta * std::min(kv_end, kvt));
      totals.sum_kv += kv_end;
      totals.max_kv = std::max(totals.max_kv, kv_end);
    }
  }
  return totals;
}

}  // namespace

Plan plan_work(const std::vector<int32_t>& qo_len, const std::vector<int32_t>& kv_len, const PlannerConfig& config) {
  validate(qo_len, kv_len, config);
  thread_local Scratch scratch;
  Scratch& s = scratch;
  const TileCount count = count_tiles(qo_len, kv_len, config);
  const TileTotals totals = build_tiles(qo_len, kv_len, config, count.num_tiles, s);

  Plan plan;
  plan.lower_bound = s.tiles.empty()
                         ? 0
                         : std::max(ceil_div(totals.unsplit_cost, int64_t{config.num_ctas}), totals.largest_indivisible);
  // Item indices are int32 (cta_indptr): a plan has (tiles - split tiles) + partials items, so
  // capping the partials at INT32_MAX - tiles keeps every plan indexable.
  const int64_t max_partials =
      std::min<int64_t>(config.max_partials, INT32_MAX - static_cast<int64_t>(s.tiles.size()));

  Candidate* chosen = &s.cand[0];
  switch (config.split_mode) {
    case SplitMode::kNone:
      chunk_tiles(s.tiles, config, ChunkRule{SplitMode::kNone, 0}, max_partials, *chosen);
      run_lpt(*chosen, config.num_ctas, s);
      break;
    case SplitMode::kFixed:
      if (!chunk_tiles(s.tiles, config, ChunkRule{SplitMode::kFixed, config.fixed_split_size}, max_partials,
                       *chosen)) {
        plan.ok = false;
        plan.error = "kFixed plan needs more partial slots than config.max_partials";
        plan.cta_indptr.assign(static_cast<size_t>(config.num_ctas) + 1, 0);
        plan.chunk_size = config.fixed_split_size;
        s.trim();
        return plan;
      }
      run_lpt(*chosen, config.num_ctas, s);
      break;
    case SplitMode::kAuto:
      chosen = plan_auto(config, plan.lower_bound, totals.sum_kv, totals.max_kv, max_partials, s);
      break;
  }
  if (config.group_by_request && count.shared_kv && !chosen->fill && config.num_ctas > 1) {
    regroup_by_request(*chosen, config.num_ctas, static_cast<int32_t>(qo_len.size()), config.kv_group,
                       plan.lower_bound, s);
  }
  if (config.exchanges && !chosen->fill) balance_by_exchanges(*chosen, config.num_ctas, plan.lower_bound, s);
  emit_plan(*chosen, config, s, plan);
  plan.grouped_by_request = chosen->grouped;
  s.trim();
  return plan;
}

}  // namespace runtime
}  // namespace tessera
