// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm::loopback: N ranks as threads of one process, host memory. For tests, CPU runs and
// examples; every wait has a deadline, so a missing rank or a failing rank never hangs the others.
//
//   hetmesh::comm::loopback::run(4, [](hetmesh::comm::loopback::communicator& c) {
//     std::vector<double> g(1024, c.rank());
//     hetmesh::comm::all_reduce(c, std::span(g), hetmesh::comm::reduce_op::sum);
//   });
//
// The typed members are one-line forwards to untyped ones (pointers, a dtype, counts), which are
// HETMESH_COMPILED: their bodies, the shared state behind the ranks (detail/loopback_state.hpp) and the
// threads of run() are in detail/loopback_impl.hpp, compiled once under HETMESH_SEPARATE_COMPILATION, so
// a translation unit that trains over loopback ranks neither parses <thread> nor generates a collective.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>

#include "../config.hpp"
#include "../core/dtype.hpp"
#include "../core/function_ref.hpp"
#include "communicator.hpp"
#include "reduce_op.hpp"

namespace hetmesh::comm::loopback {

namespace detail {
class world_state;  // every group of one run() (detail/loopback_state.hpp)
class group_state;  // one group's rendezvous (detail/loopback_state.hpp)
}  // namespace detail

/// A handle of one rank (one thread) on one group. Cheap to copy (copies share the rank's place in
/// the group; use one copy per thread at a time). Collective members below are called through the free
/// functions of collectives.hpp, which check arguments first; they check cross-rank agreement (same
/// collective, dtype, counts, root, op) on every call and raise mismatch_error on every rank when the
/// posts disagree.
class communicator {
 public:
  /// Marks the type as a communicator (opt-in, as the concepts require).
  using is_communicator = void;
  /// Buffers are host memory.
  static constexpr memory_space memory = memory_space::host;

  /// A handle of `rank` on `group` in `world`, waiting at most `timeout`. Made by loopback::run and
  /// subgroup(), not by users.
  HETMESH_COMPILED communicator(std::shared_ptr<detail::world_state> world,
                                std::shared_ptr<detail::group_state> group, int rank,
                                std::chrono::milliseconds timeout);

  /// This rank's index within the group, 0 <= rank() < size().
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks in the group.
  [[nodiscard]] int size() const noexcept { return static_cast<int>(members_.size()); }
  /// The group's members as ranks of the world, in group order.
  [[nodiscard]] std::span<const int> ranks() const noexcept { return members_; }

  /// How long any wait of this handle lasts before it raises timeout_error.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Sets how long waits of this handle last. Pre: t > 0; otherwise invalid_argument. Local, not collective.
  HETMESH_COMPILED void set_timeout(std::chrono::milliseconds t);

  /// A communicator over `members` (ranks of this communicator, in the new group's order). Collective
  /// over the members only (not blocking: the first member creates the shared state). Every member
  /// passes the same list; calling it again for the same list makes a second, distinct group.
  /// Pre: members non-empty, distinct, in range, containing this rank.
  [[nodiscard]] HETMESH_COMPILED communicator subgroup(std::span<const int> members) const;

  /// Backend of comm::all_reduce (collectives.hpp), which checks the arguments first and holds the contract.
  /// Every rank gets the same bits, the same as reducing rank 0, 1, ... in turn.
  template <host_element T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    all_reduce_raw(dtype_of_v<T>, inout.data(), inout.size(), op);
  }

  /// Backend of comm::broadcast (collectives.hpp), which checks the arguments first and holds the contract.
  template <element T>
  void broadcast(std::span<T> buf, int root) {
    broadcast_raw(dtype_of_v<T>, buf.data(), buf.size(), root);
  }

  /// Backend of comm::all_gather (collectives.hpp), which checks the arguments first and holds the contract.
  template <element T>
  void all_gather(std::span<const T> send, std::span<T> recv) {
    all_gather_raw(dtype_of_v<T>, send.data(), send.size(), recv.data());
  }

  /// Backend of comm::all_gather_v (collectives.hpp), which checks the arguments first and holds the
  /// contract.
  template <element T>
  void all_gather_v(std::span<const T> send, std::span<T> recv, std::span<const std::int64_t> recv_counts,
                    std::span<const std::int64_t> recv_displs) {
    all_gather_v_raw(dtype_of_v<T>, send.data(), send.size(), recv.data(), recv_counts, recv_displs);
  }

  /// Backend of comm::reduce_scatter (collectives.hpp), which checks the arguments first and holds the
  /// contract.
  template <host_element T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, reduce_op op) {
    reduce_scatter_raw(dtype_of_v<T>, send.data(), recv.data(), recv.size(), op);
  }

  /// Backend of comm::all_to_all_v (collectives.hpp), which checks the arguments first and holds the
  /// contract.
  template <element T>
  void all_to_all_v(std::span<const T> send, std::span<const std::int64_t> send_counts,
                    std::span<const std::int64_t> send_displs, std::span<T> recv,
                    std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_displs) {
    all_to_all_v_raw(dtype_of_v<T>, send.data(), send.size(), send_counts, send_displs, recv.data(),
                     recv_counts, recv_displs);
  }

  /// Backend of comm::barrier (collectives.hpp): returns once every rank of the group has entered it.
  HETMESH_COMPILED void barrier();

  /// Sends are eager (copied into the receiver's mailbox), so they all complete before the receives
  /// wait: any batch whose messages match completes. Receives require exactly their count and dtype.
  HETMESH_COMPILED void group_p2p(std::span<const p2p_op> ops);

 private:
  // The untyped collectives: `count` elements of `type` (dtype_size bytes each) at each pointer.
  HETMESH_COMPILED void all_reduce_raw(dtype type, void* inout, std::size_t count, reduce_op op);
  HETMESH_COMPILED void broadcast_raw(dtype type, void* buf, std::size_t count, int root);
  HETMESH_COMPILED void all_gather_raw(dtype type, const void* send, std::size_t count, void* recv);
  HETMESH_COMPILED void all_gather_v_raw(dtype type, const void* send, std::size_t count, void* recv,
                                         std::span<const std::int64_t> recv_counts,
                                         std::span<const std::int64_t> recv_displs);
  HETMESH_COMPILED void reduce_scatter_raw(dtype type, const void* send, void* recv, std::size_t count,
                                           reduce_op op);
  HETMESH_COMPILED void all_to_all_v_raw(dtype type, const void* send, std::size_t count,
                                         std::span<const std::int64_t> send_counts,
                                         std::span<const std::int64_t> send_displs, void* recv,
                                         std::span<const std::int64_t> recv_counts,
                                         std::span<const std::int64_t> recv_displs);

  std::shared_ptr<detail::world_state> world_;
  std::shared_ptr<detail::group_state> group_;
  std::span<const int> members_;  // the group's members (owned by *group_, which this handle keeps alive)
  int rank_;
  std::chrono::milliseconds timeout_;
};

static_assert(comm::host_communicator<communicator> && !comm::device_communicator<communicator>);

namespace detail {
/// loopback::run's body, over a reference to the caller's callable.
HETMESH_COMPILED void run_ranks(int nranks, function_ref<void(communicator&)> body,
                                std::chrono::milliseconds timeout);
}  // namespace detail

/// Runs body(communicator&) on `nranks` threads, one per rank of a fresh world, and returns when all
/// have finished. When a rank's body throws, every group of the world is aborted so the other ranks'
/// waits raise (aborted_error, or timeout_error if the cause was a timeout) instead of hanging; then
/// `run` rethrows, on the caller, the exception of the lowest rank whose failure was its own (not an
/// aborted_error induced by another rank), or the lowest rank's if all were induced.
/// Pre: nranks >= 1, timeout > 0. Cost: nranks thread creations.
template <class F>
void run(int nranks, F&& body,
         std::chrono::milliseconds timeout = std::chrono::milliseconds(HETMESH_DEFAULT_TIMEOUT_MS)) {
  detail::run_ranks(nranks, function_ref<void(communicator&)>(body), timeout);
}

}  // namespace hetmesh::comm::loopback

#if HETMESH_BODIES
#include "detail/loopback_impl.hpp"
#endif
