// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: the cross-rank determinism check. Decentralized planning is only correct if every
// rank of a group computed the same plan from the same gathered metadata; a rank that disagrees (a
// different library build, a float that rounded differently before reaching fixed point, a stale
// input) would send and receive different counts and hang or corrupt data. The check all-gathers
// plan_hash(plan) and fails loudly, naming the ranks that disagree with the majority.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../comm/collectives.hpp"
#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/hash.hpp"

namespace hetmesh::run {

/// The ranks (group-local) whose hash differs from the most common one (ties: the smallest hash wins,
/// so every rank names the same culprits). Empty when all agree. Pure; O(p log p).
[[nodiscard]] inline std::vector<int> disagreeing_ranks(std::span<const std::uint64_t> hashes) {
  std::map<std::uint64_t, int> votes;
  for (auto h : hashes) ++votes[h];
  std::uint64_t majority = 0;
  int best = -1;
  for (const auto& [h, n] : votes)
    if (n > best) {
      best = n;
      majority = h;
    }
  std::vector<int> out;
  for (std::size_t r = 0; r < hashes.size(); ++r)
    if (hashes[r] != majority) out.push_back(static_cast<int>(r));
  return out;
}

/// Collective over `c`: every rank passes its own plan; all-gathers plan_hash(plan) and throws
/// hetmesh::mismatch_error on every rank when they differ, naming the group, the disagreeing ranks
/// (group-local and global) with their hashes, and the majority hash expected. Deterministic; cost: one
/// all-gather of 8 bytes per rank plus hashing the plan.
template <comm::communicator C, class Plan>
void check_plan_agreement(C& c, const Plan& plan, std::string_view what = "plan") {
  static_assert(comm::host_communicator<C>,
                "run::check_plan_agreement gathers hashes into a host vector: it needs a "
                "comm::host_communicator (loopback, mpi), not a device communicator");
  const std::uint64_t mine = plan_hash(plan);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(c.size()));
  comm::all_gather(c, std::span<const std::uint64_t>(&mine, 1), std::span<std::uint64_t>(all));
  const auto bad = disagreeing_ranks(all);
  if (bad.empty()) return;
  const auto members = c.ranks();
  std::vector<std::string> who;
  for (int r : bad)
    who.push_back(hetmesh::format("rank {} (global {}) has {:#018x}", r, members[static_cast<std::size_t>(r)],
                                  all[static_cast<std::size_t>(r)]));
  std::uint64_t majority = 0;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (std::find(bad.begin(), bad.end(), static_cast<int>(r)) == bad.end()) {
      majority = all[r];
      break;
    }
  throw_error<mismatch_error>(
      "{} hashes disagree across the group of {} ranks: {}; expected every rank to hold "
      "{:#018x} (the same plan from the same metadata)",
      what, all.size(), fmt::join(who, ", "), majority);
}

/// Collective over `c`: every rank says whether its local preparation failed (`failure`, null when it
/// did not), so that a rank that cannot take part in what follows fails the others at once instead of
/// leaving them to wait out a collective's timeout. When no rank failed, returns. Otherwise a failed rank
/// rethrows its own exception, and every other rank throws invalid_argument naming `what` and the failed
/// ranks (group-local and global). Deterministic; cost: one all-gather of one byte per rank.
template <comm::communicator C>
void agree_on_failure(C& c, const std::exception_ptr& failure, std::string_view what) {
  static_assert(comm::host_communicator<C>,
                "run::agree_on_failure gathers flags into a host vector: it needs a comm::host_communicator "
                "(loopback, mpi), not a device communicator");
  const std::uint8_t mine = failure ? 1 : 0;
  std::vector<std::uint8_t> all(static_cast<std::size_t>(c.size()));
  comm::all_gather(c, std::span<const std::uint8_t>(&mine, 1), std::span<std::uint8_t>(all));
  if (failure) std::rethrow_exception(failure);
  std::vector<std::string> who;
  const auto members = c.ranks();
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != 0) who.push_back(hetmesh::format("rank {} (global {})", r, members[r]));
  if (who.empty()) return;
  throw_error<invalid_argument>(
      "{}: {} of the group of {} ranks failed before it ({}; see their errors); expected every rank to "
      "be ready, so this rank stops too instead of waiting for them",
      what, who.size(), all.size(), fmt::join(who, ", "));
}

/// check_plan_agreement at the `collective` assertion level: compiled to nothing below it, so
/// production builds pay no all-gather per plan. Same contract when enabled.
template <comm::communicator C, class Plan>
void assert_plan_agreement(C& c, const Plan& plan, std::string_view what = "plan") {
  static_assert(comm::host_communicator<C>,
                "run::assert_plan_agreement gathers hashes into a host vector: it needs a "
                "comm::host_communicator (loopback, mpi), not a device communicator");
  if constexpr (assertion_enabled(assertion_level::collective)) check_plan_agreement(c, plan, what);
}

}  // namespace hetmesh::run
