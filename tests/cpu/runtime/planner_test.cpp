// The load-balancing planner (src/runtime/planner.h, docs/design.md §6): hand-checked small batches,
// a property test over thousands of random batches (coverage, merge map, CTA index, statistics,
// determinism, balance, batch invariance of kFixed), rejection of malformed configs, and timing of
// the two hot-path cases (printed, not asserted).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <random>
#include <sstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "src/runtime/planner.h"
#include "tessera/error.h"

namespace tessera {
namespace runtime {
namespace {

// ---------------------------------------------------------------------------------------------
// An independent model of the tiles, written from planner.h.

struct RefTile {
  int32_t request;
  int32_t packed_begin;
  int32_t rows;
  int32_t kv_end;
};

struct RefTiles {
  std::vector<RefTile> tiles;
  std::vector<int64_t> first;  // [B + 1]: tiles of request b are first[b] .. first[b + 1]
};

RefTiles ref_tiles(const std::vector<int32_t>& qo, const std::vector<int32_t>& kv, const PlannerConfig& cfg) {
  RefTiles r;
  r.first.push_back(0);
  for (size_t b = 0; b < qo.size(); ++b) {
    const int64_t packed = int64_t{qo[b]} * cfg.group_size;
    for (int64_t begin = 0; begin < packed; begin += cfg.q_tile_rows) {
      const int64_t rows = std::min<int64_t>(cfg.q_tile_rows, packed - begin);
      int64_t end = kv[b];
      if (cfg.causal) {
        const int64_t last_query = (begin + rows - 1) / cfg.group_size;  // query index of the last row
        end = std::min<int64_t>(kv[b], std::max<int64_t>(0, int64_t{kv[b]} - qo[b] + last_query + 1));
      }
      r.tiles.push_back(RefTile{static_cast<int32_t>(b), static_cast<int32_t>(begin), static_cast<int32_t>(rows),
                                static_cast<int32_t>(end)});
    }
    r.first.push_back(static_cast<int64_t>(r.tiles.size()));
  }
  return r;
}

int64_t unsplit_cost(const RefTiles& t, const PlannerConfig& cfg) {
  int64_t u = 0;
  for (const RefTile& x : t.tiles) u += cfg.alpha * x.rows + cfg.beta * x.kv_end;
  return u;
}

int64_t ref_lower_bound(const RefTiles& t, const PlannerConfig& cfg) {
  if (t.tiles.empty()) return 0;
  int64_t indivisible = 0;
  for (const RefTile& x : t.tiles) {
    indivisible = std::max(indivisible, cfg.alpha * x.rows + cfg.beta * std::min<int64_t>(x.kv_end, cfg.kv_tile_rows));
  }
  const int64_t u = unsplit_cost(t, cfg);
  return std::max((u + cfg.num_ctas - 1) / cfg.num_ctas, indivisible);
}

std::string describe(const std::vector<int32_t>& qo, const std::vector<int32_t>& kv, const PlannerConfig& cfg) {
  std::ostringstream s;
  s << "B=" << qo.size() << " group=" << cfg.group_size << " Tq=" << cfg.q_tile_rows << " kvt=" << cfg.kv_tile_rows
    << " ctas=" << cfg.num_ctas << " causal=" << cfg.causal << " mode=" << static_cast<int>(cfg.split_mode)
    << " S=" << cfg.fixed_split_size << " alpha=" << cfg.alpha << " beta=" << cfg.beta
    << " max_partials=" << cfg.max_partials << " lengths (qo,kv):";
  for (size_t b = 0; b < qo.size() && b < 16; ++b) s << " (" << qo[b] << "," << kv[b] << ")";
  if (qo.size() > 16) s << " ...";
  return s.str();
}

/// Checks every structural property of a successful plan; returns "" or the first violation.
std::string check_plan(const std::vector<int32_t>& qo, const std::vector<int32_t>& kv, const PlannerConfig& cfg,
                       const Plan& plan) {
  std::ostringstream err;
  if (!plan.ok) return std::string("plan not ok: ") + plan.error;
  const RefTiles rt = ref_tiles(qo, kv, cfg);
  const size_t T = rt.tiles.size();
  const int64_t n_items = static_cast<int64_t>(plan.items.size());
  const int64_t kvt = cfg.kv_tile_rows;

  // (c) CTA index.
  if (plan.cta_indptr.size() != static_cast<size_t>(cfg.num_ctas) + 1) {
    err << "cta_indptr.size() = " << plan.cta_indptr.size();
    return err.str();
  }
  if (plan.cta_indptr[0] != 0 || plan.cta_indptr.back() != n_items) {
    err << "cta_indptr spans " << plan.cta_indptr[0] << ".." << plan.cta_indptr.back() << ", items " << n_items;
    return err.str();
  }
  for (int c = 0; c < cfg.num_ctas; ++c) {
    if (plan.cta_indptr[c + 1] < plan.cta_indptr[c]) return "cta_indptr decreases";
  }

  // Items to tiles.
  std::vector<std::vector<int32_t>> of_tile(T);
  for (int64_t i = 0; i < n_items; ++i) {
    const WorkItem& it = plan.items[i];
    if (it.request < 0 || static_cast<size_t>(it.request) >= qo.size()) {
      err << "item " << i << " request " << it.request;
      return err.str();
    }
    const int64_t packed = int64_t{qo[it.request]} * cfg.group_size;
    if (it.packed_begin < 0 || it.packed_begin >= packed || it.packed_begin % cfg.q_tile_rows != 0) {
      err << "item " << i << " packed_begin " << it.packed_begin << " of request " << it.request;
      return err.str();
    }
    of_tile[rt.first[it.request] + it.packed_begin / cfg.q_tile_rows].push_back(static_cast<int32_t>(i));
  }

  // (a) coverage and (b) slots written.
  std::vector<int> written(std::max(plan.num_partials, 0), 0);
  std::vector<int> listed(std::max(plan.num_partials, 0), 0);
  std::vector<int64_t> split_first(T, -1), split_end(T, -1);
  for (size_t t = 0; t < T; ++t) {
    auto& v = of_tile[t];
    const RefTile& tile = rt.tiles[t];
    if (v.empty()) {
      err << "tile (" << tile.request << "," << tile.packed_begin << ") has no item";
      return err.str();
    }
    std::sort(v.begin(), v.end(), [&](int32_t a, int32_t b) {
      return plan.items[a].kv_begin < plan.items[b].kv_begin;
    });
    int64_t pos = 0;
    for (size_t j = 0; j < v.size(); ++j) {
      const WorkItem& it = plan.items[v[j]];
      if (it.kv_begin != pos || it.kv_end < it.kv_begin || (it.kv_end == it.kv_begin && tile.kv_end != 0) ||
          it.kv_begin % kvt != 0 || (it.kv_end % kvt != 0 && it.kv_end != tile.kv_end)) {
        err << "tile (" << tile.request << "," << tile.packed_begin << ") kv_end " << tile.kv_end << ": chunk " << j
            << " is [" << it.kv_begin << "," << it.kv_end << ")";
        return err.str();
      }
      pos = it.kv_end;
    }
    if (pos != tile.kv_end) {
      err << "tile (" << tile.request << "," << tile.packed_begin << ") covered to " << pos << " of " << tile.kv_end;
      return err.str();
    }
    if (v.size() == 1) {
      if (plan.items[v[0]].partial != -1) {
        err << "single-chunk tile (" << tile.request << "," << tile.packed_begin << ") writes a partial";
        return err.str();
      }
      continue;
    }
    const int32_t first = plan.items[v[0]].partial;
    for (size_t j = 0; j < v.size(); ++j) {
      const int32_t p = plan.items[v[j]].partial;
      if (p < 0 || p >= plan.num_partials || p != first + static_cast<int32_t>(j)) {
        err << "split tile (" << tile.request << "," << tile.packed_begin << ") chunk " << j << " slot " << p
            << " (first " << first << ", num_partials " << plan.num_partials << ")";
        return err.str();
      }
      ++written[p];
    }
    split_first[t] = first;
    split_end[t] = first + static_cast<int64_t>(v.size());
  }
  for (int32_t p = 0; p < plan.num_partials; ++p) {
    if (written[p] != 1) {
      err << "slot " << p << " written " << written[p] << " times";
      return err.str();
    }
  }

  // (b) merges.
  std::vector<int> merged(T, 0);
  int32_t next_slot = 0;
  for (size_t m = 0; m < plan.merges.size(); ++m) {
    const MergeItem& mi = plan.merges[m];
    if (mi.request < 0 || static_cast<size_t>(mi.request) >= qo.size() || mi.packed_begin < 0 ||
        mi.packed_begin % cfg.q_tile_rows != 0 || mi.packed_begin >= int64_t{qo[mi.request]} * cfg.group_size) {
      err << "merge " << m << " names no tile";
      return err.str();
    }
    const size_t t = rt.first[mi.request] + mi.packed_begin / cfg.q_tile_rows;
    if (split_first[t] != mi.partial_begin || split_end[t] != mi.partial_end) {
      err << "merge " << m << " slots [" << mi.partial_begin << "," << mi.partial_end << ") but its tile wrote ["
          << split_first[t] << "," << split_end[t] << ")";
      return err.str();
    }
    if (mi.partial_begin != next_slot) {
      err << "merge " << m << " starts at slot " << mi.partial_begin << ", expected " << next_slot;
      return err.str();
    }
    if (m > 0 && std::make_pair(plan.merges[m - 1].request, plan.merges[m - 1].packed_begin) >=
                     std::make_pair(mi.request, mi.packed_begin)) {
      err << "merge " << m << " out of (request, packed_begin) order";
      return err.str();
    }
    next_slot = mi.partial_end;
    ++merged[t];
    for (int32_t p = mi.partial_begin; p < mi.partial_end; ++p) ++listed[p];
  }
  if (next_slot != plan.num_partials) return "merges do not end at num_partials";
  for (size_t t = 0; t < T; ++t) {
    if (merged[t] != (split_first[t] >= 0 ? 1 : 0)) {
      err << "tile " << t << " has " << merged[t] << " merges";
      return err.str();
    }
  }
  for (int32_t p = 0; p < plan.num_partials; ++p) {
    if (listed[p] != 1) return "slot listed by " + std::to_string(listed[p]) + " merges";
  }

  // (c) statistics, recomputed.
  auto cost_of = [&](const WorkItem& it) {
    const RefTile& tile = rt.tiles[rt.first[it.request] + it.packed_begin / cfg.q_tile_rows];
    return cfg.alpha * tile.rows + cfg.beta * (int64_t{it.kv_end} - it.kv_begin);
  };
  // Order within a CTA: decreasing cost, or with grouped_by_request requests (their KV groups,
  // cfg.kv_group) in decreasing total cost (ties: lower group first), then decreasing cost.
  auto group_of = [&](int32_t r) { return cfg.kv_group != nullptr ? cfg.kv_group[r] : r; };
  std::vector<int64_t> request_total(qo.size(), 0);
  for (const WorkItem& it : plan.items) request_total[group_of(it.request)] += cost_of(it);
  auto request_before = [&](int32_t a, int32_t b) {
    a = group_of(a);
    b = group_of(b);
    return request_total[a] > request_total[b] || (request_total[a] == request_total[b] && a < b);
  };
  if (plan.grouped_by_request && !cfg.group_by_request) return "grouped_by_request set but not asked for";
  int64_t total = 0, makespan = 0;
  for (int c = 0; c < cfg.num_ctas; ++c) {
    int64_t load = 0;
    for (int32_t i = plan.cta_indptr[c]; i < plan.cta_indptr[c + 1]; ++i) {
      const int64_t cost = cost_of(plan.items[i]);
      if (i > plan.cta_indptr[c]) {
        const WorkItem& prev = plan.items[i - 1];
        const bool same_request = group_of(prev.request) == group_of(plan.items[i].request);
        const bool in_order = plan.grouped_by_request
                                  ? (same_request ? cost <= cost_of(prev) : request_before(prev.request, plan.items[i].request))
                                  : cost <= cost_of(prev);
        if (!in_order) {
          err << "CTA " << c << " items out of "
              << (plan.grouped_by_request ? "request-grouped order" : "decreasing cost");
          return err.str();
        }
      }
      load += cost;
    }
    total += load;
    makespan = std::max(makespan, load);
  }
  if (makespan != plan.makespan || total != plan.total_cost) {
    err << "makespan " << plan.makespan << " (recomputed " << makespan << "), total_cost " << plan.total_cost
        << " (recomputed " << total << ")";
    return err.str();
  }
  if (plan.lower_bound != ref_lower_bound(rt, cfg)) {
    err << "lower_bound " << plan.lower_bound << ", recomputed " << ref_lower_bound(rt, cfg);
    return err.str();
  }

  // Mode-specific chunking.
  if (cfg.split_mode == SplitMode::kNone) {
    if (plan.num_partials != 0 || plan.chunk_size != 0) return "kNone split a tile or set chunk_size";
  } else if (cfg.split_mode == SplitMode::kFixed) {
    if (plan.chunk_size != cfg.fixed_split_size) return "kFixed chunk_size";
    for (size_t t = 0; t < T; ++t) {
      const auto& v = of_tile[t];
      for (size_t j = 0; j < v.size(); ++j) {
        const WorkItem& it = plan.items[v[j]];
        const int64_t want_end = std::min<int64_t>((j + 1) * int64_t{cfg.fixed_split_size}, rt.tiles[t].kv_end);
        if (it.kv_begin != static_cast<int64_t>(j) * cfg.fixed_split_size || it.kv_end != want_end) {
          return "kFixed chunk not at a multiple of fixed_split_size";
        }
      }
    }
  } else {
    if (plan.chunk_size < kvt || plan.chunk_size % kvt != 0) {
      err << "kAuto chunk_size " << plan.chunk_size;
      return err.str();
    }
    for (const WorkItem& it : plan.items) {
      if (it.kv_end - it.kv_begin > plan.chunk_size) return "kAuto chunk longer than chunk_size";
    }
  }
  return "";
}

bool same_plan(const Plan& a, const Plan& b) {
  auto item_tuple = [](const WorkItem& w) {
    return std::make_tuple(w.request, w.packed_begin, w.kv_begin, w.kv_end, w.partial);
  };
  auto merge_tuple = [](const MergeItem& m) {
    return std::make_tuple(m.request, m.packed_begin, m.partial_begin, m.partial_end);
  };
  if (a.ok != b.ok || std::string(a.error) != b.error || a.cta_indptr != b.cta_indptr ||
      a.items.size() != b.items.size() || a.merges.size() != b.merges.size() || a.num_partials != b.num_partials ||
      a.chunk_size != b.chunk_size || a.makespan != b.makespan || a.total_cost != b.total_cost ||
      a.lower_bound != b.lower_bound || a.grouped_by_request != b.grouped_by_request) {
    return false;
  }
  for (size_t i = 0; i < a.items.size(); ++i) {
    if (item_tuple(a.items[i]) != item_tuple(b.items[i])) return false;
  }
  for (size_t i = 0; i < a.merges.size(); ++i) {
    if (merge_tuple(a.merges[i]) != merge_tuple(b.merges[i])) return false;
  }
  return true;
}

/// A request's items as (packed_begin, kv_begin, kv_end, split), sorted: what kFixed must keep
/// independent of the rest of the batch.
std::vector<std::tuple<int32_t, int32_t, int32_t, bool>> request_items(const Plan& plan, int32_t request) {
  std::vector<std::tuple<int32_t, int32_t, int32_t, bool>> r;
  for (const WorkItem& w : plan.items) {
    if (w.request == request) r.emplace_back(w.packed_begin, w.kv_begin, w.kv_end, w.partial >= 0);
  }
  std::sort(r.begin(), r.end());
  return r;
}

PlannerConfig config(int32_t group, int32_t tq, int32_t kvt, int32_t ctas, bool causal = false,
                     SplitMode mode = SplitMode::kAuto, int32_t fixed = 0) {
  PlannerConfig c;
  c.group_size = group;
  c.q_tile_rows = tq;
  c.kv_tile_rows = kvt;
  c.num_ctas = ctas;
  c.causal = causal;
  c.split_mode = mode;
  c.fixed_split_size = fixed;
  return c;
}

Plan plan_checked(const std::vector<int32_t>& qo, const std::vector<int32_t>& kv, const PlannerConfig& cfg) {
  Plan p = plan_work(qo, kv, cfg);
  const std::string e = check_plan(qo, kv, cfg, p);
  EXPECT_EQ(e, "") << describe(qo, kv, cfg);
  return p;
}

// ---------------------------------------------------------------------------------------------
// Hand-checked batches.

TEST(Planner, DecodeOneRequestNoSplit) {
  // 4 packed rows, 50 keys: L0 = round_up(ceil(50 / 33), 64) = 64 >= 50, so no split.
  const Plan p = plan_checked({1}, {50}, config(4, 16, 64, 33));
  ASSERT_EQ(p.items.size(), 1u);
  const WorkItem& w = p.items[0];
  EXPECT_EQ(w.request, 0);
  EXPECT_EQ(w.packed_begin, 0);
  EXPECT_EQ(w.kv_begin, 0);
  EXPECT_EQ(w.kv_end, 50);
  EXPECT_EQ(w.partial, -1);
  EXPECT_TRUE(p.merges.empty());
  EXPECT_EQ(p.num_partials, 0);
  EXPECT_EQ(p.chunk_size, 64);
  EXPECT_EQ(p.makespan, 54);
  EXPECT_EQ(p.total_cost, 54);
  EXPECT_EQ(p.lower_bound, 54);  // max(ceil(54 / 33), 4 + 50)
  EXPECT_EQ(p.cta_indptr[0], 0);
  EXPECT_EQ(p.cta_indptr[1], 1);
  EXPECT_EQ(p.cta_indptr[33], 1);
}

TEST(Planner, LongKvSplitsEvenly) {
  // 10000 keys on 8 CTAs: L0 = round_up(1250, 64) = 1280, n = 8, size = round_up(1250, 64) = 1280:
  // seven chunks of 1280 and a last one of 1040, slots 0..7 in KV order, one merge.
  const Plan p = plan_checked({1}, {10000}, config(1, 16, 64, 8));
  ASSERT_EQ(p.items.size(), 8u);
  EXPECT_EQ(p.chunk_size, 1280);
  EXPECT_EQ(p.num_partials, 8);
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(p.cta_indptr[c], c);
    const WorkItem& w = p.items[c];  // CTA c runs chunk c (costs descending, ties in KV order)
    EXPECT_EQ(w.kv_begin, 1280 * c);
    EXPECT_EQ(w.kv_end, std::min(1280 * (c + 1), 10000));
    EXPECT_EQ(w.partial, c);
  }
  ASSERT_EQ(p.merges.size(), 1u);
  EXPECT_EQ(p.merges[0].request, 0);
  EXPECT_EQ(p.merges[0].packed_begin, 0);
  EXPECT_EQ(p.merges[0].partial_begin, 0);
  EXPECT_EQ(p.merges[0].partial_end, 8);
  EXPECT_EQ(p.makespan, 1281);
  EXPECT_EQ(p.lower_bound, 1251);  // ceil(10001 / 8)
  EXPECT_EQ(p.total_cost, 10008);
}

TEST(Planner, MinimumChunkSizeStopsSmallSplits) {
  // 16 requests of 1024 keys on 33 CTAs: L0 = round_up(ceil(16384 / 33), 64) = 512 splits every
  // request in two. With min_chunk_rows = 1024 nothing is split (16 write-through items), and a
  // long request is still cut, into chunks of >= 1024.
  PlannerConfig cfg = config(4, 16, 64, 33);
  const Plan split = plan_checked(std::vector<int32_t>(16, 1), std::vector<int32_t>(16, 1024), cfg);
  EXPECT_EQ(split.chunk_size, 512);
  EXPECT_EQ(split.num_partials, 32);
  cfg.min_chunk_rows = 1000;  // rounded up to 1024
  const Plan whole = plan_checked(std::vector<int32_t>(16, 1), std::vector<int32_t>(16, 1024), cfg);
  EXPECT_EQ(whole.num_partials, 0);
  EXPECT_EQ(whole.items.size(), 16u);
  EXPECT_EQ(whole.chunk_size, 1024);
  const Plan one = plan_checked({1}, {65536}, cfg);
  EXPECT_EQ(one.chunk_size, 2048);  // L0 = round_up(ceil(65536 / 33) = 1986, 64)
  for (const WorkItem& w : one.items) EXPECT_GE(w.kv_end - w.kv_begin, 1024);
}

TEST(Planner, PowerOfTwoSplitIsExact) {
  // 4096 keys, 4 CTAs: four chunks of 1024, one per CTA.
  const Plan p = plan_checked({1}, {4096}, config(1, 16, 64, 4));
  ASSERT_EQ(p.items.size(), 4u);
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(p.items[c].kv_begin, 1024 * c);
    EXPECT_EQ(p.items[c].kv_end, 1024 * (c + 1));
  }
  EXPECT_EQ(p.makespan, 1025);
}

TEST(Planner, CausalClipsEachTile) {
  // qo_len = kv_len = 100, group 1, Tq 16: tile t sees keys [0, min(100, 16 t + 16)).
  for (SplitMode mode : {SplitMode::kNone, SplitMode::kAuto}) {
    PlannerConfig cfg = config(1, 16, 16, 1, true, mode);
    const Plan p = plan_checked({100}, {100}, cfg);
    ASSERT_EQ(p.items.size(), 7u);
    std::vector<int32_t> end_of_tile(7, -1);
    for (const WorkItem& w : p.items) end_of_tile[w.packed_begin / 16] = w.kv_end;
    for (int t = 0; t < 7; ++t) EXPECT_EQ(end_of_tile[t], std::min(100, 16 * t + 16)) << "tile " << t;
  }
  {
    // group 4, qo 10, kv 20: 40 packed rows; tiles end at queries 3, 7, 9 -> kv_end 14, 18, 20.
    const Plan p = plan_checked({10}, {20}, config(4, 16, 16, 1, true, SplitMode::kNone));
    ASSERT_EQ(p.items.size(), 3u);
    std::vector<int32_t> end_of_tile(3, -1);
    for (const WorkItem& w : p.items) end_of_tile[w.packed_begin / 16] = w.kv_end;
    EXPECT_EQ(end_of_tile, (std::vector<int32_t>{14, 18, 20}));
  }
  {
    // More queries than keys: the first tile sees no key (one empty item), later ones 2 and 4.
    const Plan p = plan_checked({10}, {4}, config(1, 4, 16, 2, true, SplitMode::kAuto));
    ASSERT_EQ(p.items.size(), 3u);
    std::vector<std::pair<int32_t, int32_t>> r(3);
    for (const WorkItem& w : p.items) r[w.packed_begin / 4] = {w.kv_begin, w.kv_end};
    EXPECT_EQ(r[0], std::make_pair(0, 0));
    EXPECT_EQ(r[1], std::make_pair(0, 2));
    EXPECT_EQ(r[2], std::make_pair(0, 4));
  }
}

TEST(Planner, RequestGroupedKeepsTilesOfARequestTogether) {
  // W4 constant on the wgmma tile: 16 causal requests of 1024 tokens, group 4, Tq 128, KV tiles of
  // 128, 16 CTAs per KV head. LPT runs one cost level (one tile of every request) at a time; the
  // grouped plan runs request by request, with the same makespan here.
  const std::vector<int32_t> len(16, 1024);
  PlannerConfig cfg = config(4, 128, 128, 16, true);
  cfg.min_chunk_rows = 1024;
  const Plan g = plan_checked(len, len, cfg);
  cfg.group_by_request = false;
  const Plan l = plan_checked(len, len, cfg);
  EXPECT_TRUE(g.grouped_by_request);
  EXPECT_FALSE(l.grouped_by_request);
  EXPECT_EQ(g.makespan, l.makespan);
  EXPECT_EQ(g.makespan, g.lower_bound);
  // The k-th item of every CTA: the grouped plan's come from at most 2 requests, LPT's from all 16.
  auto requests_at = [](const Plan& p, int32_t k) {
    std::set<int32_t> r;
    for (size_t c = 0; c + 1 < p.cta_indptr.size(); ++c) {
      if (p.cta_indptr[c] + k < p.cta_indptr[c + 1]) r.insert(p.items[p.cta_indptr[c] + k].request);
    }
    return r.size();
  };
  for (int32_t k = 0; k < 32; ++k) {
    EXPECT_LE(requests_at(g, k), 2u) << "item " << k;
    EXPECT_EQ(requests_at(l, k), 16u) << "item " << k;
  }
}

TEST(Planner, ExchangesBringShortItemsNearTheBound) {
  // W4 uniform on the wgmma tile (16 causal requests of 553-1009 tokens, group 4, Tq and KV tiles
  // of 128, alpha 3, 33 CTAs): 404 items, a dozen a CTA. The grouped assignment alone ends 2.6%
  // above the lower bound; the exchanges at the ends of the CTAs' lists bring it within 1/256,
  // and the plan keeps its invariants (plan_checked: coverage, order within each CTA, statistics).
  const std::vector<int32_t> len = {906, 942, 553, 777, 1009, 926, 822, 1000, 878, 735, 654, 800, 655, 609, 768, 662};
  PlannerConfig cfg = config(4, 128, 128, 33, true);
  cfg.alpha = 3;
  cfg.min_chunk_rows = 1024;
  const Plan p = plan_checked(len, len, cfg);
  EXPECT_EQ(p.items.size(), 404u);
  EXPECT_TRUE(p.grouped_by_request);
  EXPECT_LE(p.makespan - p.lower_bound, p.lower_bound / 256) << p.makespan << " vs " << p.lower_bound;
  PlannerConfig off = cfg;
  off.exchanges = false;
  const Plan p_off = plan_checked(len, len, off);
  EXPECT_GT(p_off.makespan - p_off.lower_bound, p_off.lower_bound / 64) << "the grouped plan alone is 2.6% above";
  // W5 q128 (32 requests of 128 queries over 4096 keys, 128 items on 33 CTAs): the grouped plan is
  // 3.7% above its bound and exchanges at the lists' ends gain 0.2%, not worth moving tiles out of
  // step with their requests': the plan is the one without exchanges.
  const std::vector<int32_t> qo(32, 128), kv(32, 4096);
  const Plan q = plan_checked(qo, kv, cfg);
  EXPECT_TRUE(same_plan(q, plan_checked(qo, kv, off)));
  EXPECT_GT(q.makespan - q.lower_bound, q.lower_bound / 32) << q.makespan << " vs " << q.lower_bound;
}

TEST(Planner, KvGroupsKeepTheBlockRowsOfARequestTogether) {
  // Block-sparse KV over a paged cache: 8 requests of 32 causal block rows of 128 queries (group 4,
  // Tq 128: 4 tiles each), block row j listing j + 1 blocks of 128 keys, 33 CTAs. Grouped by block
  // row, the heaviest rows of all 8 requests run first (all 8 requests' KV live at once); with
  // kv_group naming each row's request, a CTA's k-th item comes from few requests.
  std::vector<int32_t> qo, kv, group;
  for (int32_t b = 0; b < 8; ++b) {
    for (int32_t j = 0; j < 32; ++j) {
      qo.push_back(128);
      kv.push_back((j + 1) * 128);
      group.push_back(b);
    }
  }
  PlannerConfig cfg = config(4, 128, 128, 33, false, SplitMode::kNone);
  const Plan rows = plan_checked(qo, kv, cfg);
  cfg.kv_group = group.data();
  const Plan requests = plan_checked(qo, kv, cfg);
  EXPECT_TRUE(requests.grouped_by_request);
  auto requests_at = [&](const Plan& p, int32_t k) {
    std::set<int32_t> r;
    for (size_t c = 0; c + 1 < p.cta_indptr.size(); ++c) {
      if (p.cta_indptr[c] + k < p.cta_indptr[c + 1]) r.insert(group[p.items[p.cta_indptr[c] + k].request]);
    }
    return r.size();
  };
  EXPECT_EQ(requests_at(rows, 0), 8u);
  for (int32_t k = 0; k < 8; ++k) EXPECT_LE(requests_at(requests, k), 2u) << "item " << k;
  // A group outside [0, B) is a named error.
  group[5] = 9999;
  EXPECT_THROW(plan_work(qo, kv, cfg), tessera::Error);
}

TEST(Planner, RequestGroupedYieldsToLptWhenItPacksWorse) {
  // Tq 1, causal, alpha 0: request 0 (3 x 3) has tiles costing 1, 2, 3, request 1 one tile of 5.
  // By request on 2 CTAs: 3, 2, 1 then 5 -> makespan 8; LPT: 5, 3, 2, 1 -> 6. LPT is kept.
  PlannerConfig cfg = config(1, 1, 1, 2, true, SplitMode::kNone);
  cfg.alpha = 0;
  const Plan p = plan_checked({3, 1}, {3, 5}, cfg);
  EXPECT_FALSE(p.grouped_by_request);
  EXPECT_EQ(p.makespan, 6);
}

TEST(Planner, EmptyQueriesProduceNothing) {
  const Plan p = plan_checked({0, 1, 0}, {50, 50, 0}, config(1, 16, 64, 4));
  ASSERT_EQ(p.items.size(), 1u);
  EXPECT_EQ(p.items[0].request, 1);
  const Plan q = plan_checked({0, 0}, {100, 0}, config(8, 128, 64, 5));
  EXPECT_TRUE(q.items.empty());
  EXPECT_TRUE(q.merges.empty());
  EXPECT_EQ(q.cta_indptr, std::vector<int32_t>(6, 0));
  EXPECT_EQ(q.makespan, 0);
  EXPECT_EQ(q.lower_bound, 0);
  const Plan e = plan_checked({}, {}, config(1, 16, 64, 3));
  EXPECT_TRUE(e.items.empty());
  EXPECT_EQ(e.cta_indptr.size(), 4u);
}

TEST(Planner, EmptyKvGivesOneEmptyWriteThroughItem) {
  for (SplitMode mode : {SplitMode::kAuto, SplitMode::kFixed, SplitMode::kNone}) {
    PlannerConfig cfg = config(1, 16, 64, 4, false, mode, 64);
    cfg.alpha = 3;
    const Plan p = plan_checked({3}, {0}, cfg);
    ASSERT_EQ(p.items.size(), 1u);
    EXPECT_EQ(p.items[0].kv_begin, 0);
    EXPECT_EQ(p.items[0].kv_end, 0);
    EXPECT_EQ(p.items[0].partial, -1);
    EXPECT_EQ(p.makespan, 9);  // alpha * 3 rows
  }
}

TEST(Planner, NoneNeverSplits) {
  const Plan p = plan_checked({1, 1000, 3}, {100000, 1000, 7}, config(4, 64, 64, 132, true, SplitMode::kNone));
  EXPECT_EQ(p.num_partials, 0);
  EXPECT_TRUE(p.merges.empty());
  EXPECT_EQ(p.chunk_size, 0);
  EXPECT_EQ(p.items.size(), 1u + 63u + 1u);  // ceil(4 / 64) + ceil(4000 / 64) + ceil(12 / 64)
  for (const WorkItem& w : p.items) {
    EXPECT_EQ(w.kv_begin, 0);
    EXPECT_EQ(w.partial, -1);
  }
}

TEST(Planner, FixedBoundariesAtMultiplesOfS) {
  const Plan p = plan_checked({1, 1, 1}, {1000, 300, 256}, config(1, 16, 64, 3, false, SplitMode::kFixed, 256));
  EXPECT_EQ(p.chunk_size, 256);
  EXPECT_EQ(p.num_partials, 6);
  std::vector<std::tuple<int32_t, int32_t, int32_t, int32_t>> got;
  for (const WorkItem& w : p.items) got.emplace_back(w.request, w.kv_begin, w.kv_end, w.partial);
  std::sort(got.begin(), got.end());
  const std::vector<std::tuple<int32_t, int32_t, int32_t, int32_t>> want = {
      {0, 0, 256, 0}, {0, 256, 512, 1}, {0, 512, 768, 2}, {0, 768, 1000, 3},
      {1, 0, 256, 4}, {1, 256, 300, 5}, {2, 0, 256, -1}};
  EXPECT_EQ(got, want);
  ASSERT_EQ(p.merges.size(), 2u);
  EXPECT_EQ(std::make_tuple(p.merges[0].request, p.merges[0].partial_begin, p.merges[0].partial_end),
            std::make_tuple(0, 0, 4));
  EXPECT_EQ(std::make_tuple(p.merges[1].request, p.merges[1].partial_begin, p.merges[1].partial_end),
            std::make_tuple(1, 4, 6));
}

TEST(Planner, FixedOverMaxPartialsFails) {
  PlannerConfig cfg = config(1, 16, 64, 3, false, SplitMode::kFixed, 256);
  cfg.max_partials = 5;
  const Plan p = plan_work({1, 1, 1}, {1000, 300, 256}, cfg);
  EXPECT_FALSE(p.ok);
  EXPECT_NE(std::string(p.error).find("max_partials"), std::string::npos) << p.error;
  cfg.max_partials = 6;
  EXPECT_TRUE(plan_work({1, 1, 1}, {1000, 300, 256}, cfg).ok);
}

TEST(Planner, AutoRespectsMaxPartials) {
  PlannerConfig cfg = config(1, 16, 64, 8);
  // L0 needs 8 slots, and every split needs at least 2: with 1 allowed nothing splits, and
  // chunk_size is the L that splits nothing.
  cfg.max_partials = 1;
  const Plan p = plan_checked({1}, {10000}, cfg);
  ASSERT_EQ(p.items.size(), 1u);
  EXPECT_EQ(p.num_partials, 0);
  EXPECT_EQ(p.chunk_size, 10048);  // round_up(10000, 64)
  // With 7 allowed, no halving candidate fits (L0 needs 8, smaller L more), so the no-split plan is
  // the starting point and the fill fallback cuts the tile into at most 7 chunks.
  cfg.max_partials = 7;
  const Plan f = plan_checked({1}, {10000}, cfg);
  EXPECT_LE(f.num_partials, 7);
  EXPECT_GE(f.items.size(), 2u);
  EXPECT_LT(f.makespan, 10001);
  // A limit the best plan meets changes nothing; a limit of one slot forbids every split.
  PlannerConfig c2 = config(1, 16, 64, 4);
  const std::vector<int32_t> qo(5, 1), kv = {4096, 64, 64, 64, 64};
  const Plan unlimited = plan_checked(qo, kv, c2);
  EXPECT_GT(unlimited.num_partials, 0);
  c2.max_partials = unlimited.num_partials;
  const Plan same = plan_checked(qo, kv, c2);
  EXPECT_TRUE(same_plan(unlimited, same));
  c2.max_partials = 1;
  const Plan none = plan_checked(qo, kv, c2);
  EXPECT_EQ(none.num_partials, 0);
}

TEST(Planner, FillFallbackWhenUniformChunksPackBadly) {
  // 215 equal tiles (16 rows, 473 keys, cost 489) on 132 CTAs: lower_bound = ceil(105135 / 132) =
  // 797. No uniform chunk size packs well: unsplit, 83 CTAs run two tiles (978); L = 256, 128, 64
  // give LPT makespans 971, 930, 1003. The fill plan cuts tiles at different points per CTA.
  const PlannerConfig cfg = config(1, 16, 64, 132);
  const Plan p = plan_checked({215 * 16}, {473}, cfg);
  EXPECT_EQ(p.lower_bound, 797);
  EXPECT_LE(p.makespan * 10, p.lower_bound * 11) << p.makespan;
  EXPECT_LE(p.num_partials, 2 * cfg.num_ctas);
  // Five long decode requests on 33 CTAs.
  const Plan d = plan_checked({1, 1, 1, 1, 1}, {2600, 2500, 2700, 2550, 2650}, config(4, 16, 32, 33));
  EXPECT_LE(d.makespan * 10, d.lower_bound * 11) << d.makespan << " vs " << d.lower_bound;
}

TEST(Planner, BoundCanBeUnattainable) {
  // One decode request (4 packed rows) with 38272 = 299 * 128 keys on 33 CTAs, KV tile 128. Chunk
  // boundaries are multiples of 128, so some CTA runs >= ceil(299 / 33) = 10 KV tiles: every plan
  // has makespan >= 4 + 1280 = 1284, while lower_bound = ceil(38276 / 33) = 1160 (ratio 1.107),
  // although the unsplit cost 38276 is >= 8 * 33 * (16 + 128) = 38016. The planner finds 1284.
  const PlannerConfig cfg = config(4, 16, 128, 33);
  const Plan p = plan_checked({1}, {38272}, cfg);
  EXPECT_EQ(p.lower_bound, 1160);
  EXPECT_EQ(p.makespan, 1284);
  EXPECT_GE(38276, 8 * 33 * (16 + 128));
}

// ---------------------------------------------------------------------------------------------
// Random batches.

int32_t draw_length(std::mt19937_64& rng, int dist, int32_t max_len, int32_t equal_value) {
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  switch (dist) {
    case 0:  // uniform
      return std::uniform_int_distribution<int32_t>(0, max_len)(rng);
    case 1:  // log-uniform
      return std::min<int32_t>(max_len, static_cast<int32_t>(std::exp(u01(rng) * std::log(max_len + 1.0)) - 1.0));
    case 2:  // mostly short, a few long
      if (u01(rng) < 0.9) return std::uniform_int_distribution<int32_t>(0, std::min(max_len, 256))(rng);
      return std::uniform_int_distribution<int32_t>(max_len / 2, max_len)(rng);
    default:  // all equal
      return equal_value;
  }
}

struct BalanceStats {
  int64_t auto_batches = 0, auto_within = 0;  // every kAuto batch with unlimited max_partials
  int64_t large_batches = 0, large_within = 0, large_within_unit = 0;  // unsplit cost >= 8 units per CTA
  int64_t larger_batches = 0, larger_within = 0;                      // unsplit cost >= 10 units per CTA
  double worst_large = 1.0, worst_larger = 1.0, worst_any = 1.0;
};

TEST(Planner, RandomBatches) {
  std::mt19937_64 rng(0x7e55e7a);
  constexpr int kBatches = 3000;
  constexpr int64_t kTileBudget = int64_t{1} << 15;  // keeps prefill batches testable in seconds
  constexpr int32_t kMaxLen = 131072;
  const int32_t groups[] = {1, 4, 5, 8};
  const int32_t q_tiles[] = {16, 64, 128, 192};
  const int32_t kv_tiles[] = {32, 64, 128};
  const int32_t ctas[] = {1, 7, 33, 132, 264};
  const int64_t alphas[] = {1, 1, 1, 0, 2, 8};
  const int64_t betas[] = {1, 1, 1, 2};
  BalanceStats st;
  int64_t fixed_failed = 0, invariance_checks = 0, grouped_plans = 0;
  auto pick = [&](const auto& arr) {
    return arr[std::uniform_int_distribution<size_t>(0, std::size(arr) - 1)(rng)];
  };
  for (int iter = 0; iter < kBatches; ++iter) {
    PlannerConfig cfg;
    cfg.group_size = pick(groups);
    cfg.q_tile_rows = pick(q_tiles);
    cfg.kv_tile_rows = pick(kv_tiles);
    cfg.num_ctas = pick(ctas);
    cfg.causal = rng() % 2 == 0;
    cfg.split_mode = static_cast<SplitMode>(rng() % 3);
    const int32_t multiples[] = {1, 2, 4, 16, 64, static_cast<int32_t>(1 + rng() % 256)};
    cfg.fixed_split_size = cfg.kv_tile_rows * pick(multiples);
    cfg.alpha = pick(alphas);
    cfg.beta = pick(betas);
    const bool limited = rng() % 10 == 0;
    if (limited) cfg.max_partials = static_cast<int32_t>(rng() % 64);
    cfg.group_by_request = rng() % 4 != 0;

    const int32_t want_b = rng() % 4 == 0 ? static_cast<int32_t>(1 + rng() % 8)
                                          : std::uniform_int_distribution<int32_t>(1, 512)(rng);
    const bool decode = rng() % 2 == 0;
    const int kv_dist = static_cast<int>(rng() % 4);
    const int qo_dist = static_cast<int>(rng() % 4);
    const bool qo_within_kv = rng() % 2 == 0;
    const int32_t max_len = rng() % 4 == 0 ? static_cast<int32_t>(1 + rng() % 4096) : kMaxLen;
    const int32_t kv_equal = draw_length(rng, 1, max_len, 0);
    const int32_t qo_equal = draw_length(rng, 1, max_len, 0);
    std::vector<int32_t> qo, kv;
    int64_t tiles = 0;
    for (int32_t b = 0; b < want_b; ++b) {
      const int32_t k = draw_length(rng, kv_dist, max_len, kv_equal);
      int32_t q = decode ? 1 : draw_length(rng, qo_dist, max_len, qo_equal);
      if (!decode && qo_within_kv) q = std::min(q, k);
      const int64_t t = (int64_t{q} * cfg.group_size + cfg.q_tile_rows - 1) / cfg.q_tile_rows;
      if (b > 0 && tiles + t > kTileBudget) break;
      tiles += t;
      qo.push_back(q);
      kv.push_back(k);
    }

    if (cfg.split_mode == SplitMode::kFixed) {
      // A small fixed split on a long batch means millions of items: grow S (keeping it a multiple
      // of kv_tile_rows) until the plan has at most 2^18, so the test stays fast.
      const RefTiles rt = ref_tiles(qo, kv, cfg);
      for (;;) {
        int64_t items = 0;
        for (const RefTile& t : rt.tiles) items += std::max<int64_t>(1, (t.kv_end + cfg.fixed_split_size - 1) / cfg.fixed_split_size);
        if (items <= (int64_t{1} << 18) || cfg.fixed_split_size > INT32_MAX / 2) break;
        cfg.fixed_split_size *= 2;
      }
    }

    const Plan p = plan_work(qo, kv, cfg);
    const std::string what = describe(qo, kv, cfg) + " (batch " + std::to_string(iter) + ")";
    // (d) determinism.
    ASSERT_TRUE(same_plan(p, plan_work(qo, kv, cfg))) << what;
    if (!p.ok) {
      ASSERT_EQ(cfg.split_mode, SplitMode::kFixed) << what;
      ASSERT_TRUE(limited) << what;
      ++fixed_failed;
      continue;
    }
    // (a), (b), (c).
    ASSERT_EQ(check_plan(qo, kv, cfg, p), "") << what;
    grouped_plans += p.grouped_by_request;
    if (limited) {
      ASSERT_LE(p.num_partials, cfg.max_partials) << what;
    }

    // LPT guarantee: the last item on the busiest CTA started no later than the average.
    int64_t largest = 0;
    {
      const RefTiles rt = ref_tiles(qo, kv, cfg);
      for (const WorkItem& w : p.items) {
        const RefTile& t = rt.tiles[rt.first[w.request] + w.packed_begin / cfg.q_tile_rows];
        largest = std::max(largest, cfg.alpha * t.rows + cfg.beta * (int64_t{w.kv_end} - w.kv_begin));
      }
    }
    ASSERT_LE(p.makespan, (p.total_cost + cfg.num_ctas - 1) / cfg.num_ctas + largest) << what;

    // (e) balance. lower_bound ignores two things no planner can avoid: the alpha * rows every extra
    // chunk pays, and that chunk boundaries are multiples of kv_tile_rows, so a CTA's load moves in
    // steps of beta * kv_tile_rows. With the average load only ~8 such units (the threshold below)
    // one step can be more than 10%: see BoundCanBeUnattainable for a batch where every plan is
    // 10.7% above the bound. So above 8 units the plan must be within 10% or within one unit
    // (alpha * Tq + beta * kv_tile) of the bound, and above 10 units strictly within 10%; the
    // strict 10% figures for the 8-unit class are printed.
    if (cfg.split_mode == SplitMode::kAuto && !limited && !p.items.empty()) {
      const int64_t u = unsplit_cost(ref_tiles(qo, kv, cfg), cfg);
      const int64_t unit = cfg.alpha * cfg.q_tile_rows + cfg.beta * cfg.kv_tile_rows;
      const double ratio = static_cast<double>(p.makespan) / static_cast<double>(p.lower_bound);
      const bool within = p.makespan * 10 <= p.lower_bound * 11;
      ++st.auto_batches;
      st.auto_within += within;
      st.worst_any = std::max(st.worst_any, ratio);
      const std::string detail = "makespan " + std::to_string(p.makespan) + " lower_bound " +
                                 std::to_string(p.lower_bound) + " ratio " + std::to_string(ratio) + " chunk_size " +
                                 std::to_string(p.chunk_size) + " items " + std::to_string(p.items.size()) + ": " + what;
      if (u >= int64_t{8} * cfg.num_ctas * unit) {
        ++st.large_batches;
        st.large_within += within;
        st.large_within_unit += within || p.makespan <= p.lower_bound + unit;
        st.worst_large = std::max(st.worst_large, ratio);
        EXPECT_TRUE(within || p.makespan <= p.lower_bound + unit) << detail;
      }
      if (u >= int64_t{10} * cfg.num_ctas * unit) {
        ++st.larger_batches;
        st.larger_within += within;
        st.worst_larger = std::max(st.worst_larger, ratio);
        EXPECT_TRUE(within) << detail;
      }
    }

    // (f) kFixed batch invariance: a request planned alone gets the same items.
    if (cfg.split_mode == SplitMode::kFixed && !limited) {
      for (int k = 0; k < 3; ++k) {
        const int32_t r = static_cast<int32_t>(rng() % qo.size());
        const Plan alone = plan_work({qo[r]}, {kv[r]}, cfg);
        ASSERT_TRUE(alone.ok);
        ASSERT_EQ(request_items(alone, 0), request_items(p, r)) << "request " << r << ": " << what;
        ++invariance_checks;
      }
      // And with the batch reversed.
      std::vector<int32_t> rq(qo.rbegin(), qo.rend()), rk(kv.rbegin(), kv.rend());
      const Plan rev = plan_work(rq, rk, cfg);
      const int32_t r = static_cast<int32_t>(rng() % qo.size());
      ASSERT_EQ(request_items(rev, static_cast<int32_t>(qo.size()) - 1 - r), request_items(p, r)) << what;
    }
  }
  std::cout << "[planner] kAuto batches (unlimited max_partials): " << st.auto_batches << ", within 10% of the "
            << "lower bound: " << st.auto_within << ", worst makespan / lower_bound: " << st.worst_any << "\n"
            << "[planner] of those with unsplit cost >= 8 * num_ctas * (alpha * Tq + beta * kv_tile): "
            << st.large_batches << ", within 10%: " << st.large_within << ", within 10% or one unit: "
            << st.large_within_unit << ", worst ratio: " << st.worst_large << "\n"
            << "[planner] of those with unsplit cost >= 10 * num_ctas * (alpha * Tq + beta * kv_tile): "
            << st.larger_batches << ", within 10%: " << st.larger_within << ", worst ratio: " << st.worst_larger << "\n"
            << "[planner] kFixed plans over max_partials (ok = false): " << fixed_failed
            << ", kFixed invariance checks: " << invariance_checks << "\n"
            << "[planner] plans assigned request by request: " << grouped_plans << std::endl;
}

// ---------------------------------------------------------------------------------------------
// Malformed configs.

::testing::AssertionResult Rejects(const std::vector<int32_t>& qo, const std::vector<int32_t>& kv,
                                   const PlannerConfig& cfg, const std::vector<std::string>& parts) {
  try {
    plan_work(qo, kv, cfg);
  } catch (const Error& e) {
    const std::string m = e.what();
    if (e.code() != StatusCode::kInvalidArgument) {
      return ::testing::AssertionFailure() << "code " << static_cast<int>(e.code()) << ": " << m;
    }
    for (const std::string& part : parts) {
      if (m.find(part) == std::string::npos) {
        return ::testing::AssertionFailure() << "message \"" << m << "\" lacks \"" << part << "\"";
      }
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no error";
}

TEST(Planner, RejectsMalformedConfigs) {
  const std::vector<int32_t> qo = {1, 2}, kv = {10, 20};
  PlannerConfig c;
  c = config(1, 16, 64, 0);
  EXPECT_TRUE(Rejects(qo, kv, c, {"config.num_ctas = 0", ">= 1"}));
  c = config(0, 16, 64, 4);
  EXPECT_TRUE(Rejects(qo, kv, c, {"config.group_size = 0", ">= 1"}));
  c = config(1, 0, 64, 4);
  EXPECT_TRUE(Rejects(qo, kv, c, {"config.q_tile_rows = 0"}));
  c = config(1, 16, -64, 4);
  EXPECT_TRUE(Rejects(qo, kv, c, {"config.kv_tile_rows = -64"}));
  c = config(1, 16, 64, 4);
  c.beta = 0;
  EXPECT_TRUE(Rejects(qo, kv, c, {"config.beta = 0", ">= 1"}));
  c = config(1, 16, 64, 4);
  c.alpha = -1;
  EXPECT_TRUE(Rejects(qo, kv, c, {"config.alpha = -1", ">= 0"}));
  c = config(1, 16, 64, 4);
  c.max_partials = -2;
  EXPECT_TRUE(Rejects(qo, kv, c, {"config.max_partials = -2"}));
  for (int32_t s : {0, -64, 96, 32}) {
    c = config(1, 16, 64, 4, false, SplitMode::kFixed, s);
    EXPECT_TRUE(Rejects(qo, kv, c, {"config.fixed_split_size = " + std::to_string(s), "multiple"}));
  }
  // fixed_split_size is ignored outside kFixed.
  c = config(1, 16, 64, 4, false, SplitMode::kAuto, 96);
  EXPECT_NO_THROW(plan_work(qo, kv, c));
  c = config(1, 16, 64, 4);
  EXPECT_TRUE(Rejects({1, 2, 3}, kv, c, {"qo_len.size() = 3", "kv_len.size() = 2"}));
  EXPECT_TRUE(Rejects({1, 2, 3, 4}, {1, 1, 1, -1}, c, {"kv_len[3] = -1", "expected >= 0"}));
  EXPECT_TRUE(Rejects({1, -5}, {1, 1}, c, {"qo_len[1] = -5", "expected >= 0"}));
  c = config(8, 16, 64, 4);
  EXPECT_TRUE(Rejects({1, INT32_MAX / 4}, {1, 1}, c, {"qo_len[1]", "config.group_size", "packed rows"}));
  c = config(1, 16, 64, 4);
  c.alpha = INT64_MAX / 2;
  EXPECT_TRUE(Rejects({100}, {100}, c, {"config.alpha", "overflows"}));
  c = config(1, 16, 64, 4);
  c.split_mode = static_cast<SplitMode>(7);
  EXPECT_TRUE(Rejects(qo, kv, c, {"config.split_mode = 7"}));
}

// ---------------------------------------------------------------------------------------------
// Timing of the hot-path cases (printed only: CI machines vary).

double mean_plan_us(const std::vector<int32_t>& qo, const std::vector<int32_t>& kv, const PlannerConfig& cfg,
                    Plan* out) {
  for (int i = 0; i < 50; ++i) *out = plan_work(qo, kv, cfg);
  constexpr int kCalls = 1000;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t sink = 0;
  for (int i = 0; i < kCalls; ++i) sink += plan_work(qo, kv, cfg).makespan;
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_GT(sink, 0);
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / kCalls;
}

TEST(Planner, Timing) {
  std::mt19937_64 rng(42);
  {
    // 128 decode requests, KV lengths log-uniform in [16, 32768].
    std::vector<int32_t> qo(128, 1), kv(128);
    std::uniform_real_distribution<double> u(std::log(16.0), std::log(32768.0));
    for (auto& k : kv) k = static_cast<int32_t>(std::exp(u(rng)));
    PlannerConfig cfg = config(4, 16, 64, 33);
    Plan p;
    const double us = mean_plan_us(qo, kv, cfg, &p);
    std::cout << "[planner] decode, 128 requests, group 4, Tq 16, 33 CTAs: " << us << " us per plan ("
              << p.items.size() << " items, chunk_size " << p.chunk_size << ", makespan / lower_bound "
              << static_cast<double>(p.makespan) / p.lower_bound << ")" << std::endl;
  }
  {
    // 16 causal prefill requests of ~1000 tokens.
    std::vector<int32_t> qo(16), kv(16);
    for (int b = 0; b < 16; ++b) qo[b] = kv[b] = std::uniform_int_distribution<int32_t>(900, 1100)(rng);
    PlannerConfig cfg = config(4, 128, 64, 33, true);
    Plan p;
    const double us = mean_plan_us(qo, kv, cfg, &p);
    std::cout << "[planner] prefill, 16 x ~1000 tokens, causal, group 4, Tq 128, 33 CTAs: " << us << " us per plan ("
              << p.items.size() << " items, chunk_size " << p.chunk_size << ", makespan / lower_bound "
              << static_cast<double>(p.makespan) / p.lower_bound << ")" << std::endl;
  }
}

}  // namespace
}  // namespace runtime
}  // namespace tessera
