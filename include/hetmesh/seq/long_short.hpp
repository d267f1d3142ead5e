// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: long-short sequence parallelism for encoder items (MegaScale-Omni, arXiv 2605.08962).
// Within one encoder micro-batch, a short item (an image, an audio clip) runs whole on one rank,
// packed with others (varlen, block-diagonal); a long item (a long video) is split across an
// aligned intra-node group by Ulysses, so the group's all-to-all stays on NVLink. Group sizes divide
// the encoder's head count (Ulysses splits heads) and the node size (aligned blocks tile nodes).
// The paper gives no thresholds; an item is long when it exceeds the per-rank memory cap or, by its
// modelled cost, more than beta times the per-rank average (LPT cannot balance such an item).
// Costs are rounded once to cost::fixed when an item is priced; every comparison that decides the plan
// (long or short, group degree, block, rank) is on those integers, so the plan does not depend on the
// last bit of a double (summation order, FMA contraction, a coefficient computed another way).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/exactly_once.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "../cost/encoder.hpp"
#include "../cost/fixed.hpp"
#include "../mesh/topology.hpp"
#include "types.hpp"

namespace hetmesh::seq {

struct long_short_plan;

/// Policy value of long-short SP, and the encoders' partition family (seq::partition_family, role
/// encoder): its type is the choice, its members the parameters. Items are priced by the encoder's compute
/// model (cost/encoder.hpp: per layer a L^2 + b L + c, windowed for audio, times layers x train_factor; any
/// unit, default L); node size and alignment come from the cluster (mesh::topology::devices_per_node).
struct long_short_policy {
  /// The family's name.
  static constexpr std::string_view name = "long-short";
  /// Partitions encoder items (not the LLM's sequences).
  static constexpr partition_role role = partition_role::encoder;
  /// Long items run Ulysses inside a node; no ring attention over ranks.
  static constexpr bool ring_attention = false;
  /// What plan() returns.
  using plan_type = long_short_plan;
  std::int64_t max_tokens_per_rank = 16384;  ///< Mcap: encoder tokens one rank holds
  /// The encoder's attention heads: a group's size must divide them (0: the encoder mixes no tokens across
  /// ranks, any size dividing the node works). No default: -1 (unknown) splits no item, so an item above
  /// max_tokens_per_rank is refused naming it. train::system sets it per encoder from the stage's
  /// attention_heads() (model::encoder_stage requirement 8).
  int heads = -1;
  /// Items shorter than this run whole however their cost compares with the mean (a split then costs more
  /// in all-to-alls than it balances); only memory (max_tokens_per_rank) splits them.
  std::int64_t min_split_tokens = 1024;
  mesh::topology cluster{};     ///< Ulysses groups stay inside one of its nodes
  double balance_factor = 1.0;  ///< beta
  /// The encoder's cost model that prices an item (linear in tokens by default).
  cost::encoder_compute encoder{.layer = {.a = 0.0, .b = 1.0, .c = 0.0}, .layers = 1, .train_factor = 1.0};

  /// Modelled cost of an item of `l` tokens.
  [[nodiscard]] double cost(std::int64_t l) const noexcept { return encoder.item(l); }
  /// plan_long_short(items, ranks, *this): one encoder micro-batch over `ranks` ranks.
  [[nodiscard]] long_short_plan plan(std::span<const seq_desc> items, int ranks) const;
  friend bool operator==(const long_short_policy&, const long_short_policy&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Where one encoder item runs: `degree` ranks from `first_rank` (degree 1: a short item), the
/// contiguous token range each group rank holds before Ulysses' all-to-all, and its modelled cost
/// (rounded once; group rank k carries cost / degree, the first cost % degree ranks one tick more).
struct long_short_assignment {
  seq_desc item;                    ///< the encoder item
  int degree = 1;                   ///< ranks it is split over (1: whole)
  int first_rank = 0;               ///< first rank of its contiguous group
  std::vector<token_range> splits;  ///< token ranges, one per rank
  cost::fixed cost{};               ///< modelled cost

  friend bool operator==(const long_short_assignment&, const long_short_assignment&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The plan: assignments (long items first, by (-length, id); then short ones likewise), each rank's
/// modelled load (exact sums of the assignments' fixed-point shares) and tokens, and the distinct
/// Ulysses groups used (as (first rank, size), sorted).
struct long_short_plan {
  long_short_policy policy{};                ///< the policy it was made with
  int ranks = 0;                             ///< ranks of the encoder group
  std::vector<long_short_assignment> items;  ///< per item, in input order
  std::vector<cost::fixed> load;             ///< per rank, modelled cost
  std::vector<std::int64_t> tokens;          ///< per rank, tokens
  std::vector<std::pair<int, int>> groups;   ///< (first rank, size) of each split group
  /// beta x the mean cost per rank, rounded once: an item costing more (of >= min_split_tokens tokens) is
  /// split for balance; one of more than max_tokens_per_rank tokens for memory (whichever it meets first).
  cost::fixed balance_limit{};

  friend bool operator==(const long_short_plan&, const long_short_plan&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

namespace detail {

/// plan_long_short's degree of a long item of `length` tokens and cost `c`: the smallest allowed Ulysses
/// degree (`sizes`, ascending) meeting memory (`cap` tokens per rank) and balance (`limit` per rank); else
/// the smallest meeting memory; else 0. A group never has more ranks than the item has tokens: every
/// piece holds at least one token, so each member of the group runs (and meets the others in) the item's
/// collectives. O(sizes).
[[nodiscard]] HETMESH_COMPILED int long_item_degree(std::span<const int> sizes, std::int64_t length,
                                                    cost::fixed c, std::int64_t cap, cost::fixed limit);

/// plan_long_short's placement of long item `s` (cost `c`) split over `deg` ranks: on the aligned block
/// of `deg` ranks with the least maximum load that has room for its share (ties: the first block), its
/// contiguous splits and its cost shares (cost / deg each, the first cost % deg ranks one tick more) added
/// to the plan; capacity_error when no block has room. O(ranks).
HETMESH_COMPILED void place_long_item(long_short_plan& plan, const seq_desc& s, cost::fixed c, int deg,
                                      std::int64_t cap)
#if HETMESH_BODIES
{
  const std::int64_t share = ceil_div(s.length, deg);
  int best = -1;
  cost::fixed best_max{};
  for (int start = 0; start + deg <= plan.ranks; start += deg) {
    cost::fixed mx{};
    bool room = true;
    for (int r = start; r < start + deg; ++r) {
      mx = std::max(mx, plan.load[static_cast<std::size_t>(r)]);
      room = room && plan.tokens[static_cast<std::size_t>(r)] + share <= cap;
    }
    if (room && (best < 0 || mx < best_max)) {
      best = start;
      best_max = mx;
    }
  }
  if (best < 0)
    throw_error<capacity_error>(
        "plan_long_short: no aligned group of {} ranks has room for item {} ({} tokens)", deg, s.id,
        s.length);
  long_short_assignment a{s, deg, best, {}, c};
  for (int k = 0; k < deg; ++k) {
    a.splits.push_back({k * s.length / deg, (k + 1) * s.length / deg});
    plan.load[static_cast<std::size_t>(best + k)] +=
        cost::fixed::from_ticks(c.ticks / deg + (k < c.ticks % deg ? 1 : 0));
    plan.tokens[static_cast<std::size_t>(best + k)] += a.splits.back().size();
  }
  plan.groups.emplace_back(best, deg);
  plan.items.push_back(std::move(a));
}
#else
    ;
#endif

}  // namespace detail

/// Plans one encoder micro-batch over `ranks` ranks (nodes of policy.cluster.devices_per_node
/// consecutive ranks). Long items are placed first on the aligned block with the least maximum load that has
/// room; short items by LPT on the least-loaded rank with room (ties: lowest rank). Throws
/// capacity_error when an item needs a group larger than gcd(heads, cluster.devices_per_node) allows or when
/// no rank/block has room; invalid_argument on bad parameters (or a cost that is not finite). Pure;
/// independent of input order; decisions on fixed-point costs (one rounding per item); O(n log n + n *
/// ranks).
[[nodiscard]] HETMESH_COMPILED long_short_plan plan_long_short(std::span<const seq_desc> items, int ranks,
                                                               const long_short_policy& policy)
#if HETMESH_BODIES
{
  const int node = policy.cluster.devices_per_node;
  if (ranks < 1 || node < 1 || policy.max_tokens_per_rank < 1)
    throw_error<invalid_argument>(
        "plan_long_short: ranks {}, devices_per_node {}, max_tokens_per_rank {}; expected all >= 1", ranks,
        node, policy.max_tokens_per_rank);
  if (policy.heads < -1 || policy.min_split_tokens < 0)
    throw_error<invalid_argument>(
        "plan_long_short: heads {}, min_split_tokens {}; expected heads >= 0 (or -1: unknown) and "
        "min_split_tokens >= 0",
        policy.heads, policy.min_split_tokens);
  check_seq_descs(items, "plan_long_short");
  long_short_plan plan;
  plan.policy = policy;
  plan.ranks = ranks;
  plan.load.assign(static_cast<std::size_t>(ranks), cost::fixed::zero());
  plan.tokens.assign(static_cast<std::size_t>(ranks), 0);
  std::vector<seq_desc> sorted(items.begin(), items.end());
  hetmesh::indirect_sort(sorted.begin(), sorted.end(), longer_first);
  std::vector<cost::fixed> price;  // sorted[i]'s cost, rounded once
  price.reserve(sorted.size());
  cost::fixed total{};
  for (const auto& s : sorted) {
    price.push_back(cost::fixed::from_units(policy.cost(s.length)));
    total += price.back();
  }
  // beta x the per-rank mean, rounded once: an item costing more is long (LPT cannot balance it).
  const cost::fixed limit = cost::fixed::from_units(policy.balance_factor * (total.units() / ranks));
  plan.balance_limit = limit;
  // Heads unknown (-1): no group; none (0): any size dividing the node.
  const int gmax = policy.heads < 0 ? 1 : std::gcd(policy.heads, node);
  std::vector<int> sizes;  // allowed Ulysses degrees > 1: divisors of gcd(heads, node size), ascending
  for (int s = 2; s <= gmax; ++s)
    if (gmax % s == 0 && s <= ranks) sizes.push_back(s);
  const auto cap = policy.max_tokens_per_rank;
  std::vector<std::size_t> shorts;  // indices into sorted
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const auto& s = sorted[i];
    const cost::fixed c = price[i];
    const bool over_mem = s.length > cap;
    const bool over_bal = c > limit && ranks > 1 && s.length >= policy.min_split_tokens;
    if (!over_mem && !over_bal) {
      shorts.push_back(i);
      continue;
    }
    // Smallest allowed degree meeting memory and balance; else the smallest meeting memory.
    // A group never has more ranks than the item has tokens: every piece holds at least one token, so each
    // member of the group runs (and meets the others in) the item's collectives.
    const int deg = detail::long_item_degree(sizes, s.length, c, cap, limit);
    if (deg == 0) {
      if (!over_mem) {  // balance wanted a split no allowed group gives: run it whole
        shorts.push_back(i);
        continue;
      }
      if (policy.heads < 0)
        throw_error<capacity_error>(
            "plan_long_short: item {} of {} tokens is above max_tokens_per_rank {} and the encoder's "
            "attention heads are unknown (long_short_policy::heads = -1), so it cannot be split; expected "
            "the heads (train::system reads them from the encoder's attention_heads(): pass the encoders "
            "to plan()) or a larger max_tokens_per_rank",
            s.id, s.length, cap);
      throw_error<capacity_error>(
          "plan_long_short: item {} of {} tokens needs more than {} ranks of {} tokens; Ulysses groups must "
          "divide heads {} and the node size {} (largest allowed {})",
          s.id, s.length, sizes.empty() ? 1 : sizes.back(), cap, policy.heads, node,
          sizes.empty() ? 1 : sizes.back());
    }
    detail::place_long_item(plan, s, c, deg, cap);
  }
  for (const std::size_t i : shorts) {
    const auto& s = sorted[i];
    int best = -1;
    for (int r = 0; r < ranks; ++r) {
      if (plan.tokens[static_cast<std::size_t>(r)] + s.length > cap) continue;
      if (best < 0 || plan.load[static_cast<std::size_t>(r)] < plan.load[static_cast<std::size_t>(best)])
        best = r;
    }
    if (best < 0)
      throw_error<capacity_error>(
          "plan_long_short: no rank has room for item {} ({} tokens, cap {} per rank)", s.id, s.length, cap);
    const cost::fixed c = price[i];
    plan.items.push_back({s, 1, best, {{0, s.length}}, c});
    plan.load[static_cast<std::size_t>(best)] += c;
    plan.tokens[static_cast<std::size_t>(best)] += s.length;
  }
  hetmesh::indirect_sort(plan.groups.begin(), plan.groups.end());
  plan.groups.erase(std::unique(plan.groups.begin(), plan.groups.end()), plan.groups.end());
  if constexpr (assertion_enabled(assertion_level::heavy)) {  // every token of every item exactly once
    std::vector<id_range> expected, assigned;
    for (const auto& s : items) expected.push_back({s.id, 0, s.length});
    for (const auto& a : plan.items)
      for (const auto& r : a.splits) assigned.push_back({a.item.id, r.begin, r.end});
    const std::string v = exactly_once_violation(std::move(expected), std::move(assigned));
    HETMESH_ASSERT_AT(heavy, v.empty(), "plan_long_short: {}", v);
  }
  return plan;
}
#else
    ;
#endif

inline long_short_plan long_short_policy::plan(std::span<const seq_desc> items, int ranks) const {
  return plan_long_short(items, ranks, *this);
}

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::long_short_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::long_short_policy& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(),
                              "long_short_policy{{cap={}, heads={}, min_split={}, node={}, beta={}, {}}}",
                              p.max_tokens_per_rank, p.heads, p.min_split_tokens, p.cluster.devices_per_node,
                              p.balance_factor, p.encoder);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::long_short_assignment> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::long_short_assignment& a, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}->ranks[{},{})", a.item, a.first_rank, a.first_rank + a.degree);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::long_short_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::long_short_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "long_short_plan{{ranks={}, items={}, groups={}, load={}}}", p.ranks,
                              p.items.size(), p.groups, p.load);
  }
};

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED void long_short_policy::hash_append(hasher& h) const {
  append_all(h, max_tokens_per_rank, heads, min_split_tokens, cluster, balance_factor, encoder);
}

HETMESH_COMPILED void long_short_assignment::hash_append(hasher& h) const {
  append_all(h, item, degree, first_rank, splits, cost);
}

HETMESH_COMPILED void long_short_plan::hash_append(hasher& h) const {
  append_all(h, policy, ranks, items, load, tokens, groups, balance_limit);
}

}  // namespace hetmesh::seq

namespace hetmesh::seq::detail {

HETMESH_COMPILED int long_item_degree(std::span<const int> sizes, std::int64_t length, cost::fixed c,
                                      std::int64_t cap, cost::fixed limit) {
  for (int g : sizes)
    if (g <= length && ceil_div(length, g) <= cap && ceil_div(c.ticks, g) <= limit.ticks) return g;
  for (int g : sizes)
    if (g <= length && ceil_div(length, g) <= cap) return g;
  return 0;
}

}  // namespace hetmesh::seq::detail
#endif  // HETMESH_BODIES
