// SPDX-License-Identifier: Apache-2.0
// Long-short attention runs on the memory of its policy: device communicators for the items' groups
// without a device memory policy (the call without one uses model::host_memory) are refused at compile
// time. The control passes a device policy (model::emulated_device_memory) with the same communicators.
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/run/long_short_attention.hpp>

#include "fake_communicator.hpp"

int main() {
  using device = compile_fail::fake_communicator<hetmesh::comm::memory_space::device>;
  device c;
  auto group_of = [&](const hetmesh::model::encoder_piece&) -> device& { return c; };
  const hetmesh::model::reference_attention kernel;
  std::vector<double> q(6), k(6), v(6), out(6), lse(2);
  const hetmesh::run::long_short_attention_input<double> in{{2, 2, 3}, 0.5, q, k, v};
#ifdef HETMESH_COMPILE_FAIL_CONTROL
  hetmesh::model::emulated_device_memory mem;
  hetmesh::run::long_short_attention_forward(group_of, hetmesh::model::encoder_batch_view{}, kernel, in,
                                             std::span<double>(out), std::span<double>(lse), mem);
#else
  hetmesh::run::long_short_attention_forward(group_of, hetmesh::model::encoder_batch_view{}, kernel, in,
                                             std::span<double>(out), std::span<double>(lse));
#endif
}
