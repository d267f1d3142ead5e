// SPDX-License-Identifier: Apache-2.0
// example_torch_train --layout dp: data parallel (runs.hpp).
#include "torch_train/layouts.hpp"
#include "torch_train/run.hpp"
#include "torch_train/runs.hpp"

namespace torch_train {

int run_dp(loopback_comm& world, const options& o, const reference_run* ref) {
  return run_layout(world, o, ref, data_parallel, no_pipeline{});
}

}  // namespace torch_train
