// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: hetmesh's own HDP planner. It keeps ByteScale's data-aware sharding (a long
// sequence gets a ring of D(s) ranks from the offload solver) but balances at the granularity of
// sequences rather than pre-packed micro-batches:
//   1. rings, longest first, each on the D least-loaded ranks (all free at first, so rings land on
//      contiguous rank ranges, inside a node when D allows); a ring's start waits for its last member,
//      and the planner charges that wait, exactly as the step simulator does. A ring that would be the
//      critical path on a lightly loaded pool is widened beyond D(s) (widen_ring);
//   2. short sequences by (-cost, id) onto the least-loaded rank (LPT on modelled time, not tokens);
//   3. each rank packs its short sequences by best-fit decreasing into micro-batches of C tokens.
// Packing after balancing is what brings the step within a few percent of the lower bound: packing
// first (ByteScale) freezes items of equal tokens but very unequal cost. With `group_size` G, ranks
// form locality groups of G consecutive ranks and each sample stays in the group of its loader (the
// decentralized grouped reordering of MegaScale-Omni: a group needs only its own metadata).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../seq/hdp.hpp"
#include "hdp_common.hpp"
#include "model.hpp"
#include "solvers.hpp"

namespace hetmesh::balance {

/// Policy value of the hetmesh planner. group_size 0 = the whole pool is one group.
struct hetmesh_policy {
  int group_size = 0;
  friend constexpr bool operator==(const hetmesh_policy&, const hetmesh_policy&) = default;
  void hash_append(hasher& h) const { append(h, group_size); }
};

namespace detail {

/// max(sum of a l^2 + b l over the group / pool, the longest short sequence): what the group's
/// busiest rank cannot beat.
inline cost::fixed group_lower_bound(std::span<const seq::seq_desc> seqs, std::int64_t capacity, int pool,
                                     const step_model& m) {
  const auto& q = m.llm.layer;
  const double scale = static_cast<double>(m.llm.layers) * m.llm.train_factor;
  double total = 0.0;
  std::int64_t longest_short = 0;
  for (const auto& s : seqs) {
    const auto x = static_cast<double>(s.length);
    total += scale * (q.a * x + q.b) * x;
    if (s.length <= capacity) longest_short = std::max(longest_short, s.length);
  }
  const auto spread = cost::fixed::from_units(total / static_cast<double>(pool));
  return std::max(spread, m.pack_time(std::span<const std::int64_t>(&longest_short, 1)));
}

/// Widens a ring beyond the D(s) that memory needs when its per-rank time would exceed `target` (the
/// group's lower bound) and spare ranks exist: D(s) is the fewest ranks that can *hold* the sequence,
/// but on a lightly loaded pool the ring is then the critical path. Picks the smallest D' >= D(s)
/// whose ring time is <= target, else the D' (up to the group size and length / 2) with the least
/// ring time, trying geometric steps. A widened ring needs no offloading once D' reaches the ranks
/// the sequence needs without it.
inline void widen_ring(seq::hdp_item& it, const seq::hdp_policy& hdp, int pool, const step_model& m,
                       cost::fixed target) {
  const std::int64_t s = it.seqs.front().length;
  const int d0 = it.degree;
  const int dmax = static_cast<int>(std::min<std::int64_t>(pool, s / 2));
  auto time_at = [&](int d) { return m.ring_time(s, d, d > m.net.ranks_per_node); };
  if (d0 >= dmax || time_at(d0) <= target) return;
  int best = d0;
  cost::fixed best_t = time_at(d0);
  for (int d = d0 + 1; d <= dmax; d = std::max(d + 1, d + d / 16)) {
    const cost::fixed t = time_at(d);
    if (t < best_t) {
      best = d;
      best_t = t;
    }
    if (t <= target) break;
  }
  if (best == d0) return;
  it.degree = best;
  it.offload.ranks = best;
  if (best >= seq::offload_ranks(s, hdp.capacity, hdp.model, 0, hdp.offload.ratio_steps))
    it.offload.ratio_k = 0;
}

/// Plans one group of `pool` ranks; appends items and placements (ranks offset by `base`).
inline void plan_group(std::span<const seq::seq_desc> seqs, const seq::hdp_policy& hdp, int pool, int base,
                       const step_model& m, std::vector<seq::hdp_item>& items,
                       std::vector<seq::hdp_placement>& placement, std::int64_t& counter) {
  std::vector<seq::seq_desc> longs, shorts;
  for (const auto& s : seqs) {
    if (s.length == 0) continue;
    (s.length <= hdp.capacity ? shorts : longs).push_back(s);
  }
  load_set loads(pool);
  // 1. Rings: hdp_shard gives D and the offload ratio of each long sequence, longest first; a ring
  //    whose time would exceed the group's lower bound is widened (see widen_ring).
  if (!longs.empty()) {
    auto sh = seq::hdp_shard(longs, hdp, pool);
    const cost::fixed target = group_lower_bound(seqs, hdp.capacity, pool, m);
    for (auto& it : sh.items) {
      widen_ring(it, hdp, pool, m, target);
      std::vector<int> ring = loads.least(it.degree);
      std::sort(ring.begin(), ring.end());
      std::vector<int> global(ring);
      for (int& r : global) r += base;
      loads.run(ring, hdp_item_time(it, m, global));
      placement.push_back(seq::hdp_placement{std::move(global), counter++});
      items.push_back(std::move(it));
    }
  }
  // 2. Short sequences: LPT on modelled time. A sequence is charged its share l / C of the per-row
  //    constant, not all of it: rows are nearly full after best-fit, so c is shared by their members.
  std::vector<std::int64_t> cost(shorts.size());
  const auto& q = m.llm.layer;
  const double scale = static_cast<double>(m.llm.layers) * m.llm.train_factor;
  for (std::size_t i = 0; i < shorts.size(); ++i) {
    const auto x = static_cast<double>(shorts[i].length);
    cost[i] =
        cost::fixed::from_units(scale * ((q.a * x + q.b) * x + q.c * x / static_cast<double>(hdp.capacity)))
            .ticks;
  }
  std::vector<std::size_t> order(shorts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return cost[a] != cost[b] ? cost[a] > cost[b] : shorts[a].id < shorts[b].id;
  });
  std::vector<std::vector<std::size_t>> on(static_cast<std::size_t>(pool));
  for (std::size_t i : order) {
    const int r = loads.least(1).front();
    const int ring[1] = {r};
    loads.run(ring, cost::fixed::from_ticks(cost[i]));
    on[static_cast<std::size_t>(r)].push_back(i);
  }
  // 3. Per rank, pack by best-fit decreasing on tokens; micro-batches run after every ring.
  for (int r = 0; r < pool; ++r) {
    const auto& mine = on[static_cast<std::size_t>(r)];
    if (mine.empty()) continue;
    // Sort by (-length, id) first: BFD then sees an order that does not depend on the input order.
    std::vector<std::size_t> sorted(mine);
    std::sort(sorted.begin(), sorted.end(),
              [&](std::size_t a, std::size_t b) { return seq::longer_first(shorts[a], shorts[b]); });
    std::vector<std::int64_t> lens;
    lens.reserve(sorted.size());
    for (std::size_t i : sorted) lens.push_back(shorts[i].length);
    const assignment bins = best_fit_decreasing(lens, hdp.capacity);
    std::vector<seq::hdp_item> packs(static_cast<std::size_t>(bins.bins()));
    for (std::size_t k = 0; k < sorted.size(); ++k) {
      auto& p = packs[static_cast<std::size_t>(bins.bin_of[k])];
      p.seqs.push_back(shorts[sorted[k]]);
      p.tokens += shorts[sorted[k]].length;
    }
    for (auto& p : packs) {
      p.packed = true;
      p.degree = 1;
      p.offload.ratio_steps = hdp.offload.ratio_steps;
      p.offload.length = p.tokens;
      placement.push_back(seq::hdp_placement{{base + r}, counter++});
      items.push_back(std::move(p));
    }
  }
}

}  // namespace detail

/// Plans one step over a pool of `pool` ranks. `owner[i]` is the loader rank that read seqs[i]
/// (needed when group_size > 0 and < pool: a sample stays in its loader's group; empty = one group).
/// Pre: pool >= 1; 0 <= group_size, pool % group_size == 0 when set; unique ids; lengths >= 0; every
/// long sequence's D <= group size (capacity_error naming it otherwise). Post: every sequence in
/// exactly one item; packs <= C tokens; rings of D distinct ranks inside one group; order keys global,
/// so the plan is deadlock-free. Pure; deterministic; independent of the order of `seqs` (with `owner`
/// permuted alike). O(n log n + n log pool). Not collective: every rank of a group computes it from the
/// same gathered metadata.
[[nodiscard]] inline seq::hdp_plan plan_hetmesh(std::span<const seq::seq_desc> seqs,
                                                const seq::hdp_policy& hdp, int pool, const step_model& m,
                                                const hetmesh_policy& policy = {},
                                                std::span<const int> owner = {}) {
  if (pool < 1) throw_error<invalid_argument>("balance::plan_hetmesh: pool = {}; expected >= 1", pool);
  if (hdp.capacity < 1)
    throw_error<invalid_argument>("balance::plan_hetmesh: capacity = {}; expected >= 1", hdp.capacity);
  seq::check_seq_descs(seqs, "balance::plan_hetmesh");
  const int g = policy.group_size == 0 ? pool : policy.group_size;
  if (g < 1 || pool % g != 0)
    throw_error<invalid_argument>(
        "balance::plan_hetmesh: group_size = {} for a pool of {}; expected a divisor of the pool",
        policy.group_size, pool);
  const int groups = pool / g;
  if (groups > 1 && owner.size() != seqs.size())
    throw_error<invalid_argument>(
        "balance::plan_hetmesh: {} owners for {} sequences with {} groups; expected one loader "
        "rank per sequence",
        owner.size(), seqs.size(), groups);
  std::vector<std::vector<seq::seq_desc>> per_group(static_cast<std::size_t>(groups));
  seq::hdp_sharding sh;
  sh.policy = hdp;
  sh.pool = pool;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    int grp = 0;
    if (groups > 1) {
      if (owner[i] < 0 || owner[i] >= pool)
        throw_error<invalid_argument>(
            "balance::plan_hetmesh: sequence {} has loader rank {}; expected [0, {})", seqs[i].id, owner[i],
            pool);
      grp = owner[i] / g;
    }
    per_group[static_cast<std::size_t>(grp)].push_back(seqs[i]);
    sh.global_tokens += seqs[i].length;
  }
  std::vector<seq::hdp_placement> placement;
  std::int64_t counter = 0;
  for (int k = 0; k < groups; ++k) {
    auto& mine = per_group[static_cast<std::size_t>(k)];
    std::sort(mine.begin(), mine.end(), seq::longer_first);
    try {
      detail::plan_group(mine, hdp, g, k * g, m, sh.items, placement, counter);
    } catch (error& e) {
      e.add_context(fmt::format("balance::plan_hetmesh: group {} (ranks [{}, {}))", k, k * g, (k + 1) * g));
      throw;
    }
  }
  for (std::size_t i = 0; i < sh.items.size(); ++i) sh.items[i].index = static_cast<std::int64_t>(i);
  return seq::hdp_assemble(std::move(sh), std::move(placement));
}

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::hetmesh_policy> : hetmesh::empty_spec_formatter {
  auto format(const hetmesh::balance::hetmesh_policy& p, fmt::format_context& ctx) const
      -> decltype(ctx.out()) {
    return fmt::format_to(ctx.out(), "hetmesh_policy(group_size={})", p.group_size);
  }
};
