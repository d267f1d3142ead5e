// SPDX-License-Identifier: Apache-2.0
// example_custom_model --backend mpi: the pipeline layout over MPI processes (runs.hpp).
#include "custom_model/layouts.hpp"
#include "custom_model/runs.hpp"

namespace custom {

int run_pipeline_mpi(hetmesh::comm::mpi::communicator& world, const options& o) {
  return run_layout(world, o, kCp, joint_pipeline{.pp = 2});
}

}  // namespace custom
