// SPDX-License-Identifier: Apache-2.0
// Runs a test body on loopback ranks and keeps rank 0's result: the tests whose ranks all reduce their
// verdict to the same value (ring attention, the training system) check it once, on the test's thread.
#pragma once

#include <mutex>
#include <utility>

#include <hetmesh/comm/loopback.hpp>

namespace testsupport {

/// Runs body(world) on `ranks` loopback ranks (threads) and returns what rank 0's call returned. The
/// result type must be default-constructible and copyable.
template <class Body>
auto rank0_of(int ranks, Body body) {
  decltype(body(std::declval<hetmesh::comm::loopback::communicator&>())) out{};
  std::mutex m;
  hetmesh::comm::loopback::run(ranks, [&](hetmesh::comm::loopback::communicator& c) {
    auto v = body(c);
    if (c.rank() == 0) {
      std::lock_guard lock(m);
      out = std::move(v);
    }
  });
  return out;
}

}  // namespace testsupport
