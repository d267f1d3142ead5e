// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the training system. plan.hpp: partition families and the step plan; context.hpp: the
// stage context with the attention entry bound to ring attention; system.hpp: train::system (plan, run).
#pragma once

#include "context.hpp"
#include "plan.hpp"
#include "system.hpp"
