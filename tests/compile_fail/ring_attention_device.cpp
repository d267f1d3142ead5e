// SPDX-License-Identifier: Apache-2.0
// Ring attention on a device communicator needs a device memory policy: the call without one (host
// memory, model::host_memory by default) is refused at compile time with a message that says so. The
// control build passes model::emulated_device_memory and compiles.
#include <span>
#include <vector>

#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/run/ring_attention.hpp>

struct fake_comm {
  using is_communicator = void;
  static constexpr hetmesh::comm::memory_space memory = hetmesh::comm::memory_space::device;
  int rank() const { return 0; }
  int size() const { return 1; }
  std::span<const int> ranks() const { return {&me, 1}; }
  void group_p2p(std::span<const hetmesh::comm::p2p_op>) {}
  int me = 0;
};

int main() {
  fake_comm c;
  const auto s = hetmesh::seq::make_ring_schedule({0}, {{{0, 0, {0, 2}, 0}}});
  hetmesh::model::reference_attention k;
  std::vector<double> q(2), out(2), lse(2);
  const hetmesh::run::ring_attention_input<double> in{{1, 1, 1}, 1.0, q, q, q};
#ifdef HETMESH_COMPILE_FAIL_CONTROL
  hetmesh::model::emulated_device_memory mem;
  hetmesh::run::ring_attention_forward(c, s, k, in, std::span<double>(out), std::span<double>(lse), mem);
#else
  hetmesh::run::ring_attention_forward(c, s, k, in, std::span<double>(out), std::span<double>(lse));
#endif
}
