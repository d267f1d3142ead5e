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
#include "../model/host_memory.hpp"

namespace hetmesh::run {

namespace detail {

/// Every rank's `mine`, gathered into host memory: directly over a host communicator, through two small
/// buffers of memory policy M over a device communicator (upload, all-gather, download; M and the
/// communicator share a stream). Collective over c.
template <comm::communicator C, model::memory_policy M, class U>
[[nodiscard]] std::vector<U> gather_to_host(C& c, const M& mem, U mine) {
  static_assert(M::space == std::remove_cvref_t<C>::memory,
                "run: the memory policy's space must be the communicator's (model::host_memory for a host "
                "communicator; a device memory policy for a device communicator)");
  std::vector<U> all(static_cast<std::size_t>(c.size()));
  if constexpr (M::space == memory_space::host) {
    comm::all_gather(c, std::span<const U>(&mine, 1), std::span<U>(all));
  } else {
    typename M::template buffer<U> one, every;
    one.resize(1);
    every.resize(all.size());
    mem.upload(one.span(), std::span<const U>(&mine, 1));
    comm::all_gather(c, std::span<const U>(one.span()), every.span());
    if constexpr (requires { c.synchronize(); }) c.synchronize();  // the gather is stream-ordered
    mem.download(std::span<U>(all), std::span<const U>(every.span()));
  }
  return all;
}

}  // namespace detail

/// The ranks (group-local) whose hash differs from the most common one (ties: the smallest hash wins,
/// so every rank names the same culprits). Empty when all agree. Pure; O(p log p).
[[nodiscard]] HETMESH_COMPILED std::vector<int> disagreeing_ranks(std::span<const std::uint64_t> hashes)
#if HETMESH_BODIES
{
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
#else
    ;
#endif

namespace detail {

/// Throws mismatch_error for plan hashes `all` (one per rank of a group whose global ranks are `members`)
/// that disagree: the disagreeing ranks with their hashes and the majority hash (check_plan_agreement's
/// message).
[[noreturn]] HETMESH_COMPILED void throw_disagreement(std::string_view what,
                                                      std::span<const std::uint64_t> all,
                                                      std::span<const int> members)
#if HETMESH_BODIES
{
  const auto bad = disagreeing_ranks(all);
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
#else
    ;
#endif

/// Throws invalid_argument naming the ranks whose flag in `all` is set (agree_on_failure's message for the
/// ranks that did not fail; `members`: the group's global ranks).
[[noreturn]] HETMESH_COMPILED void throw_failed_ranks(std::string_view what,
                                                      std::span<const std::uint8_t> all,
                                                      std::span<const int> members)
#if HETMESH_BODIES
{
  std::vector<std::string> who;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != 0) who.push_back(hetmesh::format("rank {} (global {})", r, members[r]));
  throw_error<invalid_argument>(
      "{}: {} of the group of {} ranks failed before it ({}; see their errors); expected every rank to "
      "be ready, so this rank stops too instead of waiting for them",
      what, who.size(), all.size(), fmt::join(who, ", "));
}
#else
    ;
#endif

}  // namespace detail

/// Collective over `c`: every rank passes its own plan; all-gathers plan_hash(plan) and throws
/// hetmesh::mismatch_error on every rank when they differ, naming the group, the disagreeing ranks
/// (group-local and global) with their hashes, and the majority hash expected. Deterministic; cost: one
/// all-gather of 8 bytes per rank plus hashing the plan.
/// With a device communicator, pass its memory policy `mem` (the overload below): the hashes travel through
/// two small device buffers.
template <comm::communicator C, model::memory_policy M, class Plan>
void check_plan_agreement(C& c, const M& mem, const Plan& plan, std::string_view what = "plan") {
  const auto all = detail::gather_to_host(c, mem, plan_hash(plan));
  if (disagreeing_ranks(all).empty()) return;
  const auto members = c.ranks();
  detail::throw_disagreement(what, all, std::vector<int>(members.begin(), members.end()));
}
/// check_plan_agreement over a host communicator (host memory).
template <comm::communicator C, class Plan>
void check_plan_agreement(C& c, const Plan& plan, std::string_view what = "plan") {
  static_assert(comm::host_communicator<C>,
                "run::check_plan_agreement over a device communicator needs its memory policy: "
                "check_plan_agreement(c, mem, plan, what)");
  if constexpr (comm::host_communicator<C>) check_plan_agreement(c, model::host_memory{}, plan, what);
}

/// Collective over `c`: every rank says whether its local preparation failed (`failure`, null when it
/// did not), so that a rank that cannot take part in what follows fails the others at once instead of
/// leaving them to wait out a collective's timeout. When no rank failed, returns. Otherwise a failed rank
/// rethrows its own exception, and every other rank throws invalid_argument naming `what` and the failed
/// ranks (group-local and global). Deterministic; cost: one all-gather of one byte per rank.
/// Over a device communicator, pass its memory policy `mem`: the flags travel through device buffers.
template <comm::communicator C, model::memory_policy M>
void agree_on_failure(C& c, const M& mem, const std::exception_ptr& failure, std::string_view what) {
  const auto all = detail::gather_to_host(c, mem, std::uint8_t{failure ? std::uint8_t{1} : std::uint8_t{0}});
  if (failure) std::rethrow_exception(failure);
  if (std::find(all.begin(), all.end(), std::uint8_t{1}) == all.end()) return;
  const auto members = c.ranks();
  detail::throw_failed_ranks(what, all, std::vector<int>(members.begin(), members.end()));
}
/// agree_on_failure over a host communicator (host memory).
template <comm::communicator C>
void agree_on_failure(C& c, const std::exception_ptr& failure, std::string_view what) {
  static_assert(comm::host_communicator<C>,
                "run::agree_on_failure over a device communicator needs its memory policy: "
                "agree_on_failure(c, mem, failure, what)");
  if constexpr (comm::host_communicator<C>) agree_on_failure(c, model::host_memory{}, failure, what);
}

/// check_plan_agreement at the `collective` assertion level: compiled to nothing below it, so
/// production builds pay no all-gather per plan. Same contract when enabled.
template <comm::communicator C, class Plan>
void assert_plan_agreement(C& c, const Plan& plan, std::string_view what = "plan") {
  static_assert(comm::host_communicator<C>,
                "run::assert_plan_agreement over a device communicator needs its memory policy: "
                "assert_plan_agreement(c, mem, plan, what)");
  if constexpr (assertion_enabled(assertion_level::collective) && comm::host_communicator<C>)
    check_plan_agreement(c, plan, what);
}
/// assert_plan_agreement with the communicator's memory policy (any communicator).
template <comm::communicator C, model::memory_policy M, class Plan>
void assert_plan_agreement(C& c, const M& mem, const Plan& plan, std::string_view what = "plan") {
  if constexpr (assertion_enabled(assertion_level::collective)) check_plan_agreement(c, mem, plan, what);
}

}  // namespace hetmesh::run
