// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: Hybrid Data Parallelism (ByteScale, arXiv 2502.21231 §2, Alg. 1). The dp x cp ranks
// form one pool of `pool` ranks. Each step, every sequence gets just the ranks its length needs:
// short ones (length <= C) are packed whole onto single ranks by best fit; a long one runs on a ring
// of D(s) ranks (any D, from the offload solver), split zigzag into 2D chunks. Rings are ordered
// lists of pool ranks on the parent communicator (no per-ring communicator).
//
// The planner is split in two so that balance/ can replace the placement:
//   hdp_shard     sequences -> work items (packed bins, rings with D and offload ratio)   [what]
//   hdp_assemble  items + placement (ring ranks and an order key per item) -> per-rank plan [where]
//   plan_hdp      hdp_shard + a naive contiguous placement + hdp_assemble (ByteScale Alg. 1)
// Loss: each rank divides its summed token loss by `global_tokens`, and gradients are SUM-reduced
// over the pool; then the gradient equals plain data parallelism for any placement (ByteScale Eq. 1-2).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/exactly_once.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "detail/best_fit.hpp"
#include "offload.hpp"
#include "types.hpp"

namespace hetmesh::seq {

/// How plan_hdp places items on ranks (balance/ offers ByteScale's Alg. 2 on top of hdp_assemble).
enum class hdp_placement_kind {
  waves,         ///< ByteScale Alg. 1's naive step: contiguous ranges, first fit into waves of the pool
  least_loaded,  ///< greedy by modelled cost: each item on the D least-loaded ranks (multi-rank LPT)
};

/// Policy value of HDP. `capacity` is C, the tokens of activations one rank holds per micro-batch.
struct hdp_policy {
  std::int64_t capacity = 8192;              ///< C: activation tokens one rank holds per micro-batch
  offload_policy offload{.enabled = false};  ///< selective offloading of activations (off by default)
  offload_model model{};  ///< offload solver and item costs; Act(s) proportional to s by default
  hdp_placement_kind placement = hdp_placement_kind::waves;  ///< how rings are placed on the pool

  friend bool operator==(const hdp_policy&, const hdp_policy&) = default;
  void hash_append(hasher& h) const { append_all(h, capacity, offload, model, placement); }
};

/// One unit of work: either a pack of whole short sequences on one rank (degree 1, `packed`), or
/// one long sequence on a ring of `degree` ranks with an offload ratio.
struct hdp_item {
  std::int64_t index = 0;      ///< position in hdp_sharding::items
  bool packed = false;         ///< a pack of whole short sequences on one rank
  int degree = 1;              ///< D: ranks of the ring (1 for packs)
  offload_choice offload{};    ///< ratio and solver bounds (ratio 0 for packs)
  std::vector<seq_desc> seqs;  ///< packed: members in pack order; ring: exactly one
  std::int64_t tokens = 0;     ///< sum of member lengths

  friend bool operator==(const hdp_item&, const hdp_item&) = default;
  void hash_append(hasher& h) const { append_all(h, index, packed, degree, offload, seqs, tokens); }
};

/// Output of hdp_shard: items in canonical order (rings by (-length, id), then packs in best-fit
/// creation order), and the global token count for loss normalisation.
struct hdp_sharding {
  hdp_policy policy{};             ///< the policy it was made with
  int pool = 0;                    ///< ranks of the HDP pool
  std::vector<hdp_item> items;     ///< canonical order: rings, then packs
  std::int64_t global_tokens = 0;  ///< tokens of the batch, for loss normalisation

  friend bool operator==(const hdp_sharding&, const hdp_sharding&) = default;
  void hash_append(hasher& h) const { append_all(h, policy, pool, items, global_tokens); }
};

/// Zigzag chunk k of 2D for a sequence of length s: [floor(k*s/2D), floor((k+1)*s/2D)). Chunks differ
/// by at most one token, so any s >= 2D splits over any D without padding.
[[nodiscard]] constexpr token_range hdp_chunk(std::int64_t s, int degree, int k) noexcept {
  const std::int64_t n = 2 * static_cast<std::int64_t>(degree);
  return {k * s / n, (k + 1) * s / n};
}

/// The two zigzag ranges the rank at ring position p holds: chunks p and 2D-1-p (one range when D==1).
[[nodiscard]] inline std::vector<token_range> hdp_ranges(std::int64_t s, int degree, int position) {
  if (degree == 1) return {{0, s}};
  return {hdp_chunk(s, degree, position), hdp_chunk(s, degree, 2 * degree - 1 - position)};
}

/// Where an item runs: its ring (ordered pool ranks, size = degree) and an order key. Each rank runs
/// its items by (order, item index); because that order is global, every ring's members reach it
/// together and the step cannot deadlock.
struct hdp_placement {
  std::vector<int> ring;   ///< ordered pool ranks, size = degree
  std::int64_t order = 0;  ///< global order key

  friend bool operator==(const hdp_placement&, const hdp_placement&) = default;
  void hash_append(hasher& h) const { append_all(h, ring, order); }
};

/// One micro-batch on one rank: the item, this rank's place in the item's ring (the ring itself is
/// hdp_plan::ring(mb), stored once per item rather than once per member), the token ranges it holds
/// (per sequence, local order = order of `segments`), and its offload ratio.
struct hdp_micro_batch {
  std::int64_t item = 0;              ///< index in hdp_sharding::items
  std::int64_t order = 0;             ///< the item's order key
  int degree = 1;                     ///< ring size D (1 for a pack)
  int ring_position = 0;              ///< index of this rank in the item's ring
  std::vector<seq_segment> segments;  ///< packs: whole sequences; rings: chunks p and 2D-1-p
  double offload_ratio = 0.0;         ///< share of activations offloaded
  std::int64_t tokens = 0;            ///< tokens this rank holds

  friend bool operator==(const hdp_micro_batch&, const hdp_micro_batch&) = default;
  void hash_append(hasher& h) const {
    append_all(h, item, order, degree, ring_position, segments, offload_ratio, tokens);
  }
};

/// The per-step HDP plan: equal on every rank that computes it.
struct hdp_plan {
  hdp_sharding sharding;                               ///< the items of the step
  std::vector<hdp_placement> placement;                ///< per item
  std::vector<std::vector<hdp_micro_batch>> per_rank;  ///< per pool rank, in execution order

  /// Divide each rank's summed token loss by this (then SUM-reduce gradients over the pool).
  [[nodiscard]] std::int64_t global_tokens() const noexcept { return sharding.global_tokens; }
  /// The ordered pool ranks of a micro-batch's ring; ring(mb)[mb.ring_position] is its own rank.
  [[nodiscard]] const std::vector<int>& ring(const hdp_micro_batch& mb) const {
    return placement[static_cast<std::size_t>(mb.item)].ring;
  }
  /// Ring neighbours of a micro-batch (send KV to next, receive from prev), as pool ranks.
  [[nodiscard]] int next_rank(const hdp_micro_batch& mb) const {
    const auto& r = ring(mb);
    return r[static_cast<std::size_t>((mb.ring_position + 1) % mb.degree)];
  }
  /// The pool rank this micro-batch receives KV from (its ring predecessor).
  [[nodiscard]] int prev_rank(const hdp_micro_batch& mb) const {
    const auto& r = ring(mb);
    return r[static_cast<std::size_t>((mb.ring_position + mb.degree - 1) % mb.degree)];
  }
  friend bool operator==(const hdp_plan&, const hdp_plan&) = default;
  void hash_append(hasher& h) const { append_all(h, sharding, placement, per_rank); }
};

/// Data-aware sharding (ByteScale §2.3 and Alg. 1 lines 1-2). Sequences of length <= C are packed
/// by best-fit decreasing into bins of C; a longer one gets (D, r) from solve_offload, with D capped
/// to `pool`. Preconditions: pool >= 1, C >= 1, unique ids, lengths >= 0 (zero-length sequences are
/// dropped). Postconditions: every sequence appears in exactly one item; packs hold <= C tokens;
/// a ring of D ranks has length >= 2D. Throws capacity_error for a sequence the pool cannot hold
/// even with full offloading. Pure and independent of input order; O(n log n). Not collective.
[[nodiscard]] HETMESH_COMPILED hdp_sharding hdp_shard(std::span<const seq_desc> seqs,
                                                      const hdp_policy& policy, int pool)
#if HETMESH_BODIES
{
  if (pool < 1) throw_error<invalid_argument>("hdp_shard: pool has {} ranks; expected >= 1", pool);
  if (policy.capacity < 1)
    throw_error<invalid_argument>("hdp_shard: capacity C = {}; expected >= 1 token", policy.capacity);
  check_seq_descs(seqs, "hdp_shard");
  hdp_sharding out;
  out.policy = policy;
  out.pool = pool;
  std::vector<seq_desc> shorts, longs;
  for (const auto& s : seqs) {
    out.global_tokens += s.length;
    if (s.length == 0) continue;
    (s.length <= policy.capacity ? shorts : longs).push_back(s);
  }
  hetmesh::indirect_sort(longs.begin(), longs.end(), longer_first);
  const auto bins = detail::best_fit_decreasing(shorts, policy.capacity);
  out.items.reserve(longs.size() + bins.size());
  for (const auto& s : longs) {
    hdp_item it;
    it.offload = solve_offload(s.length, policy.capacity, policy.model, policy.offload, pool);
    it.degree = it.offload.ranks;
    if (s.length < 2 * static_cast<std::int64_t>(it.degree))
      throw_error<invalid_argument>(
          "hdp_shard: sequence {} of {} tokens cannot be split into 2*D = {} zigzag chunks; expected "
          "length >= 2*D (raise the capacity)",
          s.id, s.length, 2 * it.degree);
    it.seqs = {s};
    it.tokens = s.length;
    out.items.push_back(std::move(it));
  }
  for (const auto& bin : bins) {
    hdp_item it;
    it.packed = true;
    it.seqs.reserve(bin.size());
    it.offload.ratio_steps = policy.offload.ratio_steps;
    for (std::size_t i : bin) {
      it.seqs.push_back(shorts[i]);
      it.tokens += shorts[i].length;
    }
    it.offload.length = it.tokens;
    out.items.push_back(std::move(it));
  }
  for (std::size_t i = 0; i < out.items.size(); ++i) out.items[i].index = static_cast<std::int64_t>(i);
  return out;
}
#else
    ;
#endif

/// Builds the per-rank plan from a placement (one hdp_placement per item). Checks that each ring has
/// `degree` distinct ranks in [0, pool). Per rank, micro-batches run by (order, item). Pure; O(total
/// ring size * log). Throws invalid_argument on a malformed placement.
[[nodiscard]] HETMESH_COMPILED hdp_plan hdp_assemble(hdp_sharding sharding,
                                                     std::vector<hdp_placement> placement)
#if HETMESH_BODIES
{
  if (placement.size() != sharding.items.size())
    throw_error<invalid_argument>("hdp_assemble: {} placements for {} items; expected one per item",
                                  placement.size(), sharding.items.size());
  hdp_plan plan;
  plan.per_rank.resize(static_cast<std::size_t>(sharding.pool));
  {  // reserve exactly: one allocation per rank
    std::vector<std::size_t> count(static_cast<std::size_t>(sharding.pool), 0);
    for (const auto& pl : placement)
      for (int r : pl.ring)
        if (r >= 0 && r < sharding.pool) ++count[static_cast<std::size_t>(r)];
    for (std::size_t r = 0; r < count.size(); ++r) plan.per_rank[r].reserve(count[r]);
  }
  std::vector<int> seen(static_cast<std::size_t>(sharding.pool), -1);
  for (std::size_t i = 0; i < sharding.items.size(); ++i) {
    const auto& it = sharding.items[i];
    const auto& pl = placement[i];
    if (static_cast<int>(pl.ring.size()) != it.degree)
      throw_error<invalid_argument>("hdp_assemble: item {} has a ring of {} ranks; expected D = {}", i,
                                    pl.ring.size(), it.degree);
    for (std::size_t p = 0; p < pl.ring.size(); ++p) {
      const int r = pl.ring[p];
      if (r < 0 || r >= sharding.pool)
        throw_error<invalid_argument>("hdp_assemble: item {} names rank {}; expected a rank in [0, {})", i, r,
                                      sharding.pool);
      if (seen[static_cast<std::size_t>(r)] == static_cast<int>(i))
        throw_error<invalid_argument>("hdp_assemble: item {} names rank {} twice; expected distinct ranks", i,
                                      r);
      seen[static_cast<std::size_t>(r)] = static_cast<int>(i);
      hdp_micro_batch mb;
      mb.item = static_cast<std::int64_t>(i);
      mb.order = pl.order;
      mb.degree = it.degree;
      mb.ring_position = static_cast<int>(p);
      mb.offload_ratio = it.offload.ratio();
      if (it.packed) {
        mb.segments.reserve(it.seqs.size());
        for (const auto& s : it.seqs) {
          mb.segments.push_back({s.id, {0, s.length}});
          mb.tokens += s.length;
        }
      } else {  // hdp_ranges, without its temporary vector
        const auto& s = it.seqs.front();
        const int pos = static_cast<int>(p);
        if (it.degree == 1) {
          mb.segments.push_back({s.id, {0, s.length}});
        } else {
          mb.segments.reserve(2);
          mb.segments.push_back({s.id, hdp_chunk(s.length, it.degree, pos)});
          mb.segments.push_back({s.id, hdp_chunk(s.length, it.degree, 2 * it.degree - 1 - pos)});
        }
        for (const auto& sg : mb.segments) mb.tokens += sg.tokens.size();
      }
      plan.per_rank[static_cast<std::size_t>(r)].push_back(std::move(mb));
    }
  }
  const auto before = [](const hdp_micro_batch& a, const hdp_micro_batch& b) {
    return a.order != b.order ? a.order < b.order : a.item < b.item;
  };
  for (auto& mbs : plan.per_rank)
    if (!std::is_sorted(mbs.begin(), mbs.end(), before))
      hetmesh::indirect_sort(mbs.begin(), mbs.end(), before);
  plan.sharding = std::move(sharding);
  plan.placement = std::move(placement);
  return plan;
}
#else
    ;
#endif

/// The naive placement of ByteScale Alg. 1 (balance/ offers better ones): items in canonical order
/// are laid first-fit into "waves" of `pool` rank slots, each item on a contiguous range of ranks
/// (ring = that range ascending, so a rank has at most two ring peers per item); order = wave index.
/// Pure; O(items * waves) in the worst case, O(items) typical.
[[nodiscard]] inline std::vector<hdp_placement> hdp_naive_placement(const hdp_sharding& sh) {
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

/// Modelled cost of an item on each of its ranks, as an integer (fixed point, so placements compare
/// exactly): sum over its sequences of T(s) = model.compute(s) in nanoseconds, divided by D; when
/// the model has no compute terms, the causal (query, key) pairs s(s+1)/2 instead. Pure; O(seqs).
[[nodiscard]] inline std::int64_t hdp_item_cost(const hdp_item& it, const offload_model& m) {
  const bool timed = m.timed();
  double c = 0;
  for (const auto& s : it.seqs)
    c += timed ? m.compute(s.length) * 1e9
               : 0.5 * static_cast<double>(s.length) * static_cast<double>(s.length + 1);
  return static_cast<std::int64_t>(std::llround(c / it.degree));
}

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
[[nodiscard]] inline std::vector<hdp_placement> hdp_least_loaded_placement(const hdp_sharding& sh) {
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

/// How `plan`'s segments, over all ranks, fail to hold every token of every sequence of `seqs` exactly
/// once (exactly_once_violation's message); empty when they do. The planners check it at heavy level
/// (HETMESH_ASSERTION_LEVEL 3). Pure; O(segments log segments).
[[nodiscard]] inline std::string hdp_exactly_once_violation(std::span<const seq_desc> seqs,
                                                            const hdp_plan& plan) {
  std::vector<id_range> expected, assigned;
  expected.reserve(seqs.size());
  for (const auto& s : seqs) expected.push_back({s.id, 0, s.length});
  for (const auto& mbs : plan.per_rank)
    for (const auto& mb : mbs)
      for (const auto& sg : mb.segments) assigned.push_back({sg.seq_id, sg.tokens.begin, sg.tokens.end});
  return exactly_once_violation(std::move(expected), std::move(assigned));
}

/// HDP end to end: hdp_shard, the placement the policy names, hdp_assemble (with the default
/// `waves` placement this is ByteScale Alg. 1). Same contract as hdp_shard; the result is
/// independent of the order of `seqs`. Heavy level: checks every token is assigned exactly once.
[[nodiscard]] inline hdp_plan plan_hdp(std::span<const seq_desc> seqs, const hdp_policy& policy, int pool) {
  auto sh = hdp_shard(seqs, policy, pool);
  auto pl = policy.placement == hdp_placement_kind::least_loaded ? hdp_least_loaded_placement(sh)
                                                                 : hdp_naive_placement(sh);
  auto plan = hdp_assemble(std::move(sh), std::move(pl));
  HETMESH_ASSERT_AT(heavy, hdp_exactly_once_violation(seqs, plan).empty(), "plan_hdp: {}",
                    hdp_exactly_once_violation(seqs, plan));
  return plan;
}

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::hdp_placement_kind> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::seq::hdp_placement_kind k, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}",
                              k == hetmesh::seq::hdp_placement_kind::waves ? "waves" : "least_loaded");
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_policy& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(
        ctx.out(), "hdp_policy{{C={}, {}, {}, placement={}}}", p.capacity, p.offload, p.model,
        p.placement == hetmesh::seq::hdp_placement_kind::waves ? "waves" : "least_loaded");
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_item> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_item& it, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "item{}{{{} D={} r={:.2f} tokens={} seqs={}}}", it.index,
                              it.packed ? "pack" : "ring", it.degree, it.offload.ratio(), it.tokens,
                              it.seqs.size());
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_sharding> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_sharding& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "hdp_sharding{{pool={}, items={}, global_tokens={}}}", s.pool,
                              s.items.size(), s.global_tokens);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_placement> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_placement& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "at{{order={}, ring={}}}", p.order, p.ring);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_micro_batch> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_micro_batch& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "mb{{item={}, order={}, pos={}/{}, r={:.2f}, {}}}", m.item, m.order,
                              m.ring_position, m.degree, m.offload_ratio, m.segments);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    std::size_t mbs = 0, most = 0;
    for (const auto& r : p.per_rank) {
      mbs += r.size();
      most = std::max(most, r.size());
    }
    return hetmesh::format_to(ctx.out(), "hdp_plan{{{}, micro_batches={}, max_per_rank={}}}", p.sharding, mbs,
                              most);
  }
};
