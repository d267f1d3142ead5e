// SPDX-License-Identifier: Apache-2.0
// run::execute_pipeline on a device communicator with a host memory policy (model::host_memory) is refused
// at compile time: the policy's space must be the communicator's. The control passes
// model::emulated_device_memory and compiles.
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/run/pipeline_executor.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::fake_communicator<hetmesh::memory_space::device> c;
#ifdef HETMESH_COMPILE_FAIL_CONTROL
  hetmesh::model::emulated_device_memory mem;
#else
  hetmesh::model::host_memory mem;
#endif
  hetmesh::run::execute_pipeline(c, hetmesh::pipeline::schedule{}, hetmesh::run::stage_functions<float>{},
                                 hetmesh::run::activation_sizes{}, mem);
}
