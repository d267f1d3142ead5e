// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm internals for the MPI backend: status codes to exceptions, dtype and reduce_op to MPI
// handles, the MPI environment, and the deadline-bounded wait that turns a missing rank into
// timeout_error instead of a hang.
#pragma once

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../../core/error.hpp"
#include "../dtype.hpp"
#include "../reduce_op.hpp"
#include "deadline.hpp"

namespace hetmesh::comm::mpi {

/// MPI's own text for an error code.
[[nodiscard]] inline std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return hetmesh::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(len));
}

/// Throws backend_error carrying MPI's error text when `code` is not MPI_SUCCESS.
inline void check(int code, std::string_view call, std::string_view where) {
  if (code != MPI_SUCCESS)
    throw backend_error(hetmesh::format("{}: {} failed: {}", where, call, error_string(code)), code);
}

/// RAII MPI initialisation: initialises MPI (thread level `serialized`) unless it already is, and
/// finalises it on destruction only if this object initialised it. One per process, in main.
class environment {
 public:
  environment() : environment(nullptr, nullptr) {}
  environment(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread",
          "mpi::environment");
    owned_ = true;
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Finalize();
  }
  /// True when MPI is initialised and not finalised (in this process, by anyone).
  [[nodiscard]] static bool active() noexcept {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    return initialized && !finalized;
  }

 private:
  bool owned_ = false;
};

namespace detail {

[[nodiscard]] inline MPI_Datatype datatype(dtype t, std::string_view where) {
  switch (t) {
    case dtype::int8:
      return MPI_INT8_T;
    case dtype::uint8:
      return MPI_UINT8_T;
    case dtype::int16:
      return MPI_INT16_T;
    case dtype::uint16:
      return MPI_UINT16_T;
    case dtype::int32:
      return MPI_INT32_T;
    case dtype::uint32:
      return MPI_UINT32_T;
    case dtype::int64:
      return MPI_INT64_T;
    case dtype::uint64:
      return MPI_UINT64_T;
    case dtype::float32:
      return MPI_FLOAT;
    case dtype::float64:
      return MPI_DOUBLE;
    case dtype::float16:
    case dtype::bfloat16:
      break;
  }
  throw_error<invalid_argument>("{}: {} is a device type; expected a host arithmetic type on the MPI backend",
                                where, t);
}

[[nodiscard]] inline MPI_Op op(reduce_op r) noexcept {
  switch (r) {
    case reduce_op::prod:
      return MPI_PROD;
    case reduce_op::min:
      return MPI_MIN;
    case reduce_op::max:
      return MPI_MAX;
    case reduce_op::sum:
    case reduce_op::avg:
      return MPI_SUM;  // avg: sum, then divided locally (MPI has no average)
  }
  return MPI_SUM;
}

/// An element count as MPI's int, or invalid_argument beyond INT_MAX.
[[nodiscard]] inline int count(std::int64_t n, std::string_view where) {
  if (n < 0 || n > INT_MAX)
    throw_error<invalid_argument>("{}: count {} does not fit MPI's int; expected 0 <= count <= {}", where, n,
                                  INT_MAX);
  return static_cast<int>(n);
}
[[nodiscard]] inline std::vector<int> counts(std::span<const std::int64_t> v, std::string_view where) {
  std::vector<int> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = count(v[i], where);
  return out;
}

/// A 64-bit code of an operation's name, for the cross-rank signature check.
[[nodiscard]] constexpr std::int64_t op_code(std::string_view name) noexcept {
  std::uint64_t h = 1469598103934665603ULL;
  for (const char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ULL;
  return static_cast<std::int64_t>(h >> 1);
}

/// How a communicator waits for its nonblocking operations.
struct waiter {
  std::chrono::milliseconds timeout;
  bool blocking;

  /// Completes `reqs` or, past the deadline, throws timeout_error (the requests stay pending: the
  /// caller keeps them, since MPI cannot cancel a collective). Polls MPI_Testall in a loop, as
  /// MPI_Wait does internally (MPI's progress engine yields by itself when oversubscribed; yielding
  /// here too made each progress round of a nonblocking collective cost a time slice).
  /// Returns MPI_ERR_IN_STATUS when a request failed (statuses say which), MPI_SUCCESS otherwise.
  /// `where()` names the operation in errors (formatted only on error).
  template <class Where>
  int wait(std::span<MPI_Request> reqs, std::span<MPI_Status> statuses, Where&& where,
           const char* expected) const {
    const int n = static_cast<int>(reqs.size());
    MPI_Status* st = statuses.empty() ? MPI_STATUSES_IGNORE : statuses.data();
    if (blocking) {
      const int rc = MPI_Waitall(n, reqs.data(), st);
      if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) check(rc, "MPI_Waitall", where());
      return rc;
    }
    int rc = MPI_SUCCESS;
    const bool completed = comm::detail::poll_until(timeout, {.clock_every = 64}, [&] {
      int done = 0;
      rc = MPI_Testall(n, reqs.data(), &done, st);
      if (rc == MPI_ERR_IN_STATUS) return true;
      if (rc != MPI_SUCCESS) check(rc, "MPI_Testall", where());
      return done != 0;
    });
    if (!completed)
      throw timeout_error(
          hetmesh::format("{}: timed out after {} ms; expected {} (a rank is missing, or slower than the "
                          "timeout). The communicator is unusable from now on.",
                          where(), timeout.count(), expected));
    return rc;
  }
};

}  // namespace detail
}  // namespace hetmesh::comm::mpi
