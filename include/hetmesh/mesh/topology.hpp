// SPDX-License-Identifier: Apache-2.0
// hetmesh::mesh: the cluster's shape as the layout search sees it: nodes x devices per node, and the
// bandwidth and latency of one device's intra-node link (NVLink) and inter-node link (its NIC share).
// Ranks fill nodes in blocks (rank r is on node r / devices_per_node), as torchrun and mpirun
// --map-by node:PE assign them by default.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"

namespace hetmesh::mesh {

/// The cluster. An aggregate: `topology{.nodes = 8, .devices_per_node = 8, .intra_bw_gbps = 450, ...}`.
/// Bandwidths are per device, in GB/s (1e9 bytes/s); latencies are per message, in microseconds.
struct topology {
  int nodes = 1;
  int devices_per_node = 1;
  double intra_bw_gbps =
      450.0;  ///< one device's NVLink bandwidth (H100/H200 NVLink 4: ~450 GB/s per direction)
  double inter_bw_gbps = 50.0;     ///< one device's share of the network (one 400 Gb/s NIC per GPU: 50 GB/s)
  double intra_latency_us = 3.0;   ///< per-message latency inside a node
  double inter_latency_us = 10.0;  ///< per-message latency across nodes

  /// Throws invalid_argument naming the field unless counts are >= 1, bandwidths > 0, latencies >= 0
  /// and nodes * devices_per_node fits an int. O(1).
  void validate() const {
    if (nodes < 1 || devices_per_node < 1) {
      throw_error<invalid_argument>("topology has {} nodes x {} devices per node: expected both >= 1", nodes,
                                    devices_per_node);
    }
    if (static_cast<std::int64_t>(nodes) * devices_per_node > INT_MAX) {
      throw_error<invalid_argument>("topology has more than {} devices: expected an int rank", INT_MAX);
    }
    if (!(intra_bw_gbps > 0) || !(inter_bw_gbps > 0)) {
      throw_error<invalid_argument>(
          "topology bandwidths are {} (intra) and {} (inter) GB/s: expected both > 0", intra_bw_gbps,
          inter_bw_gbps);
    }
    if (!(intra_latency_us >= 0) || !(inter_latency_us >= 0)) {
      throw_error<invalid_argument>("topology latencies are {} (intra) and {} (inter) us: expected both >= 0",
                                    intra_latency_us, inter_latency_us);
    }
  }

  /// nodes * devices_per_node.
  [[nodiscard]] int world() const noexcept { return nodes * devices_per_node; }

  /// The node of `rank`. Throws invalid_argument when rank is outside [0, world()).
  [[nodiscard]] int node_of(int rank) const {
    if (rank < 0 || rank >= world()) {
      throw_error<invalid_argument>("rank {} is outside the topology's {} devices: expected 0 <= rank < {}",
                                    rank, world(), world());
    }
    return rank / devices_per_node;
  }
  /// The device index of `rank` within its node.
  [[nodiscard]] int local_of(int rank) const {
    (void)node_of(rank);
    return rank % devices_per_node;
  }
  [[nodiscard]] bool same_node(int a, int b) const { return node_of(a) == node_of(b); }

  /// The ranks on `node`, ascending.
  [[nodiscard]] std::vector<int> ranks_of_node(int node) const {
    if (node < 0 || node >= nodes) {
      throw_error<invalid_argument>("node {} is outside the topology: expected 0 <= node < {}", node, nodes);
    }
    std::vector<int> r(static_cast<std::size_t>(devices_per_node));
    for (int i = 0; i < devices_per_node; ++i) r[static_cast<std::size_t>(i)] = node * devices_per_node + i;
    return r;
  }

  /// How many distinct nodes the ranks of `group` occupy. O(n log n).
  [[nodiscard]] int nodes_spanned(std::span<const int> group) const {
    std::vector<int> n;
    for (int r : group) n.push_back(node_of(r));
    std::sort(n.begin(), n.end());
    return static_cast<int>(std::unique(n.begin(), n.end()) - n.begin());
  }
  /// True when every rank of `group` is on one node (its traffic stays on the intra-node links).
  [[nodiscard]] bool within_one_node(std::span<const int> group) const { return nodes_spanned(group) <= 1; }

  friend bool operator==(const topology&, const topology&) = default;
  void hash_append(hasher& h) const {
    append_all(h, nodes, devices_per_node, intra_bw_gbps, inter_bw_gbps, intra_latency_us, inter_latency_us);
  }
};

}  // namespace hetmesh::mesh

template <>
struct fmt::formatter<hetmesh::mesh::topology> : hetmesh::empty_spec_formatter {
  auto format(const hetmesh::mesh::topology& t, fmt::format_context& ctx) const -> decltype(ctx.out()) {
    return fmt::format_to(
        ctx.out(), "{} nodes x {} devices (intra-node {} GB/s, {} us; inter-node {} GB/s, {} us)", t.nodes,
        t.devices_per_node, t.intra_bw_gbps, t.intra_latency_us, t.inter_bw_gbps, t.inter_latency_us);
  }
};
