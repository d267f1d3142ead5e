// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the training system. plan.hpp: the step plan and how seq::'s partition families (placed
// by themselves or by a balance:: balancer) lower to it; context.hpp: the stage context with the
// attention entry bound to ring attention; system.hpp: train::system (plan, run).
#pragma once

#include "build.hpp"
#include "context.hpp"
#include "delivery.hpp"
#include "pipeline_plan.hpp"
#include "plan.hpp"
#include "report.hpp"
#include "system.hpp"
