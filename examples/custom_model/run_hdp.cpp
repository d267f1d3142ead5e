// SPDX-License-Identifier: Apache-2.0
// example_custom_model --layout hdp: hybrid data parallelism with rings (runs.hpp).
#include "custom_model/layouts.hpp"
#include "custom_model/runs.hpp"

namespace custom {

int run_hdp(loopback_comm& world, const options& o) {
  return run_layout(world, o, hdp_layout(), no_pipeline{});
}

}  // namespace custom
