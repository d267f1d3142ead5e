// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq::detail: best-fit-decreasing bin packing of sequences into bins of one capacity.
// seq/ keeps its own copy (balance/ sits above seq/ and may not be included here).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "../../core/sort.hpp"
#include "../types.hpp"

namespace hetmesh::seq::detail {

/// Open bins by remaining room, for capacities small enough to index: per room a min-heap of bin
/// indices, and a two-level bitset of non-empty rooms, so "the tightest room >= len, lowest bin"
/// costs a few word scans instead of a balanced-tree walk.
class room_index {
 public:
  explicit room_index(std::int64_t capacity)
      : heaps_(static_cast<std::size_t>(capacity) + 1),
        words_((static_cast<std::size_t>(capacity) + 64) / 64, 0),
        summary_((words_.size() + 63) / 64, 0) {}

  void insert(std::int64_t room, std::size_t bin) {
    auto& h = heaps_[static_cast<std::size_t>(room)];
    h.push_back(bin);
    std::push_heap(h.begin(), h.end(), std::greater<>{});
    set_bit(static_cast<std::size_t>(room));
  }
  /// Removes and returns (room, bin) with the smallest room >= len (lowest bin among equals), or
  /// room = -1 when no open bin has that much room.
  std::pair<std::int64_t, std::size_t> take(std::int64_t len) {
    const auto room = next_set(static_cast<std::size_t>(len));
    if (room == npos) return {-1, 0};
    auto& h = heaps_[room];
    std::pop_heap(h.begin(), h.end(), std::greater<>{});
    const std::size_t bin = h.back();
    h.pop_back();
    if (h.empty()) clear_bit(room);
    return {static_cast<std::int64_t>(room), bin};
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  void set_bit(std::size_t i) {
    words_[i / 64] |= std::uint64_t{1} << (i % 64);
    summary_[i / 4096] |= std::uint64_t{1} << ((i / 64) % 64);
  }
  void clear_bit(std::size_t i) {
    words_[i / 64] &= ~(std::uint64_t{1} << (i % 64));
    if (words_[i / 64] == 0) summary_[i / 4096] &= ~(std::uint64_t{1} << ((i / 64) % 64));
  }
  [[nodiscard]] std::size_t next_set(std::size_t i) const {
    std::size_t w = i / 64;
    if (w >= words_.size()) return npos;
    const std::uint64_t first = words_[w] & (~std::uint64_t{0} << (i % 64));
    if (first != 0) return w * 64 + static_cast<std::size_t>(std::countr_zero(first));
    ++w;  // find the next non-empty word through the summary
    for (std::size_t s = w / 64; s < summary_.size(); ++s) {
      std::uint64_t bits = summary_[s];
      if (s == w / 64) bits &= (w % 64 == 0) ? ~std::uint64_t{0} : (~std::uint64_t{0} << (w % 64));
      if (bits == 0) continue;
      const std::size_t word = s * 64 + static_cast<std::size_t>(std::countr_zero(bits));
      return word * 64 + static_cast<std::size_t>(std::countr_zero(words_[word]));
    }
    return npos;
  }
  std::vector<std::vector<std::size_t>> heaps_;
  std::vector<std::uint64_t> words_;
  std::vector<std::uint64_t> summary_;
};

/// Packs `seqs` (each length <= capacity) into bins: sequences in (-length, id) order, each into the
/// open bin with the least remaining room that still fits (ties: the lowest bin index), else a new
/// bin. Returns bins as lists of indices into `seqs`, bin order = creation order, members in
/// insertion order. Deterministic; O(n log n).
[[nodiscard]] HETMESH_COMPILED std::vector<std::vector<std::size_t>> best_fit_decreasing(
    std::span<const seq_desc> seqs, std::int64_t capacity)
#if HETMESH_BODIES
{
  // Sorted by value (length, id, index) rather than through indices: the same order as
  // longer_first (ids are unique), without a cache miss per comparison.
  struct key {
    std::int64_t length, id;
    std::size_t index;
  };
  std::vector<key> keys(seqs.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (seqs[i].length > capacity || seqs[i].length < 0)
      throw_error<invalid_argument>(
          "best_fit_decreasing: sequence {} has length {}; expected 0 <= length <= {}", seqs[i].id,
          seqs[i].length, capacity);
    keys[i] = {seqs[i].length, seqs[i].id, i};
  }
  std::vector<std::size_t> order(keys.size());
  const bool ids_ascending = std::adjacent_find(keys.begin(), keys.end(), [](const key& a, const key& b) {
                               return a.id >= b.id;
                             }) == keys.end();
  if (ids_ascending && capacity <= 4 * static_cast<std::int64_t>(keys.size()) + 1024) {
    // Counting sort by length, longest first; stable, so equal lengths keep ascending ids: the
    // same order as the comparison sort below, in O(n + C).
    std::vector<std::size_t> start(static_cast<std::size_t>(capacity) + 2, 0);
    for (const auto& k : keys) ++start[static_cast<std::size_t>(capacity - k.length) + 1];
    for (std::size_t b = 1; b < start.size(); ++b) start[b] += start[b - 1];
    for (const auto& k : keys) order[start[static_cast<std::size_t>(capacity - k.length)]++] = k.index;
  } else {
    hetmesh::indirect_sort(keys.begin(), keys.end(), [](const key& a, const key& b) {
      return a.length != b.length ? a.length > b.length : a.id != b.id ? a.id < b.id : a.index < b.index;
    });
    for (std::size_t i = 0; i < keys.size(); ++i) order[i] = keys[i].index;
  }
  std::vector<std::vector<std::size_t>> bins;
  auto place = [&](auto& open) {
    for (std::size_t i : order) {
      const std::int64_t len = seqs[i].length;
      const auto [room, bin] = open.take(len);
      if (room < 0) {
        bins.push_back({i});
        open.insert(capacity - len, bins.size() - 1);
      } else {
        bins[bin].push_back(i);
        open.insert(room - len, bin);
      }
    }
  };
  if (capacity <= (std::int64_t{1} << 20)) {
    room_index open(capacity);
    place(open);
  } else {  // huge capacities: a balanced tree of (room, bin) instead of per-room buckets
    struct tree {
      std::set<std::pair<std::int64_t, std::size_t>> s;
      void insert(std::int64_t room, std::size_t bin) { s.insert({room, bin}); }
      std::pair<std::int64_t, std::size_t> take(std::int64_t len) {
        auto it = s.lower_bound({len, 0});
        if (it == s.end()) return {-1, 0};
        auto v = *it;
        s.erase(it);
        return v;
      }
    } open;
    place(open);
  }
  return bins;
}
#else
    ;
#endif

}  // namespace hetmesh::seq::detail
