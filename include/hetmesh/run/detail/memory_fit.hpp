// SPDX-License-Identifier: Apache-2.0
// hetmesh::run internals of the runtime pieces that run over a memory policy (model/memory_policy.hpp): the
// compile-time match of a policy and a communicator, and the cross-rank plan agreement check
// (run/agreement.hpp) on a communicator of any memory space (hashes through the policy's buffers on a
// device communicator: metadata, not payload; the runtime still never reads a tensor on the CPU).
#pragma once

#include <string_view>
#include <type_traits>
#include <utility>

#include "../../comm/collectives.hpp"
#include "../../core/assert.hpp"
#include "../../model/host_memory.hpp"
#include "../agreement.hpp"

namespace hetmesh::run::detail {

/// Whether memory policy M runs on the buffers of communicator C (M::space == C::memory): the
/// static_assert of every piece that takes a policy (a device communicator needs a device policy).
template <class C, class M>
inline constexpr bool memory_of = std::remove_cvref_t<C>::memory == M::space;

/// run::assert_plan_agreement on any communicator, `mem` a memory policy of its space (agreement.hpp's
/// overload with a memory policy): compiled to nothing below the `collective` assertion level.
template <comm::communicator C, model::memory_policy M, class Plan>
void assert_plan_agreement_on(C& c, M& mem, const Plan& plan, std::string_view what) {
  assert_plan_agreement(c, std::as_const(mem), plan, what);
}

}  // namespace hetmesh::run::detail
