// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the communicators train::system splits from its world for this rank's groups (the
// pipeline, the pool, and with tp or ep their families). They depend on the communicator type only, not
// on the system's policies, so every system over one communicator shares this code; under
// HETMESH_SEPARATE_COMPILATION the loopback communicator's (and MPI's with HETMESH_COMPILED_MPI) is
// compiled once, with the loopback communicator's split and sums over ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "../comm/group_cache.hpp"
#include "../comm/loopback.hpp"
#include "../config.hpp"
#include "../model/host_memory.hpp"
#include "reduction.hpp"
#include "system_mesh.hpp"

#if HETMESH_COMPILED_MPI
#include "../comm/mpi.hpp"
#endif

namespace hetmesh::train::detail {

/// This rank's communicators of a system's groups (system_groups), each split from the world. A group
/// that the layout does not have is empty; system's accessors fall back to the world or the pool.
template <class Comm>
struct system_comms {
  std::optional<Comm> pipe;   ///< this pipeline's ranks in pipeline order (the schedule's transfers)
  std::optional<Comm> pool;   ///< pp + encoder ranks > 1 or tp > 1: the ranks of this pipeline rank
  std::optional<Comm> slice;  ///< tp > 1: this tp coordinate's ranks (a whole tp = 1 system)
  std::optional<Comm> tp;     ///< tp > 1: the stages' ctx.tp
  std::optional<Comm> row;    ///< tp > 1: the encoder row (tp x pool ranks)
  std::optional<Comm> ep;     ///< ep > 1: the stages' ctx.ep
  std::optional<Comm> edp;    ///< ep > 1: the ranks holding the same experts (expert gradients)

  system_comms() = default;
  /// Splits `world` into the groups `g` of this rank under `layout` (pipeline_ranks: pp plus the encoder
  /// pool's ranks per pipeline). Collective over the world, in the same order on every rank.
  system_comms(Comm& world, const system_layout& layout, const system_groups& g, int pipeline_ranks);
};

template <class Comm>
system_comms<Comm>::system_comms(Comm& world, const system_layout& layout, const system_groups& g,
                                 int pipeline_ranks) {
  pipe.emplace(comm::split(world, g.pipe.index, g.pipe.position));
  const bool with_tp = layout.tp() > 1;
  if (pipeline_ranks > 1 || with_tp) pool.emplace(comm::split(world, g.pool.index, g.pool.position));
  if (with_tp) {  // one tp = 1 system per tp coordinate, and the stages' tp group across them
    slice.emplace(comm::split(world, g.slice.index, g.slice.position));
    tp.emplace(comm::split(world, g.tp.index, g.tp.position));
    row.emplace(comm::split(world, g.row.index, g.row.position));
  }
  if (layout.ep() > 1) {  // the stages' ctx.ep, and the ranks holding the same experts
    ep.emplace(comm::split(world, g.ep.index, g.ep.position));
    edp.emplace(comm::split(world, g.expert_dp.index, g.expert_dp.position));
  }
}

// Compiled once (HETMESH_SEPARATE_COMPILATION): the loopback communicator's (MPI's with
// HETMESH_COMPILED_MPI). HETMESH_INSTANTIATE is `extern template` in every translation unit but the one of
// <hetmesh/src.hpp> (config.hpp).
#if HETMESH_SEPARATE_COMPILATION
HETMESH_INSTANTIATE struct system_comms<comm::loopback::communicator>;
#if HETMESH_COMPILED_MPI
HETMESH_INSTANTIATE struct system_comms<comm::mpi::communicator>;
#endif
#endif

}  // namespace hetmesh::train::detail

// Compiled once beside them: the loopback communicator's split (the system's Ulysses groups split too) and
// its sums over ranks of gradients (float, double) and statistics (double, int64) in host memory.
#if HETMESH_SEPARATE_COMPILATION
namespace hetmesh {
HETMESH_INSTANTIATE comm::loopback::communicator comm::split(comm::loopback::communicator&, int, int);
HETMESH_INSTANTIATE void train::sum_over_ranks(comm::loopback::communicator&, const model::host_memory&,
                                               std::span<float>, bool);
HETMESH_INSTANTIATE void train::sum_over_ranks(comm::loopback::communicator&, const model::host_memory&,
                                               std::span<double>, bool);
HETMESH_INSTANTIATE void train::sum_over_ranks(comm::loopback::communicator&, const model::host_memory&,
                                               std::span<std::int64_t>, bool);
}  // namespace hetmesh
#endif
