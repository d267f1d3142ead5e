// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the training system. partition_family.hpp: what a partition family, its balancer and its
// typed plan part are (concepts); families.hpp: the library's families; step_plan.hpp: the plan they lower
// to; context.hpp: the stage context with its attention entry; system.hpp: train::system (plan, run).
#pragma once

#include "build.hpp"
#include "checkpoint_state.hpp"
#include "context.hpp"
#include "delivery.hpp"
#include "families.hpp"
#include "parity.hpp"
#include "partition_family.hpp"
#include "pipeline_plan.hpp"
#include "report.hpp"
#include "step_plan.hpp"
#include "system.hpp"
