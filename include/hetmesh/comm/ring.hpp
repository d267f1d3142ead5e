// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm: dynamic rings. Hybrid data parallelism splits each long sequence over a ring of just
// as many ranks as it needs, a different set every step; creating a communicator per ring would cost
// a collective initialisation per step. Instead a ring is an ordered list of ranks of a parent
// communicator and its traffic is point-to-point on that parent.
#pragma once

#include <algorithm>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../config.hpp"
#include "collectives.hpp"
#include "communicator.hpp"

namespace hetmesh::comm {

/// Position of `rank` in `ring`, or nullopt. O(ring size).
[[nodiscard]] HETMESH_COMPILED std::optional<int> ring_position(std::span<const int> ring, int rank) noexcept
#if HETMESH_BODIES
{
  const auto it = std::find(ring.begin(), ring.end(), rank);
  if (it == ring.end()) return std::nullopt;
  return static_cast<int>(it - ring.begin());
}
#else
    ;
#endif

/// One step of a ring: the caller, at position i of `ring`, sends `send` to ring[i+1] and receives
/// `recv` from ring[i-1] (indices modulo the ring size), as one batch on the parent `c`; no
/// communicator is created. Collective over the ring's ranks only; ranks outside the ring must not
/// call it. A ring of one rank copies send to recv. Pre: ring non-empty, distinct ranks of c,
/// containing c.rank(); send and recv the same size on every ring rank (recv must match the
/// predecessor's send exactly). Cost: one message each way per rank.
template <communicator C, element T>
void ring_exchange(C& c, std::span<const int> ring, std::span<const T> send, std::span<T> recv, int tag = 0) {
  if (ring.empty())
    throw_error<invalid_argument>("ring_exchange on {}: empty ring; expected at least this rank",
                                  describe(c));
  for (std::size_t i = 0; i < ring.size(); ++i) {
    detail::check_peer(c, "ring_exchange", ring[i], "ring rank");
    if (std::find(ring.begin(), ring.begin() + static_cast<std::ptrdiff_t>(i), ring[i]) !=
        ring.begin() + static_cast<std::ptrdiff_t>(i))
      throw_error<invalid_argument>(
          "ring_exchange on {}: rank {} appears twice in ring [{}]; expected distinct ranks", describe(c),
          ring[i], fmt::join(ring, ","));
  }
  const auto pos = ring_position(ring, c.rank());
  if (!pos)
    throw_error<invalid_argument>(
        "ring_exchange on {}: ring [{}] does not contain this rank; expected only ring "
        "members to call it",
        describe(c), fmt::join(ring, ","));
  const int k = static_cast<int>(ring.size());
  const int next = ring[static_cast<std::size_t>((*pos + 1) % k)];
  const int prev = ring[static_cast<std::size_t>((*pos + k - 1) % k)];
  const p2p_op ops[] = {send_op(send, next, tag), recv_op(recv, prev, tag)};
  group_p2p(c, std::span<const p2p_op>(ops));
}

/// For each of `nranks` ranks, the number of distinct other ranks it exchanges ring messages with
/// (its predecessors and successors) across all `rings`: the number of connections a step of these
/// rings opens, which is what a per-ring communicator design would multiply. Pure; O(total ring size
/// log). Pre: every ring's ranks in [0, nranks).
[[nodiscard]] HETMESH_COMPILED std::vector<int> ring_peer_counts(std::span<const std::vector<int>> rings,
                                                                 int nranks)
#if HETMESH_BODIES
{
  if (nranks < 1) throw_error<invalid_argument>("ring_peer_counts: {} ranks; expected at least 1", nranks);
  std::vector<std::set<int>> peers(static_cast<std::size_t>(nranks));
  for (const auto& ring : rings) {
    const auto k = ring.size();
    for (std::size_t i = 0; i < k; ++i) {
      const int r = ring[i];
      if (r < 0 || r >= nranks)
        throw_error<invalid_argument>("ring_peer_counts: ring [{}] holds rank {}; expected ranks in [0, {})",
                                      fmt::join(ring, ","), r, nranks);
      const int next = ring[(i + 1) % k], prev = ring[(i + k - 1) % k];
      if (next != r) peers[static_cast<std::size_t>(r)].insert(next);
      if (prev != r) peers[static_cast<std::size_t>(r)].insert(prev);
    }
  }
  std::vector<int> out(static_cast<std::size_t>(nranks));
  for (std::size_t r = 0; r < out.size(); ++r) out[r] = static_cast<int>(peers[r].size());
  return out;
}
#else
    ;
#endif

}  // namespace hetmesh::comm
