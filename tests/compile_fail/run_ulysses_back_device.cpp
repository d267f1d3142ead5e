// SPDX-License-Identifier: Apache-2.0
// The inverse Ulysses exchange runs on the memory of its policy: a device communicator with a host memory
// policy is refused at compile time. The control passes a device policy (model::emulated_device_memory).
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/run/ulysses.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::fake_communicator<hetmesh::comm::memory_space::device> c;
  std::vector<float> heads(4), seq(4);
#ifdef HETMESH_COMPILE_FAIL_CONTROL
  hetmesh::model::emulated_device_memory mem;
#else
  hetmesh::model::host_memory mem;
#endif
  hetmesh::run::ulysses_to_sequence(c, hetmesh::seq::ulysses_plan{}, hetmesh::run::ulysses_part::key_value,
                                    std::span<const float>(heads), std::span<float>(seq), mem,
                                    hetmesh::run::ulysses_combine::sum);
}
