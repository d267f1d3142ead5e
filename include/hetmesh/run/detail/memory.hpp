// SPDX-License-Identifier: Apache-2.0
// hetmesh::run internals of the runtime pieces that run over a memory policy (model/memory.hpp): the
// compile-time match of a policy and a communicator, and the cross-rank plan agreement check
// (run/agreement.hpp) on a communicator of any memory space. A host
// communicator gathers the hashes in host memory as run::assert_plan_agreement does; a device one gathers
// them through the policy's buffers and downloads them (metadata, not payload: the runtime still never
// reads a tensor on the CPU).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "../../comm/collectives.hpp"
#include "../../core/assert.hpp"
#include "../../core/error.hpp"
#include "../../core/hash.hpp"
#include "../../model/memory.hpp"
#include "../agreement.hpp"

namespace hetmesh::run::detail {

/// Whether memory policy M runs on the buffers of communicator C (M::space == C::memory): the
/// static_assert of every piece that takes a policy (a device communicator needs a device policy).
template <class C, class M>
inline constexpr bool memory_of = std::remove_cvref_t<C>::memory == M::space;

/// run::assert_plan_agreement on any communicator, `mem` a memory policy of its space: compiled to
/// nothing below the `collective` assertion level. A host communicator runs assert_plan_agreement; a device
/// one uploads plan_hash(plan) as two doubles of 32 bits each (exact), all-gathers them in M's buffers and
/// downloads them. Collective over `c`; throws mismatch_error on every rank, with check_plan_agreement's
/// message, when the ranks' plans differ. Cost: one all-gather of 16 bytes per rank plus hashing the plan.
template <comm::communicator C, model::memory_policy M, class Plan>
void assert_plan_agreement_on(C& c, M& mem, const Plan& plan, std::string_view what) {
  if constexpr (comm::host_communicator<C>) {
    assert_plan_agreement(c, plan, what);
  } else if constexpr (assertion_enabled(assertion_level::collective)) {
    const std::uint64_t mine = plan_hash(plan);
    const double halves[2] = {static_cast<double>(mine >> 32), static_cast<double>(mine & 0xffffffffu)};
    const auto n = static_cast<std::size_t>(c.size());
    typename M::template buffer<double> send, recv;
    send.resize(2);
    recv.resize(2 * n);
    mem.upload(send.span(), std::span<const double>(halves));
    comm::all_gather(c, std::span<const double>(send.span()), recv.span());
    std::vector<double> got(2 * n);
    mem.download(std::span<double>(got), std::span<const double>(recv.span()));
    std::vector<std::uint64_t> all(n);
    for (std::size_t r = 0; r < n; ++r)
      all[r] = (static_cast<std::uint64_t>(got[2 * r]) << 32) | static_cast<std::uint64_t>(got[2 * r + 1]);
    const auto bad = disagreeing_ranks(all);
    if (bad.empty()) return;
    const auto members = c.ranks();
    std::vector<std::string> who;
    for (int r : bad)
      who.push_back(hetmesh::format("rank {} (global {}) has {:#018x}", r,
                                    members[static_cast<std::size_t>(r)], all[static_cast<std::size_t>(r)]));
    std::uint64_t majority = 0;
    for (std::size_t r = 0; r < n; ++r)
      if (std::find(bad.begin(), bad.end(), static_cast<int>(r)) == bad.end()) {
        majority = all[r];
        break;
      }
    throw_error<mismatch_error>(
        "{} hashes disagree across the group of {} ranks: {}; expected every rank to hold "
        "{:#018x} (the same plan from the same metadata)",
        what, n, fmt::join(who, ", "), majority);
  }
}

}  // namespace hetmesh::run::detail
