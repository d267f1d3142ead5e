// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm internals: the deadline-bounded polling loop of the backends whose operations complete
// asynchronously (MPI's nonblocking requests, NCCL's non-blocking mode and streams). Each backend says
// how to poll and what a timeout means; the loop, the clock and the pacing live here once.
#pragma once

#include <chrono>
#include <thread>

namespace hetmesh::comm::detail {

/// How often the loop reads the clock and when it starts yielding the core.
struct poll_pacing {
  unsigned clock_every = 1;   ///< read the clock on every clock_every-th poll (the clock costs too)
  unsigned yield_from = ~0u;  ///< from this poll index on, yield after each unsuccessful poll
};

/// Calls `done()` until it returns true (returns true) or until `timeout` has passed (returns false;
/// the caller raises its own error). Poll k (from 0) is followed, when unsuccessful, by a clock read
/// if k % clock_every == clock_every - 1, then by std::this_thread::yield() if k >= yield_from.
/// `done` may throw (a backend error); it is never called after the deadline is seen.
/// Pre: pace.clock_every >= 1. Blocks the calling thread for at most about `timeout`. Not collective.
template <class Done>
[[nodiscard]] bool poll_until(std::chrono::milliseconds timeout, poll_pacing pace, Done&& done) {
  if (done()) return true;  // most calls end here: no clock read at all
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (unsigned spin = 0;; ++spin) {
    if (spin % pace.clock_every == pace.clock_every - 1 && std::chrono::steady_clock::now() > deadline)
      return false;
    if (spin >= pace.yield_from) std::this_thread::yield();
    if (done()) return true;
  }
}

}  // namespace hetmesh::comm::detail
