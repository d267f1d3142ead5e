// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm internals: the bodies of the loopback communicator's HETMESH_COMPILED members and of
// loopback::run. Included by comm/loopback.hpp where bodies are emitted (config.hpp: header-only, or the
// translation unit of <hetmesh/src.hpp>); nothing else includes it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "../../core/error.hpp"
#include "../../core/format.hpp"
#include "../loopback.hpp"
#include "loopback_reduce.hpp"
#include "loopback_state.hpp"

namespace hetmesh::comm::loopback {

namespace detail {

inline post make_post(std::string_view op, dtype type, std::size_t count, int root, reduce_op rop,
                      const void* send, void* recv) noexcept {
  post p;
  p.op = op, p.type = type, p.count = static_cast<std::int64_t>(count), p.root = root, p.rop = rop,
  p.send = send, p.recv = recv;
  return p;
}

/// Copies `n` elements of `elem` bytes each from src to dst (nothing when they are the same buffer).
inline void copy_block(void* dst, const void* src, std::size_t n, std::size_t elem) noexcept {
  if (n != 0 && dst != src) std::memcpy(dst, src, n * elem);
}

/// Every rank called the same collective with the same dtype.
inline std::string verify_signature(std::span<const post> ps) {
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
inline std::string verify_uniform(std::span<const post> ps, bool check_op, bool check_root) {
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

/// Arrive (post, wait, verify), compute (read the others' posts, write our own output), then release
/// (wait until nobody reads ours).
template <class Verify, class Compute>
void exchange(group_state& g, int rank, std::chrono::milliseconds timeout, const post& p, Verify&& verify,
              Compute&& compute) {
  const site where{p.op, rank};
  const auto posts = g.arrive(rank, p, timeout, where, verify);
  compute(posts);
  g.release(timeout, where);
}

/// reduce_slice with the element type of `type` (a host arithmetic dtype: host_element). Never throws
/// for those (the compute phase must not); any other dtype is refused before by the typed members.
inline void reduce_slice_raw(dtype type, std::span<void* const> dsts, std::span<const void* const> srcs,
                             std::size_t count, reduce_op op, int group_size) noexcept {
  switch (type) {
    case dtype::float32:
      return reduce_slice<float>(dsts, srcs, count, op, group_size);
    case dtype::float64:
      return reduce_slice<double>(dsts, srcs, count, op, group_size);
    case dtype::int8:
      return reduce_slice<std::int8_t>(dsts, srcs, count, op, group_size);
    case dtype::uint8:
      return reduce_slice<std::uint8_t>(dsts, srcs, count, op, group_size);
    case dtype::int32:
      return reduce_slice<std::int32_t>(dsts, srcs, count, op, group_size);
    case dtype::uint32:
      return reduce_slice<std::uint32_t>(dsts, srcs, count, op, group_size);
    case dtype::int64:
      return reduce_slice<std::int64_t>(dsts, srcs, count, op, group_size);
    case dtype::uint64:
      return reduce_slice<std::uint64_t>(dsts, srcs, count, op, group_size);
    default:
      return;  // unreachable: all_reduce and reduce_scatter take host_element types only
  }
}

}  // namespace detail

HETMESH_COMPILED communicator::communicator(std::shared_ptr<detail::world_state> world,
                                            std::shared_ptr<detail::group_state> group, int rank,
                                            std::chrono::milliseconds timeout)
    : world_(std::move(world)),
      group_(std::move(group)),
      members_(group_->members()),
      rank_(rank),
      timeout_(timeout) {}

HETMESH_COMPILED void communicator::set_timeout(std::chrono::milliseconds t) {
  if (t.count() <= 0) throw_error<invalid_argument>("loopback timeout of {} ms; expected > 0", t.count());
  timeout_ = t;
}

HETMESH_COMPILED communicator communicator::subgroup(std::span<const int> members) const {
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
        "loopback subgroup on {}: [{}] does not contain this rank; expected only members to create a group",
        comm::describe(*this), fmt::join(members, ","));
  return communicator(world_, world_->join(global, ranks()[static_cast<std::size_t>(rank_)]), me, timeout_);
}

HETMESH_COMPILED void communicator::all_reduce_raw(dtype type, void* inout, std::size_t m, reduce_op op) {
  const auto n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank_);
  const std::size_t elem = dtype_size(type);
  const detail::post p = detail::make_post("all_reduce", type, m, 0, op, inout, inout);
  // Reduce-scatter and all-gather in one pass: rank i alone reads slice i of every rank's buffer, so
  // once it has combined a block of it (in rank order: detail::reduce_slice) it writes the result
  // straight into that block of every rank's buffer; no other rank reads or writes there. Per rank: m
  // elements read (m / n from each rank) and m written (m / n to each rank), the traffic of one memcpy
  // of the buffer; no scratch. Every rank gets the same bits, the same as reducing rank 0, 1, ... in
  // turn. The release phase keeps each rank's buffer alive until every rank has written its slice.
  const std::size_t lo = m * me / n, hi = m * (me + 1) / n;
  std::vector<const void*> srcs(n);  // allocated before the exchange: the compute phase never throws
  std::vector<void*> dsts(n);
  detail::exchange(
      *group_, rank_, timeout_, p,
      [&](std::span<const detail::post> ps) { return detail::verify_uniform(ps, true, false); },
      [&](std::span<const detail::post> ps) {
        if (hi == lo) return;
        for (std::size_t k = 0; k < ps.size(); ++k) {
          srcs[k] = static_cast<const std::byte*>(ps[k].send) + lo * elem;
          dsts[k] = static_cast<std::byte*>(ps[k].recv) + lo * elem;
        }
        detail::reduce_slice_raw(type, dsts, srcs, hi - lo, op, size());
      });
}

HETMESH_COMPILED void communicator::broadcast_raw(dtype type, void* buf, std::size_t count, int root) {
  const detail::post p = detail::make_post("broadcast", type, count, root, reduce_op::sum, buf, buf);
  detail::exchange(
      *group_, rank_, timeout_, p,
      [&](std::span<const detail::post> ps) { return detail::verify_uniform(ps, false, true); },
      [&](std::span<const detail::post> ps) {
        if (rank_ != root)
          detail::copy_block(buf, ps[static_cast<std::size_t>(root)].send, count, dtype_size(type));
      });
}

HETMESH_COMPILED void communicator::all_gather_raw(dtype type, const void* send, std::size_t count,
                                                   void* recv) {
  const detail::post p = detail::make_post("all_gather", type, count, 0, reduce_op::sum, send, recv);
  const std::size_t elem = dtype_size(type);
  detail::exchange(
      *group_, rank_, timeout_, p,
      [&](std::span<const detail::post> ps) { return detail::verify_uniform(ps, false, false); },
      [&](std::span<const detail::post> ps) {
        for (std::size_t j = 0; j < ps.size(); ++j)
          detail::copy_block(static_cast<std::byte*>(recv) + j * count * elem, ps[j].send, count, elem);
      });
}

HETMESH_COMPILED void communicator::all_gather_v_raw(dtype type, const void* send, std::size_t count,
                                                     void* recv, std::span<const std::int64_t> recv_counts,
                                                     std::span<const std::int64_t> recv_displs) {
  detail::post p = detail::make_post("all_gather_v", type, count, 0, reduce_op::sum, send, recv);
  p.recv_counts = recv_counts;
  const auto me = static_cast<std::size_t>(rank_);
  const std::size_t elem = dtype_size(type);
  detail::exchange(
      *group_, rank_, timeout_, p,
      [&](std::span<const detail::post> ps) -> std::string {
        if (auto v = detail::verify_signature(ps); !v.empty()) return v;
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
          detail::copy_block(static_cast<std::byte*>(recv) + static_cast<std::size_t>(recv_displs[j]) * elem,
                             ps[j].send, static_cast<std::size_t>(recv_counts[j]), elem);
        }
      });
}

HETMESH_COMPILED void communicator::reduce_scatter_raw(dtype type, const void* send, void* recv,
                                                       std::size_t m, reduce_op op) {
  const auto me = static_cast<std::size_t>(rank_);
  const std::size_t elem = dtype_size(type);
  const detail::post p = detail::make_post("reduce_scatter", type, m, 0, op, send, recv);
  // Reduce block `me` of every rank's send straight into recv (block by block, in rank order:
  // detail::reduce_slice). recv may alias this rank's block of send, which nobody else reads, and
  // reduce_slice reads each block of it before writing it; any other overlap is refused before.
  std::vector<const void*> srcs(
      static_cast<std::size_t>(size()));  // before the exchange: compute never throws
  detail::exchange(
      *group_, rank_, timeout_, p,
      [&](std::span<const detail::post> ps) { return detail::verify_uniform(ps, true, false); },
      [&](std::span<const detail::post> ps) {
        if (m == 0) return;
        for (std::size_t k = 0; k < ps.size(); ++k)
          srcs[k] = static_cast<const std::byte*>(ps[k].send) + me * m * elem;
        void* const dst = recv;
        detail::reduce_slice_raw(type, std::span<void* const>(&dst, 1), srcs, m, op, size());
      });
}

HETMESH_COMPILED void communicator::all_to_all_v_raw(dtype type, const void* send, std::size_t count,
                                                     std::span<const std::int64_t> send_counts,
                                                     std::span<const std::int64_t> send_displs, void* recv,
                                                     std::span<const std::int64_t> recv_counts,
                                                     std::span<const std::int64_t> recv_displs) {
  detail::post p = detail::make_post("all_to_all_v", type, count, 0, reduce_op::sum, send, recv);
  p.send_counts = send_counts, p.send_displs = send_displs, p.recv_counts = recv_counts,
  p.recv_displs = recv_displs;
  const auto me = static_cast<std::size_t>(rank_);
  const std::size_t elem = dtype_size(type);
  detail::exchange(
      *group_, rank_, timeout_, p,
      [&](std::span<const detail::post> ps) -> std::string {
        if (auto v = detail::verify_signature(ps); !v.empty()) return v;
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
          detail::copy_block(static_cast<std::byte*>(recv) + static_cast<std::size_t>(recv_displs[j]) * elem,
                             static_cast<const std::byte*>(ps[j].send) +
                                 static_cast<std::size_t>(ps[j].send_displs[me]) * elem,
                             static_cast<std::size_t>(recv_counts[j]), elem);
        }
      });
}

HETMESH_COMPILED void communicator::barrier() {
  const detail::post p = detail::make_post("barrier", dtype::uint8, 0, 0, reduce_op::sum, nullptr, nullptr);
  group_->arrive(rank_, p, timeout_, {"barrier", rank_},
                 [&](std::span<const detail::post> ps) { return detail::verify_signature(ps); });
}

HETMESH_COMPILED void communicator::group_p2p(std::span<const p2p_op> ops) {
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

HETMESH_COMPILED void detail::run_ranks(int nranks, function_ref<void(communicator&)> body,
                                        std::chrono::milliseconds timeout) {
  if (nranks < 1) throw_error<invalid_argument>("loopback::run with {} ranks; expected at least 1", nranks);
  if (timeout.count() <= 0)
    throw_error<invalid_argument>("loopback::run with a timeout of {} ms; expected > 0", timeout.count());
  auto world = std::make_shared<world_state>(nranks);
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
