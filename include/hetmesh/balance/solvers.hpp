// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: the three number-partitioning / bin-packing solvers every balancer is built from.
//
//   lpt                  greedy longest-processing-time: makespan <= (4/3 - 1/(3m)) OPT
//   karmarkar_karp       multi-way largest differencing (Korf's m-way LDM): usually far closer than LPT
//   best_fit_decreasing  bin packing under a capacity: bins <= 11/9 OPT + 6/9
//
// All three are pure and deterministic: sort keys are total ((-cost, index)), costs are integers (fixed
// point, see cost/fixed.hpp), and no unordered container reaches the result. Equal inputs give
// bitwise-equal assignments on every rank.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <queue>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"

namespace hetmesh::balance {

/// The result of a solver: item i goes to bin `bin_of[i]`; `load[b]` is the sum of the costs (or sizes)
/// of the items in bin b. Plain data; hashable; printable.
struct assignment {
  std::vector<int> bin_of;         ///< bin of each item
  std::vector<std::int64_t> load;  ///< summed cost of each bin

  /// Number of bins.
  [[nodiscard]] int bins() const noexcept { return static_cast<int>(load.size()); }
  /// The largest bin load (0 when there are no bins).
  [[nodiscard]] std::int64_t makespan() const noexcept {
    return load.empty() ? 0 : *std::max_element(load.begin(), load.end());
  }
  /// Items of bin b, in increasing index order. O(n).
  [[nodiscard]] HETMESH_COMPILED std::vector<int> items_of(int b) const;
  /// Items of every bin at once: result[b] == items_of(b). O(n + bins), where calling items_of for each
  /// bin would be O(n bins). Pre: every bin_of[i] in [0, bins()).
  [[nodiscard]] HETMESH_COMPILED std::vector<std::vector<int>> members() const;
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const assignment&, const assignment&) = default;
};

namespace detail {

HETMESH_COMPILED void check_costs(std::span<const std::int64_t> costs, const char* who);

HETMESH_COMPILED void check_bins(int bins, const char* who);

/// Indices sorted by (-cost, index): the canonical order of every greedy here. From 128 items on, a stable
/// least-significant-digit radix sort over the bytes of (largest cost - cost), as many passes as the
/// costs' range needs (3 for prices below 2^24): stable, so equal costs keep index order, which is the
/// same order as sorting the pairs, in fewer instructions than comparisons (what the data planner's
/// per-step balancing spent most of its time on). Below 128 items it sorts (-cost, index) pairs by value.
/// Pre: costs >= 0.
HETMESH_COMPILED std::vector<int> order_by_decreasing(std::span<const std::int64_t> costs)
#if HETMESH_BODIES
{
  const std::size_t n = costs.size();
  if (n >= 128) {
    const auto [lo, hi] = std::minmax_element(costs.begin(), costs.end());
    const std::int64_t top = *hi;
    const auto range = static_cast<std::uint64_t>(top - *lo);  // costs >= 0: no overflow
    std::vector<std::uint64_t> key(n);
    for (std::size_t i = 0; i < n; ++i) key[i] = static_cast<std::uint64_t>(top - costs[i]);
    std::vector<int> order(n), other(n);
    std::iota(order.begin(), order.end(), 0);
    for (int shift = 0; shift < 64 && (range >> shift) != 0; shift += 8) {
      std::array<std::size_t, 257> at{};  // at[d + 1] counts digit d, then the first slot of digit d
      for (int i : order) ++at[((key[static_cast<std::size_t>(i)] >> shift) & 0xffU) + 1];
      for (std::size_t d = 1; d < at.size(); ++d) at[d] += at[d - 1];
      for (int i : order) other[at[(key[static_cast<std::size_t>(i)] >> shift) & 0xffU]++] = i;
      order.swap(other);
    }
    return order;
  }
  std::vector<std::pair<std::int64_t, int>> keyed(costs.size());
  for (std::size_t i = 0; i < costs.size(); ++i) keyed[i] = {-costs[i], static_cast<int>(i)};
  hetmesh::indirect_sort(keyed.begin(), keyed.end());
  std::vector<int> order(costs.size());
  for (std::size_t k = 0; k < keyed.size(); ++k) order[k] = keyed[k].second;
  return order;
}
#else
    ;
#endif

}  // namespace detail

/// The canonical greedy order: item indices sorted by (-cost, index). Pre: costs >= 0 (invalid_argument
/// otherwise). Deterministic; O(n log n). With list_schedule it is LPT.
[[nodiscard]] HETMESH_COMPILED std::vector<int> decreasing_order(std::span<const std::int64_t> costs);

/// Greedy list scheduling in a given order: items taken as `order` lists them, each to the bin with the
/// smallest load (ties: lowest bin). With order = (-cost, index) this is LPT; a caller that already holds
/// that order (a sub-list of a larger sorted list keeps its order) skips the sort.
/// Pre: costs >= 0, bins >= 1, `order` a permutation of [0, costs.size()). Post: every item in exactly
/// one bin. Local; deterministic. Cost O(n log bins).
[[nodiscard]] HETMESH_COMPILED assignment list_schedule(std::span<const std::int64_t> costs,
                                                        std::span<const int> order, int bins);

/// Greedy LPT: items in (-cost, index) order, each to the bin with the smallest load (ties: lowest bin).
/// Pre: costs >= 0, bins >= 1. Post: every item in exactly one bin of [0, bins); makespan <= (4/3 - 1/(3
/// bins)) * OPT. Local (not collective); deterministic. Cost O(n log n + n log bins).
[[nodiscard]] HETMESH_COMPILED assignment lpt(std::span<const std::int64_t> costs, int bins);

namespace detail {

/// Sparse state of multi-way largest differencing. A "part" is a set of items (a linked list with its
/// sum); a "tuple" is up to m parts kept in (sum desc, first item asc) order, the missing ones being
/// empty parts of sum 0. Storing only non-empty parts keeps memory O(n) even when m is in the
/// thousands, where the textbook m-vector per item would need O(n m).
class kk_state {
 public:
  /// Items are identified by their position in the (-cost, index) order, never by their input index:
  /// every tie-break below then depends only on the sorted costs, so permuting the input permutes the
  /// result and nothing else.
  kk_state(std::span<const std::int64_t> sorted_costs, int m) : m_(m), next_(sorted_costs.size(), -1) {
    parts_.reserve(sorted_costs.size());
    for (std::size_t i = 0; i < sorted_costs.size(); ++i) {
      const int id = static_cast<int>(i);
      parts_.push_back({sorted_costs[i], id, id, id});
    }
  }

  /// Runs the differencing and returns the parts of the last tuple, in canonical order.
  HETMESH_COMPILED std::vector<int> solve();

  [[nodiscard]] std::int64_t sum(int part) const { return parts_[static_cast<std::size_t>(part)].sum; }
  /// Calls f(item) for each item of `part`.
  template <class F>
  void for_each_item(int part, F&& f) const {
    for (int it = parts_[static_cast<std::size_t>(part)].head; it != -1;
         it = next_[static_cast<std::size_t>(it)])
      f(it);
  }

 private:
  struct part {
    std::int64_t sum;
    int head, tail, first;  // linked list of items; `first` = smallest sorted position (tie-break)
  };

  [[nodiscard]] HETMESH_COMPILED std::int64_t spread(const std::vector<int>& t) const;

  HETMESH_COMPILED void absorb(int into, int from);

  /// Largest part of `a` joins the smallest of `b` (an empty one while b has fewer than m parts), etc.
  HETMESH_COMPILED std::vector<int> merge(const std::vector<int>& a, const std::vector<int>& b);

  int m_;
  std::vector<part> parts_;
  std::vector<int> next_;
};

}  // namespace detail

/// Multi-way Karmarkar-Karp (largest differencing method). Bins are numbered by decreasing load (ties:
/// the bin holding the earlier item in (-cost, index) order first); unused bins have load 0.
/// Pre: costs >= 0, bins >= 1. Post: every item in exactly one bin of [0, bins). For m = 2 the result is
/// within 7/6 of OPT; for any m it is never worse than LPT's bound in practice (checked by tests
/// against brute force). Local; deterministic. Cost O(n log n) heap work plus O(sum of tuple sizes) merging.
[[nodiscard]] HETMESH_COMPILED assignment karmarkar_karp(std::span<const std::int64_t> costs, int bins);

/// Best-fit decreasing bin packing: items in (-size, index) order, each into the open bin whose free
/// space is smallest but still enough (ties: lowest bin), else into a new bin.
/// Pre: 0 <= size <= capacity for every item, capacity >= 1 (an oversized item raises capacity_error
/// naming it). Post: every bin's load <= capacity; bins <= 11/9 OPT + 6/9; bins are numbered in order of
/// opening. Local; deterministic. Cost O(n log n).
[[nodiscard]] HETMESH_COMPILED assignment best_fit_decreasing(std::span<const std::int64_t> sizes,
                                                              std::int64_t capacity)
#if HETMESH_BODIES
{
  if (capacity < 1)
    throw_error<invalid_argument>("balance::best_fit_decreasing: capacity = {}; expected >= 1", capacity);
  detail::check_costs(sizes, "balance::best_fit_decreasing");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > capacity) {
      throw_error<capacity_error>(
          "balance::best_fit_decreasing: item {} has size {} > capacity {}; expected every item to fit one "
          "bin",
          i, sizes[i], capacity);
    }
  }
  assignment out;
  out.bin_of.assign(sizes.size(), -1);
  std::set<std::pair<std::int64_t, int>> open;  // (free space, bin)
  for (int i : detail::order_by_decreasing(sizes)) {
    const std::int64_t s = sizes[static_cast<std::size_t>(i)];
    auto it = open.lower_bound({s, -1});
    int b = 0;
    std::int64_t free_space = 0;
    if (it == open.end()) {
      b = static_cast<int>(out.load.size());
      out.load.push_back(0);
      free_space = capacity;
    } else {
      b = it->second;
      free_space = it->first;
      open.erase(it);
    }
    out.bin_of[static_cast<std::size_t>(i)] = b;
    out.load[static_cast<std::size_t>(b)] += s;
    free_space -= s;
    if (free_space > 0) open.emplace(free_space, b);
  }
  return out;
}
#else
    ;
#endif

/// max(ceil(total / bins), largest item): no assignment of `costs` to `bins` bins has a smaller makespan.
[[nodiscard]] HETMESH_COMPILED std::int64_t makespan_lower_bound(std::span<const std::int64_t> costs,
                                                                 int bins);

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::assignment> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::assignment& a, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "assignment(items={}, bins={}, makespan={}, load={})",
                              a.bin_of.size(), a.bins(), a.makespan(), a.load);
  }
};

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED std::vector<int> assignment::items_of(int b) const {
  std::vector<int> out;
  for (std::size_t i = 0; i < bin_of.size(); ++i)
    if (bin_of[i] == b) out.push_back(static_cast<int>(i));
  return out;
}

HETMESH_COMPILED std::vector<std::vector<int>> assignment::members() const {
  std::vector<std::vector<int>> out(load.size());
  for (std::size_t i = 0; i < bin_of.size(); ++i)
    out[static_cast<std::size_t>(bin_of[i])].push_back(static_cast<int>(i));
  return out;
}

HETMESH_COMPILED void assignment::hash_append(hasher& h) const { append_all(h, bin_of, load); }

}  // namespace hetmesh::balance

namespace hetmesh::balance::detail {

HETMESH_COMPILED void check_costs(std::span<const std::int64_t> costs, const char* who) {
  for (std::size_t i = 0; i < costs.size(); ++i) {
    if (costs[i] < 0) {
      throw_error<invalid_argument>(
          "{}: cost[{}] = {} is negative; expected costs >= 0 (fixed-point integers)", who, i, costs[i]);
    }
  }
}

HETMESH_COMPILED void check_bins(int bins, const char* who) {
  if (bins <= 0) throw_error<invalid_argument>("{}: bins = {}; expected at least one bin", who, bins);
}

}  // namespace hetmesh::balance::detail

namespace hetmesh::balance {

HETMESH_COMPILED std::vector<int> decreasing_order(std::span<const std::int64_t> costs) {
  detail::check_costs(costs, "balance::decreasing_order");
  return detail::order_by_decreasing(costs);
}

HETMESH_COMPILED assignment list_schedule(std::span<const std::int64_t> costs, std::span<const int> order,
                                          int bins) {
  detail::check_bins(bins, "balance::list_schedule");
  if (order.size() != costs.size())
    throw_error<invalid_argument>(
        "balance::list_schedule: order has {} entries for {} costs; expected a "
        "permutation of the items",
        order.size(), costs.size());
  assignment out;
  out.bin_of.assign(costs.size(), -1);
  out.load.assign(static_cast<std::size_t>(bins), 0);
  auto take = [&](int i) -> int& {
    if (i < 0 || static_cast<std::size_t>(i) >= costs.size())
      throw_error<invalid_argument>("balance::list_schedule: order names item {}; expected items in [0, {})",
                                    i, costs.size());
    auto& slot = out.bin_of[static_cast<std::size_t>(i)];
    if (slot != -1)
      throw_error<invalid_argument>(
          "balance::list_schedule: item {} appears twice in order; expected a permutation", i);
    return slot;
  };
  if (bins <= 16) {  // a scan of a few loads beats a heap; same choice: smallest load, then lowest bin
    // The loads in a local array (the scan then reads no vector the writes to bin_of could alias).
    std::array<std::int64_t, 16> load{};
    const auto nb = static_cast<std::size_t>(bins);
    for (int i : order) {
      auto& slot = take(i);
      std::size_t b = 0;
      std::int64_t least = load[0];
      for (std::size_t k = 1; k < nb; ++k)
        if (load[k] < least) least = load[k], b = k;
      slot = static_cast<int>(b);
      load[b] = least + costs[static_cast<std::size_t>(i)];
    }
    std::copy_n(load.begin(), nb, out.load.begin());
    return out;
  }
  // Min-heap of (load, bin): lexicographic pairs give the lowest bin among equal loads.
  using entry = std::pair<std::int64_t, int>;
  std::priority_queue<entry, std::vector<entry>, std::greater<>> heap;
  for (int b = 0; b < bins; ++b) heap.emplace(0, b);
  for (int i : order) {
    auto& slot = take(i);
    auto [l, b] = heap.top();
    heap.pop();
    slot = b;
    l += costs[static_cast<std::size_t>(i)];
    out.load[static_cast<std::size_t>(b)] = l;
    heap.emplace(l, b);
  }
  return out;
}

HETMESH_COMPILED assignment lpt(std::span<const std::int64_t> costs, int bins) {
  detail::check_bins(bins, "balance::lpt");
  detail::check_costs(costs, "balance::lpt");
  const auto order = detail::order_by_decreasing(costs);
  return list_schedule(costs, order, bins);
}

}  // namespace hetmesh::balance

namespace hetmesh::balance::detail {

HETMESH_COMPILED std::vector<int> kk_state::solve() {
  const std::size_t n = parts_.size();
  std::vector<std::vector<int>> tuples;
  tuples.reserve(2 * n);
  // Heap keyed by (spread desc, tuple id asc): a total order.
  using entry = std::pair<std::int64_t, int>;  // (-spread, id)
  std::priority_queue<entry, std::vector<entry>, std::greater<>> heap;
  for (std::size_t k = 0; k < n; ++k) {
    tuples.push_back({static_cast<int>(k)});
    heap.emplace(-spread(tuples.back()), static_cast<int>(tuples.size()) - 1);
  }
  while (heap.size() > 1) {
    const int a = heap.top().second;
    heap.pop();
    const int b = heap.top().second;
    heap.pop();
    tuples.push_back(merge(tuples[static_cast<std::size_t>(a)], tuples[static_cast<std::size_t>(b)]));
    std::vector<int>().swap(tuples[static_cast<std::size_t>(a)]);
    std::vector<int>().swap(tuples[static_cast<std::size_t>(b)]);
    heap.emplace(-spread(tuples.back()), static_cast<int>(tuples.size()) - 1);
  }
  if (heap.empty()) return {};
  return tuples[static_cast<std::size_t>(heap.top().second)];
}

HETMESH_COMPILED std::int64_t kk_state::spread(const std::vector<int>& t) const {
  if (t.empty()) return 0;
  const std::int64_t lo = static_cast<int>(t.size()) < m_ ? 0 : sum(t.back());
  return sum(t.front()) - lo;
}

HETMESH_COMPILED void kk_state::absorb(int into, int from) {
  auto& p = parts_[static_cast<std::size_t>(into)];
  const auto& q = parts_[static_cast<std::size_t>(from)];
  p.sum += q.sum;
  next_[static_cast<std::size_t>(p.tail)] = q.head;
  p.tail = q.tail;
  p.first = std::min(p.first, q.first);
}

HETMESH_COMPILED std::vector<int> kk_state::merge(const std::vector<int>& a, const std::vector<int>& b) {
  const int ka = static_cast<int>(a.size());
  const int kb = static_cast<int>(b.size());
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(std::min(m_, ka + kb)));
  // a[i] (desc position i) pairs with b's desc position m-1-i, which is non-empty iff m-1-i < kb.
  for (int i = 0; i < ka; ++i) {
    const int j = m_ - 1 - i;
    if (j < kb) absorb(a[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(j)]);
    out.push_back(a[static_cast<std::size_t>(i)]);
  }
  for (int j = 0; j < kb; ++j)
    if (m_ - 1 - j >= ka) out.push_back(b[static_cast<std::size_t>(j)]);
  hetmesh::indirect_sort(out.begin(), out.end(), [&](int x, int y) {
    const auto& px = parts_[static_cast<std::size_t>(x)];
    const auto& py = parts_[static_cast<std::size_t>(y)];
    return px.sum != py.sum ? px.sum > py.sum : px.first < py.first;
  });
  return out;
}

}  // namespace hetmesh::balance::detail

namespace hetmesh::balance {

HETMESH_COMPILED assignment karmarkar_karp(std::span<const std::int64_t> costs, int bins) {
  detail::check_bins(bins, "balance::karmarkar_karp");
  detail::check_costs(costs, "balance::karmarkar_karp");
  assignment out;
  out.bin_of.assign(costs.size(), -1);
  out.load.assign(static_cast<std::size_t>(bins), 0);
  const std::vector<int> order = detail::order_by_decreasing(costs);
  std::vector<std::int64_t> sorted(costs.size());
  for (std::size_t k = 0; k < order.size(); ++k) sorted[k] = costs[static_cast<std::size_t>(order[k])];
  detail::kk_state st(sorted, bins);
  const std::vector<int> parts = st.solve();
  for (std::size_t b = 0; b < parts.size(); ++b) {
    out.load[b] = st.sum(parts[b]);
    st.for_each_item(parts[b], [&](int k) {
      out.bin_of[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])] = static_cast<int>(b);
    });
  }
  return out;
}

HETMESH_COMPILED std::int64_t makespan_lower_bound(std::span<const std::int64_t> costs, int bins) {
  detail::check_bins(bins, "balance::makespan_lower_bound");
  std::int64_t total = 0;
  std::int64_t largest = 0;
  for (auto c : costs) {
    total += c;
    largest = std::max(largest, c);
  }
  return std::max((total + bins - 1) / bins, largest);
}

}  // namespace hetmesh::balance
#endif  // HETMESH_BODIES
