// SPDX-License-Identifier: Apache-2.0
// hetmesh::cost: alpha-beta communication models. A message of n bytes over a link costs
// alpha + beta n. Collectives are priced by the algorithms the backends run on large messages: ring
// all-reduce (2(p-1) steps of M/p), ring reduce-scatter and all-gather ((p-1) steps of M/p), pairwise
// all-to-all(v) (every rank sends to every peer; a rank is busy for the sum of its sends or receives,
// whichever is larger). A ring is as fast as its slowest hop, so a group that spans nodes pays the
// inter-node link on every step. Times are in the same model units as the compute models (ms).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../mesh/topology.hpp"

namespace hetmesh::cost {

/// One link class, alpha-beta: the cluster's own (mesh::link), so the layout search and these
/// collectives price a byte the same way.
using link = mesh::link;

/// The cluster the collectives run on: the one cluster description, mesh::topology (nodes of
/// devices_per_node consecutive ranks; intra() links inside a node, inter() between nodes). The name
/// stays for the cost models' callers; there is no second set of defaults.
using network = mesh::topology;

/// One ring step of a ring algorithm over `degree` ranks whose slowest hop is `l`: each of the
/// degree - 1 hops passes `bytes_per_hop` while the ranks compute for `compute`; the exposed time is
/// max(compute, communication) (compute alone for one rank). O(1).
[[nodiscard]] HETMESH_COMPILED double ring_step_time(const link& l, int degree, double compute,
                                                     double bytes_per_hop);

namespace detail {
HETMESH_COMPILED void check_group(std::span<const int> group, const char* op);
HETMESH_COMPILED void check_bytes(double bytes, const char* op);
}  // namespace detail

/// Point-to-point message of `bytes` from src to dst. Pre: bytes >= 0. O(1).
[[nodiscard]] HETMESH_COMPILED double p2p_time(const network& net, int src, int dst, double bytes);

/// Ring all-reduce of a `bytes` buffer on every rank: 2(p-1) (alpha + beta bytes/p). O(p).
[[nodiscard]] HETMESH_COMPILED double all_reduce_time(const network& net, std::span<const int> group,
                                                      double bytes);

/// Ring reduce-scatter of a `bytes` buffer (each rank keeps bytes/p): (p-1) (alpha + beta bytes/p).
[[nodiscard]] HETMESH_COMPILED double reduce_scatter_time(const network& net, std::span<const int> group,
                                                          double bytes);

/// Ring all-gather producing a `bytes` buffer on every rank (each contributes bytes/p). Same cost as
/// reduce-scatter: the two are each other's transpose.
[[nodiscard]] HETMESH_COMPILED double all_gather_time(const network& net, std::span<const int> group,
                                                      double bytes);

/// All-to-all-v: `bytes[i * p + j]` is what group[i] sends to group[j]. Each rank pays the per-peer link
/// for each non-empty message; the operation ends when the busiest rank's sends or receives end.
/// Pre: bytes.size() == p * p, entries >= 0. O(p^2).
[[nodiscard]] HETMESH_COMPILED double all_to_all_v_time(const network& net, std::span<const int> group,
                                                        std::span<const double> bytes);

/// All-to-all with `bytes_per_peer` bytes between every ordered pair. O(p^2).
[[nodiscard]] HETMESH_COMPILED double all_to_all_time(const network& net, std::span<const int> group,
                                                      double bytes_per_peer);

/// Ring attention over `ring` (context parallelism, HDP): p-1 steps, each passing a KV block of
/// `kv_bytes_per_rank` to the next rank, overlapped with the `compute` of the local shard. Returns the
/// exposed time max(compute, communication). O(p).
[[nodiscard]] HETMESH_COMPILED double ring_attention_time(const network& net, std::span<const int> ring,
                                                          double compute, double kv_bytes_per_rank);

}  // namespace hetmesh::cost

#if HETMESH_BODIES

namespace hetmesh::cost {

HETMESH_COMPILED double ring_step_time(const link& l, int degree, double compute, double bytes_per_hop) {
  if (degree <= 1) return compute;
  return std::max(compute, (static_cast<double>(degree) - 1.0) * l.time(bytes_per_hop));
}

}  // namespace hetmesh::cost

namespace hetmesh::cost::detail {

HETMESH_COMPILED void check_group(std::span<const int> group, const char* op) {
  if (group.empty()) throw_error<invalid_argument>("cost::{}: empty group; expected at least one rank", op);
}

HETMESH_COMPILED void check_bytes(double bytes, const char* op) {
  if (!(bytes >= 0.0)) throw_error<invalid_argument>("cost::{}: {} bytes; expected >= 0", op, bytes);
}

}  // namespace hetmesh::cost::detail

namespace hetmesh::cost {

HETMESH_COMPILED double p2p_time(const network& net, int src, int dst, double bytes) {
  detail::check_bytes(bytes, "p2p_time");
  return src == dst ? 0.0 : net.between(src, dst).time(bytes);
}

HETMESH_COMPILED double all_reduce_time(const network& net, std::span<const int> group, double bytes) {
  detail::check_group(group, "all_reduce_time");
  detail::check_bytes(bytes, "all_reduce_time");
  const auto p = static_cast<double>(group.size());
  if (group.size() == 1 || bytes == 0.0) return 0.0;
  return 2.0 * (p - 1.0) * net.bottleneck(group).time(bytes / p);
}

HETMESH_COMPILED double reduce_scatter_time(const network& net, std::span<const int> group, double bytes) {
  detail::check_group(group, "reduce_scatter_time");
  detail::check_bytes(bytes, "reduce_scatter_time");
  const auto p = static_cast<double>(group.size());
  if (group.size() == 1 || bytes == 0.0) return 0.0;
  return (p - 1.0) * net.bottleneck(group).time(bytes / p);
}

HETMESH_COMPILED double all_gather_time(const network& net, std::span<const int> group, double bytes) {
  detail::check_group(group, "all_gather_time");
  return reduce_scatter_time(net, group, bytes);
}

HETMESH_COMPILED double all_to_all_v_time(const network& net, std::span<const int> group,
                                          std::span<const double> bytes) {
  detail::check_group(group, "all_to_all_v_time");
  const std::size_t p = group.size();
  if (bytes.size() != p * p) {
    throw_error<invalid_argument>(
        "cost::all_to_all_v_time: {} byte counts for a group of {}; expected {} (p*p)", bytes.size(), p,
        p * p);
  }
  const link intra = net.intra();
  const link inter = net.inter();
  std::vector<double> send(p, 0.0);
  std::vector<double> recv(p, 0.0);
  for (std::size_t i = 0; i < p; ++i) {
    for (std::size_t j = 0; j < p; ++j) {
      const double b = bytes[i * p + j];
      detail::check_bytes(b, "all_to_all_v_time");
      if (i == j) continue;
      const double t = (net.crosses_nodes(std::array{group[i], group[j]}) ? inter : intra).time(b);
      send[i] += t;
      recv[j] += t;
    }
  }
  double worst = 0.0;
  for (std::size_t i = 0; i < p; ++i) worst = std::max({worst, send[i], recv[i]});
  return worst;
}

HETMESH_COMPILED double all_to_all_time(const network& net, std::span<const int> group,
                                        double bytes_per_peer) {
  detail::check_group(group, "all_to_all_time");
  std::vector<double> m(group.size() * group.size(), bytes_per_peer);
  return all_to_all_v_time(net, group, m);
}

HETMESH_COMPILED double ring_attention_time(const network& net, std::span<const int> ring, double compute,
                                            double kv_bytes_per_rank) {
  detail::check_group(ring, "ring_attention_time");
  return ring_step_time(net.bottleneck(ring), static_cast<int>(ring.size()), compute, kv_bytes_per_rank);
}

}  // namespace hetmesh::cost
#endif  // HETMESH_BODIES
