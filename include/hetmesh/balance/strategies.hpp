// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: the balancer families of balancers.hpp priced side by side, so a tool (hetmesh-plan
// compare) and the benchmarks can compare them:
//   random_placement  HDP work items (packs, rings) on random ranks
//   token_count       HDP work items balanced by token count (LPT on tokens)
//   static_dp_cp      a fixed dp x cp mesh, cp = ceil(context / C); sequences packed Megatron-style (in
//                     arrival order, next-fit) into rows of cp x C tokens, rows dealt round-robin to the
//                     dp groups; every row runs on its whole cp ring (THD zigzag)
//   bytescale         ByteScale: data-aware sharding + Alg. 2 balance scheduler (bytescale.hpp)
//   gap_filling_hdp   ours: rings first, LPT on modelled time per sequence, short sequences fill the
//                     gaps; with locality groups when group_size is set (planner.hpp)
// Every strategy is priced by the same step_model and the same simulator; the times are modelled.
// Each strategy's per-rank plan (its work items) is its `plan` member (plan_strategy).
// Choosing a strategy by name is the tools' business (tools/common/hetmesh_tools/balancer_names.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../seq/offload.hpp"
#include "../seq/types.hpp"
#include "balancers.hpp"
#include "model.hpp"
#include "strategy_plan.hpp"

namespace hetmesh::balance {

/// One strategy's modelled outcome.
struct strategy_result {
  std::string name;                     ///< the strategy's name, as the benchmarks print it
  cost::fixed step{};                   ///< modelled step time
  double imbalance = 0.0;               ///< max / mean of per-rank busy time
  cost::fixed lower_bound{};            ///< step_lower_bound: area with ring costs, longest task, chain
  double ratio_to_lower_bound = 0.0;    ///< step / lower_bound (1.0 is perfect)
  std::int64_t tasks = 0;               ///< micro-batches (a ring counts once)
  std::int64_t max_tasks_per_rank = 0;  ///< the most micro-batches any rank runs
  double comm_bytes = 0.0;              ///< modelled ring-attention traffic of the step (ring_comm_bytes)
};

/// The parts of step_lower_bound, each a bound on the modelled step time (already divided by
/// pp_stages), in model ticks.
struct lower_bound_terms {
  /// Rank-time area over the pool: the short sequences' work (without the per-row constant c) plus, per
  /// sequence longer than C, the least rank-time D x ring_time(s, D) of a ring it may run on (D from
  /// its minimum ring size, the capacity rule, to the pool), divided by the ranks.
  cost::fixed area{};
  /// The longest single task: the largest short sequence's pack time, and every long sequence's ring
  /// time at its best allowed degree.
  cost::fixed longest{};
  /// Sequences whose minimum ring holds more than half the pool pairwise share a rank, so they run one
  /// after another: the sum of their best ring times.
  cost::fixed chain{};
  /// What the bound was before the capacity rule and ring costs entered it (for comparison): max(total
  /// work / ranks, the longest task at any degree).
  cost::fixed work_only{};
};

/// The terms of step_lower_bound (see there). O(n + long sequences x ranks).
[[nodiscard]] HETMESH_COMPILED lower_bound_terms step_lower_bound_terms(std::span<const seq::seq_desc> seqs,
                                                                        const strategy_config& cfg);

/// A lower bound on the modelled step of any plan that packs sequences of <= C tokens whole on one rank
/// and runs each longer sequence on a ring of its own, of at least the ranks the capacity rule gives it
/// (seq::solve_offload with cfg.hdp's offloading; every HDP strategy does): the largest of
/// lower_bound_terms' area, longest and chain, divided by pp_stages. Area: every rank is busy for at
/// most the step, and a ring of D ranks keeps each of them busy for its ring time, which on
/// communication-bound rings exceeds the sequence's work / D (ByteScale's Byted-like 2M-token
/// sequences at C = 8K: D x ring time ~ 2.1 x work); the bound before it (work / ranks) left that out.
/// Static dp x cp shares a ring between several sequences, so the bound does not bind it.
/// O(n + long sequences x ranks).
[[nodiscard]] HETMESH_COMPILED cost::fixed step_lower_bound(std::span<const seq::seq_desc> seqs,
                                                            const strategy_config& cfg);

/// The plan balancer `b` makes for `seqs` on cfg.ranks ranks: its work items and their tasks, priced by
/// cfg.model (b.plan(seqs, cfg)). Every non-empty sequence is in exactly one item. Pre: cfg.ranks >= 1
/// (else invalid_argument); valid sequences. Throws what the balancer throws (static_dp_cp:
/// capacity_error when its cp exceeds the pool). Pure; deterministic. Not collective.
template <class B>
[[nodiscard]] strategy_plan plan_strategy(const B& b, std::span<const seq::seq_desc> seqs,
                                          const strategy_config& cfg) {
  static_assert(balancer<B>,
                "not a balance::balancer: expected a policy type with `name`, `plan(seqs, strategy_config)` "
                "returning strategy_plan, `hash_append`, ==, and a formatter (bytescale, gap_filling_hdp, "
                "token_count, random_placement, static_dp_cp)");
  return b.plan(seqs, cfg);
}

/// Runs balancer `b` on `seqs` and prices its plan with the step simulator; the result is named B::name.
/// Pre: cfg.ranks >= 1; valid sequences. Post: step >= lower_bound for the HDP strategies. Pure;
/// deterministic. Cost: the balancer's planning plus O(tasks log tasks).
template <class B>
[[nodiscard]] strategy_result run_strategy(const B& b, std::span<const seq::seq_desc> seqs,
                                           const strategy_config& cfg) {
  static_assert(balancer<B>,
                "not a balance::balancer: expected a policy type with `name`, `plan(seqs, strategy_config)` "
                "returning strategy_plan, `hash_append`, ==, and a formatter (bytescale, gap_filling_hdp, "
                "token_count, random_placement, static_dp_cp)");
  const strategy_plan plan = b.plan(seqs, cfg);
  const std::vector<task>& tasks = plan.tasks;
  const timeline tl = simulate(cfg.ranks, tasks, cfg.model.pp_stages);
  strategy_result r;
  r.name = std::string(B::name);
  r.step = tl.step;
  r.imbalance = tl.imbalance();
  r.lower_bound = step_lower_bound(seqs, cfg);
  r.ratio_to_lower_bound = r.lower_bound.ticks > 0 ? tl.step.units() / r.lower_bound.units() : 0.0;
  r.tasks = static_cast<std::int64_t>(tasks.size());
  for (auto k : tl.tasks_on) r.max_tasks_per_rank = std::max(r.max_tasks_per_rank, k);
  r.comm_bytes = ring_comm_bytes(plan, cfg.model);
  return r;
}

/// Every balancer of `bs` on the same batch, side by side, in argument order. Same contract as
/// run_strategy.
template <class... Bs>
[[nodiscard]] std::vector<strategy_result> compare_strategies(std::span<const seq::seq_desc> seqs,
                                                              const strategy_config& cfg, const Bs&... bs) {
  std::vector<strategy_result> out;
  out.reserve(sizeof...(Bs));
  (out.push_back(run_strategy(bs, seqs, cfg)), ...);
  return out;
}

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::strategy_result> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::strategy_result& r, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(
        ctx.out(), "{}: step={} (modelled), imbalance={:.3f}, lower_bound={}, ratio={:.3f}, tasks={}", r.name,
        r.step, r.imbalance, r.lower_bound, r.ratio_to_lower_bound, r.tasks);
  }
};

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED lower_bound_terms step_lower_bound_terms(std::span<const seq::seq_desc> seqs,
                                                          const strategy_config& cfg) {
  const auto& m = cfg.model;
  const std::int64_t n = cfg.ranks;
  // The per-row constant c is left out of the short work: packing shares it, so counting it per sequence
  // would overstate what a rank must do.
  double total_units = 0.0, short_units = 0.0;
  std::int64_t largest = 0, largest_any = 0, long_area = 0, chain = 0;
  for (const auto& s : seqs) {
    total_units += m.llm.work(s.length);
    if (s.length > cfg.hdp.capacity) continue;
    short_units += m.llm.work(s.length);
    largest = std::max(largest, m.pack_time(std::span<const std::int64_t>(&s.length, 1)).ticks);
  }
  largest_any = largest;
  for (const auto& s : seqs) {
    if (s.length <= cfg.hdp.capacity) continue;
    // Its ring: at least the ranks the capacity rule (with the policy's offloading) gives it, at most
    // the pool and s / 2 (two zigzag chunks per rank). Exact scans: the bound must never overstate.
    const auto dmax = std::max<std::int64_t>(1, std::min<std::int64_t>(n, s.length / 2));
    const std::int64_t dmin = std::clamp<std::int64_t>(
        seq::solve_offload(s.length, cfg.hdp.capacity, cfg.hdp.model, cfg.hdp.offload, cfg.ranks).ranks, 1,
        dmax);
    std::int64_t best_any = m.ring_time(s.length, 1, false).ticks;
    std::int64_t best = std::numeric_limits<std::int64_t>::max(), area = best;
    for (std::int64_t d = 1; d <= dmax; ++d) {
      const auto t = m.ring_time(s.length, static_cast<int>(d), m.spans_nodes(static_cast<int>(d))).ticks;
      best_any = std::min(best_any, t);
      if (d < dmin) continue;
      best = std::min(best, t);
      area = std::min(area, d * t);
    }
    largest_any = std::max(largest_any, best_any);
    largest = std::max(largest, best);
    long_area += area;
    if (2 * dmin > n) chain += best;
  }
  const std::int64_t pp = m.pp_stages;
  const std::int64_t area_ticks = cost::fixed::from_units(short_units).ticks + long_area;
  const std::int64_t total = cost::fixed::from_units(total_units).ticks;
  lower_bound_terms t;
  t.area = cost::fixed::from_ticks((area_ticks + n - 1) / n / pp);
  t.longest = cost::fixed::from_ticks(largest / pp);
  t.chain = cost::fixed::from_ticks(chain / pp);
  t.work_only = cost::fixed::from_ticks(std::max((total + n - 1) / n, largest_any) / pp);
  return t;
}

HETMESH_COMPILED cost::fixed step_lower_bound(std::span<const seq::seq_desc> seqs,
                                              const strategy_config& cfg) {
  const auto t = step_lower_bound_terms(seqs, cfg);
  return std::max({t.area, t.longest, t.chain});
}

}  // namespace hetmesh::balance
#endif  // HETMESH_BODIES
