// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: data-parallel and micro-batch balancing for a plain DP group (no rings): assign
// sequences to ranks and, on each rank, to micro-batches of at most C tokens (the activation memory of
// one micro-batch), minimising the slowest rank's modelled time. Token counts are the *constraint*
// (memory); modelled time T(s) is the *objective* (a 32K sequence costs far more than eight 4K ones).
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/exactly_once.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "../cost/compute.hpp"
#include "../seq/types.hpp"
#include "solvers.hpp"

namespace hetmesh::balance {

/// The number-partitioning solver dp_plan uses: LPT (greedy) or Karmarkar-Karp (differencing).
enum class dp_solver : std::uint8_t { lpt, karmarkar_karp };

/// Policy value. `micro_batches` = 0: every rank runs as many micro-batches as its sequences need (HDP
/// style gradient accumulation, ByteScale §6.1); m > 0: every rank runs exactly m slots of C tokens
/// (Megatron's fixed count; a slot may stay empty when the batch is small).
struct dp_policy {
  int ranks = 1;                                 ///< data-parallel ranks to fill
  std::int64_t capacity = 8192;                  ///< C: tokens of one micro-batch
  int micro_batches = 0;                         ///< 0: as many as needed; m > 0: exactly m
  dp_solver solver = dp_solver::karmarkar_karp;  ///< how sequences are spread over ranks
  friend constexpr bool operator==(const dp_policy&, const dp_policy&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// One micro-batch: its sequences (packed, in (-length, id) order), tokens and modelled time.
struct dp_micro_batch {
  std::vector<seq::seq_desc> seqs;  ///< packed, in (-length, id) order
  std::int64_t tokens = 0;          ///< sum of the sequences' lengths
  cost::fixed time{};               ///< modelled compute time
  friend bool operator==(const dp_micro_batch&, const dp_micro_batch&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The plan: per rank, its micro-batches (longest time first); per rank, its modelled time.
struct dp_plan {
  dp_policy policy{};                                 ///< the policy it was made with
  std::vector<std::vector<dp_micro_batch>> per_rank;  ///< per rank, its micro-batches, longest time first
  std::vector<cost::fixed> rank_time;                 ///< per rank, its modelled time
  /// The step time the plan models: the busiest rank's time (zero for no ranks). O(ranks).
  [[nodiscard]] HETMESH_COMPILED cost::fixed makespan() const noexcept;
  friend bool operator==(const dp_plan&, const dp_plan&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

namespace detail {

HETMESH_COMPILED void finish_rank(std::vector<dp_micro_batch>& mbs, cost::fixed& total,
                                  const cost::llm_compute& m);

}  // namespace detail

/// Balances `seqs` over `policy.ranks` ranks and their micro-batches, priced by `m`.
/// Pre: ranks >= 1, capacity >= 1, unique ids, 0 <= length <= capacity (capacity_error naming the
/// sequence otherwise: a longer one needs a ring, see seq/hdp.hpp); with micro_batches = m > 0 the batch
/// must fit ranks x m slots (capacity_error naming the first sequence that finds no room).
/// Post: every sequence in exactly one micro-batch; every micro-batch <= capacity tokens; with m > 0,
/// exactly m micro-batches per rank. Free count: KK or LPT over ranks on modelled cost, then best-fit
/// decreasing into micro-batches. Fixed count: greedy (-cost, id) to the least-loaded rank with a slot
/// the sequence fits (best fit among its slots). Pure; deterministic; invariant under permutation of
/// `seqs` (the plan is equal, not just its makespan). O(n log n + n log ranks) (fixed count: O(n ranks)
/// worst case). Not collective.
[[nodiscard]] HETMESH_COMPILED dp_plan plan_dp(std::span<const seq::seq_desc> seqs,
                                               const cost::llm_compute& m, const dp_policy& policy);

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::dp_solver> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::balance::dp_solver s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}",
                              s == hetmesh::balance::dp_solver::lpt ? "lpt" : "karmarkar_karp");
  }
};

template <>
struct fmt::formatter<hetmesh::balance::dp_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::dp_policy& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "dp_policy(ranks={}, capacity={}, micro_batches={}, solver={})",
                              p.ranks, p.capacity, p.micro_batches, p.solver);
  }
};

template <>
struct fmt::formatter<hetmesh::balance::dp_micro_batch> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::dp_micro_batch& mb, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "mb(tokens={}, time={}, seqs={})", mb.tokens, mb.time,
                              mb.seqs.size());
  }
};

template <>
struct fmt::formatter<hetmesh::balance::dp_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::dp_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "dp_plan({}, makespan={} modelled)", p.policy, p.makespan());
  }
};

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED void dp_policy::hash_append(hasher& h) const {
  append_all(h, ranks, capacity, micro_batches, solver);
}

HETMESH_COMPILED void dp_micro_batch::hash_append(hasher& h) const { append_all(h, seqs, tokens, time); }

HETMESH_COMPILED cost::fixed dp_plan::makespan() const noexcept {
  return rank_time.empty() ? cost::fixed{} : *std::max_element(rank_time.begin(), rank_time.end());
}

HETMESH_COMPILED void dp_plan::hash_append(hasher& h) const { append_all(h, policy, per_rank, rank_time); }

}  // namespace hetmesh::balance

namespace hetmesh::balance::detail {

HETMESH_COMPILED void finish_rank(std::vector<dp_micro_batch>& mbs, cost::fixed& total,
                                  const cost::llm_compute& m) {
  total = cost::fixed{};
  for (auto& mb : mbs) {
    hetmesh::indirect_sort(mb.seqs.begin(), mb.seqs.end(), seq::longer_first);
    std::vector<std::int64_t> lens;
    for (const auto& s : mb.seqs) lens.push_back(s.length);
    mb.time = m.packed_row_fixed(lens);
    total += mb.time;
  }
  hetmesh::indirect_sort(mbs.begin(), mbs.end(), [](const dp_micro_batch& a, const dp_micro_batch& b) {
    if (a.time != b.time) return a.time > b.time;
    if (a.seqs.empty() || b.seqs.empty()) return !a.seqs.empty() && b.seqs.empty();
    return a.seqs.front().id < b.seqs.front().id;
  });
}

}  // namespace hetmesh::balance::detail

namespace hetmesh::balance {

HETMESH_COMPILED dp_plan plan_dp(std::span<const seq::seq_desc> seqs, const cost::llm_compute& m,
                                 const dp_policy& policy) {
  if (policy.ranks < 1 || policy.capacity < 1 || policy.micro_batches < 0)
    throw_error<invalid_argument>(
        "balance::plan_dp: ranks={}, capacity={}, micro_batches={}; expected ranks >= 1, "
        "capacity >= 1, micro_batches >= 0",
        policy.ranks, policy.capacity, policy.micro_batches);
  seq::check_seq_descs(seqs, "balance::plan_dp");
  // Canonical order first: everything below depends only on the multiset of sequences.
  std::vector<seq::seq_desc> sorted(seqs.begin(), seqs.end());
  hetmesh::indirect_sort(sorted.begin(), sorted.end(), seq::longer_first);
  for (const auto& s : sorted)
    if (s.length > policy.capacity)
      throw_error<capacity_error>(
          "balance::plan_dp: sequence {} has {} tokens > capacity {}; expected every sequence "
          "to fit one micro-batch (use an HDP ring for longer ones)",
          s.id, s.length, policy.capacity);
  std::vector<std::int64_t> cost(sorted.size());
  for (std::size_t i = 0; i < sorted.size(); ++i)
    cost[i] = m.placement_fixed(sorted[i].length, policy.capacity).ticks;

  dp_plan plan;
  plan.policy = policy;
  const auto nr = static_cast<std::size_t>(policy.ranks);
  plan.per_rank.assign(nr, {});
  plan.rank_time.assign(nr, cost::fixed{});
  if (policy.micro_batches == 0) {
    const assignment a =
        policy.solver == dp_solver::lpt ? lpt(cost, policy.ranks) : karmarkar_karp(cost, policy.ranks);
    std::vector<std::vector<std::size_t>> on(nr);
    for (std::size_t i = 0; i < sorted.size(); ++i) on[static_cast<std::size_t>(a.bin_of[i])].push_back(i);
    for (std::size_t r = 0; r < nr; ++r) {
      std::vector<std::int64_t> lens;
      for (std::size_t i : on[r]) lens.push_back(sorted[i].length);
      const assignment bins = best_fit_decreasing(lens, policy.capacity);
      auto& mbs = plan.per_rank[r];
      mbs.resize(static_cast<std::size_t>(bins.bins()));
      for (std::size_t k = 0; k < on[r].size(); ++k) {
        auto& mb = mbs[static_cast<std::size_t>(bins.bin_of[k])];
        mb.seqs.push_back(sorted[on[r][k]]);
        mb.tokens += sorted[on[r][k]].length;
      }
    }
  } else {
    const auto slots = static_cast<std::size_t>(policy.micro_batches);
    for (auto& mbs : plan.per_rank) mbs.resize(slots);
    std::set<std::pair<std::int64_t, int>> load;
    for (int r = 0; r < policy.ranks; ++r) load.emplace(0, r);
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      bool placed = false;
      // The loop leaves right after erasing: `++it` on an erased iterator is undefined.
      for (auto it = load.begin(); it != load.end(); ++it) {
        auto& mbs = plan.per_rank[static_cast<std::size_t>(it->second)];
        std::size_t best = slots;
        for (std::size_t k = 0; k < slots; ++k)
          if (mbs[k].tokens + sorted[i].length <= policy.capacity &&
              (best == slots || mbs[k].tokens > mbs[best].tokens))
            best = k;
        if (best == slots) continue;
        mbs[best].seqs.push_back(sorted[i]);
        mbs[best].tokens += sorted[i].length;
        const auto [l, r] = *it;
        load.erase(it);
        load.emplace(l + cost[i], r);
        placed = true;
        break;
      }
      if (!placed)
        throw_error<capacity_error>(
            "balance::plan_dp: sequence {} ({} tokens) fits no micro-batch of {} ranks x {} "
            "slots of {} tokens; expected the batch to fit (raise micro_batches)",
            sorted[i].id, sorted[i].length, policy.ranks, policy.micro_batches, policy.capacity);
    }
  }
  for (std::size_t r = 0; r < nr; ++r) detail::finish_rank(plan.per_rank[r], plan.rank_time[r], m);
  if constexpr (assertion_enabled(assertion_level::heavy)) {  // every sequence in exactly one micro-batch
    std::vector<id_range> expected, assigned;
    for (const auto& s : seqs) expected.push_back({s.id, 0, 1});
    for (const auto& mbs : plan.per_rank)
      for (const auto& mb : mbs)
        for (const auto& s : mb.seqs) assigned.push_back({s.id, 0, 1});
    const std::string v = exactly_once_violation(std::move(expected), std::move(assigned));
    HETMESH_ASSERT_AT(heavy, v.empty(), "balance::plan_dp: {}", v);
  }
  return plan;
}

}  // namespace hetmesh::balance
#endif  // HETMESH_BODIES
