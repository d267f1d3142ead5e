// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm internals: collectives built from a backend's point-to-point batch. collectives.hpp
// falls back to these when a backend has no member of that name (NCCL has no all_to_all_v, and a
// minimal backend may offer only group_p2p). The data movement ones work on device memory, since they
// only pass pointers; the reductions compute on the host and need a host backend.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../communicator.hpp"
#include "../reduce_op.hpp"
#include "checks.hpp"

namespace hetmesh::comm::detail {

/// Tags above max_user_tag: the generic algorithms' messages never match a user's.
enum class generic_tag : int {
  all_to_all_v = max_user_tag + 1,
  all_gather_v,
  broadcast,
  barrier,
  reduce,
};

/// Every rank sends block j of `send` to rank j and receives block j of `recv` from rank j, in one batch.
/// Cost: 2n messages per rank, one latency.
template <communicator C, class T>
void generic_all_to_all_v(C& c, std::span<const T> send, std::span<const std::int64_t> send_counts,
                          std::span<const std::int64_t> send_displs, std::span<T> recv,
                          std::span<const std::int64_t> recv_counts,
                          std::span<const std::int64_t> recv_displs,
                          int tag = static_cast<int>(generic_tag::all_to_all_v)) {
  const int n = c.size();
  std::vector<p2p_op> ops;
  ops.reserve(2 * static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) {
    const auto js = static_cast<std::size_t>(j);
    ops.push_back(send_op(
        send.subspan(static_cast<std::size_t>(send_displs[js]), static_cast<std::size_t>(send_counts[js])), j,
        tag));
    ops.push_back(recv_op(
        recv.subspan(static_cast<std::size_t>(recv_displs[js]), static_cast<std::size_t>(recv_counts[js])), j,
        tag));
  }
  c.group_p2p(std::span<const p2p_op>(ops));
}

/// Every rank sends `send` to every rank and receives rank j's block at recv_displs[j].
template <communicator C, class T>
void generic_all_gather_v(C& c, std::span<const T> send, std::span<T> recv,
                          std::span<const std::int64_t> recv_counts,
                          std::span<const std::int64_t> recv_displs) {
  const int n = c.size();
  std::vector<p2p_op> ops;
  ops.reserve(2 * static_cast<std::size_t>(n));
  const int tag = static_cast<int>(generic_tag::all_gather_v);
  for (int j = 0; j < n; ++j) {
    const auto js = static_cast<std::size_t>(j);
    const auto block =
        recv.subspan(static_cast<std::size_t>(recv_displs[js]), static_cast<std::size_t>(recv_counts[js]));
    // In place (the send buffer is this rank's own block): nothing to move for the self block, and
    // a self-message between aliasing buffers would be erroneous on MPI.
    if (j == c.rank() && block.data() == send.data()) continue;
    ops.push_back(send_op(send, j, tag));
    ops.push_back(recv_op(block, j, tag));
  }
  c.group_p2p(std::span<const p2p_op>(ops));
}

/// The root sends to every other rank (linear: n-1 messages at the root).
template <communicator C, class T>
void generic_broadcast(C& c, std::span<T> buf, int root) {
  std::vector<p2p_op> ops;
  const int tag = static_cast<int>(generic_tag::broadcast);
  if (c.rank() == root) {
    for (int j = 0; j < c.size(); ++j)
      if (j != root) ops.push_back(send_op(std::span<const T>(buf), j, tag));
  } else {
    ops.push_back(recv_op(buf, root, tag));
  }
  c.group_p2p(std::span<const p2p_op>(ops));
}

/// Everybody exchanges an empty message with everybody: nobody leaves before all have arrived.
template <communicator C>
void generic_barrier(C& c) {
  std::vector<p2p_op> ops;
  const int tag = static_cast<int>(generic_tag::barrier);
  for (int j = 0; j < c.size(); ++j) {
    ops.push_back(send_op(std::span<const std::uint8_t>(), j, tag));
    ops.push_back(recv_op(std::span<std::uint8_t>(), j, tag));
  }
  c.group_p2p(std::span<const p2p_op>(ops));
}

/// Reduce-scatter on the host: block j of every rank's `send` goes to rank j, which reduces the
/// blocks in rank order (so every backend that uses this gets the same rounding).
template <communicator C, class T>
void generic_reduce_scatter(C& c, std::span<const T> send, std::span<T> recv, reduce_op op) {
  static_assert(std::remove_cvref_t<C>::memory == memory_space::host,
                "hetmesh::comm: this backend has no reduce_scatter member and reductions cannot be built "
                "from point-to-point operations on device memory");
  const auto n = static_cast<std::size_t>(c.size());
  const std::size_t m = recv.size();
  std::vector<T> blocks(n * m);
  std::vector<std::int64_t> counts(n, static_cast<std::int64_t>(m));
  const auto displs = prefix_displs(counts);
  generic_all_to_all_v(c, send, std::span<const std::int64_t>(counts), std::span<const std::int64_t>(displs),
                       std::span<T>(blocks), std::span<const std::int64_t>(counts),
                       std::span<const std::int64_t>(displs), static_cast<int>(generic_tag::reduce));
  if (m == 0) return;
  for (std::size_t j = 1; j < n; ++j) reduce_into(blocks.data(), blocks.data() + j * m, m, op);
  finish_reduce(blocks.data(), m, op, c.size());
  std::memcpy(recv.data(), blocks.data(), m * sizeof(T));
}

/// All-reduce on the host: every rank gathers all contributions and reduces them in rank order.
/// Cost: n times the bytes of a ring all-reduce; meant for backends that offer nothing better.
template <communicator C, class T>
void generic_all_reduce(C& c, std::span<T> inout, reduce_op op) {
  static_assert(std::remove_cvref_t<C>::memory == memory_space::host,
                "hetmesh::comm: this backend has no all_reduce member and reductions cannot be built from "
                "point-to-point operations on device memory");
  const auto n = static_cast<std::size_t>(c.size());
  const std::size_t m = inout.size();
  std::vector<T> all(n * m);
  std::vector<std::int64_t> counts(n, static_cast<std::int64_t>(m));
  const auto displs = prefix_displs(counts);
  generic_all_gather_v(c, std::span<const T>(inout), std::span<T>(all), std::span<const std::int64_t>(counts),
                       std::span<const std::int64_t>(displs));
  if (m == 0) return;
  for (std::size_t j = 1; j < n; ++j) reduce_into(all.data(), all.data() + j * m, m, op);
  finish_reduce(all.data(), m, op, c.size());
  std::memcpy(inout.data(), all.data(), m * sizeof(T));
}

}  // namespace hetmesh::comm::detail
