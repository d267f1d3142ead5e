// SPDX-License-Identifier: Apache-2.0
// hetmesh: the umbrella header. Includes every host-side room and the loopback backend; the MPI and
// NCCL backends are included when their component is linked (HETMESH_HAS_MPI, HETMESH_HAS_NCCL).
#pragma once

#include "config.hpp"
#include "core/core.hpp"

#include "mesh/mesh.hpp"

#include "comm/comm.hpp"

#include "balance/balance.hpp"
#include "cost/cost.hpp"
#include "data/data.hpp"
#include "model/model.hpp"
#include "pipeline/pipeline.hpp"
#include "seq/seq.hpp"

#include "run/run.hpp"

#include "train/train.hpp"
