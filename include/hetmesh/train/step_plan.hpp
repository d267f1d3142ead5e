// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the step plan. One training step's plan is plain data, equal on every rank that computed
// it from the same metadata, and hashable (plan_hash), so ranks check they agree before they communicate.
// It has two parts:
//   - step_layout, what every partition family lowers to and the runtime reads: the step's documents, the
//     rings of the step in one global order every rank follows, and per pool rank its micro-batches, each
//     with its ring, its position in it, its pipeline slot, its offload ratio and the token layout it is
//     built from (runs of document positions, built once here); the pipeline's schedule; and the encoder
//     side: where encoder items land, the long-short policy and the encoder domain's plan;
//   - step_plan<Part>: the layout plus the family's own typed part (train::partition_part), which names the
//     attention mechanism the runtime binds (rings or groups) and holds what only that family needs.
// Functions that read only the layout take `const step_layout&`, so a plan of any family serves them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "../pipeline/action.hpp"
#include "../seq/long_short.hpp"
#include "../seq/ring.hpp"
#include "../seq/types.hpp"

namespace hetmesh::train {

/// A run of consecutive positions of one document that a micro-batch holds, in its local token order:
/// `doc` is the document's index in step_layout::documents (stream order); positions past the document's
/// length are padding.
struct token_run {
  std::int64_t doc = 0;        ///< index of the document in the step
  seq::token_range positions;  ///< positions in the (padded) document

  friend constexpr bool operator==(const token_run&, const token_run&) = default;
  /// Feeds the run to a plan hash.
  void hash_append(hasher& h) const { append_all(h, doc, positions); }
};

/// One micro-batch of one pool rank: its ring (index into step_layout::rings), the rank's position in that
/// ring, its family-defined source (e.g. a static CP piece, an HDP micro-batch, a Ulysses group's
/// exchange), its pipeline slot, the share of its activations to offload, and its token layout: `runs` in
/// local order, and either the attention intervals as given (`cu_seqlens`, one document id per interval
/// in `seqlen_docs`: TransformerEngine's padded THD intervals) or, when `cu_seqlens` is empty, one interval
/// per maximal group of consecutive runs of one document.
struct planned_micro_batch {
  std::int64_t ring = 0;                  ///< index into step_layout::rings
  int position = 0;                       ///< the rank's position in that ring
  std::int64_t source = 0;                ///< the family's index (its part says what it indexes)
  int slot = 0;                           ///< its pipeline micro-batch index (see step_layout::slots)
  double offload_ratio = 0.0;             ///< share of its activations offloaded (selective offload)
  std::vector<token_run> runs;            ///< its tokens, in local order
  std::vector<std::int64_t> cu_seqlens;   ///< attention intervals over local tokens; empty: by runs
  std::vector<std::int64_t> seqlen_docs;  ///< with cu_seqlens: the document id of each interval

  /// Tokens it holds (padding included). O(runs).
  [[nodiscard]] std::int64_t tokens() const noexcept {
    std::int64_t n = 0;
    for (const auto& r : runs) n += r.positions.size();
    return n;
  }
  friend bool operator==(const planned_micro_batch&, const planned_micro_batch&) = default;
  /// Feeds the micro-batch to a plan hash.
  void hash_append(hasher& h) const {
    append_all(h, ring, position, source, slot, offload_ratio, runs, cu_seqlens, seqlen_docs);
  }
};

/// Where an encoder item's output rows land in one slot: the rows `rows` of item `item` (encoder index
/// `encoder`, `item_tokens` output tokens in all) are stage 0's input of pool rank `pool_rank`'s
/// micro-batch in the slot. step_layout::encoder_landings lists them per slot, pool rank ascending, each
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

/// What a plan decided for a document or encoder item that needed a decision (plan_reason::kind).
enum class reason_kind {
  ring,     ///< HDP: a document above capacity runs on a ring of `ranks` ranks, nothing offloaded
  offload,  ///< HDP: a document above capacity offloads a share of its activations to need fewer ranks
  split,    ///< long-short SP: an encoder item is split over a Ulysses group of `ranks` ranks
};

/// Why (plan_reason::cause): for a ring, why nothing was offloaded; for an offload, why it was; for a split,
/// which threshold the item crossed.
enum class reason_cause {
  offload_off,      ///< ring: the offload family is seq::no_offload
  link_unknown,     ///< ring: the host link's bandwidth is 0 (unknown, cost::offload_model's default)
  untimed_compute,  ///< ring: the offload model has no compute time T(s), so no copy hides under it
  saves_no_rank,    ///< ring: offloading what hides under compute (ratio_max) saves no rank
  copies_hide,      ///< offload: copies of `ratio` of the activations hide under compute, saving ranks
  over_memory,      ///< split: more tokens than max_tokens_per_rank (`limit`)
  over_balance,  ///< split: cost above cost_limit (balance_factor x the mean per rank), >= min_split tokens
};

/// Why a plan did what it did with one document (HDP: a document above capacity, a ring or an offload) or
/// encoder item (long-short SP: a split). Only items that needed a decision get one, so a plan of many
/// ranks and short documents carries none. Plain data, hashed with the plan; prints as one sentence.
struct plan_reason {
  reason_kind kind = reason_kind::ring;             ///< what was decided
  reason_cause cause = reason_cause::link_unknown;  ///< why
  int encoder = -1;                                 ///< split: the encoder index; -1 for an LLM document
  int slot = -1;                  ///< split: the pipeline slot of the item; -1 for an LLM document
  std::int64_t id = 0;            ///< the document's or encoder item's id
  std::int64_t tokens = 0;        ///< its length
  std::int64_t limit = 0;         ///< HDP: the capacity C; split: max_tokens_per_rank
  std::int64_t min_split = 0;     ///< split: min_split_tokens
  int ranks = 1;                  ///< the ring's or group's size
  int ranks_without_offload = 1;  ///< HDP: the ring's size with nothing offloaded
  double ratio = 0.0;             ///< HDP: the share of activations offloaded
  double ratio_max = 0.0;         ///< HDP: the most that hides under compute (0: nothing hides)
  double cost = 0.0;              ///< split: the item's modelled cost
  double cost_limit = 0.0;        ///< split: balance_factor x the mean cost per rank

  friend bool operator==(const plan_reason&, const plan_reason&) = default;
  /// Feeds the reason to a plan hash.
  void hash_append(hasher& h) const {
    append_all(h, kind, cause, encoder, slot, id, tokens, limit, min_split, ranks, ranks_without_offload,
               ratio, ratio_max, cost, cost_limit);
  }
};

/// What every partition family lowers a step to, and what the runtime reads of it (see the file comment).
/// Rings are in one global order; each rank runs its micro-batches in per_rank order, which follows that
/// order, so ring attention over rings that share ranks never waits on a ring a member has not reached.
struct step_layout {
  int world = 1;                                           ///< ranks of the pool (one pipeline rank's)
  std::vector<seq::seq_desc> documents;                    ///< the step's documents (id, length), in order
  std::vector<seq::ring_schedule> rings;                   ///< every ring of the step, in global order
  std::vector<std::vector<planned_micro_batch>> per_rank;  ///< per pool rank, in execution (slot) order
  /// Pipeline micro-batches per step, the same for every rank of the pool: each ring's members run it in
  /// the same slot, a rank runs at most one micro-batch per slot (a slot it has none in runs empty), so
  /// every pipeline runs the same schedule and ring calls meet in the same order on every member.
  int slots = 0;
  int pp = 1;                   ///< pipeline depth: the world is pp x world ranks (pipeline rank slowest)
  int tp = 1;                   ///< tensor-parallel ranks: the world's ranks per pool rank
  pipeline::schedule pipeline;  ///< the lowered, verified schedule every pipeline runs (attach_pipeline)
  /// Per slot, the encoder items' landings of every pool rank's micro-batch in it (attach_pipeline with
  /// the step's batch; empty without encoder items): what the slot's encoder shards encode, over every
  /// pipeline, and where the rows go.
  std::vector<std::vector<slot_landing>> encoder_landings;
  /// The long-short policy the encoder domain was planned with (system_options::encoder_sp).
  seq::long_short_policy encoder_sp{};
  /// Per encoder index, the attention heads its items were planned with (the stage's attention_heads(),
  /// given to system::plan; -1 where unknown: encoder_sp.heads applies). Empty: none given.
  std::vector<int> encoder_heads;
  /// Per slot and encoder index, the long-short plan of the slot's items over the encoder domain (every
  /// encoder shard's row: the tp x world ranks of its pipeline rank; train::plan_encoder_domain). Empty
  /// without encoder items.
  std::vector<std::vector<seq::long_short_plan>> encoder_domain;
  /// Why the plan did what it did where a decision was needed: HDP's documents above capacity (a ring or
  /// an offload, in the sharding's item order), then long-short SP's split encoder items (by slot, encoder,
  /// then the plan's item order). Empty when nothing needed a decision.
  std::vector<plan_reason> reasons;

  /// Micro-batches over every rank. O(world).
  [[nodiscard]] std::int64_t micro_batches() const noexcept {
    std::int64_t n = 0;
    for (const auto& r : per_rank) n += static_cast<std::int64_t>(r.size());
    return n;
  }
  /// Ranks of one encoder shard's row in the encoder domain: every rank of a pipeline rank, tp x world
  /// (train::encoder_mesh). The domain is shards x encoder_row() ranks.
  [[nodiscard]] int encoder_row() const noexcept { return tp * world; }
  /// Encoder indices the plan's items name: one more than the largest (0 without items). O(landings).
  [[nodiscard]] int encoders() const noexcept {
    int n = 0;
    for (const auto& slot : encoder_landings)
      for (const auto& l : slot) n = std::max(n, l.encoder + 1);
    return n;
  }
  friend bool operator==(const step_layout&, const step_layout&) = default;
  /// Feeds the layout to a plan hash.
  void hash_append(hasher& h) const {
    append_all(h, world, documents, rings, per_rank, slots, pp, tp, pipeline, encoder_landings, encoder_sp,
               encoder_heads, encoder_domain, reasons);
  }
};

/// The plan of one step under a partition family whose typed part is `Part` (a train::partition_part):
/// the layout every family lowers to, plus the family's own part. `hash()` covers both.
template <class Part>
struct step_plan : step_layout {
  /// The family's typed part.
  using part_type = Part;
  Part partition{};  ///< what only the family's runtime needs (e.g. Ulysses' exchange plans)

  /// plan_hash of the plan: what ranks compare to agree. O(plan size).
  [[nodiscard]] std::uint64_t hash() const { return plan_hash(*this); }
  friend bool operator==(const step_plan&, const step_plan&) = default;
  /// Feeds the plan to a plan hash.
  void hash_append(hasher& h) const {
    static_cast<const step_layout&>(*this).hash_append(h);
    partition.hash_append(h);
  }
};

namespace detail {

/// Refuses an empty step, a document of no tokens and a repeated id, naming `who`. O(docs log docs).
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

}  // namespace detail

/// Gives every planned micro-batch its slot: rings in global order, each taking the first slot after the
/// last one any of its members used, so a ring's members share its slot, a rank's slots increase along its
/// list, and every member of two rings sees them in the same order. Sets l.slots. O(micro-batches).
HETMESH_COMPILED void align_slots(step_layout& l)
#if HETMESH_BODIES
{
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> members(l.rings.size());
  for (std::size_t r = 0; r < l.per_rank.size(); ++r)
    for (std::size_t i = 0; i < l.per_rank[r].size(); ++i)
      members[static_cast<std::size_t>(l.per_rank[r][i].ring)].emplace_back(r, i);
  std::vector<int> next(l.per_rank.size(), 0);
  for (const auto& ring : members) {
    int slot = 0;
    for (const auto& [r, i] : ring) slot = std::max(slot, next[r]);
    for (const auto& [r, i] : ring) {
      l.per_rank[r][i].slot = slot;
      next[r] = slot + 1;
    }
  }
  for (auto& list : l.per_rank)
    hetmesh::indirect_stable_sort(
        list.begin(), list.end(),
        [](const planned_micro_batch& a, const planned_micro_batch& b) { return a.slot < b.slot; });
  l.slots = next.empty() ? 0 : *std::max_element(next.begin(), next.end());
}
#else
    ;
#endif

/// A layout over `world` pool ranks with `docs` as its documents and no micro-batch yet: where a family's
/// planner starts. Errors: check_documents' (naming `who`), world < 1 (invalid_argument). O(docs log docs).
[[nodiscard]] HETMESH_COMPILED step_layout start_layout(std::span<const seq::seq_desc> docs, int world,
                                                        const char* who)
#if HETMESH_BODIES
{
  detail::check_documents(docs, who);
  if (world < 1) throw_error<invalid_argument>("{}: a pool of {} ranks; expected >= 1", who, world);
  step_layout l;
  l.world = world;
  l.documents.assign(docs.begin(), docs.end());
  l.per_rank.resize(static_cast<std::size_t>(world));
  return l;
}
#else
    ;
#endif

/// Appends `ring` to the layout and returns its index. O(1) amortised.
HETMESH_COMPILED std::int64_t add_ring(step_layout& l, seq::ring_schedule ring)
#if HETMESH_BODIES
{
  l.rings.push_back(std::move(ring));
  return static_cast<std::int64_t>(l.rings.size()) - 1;
}
#else
    ;
#endif

}  // namespace hetmesh::train

template <>
struct fmt::formatter<hetmesh::train::slot_landing> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::slot_landing& l, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "landing{{rank={}, encoder={}, item={}, rows={}/{}}}", l.pool_rank,
                              l.encoder, l.item, l.rows, l.item_tokens);
  }
};
template <>
struct fmt::formatter<hetmesh::train::plan_reason> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::plan_reason& r, FormatContext& ctx) const -> decltype(ctx.out()) {
    using hetmesh::train::reason_cause;
    using hetmesh::train::reason_kind;
    auto out = ctx.out();
    if (r.kind == reason_kind::split) {
      out =
          hetmesh::format_to(out, "encoder {} item {} ({} tokens, slot {}): split over {} ranks: ", r.encoder,
                             r.id, r.tokens, r.slot, r.ranks);
      if (r.cause == reason_cause::over_memory)
        return hetmesh::format_to(out, "above max_tokens_per_rank {}", r.limit);
      return hetmesh::format_to(
          out,
          "its cost {:.4g} is above the balance limit {:.4g} (balance_factor x the mean "
          "per rank) and it has >= min_split_tokens {} tokens",
          r.cost, r.cost_limit, r.min_split);
    }
    out = hetmesh::format_to(out, "document {} ({} tokens > capacity {}): ", r.id, r.tokens, r.limit);
    if (r.kind == reason_kind::offload)
      return hetmesh::format_to(out,
                                "offloaded r={:.2f}, a ring of {} instead of {} ranks: the copies hide under "
                                "compute up to r={:.3f}",
                                r.ratio, r.ranks, r.ranks_without_offload, r.ratio_max);
    out = hetmesh::format_to(out, "a ring of {} ranks, nothing offloaded: ", r.ranks);
    switch (r.cause) {
      case reason_cause::offload_off:
        return hetmesh::format_to(out, "the offload family is seq::no_offload");
      case reason_cause::link_unknown:
        return hetmesh::format_to(out,
                                  "the host link's bandwidth is unknown (0 in cost::offload_model), so no "
                                  "copy hides under compute");
      case reason_cause::untimed_compute:
        return hetmesh::format_to(out,
                                  "the offload model has no compute time T(s) (offload_model::layer), so "
                                  "no copy hides under compute");
      default:
        return hetmesh::format_to(out, "offloading what hides under compute (r <= {:.3f}) saves no rank",
                                  r.ratio_max);
    }
  }
};
namespace hetmesh::train::detail {
/// ", reasons=N: [first; second; ...]" (at most four), or nothing without reasons.
template <class Out>
Out format_reasons(Out out, const std::vector<plan_reason>& reasons) {
  if (reasons.empty()) return out;
  out = hetmesh::format_to(out, ", reasons={}: [", reasons.size());
  for (std::size_t i = 0; i < reasons.size() && i < 4; ++i)
    out = hetmesh::format_to(out, "{}{}", i > 0 ? "; " : "", reasons[i]);
  return hetmesh::format_to(out, "{}]", reasons.size() > 4 ? "; ..." : "");
}
}  // namespace hetmesh::train::detail
template <>
struct fmt::formatter<hetmesh::train::step_layout> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::step_layout& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out =
        hetmesh::format_to(ctx.out(), "step_plan{{world={}, documents={}, rings={}, micro_batches={}, pp={}",
                           p.world, p.documents.size(), p.rings.size(), p.micro_batches(), p.pp);
    return hetmesh::format_to(hetmesh::train::detail::format_reasons(out, p.reasons), "}}");
  }
};
template <class Part>
struct fmt::formatter<hetmesh::train::step_plan<Part>> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::step_plan<Part>& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    std::string_view family = "family";
    if constexpr (requires { Part::name; }) family = Part::name;  // the part's name, where it has one
    auto out = hetmesh::format_to(
        ctx.out(), "step_plan{{{}, world={}, documents={}, rings={}, micro_batches={}, pp={}", family,
        p.world, p.documents.size(), p.rings.size(), p.micro_batches(), p.pp);
    return hetmesh::format_to(hetmesh::train::detail::format_reasons(out, p.reasons), "}}");
  }
};
