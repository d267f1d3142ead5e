// SPDX-License-Identifier: Apache-2.0
// example_torch_train --layout hdp: HDP with the joint 2-stage pipeline (runs.hpp).
#include "torch_train/layouts.hpp"
#include "torch_train/run.hpp"
#include "torch_train/runs.hpp"

namespace torch_train {

int run_hdp(loopback_comm& world, const options& o, const reference_run* ref) {
  return run_layout(world, o, ref, hdp_layout(), joint_pipeline{.pp = 2});
}

}  // namespace torch_train
