// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm::nccl over MPI: the bootstrap that creates an NCCL communicator across processes.
// Rank 0 of the MPI communicator creates the unique id, MPI broadcasts it, and every rank joins.
#pragma once

#include "../config.hpp"

#if HETMESH_HAS_NCCL && HETMESH_HAS_MPI

#include <span>
#include <vector>

#include "collectives.hpp"
#include "mpi.hpp"
#include "nccl.hpp"

namespace hetmesh::comm::nccl {

/// An NCCL communicator over the same ranks as `m`, in the same order, on CUDA device `device`.
/// Collective over m (the id broadcast is bounded by m's timeout; the NCCL init by opt.timeout).
/// ranks() reports m's global (MPI_COMM_WORLD) ranks.
[[nodiscard]] inline communicator init_from_mpi(mpi::communicator& m, int device, options opt = {}) {
  ncclUniqueId id{};
  if (m.rank() == 0) id = unique_id();
  comm::broadcast(m, std::span<char>(id.internal, sizeof(id.internal)), 0);
  return communicator::init(id, m.size(), m.rank(), device, opt,
                            std::vector<int>(m.ranks().begin(), m.ranks().end()));
}

}  // namespace hetmesh::comm::nccl

#endif
