// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm: the collective entry points. Each is a free function over any communicator: it checks
// its arguments locally (sizes, ranks, tags, overlap), then calls the backend's member of the same
// name when the backend has one, else a generic algorithm over the backend's point-to-point batch
// (detail/generic.hpp). Cross-rank agreement (same op, dtype and counts on every rank) is checked by
// the backend: always on loopback, at a debug setting on MPI (see docs/comm.md).
//
// Common contract, unless an entry says otherwise:
//  - collective over the communicator's group: every rank of the group calls the same operation with
//    the same dtype, counts and root, in the same order as its other collectives;
//  - host backends return when the operation is complete; device backends (NCCL) return when it is
//    enqueued on the communicator's stream;
//  - a rank that never arrives makes the others raise hetmesh::timeout_error within the
//    communicator's timeout (naming the op, the group, the rank and the missing ranks); disagreeing
//    counts raise hetmesh::mismatch_error where the backend detects them; bad local arguments raise
//    hetmesh::invalid_argument before anything is communicated;
//  - deterministic: every rank gets bitwise the same result, and repeated calls give the same result
//    (reductions combine ranks in a fixed order per backend).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <span>
#include <vector>

#include "communicator.hpp"
#include "detail/checks.hpp"
#include "detail/generic.hpp"
#include "reduce_op.hpp"

namespace hetmesh::comm {

/// inout = op over the group's inout buffers, element-wise, on every rank.
/// Cost: a backend's all-reduce (loopback: 2 passes over the bytes per rank; MPI/NCCL: their own).
template <communicator C, element T>
void all_reduce(C& c, std::span<T> inout, reduce_op op) {
  if constexpr (requires { c.all_reduce(inout, op); }) {
    c.all_reduce(inout, op);
  } else {
    detail::generic_all_reduce(c, inout, op);
  }
}

/// buf on every rank = buf on `root`. Pre: 0 <= root < size.
template <communicator C, element T>
void broadcast(C& c, std::span<T> buf, int root) {
  detail::check_peer(c, "broadcast", root, "root");
  if constexpr (requires { c.broadcast(buf, root); }) {
    c.broadcast(buf, root);
  } else {
    detail::generic_broadcast(c, buf, root);
  }
}

/// recv = the concatenation of every rank's send, in rank order. Pre: recv.size() == size * send.size();
/// send is disjoint from recv or is exactly this rank's block of recv (in place).
template <communicator C, element T>
void all_gather(C& c, std::span<const T> send, std::span<T> recv) {
  const auto n = static_cast<std::size_t>(c.size());
  detail::check_size(c, "all_gather", "the receive buffer", recv.size(), n * send.size(),
                     "group size times the send count");
  detail::check_no_overlap(c, "all_gather", send, recv,
                           recv.data() + static_cast<std::size_t>(c.rank()) * send.size());
  if constexpr (requires { c.all_gather(send, recv); }) {
    c.all_gather(send, recv);
  } else {
    std::vector<std::int64_t> counts(n, static_cast<std::int64_t>(send.size()));
    const auto displs = detail::prefix_displs(counts);
    detail::generic_all_gather_v(c, send, recv, std::span<const std::int64_t>(counts),
                                 std::span<const std::int64_t>(displs));
  }
}

/// recv = the concatenation of every rank's send, rank j's block holding recv_counts[j] elements at
/// the prefix sum of the counts before it. Pre: recv_counts has one entry per rank, equal on every
/// rank; recv_counts[rank] == send.size(); recv.size() == sum of recv_counts.
template <communicator C, element T>
void all_gather_v(C& c, std::span<const T> send, std::span<T> recv,
                  std::span<const std::int64_t> recv_counts) {
  const auto n = static_cast<std::size_t>(c.size());
  if (recv_counts.size() != n)
    throw_error<invalid_argument>(
        "all_gather_v on {}: recv_counts has {} entries; expected one per rank ({})", describe(c),
        recv_counts.size(), n);
  const auto displs = detail::prefix_displs(recv_counts);
  detail::check_layout(c, "all_gather_v", "receive", recv_counts, std::span<const std::int64_t>(displs),
                       recv.size());
  const auto me = static_cast<std::size_t>(c.rank());
  detail::check_size(c, "all_gather_v", "the send buffer", send.size(),
                     static_cast<std::size_t>(recv_counts[me]), "recv_counts[rank]");
  const auto total = std::accumulate(recv_counts.begin(), recv_counts.end(), std::int64_t{0});
  detail::check_size(c, "all_gather_v", "the receive buffer", recv.size(), static_cast<std::size_t>(total),
                     "the sum of recv_counts");
  detail::check_no_overlap(c, "all_gather_v", send, recv, recv.data() + displs[me]);
  if constexpr (requires {
                  c.all_gather_v(send, recv, recv_counts, std::span<const std::int64_t>(displs));
                }) {
    c.all_gather_v(send, recv, recv_counts, std::span<const std::int64_t>(displs));
  } else {
    detail::generic_all_gather_v(c, send, recv, recv_counts, std::span<const std::int64_t>(displs));
  }
}

/// Every rank's `local` vector, gathered: result[j] is rank j's local. Exchanges the counts first
/// (an all_gather of one int64), so ranks may pass different lengths. Cost: two collectives.
template <communicator C, element T>
[[nodiscard]] std::vector<std::vector<T>> all_gather_vectors(C& c, std::span<const T> local) {
  static_assert(
      host_communicator<C>,
      "all_gather_vectors returns host vectors; on a device backend gather counts and call all_gather_v");
  const auto n = static_cast<std::size_t>(c.size());
  const std::int64_t mine = static_cast<std::int64_t>(local.size());
  std::vector<std::int64_t> counts(n);
  all_gather(c, std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(counts));
  std::vector<T> flat(
      static_cast<std::size_t>(std::accumulate(counts.begin(), counts.end(), std::int64_t{0})));
  all_gather_v(c, local, std::span<T>(flat), std::span<const std::int64_t>(counts));
  std::vector<std::vector<T>> out(n);
  auto it = flat.begin();
  for (std::size_t j = 0; j < n; ++j) {
    out[j].assign(it, it + counts[j]);
    it += counts[j];
  }
  return out;
}

/// recv on rank j = op over every rank's block j of send (blocks of recv.size() elements).
/// Pre: send.size() == size * recv.size(); recv is disjoint from send or is exactly this rank's
/// block of send (in place).
template <communicator C, element T>
void reduce_scatter(C& c, std::span<const T> send, std::span<T> recv, reduce_op op) {
  const auto n = static_cast<std::size_t>(c.size());
  detail::check_size(c, "reduce_scatter", "the send buffer", send.size(), n * recv.size(),
                     "group size times the receive count");
  const T* slot = send.data() + static_cast<std::size_t>(c.rank()) * recv.size();
  if (recv.data() != slot) detail::check_no_overlap(c, "reduce_scatter", send, recv);
  if constexpr (requires { c.reduce_scatter(send, recv, op); }) {
    c.reduce_scatter(send, recv, op);
  } else {
    detail::generic_reduce_scatter(c, send, recv, op);
  }
}

/// Block j of send goes to rank j; block j of recv comes from rank j (blocks of send.size()/size).
/// Pre: send.size() == recv.size(), divisible by size; buffers disjoint.
template <communicator C, element T>
void all_to_all(C& c, std::span<const T> send, std::span<T> recv) {
  const auto n = static_cast<std::size_t>(c.size());
  if (send.size() % n != 0)
    throw_error<invalid_argument>(
        "all_to_all on {}: the send buffer holds {} elements; expected a multiple of "
        "the group size ({})",
        describe(c), send.size(), n);
  detail::check_size(c, "all_to_all", "the receive buffer", recv.size(), send.size(), "the send count");
  detail::check_no_overlap(c, "all_to_all", send, recv);
  if constexpr (requires { c.all_to_all(send, recv); }) {
    c.all_to_all(send, recv);
  } else {
    std::vector<std::int64_t> counts(n, static_cast<std::int64_t>(send.size() / n));
    const auto displs = detail::prefix_displs(counts);
    const std::span<const std::int64_t> cs(counts), ds(displs);
    if constexpr (requires { c.all_to_all_v(send, cs, ds, recv, cs, ds); }) {
      c.all_to_all_v(send, cs, ds, recv, cs, ds);
    } else {
      detail::generic_all_to_all_v(c, send, cs, ds, recv, cs, ds);
    }
  }
}

/// Rank i's block [send_displs[j], +send_counts[j]) goes to rank j's [recv_displs[i], +recv_counts[i]).
/// Pre: four arrays of one entry per rank, blocks inside their buffers; send_counts[j] on rank i
/// equals recv_counts[i] on rank j; buffers disjoint. (NCCL has no all-to-all-v: it gets the
/// generic one, one grouped batch of 2n sends and receives.)
template <communicator C, element T>
void all_to_all_v(C& c, std::span<const T> send, std::span<const std::int64_t> send_counts,
                  std::span<const std::int64_t> send_displs, std::span<T> recv,
                  std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_displs) {
  detail::check_layout(c, "all_to_all_v", "send", send_counts, send_displs, send.size());
  detail::check_layout(c, "all_to_all_v", "receive", recv_counts, recv_displs, recv.size());
  detail::check_no_overlap(c, "all_to_all_v", send, recv);
  if constexpr (requires {
                  c.all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs);
                }) {
    c.all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs);
  } else {
    detail::generic_all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts, recv_displs);
  }
}

/// Issues every operation of `ops` as one batch (as ncclGroupStart/End do): a batch whose sends and
/// receives match across ranks completes whatever the order of its ops. Collective over the ranks the
/// batch names, not over the whole group. Pre: peers in range, tags in [0, max_user_tag], every
/// receive matched by a send of exactly its count and dtype.
template <communicator C>
void group_p2p(C& c, std::span<const p2p_op> ops) {
  for (const p2p_op& op : ops) {
    detail::check_peer(c, "group_p2p", op.peer);
    detail::check_tag(c, "group_p2p", op.tag);
    if (op.count < 0)
      throw_error<invalid_argument>("group_p2p on {}: {} has a negative count; expected >= 0", describe(c),
                                    op);
  }
  c.group_p2p(ops);
}
/// group_p2p over a braced list of operations: `group_p2p(c, {send_op(...), recv_op(...)})`. Same contract.
template <communicator C>
void group_p2p(C& c, std::initializer_list<p2p_op> ops) {
  group_p2p(c, std::span<const p2p_op>(ops.begin(), ops.size()));
}

/// Sends buf to `peer`. Point-to-point (only the peer takes part). Host backends may return before
/// the receiver has arrived (loopback buffers the message); do not rely on either behaviour.
template <communicator C, element T>
void send(C& c, std::span<const T> buf, int peer, int tag = 0) {
  detail::check_peer(c, "send", peer);
  detail::check_tag(c, "send", tag);
  if constexpr (requires { c.send(buf, peer, tag); }) {
    c.send(buf, peer, tag);
  } else {
    const p2p_op op = send_op(buf, peer, tag);
    c.group_p2p(std::span<const p2p_op>(&op, 1));
  }
}
template <communicator C, element T>
void send(C& c, std::span<T> buf, int peer, int tag = 0) {
  send(c, std::span<const T>(buf), peer, tag);
}

/// Receives into buf from `peer`; the matching send must carry exactly buf.size() elements of the
/// same dtype (else mismatch_error where the backend can tell).
template <communicator C, element T>
void recv(C& c, std::span<T> buf, int peer, int tag = 0) {
  detail::check_peer(c, "recv", peer);
  detail::check_tag(c, "recv", tag);
  if constexpr (requires { c.recv(buf, peer, tag); }) {
    c.recv(buf, peer, tag);
  } else {
    const p2p_op op = recv_op(buf, peer, tag);
    c.group_p2p(std::span<const p2p_op>(&op, 1));
  }
}

/// No rank returns before every rank of the group has called barrier.
template <communicator C>
void barrier(C& c) {
  if constexpr (requires { c.barrier(); }) {
    c.barrier();
  } else {
    detail::generic_barrier(c);
  }
}

}  // namespace hetmesh::comm
