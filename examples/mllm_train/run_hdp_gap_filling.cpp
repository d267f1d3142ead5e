// SPDX-License-Identifier: Apache-2.0
// example_mllm_train: HDP with the gap-filling balancer (runs.hpp).
#include "mllm_train/run_policies.hpp"
#include "mllm_train/runs.hpp"

namespace mllm {

int run_hdp_gap_filling(loopback_comm& world, const options& o, const config& mc, const data_config& dc) {
  return run_schedules<true>(world, o, mc, dc, hdp_partition(o, mc), hetmesh::balance::gap_filling_hdp{});
}

}  // namespace mllm
