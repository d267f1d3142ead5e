// SPDX-License-Identifier: Apache-2.0
#include "commands.hpp"
namespace hetmesh_plan {
std::vector<subcommand> balance_commands() { return {}; }
}  // namespace hetmesh_plan
