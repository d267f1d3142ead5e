// SPDX-License-Identifier: Apache-2.0
// hetmesh::cost: the price of a mixture-of-experts layer under expert parallelism: the experts' compute on
// the busiest ep rank (the tokens routed to its experts, cost::moe_compute) plus the two all-to-all-v
// exchanges of a layer's forward (dispatch and combine, the transpose of each other) over the ep group's
// links, alpha-beta (cost/comm.hpp). Priced either from a plan's kept counts (what actually moves) or
// under even routing (what a balancer can know before the router runs: a linear term per token and a
// constant per micro-batch, added to a layer's T(s)).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "comm.hpp"
#include "compute.hpp"
#include "encoder.hpp"

namespace hetmesh::cost {

/// One MoE layer over an ep group: its experts' compute (`compute`: experts, top_k, per-token times of one
/// expert and of the router, model units), the width of a token row in elements and bytes, and the
/// training / forward ratio of the compute. Value type; `==`; hashable; printable.
struct moe_layer {
  moe_compute compute{};               ///< experts, top_k and per-token times
  std::int64_t hidden = 1;             ///< elements of one token row (what dispatch and combine move)
  std::int64_t bytes_per_element = 2;  ///< bytes per element on the wire (2: bf16)
  double train_factor = 3.0;           ///< training / forward compute (3: forward + 2x backward)

  /// Throws invalid_argument unless compute is valid, hidden, bytes_per_element >= 1, train_factor >= 1.
  HETMESH_COMPILED void validate() const;
  /// Bytes of one token row. O(1).
  [[nodiscard]] double row_bytes() const noexcept { return static_cast<double>(hidden * bytes_per_element); }

  /// The dispatch's bytes, group[i] to group[j] at [i p + j], from `kept` [p][experts] (a plan's kept
  /// counts: choices rank i keeps for expert e; experts laid out contiguously over the p ranks). Combine
  /// moves the transpose. Errors: sizes that do not fit (invalid_argument). O(p experts).
  [[nodiscard]] HETMESH_COMPILED std::vector<double> dispatch_bytes(std::span<const std::int64_t> kept,
                                                                    std::size_t p) const;

  /// Forward time of the layer on the ep group `group` (ranks of `net`, in ep order) for a plan's `kept`
  /// [p][experts], `tokens_per_rank` tokens routed on each rank: the busiest rank's expert work plus its
  /// router, then dispatch and combine, not overlapped. O(p^2 + p experts).
  [[nodiscard]] HETMESH_COMPILED double forward(const network& net, std::span<const int> group,
                                                std::span<const std::int64_t> kept,
                                                std::int64_t tokens_per_rank) const;
  /// Training time (forward and backward): train_factor x the compute, and the two exchanges each way
  /// twice (the backward moves the gradients of both). O(p^2 + p experts).
  [[nodiscard]] HETMESH_COMPILED double training(const network& net, std::span<const int> group,
                                                 std::span<const std::int64_t> kept,
                                                 std::int64_t tokens_per_rank) const;

  /// The layer's training time under even routing as a term of T(s) = a s^2 + b s + c for a micro-batch of
  /// s tokens on each rank of `group`: b the expert and router work per token plus the bytes each token's k
  /// rows move (the fraction (p-1)/p leaves the rank; both exchanges, forward and backward), c the
  /// exchanges' latencies; a = 0. What a balancer adds to the layer's cost for each MoE layer (exact for a
  /// group whose ranks see the same links; otherwise the busiest rank's). O(p^2).
  [[nodiscard]] HETMESH_COMPILED quadratic_time even_training(const network& net,
                                                              std::span<const int> group) const;

  friend bool operator==(const moe_layer&, const moe_layer&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;

 private:
  [[nodiscard]] HETMESH_COMPILED double expert_work(std::span<const std::int64_t> kept, std::size_t p,
                                                    std::int64_t tokens_per_rank) const;
};

}  // namespace hetmesh::cost

template <>
struct fmt::formatter<hetmesh::cost::moe_layer> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::cost::moe_layer& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "moe_layer({}, hidden={}, bytes/element={}, train_factor={})",
                              m.compute, m.hidden, m.bytes_per_element, m.train_factor);
  }
};

#if HETMESH_BODIES

namespace hetmesh::cost {

HETMESH_COMPILED void moe_layer::validate() const {
  compute.validate();
  if (hidden < 1 || bytes_per_element < 1 || !(train_factor >= 1.0))
    throw_error<invalid_argument>(
        "cost::moe_layer: hidden {}, bytes_per_element {}, train_factor {}; expected hidden, "
        "bytes_per_element >= 1 and train_factor >= 1",
        hidden, bytes_per_element, train_factor);
}

HETMESH_COMPILED std::vector<double> moe_layer::dispatch_bytes(std::span<const std::int64_t> kept,
                                                               std::size_t p) const {
  validate();
  const auto ne = static_cast<std::size_t>(compute.experts);
  if (p < 1 || ne % p != 0 || kept.size() != p * ne)
    throw_error<invalid_argument>(
        "cost::moe_layer::dispatch_bytes: {} kept counts over {} ranks of {} experts; expected ranks x "
        "experts "
        "and ranks dividing the experts",
        kept.size(), p, ne);
  std::vector<double> bytes(p * p, 0.0);
  for (std::size_t i = 0; i < p; ++i)
    for (std::size_t e = 0; e < ne; ++e)
      bytes[i * p + e / (ne / p)] += static_cast<double>(kept[i * ne + e]) * row_bytes();
  return bytes;
}

HETMESH_COMPILED double moe_layer::forward(const network& net, std::span<const int> group,
                                           std::span<const std::int64_t> kept,
                                           std::int64_t tokens_per_rank) const {
  const auto p = group.size();
  const auto bytes = dispatch_bytes(kept, p);
  std::vector<double> back(p * p);
  for (std::size_t i = 0; i < p; ++i)
    for (std::size_t j = 0; j < p; ++j) back[j * p + i] = bytes[i * p + j];
  return expert_work(kept, p, tokens_per_rank) + all_to_all_v_time(net, group, bytes) +
         all_to_all_v_time(net, group, back);
}

HETMESH_COMPILED double moe_layer::training(const network& net, std::span<const int> group,
                                            std::span<const std::int64_t> kept,
                                            std::int64_t tokens_per_rank) const {
  const double work = expert_work(kept, group.size(), tokens_per_rank);
  return train_factor * work + 2.0 * (forward(net, group, kept, tokens_per_rank) - work);
}

HETMESH_COMPILED quadratic_time moe_layer::even_training(const network& net,
                                                         std::span<const int> group) const {
  validate();
  const auto p = static_cast<double>(group.size());
  const double k = static_cast<double>(compute.top_k);
  // One all-to-all with one byte and with one token's share per peer: its latency, and its beta per token.
  const double latency = all_to_all_time(net, group, 1.0);
  const double per_token = all_to_all_time(net, group, 1.0 + k * row_bytes() / p) - latency;
  return quadratic_time{
      0.0, train_factor * (compute.router_per_token + k * compute.expert_per_token) + 4.0 * per_token,
      4.0 * latency};
}

HETMESH_COMPILED void moe_layer::hash_append(hasher& h) const {
  append_all(h, compute, hidden, bytes_per_element, train_factor);
}

HETMESH_COMPILED double moe_layer::expert_work(std::span<const std::int64_t> kept, std::size_t p,
                                               std::int64_t tokens_per_rank) const {
  const auto ne = static_cast<std::size_t>(compute.experts);
  std::vector<std::int64_t> per_expert(ne, 0);
  for (std::size_t i = 0; i < kept.size(); ++i) per_expert[i % ne] += kept[i];
  return compute.expert_parallel_layer(per_expert, static_cast<std::int64_t>(p), tokens_per_rank);
}

}  // namespace hetmesh::cost
#endif  // HETMESH_BODIES
