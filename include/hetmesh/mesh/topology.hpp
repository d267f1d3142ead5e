// SPDX-License-Identifier: Apache-2.0
// hetmesh::mesh: the one cluster description: nodes x devices per node, and the bandwidth and latency
// of one device's intra-node link (NVLink) and inter-node link (its NIC share), as the layout search,
// cost/'s communication models, the HDP balancers and long-short sequence parallelism all see it.
// Ranks fill nodes in blocks (rank r is on node r / devices_per_node), as torchrun and mpirun
// --map-by node:PE assign them by default. A link is priced alpha-beta: a message of n bytes costs
// alpha + beta n, in the cost models' unit (milliseconds).
//
// Defaults (one set, for every user): an HGX H100/H200 node: 8 devices, NVLink 4 at ~450 GB/s per
// direction and 3 us per message; one 400 Gb/s NIC per GPU, 50 GB/s and 10 us per message.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"

namespace hetmesh::mesh {

/// One link class, alpha-beta: time(n bytes) = alpha + beta n, in milliseconds (the unit of cost/).
struct link {
  double alpha = 0.0;  ///< latency per message, ms
  double beta = 0.0;   ///< ms per byte

  /// From a latency in microseconds and a bandwidth in GB/s (1e9 bytes/s). Pre: latency >= 0 and
  /// bandwidth > 0 (invalid_argument otherwise).
  [[nodiscard]] static link from_us_gbps(double latency_us, double gbytes_per_s) {
    if (!(latency_us >= 0.0) || !(gbytes_per_s > 0.0)) {
      throw_error<invalid_argument>(
          "link::from_us_gbps: latency {} us, bandwidth {} GB/s; expected >= 0 and > 0", latency_us,
          gbytes_per_s);
    }
    return link{latency_us * 1e-3, 1.0 / (gbytes_per_s * 1e6)};
  }
  /// `messages` messages carrying `bytes` in all: messages x alpha + beta x bytes. O(1).
  [[nodiscard]] constexpr double transfer(double bytes, double messages) const noexcept {
    return bytes * beta + messages * alpha;
  }
  /// One message of `bytes` (free when empty). O(1).
  [[nodiscard]] constexpr double time(double bytes) const noexcept {
    return bytes > 0.0 ? alpha + beta * bytes : 0.0;
  }
  friend constexpr bool operator==(const link&, const link&) = default;
  void hash_append(hasher& h) const { append_all(h, alpha, beta); }
};

/// The cluster. An aggregate: `topology{.nodes = 8, .devices_per_node = 8, .intra_bw_gbps = 450, ...}`.
/// Bandwidths are per device, in GB/s (1e9 bytes/s); latencies are per message, in microseconds.
struct topology {
  int nodes = 1;             ///< number of nodes
  int devices_per_node = 8;  ///< an HGX node
  double intra_bw_gbps =
      450.0;  ///< one device's NVLink bandwidth (H100/H200 NVLink 4: ~450 GB/s per direction)
  double inter_bw_gbps = 50.0;     ///< one device's share of the network (one 400 Gb/s NIC per GPU: 50 GB/s)
  double intra_latency_us = 3.0;   ///< per-message latency inside a node
  double inter_latency_us = 10.0;  ///< per-message latency across nodes

  /// Throws invalid_argument naming the field unless counts are >= 1, bandwidths > 0, latencies >= 0
  /// and nodes * devices_per_node fits an int. O(1).
  HETMESH_COMPILED void validate() const;

  /// nodes * devices_per_node.
  [[nodiscard]] int world() const noexcept { return nodes * devices_per_node; }

  /// The node of `rank`. Throws invalid_argument when rank is outside [0, world()).
  [[nodiscard]] HETMESH_COMPILED int node_of(int rank) const;
  /// The device index of `rank` within its node.
  [[nodiscard]] HETMESH_COMPILED int local_of(int rank) const;
  /// Whether ranks `a` and `b` are on the same node.
  [[nodiscard]] bool same_node(int a, int b) const { return node_of(a) == node_of(b); }

  /// The ranks on `node`, ascending.
  [[nodiscard]] HETMESH_COMPILED std::vector<int> ranks_of_node(int node) const;

  /// How many distinct nodes the ranks of `group` occupy. O(n log n).
  [[nodiscard]] HETMESH_COMPILED int nodes_spanned(std::span<const int> group) const;
  /// True when every rank of `group` is on one node (its traffic stays on the intra-node links).
  [[nodiscard]] bool within_one_node(std::span<const int> group) const { return nodes_spanned(group) <= 1; }

  /// The intra-node link as an alpha-beta model.
  [[nodiscard]] link intra() const { return link::from_us_gbps(intra_latency_us, intra_bw_gbps); }
  /// The inter-node link as an alpha-beta model.
  [[nodiscard]] link inter() const { return link::from_us_gbps(inter_latency_us, inter_bw_gbps); }

  /// Whether the ranks of `group` occupy more than one node. Unlike node_of, ranks past world() are
  /// accepted and continue the block layout: a planner may price a pool before the node count is
  /// known. O(n).
  [[nodiscard]] bool crosses_nodes(std::span<const int> group) const noexcept {
    for (int r : group)
      if (r / devices_per_node != group.front() / devices_per_node) return true;
    return false;
  }
  /// The link between ranks a and b (intra for a rank and itself). Ranks as in crosses_nodes. O(1).
  [[nodiscard]] HETMESH_COMPILED link between(int a, int b) const;
  /// The slowest link any ring or pairwise algorithm over `group` uses. Ranks as in crosses_nodes.
  [[nodiscard]] HETMESH_COMPILED link bottleneck(std::span<const int> group) const;

  friend bool operator==(const topology&, const topology&) = default;
  void hash_append(hasher& h) const {
    append_all(h, nodes, devices_per_node, intra_bw_gbps, inter_bw_gbps, intra_latency_us, inter_latency_us);
  }
};

}  // namespace hetmesh::mesh

template <>
struct fmt::formatter<hetmesh::mesh::link> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::link& l, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "link(alpha={:.4g}, beta={:.4g}/B)", l.alpha, l.beta);
  }
};

template <>
struct fmt::formatter<hetmesh::mesh::topology> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::topology& t, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(
        ctx.out(), "{} nodes x {} devices (intra-node {} GB/s, {} us; inter-node {} GB/s, {} us)", t.nodes,
        t.devices_per_node, t.intra_bw_gbps, t.intra_latency_us, t.inter_bw_gbps, t.inter_latency_us);
  }
};

#if HETMESH_BODIES

namespace hetmesh::mesh {

HETMESH_COMPILED void topology::validate() const {
  if (nodes < 1 || devices_per_node < 1) {
    throw_error<invalid_argument>("topology has {} nodes x {} devices per node: expected both >= 1", nodes,
                                  devices_per_node);
  }
  if (static_cast<std::int64_t>(nodes) * devices_per_node > INT_MAX) {
    throw_error<invalid_argument>("topology has more than {} devices: expected an int rank", INT_MAX);
  }
  if (!(intra_bw_gbps > 0) || !(inter_bw_gbps > 0)) {
    throw_error<invalid_argument>("topology bandwidths are {} (intra) and {} (inter) GB/s: expected both > 0",
                                  intra_bw_gbps, inter_bw_gbps);
  }
  if (!(intra_latency_us >= 0) || !(inter_latency_us >= 0)) {
    throw_error<invalid_argument>("topology latencies are {} (intra) and {} (inter) us: expected both >= 0",
                                  intra_latency_us, inter_latency_us);
  }
}

HETMESH_COMPILED int topology::node_of(int rank) const {
  if (rank < 0 || rank >= world()) {
    throw_error<invalid_argument>("rank {} is outside the topology's {} devices: expected 0 <= rank < {}",
                                  rank, world(), world());
  }
  return rank / devices_per_node;
}

HETMESH_COMPILED int topology::local_of(int rank) const {
  (void)node_of(rank);
  return rank % devices_per_node;
}

HETMESH_COMPILED std::vector<int> topology::ranks_of_node(int node) const {
  if (node < 0 || node >= nodes) {
    throw_error<invalid_argument>("node {} is outside the topology: expected 0 <= node < {}", node, nodes);
  }
  std::vector<int> r(static_cast<std::size_t>(devices_per_node));
  for (int i = 0; i < devices_per_node; ++i) r[static_cast<std::size_t>(i)] = node * devices_per_node + i;
  return r;
}

HETMESH_COMPILED int topology::nodes_spanned(std::span<const int> group) const {
  std::vector<int> n;
  for (int r : group) n.push_back(node_of(r));
  std::sort(n.begin(), n.end());
  return static_cast<int>(std::unique(n.begin(), n.end()) - n.begin());
}

HETMESH_COMPILED link topology::between(int a, int b) const {
  return a / devices_per_node == b / devices_per_node ? intra() : inter();
}

HETMESH_COMPILED link topology::bottleneck(std::span<const int> group) const {
  return crosses_nodes(group) ? inter() : intra();
}

}  // namespace hetmesh::mesh

#endif  // HETMESH_BODIES
