// SPDX-License-Identifier: Apache-2.0
// run::dispatch_tokens runs on the memory of its policy: a device communicator without a device memory
// policy (the call without one uses model::host_memory) is refused at compile time. The control passes a
// device policy (model::emulated_device_memory) with the same device communicator.
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/run/dispatch.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::fake_communicator<hetmesh::comm::memory_space::device> c;
  std::vector<std::int32_t> src(4), dst(4);
#ifdef HETMESH_COMPILE_FAIL_CONTROL
  hetmesh::model::emulated_device_memory mem;
  hetmesh::run::dispatch_tokens(c, hetmesh::balance::dispatch_plan{}, std::span<const std::int32_t>(src),
                                std::span<std::int32_t>(dst), 1, mem);
#else
  hetmesh::run::dispatch_tokens(c, hetmesh::balance::dispatch_plan{}, std::span<const std::int32_t>(src),
                                std::span<std::int32_t>(dst), 1);
#endif
}
