// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the library's partition families as train::partition_family models (the contract is in
// train/partition_family.hpp), each by one plan_partition overload and a typed part:
//   seq::cp_zigzag, seq::cp_thd  static CP: documents to dp = pool / cp groups by the balancer's
//                                place_groups, each group's documents under a CP partition over its cp
//                                consecutive ranks (a ring each); part: static_cp_part
//   seq::ulysses                 documents to dp = pool / degree groups alike, each group's documents packed
//                                and split contiguously, heads exchanged all-to-all around attention;
//                                part: ulysses_group_part (attention_over_groups)
//   seq::hdp<Offload>            ByteScale's HDP: the pool places items by the balancer's place_hdp (the
//                                family's own seq::plan_hdp, balance::bytescale or balance::gap_filling_hdp);
//                                part: hdp_part
// A balancer is open the same way: any type with the member the family calls (place_groups for static CP
// and Ulysses, place_hdp for HDP) places that family's work.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "../balance/balancers.hpp"
#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "../seq/cp.hpp"
#include "../seq/hdp.hpp"
#include "../seq/partition.hpp"
#include "../seq/ring.hpp"
#include "../seq/ulysses.hpp"
#include "partition_family.hpp"

namespace hetmesh::train {

/// A balancer that places documents on `groups` equal groups of the pool (static CP, Ulysses):
/// `b.place_groups(docs, groups)` returns per group the indices (into docs) of its documents in stream
/// order, every index in exactly one group. Pure.
template <class B>
concept group_balancer = requires(const B& b, std::span<const seq::seq_desc> docs, int groups) {
  { b.place_groups(docs, groups) } -> std::convertible_to<std::vector<std::vector<std::int64_t>>>;
};

/// A balancer that places HDP items: `b.place_hdp(docs, hdp_policy, pool, cost)` returns a seq::hdp_plan
/// of docs over `pool` ranks under the policy (seq::plan_hdp's contract: every token exactly once). Pure.
template <class B>
concept hdp_balancer = requires(const B& b, std::span<const seq::seq_desc> docs, const seq::hdp_policy& p,
                                int pool, const balance::step_model& m) {
  { b.place_hdp(docs, p, pool, m) } -> std::convertible_to<seq::hdp_plan>;
};

/// How static CP spreads a step's documents over `groups` groups: longest processing time first by causal
/// cost (length^2 + length), ties by stream index, each to the least loaded group (ties: the lowest group).
/// Returns per group its document indices (into `docs`) in stream order. Pre: groups >= 1. Pure;
/// O(docs log docs + docs x groups).
[[nodiscard]] HETMESH_COMPILED std::vector<std::vector<std::int64_t>> static_cp_groups(
    std::span<const seq::seq_desc> docs, int groups)
#if HETMESH_BODIES
{
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
#else
    ;
#endif

/// The default balancer: placement is left to the partition family itself. Static CP and Ulysses spread
/// documents over their groups by static_cp_groups; HDP places its items by seq::plan_hdp with the
/// family's placement kind. A balancer of the user's is any type with the member a family calls.
struct family_placement {
  /// The name results and messages use.
  static constexpr std::string_view name = "family";
  /// static_cp_groups(docs, groups). Pure.
  [[nodiscard]] std::vector<std::vector<std::int64_t>> place_groups(std::span<const seq::seq_desc> docs,
                                                                    int groups) const {
    return static_cp_groups(docs, groups);
  }
  /// seq::plan_hdp(docs, policy, pool): the HDP family's own placement; the cost model is not read. Pure.
  [[nodiscard]] seq::hdp_plan place_hdp(std::span<const seq::seq_desc> docs, const seq::hdp_policy& policy,
                                        int pool, const balance::step_model&) const {
    return seq::plan_hdp(docs, policy, pool);
  }
  friend constexpr bool operator==(const family_placement&, const family_placement&) = default;
  /// Hashes the choice.
  void hash_append(hasher& h) const { append(h, name); }
};

/// A static CP group's share of the step: the ids of the documents it holds (in stream order) and their
/// CP partition over the group's cp ranks (of document lengths in that order).
struct cp_piece {
  int group = 0;                      ///< the dp group (pool ranks group*cp .. group*cp + cp - 1)
  std::vector<std::int64_t> doc_ids;  ///< documents of the piece, in stream order
  seq::cp_partition partition;        ///< their partition over the group's cp ranks

  friend bool operator==(const cp_piece&, const cp_piece&) = default;
  /// Feeds the piece to a plan hash.
  void hash_append(hasher& h) const { append_all(h, group, doc_ids, partition); }
};

/// The typed part of a static CP plan (seq::cp_zigzag, seq::cp_thd): the group size and the pieces; a
/// planned micro-batch's source indexes `pieces`.
struct static_cp_part {
  /// The part's name (plans print it).
  static constexpr std::string_view name = "static_cp";
  /// Ring attention over each piece's group.
  using attention = attention_over_rings;
  int cp = 1;                    ///< CP group size
  std::vector<cp_piece> pieces;  ///< the groups' shares, in ring order

  friend bool operator==(const static_cp_part&, const static_cp_part&) = default;
  /// Feeds the part to a plan hash.
  void hash_append(hasher& h) const { append_all(h, name, cp, pieces); }
};

/// The typed part of a Ulysses plan: the degree, the pieces (contiguous partitions) and per piece the
/// all-to-all exchange plan; a planned micro-batch's source indexes both.
struct ulysses_group_part {
  /// The part's name (plans print it).
  static constexpr std::string_view name = "ulysses";
  /// Heads exchanged in fixed groups of `degree` consecutive pool ranks.
  using attention = attention_over_groups;
  int degree = 1;                            ///< the Ulysses degree (group size)
  std::vector<cp_piece> pieces;              ///< the groups' shares
  std::vector<seq::ulysses_plan> exchanges;  ///< per piece, its exchange plan

  /// Consecutive pool ranks per group.
  [[nodiscard]] int group_size() const noexcept { return degree; }
  /// The exchange plan of the micro-batch with source index `source`. Pre: a valid index.
  [[nodiscard]] const seq::ulysses_plan& exchange(std::int64_t source) const {
    return exchanges[static_cast<std::size_t>(source)];
  }
  friend bool operator==(const ulysses_group_part&, const ulysses_group_part&) = default;
  /// Feeds the part to a plan hash.
  void hash_append(hasher& h) const { append_all(h, name, degree, pieces, exchanges); }
};

/// The typed part of an HDP plan: the HDP planner's plan; a planned micro-batch's source indexes its rank's
/// list in hdp.per_rank.
struct hdp_part {
  /// The part's name (plans print it).
  static constexpr std::string_view name = "hdp";
  /// Ring attention over each item's ring (a pack: a ring of one).
  using attention = attention_over_rings;
  seq::hdp_plan hdp;  ///< the items, their placement and per rank its micro-batches

  friend bool operator==(const hdp_part&, const hdp_part&) = default;
  /// Feeds the part to a plan hash.
  void hash_append(hasher& h) const { append_all(h, name, hdp); }
};

static_assert(partition_part<static_cp_part>);
static_assert(partition_part<ulysses_group_part>);
static_assert(partition_part<hdp_part>);

/// Appends to the layout a ring over pool ranks `ranks` (ranks[p] holds CP rank p's share) for the CP
/// partition `part` of documents `doc_index` (the partition's document k is the step's document
/// doc_index[k]), and on each of its ranks a planned micro-batch with source `source` whose token layout is
/// the partition's share (its chunks as runs, its cu_seqlens and local documents). A family's planner
/// (plan_partition) calls it per ring, then align_slots. Returns the ring's index. Errors: seq::ring_for's
/// (a rank count other than the partition's cp; repeated ranks). O(chunks).
HETMESH_COMPILED std::int64_t add_partition_ring(step_layout& l, std::span<const int> ranks,
                                                 std::span<const std::int64_t> doc_index,
                                                 const seq::cp_partition& part, std::int64_t source)
#if HETMESH_BODIES
{
  const auto ring = add_ring(l, seq::ring_for(part, std::vector<int>(ranks.begin(), ranks.end())));
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& sh = part.ranks[r];
    planned_micro_batch pm{ring, static_cast<int>(r), source, 0, 0.0, {}, sh.cu_seqlens, {}};
    for (const auto& c : sh.chunks)
      pm.runs.push_back({doc_index[static_cast<std::size_t>(c.doc)], c.positions});
    for (auto d : sh.local_docs)
      pm.seqlen_docs.push_back(
          l.documents[static_cast<std::size_t>(doc_index[static_cast<std::size_t>(d)])].id);
    l.per_rank[static_cast<std::size_t>(ranks[r])].push_back(std::move(pm));
  }
  return ring;
}
#else
    ;
#endif

namespace detail {

HETMESH_COMPILED void check_degree(int degree, int pool, const char* who)
#if HETMESH_BODIES
{
  if (degree < 1 || pool < 1 || pool % degree != 0)
    throw_error<invalid_argument>(
        "{}: degree {} over a pool of {} ranks; expected a degree >= 1 dividing the pool", who, degree, pool);
}
#else
    ;
#endif

/// Appends a CP piece of group `group` (pool ranks group * cp .. group * cp + cp - 1) to the layout with
/// add_partition_ring; `pieces` gets the piece (its planned micro-batches' source). O(piece chunks).
HETMESH_COMPILED void add_cp_piece(step_layout& l, std::vector<cp_piece>& pieces, int cp, int group,
                                   const std::vector<std::int64_t>& doc_index, std::vector<std::int64_t> ids,
                                   seq::cp_partition part)
#if HETMESH_BODIES
{
  std::vector<int> ranks(static_cast<std::size_t>(cp));
  for (int r = 0; r < cp; ++r) ranks[static_cast<std::size_t>(r)] = group * cp + r;
  add_partition_ring(l, ranks, doc_index, part, static_cast<std::int64_t>(pieces.size()));
  pieces.push_back({group, std::move(ids), std::move(part)});
}
#else
    ;
#endif

/// Static CP's planner over groups of `cp` ranks: the balancer's groups, then per group
/// `split(group, doc indices)` -> list of (doc indices, partition) pieces it adds with add_cp_piece.
template <class B, class Split>
step_layout plan_groups(const partition_request& r, int cp, const B& balancer, std::vector<cp_piece>& pieces,
                        Split&& split, const char* who) {
  auto l = start_layout(r.documents, r.pool, who);
  check_degree(cp, r.pool, who);
  const auto groups = balancer.place_groups(r.documents, r.pool / cp);
  if (static_cast<int>(groups.size()) != r.pool / cp)
    throw_error<invalid_argument>("{}: the balancer placed documents on {} groups; expected {}", who,
                                  groups.size(), r.pool / cp);
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (auto&& [idx, part] : split(groups[g])) {
      std::vector<std::int64_t> ids;
      for (auto i : idx) ids.push_back(r.documents[static_cast<std::size_t>(i)].id);
      add_cp_piece(l, pieces, cp, static_cast<int>(g), idx, std::move(ids), std::move(part));
    }
  align_slots(l);
  return l;
}

/// The lengths of documents `idx` of the request.
HETMESH_COMPILED std::vector<std::int64_t> lengths_of(const partition_request& r,
                                                      std::span<const std::int64_t> idx)
#if HETMESH_BODIES
{
  std::vector<std::int64_t> out;
  for (auto i : idx) out.push_back(r.documents[static_cast<std::size_t>(i)].length);
  return out;
}
#else
    ;
#endif

using piece_list = std::vector<std::pair<std::vector<std::int64_t>, seq::cp_partition>>;

/// The layout of an HDP plan: rings in the global order of the items' order keys (then item index), so every
/// rank's list (sorted by the same key) is a subsequence of it; each micro-batch's runs are its segments.
HETMESH_COMPILED step_layout hdp_layout(const partition_request& r, const seq::hdp_plan& hdp)
#if HETMESH_BODIES
{
  auto l = start_layout(r.documents, r.pool, "train::plan_partition(hdp)");
  std::vector<std::int64_t> items(hdp.placement.size());
  for (std::size_t i = 0; i < items.size(); ++i) items[i] = static_cast<std::int64_t>(i);
  hetmesh::indirect_sort(items.begin(), items.end(), [&](std::int64_t a, std::int64_t b) {
    const auto oa = hdp.placement[static_cast<std::size_t>(a)].order,
               ob = hdp.placement[static_cast<std::size_t>(b)].order;
    return oa != ob ? oa < ob : a < b;
  });
  std::vector<std::int64_t> ring_of(items.size(), -1);
  for (auto i : items) ring_of[static_cast<std::size_t>(i)] = add_ring(l, seq::ring_for(hdp, i));
  std::vector<std::pair<std::int64_t, std::int64_t>> index;  // (id, stream index)
  for (std::size_t i = 0; i < l.documents.size(); ++i)
    index.emplace_back(l.documents[i].id, static_cast<std::int64_t>(i));
  std::sort(index.begin(), index.end());
  auto doc_of = [&](std::int64_t id) {
    const auto it =
        std::lower_bound(index.begin(), index.end(), std::pair<std::int64_t, std::int64_t>{id, -1});
    if (it == index.end() || it->first != id)
      throw_error<invalid_argument>(
          "train::plan_partition(hdp): the HDP plan names document id {}, which is "
          "not in the step; expected a plan of the request's documents",
          id);
    return it->second;
  };
  for (std::size_t k = 0; k < hdp.per_rank.size() && k < l.per_rank.size(); ++k)
    for (std::size_t m = 0; m < hdp.per_rank[k].size(); ++m) {
      const auto& mb = hdp.per_rank[k][m];
      planned_micro_batch pm{ring_of[static_cast<std::size_t>(mb.item)],
                             mb.ring_position,
                             static_cast<std::int64_t>(m),
                             0,
                             mb.offload_ratio,
                             {},
                             {},
                             {}};
      for (const auto& sg : mb.segments) pm.runs.push_back({doc_of(sg.seq_id), sg.tokens});
      l.per_rank[k].push_back(std::move(pm));
    }
  align_slots(l);
  return l;
}
#else
    ;
#endif

}  // namespace detail

/// Why `hdp` runs each document above capacity as it does: per ring item (in the sharding's order), a
/// plan_reason of kind offload (a ratio > 0: the copies hide under compute and the ring needs fewer ranks
/// than ranks_without_offload) or ring (nothing offloaded, with the cause: the family's no_offload, the
/// host link's unknown bandwidth, a model without compute time, or an overlap bound that saves no rank),
/// from the sharding's policy and each item's offload choice. Packs of short documents get none. Pure;
/// O(ring items).
[[nodiscard]] HETMESH_COMPILED std::vector<plan_reason> hdp_reasons(const seq::hdp_plan& hdp)
#if HETMESH_BODIES
{
  std::vector<plan_reason> out;
  const auto& policy = hdp.sharding.policy;
  const auto& m = policy.model;
  for (const auto& it : hdp.sharding.items) {
    if (it.packed || it.seqs.empty()) continue;
    const auto& c = it.offload;
    plan_reason r;
    r.id = it.seqs.front().id;
    r.tokens = it.tokens;
    r.limit = policy.capacity;
    r.ranks = it.degree;
    r.ratio = c.ratio();
    r.ratio_max = policy.offload.enabled ? c.ratio_max : 0.0;
    r.ranks_without_offload =
        m.layers() >= 2 ? seq::offload_ranks(it.tokens, policy.capacity, m, 0, c.ratio_steps) : it.degree;
    if (c.ratio_k > 0) {
      r.kind = reason_kind::offload;
      r.cause = reason_cause::copies_hide;
    } else {
      r.kind = reason_kind::ring;
      if (!policy.offload.enabled)
        r.cause = reason_cause::offload_off;
      else if (!(std::fmin(m.d2h_bandwidth, m.h2d_bandwidth) > 0))
        r.cause = reason_cause::link_unknown;
      else if (!(m.compute(it.tokens) > 0) && !std::isinf(std::fmin(m.d2h_bandwidth, m.h2d_bandwidth)))
        r.cause = reason_cause::untimed_compute;
      else
        r.cause = reason_cause::saves_no_rank;
    }
    out.push_back(r);
  }
  return out;
}
#else
    ;
#endif

/// Static CP, Megatron-LM's zigzag: documents to dp = pool / cp groups (the balancer's place_groups), each
/// document one micro-batch of its group, zigzagged over the group's cp ranks (seq::partition_zigzag;
/// padding carries no loss). Errors: no document, a length < 1, repeated ids, cp not dividing the pool
/// (invalid_argument). Pure.
template <group_balancer B>
[[nodiscard]] step_plan<static_cp_part> plan_partition(const seq::cp_zigzag& f, const partition_request& r,
                                                       const B& balancer) {
  step_plan<static_cp_part> p;
  p.partition.cp = f.cp;
  auto split = [&](const std::vector<std::int64_t>& idx) {
    detail::piece_list out;
    for (auto i : idx) out.push_back({{i}, f.plan(r.documents[static_cast<std::size_t>(i)].length)});
    return out;
  };
  static_cast<step_layout&>(p) =
      detail::plan_groups(r, f.cp, balancer, p.partition.pieces, split, "train::plan_partition(cp-zigzag)");
  return p;
}

/// Static CP, TransformerEngine's THD: documents to groups as for zigzag; each group's documents one packed
/// micro-batch (seq::partition_thd over their lengths); a group with no document has none. With pad =
/// false every length must be a multiple of 2cp (the partitioner's invalid_argument). Pure.
template <group_balancer B>
[[nodiscard]] step_plan<static_cp_part> plan_partition(const seq::cp_thd& f, const partition_request& r,
                                                       const B& balancer) {
  step_plan<static_cp_part> p;
  p.partition.cp = f.cp;
  auto split = [&](const std::vector<std::int64_t>& idx) {
    detail::piece_list out;
    if (!idx.empty()) out.push_back({idx, f.plan(detail::lengths_of(r, idx))});
    return out;
  };
  static_cast<step_layout&>(p) =
      detail::plan_groups(r, f.cp, balancer, p.partition.pieces, split, "train::plan_partition(cp-thd)");
  return p;
}

/// Ulysses: documents to dp = pool / degree groups as for static CP; each group's documents packed and split
/// contiguously over its ranks (seq::partition_contiguous), with the all-to-all exchange plan of its token
/// counts (f.plan). Errors: as static CP's, with the degree. Pure.
template <group_balancer B>
[[nodiscard]] step_plan<ulysses_group_part> plan_partition(const seq::ulysses& f, const partition_request& r,
                                                           const B& balancer) {
  step_plan<ulysses_group_part> p;
  p.partition.degree = f.degree;
  auto split = [&](const std::vector<std::int64_t>& idx) {
    detail::piece_list out;
    if (idx.empty()) return out;
    auto part = seq::partition_contiguous(detail::lengths_of(r, idx), f.degree);
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(f.degree), 0);
    for (int owner : part.owner_rank) ++tokens[static_cast<std::size_t>(owner)];
    p.partition.exchanges.push_back(f.plan(tokens));
    out.push_back({idx, std::move(part)});
    return out;
  };
  static_cast<step_layout&>(p) =
      detail::plan_groups(r, f.degree, balancer, p.partition.pieces, split, "train::plan_partition(ulysses)");
  return p;
}

/// ByteScale's HDP over the pool: items placed by the balancer's place_hdp (family_placement: the family's
/// seq::plan_hdp with its placement kind; balance::bytescale; balance::gap_filling_hdp), priced by the
/// request's cost. Each item's ring carries its micro-batches, with their offload ratios; the plan's reasons
/// say why each document above capacity got its ring or offload (hdp_reasons). Errors: no document, a length
/// < 1, repeated ids (invalid_argument); the planner's. Pure.
template <class Offload, hdp_balancer B>
[[nodiscard]] step_plan<hdp_part> plan_partition(const seq::hdp<Offload>& f, const partition_request& r,
                                                 const B& balancer) {
  detail::check_documents(r.documents, "train::plan_partition(hdp)");
  step_plan<hdp_part> p;
  p.partition.hdp = balancer.place_hdp(r.documents, f.policy(), r.pool, r.cost);
  static_cast<step_layout&>(p) = detail::hdp_layout(r, p.partition.hdp);
  p.reasons = hdp_reasons(p.partition.hdp);
  return p;
}

/// Compile-time check that train::system can run partition family `F` placed by balancer `B`, with a
/// message naming what is missing; returns true for use in a static_assert.
template <class F, class B>
consteval bool check_trainable() {
  static_assert(partition_family<F, B> || partition_family<F, family_placement>,
                "train: Partition must be a train::partition_family placed by the Balancer: a regular, "
                "hashable type with `plan_partition(family, train::partition_request, balancer)` (found by "
                "argument-dependent lookup) returning a train::step_plan<Part> of a train::partition_part "
                "(train/partition_family.hpp). The library's: seq::cp_zigzag, seq::cp_thd, seq::ulysses, "
                "seq::hdp<Offload> (train/families.hpp); seq::cp_contiguous has no step plan");
  static_assert(partition_family<F, B> || !partition_family<F, family_placement>,
                "train: this Balancer cannot place the partition family's work: it lacks the member the "
                "family's plan_partition calls (place_groups for seq::cp_zigzag, seq::cp_thd and "
                "seq::ulysses; place_hdp for seq::hdp: balance::bytescale and balance::gap_filling_hdp "
                "have it; train/families.hpp)");
  return true;
}

/// The step plan of partition family `family` placed by `balancer` for documents `docs` (id, length in
/// stream order) over `pool` ranks, priced by `cost`: plan_partition(family, {docs, pool, cost}, balancer),
/// before the pipeline part (attach_pipeline). Pure: equal on every rank for equal inputs; not collective.
/// Errors: the family's (invalid_argument for bad documents or a degree that does not divide the pool).
template <class F, class B = family_placement>
requires partition_family<F, B>
[[nodiscard]] step_plan_t<F, B> plan_step(const F& family, std::span<const seq::seq_desc> docs, int pool,
                                          const B& balancer = {}, const balance::step_model& cost = {}) {
  return plan_partition(family, partition_request{docs, pool, cost}, balancer);
}

}  // namespace hetmesh::train

template <>
struct fmt::formatter<hetmesh::train::family_placement> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::family_placement&, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "family_placement");
  }
};
