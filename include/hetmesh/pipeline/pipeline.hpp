// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: everything of the pipeline room in one include. Plans only (they need only core);
// the executor that runs a schedule over a communicator is run::execute_pipeline (run/pipeline_executor.hpp).
#pragma once

#include "action.hpp"
#include "cost_model.hpp"
#include "dualpipe.hpp"
#include "generators.hpp"
#include "io.hpp"
#include "joint.hpp"
#include "lower.hpp"
#include "schedule_family.hpp"
#include "simulate.hpp"
#include "trace.hpp"
#include "verify.hpp"
#include "verify_report.hpp"
#include "zero_bubble.hpp"
