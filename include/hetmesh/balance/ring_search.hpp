// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: the gap-filling HDP planner's improvement pass (planner.hpp) over ring layouts
// (ring_layout.hpp, which prices them): improve_layout searches layouts near the constructive one: moves
// that change which ranks a ring occupies or when it runs, and a re-packing of every ring (repack_rings:
// the largest in the order a small branch and bound finds, the others backfilled into the ranks they leave
// idle; in ring_repack.hpp), each kept only when the modelled step strictly drops.
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
#include "hdp_common.hpp"
#include "ring_layout.hpp"
#include "ring_repack.hpp"

namespace hetmesh::balance::detail {
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

#if HETMESH_BODIES
/// improve_layout's search (see there): the layout and its evaluation it improves, what is left of the
/// budget, and one method per family of moves. One object per call; compiled with improve_layout's body.
class layout_search {
 public:
  /// The ring prices `time_of(j, ranks)` of improve_layout.
  using time_fn = std::function<cost::fixed(std::size_t, std::span<const int>)>;

  /// A search from `lay` (evaluated as `ev`), which it updates in place.
  layout_search(ring_layout& lay, layout_eval& ev, const short_set& ss, int pool, std::int64_t capacity,
                const step_model& m, const time_fn& time_of, const search_budget& budget)
      : lay_(lay),
        ev_(ev),
        ss_(ss),
        pool_(pool),
        capacity_(capacity),
        m_(m),
        time_of_(time_of),
        budget_(budget),
        rings_(lay.ranks.size()),
        pp_(m.pp_stages),
        eval_work_(static_cast<std::int64_t>(ss.seqs.size()) + pool),
        screen_left_(budget.screen_work),
        eval_left_(budget.evaluation_work),
        evals_(budget.evaluations) {
    for (std::size_t j = 0; j < rings_; ++j) ring_slots_ += static_cast<std::int64_t>(lay.ranks[j].size());
    repacked_ = rings_ < 2 || static_cast<std::int64_t>(rings_) * (pool_ + ring_slots_) > budget.repack_work;
  }

  /// Whether the search may find anything: a step longer than any one task alone (the longest ring, or
  /// the row of the longest short sequence) can drop by moving rings; a step no longer cannot (only
  /// resizing that ring could, and the pass leaves sizes for the whole step to widen_ring).
  [[nodiscard]] HETMESH_COMPILED bool worth_it() const;

  /// The search loop: local moves (a)-(f) from the critical rank until none improves, then (g) once.
  HETMESH_COMPILED void run();

 private:
  // One round's view of the layout: the critical rank c (-1: none), each ring's place in the order, c's
  // rings (the latest first), and the ranks by ring-only finish (ties: lower rank) as move targets.
  struct round {
    int c = -1;
    std::vector<std::size_t> pos, mine;
    std::vector<int> by_load;
  };

  [[nodiscard]] HETMESH_COMPILED round critical() const;

  // Screens `cand_`, evaluates it when it passes; true (and `cand_` taken) when it is strictly better.
  HETMESH_COMPILED bool try_candidate();
  [[nodiscard]] bool within() const { return evals_ > 0 && eval_left_ >= eval_work_ && screen_left_ > 0; }
  [[nodiscard]] bool within_local() const { return within() && screen_left_ > reserve_; }

  // (g) Every ring re-packed (repack_rings), tried once, when no local move improves any more: the
  //     largest in the order a small branch and bound finds, the others backfilled into the idle ranks
  //     the largest leave. The greedy placement puts the largest rings side by side first and can leave
  //     the next ones waiting for each other with no local move to undo it; this places them as a
  //     packing of rectangles instead. When kept, the local moves go on from it.
  HETMESH_COMPILED bool repack();

  HETMESH_COMPILED void set_ring(std::size_t j, std::vector<int> ranks);

  // Moves (a) to (d) of ring j, one of the critical rank's.
  HETMESH_COMPILED void ring_moves(std::size_t j, const round& rd);

  // Places the rings of cand_ from position q0 of `order` on: each (but ring `fixed`, already placed) on
  // the D least-loaded ranks of `loads`, as the constructive pass does; true when some ring already ends
  // at or after the step, so the screen would fail.
  HETMESH_COMPILED bool place_from(std::size_t q0, const std::vector<std::size_t>& order, load_set& loads,
                                   std::size_t fixed);

  // (e) Re-placing a ring and every ring after it, at each position p (those of the critical rank's
  //     rings first, the latest first, then the others from the last): the ring on the D ranks free
  //     latest by a later finish level (best fit: the rings of its predecessors leave fewer holes),
  //     every later ring again on the D least-loaded ranks, as the constructive pass places them.
  HETMESH_COMPILED void replace_moves(const round& rd);

  // (f) A ring of the critical rank run earlier: moved up to `tiers` places ahead in the order, it and
  //     every ring from its new place on again on the D least-loaded ranks (the constructive pass
  //     with that ring placed before some longer ones).
  HETMESH_COMPILED void earlier_moves(const round& rd);

  ring_layout& lay_;
  layout_eval& ev_;
  const short_set& ss_;
  int pool_;
  std::int64_t capacity_;
  const step_model& m_;
  const time_fn& time_of_;
  const search_budget& budget_;
  std::size_t rings_;
  int pp_;
  std::int64_t eval_work_;       // what one full evaluation is charged
  std::int64_t ring_slots_ = 0;  // ring members, all rings together
  std::int64_t screen_left_, eval_left_;
  int evals_;
  std::int64_t reserve_ = 0;  // screens kept for (e) in this round
  bool repacked_ = false;     // (g) tried (or ruled out)
  bool improved_ = false;     // a move was kept in this round
  ring_layout cand_;          // the layout being tried
};
#endif

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
  layout_search search(lay, ev, ss, pool, capacity, m, time_of, budget);
  // (With deep pipelines the bubble of the longest task often is the step.)
  if (!search.worth_it()) return;
  search.run();
}
#else
    ;
#endif

}  // namespace hetmesh::balance::detail

#if HETMESH_BODIES

namespace hetmesh::balance::detail {

HETMESH_COMPILED bool layout_search::worth_it() const {
  // What a rank running one task of t ticks finishes at least at: its share and, with pipelines, the
  // bubble (as balance::simulate prices them).
  const auto alone = [&](std::int64_t t) { return t / pp_ + (pp_ > 1 ? t * (pp_ - 1) / pp_ : 0); };
  std::int64_t longest = 0;
  for (std::size_t j = 0; j < rings_; ++j) longest = std::max(longest, alone(lay_.time[j].ticks));
  if (!ss_.order.empty())
    longest = std::max(longest, alone(m_.pack_time(std::span(&ss_.seqs[ss_.order.front()].length, 1)).ticks));
  return ev_.step.ticks > longest;
}

HETMESH_COMPILED void layout_search::run() {
  improved_ = true;
  while (improved_ && within()) {
    improved_ = false;
    const round rd = critical();
    // Moves (a) to (d) may spend half of what is left of the screens, (e) the rest.
    reserve_ = screen_left_ / 2;
    for (std::size_t j : rd.mine) {
      ring_moves(j, rd);
      if (improved_ || !within_local()) break;
    }
    replace_moves(rd);
    earlier_moves(rd);
    if (!improved_ && !repacked_) improved_ = repack();
  }
  if (!repacked_) (void)repack();
}

HETMESH_COMPILED layout_search::round layout_search::critical() const {
  round rd;
  // The critical rank: the first that finishes last and holds a ring.
  const auto& finish = ev_.finish;
  const std::int64_t top = *std::max_element(finish.begin(), finish.end());
  std::vector<char> holds(static_cast<std::size_t>(pool_), 0);
  for (const auto& rk : lay_.ranks)
    for (int r : rk) holds[static_cast<std::size_t>(r)] = 1;
  for (int r = 0; r < pool_ && rd.c < 0; ++r)
    if (finish[static_cast<std::size_t>(r)] == top && holds[static_cast<std::size_t>(r)]) rd.c = r;
  rd.pos.resize(rings_);
  for (std::size_t p = 0; p < rings_; ++p) rd.pos[lay_.order[p]] = p;
  for (std::size_t p = rings_; rd.c >= 0 && p-- > 0;) {
    const auto& rk = lay_.ranks[lay_.order[p]];
    if (std::binary_search(rk.begin(), rk.end(), rd.c)) rd.mine.push_back(lay_.order[p]);
  }
  const auto ring_fin = replay_rings(lay_, pool_, pp_);
  rd.by_load.resize(static_cast<std::size_t>(pool_));
  for (int r = 0; r < pool_; ++r) rd.by_load[static_cast<std::size_t>(r)] = r;
  std::stable_sort(rd.by_load.begin(), rd.by_load.end(), [&](int a, int b) {
    return ring_fin[static_cast<std::size_t>(a)] < ring_fin[static_cast<std::size_t>(b)];
  });
  return rd;
}

HETMESH_COMPILED bool layout_search::try_candidate() {
  screen_left_ -= ring_slots_ + pool_;
  const auto fin = replay_rings(cand_, pool_, pp_);
  if (*std::max_element(fin.begin(), fin.end()) >= ev_.step.ticks) return false;
  eval_left_ -= eval_work_;
  --evals_;
  layout_eval e = evaluate_layout(cand_, ss_, pool_, capacity_, m_);
  if (e.step >= ev_.step) return false;
  ev_ = std::move(e);
  lay_ = cand_;
  return true;
}

HETMESH_COMPILED bool layout_search::repack() {
  repacked_ = true;
  if (evals_ <= 0 || eval_left_ < eval_work_) return false;
  std::int64_t fluid = 0;
  for (std::int64_t c : ss_.cost) fluid += c / pp_;
  cand_ = repack_rings(lay_, pool_, pp_, budget_.repack_rings, budget_.repack_backfill, fluid,
                       budget_.repack_nodes, time_of_);
  return try_candidate();
}

HETMESH_COMPILED void layout_search::set_ring(std::size_t j, std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  cand_.time[j] = time_of_(j, ranks);
  cand_.ranks[j] = std::move(ranks);
}

HETMESH_COMPILED void layout_search::ring_moves(std::size_t j, const round& rd) {
  const int c = rd.c;
  const std::vector<int> rk = lay_.ranks[j];  // copies: a kept move replaces lay
  const auto member = [&](int r) { return std::binary_search(rk.begin(), rk.end(), r); };
  // (a) off c onto a non-member.
  int tried = 0;
  for (int r : rd.by_load) {
    if (improved_ || !within_local() || tried >= budget_.candidates_per_ring) break;
    if (member(r)) continue;
    ++tried;
    cand_ = lay_;
    std::vector<int> nr(rk);
    *std::find(nr.begin(), nr.end(), c) = r;
    set_ring(j, std::move(nr));
    improved_ = try_candidate();
  }
  // (b) c exchanged with a member r of another ring k that c is not in: k moves onto c.
  for (std::size_t p = 0; p < rings_ && !improved_ && within_local(); ++p) {
    const std::size_t k = lay_.order[p];
    const std::vector<int> rk2 = lay_.ranks[k];
    if (k == j || std::binary_search(rk2.begin(), rk2.end(), c)) continue;
    tried = 0;
    for (int r : rk2) {
      if (improved_ || !within_local() || tried >= budget_.candidates_per_ring) break;
      if (member(r)) continue;
      ++tried;
      cand_ = lay_;
      std::vector<int> a(rk), b(rk2);
      *std::find(a.begin(), a.end(), c) = r;
      *std::find(b.begin(), b.end(), r) = c;
      set_ring(j, std::move(a));
      set_ring(k, std::move(b));
      improved_ = try_candidate();
    }
  }
  // (c) one rank more (the least loaded non-member) or one less (c), within its degree bounds.
  if (!improved_ && within_local() && static_cast<int>(rk.size()) < lay_.max_degree[j]) {
    const auto r = std::find_if(rd.by_load.begin(), rd.by_load.end(), [&](int x) { return !member(x); });
    cand_ = lay_;
    std::vector<int> nr(rk);
    nr.push_back(*r);
    set_ring(j, std::move(nr));
    improved_ = try_candidate();
  }
  if (!improved_ && within_local() && static_cast<int>(rk.size()) > lay_.min_degree[j]) {
    cand_ = lay_;
    std::vector<int> nr(rk);
    nr.erase(std::find(nr.begin(), nr.end(), c));
    set_ring(j, std::move(nr));
    improved_ = try_candidate();
  }
  // (d) one place earlier or later.
  for (int dir : {1, -1}) {
    if (improved_ || !within_local()) break;
    const std::size_t p = rd.pos[j];
    if ((dir < 0 && p == 0) || (dir > 0 && p + 1 >= rings_)) continue;
    cand_ = lay_;
    std::swap(cand_.order[p], cand_.order[dir > 0 ? p + 1 : p - 1]);
    improved_ = try_candidate();
  }
}

HETMESH_COMPILED bool layout_search::place_from(std::size_t q0, const std::vector<std::size_t>& order,
                                                load_set& loads, std::size_t fixed) {
  bool hopeless = false;
  for (std::size_t q = q0; q < rings_ && !hopeless; ++q) {
    const std::size_t i = order[q];
    if (i != fixed) set_ring(i, loads.least(static_cast<int>(cand_.ranks[i].size())));
    const cost::fixed share = cost::fixed::from_ticks(cand_.time[i].ticks / pp_);
    hopeless = (loads.run(cand_.ranks[i], share) + share).ticks >= ev_.step.ticks;
    screen_left_ -= static_cast<std::int64_t>(cand_.ranks[i].size());
  }
  return hopeless;
}

HETMESH_COMPILED void layout_search::replace_moves(const round& rd) {
  std::vector<std::size_t> positions;
  for (std::size_t j : rd.mine) positions.push_back(rd.pos[j]);
  for (std::size_t p = rings_; p-- > 0;)
    if (std::find(rd.mine.begin(), rd.mine.end(), lay_.order[p]) == rd.mine.end()) positions.push_back(p);
  for (std::size_t p : positions) {
    if (improved_ || !within()) break;
    const std::size_t j = lay_.order[p];
    const auto d = lay_.ranks[j].size();
    const auto before = replay_rings(lay_, pool_, pp_, nullptr, p);
    std::vector<int> idx(static_cast<std::size_t>(pool_));
    for (int r = 0; r < pool_; ++r) idx[static_cast<std::size_t>(r)] = r;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
      return before[static_cast<std::size_t>(a)] < before[static_cast<std::size_t>(b)];
    });
    screen_left_ -= pool_;
    const auto at = [&](std::size_t q) { return before[static_cast<std::size_t>(idx[q])]; };
    int tier = 0;
    for (std::size_t e = d; e <= idx.size() && tier < budget_.tiers && !improved_ && within(); ++e) {
      // Level: the finish of idx[e - 1]; only the last rank of each level opens a tier.
      if (e < idx.size() && at(e) == at(e - 1)) continue;
      ++tier;
      // The d ranks free latest at or before this level, the lowest ranks of the level first.
      std::vector<int> pick;
      std::size_t lo = e;
      while (lo > 0 && at(lo - 1) == at(e - 1)) --lo;
      for (std::size_t q = lo; q < e && pick.size() < d; ++q) pick.push_back(idx[q]);
      for (std::size_t q = lo; q-- > 0 && pick.size() < d;) pick.push_back(idx[q]);
      cand_ = lay_;
      set_ring(j, std::move(pick));
      if (cand_.ranks[j] == lay_.ranks[j]) continue;
      load_set loads(before);
      if (!place_from(p, lay_.order, loads, j)) improved_ = try_candidate();
    }
  }
}

HETMESH_COMPILED void layout_search::earlier_moves(const round& rd) {
  for (std::size_t j : rd.mine) {
    for (std::size_t back = 1; back <= static_cast<std::size_t>(budget_.tiers) && back <= rd.pos[j]; ++back) {
      if (improved_ || !within()) break;
      const std::size_t q0 = rd.pos[j] - back;
      cand_ = lay_;
      cand_.order.erase(cand_.order.begin() + static_cast<std::ptrdiff_t>(rd.pos[j]));
      cand_.order.insert(cand_.order.begin() + static_cast<std::ptrdiff_t>(q0), j);
      load_set loads(replay_rings(cand_, pool_, pp_, nullptr, q0));
      screen_left_ -= pool_;
      if (!place_from(q0, cand_.order, loads, rings_)) improved_ = try_candidate();
    }
  }
}

}  // namespace hetmesh::balance::detail
#endif  // HETMESH_BODIES
