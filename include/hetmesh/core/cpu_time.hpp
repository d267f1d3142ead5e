// SPDX-License-Identifier: Apache-2.0
// hetmesh::core: the calling thread's CPU time. Ranks that share cores (loopback threads, oversubscribed
// MPI processes) see their wall times stretched by each other; CPU time measures the work a rank did.
#pragma once

#include <time.h>
#include "../config.hpp"

namespace hetmesh {

/// Seconds of CPU time the calling thread has used (POSIX CLOCK_THREAD_CPUTIME_ID); 0 where the clock
/// is unavailable. Differences of two calls on one thread measure the work in between.
[[nodiscard]] HETMESH_COMPILED double thread_cpu_seconds() noexcept;

}  // namespace hetmesh

#if HETMESH_BODIES

namespace hetmesh {

HETMESH_COMPILED double thread_cpu_seconds() noexcept {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0.0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace hetmesh
#endif  // HETMESH_BODIES
