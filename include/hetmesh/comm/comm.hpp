// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm: the communication room in one include: the communicator concepts, the collectives, the
// group cache, ring helpers and the loopback backend; the MPI backend when its component is linked
// (HETMESH_HAS_MPI). Included on their own where they are used: comm/nccl.hpp and comm/nccl_mpi.hpp (they
// need NCCL and the CUDA runtime) and comm/emulated_device.hpp (a device communicator without a GPU).
#pragma once

#include "../config.hpp"
#include "collectives.hpp"
#include "communicator.hpp"
#include "dtype.hpp"
#include "group_cache.hpp"
#include "loopback.hpp"
#include "reduce_op.hpp"
#include "ring.hpp"
#if HETMESH_HAS_MPI
#include "mpi.hpp"
#endif
