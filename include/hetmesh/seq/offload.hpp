// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: ByteScale's selective activation offloading (arXiv 2502.21231, Eq. 3). For a long
// sequence, offloading a fraction r of the activations of l-2 of a rank's l layers to host memory
// lets fewer ranks hold it; the copies must hide under the attention compute. The solver picks the
// rank count D and the smallest ratio r that reaches the least D.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../cost/activation_memory.hpp"

namespace hetmesh::seq {

/// The models the solver needs (ByteScale §3.3): cost/'s offload model, T(s) per layer in seconds,
/// Act(s) per layer in bytes, l = activation.layers and the host link's bandwidths.
using offload_model = cost::offload_model;

/// Policy of the solver: ratios are chosen on a grid of `ratio_steps` steps (r = k/ratio_steps), so
/// plans compare exactly and hash the same everywhere; `enabled = false` pins r = 0.
struct offload_policy {
  bool enabled = true;    ///< false: nothing offloaded
  int ratio_steps = 100;  ///< ratios are multiples of 1 / ratio_steps

  friend constexpr bool operator==(const offload_policy&, const offload_policy&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The solver's answer for one sequence.
struct offload_choice {
  std::int64_t length = 0;       ///< sequence length
  int ranks = 1;                 ///< D(s)
  int ratio_steps = 100;         ///< grid of the ratio
  int ratio_k = 0;               ///< r = ratio_k / ratio_steps
  double ratio_max = 0.0;        ///< overlap bound min(1, T(s)*min(B)/Act(s))
  double ratio_lower_bound = 0;  ///< min(1, l*Act(C) / ((l-2)*Act(s))): below it offloading saves no rank

  /// The chosen offload ratio, ratio_k / ratio_steps.
  [[nodiscard]] double ratio() const noexcept { return static_cast<double>(ratio_k) / ratio_steps; }
  friend constexpr bool operator==(const offload_choice&, const offload_choice&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// D(s) of Eq. 3 for a ratio r = k/steps: ceil((2 + (1-r)(l-2)) * Act(s) / (l * Act(C))), at least 1;
/// without offloading (k = 0) ceil(Act(s) / Act(C)), whatever l. Preconditions: capacity > 0, 0 <= k <=
/// steps, model.layers >= 2 when k > 0 (the layers are unknown by default). Pure; O(1).
[[nodiscard]] HETMESH_COMPILED int offload_ranks(std::int64_t s, std::int64_t capacity,
                                                 const offload_model& m, int k, int steps)
#if HETMESH_BODIES
{
  if (capacity <= 0) throw_error<invalid_argument>("offload_ranks: capacity {} must be > 0", capacity);
  if (steps <= 0 || k < 0 || k > steps)
    throw_error<invalid_argument>("offload_ranks: ratio {}/{} must lie in [0, 1] with steps > 0", k, steps);
  if (k == 0) {  // nothing offloaded: the ranks the activations need, whatever the layers
    const double budget0 = m.activation_bytes(capacity);
    if (!(budget0 > 0))
      throw_error<invalid_argument>("offload_ranks: Act(C) must be > 0; check the activation model");
    const double d0 = std::ceil(m.activation_bytes(s) / budget0 * (1.0 - 1e-12));
    return d0 < 1 ? 1 : static_cast<int>(d0);
  }
  if (m.layers() < 2)
    throw_error<invalid_argument>(
        "offload_ranks: offload_model.activation.layers = {}; expected the backbone's layers per rank (>= 2: "
        "Eq. 3 keeps two layers) to offload a share of them",
        m.layers());
  const auto l = static_cast<double>(m.layers());
  const double kept = 2.0 * steps + static_cast<double>(steps - k) * (l - 2.0);
  const double need = kept * m.activation_bytes(s);
  const double budget = static_cast<double>(steps) * l * m.activation_bytes(capacity);
  if (!(budget > 0))
    throw_error<invalid_argument>("offload_ranks: Act(C) must be > 0; check the activation model");
  // A relative guard keeps exact quotients (128.0000000001 from rounding) from adding a rank.
  const double d = std::ceil(need / budget * (1.0 - 1e-12));
  return d < 1 ? 1 : static_cast<int>(d);
}
#else
    ;
#endif

/// Picks (D, r) for a sequence of length s: the least D reachable with r <= r_max (the overlap
/// bound), and the smallest grid ratio reaching it (offloading costs PCIe traffic, so no more than
/// helps). Ties impossible: the key is (D, k). Throws capacity_error when even full offloading
/// (r = 1, ignoring the overlap bound) needs more than `max_ranks` ranks. Pure; O(log steps).
[[nodiscard]] HETMESH_COMPILED offload_choice solve_offload(std::int64_t s, std::int64_t capacity,
                                                            const offload_model& m, const offload_policy& p,
                                                            int max_ranks)
#if HETMESH_BODIES
{
  offload_choice c;
  c.length = s;
  c.ratio_steps = p.ratio_steps;
  const double act = m.activation_bytes(s);
  const double bmin = std::fmin(m.d2h_bandwidth, m.h2d_bandwidth);
  // Infinite bandwidth: copies always hide (the paper's worked example ignores the overlap bound).
  c.ratio_max = std::isinf(bmin) || !(act > 0) ? 1.0 : std::fmin(1.0, m.compute(s) * bmin / act);
  if (!(c.ratio_max >= 0)) c.ratio_max = 0;
  c.ratio_lower_bound = m.layers() > 2
                            ? std::fmin(1.0, static_cast<double>(m.layers()) * m.activation_bytes(capacity) /
                                                 (static_cast<double>(m.layers() - 2) * act))
                            : 1.0;
  const bool layers_known = m.layers() >= 2;
  const int kmax = p.enabled ? static_cast<int>(std::floor(c.ratio_max * p.ratio_steps + 1e-9)) : 0;
  if (kmax > 0 && !layers_known)
    throw_error<invalid_argument>(
        "solve_offload: a host link is declared (d2h {} and h2d {} bytes/s) but "
        "offload_model.activation.layers "
        "is {} (unknown); expected the backbone's layers per rank (>= 2), which selective offloading needs "
        "(ByteScale Eq. 3), or no link (bandwidth 0: rings without offloading)",
        m.d2h_bandwidth, m.h2d_bandwidth, m.layers());
  const int full = offload_ranks(s, capacity, m, layers_known ? p.ratio_steps : 0, p.ratio_steps);
  if (full > max_ranks)
    throw_error<capacity_error>(
        "solve_offload: a sequence of {} tokens needs {} ranks of capacity {} even with full offloading; "
        "the pool has {} ranks",
        s, full, capacity, max_ranks);
  const int best = offload_ranks(s, capacity, m, kmax, p.ratio_steps);
  // D(k) <= best  <=>  k >= steps - (best*steps*l*Act(C)/Act(s) - 2*steps) / (l-2): start at that
  // closed form, then step to the exact least k (D is non-increasing in k).
  int lo = 0;
  if (kmax > 0 && m.layers() > 2) {
    const auto l = static_cast<double>(m.layers());
    const double need = (static_cast<double>(best) * p.ratio_steps * l * m.activation_bytes(capacity) / act -
                         2.0 * p.ratio_steps) /
                        (l - 2.0);
    lo = std::clamp(static_cast<int>(std::ceil(p.ratio_steps - need)), 0, kmax);
    while (lo > 0 && offload_ranks(s, capacity, m, lo - 1, p.ratio_steps) <= best) --lo;
    while (lo < kmax && offload_ranks(s, capacity, m, lo, p.ratio_steps) > best) ++lo;
  }
  c.ratio_k = lo;
  c.ranks = best;
  if (best > max_ranks)
    throw_error<capacity_error>(
        "solve_offload: a sequence of {} tokens needs {} ranks at offload ratio {:.3f} (the most the "
        "compute can hide); the pool has {} ranks",
        s, best, c.ratio(), max_ranks);
  return c;
}
#else
    ;
#endif

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::offload_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::offload_policy& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "offload_policy{{enabled={}, steps={}}}", p.enabled, p.ratio_steps);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::offload_choice> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::offload_choice& c, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "offload{{s={}, D={}, r={:.3f}, r_max={:.3f}, r_lb={:.4f}}}",
                              c.length, c.ranks, c.ratio(), c.ratio_max, c.ratio_lower_bound);
  }
};

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED void offload_policy::hash_append(hasher& h) const { append_all(h, enabled, ratio_steps); }

HETMESH_COMPILED void offload_choice::hash_append(hasher& h) const {
  append_all(h, length, ranks, ratio_steps, ratio_k);
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
