// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: number-partitioning policies as types (the type is the choice), and the
// `partitioner` concept they model. A partitioner splits integer-priced items into a number of bins;
// the data plane's load-time planner (data::plan_step) uses one for the data-parallel shares of a step
// and for the micro-batches inside each share:
//   lpt_partition             greedy longest-processing-time (solvers.hpp lpt): the default
//   karmarkar_karp_partition  multi-way largest differencing (solvers.hpp karmarkar_karp)
//   round_robin_partition     baseline: items dealt out in stream order, blind to their prices
// The HDP balancers (balancers.hpp: bytescale, gap_filling_hdp, token_count) place a step's sequences
// on a pool of ranks instead; train::system applies them to the step the data plane loaded.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "solvers.hpp"

namespace hetmesh::balance {

/// A number-partitioning policy. Requirements on `P` (a value `p`, prices `costs`, a bin count `bins`):
///   1. `P` is regular: default-constructible, copyable, `p == p` (`std::regular`);
///   2. `P::name` is a constant convertible to `std::string_view`: the name results and tools use;
///   3. `p.split(costs, bins)` returns an `assignment` with every item in exactly one bin of [0, bins)
///      and `load[b]` the summed prices of bin b; it is pure and deterministic (bitwise equal on every
///      rank that computes it), throws invalid_argument for bins < 1 or a negative price;
///   4. `p.hash_append(h)` feeds every parameter to a `hasher`;
///   5. `P` prints through fmt.
template <class P>
concept partitioner = std::regular<P> && std::convertible_to<decltype(P::name), std::string_view> &&
    requires(const P& p, std::span<const std::int64_t> costs, int bins, hasher& h) {
  { p.split(costs, bins) } -> std::same_as<assignment>;
  p.hash_append(h);
} && fmt::is_formattable<P>::value;

/// Greedy LPT (balance::lpt): items by decreasing price, each to the least loaded bin. Makespan within
/// 4/3 of the optimum; O(n log n).
struct lpt_partition {
  /// The name results and the tools use.
  static constexpr std::string_view name = "lpt";
  /// balance::lpt(costs, bins). Local; deterministic.
  [[nodiscard]] HETMESH_COMPILED assignment split(std::span<const std::int64_t> costs, int bins) const;
  friend constexpr bool operator==(const lpt_partition&, const lpt_partition&) = default;
  /// Hashes the family.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Multi-way Karmarkar-Karp (balance::karmarkar_karp): usually closer to the optimum than LPT, at more
/// cost per item.
struct karmarkar_karp_partition {
  /// The name results and the tools use.
  static constexpr std::string_view name = "karmarkar_karp";
  /// balance::karmarkar_karp(costs, bins). Local; deterministic.
  [[nodiscard]] HETMESH_COMPILED assignment split(std::span<const std::int64_t> costs, int bins) const;
  friend constexpr bool operator==(const karmarkar_karp_partition&,
                                   const karmarkar_karp_partition&) = default;
  /// Hashes the family.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Baseline: item i to bin i mod bins, whatever its price (what a loader without balancing does).
struct round_robin_partition {
  /// The name results and the tools use.
  static constexpr std::string_view name = "round_robin";
  /// Deals the items out in order. Pre: bins >= 1, prices >= 0 (else invalid_argument). O(n).
  [[nodiscard]] HETMESH_COMPILED assignment split(std::span<const std::int64_t> costs, int bins) const;
  friend constexpr bool operator==(const round_robin_partition&, const round_robin_partition&) = default;
  /// Hashes the family.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

}  // namespace hetmesh::balance

namespace hetmesh::balance::detail {
/// The partitioners without parameters: each prints as its name followed by "_partition".
template <class P>
inline constexpr bool plain_partition =
    std::same_as<P, lpt_partition> || std::same_as<P, karmarkar_karp_partition> ||
    std::same_as<P, round_robin_partition>;
}  // namespace hetmesh::balance::detail

template <class P>
requires hetmesh::balance::detail::plain_partition<P>
struct fmt::formatter<P> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const P&, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}_partition", P::name);
  }
};

#if HETMESH_BODIES
// The library's own families, checked against their concepts where the bodies are compiled (header-only
// translation units and the compiled part; a translation unit of a separately compiled program skips them).
static_assert(hetmesh::balance::partitioner<hetmesh::balance::lpt_partition>);
static_assert(hetmesh::balance::partitioner<hetmesh::balance::karmarkar_karp_partition>);
static_assert(hetmesh::balance::partitioner<hetmesh::balance::round_robin_partition>);

namespace hetmesh::balance {

HETMESH_COMPILED assignment lpt_partition::split(std::span<const std::int64_t> costs, int bins) const {
  return lpt(costs, bins);
}

HETMESH_COMPILED void lpt_partition::hash_append(hasher& h) const { append(h, name); }

HETMESH_COMPILED assignment karmarkar_karp_partition::split(std::span<const std::int64_t> costs,
                                                            int bins) const {
  return karmarkar_karp(costs, bins);
}

HETMESH_COMPILED void karmarkar_karp_partition::hash_append(hasher& h) const { append(h, name); }

HETMESH_COMPILED assignment round_robin_partition::split(std::span<const std::int64_t> costs,
                                                         int bins) const {
  detail::check_bins(bins, "balance::round_robin_partition");
  detail::check_costs(costs, "balance::round_robin_partition");
  assignment a;
  a.load.assign(static_cast<std::size_t>(bins), 0);
  a.bin_of.resize(costs.size());
  for (std::size_t i = 0; i < costs.size(); ++i) {
    const auto b = i % static_cast<std::size_t>(bins);
    a.bin_of[i] = static_cast<int>(b);
    a.load[b] += costs[i];
  }
  return a;
}

HETMESH_COMPILED void round_robin_partition::hash_append(hasher& h) const { append(h, name); }

}  // namespace hetmesh::balance
#endif  // HETMESH_BODIES
