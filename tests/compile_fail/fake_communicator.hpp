// SPDX-License-Identifier: Apache-2.0
// A communicator type for compile-fail tests that run without a GPU: it models device_communicator
// (memory = device, a stream type, set_stream, synchronize) but never runs. With
// -DHETMESH_COMPILE_FAIL_CONTROL, `test_communicator` is the same type with host memory, which the
// runtime pieces accept: the control build proves the failure is the memory space and nothing else.
#pragma once

#include <span>

#include <hetmesh/comm/communicator.hpp>

namespace compile_fail {

/// A do-nothing communicator of one rank whose buffers live in `Memory`.
template <hetmesh::comm::memory_space Memory>
struct fake_communicator {
  using is_communicator = void;
  static constexpr hetmesh::comm::memory_space memory = Memory;
  using stream_type = void*;
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  [[nodiscard]] std::span<const int> ranks() const { return {&zero_, 1}; }
  void group_p2p(std::span<const hetmesh::comm::p2p_op>) {}
  [[nodiscard]] void* stream() const { return nullptr; }
  void set_stream(void*) {}
  void synchronize() {}
  [[nodiscard]] fake_communicator subgroup(std::span<const int>) const { return {}; }

 private:
  int zero_ = 0;
};

static_assert(hetmesh::comm::device_communicator<fake_communicator<hetmesh::comm::memory_space::device>>);
static_assert(hetmesh::comm::host_communicator<fake_communicator<hetmesh::comm::memory_space::host>>);

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using test_communicator = fake_communicator<hetmesh::comm::memory_space::host>;
#else
using test_communicator = fake_communicator<hetmesh::comm::memory_space::device>;
#endif

}  // namespace compile_fail
