// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: where HDP's work items run. Two placements of an hdp_sharding's items on the pool, each
// a ring of D ranks and a global order key per item (hdp_assemble turns them into the per-rank plan):
// ByteScale Alg. 1's naive waves of contiguous ranges, and a greedy by modelled cost (LPT over items
// that need D ranks); and the fixed-point item cost that greedy compares. balance/ offers ByteScale's
// Alg. 2 on top of the same types.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../core/sort.hpp"
#include "hdp_plan.hpp"
#include "offload.hpp"

namespace hetmesh::seq {

/// The naive placement of ByteScale Alg. 1 (balance/ offers better ones): items in canonical order
/// are laid first-fit into "waves" of `pool` rank slots, each item on a contiguous range of ranks
/// (ring = that range ascending, so a rank has at most two ring peers per item); order = wave index.
/// Pure; O(items * waves) in the worst case, O(items) typical.
[[nodiscard]] HETMESH_COMPILED std::vector<hdp_placement> hdp_naive_placement(const hdp_sharding& sh);

/// Modelled cost of an item on each of its ranks, as an integer (fixed point, so placements compare
/// exactly): sum over its sequences of T(s) = model.compute(s) in nanoseconds, divided by D; when
/// the model has no compute terms, the causal (query, key) pairs s(s+1)/2 instead. Pure; O(seqs).
[[nodiscard]] HETMESH_COMPILED std::int64_t hdp_item_cost(const hdp_item& it, const offload_model& m);

namespace detail {

/// Binary min-heap steps over keys compared with `<` (the hole technique: one move per level).
template <class Key>
void heap_sift_down(std::vector<Key>& h, std::size_t i) {
  const std::size_t n = h.size();
  const Key v = h[i];
  for (;;) {
    std::size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && h[c + 1] < h[c]) ++c;
    if (!(h[c] < v)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = v;
}
template <class Key>
void heap_sift_up(std::vector<Key>& h, std::size_t i) {
  const Key v = h[i];
  while (i > 0) {
    const std::size_t parent = (i - 1) / 2;
    if (!(v < h[parent])) break;
    h[i] = h[parent];
    i = parent;
  }
  h[i] = v;
}

/// The greedy of hdp_least_loaded_placement over a min-heap of (load, rank) keys. `Slot` encodes a
/// key: Slot::make(load, rank), Slot::rank(key), Slot::add(key, cost). Keys are unique (one per rank)
/// and compare as (load, rank), so each step takes the same ranks whatever the heap's shape.
template <class Slot>
void least_loaded_greedy(const hdp_sharding& sh,
                         std::span<const std::pair<std::int64_t, std::size_t>> by_cost,
                         std::vector<hdp_placement>& out) {
  using key = typename Slot::key;
  std::vector<key> heap(static_cast<std::size_t>(sh.pool));
  for (int r = 0; r < sh.pool; ++r) heap[static_cast<std::size_t>(r)] = Slot::make(0, r);  // a min-heap
  std::vector<key> taken;
  for (std::size_t turn = 0; turn < by_cost.size(); ++turn) {
    const auto [c, i] = by_cost[turn];
    const int d = sh.items[i].degree;
    auto& pl = out[i];
    pl.order = static_cast<std::int64_t>(turn);
    if (d == 1) {  // pop and push of the same rank: one sift
      pl.ring.assign(1, Slot::rank(heap.front()));
      heap.front() = Slot::add(heap.front(), c);
      heap_sift_down(heap, 0);
      continue;
    }
    taken.clear();
    for (int k = 0; k < d; ++k) {
      taken.push_back(heap.front());
      heap.front() = heap.back();
      heap.pop_back();
      if (!heap.empty()) heap_sift_down(heap, 0);
    }
    pl.ring.resize(static_cast<std::size_t>(d));
    for (std::size_t k = 0; k < taken.size(); ++k) {
      pl.ring[k] = Slot::rank(taken[k]);
      heap.push_back(Slot::add(taken[k], c));
      heap_sift_up(heap, heap.size() - 1);
    }
    std::sort(pl.ring.begin(), pl.ring.end());
  }
}

/// (load, rank) packed into one word, load in the high bits: for loads below 2^(64 - rank_bits).
template <int RankBits>
struct packed_slot {
  using key = std::uint64_t;
  static key make(std::int64_t load, int rank) {
    return (static_cast<key>(load) << RankBits) | static_cast<key>(rank);
  }
  static int rank(key k) { return static_cast<int>(k & ((key{1} << RankBits) - 1)); }
  static key add(key k, std::int64_t cost) { return k + (static_cast<key>(cost) << RankBits); }
};
/// (load, rank) as a pair: any loads.
struct pair_slot {
  using key = std::pair<std::int64_t, int>;
  static key make(std::int64_t load, int rank) { return {load, rank}; }
  static int rank(const key& k) { return k.second; }
  static key add(const key& k, std::int64_t cost) { return {k.first + cost, k.second}; }
};

}  // namespace detail

/// Greedy placement by modelled cost (LPT generalised to items needing D ranks): items by
/// (-cost per rank, index), each on the D ranks with the least accumulated cost (ties: lowest
/// rank), ring = those ranks ascending, order = the item's turn in this greedy order (a global
/// order, so no deadlock). Pure; O(sum of D * log pool).
[[nodiscard]] HETMESH_COMPILED std::vector<hdp_placement> hdp_least_loaded_placement(const hdp_sharding& sh);

}  // namespace hetmesh::seq

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED std::vector<hdp_placement> hdp_naive_placement(const hdp_sharding& sh) {
  std::vector<hdp_placement> out(sh.items.size());
  std::vector<int> used;  // ranks used so far in each wave
  std::size_t first_open = 0;
  for (std::size_t i = 0; i < sh.items.size(); ++i) {
    const int d = sh.items[i].degree;
    std::size_t w = first_open;
    while (w < used.size() && used[w] + d > sh.pool) ++w;
    if (w == used.size()) used.push_back(0);
    out[i].order = static_cast<std::int64_t>(w);
    out[i].ring.resize(static_cast<std::size_t>(d));
    for (int k = 0; k < d; ++k) out[i].ring[static_cast<std::size_t>(k)] = used[w] + k;
    used[w] += d;
    while (first_open < used.size() && used[first_open] == sh.pool) ++first_open;
  }
  return out;
}

HETMESH_COMPILED std::int64_t hdp_item_cost(const hdp_item& it, const offload_model& m) {
  const bool timed = m.timed();
  double c = 0;
  for (const auto& s : it.seqs)
    c += timed ? m.compute(s.length) * 1e9
               : 0.5 * static_cast<double>(s.length) * static_cast<double>(s.length + 1);
  return static_cast<std::int64_t>(std::llround(c / it.degree));
}

HETMESH_COMPILED std::vector<hdp_placement> hdp_least_loaded_placement(const hdp_sharding& sh) {
  std::vector<std::pair<std::int64_t, std::size_t>> by_cost(sh.items.size());  // (cost, item)
  bool non_negative = true;
  std::uint64_t total = 0;  // bounds every rank's load (an item adds its cost to a rank at most once)
  for (std::size_t i = 0; i < sh.items.size(); ++i) {
    const std::int64_t c = hdp_item_cost(sh.items[i], sh.policy.model);
    by_cost[i] = {c, i};
    non_negative = non_negative && c >= 0;
    if (c > 0)
      total = static_cast<std::uint64_t>(c) > ~std::uint64_t{0} - total
                  ? ~std::uint64_t{0}
                  : total + static_cast<std::uint64_t>(c);
  }
  hetmesh::indirect_sort(by_cost.begin(), by_cost.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<hdp_placement> out(sh.items.size());
  // One-word keys when every load fits beside a 20-bit rank (pools up to 2^20 ranks): same
  // comparisons as the (load, rank) pairs, at half the memory traffic.
  constexpr int rank_bits = 20;
  if (non_negative && sh.pool <= (1 << rank_bits) && total < (std::uint64_t{1} << (63 - rank_bits)))
    detail::least_loaded_greedy<detail::packed_slot<rank_bits>>(sh, by_cost, out);
  else
    detail::least_loaded_greedy<detail::pair_slot>(sh, by_cost, out);
  return out;
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
