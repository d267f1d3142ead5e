// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: how many source loaders each source gets. A source's demand is its mixture weight times
// its measured preprocessing cost per sample: a heavy image source at 30% needs more loaders than a
// text source at 70%. Loaders follow demand within a budget; every source keeps at least one loader
// (its access state must live somewhere). The number of loaders never changes the sample stream (the
// planner does not know it), so scaling is free to follow noisy measurements.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/sort.hpp"

namespace hetmesh::data {

/// Settings of loader autoscaling: how often the data plane re-plans how many source loaders each source
/// gets, and within what budget.
struct autoscale_options {
  bool enabled = false;    ///< false: the loader counts stay as configured
  int interval_steps = 8;  ///< re-plan loaders every this many steps
  int loader_budget = 0;   ///< total loaders; 0: two per source
  int max_per_source = 8;  ///< most loaders one source may get
  std::int64_t lookahead_steps =
      0;  ///< size for the weights this many steps ahead (curricula known in advance)
  friend bool operator==(const autoscale_options&, const autoscale_options&) = default;
};

/// Loaders per source: one each, then the rest of `budget` by largest remainder of demand_s = cost_s x
/// weight_s (ties: lower source index), at most max_per_source each. Pure. Pre: spans of equal size,
/// costs >= 0, weights >= 0, budget >= sources (else invalid_argument). Post: sum <= budget, each in
/// [1, max_per_source]. Cost O(S log S).
[[nodiscard]] HETMESH_COMPILED std::vector<int> autoscale_loaders(std::span<const double> cost_per_sample,
                                                                  std::span<const std::int64_t> weights,
                                                                  int budget, int max_per_source);

}  // namespace hetmesh::data

#if HETMESH_BODIES

namespace hetmesh::data {

HETMESH_COMPILED std::vector<int> autoscale_loaders(std::span<const double> cost_per_sample,
                                                    std::span<const std::int64_t> weights, int budget,
                                                    int max_per_source) {
  const std::size_t n = weights.size();
  if (cost_per_sample.size() != n)
    throw_error<invalid_argument>("autoscale_loaders: {} costs for {} weights; expected one per source",
                                  cost_per_sample.size(), n);
  if (budget < static_cast<int>(n))
    throw_error<invalid_argument>("autoscale_loaders: budget {} < {} sources; every source needs one loader",
                                  budget, n);
  if (max_per_source < 1)
    throw_error<invalid_argument>("autoscale_loaders: max_per_source = {}; expected >= 1", max_per_source);
  std::vector<int> k(n, 1);
  std::vector<double> demand(n);
  double total = 0;
  for (std::size_t s = 0; s < n; ++s) {
    if (!(cost_per_sample[s] >= 0))
      throw_error<invalid_argument>("autoscale_loaders: cost[{}] = {}; expected >= 0", s, cost_per_sample[s]);
    demand[s] = cost_per_sample[s] * static_cast<double>(weights[s]);
    total += demand[s];
  }
  int spare = budget - static_cast<int>(n);
  if (total <= 0 || spare == 0) return k;
  // Ideal total loaders per source is budget x share; grant whole loaders beyond the first, then remainders.
  std::vector<double> want(n);
  for (std::size_t s = 0; s < n; ++s)
    want[s] = std::max(0.0, static_cast<double>(budget) * demand[s] / total - 1.0);
  for (std::size_t s = 0; s < n && spare > 0; ++s) {
    const int whole = std::min({static_cast<int>(std::floor(want[s])), max_per_source - k[s], spare});
    k[s] += whole;
    spare -= whole;
    want[s] -= whole;
  }
  std::vector<std::size_t> order(n);
  for (std::size_t s = 0; s < n; ++s) order[s] = s;
  hetmesh::indirect_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return want[a] != want[b] ? want[a] > want[b] : a < b;
  });
  for (std::size_t s : order) {
    if (spare == 0 || want[s] <= 0) break;
    if (k[s] < max_per_source) {
      ++k[s];
      --spare;
    }
  }
  return k;
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
