// SPDX-License-Identifier: Apache-2.0
// example_mllm_train under MPI: HDP with ByteScale's balancer, the joint pipeline, 1F1B or zero-bubble
// (runs.hpp).
#include "mllm_train/run_policies.hpp"
#include "mllm_train/runs.hpp"

namespace mllm {

int run_hdp_bytescale(hetmesh::comm::mpi::communicator& world, const options& o, const config& mc,
                      const data_config& dc) {
  return run_schedules<false>(world, o, mc, dc, hdp_partition(o, mc), hetmesh::balance::bytescale{});
}

}  // namespace mllm
