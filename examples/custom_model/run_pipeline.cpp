// SPDX-License-Identifier: Apache-2.0
// example_custom_model --layout pipeline: the 2-stage joint encoder-LLM pipeline (runs.hpp).
#include "custom_model/layouts.hpp"
#include "custom_model/runs.hpp"

namespace custom {

int run_pipeline(loopback_comm& world, const options& o) {
  return run_layout(world, o, kCp, joint_pipeline{.pp = 2});
}

}  // namespace custom
