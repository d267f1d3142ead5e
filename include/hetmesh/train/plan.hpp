// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the step plan of one training step at pipeline depth 1, and how the LLM partition
// families lower to it. The families are seq::'s policy types (seq::cp_zigzag, seq::cp_thd,
// seq::hdp<Offload>, seq/partition.hpp): the type is the choice, its members the run-time parameters.
// Where a balancer places HDP work, it is balance::'s policy type (balance::bytescale,
// balance::gap_filling_hdp); train::family_placement leaves placement to the family. What train adds
// over the seq:: types is not a second type but traits (trains_family_v, places_family_v) and free
// functions (static_cp_groups: how static CP splits documents over dp groups; plan_step). Planning is
// pure: a function of (family, balancer, world size, the step's document metadata), equal on every rank,
// and hashable, so ranks can check they agree before they communicate. Every family lowers to the same
// plain plan: an ordered list of rings (seq::ring_schedule, in one global order every rank follows) and,
// per rank, its micro-batches, each naming its ring, its position in it and where its tokens come from.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../balance/balancers.hpp"
#include "../balance/bytescale.hpp"
#include "../balance/planner.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "../pipeline/action.hpp"
#include "../seq/cp.hpp"
#include "../seq/hdp.hpp"
#include "../seq/partition.hpp"
#include "../seq/ring.hpp"
#include "../seq/types.hpp"
#include "../seq/ulysses.hpp"

namespace hetmesh::train {

/// How a step plan's micro-batches get their tokens.
enum class partition_kind {
  static_cp,  ///< dp groups of cp consecutive ranks; each group's documents under a CP partition
  hdp,        ///< one pool of every rank; sequences packed whole or split over rings (ByteScale's HDP)
  ulysses,    ///< dp groups of `cp` (the Ulysses degree) ranks; each group's documents packed and split
              ///< contiguously, heads swapped by all-to-all around attention
};

/// A static CP group's share of the step: the ids of the documents it holds (in stream order) and their
/// CP partition over the group's cp ranks (of document lengths in that order).
struct cp_piece {
  int group = 0;                      ///< the dp group (world ranks group*cp .. group*cp + cp - 1)
  std::vector<std::int64_t> doc_ids;  ///< documents of the piece, in stream order
  seq::cp_partition partition;        ///< their partition over the group's cp ranks

  friend bool operator==(const cp_piece&, const cp_piece&) = default;
  /// Feeds the piece to a plan hash.
  void hash_append(hasher& h) const { append_all(h, group, doc_ids, partition); }
};

/// One micro-batch of one rank: its ring (index into step_plan::rings), the rank's position in that ring,
/// and its source (static CP: index into step_plan::cp_pieces, the rank's CP rank being `position`;
/// HDP: index into step_plan::hdp.per_rank[rank]).
struct planned_micro_batch {
  std::int64_t ring = 0;    ///< index into step_plan::rings
  int position = 0;         ///< the rank's position in that ring
  std::int64_t source = 0;  ///< cp piece, or index in the rank's HDP micro-batches
  int slot = 0;             ///< its pipeline micro-batch index (see step_plan::slots)

  friend constexpr bool operator==(const planned_micro_batch&, const planned_micro_batch&) = default;
  /// Feeds the micro-batch to a plan hash.
  void hash_append(hasher& h) const { append_all(h, ring, position, source, slot); }
};

/// Where an encoder item's output rows land in one slot: the rows `rows` of item `item` (encoder index
/// `encoder`, `item_tokens` output tokens in all) are stage 0's input of pool rank `pool_rank`'s
/// micro-batch in the slot. step_plan::encoder_landings lists them per slot, pool rank ascending, each
/// rank's in its micro-batch's landing order (model::micro_batch::encoder_outputs).
struct slot_landing {
  int pool_rank = 0;             ///< the pipeline (pool rank) whose stage 0 reads the rows
  int encoder = 0;               ///< index of the encoder
  std::int64_t item = 0;         ///< item id
  std::int64_t item_tokens = 0;  ///< the item's output tokens (all of them, wherever they land)
  seq::token_range rows;         ///< the item's rows that land here

  friend constexpr bool operator==(const slot_landing&, const slot_landing&) = default;
  /// Feeds the landing to a plan hash.
  void hash_append(hasher& h) const { append_all(h, pool_rank, encoder, item, item_tokens, rows); }
};

/// The plan of one step (pipeline depth 1): plain data, equal on every rank that computed it from the same
/// metadata, hashable with plan_hash. Rings are in one global order; each rank runs its micro-batches in
/// per_rank order, which follows that order, so ring attention over rings that share ranks never waits on
/// a ring a member has not reached.
struct step_plan {
  partition_kind kind = partition_kind::static_cp;  ///< which family made it
  int world = 1;                                    ///< ranks of the data-parallel pool (dp x cp)
  int cp = 1;                                       ///< static CP group size (1 under HDP)
  std::vector<seq::seq_desc> documents;             ///< the step's documents (id, length), stream order
  std::vector<cp_piece> cp_pieces;                  ///< static CP: the groups' shares
  seq::hdp_plan hdp;                                ///< HDP: the plan (empty under static CP)
  std::vector<seq::ulysses_plan> ulysses;           ///< Ulysses: per cp piece, its exchange plan
  std::vector<seq::ring_schedule> rings;            ///< every ring of the step, in global order
  std::vector<std::vector<planned_micro_batch>> per_rank;  ///< per rank, in execution (slot) order
  /// Pipeline micro-batches per step, the same for every rank of the pool: each ring's members run it in
  /// the same slot, a rank runs at most one micro-batch per slot (a slot it has none in runs empty), so
  /// every pipeline runs the same schedule and ring calls meet in the same order on every member.
  int slots = 0;
  int pp = 1;  ///< pipeline depth: the world is pp x world ranks (pipeline rank slowest)
  pipeline::schedule
      pipeline;  ///< the lowered, verified schedule every pipeline runs (train::attach_pipeline)
  /// Per slot, the encoder items' landings of every pool rank's micro-batch in it (train::attach_pipeline
  /// with the step's batch; empty without encoder items): what the slot's encoder shards encode, over
  /// every pipeline, and where the rows go (train::plan_encoder_domain).
  std::vector<std::vector<slot_landing>> encoder_landings;

  /// Micro-batches over every rank. O(world).
  [[nodiscard]] std::int64_t micro_batches() const noexcept {
    std::int64_t n = 0;
    for (const auto& r : per_rank) n += static_cast<std::int64_t>(r.size());
    return n;
  }
  /// plan_hash of the plan: what ranks compare to agree. O(plan size).
  [[nodiscard]] std::uint64_t hash() const { return plan_hash(*this); }
  friend bool operator==(const step_plan&, const step_plan&) = default;
  /// Feeds the plan to a plan hash.
  void hash_append(hasher& h) const {
    append_all(h, kind, world, cp, documents, cp_pieces, hdp, ulysses, rings, per_rank, slots, pp, pipeline,
               encoder_landings);
  }
};

namespace detail {

HETMESH_COMPILED void check_documents(std::span<const seq::seq_desc> docs, const char* who)
#if HETMESH_BODIES
{
  if (docs.empty()) throw_error<invalid_argument>("{}: empty step; expected at least one document", who);
  std::vector<std::int64_t> ids;
  for (const auto& d : docs) {
    if (d.length < 1)
      throw_error<invalid_argument>("{}: document id {} has {} tokens; expected >= 1", who, d.id, d.length);
    ids.push_back(d.id);
  }
  std::sort(ids.begin(), ids.end());
  if (const auto it = std::adjacent_find(ids.begin(), ids.end()); it != ids.end())
    throw_error<invalid_argument>("{}: document id {} appears twice; expected unique ids", who, *it);
}
#else
    ;
#endif

inline void check_cp(int cp, int world, const char* who) {
  if (cp < 1 || world < 1 || world % cp != 0)
    throw_error<invalid_argument>("{}: cp = {} over a world of {} ranks; expected cp >= 1 dividing the world",
                                  who, cp, world);
}

/// Documents to dp groups: longest processing time first by causal cost (length^2 + length), ties by
/// stream index, each to the least loaded group (ties: the lowest group). Returns per group its document
/// indices in stream order. Pure; O(docs log docs + docs x groups).
inline std::vector<std::vector<std::int64_t>> split_over_groups(std::span<const seq::seq_desc> docs,
                                                                int groups) {
  std::vector<std::int64_t> order(docs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  const auto cost = [&](std::int64_t i) {
    const auto l = docs[static_cast<std::size_t>(i)].length;
    return l * l + l;
  };
  hetmesh::indirect_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return cost(a) != cost(b) ? cost(a) > cost(b) : a < b;
  });
  std::vector<std::int64_t> load(static_cast<std::size_t>(groups), 0);
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(groups));
  for (auto i : order) {
    const auto g = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[g] += cost(i);
    out[g].push_back(i);
  }
  for (auto& g : out) std::sort(g.begin(), g.end());
  return out;
}

/// Appends a static CP piece, its ring over the group's ranks, and a micro-batch on each of them.
inline void add_cp_piece(step_plan& p, int group, std::vector<std::int64_t> ids, seq::cp_partition part) {
  std::vector<int> ranks(static_cast<std::size_t>(p.cp));
  for (int r = 0; r < p.cp; ++r) ranks[static_cast<std::size_t>(r)] = group * p.cp + r;
  p.rings.push_back(seq::ring_for(part, ranks));
  const auto ring = static_cast<std::int64_t>(p.rings.size()) - 1;
  const auto source = static_cast<std::int64_t>(p.cp_pieces.size());
  for (int r = 0; r < p.cp; ++r)
    p.per_rank[static_cast<std::size_t>(group * p.cp + r)].push_back({ring, r, source});
  p.cp_pieces.push_back({group, std::move(ids), std::move(part)});
}

/// Static CP: documents to dp groups, then per group `pieces(group docs)` -> list of (doc indices, lengths).
/// Gives every planned micro-batch its slot: rings in global order, each taking the first slot after
/// the last one any of its members used, so a ring's members share its slot, a rank's slots increase
/// along its list, and every member of two rings sees them in the same order. Sets p.slots.
HETMESH_COMPILED void align_slots(step_plan& p)
#if HETMESH_BODIES
{
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> members(p.rings.size());
  for (std::size_t r = 0; r < p.per_rank.size(); ++r)
    for (std::size_t i = 0; i < p.per_rank[r].size(); ++i)
      members[static_cast<std::size_t>(p.per_rank[r][i].ring)].emplace_back(r, i);
  std::vector<int> next(p.per_rank.size(), 0);
  for (const auto& ring : members) {
    int slot = 0;
    for (const auto& [r, i] : ring) slot = std::max(slot, next[r]);
    for (const auto& [r, i] : ring) {
      p.per_rank[r][i].slot = slot;
      next[r] = slot + 1;
    }
  }
  for (auto& list : p.per_rank)
    hetmesh::indirect_stable_sort(
        list.begin(), list.end(),
        [](const planned_micro_batch& a, const planned_micro_batch& b) { return a.slot < b.slot; });
  p.slots = next.empty() ? 0 : *std::max_element(next.begin(), next.end());
}
#else
    ;
#endif

template <class Split>
step_plan plan_static_cp(std::span<const seq::seq_desc> docs, int cp, int world, Split&& split) {
  step_plan p;
  p.kind = partition_kind::static_cp;
  p.world = world;
  p.cp = cp;
  p.documents.assign(docs.begin(), docs.end());
  p.per_rank.resize(static_cast<std::size_t>(world));
  const auto groups = split_over_groups(docs, world / cp);
  for (std::size_t g = 0; g < groups.size(); ++g) split(p, static_cast<int>(g), groups[g]);
  align_slots(p);
  return p;
}

}  // namespace detail

namespace detail {
HETMESH_COMPILED step_plan plan_from_hdp(std::span<const seq::seq_desc> docs, int world, seq::hdp_plan hdp)
#if HETMESH_BODIES
{
  step_plan p;
  p.kind = partition_kind::hdp;
  p.world = world;
  p.cp = 1;
  p.documents.assign(docs.begin(), docs.end());
  p.per_rank.resize(static_cast<std::size_t>(world));
  // Rings in the global order of the items' order keys (then item index): every rank's per_rank list is
  // sorted by the same key, so it is a subsequence of this order.
  std::vector<std::int64_t> items(hdp.placement.size());
  for (std::size_t i = 0; i < items.size(); ++i) items[i] = static_cast<std::int64_t>(i);
  hetmesh::indirect_sort(items.begin(), items.end(), [&](std::int64_t a, std::int64_t b) {
    const auto oa = hdp.placement[static_cast<std::size_t>(a)].order,
               ob = hdp.placement[static_cast<std::size_t>(b)].order;
    return oa != ob ? oa < ob : a < b;
  });
  std::vector<std::int64_t> ring_of(items.size(), -1);
  for (auto i : items) {
    ring_of[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(p.rings.size());
    p.rings.push_back(seq::ring_for(hdp, i));
  }
  for (std::size_t r = 0; r < hdp.per_rank.size(); ++r)
    for (std::size_t m = 0; m < hdp.per_rank[r].size(); ++m) {
      const auto& mb = hdp.per_rank[r][m];
      p.per_rank[r].push_back(
          {ring_of[static_cast<std::size_t>(mb.item)], mb.ring_position, static_cast<std::int64_t>(m)});
    }
  p.hdp = std::move(hdp);
  align_slots(p);
  return p;
}
#else
    ;
#endif
}  // namespace detail

/// The default Balancer of train::system: placement is left to the partition family itself. Static CP
/// (seq::cp_zigzag, seq::cp_thd) places documents on dp groups by static_cp_groups; seq::hdp places its
/// items by seq::plan_hdp with the family's `placement` kind. A balance:: balancer type in its place
/// (balance::bytescale, balance::gap_filling_hdp) places seq::hdp's items instead.
struct family_placement {
  /// The name results and messages use.
  static constexpr std::string_view name = "family";
  friend constexpr bool operator==(const family_placement&, const family_placement&) = default;
  /// Hashes the choice.
  void hash_append(hasher& h) const { append(h, name); }
};

/// True when train can lower LLM partition family `P` (a seq:: policy type) to a step plan:
/// seq::cp_zigzag and seq::cp_thd (static CP over dp groups of cp ranks) and seq::hdp<Offload> (HDP over
/// the pool). seq::cp_contiguous and seq::ulysses have no step plan yet. A new family specialises it
/// together with a branch of plan_step.
template <class P>
inline constexpr bool trains_family_v = false;
/// Static CP zigzag trains.
template <>
inline constexpr bool trains_family_v<seq::cp_zigzag> = true;
/// Static CP THD trains.
template <>
inline constexpr bool trains_family_v<seq::cp_thd> = true;
template <>
inline constexpr bool trains_family_v<seq::ulysses> = true;
/// HDP trains, with either offload family.
template <class Offload>
inline constexpr bool trains_family_v<seq::hdp<Offload>> = true;

/// True when balancer `B` can place the work of partition family `P` in a step plan: family_placement
/// for every family train trains; an HDP balancer (balance::bytescale, balance::gap_filling_hdp) for
/// seq::hdp<Offload>, which it places instead of seq::plan_hdp. Balancers that return only a
/// balance::strategy_plan (token_count, random_placement, static_dp_cp) do not place a step plan yet.
template <class P, class B>
inline constexpr bool places_family_v = (trains_family_v<P> && std::same_as<B, family_placement>);
/// ByteScale's balance scheduler places HDP items.
template <class Offload>
inline constexpr bool places_family_v<seq::hdp<Offload>, balance::bytescale> = true;
/// This project's gap-filling planner places HDP items.
template <class Offload>
inline constexpr bool places_family_v<seq::hdp<Offload>, balance::gap_filling_hdp> = true;

/// Compile-time check that train::system can run partition family `P` placed by balancer `B`, with a
/// message naming what is missing; returns true for use in a static_assert.
template <class P, class B>
consteval bool check_trainable() {
  static_assert(seq::llm_partition<P>,
                "train: Partition must be an LLM partition family (seq::llm_partition), a seq:: policy type "
                "such as seq::cp_zigzag, seq::cp_thd or seq::hdp<seq::selective_offload>");
  static_assert(trains_family_v<P>,
                "train: no step plan for this partition family yet; expected seq::cp_zigzag, seq::cp_thd, "
                "seq::ulysses or seq::hdp<Offload> (train::trains_family_v)");
  static_assert(!trains_family_v<P> || places_family_v<P, B>,
                "train: this Balancer cannot place the partition family's work; expected "
                "train::family_placement, or balance::bytescale / balance::gap_filling_hdp with "
                "seq::hdp<Offload> (train::places_family_v)");
  return true;
}

/// How static CP spreads a step's documents over its dp = `groups` groups: longest processing time first
/// by causal cost (length^2 + length), ties by stream index, each to the least loaded group (ties: the
/// lowest group). Returns per group its document indices (into `docs`) in stream order. Used by
/// plan_step for seq::cp_zigzag and seq::cp_thd. Pre: groups >= 1. Pure; O(docs log docs + docs x groups).
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> static_cp_groups(
    std::span<const seq::seq_desc> docs, int groups) {
  return detail::split_over_groups(docs, groups);
}

/// The step plan of LLM partition family `family` placed by `balancer` for documents `docs` (id, length
/// in stream order) over `world` ranks. Pure: equal on every rank for equal inputs; not collective.
///  - seq::cp_zigzag{cp, pad}: documents to dp = world / cp groups (static_cp_groups); each document one
///    micro-batch of its group, zigzagged over the group's cp ranks (seq::partition_zigzag(length, cp,
///    pad); padding carries no loss).
///  - seq::cp_thd{cp, pad}: documents to groups alike; each group's documents one packed micro-batch
///    (seq::partition_thd(lengths, cp, pad)); a group with no document has no micro-batch.
///    With pad = false every length must be a multiple of 2cp (the partitioner's invalid_argument).
///  - seq::hdp<Offload>: the pool of every rank; items placed by seq::plan_hdp(docs, family.policy(),
///    world) under family_placement, by balance::plan_bytescale (balance::bytescale: its delta and
///    buckets, dp mode, or pp mode when cost.pp_stages > 1) or balance::plan_gap_filling_hdp
///    (balance::gap_filling_hdp; the loader of document i is rank i % world), both priced by `cost`.
/// Pre: documents non-empty, lengths >= 1, ids unique; static CP: cp >= 1 dividing world
/// (invalid_argument otherwise); the planners' own preconditions. Compile time: check_trainable<P, B>.
/// Cost: static CP O(tokens + docs log docs + docs x dp); HDP as its planner plus the rings' schedules.
template <class P, class B = family_placement>
[[nodiscard]] step_plan plan_step(const P& family, std::span<const seq::seq_desc> docs, int world,
                                  const B& balancer = {}, const balance::step_model& cost = {}) {
  static_assert(check_trainable<P, B>());
  if constexpr (std::same_as<P, seq::cp_zigzag>) {
    detail::check_documents(docs, "train::plan_step(cp-zigzag)");
    detail::check_cp(family.cp, world, "train::plan_step(cp-zigzag)");
    return detail::plan_static_cp(docs, family.cp, world,
                                  [&](step_plan& p, int g, const std::vector<std::int64_t>& idx) {
                                    for (auto i : idx) {
                                      const auto& d = docs[static_cast<std::size_t>(i)];
                                      detail::add_cp_piece(p, g, {d.id}, family.plan(d.length));
                                    }
                                  });
  } else if constexpr (std::same_as<P, seq::cp_thd>) {
    detail::check_documents(docs, "train::plan_step(cp-thd)");
    detail::check_cp(family.cp, world, "train::plan_step(cp-thd)");
    return detail::plan_static_cp(docs, family.cp, world,
                                  [&](step_plan& p, int g, const std::vector<std::int64_t>& idx) {
                                    if (idx.empty()) return;  // a group with no document has no micro-batch
                                    std::vector<std::int64_t> ids, lens;
                                    for (auto i : idx) {
                                      ids.push_back(docs[static_cast<std::size_t>(i)].id);
                                      lens.push_back(docs[static_cast<std::size_t>(i)].length);
                                    }
                                    detail::add_cp_piece(p, g, std::move(ids), family.plan(lens));
                                  });
  } else if constexpr (std::same_as<P, seq::ulysses>) {
    detail::check_documents(docs, "train::plan_step(ulysses)");
    detail::check_cp(family.degree, world, "train::plan_step(ulysses)");
    auto p = detail::plan_static_cp(
        docs, family.degree, world, [&](step_plan& sp, int g, const std::vector<std::int64_t>& idx) {
          if (idx.empty()) return;
          std::vector<std::int64_t> ids, lens;
          for (auto i : idx) {
            ids.push_back(docs[static_cast<std::size_t>(i)].id);
            lens.push_back(docs[static_cast<std::size_t>(i)].length);
          }
          auto part = seq::partition_contiguous(lens, family.degree);
          std::vector<std::int64_t> tokens(static_cast<std::size_t>(family.degree), 0);
          for (int r : part.owner_rank) ++tokens[static_cast<std::size_t>(r)];
          sp.ulysses.push_back(family.plan(tokens));
          detail::add_cp_piece(sp, g, std::move(ids), std::move(part));
        });
    p.kind = partition_kind::ulysses;
    return p;
  } else {
    detail::check_documents(docs, "train::plan_step(hdp)");
    if constexpr (std::same_as<B, balance::bytescale>) {
      const balance::bytescale_policy bp{
          .delta = balancer.delta,
          .mode = cost.pp_stages > 1 ? balance::hdp_balance_mode::pp : balance::hdp_balance_mode::dp,
          .buckets = balancer.buckets};
      return detail::plan_from_hdp(docs, world,
                                   balance::plan_bytescale(docs, family.policy(), world, cost, bp));
    } else if constexpr (std::same_as<B, balance::gap_filling_hdp>) {
      std::vector<int> owner(docs.size());
      for (std::size_t i = 0; i < owner.size(); ++i)
        owner[i] = static_cast<int>(i % static_cast<std::size_t>(std::max(world, 1)));
      return detail::plan_from_hdp(
          docs, world,
          balance::plan_gap_filling_hdp(
              docs, family.policy(), world, cost,
              balance::gap_filling_policy{balancer.group_size, balancer.local_search}, owner));
    } else {
      return detail::plan_from_hdp(docs, world, family.plan(docs, world));
    }
  }
}

}  // namespace hetmesh::train

template <>
struct fmt::formatter<hetmesh::train::family_placement> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::family_placement&, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "family_placement");
  }
};
template <>
struct fmt::formatter<hetmesh::train::partition_kind> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::train::partition_kind k, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}",
                              k == hetmesh::train::partition_kind::hdp       ? "hdp"
                              : k == hetmesh::train::partition_kind::ulysses ? "ulysses"
                                                                             : "static_cp");
  }
};
template <>
struct fmt::formatter<hetmesh::train::slot_landing> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::slot_landing& l, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "landing{{rank={}, encoder={}, item={}, rows={}/{}}}", l.pool_rank,
                              l.encoder, l.item, l.rows, l.item_tokens);
  }
};
template <>
struct fmt::formatter<hetmesh::train::step_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::step_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(),
                              "step_plan{{{}, world={}, cp={}, documents={}, rings={}, micro_batches={}}}",
                              p.kind, p.world, p.cp, p.documents.size(), p.rings.size(), p.micro_batches());
  }
};
