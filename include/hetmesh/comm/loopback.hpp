// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm::loopback: N ranks as threads of one process, host memory. For tests, CPU runs and
// examples; every wait has a deadline, so a missing rank or a failing rank never hangs the others.
//
//   hetmesh::comm::loopback::run(4, [](hetmesh::comm::loopback::communicator& c) {
//     std::vector<double> g(1024, c.rank());
//     hetmesh::comm::all_reduce(c, std::span(g), hetmesh::comm::reduce_op::sum);
//   });
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../core/error.hpp"
#include "communicator.hpp"
#include "detail/loopback_reduce.hpp"
#include "detail/loopback_state.hpp"
#include "reduce_op.hpp"

namespace hetmesh::comm::loopback {

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
  communicator(std::shared_ptr<detail::world_state> world, std::shared_ptr<detail::group_state> group,
               int rank, std::chrono::milliseconds timeout)
      : world_(std::move(world)), group_(std::move(group)), rank_(rank), timeout_(timeout) {}

  /// This rank's index within the group, 0 <= rank() < size().
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks in the group.
  [[nodiscard]] int size() const noexcept { return group_->size(); }
  /// The group's members as ranks of the world, in group order.
  [[nodiscard]] std::span<const int> ranks() const noexcept { return group_->members(); }

  /// How long any wait of this handle lasts before it raises timeout_error.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Sets how long waits of this handle last. Pre: t > 0; otherwise invalid_argument. Local, not collective.
  void set_timeout(std::chrono::milliseconds t) {
    if (t.count() <= 0) throw_error<invalid_argument>("loopback timeout of {} ms; expected > 0", t.count());
    timeout_ = t;
  }

  /// A communicator over `members` (ranks of this communicator, in the new group's order). Collective
  /// over the members only (not blocking: the first member creates the shared state). Every member
  /// passes the same list; calling it again for the same list makes a second, distinct group.
  /// Pre: members non-empty, distinct, in range, containing this rank.
  [[nodiscard]] communicator subgroup(std::span<const int> members) const {
    if (members.empty())
      throw_error<invalid_argument>(
          "loopback subgroup on {}: the member list is empty; expected at least this rank",
          comm::describe(*this));
    std::vector<int> global;
    int me = -1;
    for (std::size_t i = 0; i < members.size(); ++i) {
      const int r = members[i];
      if (r < 0 || r >= size())
        throw_error<invalid_argument>(
            "loopback subgroup on {}: member {} is out of range; expected 0 <= rank < {}",
            comm::describe(*this), r, size());
      if (std::find(members.begin(), members.begin() + static_cast<std::ptrdiff_t>(i), r) !=
          members.begin() + static_cast<std::ptrdiff_t>(i))
        throw_error<invalid_argument>(
            "loopback subgroup on {}: rank {} appears twice in [{}]; expected distinct ranks",
            comm::describe(*this), r, fmt::join(members, ","));
      if (r == rank_) me = static_cast<int>(i);
      global.push_back(ranks()[static_cast<std::size_t>(r)]);
    }
    if (me < 0)
      throw_error<invalid_argument>(
          "loopback subgroup on {}: [{}] does not contain this rank; expected only members "
          "to create a group",
          comm::describe(*this), fmt::join(members, ","));
    return communicator(world_, world_->join(global, ranks()[static_cast<std::size_t>(rank_)]), me, timeout_);
  }

  /// Backend of comm::all_reduce (collectives.hpp), which checks the arguments first and holds the contract.
  template <host_element T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    const auto n = static_cast<std::size_t>(size()), m = inout.size(), me = static_cast<std::size_t>(rank_);
    detail::post p = make_post("all_reduce", dtype_of_v<T>, static_cast<std::int64_t>(m), 0, op, inout.data(),
                               inout.data());
    // Reduce-scatter and all-gather in one pass: rank i alone reads slice i of every rank's buffer, so
    // once it has combined a block of it (in rank order: detail::reduce_slice) it writes the result
    // straight into that block of every rank's buffer; no other rank reads or writes there. Per rank: m
    // elements read (m / n from each rank) and m written (m / n to each rank), the traffic of one memcpy
    // of the buffer; no scratch. Every rank gets the same bits, the same as reducing rank 0, 1, ... in
    // turn. The release phase keeps each rank's buffer alive until every rank has written its slice.
    const std::size_t lo = m * me / n, hi = m * (me + 1) / n;
    std::vector<const T*> srcs(n);  // allocated before the exchange: the compute phase never throws
    std::vector<T*> dsts(n);
    exchange(
        p, [&](std::span<const detail::post> ps) { return verify_uniform(ps, true, false); },
        [&](std::span<const detail::post> ps) {
          if (hi == lo) return;
          for (std::size_t k = 0; k < ps.size(); ++k) {
            srcs[k] = static_cast<const T*>(ps[k].send) + lo;
            dsts[k] = static_cast<T*>(ps[k].recv) + lo;
          }
          detail::reduce_slice(std::span<T* const>(dsts), std::span<const T* const>(srcs), hi - lo, op,
                               size());
        });
  }

  /// Backend of comm::broadcast (collectives.hpp), which checks the arguments first and holds the contract.
  template <element T>
  void broadcast(std::span<T> buf, int root) {
    detail::post p = make_post("broadcast", dtype_of_v<T>, static_cast<std::int64_t>(buf.size()), root,
                               reduce_op::sum, buf.data(), buf.data());
    exchange(
        p, [&](std::span<const detail::post> ps) { return verify_uniform(ps, false, true); },
        [&](std::span<const detail::post> ps) {
          if (rank_ != root && !buf.empty())
            std::memcpy(buf.data(), ps[static_cast<std::size_t>(root)].send, buf.size_bytes());
        });
  }

  /// Backend of comm::all_gather (collectives.hpp), which checks the arguments first and holds the contract.
  template <element T>
  void all_gather(std::span<const T> send, std::span<T> recv) {
    detail::post p = make_post("all_gather", dtype_of_v<T>, static_cast<std::int64_t>(send.size()), 0,
                               reduce_op::sum, send.data(), recv.data());
    exchange(
        p, [&](std::span<const detail::post> ps) { return verify_uniform(ps, false, false); },
        [&](std::span<const detail::post> ps) {
          for (std::size_t j = 0; j < ps.size(); ++j)
            copy_block(recv.data() + j * send.size(), ps[j].send, send.size());
        });
  }

  /// Backend of comm::all_gather_v (collectives.hpp), which checks the arguments first and holds the
  /// contract.
  template <element T>
  void all_gather_v(std::span<const T> send, std::span<T> recv, std::span<const std::int64_t> recv_counts,
                    std::span<const std::int64_t> recv_displs) {
    detail::post p = make_post("all_gather_v", dtype_of_v<T>, static_cast<std::int64_t>(send.size()), 0,
                               reduce_op::sum, send.data(), recv.data());
    p.recv_counts = recv_counts;
    const auto me = static_cast<std::size_t>(rank_);
    exchange(
        p,
        [&](std::span<const detail::post> ps) -> std::string {
          if (auto v = verify_signature(ps); !v.empty()) return v;
          for (std::size_t i = 0; i < ps.size(); ++i)
            for (std::size_t j = 0; j < ps.size(); ++j)
              if (ps[i].recv_counts[j] != ps[j].count)
                return hetmesh::format(
                    "rank {} expects {} elements from rank {}, which sends {}; expected recv_counts "
                    "equal on every rank and recv_counts[j] equal to rank j's send count",
                    i, ps[i].recv_counts[j], j, ps[j].count);
          return {};
        },
        [&](std::span<const detail::post> ps) {
          // Straight from each sender's buffer, once; from the next rank on, so ranks spread their reads.
          for (std::size_t k = 0; k < ps.size(); ++k) {
            const std::size_t j = (me + k) % ps.size();
            copy_block(recv.data() + recv_displs[j], ps[j].send, static_cast<std::size_t>(recv_counts[j]));
          }
        });
  }

  /// Backend of comm::reduce_scatter (collectives.hpp), which checks the arguments first and holds the
  /// contract.
  template <host_element T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, reduce_op op) {
    const auto m = recv.size(), me = static_cast<std::size_t>(rank_);
    detail::post p = make_post("reduce_scatter", dtype_of_v<T>, static_cast<std::int64_t>(m), 0, op,
                               send.data(), recv.data());
    // Reduce block `me` of every rank's send straight into recv (block by block, in rank order:
    // detail::reduce_slice). recv may alias this rank's block of send, which nobody else reads, and
    // reduce_slice reads each block of it before writing it; any other overlap is refused before.
    std::vector<const T*> srcs(
        static_cast<std::size_t>(size()));  // before the exchange: compute never throws
    exchange(
        p, [&](std::span<const detail::post> ps) { return verify_uniform(ps, true, false); },
        [&](std::span<const detail::post> ps) {
          if (m == 0) return;
          for (std::size_t k = 0; k < ps.size(); ++k) srcs[k] = static_cast<const T*>(ps[k].send) + me * m;
          T* const dst = recv.data();
          detail::reduce_slice(std::span<T* const>(&dst, 1), std::span<const T* const>(srcs), m, op, size());
        });
  }

  /// Backend of comm::all_to_all_v (collectives.hpp), which checks the arguments first and holds the
  /// contract.
  template <element T>
  void all_to_all_v(std::span<const T> send, std::span<const std::int64_t> send_counts,
                    std::span<const std::int64_t> send_displs, std::span<T> recv,
                    std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_displs) {
    detail::post p = make_post("all_to_all_v", dtype_of_v<T>, static_cast<std::int64_t>(send.size()), 0,
                               reduce_op::sum, send.data(), recv.data());
    p.send_counts = send_counts, p.send_displs = send_displs, p.recv_counts = recv_counts,
    p.recv_displs = recv_displs;
    const auto me = static_cast<std::size_t>(rank_);
    exchange(
        p,
        [&](std::span<const detail::post> ps) -> std::string {
          if (auto v = verify_signature(ps); !v.empty()) return v;
          for (std::size_t i = 0; i < ps.size(); ++i)
            for (std::size_t j = 0; j < ps.size(); ++j)
              if (ps[i].send_counts[j] != ps[j].recv_counts[i])
                return hetmesh::format(
                    "rank {} sends {} elements to rank {}, which expects {}; expected send_counts[j] "
                    "on rank i to equal recv_counts[i] on rank j",
                    i, ps[i].send_counts[j], j, ps[j].recv_counts[i]);
          return {};
        },
        [&](std::span<const detail::post> ps) {
          // Straight from each sender's buffer, once; from the next rank on, so ranks spread their reads.
          for (std::size_t k = 0; k < ps.size(); ++k) {
            const std::size_t j = (me + k) % ps.size();
            copy_block(recv.data() + recv_displs[j],
                       static_cast<const T*>(ps[j].send) + ps[j].send_displs[me],
                       static_cast<std::size_t>(recv_counts[j]));
          }
        });
  }

  /// Backend of comm::barrier (collectives.hpp): returns once every rank of the group has entered it.
  void barrier() {
    detail::post p = make_post("barrier", dtype::uint8, 0, 0, reduce_op::sum, nullptr, nullptr);
    group_->arrive(rank_, p, timeout_, {"barrier", rank_},
                   [&](std::span<const detail::post> ps) { return verify_signature(ps); });
  }

  /// Sends are eager (copied into the receiver's mailbox), so they all complete before the receives
  /// wait: any batch whose messages match completes. Receives require exactly their count and dtype.
  void group_p2p(std::span<const p2p_op> ops) {
    const detail::site where{"group_p2p", rank_};
    for (const p2p_op& op : ops) {
      if (op.what != p2p_op::kind::send) continue;
      const auto bytes = static_cast<std::size_t>(op.count) * dtype_size(op.type);
      detail::message msg{std::vector<std::byte>(bytes), op.type, op.count};
      if (bytes != 0) std::memcpy(msg.bytes.data(), op.data, bytes);
      group_->deliver(rank_, op.peer, op.tag, std::move(msg), where);
    }
    for (const p2p_op& op : ops) {
      if (op.what != p2p_op::kind::recv) continue;
      detail::message msg = group_->take(op.peer, rank_, op.tag, timeout_, where, op.count, op.type);
      if (msg.type != op.type || msg.count != op.count)
        throw_error<mismatch_error>(
            "loopback group_p2p on {}: the message from rank {} with tag {} holds {} x {}; "
            "expected {} x {} (a receive takes exactly its buffer's count and dtype)",
            comm::describe(*this), op.peer, op.tag, msg.count, msg.type, op.count, op.type);
      if (!msg.bytes.empty()) std::memcpy(op.data, msg.bytes.data(), msg.bytes.size());
    }
  }

 private:
  static detail::post make_post(std::string_view op, dtype type, std::int64_t count, int root, reduce_op rop,
                                const void* send, void* recv) noexcept {
    detail::post p;
    p.op = op, p.type = type, p.count = count, p.root = root, p.rop = rop, p.send = send, p.recv = recv;
    return p;
  }
  template <class T>
  static void copy_block(T* dst, const void* src, std::size_t n) noexcept {
    if (n != 0 && dst != src) std::memcpy(dst, src, n * sizeof(T));
  }

  /// Arrive (post, wait, verify), compute (read the others' posts, write our own output), then release
  /// (wait until nobody reads ours).
  template <class Verify, class Compute>
  void exchange(const detail::post& p, Verify&& verify, Compute&& compute) {
    const detail::site where{p.op, rank_};
    const auto posts = group_->arrive(rank_, p, timeout_, where, verify);
    compute(posts);
    group_->release(timeout_, where);
  }

  /// Every rank called the same collective with the same dtype.
  static std::string verify_signature(std::span<const detail::post> ps) {
    for (std::size_t j = 1; j < ps.size(); ++j) {
      if (ps[j].op != ps[0].op)
        return hetmesh::format(
            "rank {} called {} while rank 0 called {}; expected every rank to call the same collective", j,
            ps[j].op, ps[0].op);
      if (ps[j].type != ps[0].type)
        return hetmesh::format(
            "rank {} passed {} elements while rank 0 passed {}; expected the same dtype on every rank", j,
            ps[j].type, ps[0].type);
    }
    return {};
  }
  /// ... and the same count (and op, root when they matter).
  static std::string verify_uniform(std::span<const detail::post> ps, bool check_op, bool check_root) {
    if (auto v = verify_signature(ps); !v.empty()) return v;
    for (std::size_t j = 1; j < ps.size(); ++j) {
      if (ps[j].count != ps[0].count)
        return hetmesh::format(
            "rank {} passed {} elements while rank 0 passed {}; expected the same count on every rank", j,
            ps[j].count, ps[0].count);
      if (check_op && ps[j].rop != ps[0].rop)
        return hetmesh::format(
            "rank {} reduces with {} while rank 0 reduces with {}; expected the same reduce_op", j, ps[j].rop,
            ps[0].rop);
      if (check_root && ps[j].root != ps[0].root)
        return hetmesh::format("rank {} names root {} while rank 0 names root {}; expected the same root", j,
                               ps[j].root, ps[0].root);
    }
    return {};
  }

  std::shared_ptr<detail::world_state> world_;
  std::shared_ptr<detail::group_state> group_;
  int rank_;
  std::chrono::milliseconds timeout_;
};

static_assert(comm::host_communicator<communicator> && !comm::device_communicator<communicator>);

/// Runs body(communicator&) on `nranks` threads, one per rank of a fresh world, and returns when all
/// have finished. When a rank's body throws, every group of the world is aborted so the other ranks'
/// waits raise (aborted_error, or timeout_error if the cause was a timeout) instead of hanging; then
/// `run` rethrows, on the caller, the exception of the lowest rank whose failure was its own (not an
/// aborted_error induced by another rank), or the lowest rank's if all were induced.
/// Pre: nranks >= 1, timeout > 0. Cost: nranks thread creations.
template <class F>
void run(int nranks, F&& body,
         std::chrono::milliseconds timeout = std::chrono::milliseconds(HETMESH_DEFAULT_TIMEOUT_MS)) {
  if (nranks < 1) throw_error<invalid_argument>("loopback::run with {} ranks; expected at least 1", nranks);
  if (timeout.count() <= 0)
    throw_error<invalid_argument>("loopback::run with a timeout of {} ms; expected > 0", timeout.count());
  auto world = std::make_shared<detail::world_state>(nranks);
  const auto n = static_cast<std::size_t>(nranks);
  std::vector<std::exception_ptr> errors(n);
  std::vector<char> induced(n, 0);
  auto worker = [&](int r) {
    const auto rs = static_cast<std::size_t>(r);
    try {
      communicator c(world, world->world(), r, timeout);
      body(c);
    } catch (const aborted_error&) {
      errors[rs] = std::current_exception();
      induced[rs] = 1;
    } catch (const std::exception& e) {
      errors[rs] = std::current_exception();
      world->abort_all(hetmesh::format("rank {} failed: {}", r, e.what()));
    } catch (...) {
      errors[rs] = std::current_exception();
      world->abort_all(hetmesh::format("rank {} failed with a non-standard exception", r));
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(n);
  try {
    for (int r = 0; r < nranks; ++r) threads.emplace_back(worker, r);
  } catch (...) {
    world->abort_all("loopback::run could not start all rank threads");
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();
  for (std::size_t r = 0; r < n; ++r)
    if (errors[r] && !induced[r]) std::rethrow_exception(errors[r]);
  for (std::size_t r = 0; r < n; ++r)
    if (errors[r]) std::rethrow_exception(errors[r]);
}

}  // namespace hetmesh::comm::loopback
