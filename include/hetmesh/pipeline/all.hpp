// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: everything of the pipeline room in one include. Planning headers (action, io,
// generators, lower, verify, simulate, joint, trace) need only core; executor.hpp adds comm.
#pragma once

#include "action.hpp"
#include "executor.hpp"
#include "generators.hpp"
#include "io.hpp"
#include "joint.hpp"
#include "lower.hpp"
#include "simulate.hpp"
#include "trace.hpp"
#include "verify.hpp"
