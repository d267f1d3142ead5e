// SPDX-License-Identifier: Apache-2.0
// Test helper: a communicator wrapper that forwards only the members the communicator concept
// requires (rank, size, ranks, group_p2p). Collectives over it take the generic point-to-point path,
// and code over it provably creates no communicator (it has no subgroup or split to call).
#pragma once

#include <span>

#include <hetmesh/comm/communicator.hpp>

namespace hetmesh::comm::testing {

template <class C>
class p2p_only {
 public:
  using is_communicator = void;
  static constexpr memory_space memory = C::memory;
  explicit p2p_only(C& c) : c_(c) {}
  [[nodiscard]] int rank() const { return c_.rank(); }
  [[nodiscard]] int size() const { return c_.size(); }
  [[nodiscard]] std::span<const int> ranks() const { return c_.ranks(); }
  void group_p2p(std::span<const p2p_op> ops) { c_.group_p2p(ops); }

 private:
  C& c_;
};

}  // namespace hetmesh::comm::testing
