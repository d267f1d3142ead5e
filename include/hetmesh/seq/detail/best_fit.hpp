// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq::detail: best-fit-decreasing bin packing of sequences into bins of one capacity.
// seq/ keeps its own copy (balance/ sits above seq/ and may not be included here).
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "../types.hpp"

namespace hetmesh::seq::detail {

/// Packs `seqs` (each length <= capacity) into bins: sequences in (-length, id) order, each into the
/// open bin with the least remaining room that still fits (ties: the lowest bin index), else a new
/// bin. Returns bins as lists of indices into `seqs`, bin order = creation order, members in
/// insertion order. Deterministic; O(n log n).
[[nodiscard]] inline std::vector<std::vector<std::size_t>> best_fit_decreasing(std::span<const seq_desc> seqs,
                                                                             std::int64_t capacity) {
  std::vector<std::size_t> order(seqs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return longer_first(seqs[a], seqs[b]); });
  std::vector<std::vector<std::size_t>> bins;
  // (remaining room, bin index): lower_bound(length, 0) finds the tightest bin that fits, lowest index.
  std::set<std::pair<std::int64_t, std::size_t>> open;
  for (std::size_t i : order) {
    const std::int64_t len = seqs[i].length;
    auto it = open.lower_bound({len, 0});
    if (it == open.end()) {
      bins.push_back({i});
      open.insert({capacity - len, bins.size() - 1});
    } else {
      const auto [room, bin] = *it;
      open.erase(it);
      bins[bin].push_back(i);
      open.insert({room - len, bin});
    }
  }
  return bins;
}

}  // namespace hetmesh::seq::detail
