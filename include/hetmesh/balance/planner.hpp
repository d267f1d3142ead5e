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
// Between 1 and 2, an improvement pass (ring_search.hpp, on unless gap_filling_policy::local_search is
// false) tries other ranks, sizes and orders for the rings, and a re-packing of all of them (the largest
// as a packing of rectangles, the others backfilled), re-placing the short sequences for each try and
// keeping a change only when the modelled step of the whole group strictly drops.
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

#include "../config.hpp"
#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "../seq/hdp.hpp"
#include "hdp_common.hpp"
#include "model.hpp"
#include "ring_search.hpp"
#include "solvers.hpp"

namespace hetmesh::balance {

/// Policy value of the gap-filling HDP planner. group_size 0 = the whole pool is one group.
struct gap_filling_policy {
  int group_size = 0;        ///< ranks per group; 0: the whole pool
  bool local_search = true;  ///< run the improvement pass over ring layouts (ring_search.hpp)
  friend constexpr bool operator==(const gap_filling_policy&, const gap_filling_policy&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

namespace detail {

/// max(sum of the sequences' work (cost::llm_compute::work) over the group / pool, the longest short
/// sequence): what the group's
/// busiest rank cannot beat.
HETMESH_COMPILED cost::fixed group_lower_bound(std::span<const seq::seq_desc> seqs, std::int64_t capacity,
                                               int pool, const step_model& m);

/// Gives ring item `it` a ring of `d` ranks (d at least the D(s) it was sharded with): degree and
/// offload ranks d; the ratio `sharded_ratio_k` it was sharded with, or none once d reaches the ranks
/// the sequence needs without offloading.
HETMESH_COMPILED void set_ring_degree(seq::hdp_item& it, int d, int sharded_ratio_k,
                                      const seq::hdp_policy& hdp);

/// Widens a ring beyond the D(s) that memory needs when its per-rank time would exceed `target` (the
/// group's lower bound) and spare ranks exist: D(s) is the fewest ranks that can *hold* the sequence,
/// but on a lightly loaded pool the ring is then the critical path. Picks the smallest D' >= D(s)
/// whose ring time is <= target, else the D' (up to the group size and length / 2) with the least
/// ring time, trying geometric steps. A widened ring needs no offloading once D' reaches the ranks
/// the sequence needs without it.
HETMESH_COMPILED void widen_ring(seq::hdp_item& it, const seq::hdp_policy& hdp, int pool, const step_model& m,
                                 cost::fixed target);

/// Appends the packed rows `rows` (indices into `shorts`, from pack_rows) on rank `rank`, in order.
HETMESH_COMPILED void emit_rows(const std::vector<std::vector<std::size_t>>& rows,
                                std::span<const seq::seq_desc> shorts, int rank, const seq::hdp_policy& hdp,
                                std::vector<seq::hdp_item>& items, std::vector<seq::hdp_placement>& placement,
                                std::int64_t& counter);

/// Plans one group of `pool` ranks; appends items and placements (ranks offset by `base`).
HETMESH_COMPILED void plan_group(std::span<const seq::seq_desc> seqs, const seq::hdp_policy& hdp, int pool,
                                 int base, const step_model& m, bool search,
                                 std::vector<seq::hdp_item>& items,
                                 std::vector<seq::hdp_placement>& placement, std::int64_t& counter)
#if HETMESH_BODIES
{
  std::vector<seq::seq_desc> longs, shorts;
  for (const auto& s : seqs) {
    if (s.length == 0) continue;
    (s.length <= hdp.capacity ? shorts : longs).push_back(s);
  }
  // 1. Rings: hdp_shard gives D and the offload ratio of each long sequence, longest first; a ring
  //    whose time would exceed the group's lower bound is widened (see widen_ring); each goes on the D
  //    ranks that its predecessors leave least loaded.
  std::vector<seq::hdp_item> rings;
  std::vector<int> sharded_ratio;  // per ring: the offload ratio it was sharded with
  ring_layout lay;
  // A ring's per-rank time on `ranks` (as many as it has members): hdp_item_time at that degree.
  const auto time_of = [&](std::size_t j, std::span<const int> ranks) {
    std::vector<int> global(ranks.begin(), ranks.end());
    for (int& r : global) r += base;
    return m.ring_time(rings[j].seqs.front().length, static_cast<int>(ranks.size()), m.spans_nodes(global));
  };
  if (!longs.empty()) {
    load_set loads(pool);
    auto sh = seq::hdp_shard(longs, hdp, pool);
    const cost::fixed target = group_lower_bound(seqs, hdp.capacity, pool, m);
    for (auto& it : sh.items) {
      sharded_ratio.push_back(it.offload.ratio_k);
      lay.min_degree.push_back(it.degree);
      lay.max_degree.push_back(
          std::max(it.degree, static_cast<int>(std::min<std::int64_t>(pool, it.seqs.front().length / 2))));
      widen_ring(it, hdp, pool, m, target);
      std::vector<int> ring = loads.least(it.degree);
      std::sort(ring.begin(), ring.end());
      rings.push_back(std::move(it));
      lay.time.push_back(time_of(rings.size() - 1, ring));
      loads.run(ring, lay.time.back());
      lay.order.push_back(lay.ranks.size());
      lay.ranks.push_back(std::move(ring));
    }
  }
  // 2. Short sequences around the rings (evaluate_layout): into the gaps first, else LPT (place_shorts),
  //    packed into rows. The improvement pass (improve_layout) tries other ranks, sizes and orders for
  //    the rings, re-evaluating each try, and keeps a change only when the modelled step strictly
  //    drops. The plan is emitted from the last evaluation kept.
  const short_set ss = price_shorts(shorts, hdp.capacity, m);
  layout_eval ev = evaluate_layout(lay, ss, pool, hdp.capacity, m);
  if (search) improve_layout(lay, ev, ss, pool, hdp.capacity, m, time_of);
  const short_fill& fill = ev.fill;
  // 3. Emit in execution order, so order keys are increasing along every rank: before each ring, the
  //    rows of its gaps (best-fit decreasing per gap); then the ring; after every ring, each rank's
  //    remaining short sequences packed by best-fit decreasing into rows of C tokens.
  std::vector<std::vector<std::size_t>> gaps_of(rings.size());
  for (std::size_t k = 0; k < fill.gaps.size(); ++k) gaps_of[fill.gaps[k].ring].push_back(k);
  for (std::size_t j : lay.order) {
    for (std::size_t k : gaps_of[j])
      emit_rows(ev.gap_rows[k], shorts, base + fill.gaps[k].rank, hdp, items, placement, counter);
    std::vector<int> global(lay.ranks[j]);
    for (int& r : global) r += base;
    if (static_cast<int>(global.size()) != rings[j].degree)
      set_ring_degree(rings[j], static_cast<int>(global.size()), sharded_ratio[j], hdp);
    placement.push_back(seq::hdp_placement{std::move(global), counter++});
    items.push_back(std::move(rings[j]));
  }
  for (int r = 0; r < pool; ++r)
    emit_rows(ev.rank_rows[static_cast<std::size_t>(r)], shorts, base + r, hdp, items, placement, counter);
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
      detail::plan_group(mine, hdp, g, k * g, m, policy.local_search, sh.items, placement, counter);
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
    return hetmesh::format_to(ctx.out(), "gap_filling_policy(group_size={}, local_search={})", p.group_size,
                              p.local_search);
  }
};

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED void gap_filling_policy::hash_append(hasher& h) const {
  append(h, group_size);
  if (!local_search) append(h, local_search);  // hashes of the default policy unchanged
}

}  // namespace hetmesh::balance

namespace hetmesh::balance::detail {

HETMESH_COMPILED cost::fixed group_lower_bound(std::span<const seq::seq_desc> seqs, std::int64_t capacity,
                                               int pool, const step_model& m) {
  double total = 0.0;
  std::int64_t longest_short = 0;
  for (const auto& s : seqs) {
    total += m.llm.work(s.length);
    if (s.length <= capacity) longest_short = std::max(longest_short, s.length);
  }
  const auto spread = cost::fixed::from_units(total / static_cast<double>(pool));
  return std::max(spread, m.pack_time(std::span<const std::int64_t>(&longest_short, 1)));
}

HETMESH_COMPILED void set_ring_degree(seq::hdp_item& it, int d, int sharded_ratio_k,
                                      const seq::hdp_policy& hdp) {
  it.degree = d;
  it.offload.ranks = d;
  it.offload.ratio_k =
      d >= seq::offload_ranks(it.seqs.front().length, hdp.capacity, hdp.model, 0, hdp.offload.ratio_steps)
          ? 0
          : sharded_ratio_k;
}

HETMESH_COMPILED void widen_ring(seq::hdp_item& it, const seq::hdp_policy& hdp, int pool, const step_model& m,
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
  set_ring_degree(it, best, it.offload.ratio_k, hdp);
}

HETMESH_COMPILED void emit_rows(const std::vector<std::vector<std::size_t>>& rows,
                                std::span<const seq::seq_desc> shorts, int rank, const seq::hdp_policy& hdp,
                                std::vector<seq::hdp_item>& items, std::vector<seq::hdp_placement>& placement,
                                std::int64_t& counter) {
  for (const auto& row : rows) {
    seq::hdp_item p;
    for (std::size_t i : row) {
      p.seqs.push_back(shorts[i]);
      p.tokens += shorts[i].length;
    }
    p.packed = true;
    p.degree = 1;
    p.offload.ratio_steps = hdp.offload.ratio_steps;
    p.offload.length = p.tokens;
    placement.push_back(seq::hdp_placement{{rank}, counter++});
    items.push_back(std::move(p));
  }
}

}  // namespace hetmesh::balance::detail
#endif  // HETMESH_BODIES
