// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: the gap-filling HDP planner's improvement pass (planner.hpp) over ring layouts
// (ring_layout.hpp, which prices them): improve_layout searches layouts near the constructive one: moves
// that change which ranks a ring occupies or when it runs, and a re-packing of every ring (repack_rings:
// the largest in the order a small branch and bound finds, the others backfilled into the ranks they leave
// idle), each kept only when the modelled step strictly drops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "ring_layout.hpp"

namespace hetmesh::balance::detail {
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
  const auto width = [&](std::size_t j) { return static_cast<int>(lay.ranks[j].size()); };
  const auto dur = [&](std::size_t j) { return lay.time[j].ticks / pp; };
  // 1. Branch and bound over the order of rings 0..k-1 (counts of ranks, not which ranks).
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
  // 2. Every ring by backfilling: the k in that order, then the others longest first (index order).
  std::vector<std::size_t> list(best_seq);
  for (std::size_t j = 0; j < rings; ++j)
    if (std::find(best_seq.begin(), best_seq.end(), j) == best_seq.end()) list.push_back(j);
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> busy(static_cast<std::size_t>(pool));
  struct window {
    std::int64_t from, to;
    int rank;
  };
  std::vector<window> wins;
  std::vector<std::size_t> heap;  // indices into wins, a min-heap on `to`
  std::vector<std::int64_t> start(rings, 0);
  ring_layout out = lay;
  std::size_t placed = 0;
  std::optional<load_set> after;  // past `backfill` rings: each rank's last end
  for (std::size_t j : list) {
    const std::int64_t len = dur(j);
    const int d = width(j);
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
    wins.clear();
    for (int r = 0; r < pool; ++r) {
      std::int64_t from = 0;
      for (const auto& [a, b] : busy[static_cast<std::size_t>(r)]) {
        if (a - from >= len) wins.push_back({from, a, r});
        from = b;
      }
      wins.push_back({from, std::numeric_limits<std::int64_t>::max(), r});
    }
    std::sort(wins.begin(), wins.end(), [](const window& x, const window& y) {
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

/// How much searching improve_layout may do: full evaluations (evaluate_layout, each O(n log n)) and the work
/// of the cheap ring-only screens, in ranks touched.
struct search_budget {
  /// Full evaluations, each charged (short sequences + ranks) of the group: about 9 on 3,500 sequences
  /// and 8 ranks, 6 on 4,300 and 512.
  std::int64_t evaluation_work = 1 << 15;
  int evaluations = 12;     ///< and at most this many of them
  int min_evaluations = 4;  ///< no search where fewer fit (measured: 1-3 found nothing, at 1-2x the plan)
  std::int64_t screen_work = 1 << 18;  ///< ranks replayed by screens, all together
  int candidates_per_ring = 16;        ///< ranks tried per ring (the least-loaded non-members)
  int tiers = 4;                       ///< finish levels tried per ring when re-placing it (move e)
  std::size_t repack_rings = 9;        ///< move (g): the largest rings whose order is searched
  std::int64_t repack_nodes = 20'000;  ///< move (g): branch-and-bound nodes
  std::size_t repack_backfill = 64;    ///< move (g): rings backfilled (the rest go after, least loaded)
  std::int64_t repack_work = 1 << 22;  ///< move (g) only where rings x (pool + ring members) is within this
};

/// The search over ring layouts. Starting from `lay` (the constructive placement), repeatedly takes the
/// first rank that finishes last and holds a ring, and tries, ring by ring over its rings (the latest
/// first): (a) moving the ring off that rank onto a non-member (the least loaded by rings first); (b)
/// exchanging that rank with a member of another ring; (c) widening the ring by the least loaded
/// non-member or narrowing it by that rank, within its degree bounds; (d) running the ring one place
/// earlier or later; (e) re-placing a ring on the ranks free latest by a later finish level and every
/// later ring greedily; (f) running one of its rings a few places earlier, re-placing it and every later
/// ring greedily. A move is screened by the ring-only finish (a lower bound of the step: rows only add
/// time), then evaluated in full; the first move whose modelled step (evaluate_layout) is strictly lower
/// is kept and the search restarts from it. Once, when no move (a)-(f) improves (or the budget of the
/// screens is spent while full evaluations are left): (g) every ring re-packed (repack_rings: the
/// largest in the order a small branch and bound finds, the others backfilled), kept on the same terms,
/// and the local moves go on from it; skipped where rings x (pool + ring members) exceeds
/// budget.repack_work. Stops when nothing improves, or the budget is spent. `ev` is the evaluation of
/// `lay` (evaluate_layout) and follows it. `time_of(j, ranks)` prices ring j on group ranks. Post:
/// ev.step never above the starting layout's. Deterministic (moves in a fixed order; ties by rank).
/// Cost: bounded by `budget`.
HETMESH_COMPILED void improve_layout(
    ring_layout& lay, layout_eval& ev, const short_set& ss, int pool, std::int64_t capacity,
    const step_model& m, const std::function<cost::fixed(std::size_t, std::span<const int>)>& time_of,
    const search_budget& budget = {})
#if HETMESH_BODIES
{
  const std::size_t rings = lay.ranks.size();
  const std::int64_t eval_work = static_cast<std::int64_t>(ss.seqs.size()) + pool;
  if (rings == 0 || pool < 2 || budget.evaluation_work < budget.min_evaluations * eval_work) return;
  const int pp = m.pp_stages;
  const std::vector<std::int64_t>& finish = ev.finish;
  // What a rank running one task of t ticks finishes at least at: its share and, with pipelines, the
  // bubble (as balance::simulate prices them).
  const auto alone = [&](std::int64_t t) { return t / pp + (pp > 1 ? t * (pp - 1) / pp : 0); };
  std::int64_t ring_slots = 0;
  std::int64_t longest = 0;
  for (std::size_t j = 0; j < rings; ++j) {
    ring_slots += static_cast<std::int64_t>(lay.ranks[j].size());
    longest = std::max(longest, alone(lay.time[j].ticks));
  }
  if (!ss.order.empty())
    longest = std::max(longest, alone(m.pack_time(std::span(&ss.seqs[ss.order.front()].length, 1)).ticks));
  // A step no longer than one task alone (the longest ring, or the row of the longest short sequence)
  // cannot drop by moving rings: only resizing that ring could, and the pass leaves sizes for the whole
  // step to widen_ring. (With deep pipelines the bubble of the longest task often is the step.)
  if (ev.step.ticks <= longest) return;
  std::int64_t screen_left = budget.screen_work;
  std::int64_t eval_left = budget.evaluation_work;
  int evals = budget.evaluations;
  ring_layout cand;
  // Screens `cand`, evaluates it when it passes; true (and `cand` taken) when it is strictly better.
  const auto try_candidate = [&]() -> bool {
    screen_left -= ring_slots + pool;
    const auto fin = replay_rings(cand, pool, pp);
    if (*std::max_element(fin.begin(), fin.end()) >= ev.step.ticks) return false;
    eval_left -= eval_work;
    --evals;
    layout_eval e = evaluate_layout(cand, ss, pool, capacity, m);
    if (e.step >= ev.step) return false;
    ev = std::move(e);
    lay = cand;
    return true;
  };
  const auto within = [&] { return evals > 0 && eval_left >= eval_work && screen_left > 0; };
  // (g) Every ring re-packed (repack_rings), tried once, when no local move improves any more: the
  //     largest in the order a small branch and bound finds, the others backfilled into the idle ranks
  //     the largest leave. The greedy placement puts the largest rings side by side first and can leave
  //     the next ones waiting for each other with no local move to undo it; this places them as a
  //     packing of rectangles instead. When kept, the local moves go on from it.
  bool repacked = rings < 2 || static_cast<std::int64_t>(rings) * (pool + ring_slots) > budget.repack_work;
  const auto repack = [&]() -> bool {
    repacked = true;
    if (evals <= 0 || eval_left < eval_work) return false;
    std::int64_t fluid = 0;
    for (std::int64_t c : ss.cost) fluid += c / pp;
    cand = repack_rings(lay, pool, pp, budget.repack_rings, budget.repack_backfill, fluid,
                        budget.repack_nodes, time_of);
    return try_candidate();
  };
  const auto set_ring = [&](std::size_t j, std::vector<int> ranks) {
    std::sort(ranks.begin(), ranks.end());
    cand.time[j] = time_of(j, ranks);
    cand.ranks[j] = std::move(ranks);
  };
  bool improved = true;
  while (improved && within()) {
    improved = false;
    // The critical rank: the first that finishes last and holds a ring.
    const std::int64_t top = *std::max_element(finish.begin(), finish.end());
    std::vector<char> holds(static_cast<std::size_t>(pool), 0);
    for (const auto& rk : lay.ranks)
      for (int r : rk) holds[static_cast<std::size_t>(r)] = 1;
    int c = -1;
    for (int r = 0; r < pool && c < 0; ++r)
      if (finish[static_cast<std::size_t>(r)] == top && holds[static_cast<std::size_t>(r)]) c = r;
    // Its rings, the latest first; ranks by ring-only finish (ties: lower rank) as move targets.
    std::vector<std::size_t> pos(rings);
    for (std::size_t p = 0; p < rings; ++p) pos[lay.order[p]] = p;
    std::vector<std::size_t> mine;  // none when c < 0
    for (std::size_t p = rings; c >= 0 && p-- > 0;) {
      const auto& rk = lay.ranks[lay.order[p]];
      if (std::binary_search(rk.begin(), rk.end(), c)) mine.push_back(lay.order[p]);
    }
    const auto ring_fin = replay_rings(lay, pool, pp);
    std::vector<int> by_load(static_cast<std::size_t>(pool));
    for (int r = 0; r < pool; ++r) by_load[static_cast<std::size_t>(r)] = r;
    std::stable_sort(by_load.begin(), by_load.end(), [&](int a, int b) {
      return ring_fin[static_cast<std::size_t>(a)] < ring_fin[static_cast<std::size_t>(b)];
    });
    // Moves (a) to (d) may spend half of what is left of the screens, (e) the rest.
    const std::int64_t reserve = screen_left / 2;
    const auto within_local = [&] { return within() && screen_left > reserve; };
    for (std::size_t j : mine) {
      const std::vector<int> rk = lay.ranks[j];  // copies: a kept move replaces lay
      const auto member = [&](int r) { return std::binary_search(rk.begin(), rk.end(), r); };
      // (a) off c onto a non-member.
      int tried = 0;
      for (int r : by_load) {
        if (improved || !within_local() || tried >= budget.candidates_per_ring) break;
        if (member(r)) continue;
        ++tried;
        cand = lay;
        std::vector<int> nr(rk);
        *std::find(nr.begin(), nr.end(), c) = r;
        set_ring(j, std::move(nr));
        improved = try_candidate();
      }
      // (b) c exchanged with a member r of another ring k that c is not in: k moves onto c.
      for (std::size_t p = 0; p < rings && !improved && within_local(); ++p) {
        const std::size_t k = lay.order[p];
        const std::vector<int> rk2 = lay.ranks[k];
        if (k == j || std::binary_search(rk2.begin(), rk2.end(), c)) continue;
        tried = 0;
        for (int r : rk2) {
          if (improved || !within_local() || tried >= budget.candidates_per_ring) break;
          if (member(r)) continue;
          ++tried;
          cand = lay;
          std::vector<int> a(rk), b(rk2);
          *std::find(a.begin(), a.end(), c) = r;
          *std::find(b.begin(), b.end(), r) = c;
          set_ring(j, std::move(a));
          set_ring(k, std::move(b));
          improved = try_candidate();
        }
      }
      // (c) one rank more (the least loaded non-member) or one less (c), within its degree bounds.
      if (!improved && within_local() && static_cast<int>(rk.size()) < lay.max_degree[j]) {
        const auto r = std::find_if(by_load.begin(), by_load.end(), [&](int x) { return !member(x); });
        cand = lay;
        std::vector<int> nr(rk);
        nr.push_back(*r);
        set_ring(j, std::move(nr));
        improved = try_candidate();
      }
      if (!improved && within_local() && static_cast<int>(rk.size()) > lay.min_degree[j]) {
        cand = lay;
        std::vector<int> nr(rk);
        nr.erase(std::find(nr.begin(), nr.end(), c));
        set_ring(j, std::move(nr));
        improved = try_candidate();
      }
      // (d) one place earlier or later.
      for (int dir : {1, -1}) {
        if (improved || !within_local()) break;
        const std::size_t p = pos[j];
        if ((dir < 0 && p == 0) || (dir > 0 && p + 1 >= rings)) continue;
        cand = lay;
        std::swap(cand.order[p], cand.order[dir > 0 ? p + 1 : p - 1]);
        improved = try_candidate();
      }
      if (improved || !within_local()) break;
    }
    // (e) Re-placing a ring and every ring after it, at each position p (those of the critical rank's
    //     rings first, the latest first, then the others from the last): the ring on the D ranks free
    //     latest by a later finish level (best fit: the rings of its predecessors leave fewer holes),
    //     every later ring again on the D least-loaded ranks, as the constructive pass places them.
    std::vector<std::size_t> positions;
    for (std::size_t j : mine) positions.push_back(pos[j]);
    for (std::size_t p = rings; p-- > 0;)
      if (std::find(mine.begin(), mine.end(), lay.order[p]) == mine.end()) positions.push_back(p);
    for (std::size_t p : positions) {
      if (improved || !within()) break;
      const std::size_t j = lay.order[p];
      const auto d = lay.ranks[j].size();
      const auto before = replay_rings(lay, pool, pp, nullptr, p);
      std::vector<int> idx(static_cast<std::size_t>(pool));
      for (int r = 0; r < pool; ++r) idx[static_cast<std::size_t>(r)] = r;
      std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
        return before[static_cast<std::size_t>(a)] < before[static_cast<std::size_t>(b)];
      });
      screen_left -= pool;
      const auto at = [&](std::size_t q) { return before[static_cast<std::size_t>(idx[q])]; };
      int tier = 0;
      for (std::size_t e = d; e <= idx.size() && tier < budget.tiers && !improved && within(); ++e) {
        // Level: the finish of idx[e - 1]; only the last rank of each level opens a tier.
        if (e < idx.size() && at(e) == at(e - 1)) continue;
        ++tier;
        // The d ranks free latest at or before this level, the lowest ranks of the level first.
        std::vector<int> pick;
        std::size_t lo = e;
        while (lo > 0 && at(lo - 1) == at(e - 1)) --lo;
        for (std::size_t q = lo; q < e && pick.size() < d; ++q) pick.push_back(idx[q]);
        for (std::size_t q = lo; q-- > 0 && pick.size() < d;) pick.push_back(idx[q]);
        cand = lay;
        set_ring(j, std::move(pick));
        if (cand.ranks[j] == lay.ranks[j]) continue;
        load_set loads(before);
        bool hopeless = false;  // a ring already ends at or after the step: the screen would fail
        for (std::size_t q = p; q < rings && !hopeless; ++q) {
          const std::size_t i = lay.order[q];
          if (q > p) {
            std::vector<int> least = loads.least(static_cast<int>(cand.ranks[i].size()));
            set_ring(i, std::move(least));
          }
          const cost::fixed share = cost::fixed::from_ticks(cand.time[i].ticks / pp);
          hopeless = (loads.run(cand.ranks[i], share) + share).ticks >= ev.step.ticks;
          screen_left -= static_cast<std::int64_t>(cand.ranks[i].size());
        }
        if (!hopeless) improved = try_candidate();
      }
    }
    // (f) A ring of the critical rank run earlier: moved up to `tiers` places ahead in the order, it and
    //     every ring from its new place on again on the D least-loaded ranks (the constructive pass
    //     with that ring placed before some longer ones).
    for (std::size_t j : mine) {
      for (std::size_t back = 1; back <= static_cast<std::size_t>(budget.tiers) && back <= pos[j]; ++back) {
        if (improved || !within()) break;
        const std::size_t q0 = pos[j] - back;
        cand = lay;
        cand.order.erase(cand.order.begin() + static_cast<std::ptrdiff_t>(pos[j]));
        cand.order.insert(cand.order.begin() + static_cast<std::ptrdiff_t>(q0), j);
        load_set loads(replay_rings(cand, pool, pp, nullptr, q0));
        screen_left -= pool;
        bool hopeless = false;
        for (std::size_t q = q0; q < rings && !hopeless; ++q) {
          const std::size_t i = cand.order[q];
          set_ring(i, loads.least(static_cast<int>(cand.ranks[i].size())));
          const cost::fixed share = cost::fixed::from_ticks(cand.time[i].ticks / pp);
          hopeless = (loads.run(cand.ranks[i], share) + share).ticks >= ev.step.ticks;
          screen_left -= static_cast<std::int64_t>(cand.ranks[i].size());
        }
        if (!hopeless) improved = try_candidate();
      }
    }
    if (!improved && !repacked) improved = repack();
  }
  if (!repacked) (void)repack();
}
#else
    ;
#endif

}  // namespace hetmesh::balance::detail
