// SPDX-License-Identifier: Apache-2.0
// example_mllm_train: static CP (zigzag over groups of 2) (runs.hpp).
#include "mllm_train/run_policies.hpp"
#include "mllm_train/runs.hpp"

namespace mllm {

int run_static_cp(loopback_comm& world, const options& o, const config& mc, const data_config& dc) {
  return run_schedules<true>(world, o, mc, dc, hetmesh::seq::cp_zigzag{.cp = 2, .pad = true},
                             hetmesh::train::family_placement{});
}

}  // namespace mllm
