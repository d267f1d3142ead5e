// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: five ways to spread one global batch over a pool of ranks, behind one call so a
// tool (hetmesh-plan compare) and the benchmarks can set them side by side:
//   random         HDP work items (packs, rings) on random ranks
//   token_count    HDP work items balanced by token count (LPT on tokens)
//   static_dp_cp   a fixed dp x cp mesh, cp = ceil(context / C); sequences packed Megatron-style (in
//                  arrival order, next-fit) into rows of cp x C tokens, rows dealt round-robin to the
//                  dp groups; every row runs on its whole cp ring (THD zigzag)
//   bytescale_hdp  ByteScale: data-aware sharding + Alg. 2 balance scheduler (bytescale.hpp)
//   hetmesh        ours: rings first, LPT on modelled time per sequence, pack per rank; with locality
//                  groups when hetmesh.group_size is set (planner.hpp)
// Every strategy is priced by the same step_model and the same simulator; the times are modelled.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/random.hpp"
#include "../seq/hdp.hpp"
#include "bytescale.hpp"
#include "hdp_common.hpp"
#include "model.hpp"
#include "planner.hpp"

namespace hetmesh::balance {

/// The names run_strategy accepts, in the order compare_strategies reports them.
inline constexpr std::array<std::string_view, 5> strategy_names{"random", "token_count", "static_dp_cp",
                                                                "bytescale_hdp", "hetmesh"};

/// Everything the strategies need besides the batch.
struct strategy_config {
  int ranks = 256;               ///< the pool (dp x cp positions)
  seq::hdp_policy hdp{};         ///< capacity C per rank and offloading (HDP strategies)
  step_model model{};            ///< prices every task
  bytescale_policy bytescale{};  ///< mode is taken from model.pp_stages
  hetmesh_policy hetmesh{};      ///< group_size for grouped reordering
  std::uint64_t seed = 1;        ///< random placement; loader of sample i is rank i % ranks
  std::int64_t context = 0;      ///< static_dp_cp: the context length (0: the longest sequence)
  void hash_append(hasher& h) const { append_all(h, ranks, hdp, model, bytescale, hetmesh, seed, context); }
};

/// One strategy's modelled outcome.
struct strategy_result {
  std::string name;
  cost::fixed step{};         ///< modelled step time
  double imbalance = 0.0;     ///< max / mean of per-rank busy time
  cost::fixed lower_bound{};  ///< max(total / N, largest short sequence), per pipeline stage
  double ratio_to_lower_bound = 0.0;
  std::int64_t tasks = 0;  ///< micro-batches (a ring counts once)
  std::int64_t max_tasks_per_rank = 0;
};

/// max(sum of whole-sequence times (without the per-row constant) / ranks, the largest sequence of <= C
/// tokens (which no HDP strategy splits), every longer sequence's ring time at its best degree),
/// divided by pp_stages. Under the step model, no strategy that keeps short sequences whole can beat
/// it. O(n + long sequences x ranks).
[[nodiscard]] inline cost::fixed step_lower_bound(std::span<const seq::seq_desc> seqs,
                                                  const strategy_config& cfg) {
  // The per-row constant c is left out of the total: packing shares it, so counting it per sequence
  // would overstate what a rank must do.
  const auto& q = cfg.model.llm.layer;
  const double scale = static_cast<double>(cfg.model.llm.layers) * cfg.model.llm.train_factor;
  double total_units = 0.0;
  std::int64_t largest = 0;
  for (const auto& s : seqs) {
    const auto x = static_cast<double>(s.length);
    total_units += scale * (q.a * x + q.b) * x;
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
          best, cfg.model.ring_time(s.length, static_cast<int>(d), d > cfg.model.net.ranks_per_node).ticks);
    largest = std::max(largest, best);
  }
  const std::int64_t lb = std::max((total + cfg.ranks - 1) / cfg.ranks, largest);
  return cost::fixed::from_ticks(lb / cfg.model.pp_stages);
}

namespace detail {

inline std::vector<task> random_tasks(std::span<const seq::seq_desc> seqs, const strategy_config& cfg) {
  const auto plan_sh = seq::hdp_shard(seqs, cfg.hdp, cfg.ranks);
  rng g(cfg.seed);
  std::vector<int> ranks(static_cast<std::size_t>(cfg.ranks));
  for (int r = 0; r < cfg.ranks; ++r) ranks[static_cast<std::size_t>(r)] = r;
  std::vector<task> out;
  for (std::size_t i = 0; i < plan_sh.items.size(); ++i) {
    const auto& it = plan_sh.items[i];
    // Partial Fisher-Yates (from whatever permutation the last item left): the first D entries are a
    // uniform random D-subset.
    for (int k = 0; k < it.degree; ++k) {
      const auto j = static_cast<std::size_t>(k) +
                     static_cast<std::size_t>(g.below(static_cast<std::uint64_t>(cfg.ranks - k)));
      std::swap(ranks[static_cast<std::size_t>(k)], ranks[j]);
    }
    std::vector<int> ring(ranks.begin(), ranks.begin() + it.degree);
    std::sort(ring.begin(), ring.end());
    const auto d = hdp_item_time(it, cfg.model, ring);
    out.push_back(task{std::move(ring), static_cast<std::int64_t>(i), d});
  }
  return out;
}

inline std::vector<task> token_count_tasks(std::span<const seq::seq_desc> seqs, const strategy_config& cfg) {
  const auto sh = seq::hdp_shard(seqs, cfg.hdp, cfg.ranks);
  // Items are in canonical order (rings longest first, then packs), so this is LPT on tokens per rank.
  std::set<std::pair<std::int64_t, int>> load;
  for (int r = 0; r < cfg.ranks; ++r) load.emplace(0, r);
  std::vector<task> out;
  for (std::size_t i = 0; i < sh.items.size(); ++i) {
    const auto& it = sh.items[i];
    std::vector<std::pair<std::int64_t, int>> picked(load.begin(), std::next(load.begin(), it.degree));
    std::vector<int> ring;
    for (const auto& [l, r] : picked) {
      load.erase({l, r});
      load.emplace(l + it.tokens / it.degree, r);
      ring.push_back(r);
    }
    std::sort(ring.begin(), ring.end());
    const auto d = hdp_item_time(it, cfg.model, ring);
    out.push_back(task{std::move(ring), static_cast<std::int64_t>(i), d});
  }
  return out;
}

inline std::vector<task> static_dp_cp_tasks(std::span<const seq::seq_desc> seqs, const strategy_config& cfg) {
  std::int64_t longest = 0;
  for (const auto& s : seqs) longest = std::max(longest, s.length);
  const std::int64_t context = std::max({cfg.context, longest, cfg.hdp.capacity});
  const std::int64_t cp = (context + cfg.hdp.capacity - 1) / cfg.hdp.capacity;
  if (cp > cfg.ranks)
    throw_error<capacity_error>(
        "static_dp_cp: context {} needs cp = {} ranks of capacity {}; the pool has {}", context, cp,
        cfg.hdp.capacity, cfg.ranks);
  const std::int64_t dp = cfg.ranks / cp;
  const std::int64_t row_cap = cp * cfg.hdp.capacity;
  // Megatron-style packing: arrival order, next-fit into rows of cp x C tokens.
  std::vector<std::vector<std::int64_t>> rows(1);
  std::int64_t fill = 0;
  for (const auto& s : seqs) {
    if (s.length == 0) continue;
    if (fill + s.length > row_cap && !rows.back().empty()) {
      rows.emplace_back();
      fill = 0;
    }
    rows.back().push_back(s.length);
    fill += s.length;
  }
  if (rows.back().empty()) rows.pop_back();
  std::vector<task> out;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const auto grp = static_cast<std::int64_t>(k) % dp;
    std::vector<int> ring;
    for (std::int64_t j = 0; j < cp; ++j) ring.push_back(static_cast<int>(grp * cp + j));
    const auto d = cfg.model.ring_row_time(rows[k], static_cast<int>(cp), cfg.model.spans_nodes(ring));
    out.push_back(task{std::move(ring), static_cast<std::int64_t>(k), d});
  }
  return out;
}

}  // namespace detail

/// Runs strategy `name` (one of strategy_names) on `seqs` and prices it with the step simulator.
/// Pre: cfg.ranks >= 1; valid sequences. Post: step >= lower_bound for the HDP strategies. Pure;
/// deterministic (random uses cfg.seed). Cost: that strategy's planning plus O(tasks log tasks).
[[nodiscard]] inline strategy_result run_strategy(std::string_view name, std::span<const seq::seq_desc> seqs,
                                                  const strategy_config& cfg) {
  if (cfg.ranks < 1)
    throw_error<invalid_argument>("balance::run_strategy: ranks = {}; expected >= 1", cfg.ranks);
  std::vector<task> tasks;
  if (name == "random") {
    tasks = detail::random_tasks(seqs, cfg);
  } else if (name == "token_count") {
    tasks = detail::token_count_tasks(seqs, cfg);
  } else if (name == "static_dp_cp") {
    tasks = detail::static_dp_cp_tasks(seqs, cfg);
  } else if (name == "bytescale_hdp") {
    bytescale_policy p = cfg.bytescale;
    p.mode = cfg.model.pp_stages > 1 ? hdp_balance_mode::pp : hdp_balance_mode::dp;
    tasks = tasks_of(plan_bytescale(seqs, cfg.hdp, cfg.ranks, cfg.model, p), cfg.model);
  } else if (name == "hetmesh") {
    std::vector<int> owner(seqs.size());
    for (std::size_t i = 0; i < owner.size(); ++i)
      owner[i] = static_cast<int>(i % static_cast<std::size_t>(cfg.ranks));
    tasks = tasks_of(plan_hetmesh(seqs, cfg.hdp, cfg.ranks, cfg.model, cfg.hetmesh, owner), cfg.model);
  } else {
    throw_error<invalid_argument>("balance::run_strategy: unknown strategy '{}'; expected one of {}", name,
                                  fmt::join(strategy_names, ", "));
  }
  const timeline tl = simulate(cfg.ranks, tasks, cfg.model.pp_stages);
  strategy_result r;
  r.name = std::string(name);
  r.step = tl.step;
  r.imbalance = tl.imbalance();
  r.lower_bound = step_lower_bound(seqs, cfg);
  r.ratio_to_lower_bound = r.lower_bound.ticks > 0 ? tl.step.units() / r.lower_bound.units() : 0.0;
  r.tasks = static_cast<std::int64_t>(tasks.size());
  for (auto k : tl.tasks_on) r.max_tasks_per_rank = std::max(r.max_tasks_per_rank, k);
  return r;
}

/// Every strategy of `names` (default: all five) on the same batch, side by side. Same contract as
/// run_strategy.
[[nodiscard]] inline std::vector<strategy_result> compare_strategies(
    std::span<const seq::seq_desc> seqs, const strategy_config& cfg,
    std::span<const std::string_view> names = strategy_names) {
  std::vector<strategy_result> out;
  out.reserve(names.size());
  for (auto n : names) out.push_back(run_strategy(n, seqs, cfg));
  return out;
}

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::strategy_result> : hetmesh::empty_spec_formatter {
  auto format(const hetmesh::balance::strategy_result& r, fmt::format_context& ctx) const
      -> decltype(ctx.out()) {
    return fmt::format_to(ctx.out(),
                          "{}: step={} (modelled), imbalance={:.3f}, lower_bound={}, ratio={:.3f}, tasks={}",
                          r.name, r.step, r.imbalance, r.lower_bound, r.ratio_to_lower_bound, r.tasks);
  }
};

template <>
struct fmt::formatter<hetmesh::balance::strategy_config> : hetmesh::empty_spec_formatter {
  auto format(const hetmesh::balance::strategy_config& c, fmt::format_context& ctx) const
      -> decltype(ctx.out()) {
    return fmt::format_to(ctx.out(), "strategy_config(ranks={}, {}, {}, {}, {}, seed={}, context={})",
                          c.ranks, c.hdp, c.model, c.bytescale, c.hetmesh, c.seed, c.context);
  }
};
