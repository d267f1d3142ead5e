// SPDX-License-Identifier: Apache-2.0
// example_mllm_train: Ulysses over groups of 2 (runs.hpp).
#include "mllm_train/run_policies.hpp"
#include "mllm_train/runs.hpp"

namespace mllm {

int run_ulysses(loopback_comm& world, const options& o, const config& mc, const data_config& dc) {
  return run_schedules<true>(world, o, mc, dc,
                             hetmesh::seq::ulysses{.degree = 2,
                                                   .heads = mc.attn.q_heads / o.tp,  // this tp rank's heads
                                                   .kv_heads = mc.attn.kv_heads / o.tp,
                                                   .head_dim = mc.attn.head_dim},
                             hetmesh::train::family_placement{});
}

}  // namespace mllm
