// SPDX-License-Identifier: Apache-2.0
// hetmesh::cost: the fixed-point cost type. Models compute in double (FMA contraction, libm and
// summation order may differ between ranks and compilers); every value that reaches a planner's
// comparison is first rounded to an integer count of 1e-6 model units, so a plan never depends on the
// last bit of a double. With the model unit = 1 ms, one tick is 1 ns and the range is +-292 years.
#pragma once

#include <cmath>
#include <compare>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"

namespace hetmesh::cost {

/// A modelled cost (time, in model units, usually milliseconds) as an integer number of ticks.
/// Totally ordered, hashable, printable; adding two fixed values is exact (saturation is an error).
struct fixed {
  /// Ticks per model unit.
  static constexpr std::int64_t ticks_per_unit = 1'000'000;

  std::int64_t ticks = 0;  ///< the value, in ticks (units x ticks_per_unit)

  /// Rounds `units` to the nearest tick. Pre: finite and within +-9.2e12 units (invalid_argument
  /// otherwise: a NaN or overflow here means a broken model, not a big batch). Deterministic for a
  /// given double; O(1).
  [[nodiscard]] HETMESH_COMPILED static fixed from_units(double units);
  /// The value of `t` ticks, exactly.
  [[nodiscard]] static constexpr fixed from_ticks(std::int64_t t) noexcept { return fixed{t}; }
  /// The value in model units (a double, for printing and reports).
  [[nodiscard]] constexpr double units() const noexcept {
    return static_cast<double>(ticks) / static_cast<double>(ticks_per_unit);
  }
  /// Zero.
  [[nodiscard]] static constexpr fixed zero() noexcept { return fixed{0}; }
  /// The largest value, for "no bound yet".
  [[nodiscard]] static constexpr fixed max() noexcept {
    return fixed{std::numeric_limits<std::int64_t>::max()};
  }

  /// Adds exactly (integer ticks).
  constexpr fixed& operator+=(fixed o) noexcept {
    ticks += o.ticks;
    return *this;
  }
  /// Subtracts exactly (integer ticks).
  constexpr fixed& operator-=(fixed o) noexcept {
    ticks -= o.ticks;
    return *this;
  }
  /// Exact sum.
  friend constexpr fixed operator+(fixed a, fixed b) noexcept { return fixed{a.ticks + b.ticks}; }
  /// Exact difference.
  friend constexpr fixed operator-(fixed a, fixed b) noexcept { return fixed{a.ticks - b.ticks}; }
  /// Integer scaling (e.g. by a layer count): exact.
  friend constexpr fixed operator*(fixed a, std::int64_t k) noexcept { return fixed{a.ticks * k}; }
  /// Totally ordered by ticks: the comparisons planners' sort keys rely on.
  friend constexpr auto operator<=>(fixed, fixed) = default;
  friend constexpr bool operator==(fixed, fixed) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The tick counts of `costs`, for the solvers in balance/solvers.hpp (which take raw int64).
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> ticks_of(std::span<const fixed> costs);

}  // namespace hetmesh::cost

template <>
struct fmt::formatter<hetmesh::cost::fixed> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::cost::fixed& f, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{:.6f}", f.units());
  }
};

#if HETMESH_BODIES

namespace hetmesh::cost {

HETMESH_COMPILED fixed fixed::from_units(double units) {
  const double t = units * static_cast<double>(ticks_per_unit);
  if (!std::isfinite(t) || std::fabs(t) >= 9.0e18) {
    throw_error<invalid_argument>(
        "cost::fixed: value {} model units is not finite or out of range; expected |value| < 9e12", units);
  }
  return fixed{std::llround(t)};
}

HETMESH_COMPILED void fixed::hash_append(hasher& h) const { append(h, ticks); }

HETMESH_COMPILED std::vector<std::int64_t> ticks_of(std::span<const fixed> costs) {
  std::vector<std::int64_t> out;
  out.reserve(costs.size());
  for (auto c : costs) out.push_back(c.ticks);
  return out;
}

}  // namespace hetmesh::cost
#endif  // HETMESH_BODIES
