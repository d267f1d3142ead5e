// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: move (g) of the gap-filling HDP planner's improvement pass (ring_search.hpp): every
// ring of a layout re-packed from scratch, the largest in the order a small branch and bound finds (rings
// as rectangles of ranks x time), the others backfilled into the ranks they leave idle.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "hdp_common.hpp"
#include "ring_layout.hpp"

namespace hetmesh::balance::detail {

/// Step 1 of repack_rings: the branch and bound over the order of rings 0..k-1 (counts of ranks, not
/// which ranks; see repack_rings). Returns the first best order found (empty when k is 0). Deterministic;
/// O(nodes x k^2).
HETMESH_COMPILED std::vector<std::size_t> order_largest_rings(const ring_layout& lay, int pool, int pp,
                                                              std::size_t k, std::int64_t fluid,
                                                              std::int64_t nodes)
#if HETMESH_BODIES
{
  const std::size_t rings = lay.ranks.size();
  const auto width = [&](std::size_t j) { return static_cast<int>(lay.ranks[j].size()); };
  const auto dur = [&](std::size_t j) { return lay.time[j].ticks / pp; };
  struct rect {
    std::int64_t start, end;
    int ranks;
  };
  std::vector<rect> ps;
  std::vector<std::size_t> seq, best_seq;
  std::vector<char> done(k, 0);
  std::int64_t area_all = fluid;
  for (std::size_t j = 0; j < rings; ++j) area_all += static_cast<std::int64_t>(width(j)) * dur(j);
  const std::int64_t area_bound = (area_all + pool - 1) / pool;
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  std::int64_t visited = 0;
  const auto busy_at = [&](std::int64_t t) {
    int b = 0;
    for (const auto& p : ps)
      if (p.start <= t && t < p.end) b += p.ranks;
    return b;
  };
  std::vector<std::int64_t> cand;
  cand.reserve(k + 1);
  const auto earliest = [&](int d, std::int64_t len) {
    cand.assign(1, 0);
    for (const auto& p : ps) cand.push_back(p.end);
    std::sort(cand.begin(), cand.end());
    for (std::int64_t t : cand) {
      bool ok = busy_at(t) + d <= pool;
      for (const auto& p : ps)
        if (ok && p.start > t && p.start < t + len) ok = busy_at(p.start) + d <= pool;
      if (ok) return t;
    }
    return cand.back();
  };
  const auto rec = [&](const auto& self, std::int64_t cmax) -> void {
    ++visited;
    std::int64_t longest_left = 0;
    for (std::size_t j = 0; j < k; ++j)
      if (!done[j]) longest_left = std::max(longest_left, dur(j));
    const std::int64_t lb = std::max({cmax, area_bound, longest_left});
    if (lb >= best) return;
    if (seq.size() == k) {
      best = lb;
      best_seq = seq;
      return;
    }
    if (visited >= nodes) return;
    for (std::size_t j = 0; j < k && best > area_bound; ++j) {
      // Identical rings in index order only: the others' orders give the same schedules.
      if (done[j] || (j > 0 && !done[j - 1] && width(j) == width(j - 1) && dur(j) == dur(j - 1))) continue;
      const std::int64_t st = earliest(width(j), dur(j));
      done[j] = 1;
      seq.push_back(j);
      ps.push_back({st, st + dur(j), width(j)});
      self(self, std::max(cmax, st + dur(j)));
      ps.pop_back();
      seq.pop_back();
      done[j] = 0;
    }
  };
  if (k > 0) rec(rec, 0);
  return best_seq;
}
#else
    ;
#endif

/// An idle window of one rank, [from, to), for repack_rings' backfilling.
struct idle_window {
  std::int64_t from, to;  ///< the window
  int rank;               ///< its rank
};

/// For repack_rings' backfilling: the earliest time t0 at which `d` ranks are idle for [t0, t0 + len),
/// given each rank's busy intervals (sorted, disjoint), and the d ranks that fit that slot tightest (free
/// latest before it, then busy soonest after it, then the lowest rank), ascending. `wins` and `heap` are
/// scratch, kept between calls. O(W log W), W the idle windows.
HETMESH_COMPILED std::pair<std::int64_t, std::vector<int>> tightest_slot(
    const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>& busy, std::int64_t len, int d,
    std::vector<idle_window>& wins, std::vector<std::size_t>& heap)
#if HETMESH_BODIES
{
  wins.clear();
  for (std::size_t r = 0; r < busy.size(); ++r) {
    std::int64_t from = 0;
    for (const auto& [a, b] : busy[r]) {
      if (a - from >= len) wins.push_back({from, a, static_cast<int>(r)});
      from = b;
    }
    wins.push_back({from, std::numeric_limits<std::int64_t>::max(), static_cast<int>(r)});
  }
  std::sort(wins.begin(), wins.end(), [](const idle_window& x, const idle_window& y) {
    return x.from != y.from ? x.from < y.from : x.rank < y.rank;
  });
  // Sweep the window starts; the heap holds the windows open at t0 that still hold [t0, t0 + len).
  heap.clear();
  const auto later_end = [&](std::size_t x, std::size_t y) { return wins[x].to > wins[y].to; };
  std::int64_t t0 = 0;
  for (std::size_t q = 0; q < wins.size(); ++q) {
    t0 = wins[q].from;
    heap.push_back(q);
    std::push_heap(heap.begin(), heap.end(), later_end);
    while (!heap.empty() && wins[heap.front()].to - t0 < len) {
      std::pop_heap(heap.begin(), heap.end(), later_end);
      heap.pop_back();
    }
    // All windows starting at t0 first, so the tightest choice sees them.
    if (static_cast<int>(heap.size()) >= d && (q + 1 == wins.size() || wins[q + 1].from != t0)) break;
  }
  std::sort(heap.begin(), heap.end(), [&](std::size_t x, std::size_t y) {
    if (wins[x].from != wins[y].from) return wins[x].from > wins[y].from;
    if (wins[x].to != wins[y].to) return wins[x].to < wins[y].to;
    return wins[x].rank < wins[y].rank;
  });
  std::vector<int> ranks;
  for (std::size_t q = 0; q < static_cast<std::size_t>(d); ++q) ranks.push_back(wins[heap[q]].rank);
  std::sort(ranks.begin(), ranks.end());
  return {t0, std::move(ranks)};
}
#else
    ;
#endif

/// Re-packs every ring of `lay` from scratch (move (g) of improve_layout): the `k` largest rings (the
/// first k ring indices: the planner numbers them longest first) in the order a bounded branch and
/// bound finds, then every other ring longest first, each at the earliest time that as many ranks as it
/// has members are all idle for its whole time (backfilling: a later ring may run before an earlier one
/// on ranks it leaves idle), on the ranks that fit that slot tightest (free latest before it, then busy
/// soonest after it, then the lowest rank). The branch and bound places the k rings as rectangles of
/// ranks x time on a pool of `pool` interchangeable ranks, each at the earliest time enough ranks are
/// free for its whole time after those placed before it (the serial schedule-generation scheme, which
/// reaches an optimal schedule of the rectangles), and minimizes max(the last end, all work of the
/// group / pool) where the other rings and the short sequences (`fluid`, rank-ticks) count as work that
/// fills idle ranks; it visits at most `nodes` nodes and keeps the first best order found. Times are
/// lay.time / pp as replay_rings runs them. Returns the new layout: ranks re-priced by `time_of`, order by
/// start (ties: ring index), so every rank runs its rings in the order of their slots. Deterministic.
/// O(nodes x k^2 + rings x W log W), W the idle windows (at most pool + the rings' members).
HETMESH_COMPILED ring_layout repack_rings(
    const ring_layout& lay, int pool, int pp, std::size_t k, std::size_t backfill, std::int64_t fluid,
    std::int64_t nodes, const std::function<cost::fixed(std::size_t, std::span<const int>)>& time_of)
#if HETMESH_BODIES
{
  const std::size_t rings = lay.ranks.size();
  k = std::min(k, rings);
  // 1. Branch and bound over the order of rings 0..k-1.
  const std::vector<std::size_t> best_seq = order_largest_rings(lay, pool, pp, k, fluid, nodes);
  // 2. Every ring by backfilling: the k in that order, then the others longest first (index order).
  std::vector<std::size_t> list(best_seq);
  for (std::size_t j = 0; j < rings; ++j)
    if (std::find(best_seq.begin(), best_seq.end(), j) == best_seq.end()) list.push_back(j);
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> busy(static_cast<std::size_t>(pool));
  std::vector<idle_window> wins;
  std::vector<std::size_t> heap;  // indices into wins, a min-heap on `to`
  std::vector<std::int64_t> start(rings, 0);
  ring_layout out = lay;
  std::size_t placed = 0;
  std::optional<load_set> after;  // past `backfill` rings: each rank's last end
  for (std::size_t j : list) {
    const std::int64_t len = lay.time[j].ticks / pp;
    const int d = static_cast<int>(lay.ranks[j].size());
    if (placed++ >= backfill) {
      // The rest after everything on their ranks: the d ranks whose last ring ends first.
      if (!after) {
        std::vector<std::int64_t> last(static_cast<std::size_t>(pool), 0);
        for (std::size_t r = 0; r < last.size(); ++r)
          if (!busy[r].empty()) last[r] = busy[r].back().second;
        after.emplace(last);
      }
      std::vector<int> ranks = after->least(d);
      std::sort(ranks.begin(), ranks.end());
      const std::int64_t t = after->run(ranks, cost::fixed::from_ticks(len)).ticks;
      start[j] = t;
      out.time[j] = time_of(j, ranks);
      out.ranks[j] = std::move(ranks);
      continue;
    }
    auto [t0, ranks] = tightest_slot(busy, len, d, wins, heap);
    for (int r : ranks) {
      auto& b = busy[static_cast<std::size_t>(r)];
      b.insert(std::upper_bound(b.begin(), b.end(), std::pair{t0, t0 + len}), {t0, t0 + len});
    }
    start[j] = t0;
    out.time[j] = time_of(j, ranks);
    out.ranks[j] = std::move(ranks);
  }
  for (std::size_t j = 0; j < rings; ++j) out.order[j] = j;
  std::stable_sort(out.order.begin(), out.order.end(),
                   [&](std::size_t x, std::size_t y) { return start[x] < start[y]; });
  return out;
}
#else
    ;
#endif

}  // namespace hetmesh::balance::detail
