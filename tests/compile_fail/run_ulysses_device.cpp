// SPDX-License-Identifier: Apache-2.0
// The Ulysses exchange runs on the memory of its policy: a device communicator without a device memory
// policy (the call without one uses model::host_memory) is refused at compile time. The control passes a
// device policy (model::emulated_device_memory) with the same device communicator.
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/run/ulysses.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::fake_communicator<hetmesh::comm::memory_space::device> c;
  std::vector<float> q(4), out(4);
#ifdef HETMESH_COMPILE_FAIL_CONTROL
  hetmesh::model::emulated_device_memory mem;
  hetmesh::run::ulysses_to_heads(c, hetmesh::seq::ulysses_plan{}, hetmesh::run::ulysses_part::query,
                                 std::span<const float>(q), std::span<float>(out), mem);
#else
  hetmesh::run::ulysses_to_heads(c, hetmesh::seq::ulysses_plan{}, hetmesh::run::ulysses_part::query,
                                 std::span<const float>(q), std::span<float>(out));
#endif
}
