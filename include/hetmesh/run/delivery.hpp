// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: delivery under hybrid parallelism. Per data-parallel index, one rank (the loading rank
// of its delivery group, see data::delivery_of) receives the step's samples from the data plane and
// builds the packed micro-batches; the other ranks of the group get the bytes by broadcast. So every
// sample is read once per step in the whole job, and the other ranks of its data-parallel index (tensor,
// context, pipeline peers, in any mesh order) never touch a source.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../data/constructor.hpp"
#include "../data/loader.hpp"
#include "../data/planner.hpp"
#include "../data/wire.hpp"

namespace hetmesh::run {

/// Broadcasts micro-batches from `root` over `group`. Collective over `group`: every member calls it with
/// the same root; only the root's `mine` is read. Returns the root's micro-batches on every member.
/// Three broadcasts (count, sizes, bytes); cost O(bytes) per member.
template <comm::communicator C>
[[nodiscard]] std::vector<data::thd_micro_batch> broadcast_micro_batches(
    C& group, const std::vector<data::thd_micro_batch>& mine, int root) {
  static_assert(comm::host_communicator<C>,
                "run::broadcast_micro_batches broadcasts host vectors: it needs a comm::host_communicator "
                "(loopback, mpi), not a device communicator");
  data::wire_micro_batches w;
  if (group.rank() == root) w = data::to_wire(mine);
  std::int64_t count[2] = {static_cast<std::int64_t>(w.sizes.size()),
                           static_cast<std::int64_t>(w.bytes.size())};
  comm::broadcast(group, std::span<std::int64_t>(count, 2), root);
  w.sizes.resize(static_cast<std::size_t>(count[0]));
  w.bytes.resize(static_cast<std::size_t>(count[1]));
  comm::broadcast(group, std::span<std::int64_t>(w.sizes), root);
  comm::broadcast(group, std::span<std::uint8_t>(w.bytes), root);
  return data::from_wire(w.sizes, w.bytes);
}

/// This rank's micro-batches of a step. `world` spans the trainers' mesh (rank numbering of `cfg.layout`,
/// any order); `batch` is the step's batch and must be non-null on loading ranks (it is not read
/// elsewhere). Collective over each delivery group (the group's communicator is made from `world`): every
/// rank is in exactly one group, that of its data-parallel index, and returns that index's micro-batches.
template <comm::communicator C>
[[nodiscard]] std::vector<data::thd_micro_batch> deliver(C& world, const data::mixture_config& cfg,
                                                         const data::loaded_batch* batch) {
  static_assert(comm::host_communicator<C>,
                "run::deliver moves micro-batches in host vectors: it needs a comm::host_communicator "
                "(loopback, mpi), not a device communicator");
  const auto& t = cfg.layout;
  if (world.size() != t.world())
    throw_error<invalid_argument>("deliver: the communicator has {} ranks; the mesh {} needs {}",
                                  world.size(), t.str(), t.world());
  const int me = world.rank();
  const int dp = t.dp_of(me);
  const auto g = data::delivery_of(t, dp);
  std::vector<data::thd_micro_batch> mine{};
  if (me == g.loader) {
    if (batch == nullptr)
      throw_error<invalid_argument>("deliver: rank {} is the loading rank of dp {} but got no batch", me, dp);
    mine = data::construct(batch->plan, batch->samples, dp, cfg.micro_batches);
  }
  if (g.ranks.size() == 1) return mine;
  auto group = world.subgroup(std::span<const int>(g.ranks));
  return broadcast_micro_batches(group, mine, 0);
}

}  // namespace hetmesh::run
