// SPDX-License-Identifier: Apache-2.0
// run::gather_tokens runs on the memory of its policy: a device communicator with a host memory policy is
// refused at compile time. The control passes a device policy (model::emulated_device_memory).
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/run/dispatch.hpp>

#include "fake_communicator.hpp"

int main() {
  compile_fail::fake_communicator<hetmesh::comm::memory_space::device> c;
  std::vector<double> src(4), dst(4);
#ifdef HETMESH_COMPILE_FAIL_CONTROL
  hetmesh::model::emulated_device_memory mem;
#else
  hetmesh::model::host_memory mem;
#endif
  hetmesh::run::gather_tokens(c, hetmesh::balance::dispatch_plan{}, std::span<const double>(src),
                              std::span<double>(dst), 1, mem);
}
