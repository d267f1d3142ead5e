// SPDX-License-Identifier: Apache-2.0
// hetmesh::cost: activation memory. With FlashAttention a layer stores O(s) activations per sequence,
// so ByteScale's Act(s) = alpha s + beta (bytes per layer) is enough to size ranks: a rank's capacity C
// is the token count whose activations fill its budget, and a sequence longer than C needs a ring of
// D(s) ranks (fewer with offloading: offload_model here, its solver in seq/offload.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "compute.hpp"

namespace hetmesh::cost {

/// Act(s) = alpha s + beta bytes per layer; `layers` layers live on a rank.
struct activation_memory {
  double alpha = 0.0;       ///< bytes per token per layer
  double beta = 0.0;        ///< bytes per layer independent of length (workspace)
  std::int64_t layers = 1;  ///< layers the rank holds

  /// Activations of a transformer layer with FlashAttention and no recomputation: about 34 h bytes
  /// per token in 16-bit types (Korthikanti et al.; the 5 a s / h attention-score term disappears),
  /// divided over `tp` tensor-parallel ranks with sequence parallelism. Pre: hidden, layers, tp > 0.
  [[nodiscard]] HETMESH_COMPILED static activation_memory from_dims(std::int64_t hidden, std::int64_t layers,
                                                                    std::int64_t tp = 1);

  /// Act(s) for one layer, bytes. O(1).
  [[nodiscard]] constexpr double per_layer(std::int64_t s) const noexcept {
    return alpha * static_cast<double>(s) + beta;
  }
  /// Activations of all `layers` layers, bytes. O(1).
  [[nodiscard]] constexpr double bytes(std::int64_t s) const noexcept {
    return static_cast<double>(layers) * per_layer(s);
  }
  /// The largest s with bytes(s) <= budget (the rank capacity C). Pre: alpha > 0. Post: result >= 0;
  /// bytes(result) <= budget < bytes(result + 1). O(1).
  [[nodiscard]] HETMESH_COMPILED std::int64_t capacity_tokens(double budget_bytes) const;
  /// Ranks needed to hold a sequence of s tokens without offloading, given per-rank capacity c tokens:
  /// ceil(Act(s) / Act(c)). Pre: c >= 1. O(1).
  [[nodiscard]] HETMESH_COMPILED std::int64_t ranks_needed(std::int64_t s, std::int64_t c) const;

  friend constexpr bool operator==(const activation_memory&, const activation_memory&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// What ByteScale's selective offloading (arXiv 2502.21231 §3.3, Eq. 3; solver in seq/offload.hpp)
/// needs to know about one rank: the per-layer compute T(s) (`layer`, in *seconds* as in the paper:
/// it bounds how much copying hides under attention), the activations Act(s) (`activation`; its
/// `layers` is l, the layers one rank holds, one pipeline stage), and the host link's bandwidths in
/// bytes per second. An infinite bandwidth means "the copies always hide" (the paper's worked
/// example ignores the overlap bound). Fill it from calibrated models or the paper's constants: by
/// default the link is unknown (bandwidth 0), no copy is modelled to hide, and selective offloading
/// offloads nothing, so a long sequence gets a ring of the ranks its length needs.
struct offload_model {
  quadratic_time layer{};  ///< T(s): one layer's compute, in seconds
  /// Act(s): activation bytes; its layers is l, the backbone's layers per rank, unknown (0) by default: a
  /// declared host link needs it (solve_offload refuses the pair otherwise), rings without offloading do not.
  activation_memory activation{1.0, 0.0, 0};
  /// Device-to-host bytes per second; infinity: the copies always hide; 0 (the default): unknown, none hides.
  double d2h_bandwidth = 0.0;
  /// Host-to-device bytes per second; infinity: the copies always hide; 0 (the default): unknown.
  double h2d_bandwidth = 0.0;

  /// T(s), one layer over the whole sequence. O(1).
  [[nodiscard]] double compute(std::int64_t s) const noexcept { return layer(static_cast<double>(s)); }
  /// Act(s), one layer over the whole sequence. O(1).
  [[nodiscard]] double activation_bytes(std::int64_t s) const noexcept { return activation.per_layer(s); }
  /// l, the layers one rank holds.
  [[nodiscard]] std::int64_t layers() const noexcept { return activation.layers; }
  /// Whether T(s) has any term (else item costs fall back to counting attention pairs).
  [[nodiscard]] bool timed() const noexcept { return layer != quadratic_time{}; }

  friend bool operator==(const offload_model&, const offload_model&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

}  // namespace hetmesh::cost

template <>
struct fmt::formatter<hetmesh::cost::activation_memory> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::cost::activation_memory& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "Act(s)={:.4g}*s+{:.4g} bytes/layer x {} layers", m.alpha, m.beta,
                              m.layers);
  }
};

template <>
struct fmt::formatter<hetmesh::cost::offload_model> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::cost::offload_model& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "offload_model{{{} (s), {}, d2h={}, h2d={}}}", m.layer, m.activation,
                              m.d2h_bandwidth, m.h2d_bandwidth);
  }
};

#if HETMESH_BODIES

namespace hetmesh::cost {

HETMESH_COMPILED activation_memory activation_memory::from_dims(std::int64_t hidden, std::int64_t layers,
                                                                std::int64_t tp) {
  if (hidden <= 0 || layers <= 0 || tp <= 0) {
    throw_error<invalid_argument>(
        "cost::activation_memory::from_dims: hidden={}, layers={}, tp={}; expected all > 0", hidden, layers,
        tp);
  }
  return activation_memory{34.0 * static_cast<double>(hidden) / static_cast<double>(tp), 0.0, layers};
}

HETMESH_COMPILED std::int64_t activation_memory::capacity_tokens(double budget_bytes) const {
  if (!(alpha > 0.0)) {
    throw_error<invalid_argument>("cost::activation_memory::capacity_tokens: alpha={}; expected alpha > 0",
                                  alpha);
  }
  const double per_token = static_cast<double>(layers) * alpha;
  const double fixed_part = static_cast<double>(layers) * beta;
  if (budget_bytes < fixed_part) return 0;
  auto s = static_cast<std::int64_t>(std::floor((budget_bytes - fixed_part) / per_token));
  while (s > 0 && bytes(s) > budget_bytes) --s;  // guard the rounding of the division
  while (bytes(s + 1) <= budget_bytes) ++s;
  return s;
}

HETMESH_COMPILED std::int64_t activation_memory::ranks_needed(std::int64_t s, std::int64_t c) const {
  if (c < 1)
    throw_error<invalid_argument>("cost::activation_memory::ranks_needed: capacity {}; expected >= 1", c);
  if (s <= c) return 1;
  const double r = per_layer(s) / per_layer(c);
  auto d = static_cast<std::int64_t>(std::ceil(r - 1e-12));
  return d < 1 ? 1 : d;
}

HETMESH_COMPILED void activation_memory::hash_append(hasher& h) const { append_all(h, alpha, beta, layers); }

HETMESH_COMPILED void offload_model::hash_append(hasher& h) const {
  append_all(h, layer, activation, d2h_bandwidth, h2d_bandwidth);
}

}  // namespace hetmesh::cost
#endif  // HETMESH_BODIES
