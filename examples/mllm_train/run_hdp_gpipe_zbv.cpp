// SPDX-License-Identifier: Apache-2.0
// example_mllm_train: HDP with ByteScale's balancer under GPipe or ZB-V, with the joint pipeline
// (runs.hpp).
#include "mllm_train/run_policies.hpp"
#include "mllm_train/runs.hpp"

namespace mllm {

int run_hdp_gpipe_zbv(loopback_comm& world, const options& o, const config& mc, const data_config& dc) {
  namespace pipeline = hetmesh::pipeline;
  if (o.encoder != "joint")
    throw usage_error(
        fmt::format("--schedule {} is compiled with --encoder joint only, not {}", o.schedule, o.encoder));
  const auto hdp = hdp_partition(o, mc);
  if (o.schedule == "gpipe")
    return run_policies(world, o, mc, dc, hdp, hetmesh::balance::bytescale{}, pipeline::gpipe{},
                        pipeline::colocated_encoder{});
  if (o.schedule == "zbv")
    return run_policies(world, o, mc, dc, hdp, hetmesh::balance::bytescale{}, pipeline::zbv{},
                        pipeline::colocated_encoder{});
  throw usage_error(fmt::format("--schedule {}: expected gpipe or zbv here", o.schedule));
}

}  // namespace mllm
