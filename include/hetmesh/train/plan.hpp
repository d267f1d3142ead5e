// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the step plan of one training step at pipeline depth 1, and the LLM partition families
// that make it. A family is a type (the choice: static CP zigzag, static CP THD, HDP by seq::plan_hdp, HDP
// by ByteScale's planner); its parameters (cp, the HDP policy) are run-time values. Planning is pure: a
// function of (family parameters, world size, the step's document metadata), equal on every rank, and
// hashable, so ranks can check they agree before they communicate. Every family lowers to the same plain
// plan: an ordered list of rings (seq::ring_schedule, in one global order every rank follows) and, per
// rank, its micro-batches, each naming its ring, its position in it and where its tokens come from.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../balance/bytescale.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../seq/cp.hpp"
#include "../seq/hdp.hpp"
#include "../seq/ring.hpp"
#include "../seq/types.hpp"

namespace hetmesh::train {

/// How a step plan's micro-batches get their tokens.
enum class partition_kind {
  static_cp,  ///< dp groups of cp consecutive ranks; each group's documents under a CP partition
  hdp,        ///< one pool of every rank; sequences packed whole or split over rings (ByteScale's HDP)
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

  friend constexpr bool operator==(const planned_micro_batch&, const planned_micro_batch&) = default;
  /// Feeds the micro-batch to a plan hash.
  void hash_append(hasher& h) const { append_all(h, ring, position, source); }
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
  std::vector<seq::ring_schedule> rings;            ///< every ring of the step, in global order
  std::vector<std::vector<planned_micro_batch>> per_rank;  ///< per rank, in execution order

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
    append_all(h, kind, world, cp, documents, cp_pieces, hdp, rings, per_rank);
  }
};

namespace detail {

inline void check_documents(std::span<const seq::seq_desc> docs, const char* who) {
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
  std::sort(order.begin(), order.end(),
            [&](std::int64_t a, std::int64_t b) { return cost(a) != cost(b) ? cost(a) > cost(b) : a < b; });
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
  return p;
}

}  // namespace detail

/// Partition family: static context parallelism with Megatron-LM's zigzag of one sequence. Documents go
/// to dp = world / cp groups (longest first, least loaded group, by causal cost); each document is one
/// micro-batch of its group, zigzagged over the group's cp ranks and padded at its end to a multiple of
/// 2cp (padding carries no loss). Parameter: cp.
struct static_cp_zigzag {
  int cp = 1;  ///< context-parallel group size, dividing the world

  /// The family's name, for messages and stats.
  static constexpr std::string_view name = "static_cp_zigzag";
  /// The step plan over `world` ranks. Pre: cp divides world; documents non-empty, lengths >= 1, ids unique
  /// (invalid_argument otherwise). Pure; O(tokens / 2cp x cp + docs log docs).
  [[nodiscard]] step_plan plan(std::span<const seq::seq_desc> docs, int world) const {
    detail::check_documents(docs, "static_cp_zigzag::plan");
    detail::check_cp(cp, world, "static_cp_zigzag::plan");
    return detail::plan_static_cp(
        docs, cp, world, [&](step_plan& p, int g, const std::vector<std::int64_t>& idx) {
          for (auto i : idx) {
            const auto& d = docs[static_cast<std::size_t>(i)];
            detail::add_cp_piece(p, g, {d.id}, seq::partition_zigzag(d.length, cp, true));
          }
        });
  }
  friend constexpr bool operator==(const static_cp_zigzag&, const static_cp_zigzag&) = default;
};

/// Partition family: static context parallelism with TransformerEngine's THD split of packed documents.
/// Documents go to dp groups as static_cp_zigzag does; each group's documents form one packed micro-batch,
/// every document cut into 2cp chunks (padded at its end to a multiple of 2cp). Parameter: cp.
struct static_cp_thd {
  int cp = 1;  ///< context-parallel group size, dividing the world

  /// The family's name, for messages and stats.
  static constexpr std::string_view name = "static_cp_thd";
  /// The step plan over `world` ranks. Same preconditions and cost as static_cp_zigzag::plan.
  [[nodiscard]] step_plan plan(std::span<const seq::seq_desc> docs, int world) const {
    detail::check_documents(docs, "static_cp_thd::plan");
    detail::check_cp(cp, world, "static_cp_thd::plan");
    return detail::plan_static_cp(
        docs, cp, world, [&](step_plan& p, int g, const std::vector<std::int64_t>& idx) {
          if (idx.empty()) return;  // a group with no document has no micro-batch
          std::vector<std::int64_t> ids, lens;
          for (auto i : idx) {
            ids.push_back(docs[static_cast<std::size_t>(i)].id);
            lens.push_back(docs[static_cast<std::size_t>(i)].length);
          }
          detail::add_cp_piece(p, g, std::move(ids), seq::partition_thd(lens, cp, true));
        });
  }
  friend constexpr bool operator==(const static_cp_thd&, const static_cp_thd&) = default;
};

namespace detail {
inline step_plan plan_from_hdp(std::span<const seq::seq_desc> docs, int world, seq::hdp_plan hdp) {
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
  std::sort(items.begin(), items.end(), [&](std::int64_t a, std::int64_t b) {
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
  return p;
}
}  // namespace detail

/// Partition family: hybrid data parallelism (ByteScale) with seq::plan_hdp over the pool of every rank:
/// sequences up to the capacity are packed whole on one rank, longer ones split over a ring of just as
/// many ranks as they need; rings of several sizes run on the one parent communicator. Parameter: the
/// HDP policy (capacity, placement, offload).
struct hdp_partition {
  seq::hdp_policy policy{};  ///< capacity, placement kind, offload

  /// The family's name, for messages and stats.
  static constexpr std::string_view name = "hdp";
  /// The step plan over the pool of `world` ranks. Pre: as seq::plan_hdp, and documents non-empty with
  /// unique ids and lengths >= 1 (invalid_argument). Pure; as seq::plan_hdp plus the rings' schedules.
  [[nodiscard]] step_plan plan(std::span<const seq::seq_desc> docs, int world) const {
    detail::check_documents(docs, "hdp_partition::plan");
    return detail::plan_from_hdp(docs, world, seq::plan_hdp(docs, policy, world));
  }
  friend bool operator==(const hdp_partition&, const hdp_partition&) = default;
};

/// Partition family: hybrid data parallelism placed by ByteScale's balance scheduler
/// (balance::plan_bytescale) over the pool of every rank. Parameters: the HDP policy and the step's cost
/// model.
struct hdp_bytescale_partition {
  seq::hdp_policy policy{};     ///< capacity, offload
  balance::step_model model{};  ///< what the scheduler prices items with

  /// The family's name, for messages and stats.
  static constexpr std::string_view name = "hdp_bytescale";
  /// The step plan over the pool of `world` ranks. Pre and cost: as balance::plan_bytescale, documents
  /// non-empty with unique ids and lengths >= 1 (invalid_argument). Pure.
  [[nodiscard]] step_plan plan(std::span<const seq::seq_desc> docs, int world) const {
    detail::check_documents(docs, "hdp_bytescale_partition::plan");
    return detail::plan_from_hdp(docs, world, balance::plan_bytescale(docs, policy, world, model));
  }
};

/// An LLM partition family for train::system. Requirements:
///  1. `P::name` converts to std::string_view;
///  2. `p.plan(docs, world)` on a const P, with `std::span<const seq::seq_desc>` and `int`, returns a
///     step_plan for `world` ranks, and is pure (the same inputs give equal plans on every rank).
/// Models: static_cp_zigzag, static_cp_thd, hdp_partition, hdp_bytescale_partition.
template <class P>
concept partition_family = requires(const P& p, std::span<const seq::seq_desc> docs, int world) {
  { P::name } -> std::convertible_to<std::string_view>;
  { p.plan(docs, world) } -> std::same_as<step_plan>;
};

static_assert(partition_family<static_cp_zigzag>);
static_assert(partition_family<static_cp_thd>);
static_assert(partition_family<hdp_partition>);
static_assert(partition_family<hdp_bytescale_partition>);

}  // namespace hetmesh::train

template <>
struct fmt::formatter<hetmesh::train::partition_kind> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::train::partition_kind k, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}",
                              k == hetmesh::train::partition_kind::hdp ? "hdp" : "static_cp");
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
