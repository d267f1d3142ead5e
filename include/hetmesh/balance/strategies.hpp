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
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
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
  cost::fixed lower_bound{};            ///< max(total / N, largest short sequence), per pipeline stage
  double ratio_to_lower_bound = 0.0;    ///< step / lower_bound (1.0 is perfect)
  std::int64_t tasks = 0;               ///< micro-batches (a ring counts once)
  std::int64_t max_tasks_per_rank = 0;  ///< the most micro-batches any rank runs
  double comm_bytes = 0.0;              ///< modelled ring-attention traffic of the step (ring_comm_bytes)
};

/// max(sum of whole-sequence times (without the per-row constant) / ranks, the largest sequence of <= C
/// tokens (which no HDP strategy splits), every longer sequence's ring time at its best degree),
/// divided by pp_stages. Under the step model, no strategy that keeps short sequences whole can beat
/// it. O(n + long sequences x ranks).
[[nodiscard]] inline cost::fixed step_lower_bound(std::span<const seq::seq_desc> seqs,
                                                  const strategy_config& cfg) {
  // The per-row constant c is left out of the total: packing shares it, so counting it per sequence
  // would overstate what a rank must do.
  double total_units = 0.0;
  std::int64_t largest = 0;
  for (const auto& s : seqs) {
    total_units += cfg.model.llm.work(s.length);
    if (s.length <= cfg.hdp.capacity)
      largest = std::max(largest, cfg.model.pack_time(std::span<const std::int64_t>(&s.length, 1)).ticks);
  }
  const std::int64_t total = cost::fixed::from_units(total_units).ticks;
  // A long sequence runs on some ring; whatever its degree, the step cannot be shorter than its
  // per-rank ring time at the best degree (exact scan: the bound must never overstate).
  for (const auto& s : seqs) {
    if (s.length <= cfg.hdp.capacity) continue;
    const auto dmax = std::max<std::int64_t>(1, std::min<std::int64_t>(cfg.ranks, s.length / 2));
    std::int64_t best = cfg.model.ring_time(s.length, 1, false).ticks;
    for (std::int64_t d = 2; d <= dmax; ++d)
      best = std::min(
          best, cfg.model.ring_time(s.length, static_cast<int>(d), cfg.model.spans_nodes(static_cast<int>(d)))
                    .ticks);
    largest = std::max(largest, best);
  }
  const std::int64_t lb = std::max((total + cfg.ranks - 1) / cfg.ranks, largest);
  return cost::fixed::from_ticks(lb / cfg.model.pp_stages);
}

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
