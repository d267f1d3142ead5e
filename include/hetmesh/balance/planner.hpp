// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: the gap-filling HDP planner (strategy "gap_filling_hdp"). It keeps ByteScale's
// data-aware sharding (a long sequence gets a ring of D(s) ranks from the offload solver) but balances at the
// granularity of sequences rather than pre-packed micro-batches:
//   1. rings, longest first, each on the D least-loaded ranks (all free at first, so rings land on
//      contiguous rank ranges, inside a node when D allows); a ring's start waits for its last member,
//      and the planner charges that wait, exactly as the step simulator does. A ring that would be the
//      critical path on a lightly loaded pool is widened beyond D(s) (widen_ring);
//   2. short sequences by (-cost, id): first into the gaps that rings leave (a ring member free before
//      the ring's last member waits; the tightest gap that still holds the sequence takes it, and its
//      rows run before the ring), else onto the least-loaded rank (LPT on modelled time, not tokens);
//   3. each gap, and each rank's remaining short sequences, packed by best-fit decreasing into
//      micro-batches of C tokens.
// Packing after balancing is what brings the step within a few percent of the lower bound: packing
// first (ByteScale) freezes items of equal tokens but very unequal cost. With `group_size` G, ranks
// form locality groups of G consecutive ranks and each sample stays in the group of its loader (the
// decentralized grouped reordering of MegaScale-Omni: a group needs only its own metadata).
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "../seq/hdp.hpp"
#include "hdp_common.hpp"
#include "model.hpp"
#include "solvers.hpp"

namespace hetmesh::balance {

/// Policy value of the gap-filling HDP planner. group_size 0 = the whole pool is one group.
struct gap_filling_policy {
  int group_size = 0;  ///< ranks per group; 0: the whole pool
  friend constexpr bool operator==(const gap_filling_policy&, const gap_filling_policy&) = default;
  void hash_append(hasher& h) const { append(h, group_size); }
};

namespace detail {

/// max(sum of the sequences' work (cost::llm_compute::work) over the group / pool, the longest short
/// sequence): what the group's
/// busiest rank cannot beat.
inline cost::fixed group_lower_bound(std::span<const seq::seq_desc> seqs, std::int64_t capacity, int pool,
                                     const step_model& m) {
  double total = 0.0;
  std::int64_t longest_short = 0;
  for (const auto& s : seqs) {
    total += m.llm.work(s.length);
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
  auto time_at = [&](int d) { return m.ring_time(s, d, m.spans_nodes(d)); };
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

/// Packs `idx` (indices into `shorts`) by best-fit decreasing on tokens into rows on rank `rank`,
/// appending items and placements in order. Sorted by (-length, id) first, so the rows do not depend on
/// the input order.
HETMESH_COMPILED void emit_rows(std::span<const std::size_t> idx, std::span<const seq::seq_desc> shorts,
                                int rank, const seq::hdp_policy& hdp, std::vector<seq::hdp_item>& items,
                                std::vector<seq::hdp_placement>& placement, std::int64_t& counter)
#if HETMESH_BODIES
{
  if (idx.empty()) return;
  std::vector<std::size_t> sorted(idx.begin(), idx.end());
  hetmesh::indirect_sort(sorted.begin(), sorted.end(), [&](std::size_t a, std::size_t b) {
    return seq::longer_first(shorts[a], shorts[b]);
  });
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
    placement.push_back(seq::hdp_placement{{rank}, counter++});
    items.push_back(std::move(p));
  }
}
#else
    ;
#endif

/// Plans one group of `pool` ranks; appends items and placements (ranks offset by `base`).
HETMESH_COMPILED void plan_group(std::span<const seq::seq_desc> seqs, const seq::hdp_policy& hdp, int pool,
                                 int base, const step_model& m, std::vector<seq::hdp_item>& items,
                                 std::vector<seq::hdp_placement>& placement, std::int64_t& counter)
#if HETMESH_BODIES
{
  std::vector<seq::seq_desc> longs, shorts;
  for (const auto& s : seqs) {
    if (s.length == 0) continue;
    (s.length <= hdp.capacity ? shorts : longs).push_back(s);
  }
  load_set loads(pool);
  // 1. Rings: hdp_shard gives D and the offload ratio of each long sequence, longest first; a ring
  //    whose time would exceed the group's lower bound is widened (see widen_ring). A member that is
  //    free before the ring starts leaves a gap (it waits for the last member): recorded, to be filled.
  struct gap {
    int rank;             // in the group
    std::size_t ring;     // index into `rings`
    std::int64_t room;    // ticks left before the ring starts
    std::int64_t tokens;  // tokens of the short sequences put into it so far
  };
  std::vector<seq::hdp_item> rings;
  std::vector<std::vector<int>> ring_ranks;
  std::vector<gap> gaps;
  if (!longs.empty()) {
    auto sh = seq::hdp_shard(longs, hdp, pool);
    const cost::fixed target = group_lower_bound(seqs, hdp.capacity, pool, m);
    for (auto& it : sh.items) {
      widen_ring(it, hdp, pool, m, target);
      std::vector<int> ring = loads.least(it.degree);
      std::sort(ring.begin(), ring.end());
      std::vector<int> global(ring);
      for (int& r : global) r += base;
      std::vector<cost::fixed> free_at;
      for (int r : ring) free_at.push_back(loads.finish(r));
      const cost::fixed start = loads.run(ring, hdp_item_time(it, m, global));
      for (std::size_t k = 0; k < ring.size(); ++k)
        if (free_at[k] < start) gaps.push_back({ring[k], rings.size(), (start - free_at[k]).ticks, 0});
      ring_ranks.push_back(std::move(global));
      rings.push_back(std::move(it));
    }
  }
  // 2. Short sequences by (-cost, id): into the tightest gap before a ring that still holds them (their
  //    rows run there, so the ring starts no later), else onto the least-loaded rank (LPT on modelled
  //    time, after every ring). A sequence is charged its share l / C of the per-row constant, not all
  //    of it: rows are nearly full after best-fit, so c is shared by their members; a gap keeps one
  //    whole constant in reserve for each row it may need.
  std::vector<std::int64_t> cost(shorts.size());
  const std::int64_t row_constant = cost::fixed::from_units(m.llm.scale() * m.llm.layer.c).ticks;
  for (std::size_t i = 0; i < shorts.size(); ++i)
    cost[i] = m.llm.placement_fixed(shorts[i].length, hdp.capacity).ticks;
  std::vector<std::size_t> order(shorts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  hetmesh::indirect_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return cost[a] != cost[b] ? cost[a] > cost[b] : shorts[a].id < shorts[b].id;
  });
  // Open gaps by (room left after reserving the constants of the rows they may need, gap index).
  const auto usable = [&](const gap& g) {
    const std::int64_t rows = g.tokens / hdp.capacity + 1;
    return g.room - rows * row_constant;
  };
  std::set<std::pair<std::int64_t, std::size_t>> open;
  for (std::size_t k = 0; k < gaps.size(); ++k)
    if (usable(gaps[k]) > 0) open.emplace(usable(gaps[k]), k);
  std::vector<std::vector<std::size_t>> in_gap(gaps.size());
  std::vector<std::vector<std::size_t>> on(static_cast<std::size_t>(pool));
  for (std::size_t i : order) {
    auto it = open.lower_bound({cost[i], 0});
    // The sequence may open one more row in the gap: that row's constant must fit too.
    while (it != open.end() &&
           gaps[it->second].room - cost[i] -
                   ((gaps[it->second].tokens + shorts[i].length) / hdp.capacity + 1) * row_constant <
               0)
      ++it;
    if (it != open.end()) {
      const std::size_t k = it->second;
      open.erase(it);
      gaps[k].room -= cost[i];
      gaps[k].tokens += shorts[i].length;
      in_gap[k].push_back(i);
      if (usable(gaps[k]) > 0) open.emplace(usable(gaps[k]), k);
      continue;
    }
    const int r = loads.least(1).front();
    const int ring[1] = {r};
    loads.run(ring, cost::fixed::from_ticks(cost[i]));
    on[static_cast<std::size_t>(r)].push_back(i);
  }
  // 3. Emit in execution order, so order keys are increasing along every rank: before each ring, the
  //    rows of its gaps (best-fit decreasing per gap); then the ring; after every ring, each rank's
  //    remaining short sequences packed by best-fit decreasing into rows of C tokens.
  std::vector<std::vector<std::size_t>> gaps_of(rings.size());
  for (std::size_t k = 0; k < gaps.size(); ++k) gaps_of[gaps[k].ring].push_back(k);
  for (std::size_t j = 0; j < rings.size(); ++j) {
    for (std::size_t k : gaps_of[j])
      emit_rows(in_gap[k], shorts, base + gaps[k].rank, hdp, items, placement, counter);
    placement.push_back(seq::hdp_placement{std::move(ring_ranks[j]), counter++});
    items.push_back(std::move(rings[j]));
  }
  for (int r = 0; r < pool; ++r)
    emit_rows(on[static_cast<std::size_t>(r)], shorts, base + r, hdp, items, placement, counter);
}
#else
    ;
#endif

}  // namespace detail

/// Plans one step over a pool of `pool` ranks. `owner[i]` is the loader rank that read seqs[i]
/// (needed when group_size > 0 and < pool: a sample stays in its loader's group; empty = one group).
/// Pre: pool >= 1; 0 <= group_size, pool % group_size == 0 when set; unique ids; lengths >= 0; every
/// long sequence's D <= group size (capacity_error naming it otherwise). Post: every sequence in
/// exactly one item; packs <= C tokens; rings of D distinct ranks inside one group; order keys global,
/// so the plan is deadlock-free. Pure; deterministic; independent of the order of `seqs` (with `owner`
/// permuted alike). O(n log n + n log pool). Not collective: every rank of a group computes it from the
/// same gathered metadata.
[[nodiscard]] HETMESH_COMPILED seq::hdp_plan plan_gap_filling_hdp(std::span<const seq::seq_desc> seqs,
                                                                  const seq::hdp_policy& hdp, int pool,
                                                                  const step_model& m,
                                                                  const gap_filling_policy& policy = {},
                                                                  std::span<const int> owner = {})
#if HETMESH_BODIES
{
  if (pool < 1)
    throw_error<invalid_argument>("balance::plan_gap_filling_hdp: pool = {}; expected >= 1", pool);
  if (hdp.capacity < 1)
    throw_error<invalid_argument>("balance::plan_gap_filling_hdp: capacity = {}; expected >= 1",
                                  hdp.capacity);
  seq::check_seq_descs(seqs, "balance::plan_gap_filling_hdp");
  const int g = policy.group_size == 0 ? pool : policy.group_size;
  if (g < 1 || pool % g != 0)
    throw_error<invalid_argument>(
        "balance::plan_gap_filling_hdp: group_size = {} for a pool of {}; expected a divisor of the pool",
        policy.group_size, pool);
  const int groups = pool / g;
  if (groups > 1 && owner.size() != seqs.size())
    throw_error<invalid_argument>(
        "balance::plan_gap_filling_hdp: {} owners for {} sequences with {} groups; expected one loader "
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
            "balance::plan_gap_filling_hdp: sequence {} has loader rank {}; expected [0, {})", seqs[i].id,
            owner[i], pool);
      grp = owner[i] / g;
    }
    per_group[static_cast<std::size_t>(grp)].push_back(seqs[i]);
    sh.global_tokens += seqs[i].length;
  }
  std::vector<seq::hdp_placement> placement;
  std::int64_t counter = 0;
  for (int k = 0; k < groups; ++k) {
    auto& mine = per_group[static_cast<std::size_t>(k)];
    hetmesh::indirect_sort(mine.begin(), mine.end(), seq::longer_first);
    try {
      detail::plan_group(mine, hdp, g, k * g, m, sh.items, placement, counter);
    } catch (error& e) {
      e.add_context(
          hetmesh::format("balance::plan_gap_filling_hdp: group {} (ranks [{}, {}))", k, k * g, (k + 1) * g));
      throw;
    }
  }
  for (std::size_t i = 0; i < sh.items.size(); ++i) sh.items[i].index = static_cast<std::int64_t>(i);
  auto plan = seq::hdp_assemble(std::move(sh), std::move(placement));
  HETMESH_ASSERT_AT(heavy, seq::hdp_exactly_once_violation(seqs, plan).empty(),
                    "balance::plan_gap_filling_hdp: {}", seq::hdp_exactly_once_violation(seqs, plan));
  return plan;
}
#else
    ;
#endif

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::gap_filling_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::gap_filling_policy& p, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "gap_filling_policy(group_size={})", p.group_size);
  }
};
