// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan: the subcommand table. Each family lives in its own file (cmd_*.cpp) and returns its
// subcommands; main dispatches by name. A subcommand writes its whole output to the stream it is
// given only after planning succeeded, so a failure never leaves half a document on stdout.
#pragma once

#include <ostream>
#include <vector>

#include "args.hpp"

namespace hetmesh_plan {

/// One subcommand: its options (and --help text) and the function that runs it.
struct subcommand {
  command_spec spec;
  void (*run)(const parsed& args, std::ostream& out);
};

std::vector<subcommand> mesh_commands();                   // cmd_mesh.cpp: mesh
void run_mesh_moe(const parsed& args, std::ostream& out);  // cmd_mesh_moe.cpp: mesh --moe
std::vector<subcommand> cp_commands();                     // cmd_cp.cpp: cp
std::vector<subcommand> pipeline_commands();               // cmd_pipeline.cpp: pipeline, simulate
std::vector<subcommand> balance_commands();                // cmd_balance.cpp: compare, balance

}  // namespace hetmesh_plan
