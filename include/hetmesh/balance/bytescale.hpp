// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: ByteScale's balance scheduler (arXiv 2502.21231 §5, Alg. 2) as a placement for
// seq::hdp_shard's work items. Items are sorted by length and cut into buckets of about equal compute
// (long buckets hold few items). While items remain: every rank that lags the busiest by more than
// the slack delta is a target (when none does, every rank is: a new round); each target takes one item
//   - DP-Balance (no pipeline parallelism): from the first non-empty bucket, so ranks running at the
//     same time run similar lengths and ranks with shorter items simply run more of them;
//   - PP-Balance: each rank (a pipeline) keeps drawing from "its" bucket (buckets dealt round-robin
//     over the ranks), so a pipeline sees similar lengths, and since buckets hold equal compute, pipelines of
//     shorter items run more micro-batches.
// A long item needs D ranks: the target plus the D-1 least-loaded other targets (then any ranks).
// Every placed item gets the next value of one global counter as its order key, so ring members run
// shared rings in the same relative order and the step cannot deadlock (verify_deadlock_free checks it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
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

namespace hetmesh::balance {

/// Which resource the ByteScale scheduler balances: data-parallel ranks (dp) or pipeline stages (pp).
enum class hdp_balance_mode : std::uint8_t { dp, pp };

/// Policy value of the ByteScale scheduler. `delta` is the slack relative to the busiest rank's time
/// (ByteScale gives no value; Megatron's port uses 5%). `buckets` = 0 picks min(16, items).
struct bytescale_policy {
  double delta = 0.05;                           ///< slack relative to the busiest rank's time
  hdp_balance_mode mode = hdp_balance_mode::dp;  ///< balance over dp ranks or pp stages
  int buckets = 0;                               ///< length buckets; 0: min(16, items)
  friend constexpr bool operator==(const bytescale_policy&, const bytescale_policy&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

namespace detail {

/// Items by (-length, index), cut into `nb` runs of about equal total compute (per-rank time x D).
HETMESH_COMPILED std::vector<std::vector<std::size_t>> equal_compute_buckets(
    const seq::hdp_sharding& sh, std::span<const cost::fixed> per_rank, int nb);

}  // namespace detail

/// ByteScale Alg. 2 placement of the items of `sh` over its pool, priced by `m`.
/// Pre: a sharding from seq::hdp_shard (every degree <= pool); 0 <= delta < 1. Post: one placement per
/// item, rings of `degree` distinct ranks, order keys a global sequence (deadlock-free). Pure and
/// deterministic (fixed-point loads, (load, rank) and (-length, index) keys); independent of the order
/// of the sequences given to hdp_shard. O(items log pool + sum of ring sizes log pool). Not collective.
[[nodiscard]] HETMESH_COMPILED std::vector<seq::hdp_placement> bytescale_placement(
    const seq::hdp_sharding& sh, const step_model& m, const bytescale_policy& policy = {})
#if HETMESH_BODIES
{
  if (!(policy.delta >= 0.0 && policy.delta < 1.0))
    throw_error<invalid_argument>("balance::bytescale_placement: delta = {}; expected 0 <= delta < 1",
                                  policy.delta);
  if (sh.pool < 1)
    throw_error<invalid_argument>("balance::bytescale_placement: pool = {}; expected >= 1", sh.pool);
  const std::size_t n_items = sh.items.size();
  std::vector<cost::fixed> per_rank(n_items);
  for (std::size_t i = 0; i < n_items; ++i) {
    if (sh.items[i].degree > sh.pool)
      throw_error<capacity_error>("balance::bytescale_placement: item {} needs {} ranks; the pool has {}", i,
                                  sh.items[i].degree, sh.pool);
    per_rank[i] = hdp_item_time(sh.items[i], m);
  }
  const int nb = policy.buckets > 0
                     ? policy.buckets
                     : static_cast<int>(std::min<std::size_t>(16, std::max<std::size_t>(1, n_items)));
  auto buckets = detail::equal_compute_buckets(sh, per_rank, nb);
  std::vector<std::size_t> cursor(buckets.size(), 0);
  // PP-Balance: rank r starts on bucket r mod buckets. Dealing buckets round-robin (rather than in
  // blocks of pool / buckets consecutive ranks) puts the few longest items on different pipelines in
  // the first round; in blocks, a ring of the first bucket would absorb the bucket's other ranks and
  // leave its next long item for the end of the step.
  std::vector<std::size_t> affinity(static_cast<std::size_t>(sh.pool), 0);
  for (int r = 0; r < sh.pool; ++r)
    affinity[static_cast<std::size_t>(r)] = static_cast<std::size_t>(r) % buckets.size();
  std::size_t first_open = 0;
  auto take = [&](int rank) -> std::ptrdiff_t {
    while (first_open < buckets.size() && cursor[first_open] == buckets[first_open].size()) ++first_open;
    if (first_open == buckets.size()) return -1;
    std::size_t b = first_open;
    if (policy.mode == hdp_balance_mode::pp) {
      b = affinity[static_cast<std::size_t>(rank)];
      while (cursor[b] == buckets[b].size()) b = (b + 1) % buckets.size();
      affinity[static_cast<std::size_t>(rank)] = b;
    }
    return static_cast<std::ptrdiff_t>(buckets[b][cursor[b]++]);
  };

  std::vector<seq::hdp_placement> out(n_items);
  detail::load_set loads(sh.pool);
  std::vector<char> served(static_cast<std::size_t>(sh.pool), 0);
  std::size_t placed = 0;
  std::int64_t counter = 0;
  while (placed < n_items) {
    const cost::fixed mx = loads.max();
    const auto slack = static_cast<std::int64_t>(std::llround(policy.delta * static_cast<double>(mx.ticks)));
    std::vector<int> targets = loads.below(mx - cost::fixed::from_ticks(slack));
    if (targets.empty()) targets = loads.all();  // everyone within delta: a new round for all ranks
    std::fill(served.begin(), served.end(), 0);
    std::size_t next_target = 0;
    for (int t : targets) {
      if (served[static_cast<std::size_t>(t)]) continue;
      const std::ptrdiff_t item = take(t);
      if (item < 0) break;
      const auto i = static_cast<std::size_t>(item);
      const int d = sh.items[i].degree;
      std::vector<int> ring{t};
      served[static_cast<std::size_t>(t)] = 1;
      // The other members: the next unserved targets (least loaded first), then any least-loaded ranks.
      for (; next_target < targets.size() && static_cast<int>(ring.size()) < d; ++next_target) {
        const int u = targets[next_target];
        if (!served[static_cast<std::size_t>(u)]) {
          ring.push_back(u);
          served[static_cast<std::size_t>(u)] = 1;
        }
      }
      if (static_cast<int>(ring.size()) < d) {
        std::vector<char> in_ring(static_cast<std::size_t>(sh.pool), 0);
        for (int u : ring) in_ring[static_cast<std::size_t>(u)] = 1;
        for (int u : loads.least(d - static_cast<int>(ring.size()), &in_ring)) {
          ring.push_back(u);
          served[static_cast<std::size_t>(u)] = 1;
        }
      }
      std::sort(ring.begin(), ring.end());  // ascending pool ranks: neighbours are as local as the set allows
      loads.run(ring, hdp_item_time(sh.items[i], m, ring));
      out[i] = seq::hdp_placement{std::move(ring), counter++};
      ++placed;
    }
  }
  return out;
}
#else
    ;
#endif

/// ByteScale end to end: seq::hdp_shard (data-aware sharding, offload solver), bytescale_placement,
/// seq::hdp_assemble. Same contract as those; the plan is independent of the order of `seqs`.
[[nodiscard]] inline seq::hdp_plan plan_bytescale(std::span<const seq::seq_desc> seqs,
                                                  const seq::hdp_policy& hdp, int pool, const step_model& m,
                                                  const bytescale_policy& policy = {}) {
  auto sh = seq::hdp_shard(seqs, hdp, pool);
  auto pl = bytescale_placement(sh, m, policy);
  auto plan = seq::hdp_assemble(std::move(sh), std::move(pl));
  HETMESH_ASSERT_AT(heavy, seq::hdp_exactly_once_violation(seqs, plan).empty(), "balance::plan_bytescale: {}",
                    seq::hdp_exactly_once_violation(seqs, plan));
  return plan;
}

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::hdp_balance_mode> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::balance::hdp_balance_mode m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", m == hetmesh::balance::hdp_balance_mode::dp ? "dp" : "pp");
  }
};

template <>
struct fmt::formatter<hetmesh::balance::bytescale_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::bytescale_policy& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "bytescale_policy(delta={}, mode={}, buckets={})", p.delta, p.mode,
                              p.buckets);
  }
};

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED void bytescale_policy::hash_append(hasher& h) const { append_all(h, delta, mode, buckets); }

}  // namespace hetmesh::balance

namespace hetmesh::balance::detail {

HETMESH_COMPILED std::vector<std::vector<std::size_t>> equal_compute_buckets(
    const seq::hdp_sharding& sh, std::span<const cost::fixed> per_rank, int nb) {
  std::vector<std::size_t> order(sh.items.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto longest = [&](std::size_t i) {
    std::int64_t m = 0;
    for (const auto& s : sh.items[i].seqs) m = std::max(m, s.length);
    return m;
  };
  hetmesh::indirect_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto la = longest(a), lb = longest(b);
    return la != lb ? la > lb : a < b;
  });
  std::int64_t total = 0;
  for (std::size_t i : order) total += per_rank[i].ticks * sh.items[i].degree;
  std::vector<std::vector<std::size_t>> out(1);
  std::int64_t acc = 0;
  for (std::size_t i : order) {
    const auto b = static_cast<std::int64_t>(out.size());
    // Close the current bucket once it holds its share of compute (b / nb of the total so far).
    if (!out.back().empty() && b < nb && acc * nb >= b * total) out.emplace_back();
    out.back().push_back(i);
    acc += per_rank[i].ticks * sh.items[i].degree;
  }
  return out;
}

}  // namespace hetmesh::balance::detail
#endif  // HETMESH_BODIES
