// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: decentralized grouped reordering (MegaScale-Omni §"workload balancing", after
// Seed1.5-VL's group-wise balancing) -- the planning half. Loaders are grouped by network locality
// (consecutive, node-aligned ranks). Each step a group all-gathers the small metadata of the samples
// its loaders read; every member then computes this same plan:
//   - each sample's LLM part goes to an LLM rank: LPT on modelled backbone time under a per-rank token
//     capacity;
//   - each encoder item goes to an encoder rank: LPT on modelled encoder time, independently, because
//     the encoder and the backbone are separated by the reshard (reshard.hpp) and each phase waits for
//     its slowest rank: step ~ max_r enc_r + max_r llm_r, so both maxima are minimised.
// Encoder outputs then travel to their sample's LLM rank by the reshard plan. The runtime half
// (gather, plan, all_to_all_v of the samples) is run::grouped_reorder (run/grouped_reorder.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/exactly_once.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/numeric.hpp"
#include "../cost/compute.hpp"
#include "../cost/encoder.hpp"
#include "../cost/fixed.hpp"
#include "../seq/sample.hpp"

namespace hetmesh::balance {

/// Policy value: the cost models and the LLM token capacity of a rank for the step (0 = unlimited).
struct reorder_policy {
  cost::llm_compute llm{cost::bytescale_fig6a_layer(), 32, 3.0};                ///< backbone cost model
  cost::encoder_compute encoder = cost::encoder_compute::vit(1024, 24, 400e9);  ///< encoder cost model
  std::int64_t token_capacity = 0;  ///< LLM tokens a rank may take; 0: unlimited
  friend bool operator==(const reorder_policy&, const reorder_policy&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The reassignment of one group, with the lengths it was planned from. Samples are in canonical order
/// (by id); item k of sample i is entry item_offset[i] + k of the item arrays. parcels[i * ranks + j] counts
/// what rank i sends to rank j (LLM parts and encoder items), the all_to_all_v shape of the exchange.
struct reorder_plan {
  int ranks = 0;                            ///< ranks of the group
  std::vector<std::int64_t> sample_ids;     ///< sample ids, ascending (canonical order)
  std::vector<int> owner;                   ///< per sample, the rank that loaded it
  std::vector<int> llm_rank;                ///< per sample, the rank that runs its LLM part
  std::vector<std::int64_t> item_offset;    ///< size samples + 1
  std::vector<int> encoder_rank;            ///< per item, the encoder rank that runs it
  std::vector<cost::fixed> llm_load;        ///< per rank, modelled LLM time
  std::vector<cost::fixed> encoder_load;    ///< per rank, modelled encoder time
  std::vector<std::int64_t> llm_tokens_on;  ///< per rank, LLM tokens it runs
  /// Per sample (canonical order), its LLM tokens as gathered: the next room (reshard, partitioning)
  /// reads lengths here instead of gathering the metadata a second time.
  std::vector<std::int64_t> tokens;
  std::vector<std::int64_t> item_tokens;  ///< per item (item_offset order), its tokens as gathered
  std::vector<std::int32_t> parcels;      ///< ranks x ranks parcel counts, row = sender

  /// Position of sample `id` in the canonical order; -1 when absent. O(log n).
  [[nodiscard]] HETMESH_COMPILED std::ptrdiff_t index_of(std::int64_t id) const noexcept;
  /// Destination of a parcel: item -1 is the sample's LLM part. Pre: the sample is in the plan.
  [[nodiscard]] HETMESH_COMPILED int destination(std::int64_t id, int item) const;
  friend bool operator==(const reorder_plan&, const reorder_plan&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Locality groups: `world` ranks cut into consecutive groups of `group_size`, which must hold whole
/// nodes or fit in one (so a group never straddles a node boundary partially).
/// Pre: world % group_size == 0 and (group_size % ranks_per_node == 0 or ranks_per_node % group_size == 0).
[[nodiscard]] HETMESH_COMPILED std::vector<std::vector<int>> locality_groups(int world, int group_size,
                                                                             int ranks_per_node);

/// How `p` fails to send every parcel of `samples` (each sample's LLM part and each of its encoder items)
/// to exactly one rank in [0, p.ranks), as exactly_once_violation reports it (parcel 0 is the LLM part,
/// parcel j + 1 encoder item j); empty when it holds. plan_grouped_reorder checks it at heavy level.
/// Pure; O(parcels log parcels).
[[nodiscard]] HETMESH_COMPILED std::string reorder_exactly_once_violation(
    std::span<const seq::sample_meta> samples, const reorder_plan& p);

namespace detail {

/// One entry of plan_grouped_reorder's LPT passes: each walks a sorted array of self-contained entries
/// (key, index, owner), so the loop reads memory in order instead of chasing indices into the samples,
/// which dominated the run time.
struct reorder_lpt_entry {
  std::int64_t neg_cost;  // sort key: -cost, then index (canonical position: ties go to the smaller id)
  std::uint32_t index;
  std::int32_t owner;
  bool operator<(const reorder_lpt_entry& o) const noexcept {
    return neg_cost != o.neg_cost ? neg_cost < o.neg_cost : index < o.index;
  }
};
static_assert(sizeof(reorder_lpt_entry) == 16, "keep sort entries small: they are the planner's hot data");

/// A (load, rank) entry of the LPT passes' min-heaps: lexicographic pairs give the lowest rank among equal
/// loads. A heap rather than a balanced tree: the planner runs every step on every member.
using reorder_slot = std::pair<std::int64_t, int>;

/// The heap of `ranks` empty ranks (already a valid min-heap).
HETMESH_COMPILED void reset_reorder_heap(std::vector<reorder_slot>& heap, int ranks);

/// plan_grouped_reorder's input pass: `samples` by id into p's per-sample arrays (ids, owners, tokens,
/// item tokens and offsets) and its per-rank arrays sized and zeroed, each sample checked (unique id,
/// owner in range, token counts >= 0: invalid_argument). Returns each sample's LLM cost (id order) and
/// appends each encoder item's cost to `item_cost` (flattened order). O(n log n + items).
HETMESH_COMPILED std::vector<std::int64_t> read_reorder_samples(std::span<const seq::sample_meta> samples,
                                                                int ranks, const reorder_policy& policy,
                                                                reorder_plan& p,
                                                                std::vector<std::int64_t>& item_cost);

/// plan_grouped_reorder's LLM pass: each sample's LLM part by LPT on `llm_cost` (ties: id) to the least
/// loaded rank whose tokens stay within `capacity` (0: unlimited); capacity_error naming a sample that
/// fits no rank. Fills p.llm_rank, llm_load, llm_tokens_on and the parcels. O(n log n + n log ranks).
HETMESH_COMPILED void place_reorder_llm(reorder_plan& p, std::span<const std::int64_t> llm_cost,
                                        std::int64_t capacity);

/// plan_grouped_reorder's encoder pass: every encoder item by LPT on `item_cost` (ties: (sample id, item)
/// through the flattened index) to the least loaded rank, independently of the LLM pass. Fills
/// p.encoder_rank, encoder_load and the parcels. O(items log items + items log ranks).
HETMESH_COMPILED void place_reorder_items(reorder_plan& p, std::span<const std::int64_t> item_cost);

}  // namespace detail

/// Plans the reassignment of one group's samples over its `ranks` ranks.
/// Pre: ranks >= 1; unique ids; owners in [0, ranks); token counts >= 0. Post: every sample's LLM part
/// and every encoder item assigned to exactly one rank; per-rank LLM tokens <= token_capacity when set
/// (capacity_error naming the sample that fits nowhere); parcels conserve (sum = samples + items).
/// Pure; deterministic (fixed-point costs, (-cost, id, item) keys); the same for any order of `samples`.
/// O(n log n + n log ranks). Not collective: every member computes it from the same gathered metadata.
[[nodiscard]] inline reorder_plan plan_grouped_reorder(std::span<const seq::sample_meta> samples, int ranks,
                                                       const reorder_policy& policy = {}) {
  if (ranks < 1)
    throw_error<invalid_argument>("balance::plan_grouped_reorder: ranks = {}; expected >= 1", ranks);
  if (policy.token_capacity < 0)
    throw_error<invalid_argument>("balance::plan_grouped_reorder: token_capacity = {}; expected >= 0",
                                  policy.token_capacity);
  reorder_plan p;
  std::vector<std::int64_t> item_cost;
  const auto llm_cost = detail::read_reorder_samples(samples, ranks, policy, p, item_cost);
  if (samples.size() > 0xffffffffU)
    throw_error<invalid_argument>(
        "balance::plan_grouped_reorder: {} samples; expected fewer than 2^32 per group", samples.size());
  detail::place_reorder_llm(p, llm_cost, policy.token_capacity);
  detail::place_reorder_items(p, item_cost);
  HETMESH_ASSERT_AT(heavy, reorder_exactly_once_violation(samples, p).empty(),
                    "balance::plan_grouped_reorder: {}", reorder_exactly_once_violation(samples, p));
  return p;
}

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::reorder_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::reorder_policy& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "reorder_policy({}, {}, token_capacity={})", p.llm, p.encoder,
                              p.token_capacity);
  }
};

template <>
struct fmt::formatter<hetmesh::balance::reorder_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::reorder_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    const auto mx = [](const std::vector<hetmesh::cost::fixed>& v) {
      return v.empty() ? hetmesh::cost::fixed{} : *std::max_element(v.begin(), v.end());
    };
    return hetmesh::format_to(
        ctx.out(), "reorder_plan(ranks={}, samples={}, items={}, max_llm={}, max_encoder={} modelled)",
        p.ranks, p.sample_ids.size(), p.encoder_rank.size(), mx(p.llm_load), mx(p.encoder_load));
  }
};

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED void reorder_policy::hash_append(hasher& h) const {
  append_all(h, llm, encoder, token_capacity);
}

HETMESH_COMPILED std::ptrdiff_t reorder_plan::index_of(std::int64_t id) const noexcept {
  auto it = std::lower_bound(sample_ids.begin(), sample_ids.end(), id);
  return it != sample_ids.end() && *it == id ? it - sample_ids.begin() : -1;
}

HETMESH_COMPILED int reorder_plan::destination(std::int64_t id, int item) const {
  const auto i = index_of(id);
  if (i < 0)
    throw_error<invalid_argument>("reorder_plan: sample {} is not in the plan; expected a gathered id", id);
  const auto u = static_cast<std::size_t>(i);
  if (item < 0) return llm_rank[u];
  if (item >= item_offset[u + 1] - item_offset[u])
    throw_error<invalid_argument>("reorder_plan: sample {} has {} items; item {} requested", id,
                                  item_offset[u + 1] - item_offset[u], item);
  return encoder_rank[static_cast<std::size_t>(item_offset[u] + item)];
}

HETMESH_COMPILED void reorder_plan::hash_append(hasher& h) const {
  append_all(h, ranks, sample_ids, owner, llm_rank, item_offset, encoder_rank, llm_load, encoder_load,
             parcels, tokens, item_tokens);
}

HETMESH_COMPILED std::vector<std::vector<int>> locality_groups(int world, int group_size,
                                                               int ranks_per_node) {
  if (world < 1 || group_size < 1 || ranks_per_node < 1 || world % group_size != 0 ||
      (group_size % ranks_per_node != 0 && ranks_per_node % group_size != 0))
    throw_error<invalid_argument>(
        "balance::locality_groups: world={}, group_size={}, ranks_per_node={}; expected the "
        "group size to divide the world and to be a multiple or divisor of the node size",
        world, group_size, ranks_per_node);
  std::vector<std::vector<int>> out(static_cast<std::size_t>(world / group_size));
  for (int r = 0; r < world; ++r) out[static_cast<std::size_t>(r / group_size)].push_back(r);
  return out;
}

HETMESH_COMPILED std::string reorder_exactly_once_violation(std::span<const seq::sample_meta> samples,
                                                            const reorder_plan& p) {
  std::vector<id_range> expected, assigned;
  for (const auto& s : samples)
    expected.push_back({s.id, 0, 1 + static_cast<std::int64_t>(s.item_tokens.size())});
  const std::size_t n = p.sample_ids.size();
  if (p.llm_rank.size() != n || p.item_offset.size() != n + 1 ||
      p.encoder_rank.size() != static_cast<std::size_t>(p.item_offset.back()))
    return hetmesh::format(
        "the plan's arrays disagree: {} samples, {} LLM ranks, {} item offsets, {} encoder ranks", n,
        p.llm_rank.size(), p.item_offset.size(), p.encoder_rank.size());
  const auto placed = [&](int r) { return r >= 0 && r < p.ranks; };
  for (std::size_t k = 0; k < n; ++k) {
    if (placed(p.llm_rank[k])) assigned.push_back({p.sample_ids[k], 0, 1});
    for (auto j = p.item_offset[k]; j < p.item_offset[k + 1]; ++j)
      if (placed(p.encoder_rank[static_cast<std::size_t>(j)]))
        assigned.push_back({p.sample_ids[k], 1 + j - p.item_offset[k], 2 + j - p.item_offset[k]});
  }
  return exactly_once_violation(std::move(expected), std::move(assigned));
}

}  // namespace hetmesh::balance

namespace hetmesh::balance::detail {

HETMESH_COMPILED void reset_reorder_heap(std::vector<reorder_slot>& heap, int ranks) {
  heap.clear();
  for (int r = 0; r < ranks; ++r) heap.emplace_back(0, r);
}

HETMESH_COMPILED std::vector<std::int64_t> read_reorder_samples(std::span<const seq::sample_meta> samples,
                                                                int ranks, const reorder_policy& policy,
                                                                reorder_plan& p,
                                                                std::vector<std::int64_t>& item_cost) {
  // Sorting (key, index) pairs by value, not indices through a comparator that looks the keys up:
  // contiguous keys sort several times faster, and this runs every step.
  std::vector<std::pair<std::int64_t, std::size_t>> by_id(samples.size());
  for (std::size_t i = 0; i < samples.size(); ++i) by_id[i] = {samples[i].id, i};
  std::sort(by_id.begin(), by_id.end());
  std::vector<std::size_t> idx(samples.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = by_id[i].second;
  p.ranks = ranks;
  const std::size_t n = samples.size();
  std::vector<std::int64_t> llm_cost(n);
  std::vector<std::int64_t> tokens(n);
  p.sample_ids.reserve(n);
  p.owner.reserve(n);
  std::vector<std::int64_t> items_of(n);
  for (std::size_t k = 0; k < n; ++k) {
    const auto& s = samples[idx[k]];
    if (k > 0 && s.id == p.sample_ids.back())
      throw_error<invalid_argument>(
          "balance::plan_grouped_reorder: sample id {} appears twice; expected unique ids", s.id);
    if (s.owner < 0 || s.owner >= ranks || s.tokens < 0)
      throw_error<invalid_argument>(
          "balance::plan_grouped_reorder: sample {} has owner {} and {} LLM tokens; expected "
          "an owner in [0, {}) and tokens >= 0",
          s.id, s.owner, s.tokens, ranks);
    p.sample_ids.push_back(s.id);
    p.owner.push_back(s.owner);
    tokens[k] = s.tokens;
    llm_cost[k] = policy.llm.sequence_fixed(s.tokens).ticks;
    for (auto t : s.item_tokens) {
      if (t < 0)
        throw_error<invalid_argument>(
            "balance::plan_grouped_reorder: sample {} has an item of {} tokens; expected >= 0", s.id, t);
      item_cost.push_back(policy.encoder.item_fixed(t).ticks);
      p.item_tokens.push_back(t);
    }
    items_of[k] = static_cast<std::int64_t>(s.item_tokens.size());
  }
  p.item_offset = prefix_sums(items_of);
  p.tokens = std::move(tokens);
  const auto nr = static_cast<std::size_t>(ranks);
  p.llm_rank.assign(n, -1);
  p.encoder_rank.assign(item_cost.size(), -1);
  p.llm_load.assign(nr, cost::fixed{});
  p.encoder_load.assign(nr, cost::fixed{});
  p.llm_tokens_on.assign(nr, 0);
  p.parcels.assign(nr * nr, 0);
  return llm_cost;
}

HETMESH_COMPILED void place_reorder_llm(reorder_plan& p, std::span<const std::int64_t> llm_cost,
                                        std::int64_t capacity) {
  const std::size_t n = p.sample_ids.size();
  const auto nr = static_cast<std::size_t>(p.ranks);
  const auto gt = std::greater<reorder_slot>{};
  std::vector<reorder_slot> heap;
  std::vector<reorder_lpt_entry> order(n);
  for (std::size_t k = 0; k < n; ++k) order[k] = {-llm_cost[k], static_cast<std::uint32_t>(k), p.owner[k]};
  std::sort(order.begin(), order.end());
  reset_reorder_heap(heap, p.ranks);
  std::vector<reorder_slot> full;  // ranks skipped because the sample does not fit their capacity
  for (const auto& e : order) {
    const std::int64_t tokens = p.tokens[e.index];
    while (!heap.empty() && capacity > 0 &&
           p.llm_tokens_on[static_cast<std::size_t>(heap.front().second)] + tokens > capacity) {
      std::pop_heap(heap.begin(), heap.end(), gt);
      full.push_back(heap.back());
      heap.pop_back();
    }
    if (heap.empty())
      throw_error<capacity_error>(
          "balance::plan_grouped_reorder: sample {} ({} LLM tokens) fits no rank of the group "
          "under a capacity of {} tokens; expected the group's batch to fit",
          p.sample_ids[e.index], tokens, capacity);
    std::pop_heap(heap.begin(), heap.end(), gt);
    const int r = heap.back().second;
    heap.back().first -= e.neg_cost;
    std::push_heap(heap.begin(), heap.end(), gt);
    for (const auto& f : full) {
      heap.push_back(f);
      std::push_heap(heap.begin(), heap.end(), gt);
    }
    full.clear();
    const auto ur = static_cast<std::size_t>(r);
    p.llm_rank[e.index] = r;
    p.llm_tokens_on[ur] += tokens;
    p.llm_load[ur] -= cost::fixed::from_ticks(e.neg_cost);
    p.parcels[static_cast<std::size_t>(e.owner) * nr + ur] += 1;
  }
}

HETMESH_COMPILED void place_reorder_items(reorder_plan& p, std::span<const std::int64_t> item_cost) {
  const std::size_t n = p.sample_ids.size();
  const auto nr = static_cast<std::size_t>(p.ranks);
  const auto gt = std::greater<reorder_slot>{};
  std::vector<reorder_slot> heap;
  std::vector<reorder_lpt_entry> items(item_cost.size());
  for (std::size_t k = 0; k < n; ++k)
    for (auto j = p.item_offset[k]; j < p.item_offset[k + 1]; ++j) {
      const auto u = static_cast<std::size_t>(j);
      items[u] = {-item_cost[u], static_cast<std::uint32_t>(u), p.owner[k]};
    }
  std::sort(items.begin(), items.end());
  reset_reorder_heap(heap, p.ranks);
  for (const auto& e : items) {
    std::pop_heap(heap.begin(), heap.end(), gt);
    const int r = heap.back().second;
    heap.back().first -= e.neg_cost;
    std::push_heap(heap.begin(), heap.end(), gt);
    const auto ur = static_cast<std::size_t>(r);
    p.encoder_rank[e.index] = r;
    p.encoder_load[ur] -= cost::fixed::from_ticks(e.neg_cost);
    p.parcels[static_cast<std::size_t>(e.owner) * nr + ur] += 1;
  }
}

}  // namespace hetmesh::balance::detail
#endif  // HETMESH_BODIES
