// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: the per-rank plans of the five balance strategies that strategies.hpp prices side
// by side. A plan is a list of work items (whole sequences packed on one rank, or a sequence split
// zigzag over a ring), each with the task that prices it; the strategies are described there, and
// chosen by type (the balancer families of balancers.hpp, each holding its own parameters).
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // the formatters print rings (vectors)

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/random.hpp"
#include "../seq/hdp.hpp"
#include "bytescale.hpp"
#include "hdp_common.hpp"
#include "model.hpp"
#include "planner.hpp"

namespace hetmesh::balance {

/// What every balancer needs besides the batch and its own parameters: the pool, HDP's capacity and
/// offloading, and the step model that prices every task. (A balancer's own parameters, such as
/// ByteScale's slack or the gap-filling group size, live in the balancer's type: balancers.hpp.)
struct strategy_config {
  int ranks = 256;        ///< the pool (dp x cp positions); the loader of sample i is rank i % ranks
  seq::hdp_policy hdp{};  ///< capacity C per rank and offloading (HDP strategies)
  step_model model{};     ///< prices every task
  /// Hashes every parameter, so that a plan's hash names the configuration it came from.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// One unit of work: whole sequences packed on one rank (a ring of one), or one sequence (for
/// static_dp_cp, one packed row) split zigzag over a ring: ring position p holds chunks p and 2D-1-p
/// of every sequence in it (seq::hdp_ranges).
struct work_item {
  std::vector<int> ring;            ///< the pool ranks that run it
  std::int64_t order = 0;           ///< global order key: every rank runs its items by (order, item)
  std::vector<seq::seq_desc> seqs;  ///< the sequences it holds
  double offload_ratio = 0.0;       ///< share of activations offloaded (HDP rings with offloading)

  /// Tokens of the item: the sum of its sequences' lengths. O(seqs).
  [[nodiscard]] HETMESH_COMPILED std::int64_t tokens() const;
};

/// One strategy's plan for one batch: `tasks[i]` prices `items[i]` (same ranks and order key).
struct strategy_plan {
  std::vector<work_item> items;  ///< the work, in canonical order
  std::vector<task> tasks;       ///< tasks[i] prices items[i]
};

namespace detail {

HETMESH_COMPILED void push_item(strategy_plan& p, std::vector<int> ring, std::int64_t order,
                                std::vector<seq::seq_desc> seqs, double offload_ratio, cost::fixed duration);

HETMESH_COMPILED void check_ranks(const strategy_config& cfg, std::string_view who);

HETMESH_COMPILED strategy_plan random_plan(std::span<const seq::seq_desc> seqs, const strategy_config& cfg,
                                           std::uint64_t seed);

HETMESH_COMPILED strategy_plan token_count_plan(std::span<const seq::seq_desc> seqs,
                                                const strategy_config& cfg);

HETMESH_COMPILED strategy_plan static_dp_cp_plan(std::span<const seq::seq_desc> seqs,
                                                 const strategy_config& cfg, std::int64_t context_length);

HETMESH_COMPILED strategy_plan hdp_plan_items(const seq::hdp_plan& plan, const step_model& m);

}  // namespace detail

/// Modelled ring-attention traffic of `plan`'s step, bytes summed over all ranks: per layer, a ring of
/// D ranks passes every KV block D-1 hops forward, and KV plus its gradient back (3x forward); items on
/// one rank move nothing. Gradient reduction, the same for every strategy, is left out.
/// Pure; O(items + sequences). Not collective.
[[nodiscard]] HETMESH_COMPILED double ring_comm_bytes(const strategy_plan& plan, const step_model& m);

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::strategy_config> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::strategy_config& c, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "strategy_config(ranks={}, {}, {})", c.ranks, c.hdp, c.model);
  }
};
template <>
struct fmt::formatter<hetmesh::balance::work_item> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::work_item& w, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "work_item(ring={}, order={}, {} seqs, {} tokens, offload={:.2f})",
                              w.ring, w.order, w.seqs.size(), w.tokens(), w.offload_ratio);
  }
};
template <>
struct fmt::formatter<hetmesh::balance::strategy_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::strategy_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    std::int64_t tokens = 0;
    for (const auto& w : p.items) tokens += w.tokens();
    return hetmesh::format_to(ctx.out(), "strategy_plan({} items, {} tokens)", p.items.size(), tokens);
  }
};

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED void strategy_config::hash_append(hasher& h) const { append_all(h, ranks, hdp, model); }

HETMESH_COMPILED std::int64_t work_item::tokens() const {
  std::int64_t t = 0;
  for (const auto& s : seqs) t += s.length;
  return t;
}

}  // namespace hetmesh::balance

namespace hetmesh::balance::detail {

HETMESH_COMPILED void push_item(strategy_plan& p, std::vector<int> ring, std::int64_t order,
                                std::vector<seq::seq_desc> seqs, double offload_ratio, cost::fixed duration) {
  p.tasks.push_back(task{ring, order, duration});
  p.items.push_back(work_item{std::move(ring), order, std::move(seqs), offload_ratio});
}

HETMESH_COMPILED void check_ranks(const strategy_config& cfg, std::string_view who) {
  if (cfg.ranks < 1) throw_error<invalid_argument>("balance::{}: ranks = {}; expected >= 1", who, cfg.ranks);
}

HETMESH_COMPILED strategy_plan random_plan(std::span<const seq::seq_desc> seqs, const strategy_config& cfg,
                                           std::uint64_t seed) {
  const auto sh = seq::hdp_shard(seqs, cfg.hdp, cfg.ranks);
  rng g(seed);
  std::vector<int> ranks(static_cast<std::size_t>(cfg.ranks));
  for (int r = 0; r < cfg.ranks; ++r) ranks[static_cast<std::size_t>(r)] = r;
  strategy_plan out;
  for (std::size_t i = 0; i < sh.items.size(); ++i) {
    const auto& it = sh.items[i];
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
    push_item(out, std::move(ring), static_cast<std::int64_t>(i), it.seqs, it.offload.ratio(), d);
  }
  return out;
}

HETMESH_COMPILED strategy_plan token_count_plan(std::span<const seq::seq_desc> seqs,
                                                const strategy_config& cfg) {
  const auto sh = seq::hdp_shard(seqs, cfg.hdp, cfg.ranks);
  // Items are in canonical order (rings longest first, then packs), so this is LPT on tokens per rank.
  std::set<std::pair<std::int64_t, int>> load;
  for (int r = 0; r < cfg.ranks; ++r) load.emplace(0, r);
  strategy_plan out;
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
    push_item(out, std::move(ring), static_cast<std::int64_t>(i), it.seqs, it.offload.ratio(), d);
  }
  return out;
}

HETMESH_COMPILED strategy_plan static_dp_cp_plan(std::span<const seq::seq_desc> seqs,
                                                 const strategy_config& cfg, std::int64_t context_length) {
  std::int64_t longest = 0;
  for (const auto& s : seqs) longest = std::max(longest, s.length);
  const std::int64_t context = std::max({context_length, longest, cfg.hdp.capacity});
  const std::int64_t cp = (context + cfg.hdp.capacity - 1) / cfg.hdp.capacity;
  if (cp > cfg.ranks)
    throw_error<capacity_error>(
        "static_dp_cp: context {} needs cp = {} ranks of capacity {}; the pool has {}", context, cp,
        cfg.hdp.capacity, cfg.ranks);
  const std::int64_t dp = cfg.ranks / cp;
  const std::int64_t row_cap = cp * cfg.hdp.capacity;
  // Megatron-style packing: arrival order, next-fit into rows of cp x C tokens.
  std::vector<std::vector<seq::seq_desc>> rows(1);
  std::int64_t fill = 0;
  for (const auto& s : seqs) {
    if (s.length == 0) continue;
    if (fill + s.length > row_cap && !rows.back().empty()) {
      rows.emplace_back();
      fill = 0;
    }
    rows.back().push_back(s);
    fill += s.length;
  }
  if (rows.back().empty()) rows.pop_back();
  strategy_plan out;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const auto grp = static_cast<std::int64_t>(k) % dp;
    std::vector<int> ring;
    for (std::int64_t j = 0; j < cp; ++j) ring.push_back(static_cast<int>(grp * cp + j));
    std::vector<std::int64_t> lengths;
    for (const auto& s : rows[k]) lengths.push_back(s.length);
    const auto d = cfg.model.ring_row_time(lengths, static_cast<int>(cp), cfg.model.spans_nodes(ring));
    push_item(out, std::move(ring), static_cast<std::int64_t>(k), std::move(rows[k]), 0.0, d);
  }
  return out;
}

HETMESH_COMPILED strategy_plan hdp_plan_items(const seq::hdp_plan& plan, const step_model& m) {
  strategy_plan out;
  out.tasks = tasks_of(plan, m);
  for (std::size_t i = 0; i < plan.sharding.items.size(); ++i) {
    const auto& it = plan.sharding.items[i];
    out.items.push_back({plan.placement[i].ring, plan.placement[i].order, it.seqs, it.offload.ratio()});
  }
  return out;
}

}  // namespace hetmesh::balance::detail

namespace hetmesh::balance {

HETMESH_COMPILED double ring_comm_bytes(const strategy_plan& plan, const step_model& m) {
  double total = 0.0;
  for (const auto& it : plan.items) {
    const auto d = static_cast<double>(it.ring.size());
    if (d <= 1.0) continue;
    total += 3.0 * static_cast<double>(m.llm.layers) * (d - 1.0) * m.kv_bytes_per_token *
             static_cast<double>(it.tokens());
  }
  return total;
}

}  // namespace hetmesh::balance
#endif  // HETMESH_BODIES
