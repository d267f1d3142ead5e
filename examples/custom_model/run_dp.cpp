// SPDX-License-Identifier: Apache-2.0
// example_custom_model --layout dp: whole documents per rank (runs.hpp).
#include "custom_model/layouts.hpp"
#include "custom_model/runs.hpp"

namespace custom {

int run_dp(loopback_comm& world, const options& o) {
  return run_layout(world, o, hetmesh::seq::cp_thd{.cp = 1}, no_pipeline{});
}

}  // namespace custom
