// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: ring layouts of the gap-filling HDP planner (planner.hpp) and their price. Given where
// the rings of a group run (a ring_layout: each ring's ranks and the order the rings run in), place_shorts
// puts the short sequences around them (into the gaps the rings leave, else LPT after every ring), and
// evaluate_layout packs their rows and prices the result exactly as balance::simulate prices the emitted
// plan. The search over layouts is ring_search.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../core/sort.hpp"
#include "../seq/hdp.hpp"
#include "hdp_common.hpp"
#include "model.hpp"
#include "solvers.hpp"

namespace hetmesh::balance::detail {

/// Where a group's rings run: per ring (an index into the planner's rings) its ranks in the group,
/// sorted, and its modelled per-rank time on them; `order`: the ring indices in the order they run on
/// every rank (the same order on all ranks, which keeps the plan deadlock-free).
struct ring_layout {
  std::vector<std::vector<int>> ranks;  ///< per ring: ranks in the group, sorted
  std::vector<cost::fixed> time;        ///< per ring: hdp_item_time on those ranks
  std::vector<std::size_t> order;       ///< ring indices in execution order
  std::vector<int> min_degree;          ///< per ring: the fewest ranks it may use (memory: D(s))
  std::vector<int> max_degree;          ///< per ring: the most (the group, s / 2)
};

/// A group's short sequences, priced once: `cost` is the LPT price (placement_fixed: the work plus the
/// share l / C of the per-row constant), `order` is by (-cost, id), `row_constant` the constant c.
struct short_set {
  std::span<const seq::seq_desc> seqs;
  std::vector<std::int64_t> cost;
  std::vector<std::size_t> order;
  std::int64_t row_constant = 0;
};

/// A gap: ring member `rank` is free `room` ticks before ring `ring` starts; `tokens` of short sequences
/// fill it so far.
struct ring_gap {
  int rank;
  std::size_t ring;
  std::int64_t room;
  std::int64_t tokens;
};

/// Where the short sequences go around a ring layout: per gap the shorts run before its ring, per rank
/// the shorts run after every ring (indices into short_set::seqs).
struct short_fill {
  std::vector<ring_gap> gaps;
  std::vector<std::vector<std::size_t>> in_gap;
  std::vector<std::vector<std::size_t>> on;
};

/// Prices the short sequences of a group. O(n log n).
HETMESH_COMPILED short_set price_shorts(std::span<const seq::seq_desc> shorts, std::int64_t capacity,
                                        const step_model& m)
#if HETMESH_BODIES
{
  short_set ss;
  ss.seqs = shorts;
  ss.cost.resize(shorts.size());
  ss.row_constant = cost::fixed::from_units(m.llm.scale() * m.llm.layer.c).ticks;
  for (std::size_t i = 0; i < shorts.size(); ++i)
    ss.cost[i] = m.llm.placement_fixed(shorts[i].length, capacity).ticks;
  ss.order.resize(shorts.size());
  for (std::size_t i = 0; i < ss.order.size(); ++i) ss.order[i] = i;
  hetmesh::indirect_sort(ss.order.begin(), ss.order.end(), [&](std::size_t a, std::size_t b) {
    return ss.cost[a] != ss.cost[b] ? ss.cost[a] > ss.cost[b] : shorts[a].id < shorts[b].id;
  });
  return ss;
}
#else
    ;
#endif

/// Per-rank finish of the rings alone (the first `first` in order), each a task of time / `pp` starting
/// when its last member is free; with `gaps`, records every member free before its ring starts.
/// O(sum of ring sizes + pool).
HETMESH_COMPILED std::vector<std::int64_t> replay_rings(const ring_layout& lay, int pool, int pp,
                                                        std::vector<ring_gap>* gaps = nullptr,
                                                        std::size_t first = static_cast<std::size_t>(-1));

/// Short sequences by (-cost, id) around `lay`: into the tightest gap before a ring that still holds them
/// (their rows run there, so the ring starts no later), else onto the rank that finishes first (LPT on
/// modelled time, after every ring). A sequence is charged its share l / C of the per-row constant, not
/// all of it: rows are nearly full after best-fit, so c is shared by their members; a gap keeps one
/// whole constant in reserve for each row it may need. O(n log n + pool).
HETMESH_COMPILED short_fill place_shorts(const ring_layout& lay, const short_set& ss, int pool,
                                         std::int64_t capacity)
#if HETMESH_BODIES
{
  short_fill out;
  const std::vector<std::int64_t> fin = replay_rings(lay, pool, 1, &out.gaps);
  auto& gaps = out.gaps;
  // Open gaps by (room left after reserving the constants of the rows they may need, gap index).
  const auto usable = [&](const ring_gap& g) { return g.room - (g.tokens / capacity + 1) * ss.row_constant; };
  std::set<std::pair<std::int64_t, std::size_t>> open;
  for (std::size_t k = 0; k < gaps.size(); ++k)
    if (usable(gaps[k]) > 0) open.emplace(usable(gaps[k]), k);
  out.in_gap.resize(gaps.size());
  out.on.resize(static_cast<std::size_t>(pool));
  // Least-loaded rank: a min-heap of (finish, rank), the same choice as load_set::least(1).
  using entry = std::pair<std::int64_t, int>;
  std::vector<entry> heap;
  heap.reserve(fin.size());
  for (int r = 0; r < pool; ++r) heap.emplace_back(fin[static_cast<std::size_t>(r)], r);
  std::priority_queue<entry, std::vector<entry>, std::greater<>> least(std::greater<>{}, std::move(heap));
  for (std::size_t i : ss.order) {
    const std::int64_t c = ss.cost[i];
    const std::int64_t len = ss.seqs[i].length;
    auto it = open.lower_bound({c, 0});
    // The sequence may open one more row in the gap: that row's constant must fit too.
    while (it != open.end() &&
           gaps[it->second].room - c - ((gaps[it->second].tokens + len) / capacity + 1) * ss.row_constant < 0)
      ++it;
    if (it != open.end()) {
      const std::size_t k = it->second;
      open.erase(it);
      gaps[k].room -= c;
      gaps[k].tokens += len;
      out.in_gap[k].push_back(i);
      if (usable(gaps[k]) > 0) open.emplace(usable(gaps[k]), k);
      continue;
    }
    auto [f, r] = least.top();
    least.pop();
    least.emplace(f + c, r);
    out.on[static_cast<std::size_t>(r)].push_back(i);
  }
  return out;
}
#else
    ;
#endif

/// The rows of `idx` (indices into `shorts`): sorted by (-length, id), packed by best-fit decreasing on
/// tokens into rows of `capacity`; each row's members in that order. O(k log k).
HETMESH_COMPILED std::vector<std::vector<std::size_t>> pack_rows(std::span<const std::size_t> idx,
                                                                 std::span<const seq::seq_desc> shorts,
                                                                 std::int64_t capacity)
#if HETMESH_BODIES
{
  if (idx.empty()) return {};
  if (idx.size() == 1) return {{idx[0]}};
  std::vector<std::size_t> sorted(idx.begin(), idx.end());
  hetmesh::indirect_sort(sorted.begin(), sorted.end(), [&](std::size_t a, std::size_t b) {
    return seq::longer_first(shorts[a], shorts[b]);
  });
  std::vector<std::int64_t> lens;
  lens.reserve(sorted.size());
  for (std::size_t i : sorted) lens.push_back(shorts[i].length);
  const assignment bins = best_fit_decreasing(lens, capacity);
  std::vector<std::vector<std::size_t>> rows(static_cast<std::size_t>(bins.bins()));
  for (std::size_t k = 0; k < sorted.size(); ++k)
    rows[static_cast<std::size_t>(bins.bin_of[k])].push_back(sorted[k]);
  return rows;
}
#else
    ;
#endif

/// A ring layout evaluated: where the short sequences go, their rows (per gap and per rank, as
/// pack_rows makes them; the plan is emitted from these), each rank's modelled finish and the step.
struct layout_eval {
  short_fill fill;
  std::vector<std::vector<std::vector<std::size_t>>> gap_rows;   ///< per gap: its rows
  std::vector<std::vector<std::vector<std::size_t>>> rank_rows;  ///< per rank: rows after every ring
  std::vector<std::int64_t> finish;                              ///< per rank, ticks
  cost::fixed step{};                                            ///< the last finish
};

/// Places the short sequences around `lay` (place_shorts), packs them into rows and prices the group's
/// plan as balance::simulate prices the emitted plan: gap rows before their ring, the rings in order,
/// every rank's remaining rows last; pipeline shares and bubbles as there. O(n log n + sum of ring
/// sizes + pool).
HETMESH_COMPILED layout_eval evaluate_layout(const ring_layout& lay, const short_set& ss, int pool,
                                             std::int64_t capacity, const step_model& m)
#if HETMESH_BODIES
{
  layout_eval ev;
  ev.fill = place_shorts(lay, ss, pool, capacity);
  const int pp = m.pp_stages;
  const auto n = static_cast<std::size_t>(pool);
  auto& finish = ev.finish;
  finish.assign(n, 0);
  std::vector<std::int64_t> longest(n, 0);
  std::vector<char> any(n, 0);
  std::vector<std::int64_t> docs;
  const auto run_rows = [&](int r, const std::vector<std::vector<std::size_t>>& rows) {
    const auto u = static_cast<std::size_t>(r);
    for (const auto& row : rows) {
      docs.clear();
      for (std::size_t i : row) docs.push_back(ss.seqs[i].length);
      const std::int64_t t = m.pack_time(docs).ticks;
      finish[u] += t / pp;
      longest[u] = std::max(longest[u], t);
      any[u] = 1;
    }
  };
  const auto& gaps = ev.fill.gaps;
  ev.gap_rows.resize(gaps.size());
  std::vector<std::vector<std::size_t>> gaps_of(lay.ranks.size());
  for (std::size_t k = 0; k < gaps.size(); ++k) gaps_of[gaps[k].ring].push_back(k);
  for (std::size_t j : lay.order) {
    for (std::size_t k : gaps_of[j]) {
      ev.gap_rows[k] = pack_rows(ev.fill.in_gap[k], ss.seqs, capacity);
      run_rows(gaps[k].rank, ev.gap_rows[k]);
    }
    std::int64_t start = 0;
    for (int r : lay.ranks[j]) start = std::max(start, finish[static_cast<std::size_t>(r)]);
    for (int r : lay.ranks[j]) {
      const auto u = static_cast<std::size_t>(r);
      finish[u] = start + lay.time[j].ticks / pp;
      longest[u] = std::max(longest[u], lay.time[j].ticks);
      any[u] = 1;
    }
  }
  ev.rank_rows.resize(n);
  std::int64_t step = 0;
  for (std::size_t r = 0; r < n; ++r) {
    ev.rank_rows[r] = pack_rows(ev.fill.on[r], ss.seqs, capacity);
    run_rows(static_cast<int>(r), ev.rank_rows[r]);
    if (pp > 1 && any[r]) finish[r] += longest[r] * (pp - 1) / pp;
    step = std::max(step, finish[r]);
  }
  ev.step = cost::fixed::from_ticks(step);
  return ev;
}
#else
    ;
#endif

}  // namespace hetmesh::balance::detail

#if HETMESH_BODIES

namespace hetmesh::balance::detail {

HETMESH_COMPILED std::vector<std::int64_t> replay_rings(const ring_layout& lay, int pool, int pp,
                                                        std::vector<ring_gap>* gaps, std::size_t first) {
  std::vector<std::int64_t> fin(static_cast<std::size_t>(pool), 0);
  for (std::size_t p = 0; p < std::min(first, lay.order.size()); ++p) {
    const std::size_t j = lay.order[p];
    std::int64_t start = 0;
    for (int r : lay.ranks[j]) start = std::max(start, fin[static_cast<std::size_t>(r)]);
    for (int r : lay.ranks[j]) {
      auto& f = fin[static_cast<std::size_t>(r)];
      if (gaps != nullptr && f < start) gaps->push_back({r, j, start - f, 0});
      f = start + lay.time[j].ticks / pp;
    }
  }
  return fin;
}

}  // namespace hetmesh::balance::detail
#endif  // HETMESH_BODIES
