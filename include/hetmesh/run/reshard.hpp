// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: adaptive resharding, the executor. Moves encoder-output rows by a balance::reshard_plan
// (balance/reshard.hpp) with one all_to_all_v; the same call moves gradients back by plan.transposed().
#pragma once

#include <cstdint>
#include <span>

#include "../balance/reshard.hpp"
#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "agreement.hpp"
#include "detail/rows.hpp"

namespace hetmesh::run {

/// Collective over `c` (the ranks of the plan, group-local): moves rows by `plan` from `src` (this
/// rank's buffer, rows of `width` elements) into `dst`. Use plan for the forward pass (encoder outputs
/// into the LLM input) and plan.transposed() for the backward pass (gradients back).
/// Pre: c.size() == plan.ranks; buffers large enough for every run naming this rank (invalid_argument).
/// Post: each run's rows copied; rows of `dst` no run names are untouched. Cost: packing and
/// unpacking O(rows * width) plus one all_to_all_v.
template <comm::communicator C, class T>
void reshard(C& c, const balance::reshard_plan& plan, std::span<const T> src, std::span<T> dst,
             std::int64_t width) {
  static_assert(
      comm::host_communicator<C>,
      "run::reshard packs rows in host vectors: it needs a comm::host_communicator (loopback, mpi), "
      "not a device communicator");
  if (c.size() != plan.ranks || width < 1)
    throw_error<invalid_argument>(
        "run::reshard: group of {} ranks, plan for {}, width {}; expected equal sizes "
        "and width >= 1",
        c.size(), plan.ranks, width);
  assert_plan_agreement(c, plan, "reshard plan");  // collective level: every rank moves rows by the same plan
  detail::move_rows(c, plan, src, dst, width, "run::reshard");
}

}  // namespace hetmesh::run
