// SPDX-License-Identifier: Apache-2.0
// hetmesh: the umbrella header. Includes every host-side room and the loopback backend; the MPI and
// NCCL backends are included when their component is linked (HETMESH_HAS_MPI, HETMESH_HAS_NCCL).
#pragma once

#include "config.hpp"
#include "core/assert.hpp"
#include "core/checked.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/exactly_once.hpp"
#include "core/format.hpp"
#include "core/hash.hpp"
#include "core/integral.hpp"
#include "core/lines.hpp"
#include "core/numeric.hpp"
#include "core/random.hpp"
#include "core/sort.hpp"

#include "mesh/mesh.hpp"

#include "comm/collectives.hpp"
#include "comm/group_cache.hpp"
#include "comm/loopback.hpp"
#include "comm/ring.hpp"
#if HETMESH_HAS_MPI
#include "comm/mpi.hpp"
#endif

#include "balance/balance.hpp"
#include "cost/cost.hpp"
#include "data/all.hpp"
#include "model/model.hpp"
#include "pipeline/all.hpp"
#include "seq/seq.hpp"

#include "run/run.hpp"

#include "train/train.hpp"
