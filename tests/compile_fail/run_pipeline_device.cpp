// SPDX-License-Identifier: Apache-2.0
// run::execute_pipeline on a device communicator needs a device memory policy: called without one (the host
// overload, model::host_memory) it is refused at compile time; the control passes
// model::emulated_device_memory and compiles.
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/run/pipeline_executor.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::fake_communicator<hetmesh::memory_space::device> c;
#ifdef HETMESH_COMPILE_FAIL_CONTROL
  hetmesh::model::emulated_device_memory mem;
  hetmesh::run::execute_pipeline(c, hetmesh::pipeline::schedule{}, hetmesh::run::stage_functions<float>{},
                                 hetmesh::run::activation_sizes{}, mem);
#else
  hetmesh::run::execute_pipeline(c, hetmesh::pipeline::schedule{}, hetmesh::run::stage_functions<float>{},
                                 hetmesh::run::activation_sizes{});
#endif
}
