// SPDX-License-Identifier: Apache-2.0
// example_mllm_train: pure DP (THD without CP) (runs.hpp).
#include "mllm_train/run_policies.hpp"
#include "mllm_train/runs.hpp"

namespace mllm {

int run_dp(loopback_comm& world, const options& o, const config& mc, const data_config& dc) {
  return run_schedules<true>(world, o, mc, dc, hetmesh::seq::cp_thd{.cp = 1, .pad = true},
                             hetmesh::train::family_placement{});
}

}  // namespace mllm
