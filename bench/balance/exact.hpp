// SPDX-License-Identifier: Apache-2.0
// Benchmark support: the exact optimum of the balance room's step model on small instances, to measure
// how far the lower bound (balance::step_lower_bound) and the balancers are from it.
//
// The problem: each sequence longer than C runs on a ring of its own of D ranks, D from its minimum
// (the capacity rule) to the pool, taking ring_time(s, D) on each member (over the intra-node link when
// D fits a node: the least it can take); shorter sequences run whole on one rank. A step is a set of such
// tasks on N ranks; each rank runs its tasks one after another (balance::simulate). Any schedule of the
// tasks as rectangles of D ranks x time, at most N ranks busy at once, is reached by the simulator with
// the same or earlier finishes (assign ranks in start order), so the optimum is that of moldable
// parallel tasks under one resource of N ranks. Short sequences are relaxed to a divisible fluid that
// fills idle rank-time (their work without the per-row constant): the optimum of this relaxation,
// found by branch and bound, is a LOWER bound on the model's optimum (`relaxed_optimum`); the same search
// with the short sequences list-scheduled, largest first, into the idle time of the best long-task
// schedules gives a feasible step, an UPPER bound (`feasible`). When the two meet, the optimum is known.
//
// Branch and bound: the serial schedule-generation scheme (tasks in every order, each at the earliest
// time its D ranks are free for its whole duration, after the tasks placed before it) enumerates the
// active schedules, which hold an optimal one for every choice of ring sizes. Ring sizes: only the
// Pareto-optimal ones (a larger ring is kept only if it is faster than every smaller one; its rank-time
// is never smaller). Pruned by max(the makespan so far, the area bound of what is left, the longest task
// left). Identical tasks are placed in index order. Exponential: for instances of about ten long
// sequences (node limit `max_nodes`; `proved` says whether the search finished).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include <hetmesh/balance/strategies.hpp>

namespace hetmesh::bench {

/// The exact search's result, in model ticks (cost::fixed).
struct exact_result {
  std::int64_t relaxed_optimum = 0;   ///< optimum with short sequences as a divisible fluid: a lower bound
  std::int64_t feasible = 0;          ///< a feasible step (shorts placed whole): an upper bound
  std::int64_t long_tasks = 0;        ///< sequences longer than C
  std::int64_t nodes = 0;             ///< search nodes visited
  bool proved = false;                ///< the search finished (else relaxed_optimum is the best lower bound
                                      ///< found so far, still valid, and feasible the best schedule)
  std::int64_t fluid_long_tasks = 0;  ///< long sequences relaxed into the fluid (exact_optimum's `rigid`);
                                      ///< when > 0, `feasible` is 0 (no plan: those rings were not placed)
};

namespace detail {

struct mode {
  int ranks;
  std::int64_t time;
};
struct placed {
  std::int64_t start, end;
  int ranks;
};

/// Ranks busy at time t under `ps`.
inline int busy_at(std::span<const placed> ps, std::int64_t t) {
  int b = 0;
  for (const auto& p : ps)
    if (p.start <= t && t < p.end) b += p.ranks;
  return b;
}

/// The earliest start >= 0 at which `d` ranks are free for `dur` under `ps` on `n` ranks: a candidate is 0
/// or an end of a placed task; the ranks in use only change at starts and ends.
inline std::int64_t earliest_start(std::span<const placed> ps, int n, int d, std::int64_t dur) {
  std::vector<std::int64_t> cand{0};
  for (const auto& p : ps) cand.push_back(p.end);
  std::sort(cand.begin(), cand.end());
  for (auto t : cand) {
    bool ok = busy_at(ps, t) + d <= n;
    for (const auto& p : ps)
      if (ok && p.start > t && p.start < t + dur) ok = busy_at(ps, p.start) + d <= n;
    if (ok) return t;
  }
  return cand.back();
}

/// Per-rank finish of `ps` on `n` ranks (ranks given in start order), then the short sequences' times
/// `shorts` (largest first) each on the rank that finishes first: the feasible step.
inline std::int64_t place_shorts(std::vector<placed> ps, int n, std::span<const std::int64_t> shorts) {
  std::sort(ps.begin(), ps.end(), [](const placed& a, const placed& b) { return a.start < b.start; });
  std::vector<std::int64_t> free_at(static_cast<std::size_t>(n), 0);
  // Gaps before each rank's tasks are filled too: per rank its busy intervals.
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> busy(static_cast<std::size_t>(n));
  for (const auto& p : ps) {
    int need = p.ranks;
    for (std::size_t r = 0; r < free_at.size() && need > 0; ++r)
      if (free_at[r] <= p.start) {
        busy[r].push_back({p.start, p.end});
        free_at[r] = p.end;
        --need;
      }
  }
  // Shorts, largest first, each into the earliest gap (or the end) of any rank, to finish soonest.
  for (auto len : shorts) {
    std::size_t best_r = 0;
    std::int64_t best_end = -1, best_start = 0;
    for (std::size_t r = 0; r < busy.size(); ++r) {
      std::int64_t t = 0;
      for (const auto& [s, e] : busy[r]) {
        if (s - t >= len) break;
        t = std::max(t, e);
      }
      if (best_end < 0 || t + len < best_end) {
        best_end = t + len;
        best_start = t;
        best_r = r;
      }
    }
    auto& b = busy[best_r];
    b.insert(std::upper_bound(b.begin(), b.end(), std::pair{best_start, best_end}), {best_start, best_end});
  }
  std::int64_t step = 0;
  for (const auto& b : busy)
    for (const auto& [s, e] : b) step = std::max(step, e);
  return step;
}

}  // namespace detail

/// The exact search for `seqs` under `cfg` (pp_stages = 1). Pure; exponential in the long sequences.
/// `rigid`: how many long sequences (the largest by least ring time) the search places as rings; the
/// others join the fluid at their least rank-time (D x ring_time over their allowed D), a further
/// relaxation: relaxed_optimum stays a lower bound, feasible is not computed (0). This is how the
/// full-scale batch (hundreds of rings) gets a bound that sees how its largest rings fit together.
inline exact_result exact_optimum(std::span<const seq::seq_desc> seqs, const balance::strategy_config& cfg,
                                  std::int64_t max_nodes = 20'000'000,
                                  std::size_t rigid = std::numeric_limits<std::size_t>::max()) {
  const auto& m = cfg.model;
  const int n = cfg.ranks;
  std::vector<std::vector<detail::mode>> tasks;
  std::vector<std::int64_t> shorts;  // whole short sequences' pack times (with the row constant)
  double fluid_units = 0.0;          // their work without it
  std::int64_t largest_short = 0;
  for (const auto& s : seqs) {
    if (s.length <= cfg.hdp.capacity) {
      fluid_units += m.llm.work(s.length);
      shorts.push_back(m.pack_time(std::span<const std::int64_t>(&s.length, 1)).ticks);
      largest_short = std::max(largest_short, shorts.back());
      continue;
    }
    const int dmax = static_cast<int>(std::min<std::int64_t>(n, s.length / 2));
    const int dmin = std::clamp(
        seq::solve_offload(s.length, cfg.hdp.capacity, cfg.hdp.model, cfg.hdp.offload, n).ranks, 1, dmax);
    std::vector<detail::mode> modes;
    for (int d = dmin; d <= dmax; ++d) {
      const auto t = m.ring_time(s.length, d, m.spans_nodes(d)).ticks;
      if (modes.empty() || t < modes.back().time) modes.push_back({d, t});
    }
    tasks.push_back(std::move(modes));
  }
  std::sort(shorts.rbegin(), shorts.rend());
  std::int64_t fluid = cost::fixed::from_units(fluid_units).ticks;
  // Tasks in decreasing order of their least time (the search meets big tasks first); identical ones
  // adjacent.
  std::sort(tasks.begin(), tasks.end(), [](const auto& a, const auto& b) {
    return a.back().time != b.back().time ? a.back().time > b.back().time : a.front().ranks > b.front().ranks;
  });
  // Beyond `rigid`: into the fluid at their least rank-time; the longest of them still bounds the step.
  std::int64_t fluid_ticks = 0, longest_fluid = 0;
  const std::size_t all_tasks = tasks.size();
  while (tasks.size() > rigid) {
    std::int64_t area = std::numeric_limits<std::int64_t>::max();
    for (const auto& md : tasks.back()) area = std::min(area, md.ranks * md.time);
    fluid_ticks += area;
    longest_fluid = std::max(longest_fluid, tasks.back().back().time);
    tasks.pop_back();
  }
  const std::size_t k = tasks.size();
  std::vector<std::int64_t> min_area(k), min_time(k);
  for (std::size_t i = 0; i < k; ++i) {
    min_area[i] = tasks[i].front().ranks * tasks[i].front().time;
    min_time[i] = tasks[i].back().time;
    for (const auto& md : tasks[i]) min_area[i] = std::min(min_area[i], md.ranks * md.time);
  }
  std::vector<bool> same_as_prev(k, false);
  for (std::size_t i = 1; i < k; ++i) {
    bool same = tasks[i].size() == tasks[i - 1].size();
    for (std::size_t j = 0; same && j < tasks[i].size(); ++j)
      same = tasks[i][j].ranks == tasks[i - 1][j].ranks && tasks[i][j].time == tasks[i - 1][j].time;
    same_as_prev[i] = same;
  }
  auto ceil_div = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  fluid += fluid_ticks;
  largest_short = std::max(largest_short, longest_fluid);
  exact_result res;
  res.long_tasks = static_cast<std::int64_t>(all_tasks);
  res.fluid_long_tasks = static_cast<std::int64_t>(all_tasks - k);
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  std::int64_t best_feasible = std::numeric_limits<std::int64_t>::max();
  std::vector<detail::placed> ps;
  std::vector<bool> done(k, false);
  bool stopped = false;
  std::int64_t frontier_lb =
      std::numeric_limits<std::int64_t>::max();  // least bound of pruned-by-limit nodes
  auto rec = [&](auto&& self, std::int64_t cmax, std::int64_t area_done, std::int64_t area_left,
                 std::size_t left) -> void {
    ++res.nodes;
    std::int64_t longest_left = 0;
    for (std::size_t i = 0; i < k; ++i)
      if (!done[i]) longest_left = std::max(longest_left, min_time[i]);
    const std::int64_t lb =
        std::max({cmax, ceil_div(area_done + area_left + fluid, n), longest_left, largest_short});
    if (lb >= best) return;
    if (left == 0) {
      best = lb;  // the fluid fills the idle rank-time: max(cmax, area / N) is reached
      if (k == all_tasks)
        best_feasible = std::min(best_feasible, std::max(cmax, detail::place_shorts(ps, n, shorts)));
      return;
    }
    if (res.nodes >= max_nodes) {
      stopped = true;
      frontier_lb = std::min(frontier_lb, lb);
      return;
    }
    for (std::size_t i = 0; i < k; ++i) {
      if (done[i] || (same_as_prev[i] && !done[i - 1])) continue;
      done[i] = true;
      for (const auto& md : tasks[i]) {
        const auto st = detail::earliest_start(ps, n, md.ranks, md.time);
        ps.push_back({st, st + md.time, md.ranks});
        self(self, std::max(cmax, st + md.time), area_done + md.ranks * md.time, area_left - min_area[i],
             left - 1);
        ps.pop_back();
      }
      done[i] = false;
    }
  };
  std::int64_t all_area = 0;
  for (auto a : min_area) all_area += a;
  rec(rec, 0, 0, all_area, k);
  res.proved = !stopped;
  res.relaxed_optimum = stopped ? std::min(best, frontier_lb) : best;
  // With no long task the search placed nothing: the fluid bound and the shorts alone.
  res.feasible = k < all_tasks ? 0
                 : best_feasible == std::numeric_limits<std::int64_t>::max()
                     ? detail::place_shorts({}, n, shorts)
                     : best_feasible;
  return res;
}

}  // namespace hetmesh::bench
