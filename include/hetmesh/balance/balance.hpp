// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: the balancing room in one include (plans only; their execution is in run/).
#pragma once

#include "balancers.hpp"
#include "bytescale.hpp"
#include "dispatch.hpp"
#include "dp.hpp"
#include "hdp_common.hpp"
#include "model.hpp"
#include "partition.hpp"
#include "planner.hpp"
#include "reorder.hpp"
#include "reshard.hpp"
#include "solvers.hpp"
#include "strategies.hpp"
#include "strategy_plan.hpp"
#include "workload.hpp"
