// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the encoders' domain of a step (MegaScale-Omni's long-short SP, decoupled from the LLM's
// mesh). In each slot, the encoder items landing in any pipeline's micro-batch are encoded once in the
// world, over a domain of E x R ranks: encoder shard e sits on the pipeline rank the placement gives it,
// and encodes over that pipeline rank's row of the encoder mesh (train::system_layout::encoder_mesh: the
// R = tp x pool ranks of the pipeline rank, row position q = pool rank x tp + tp rank), so domain rank
// e * R + q is the rank at row position q of shard e's pipeline rank. Per encoder, seq::plan_long_short
// places the slot's distinct items over the domain: short items whole on one rank, balanced; long ones
// split over a Ulysses group of consecutive domain ranks that never leaves one shard's row (group sizes
// divide gcd(R, devices per node); under Megatron's orders a row's ranks are consecutive world ranks, so
// a group also stays inside a node). The rows a shard's rank encodes go to every rank of the row whose
// pool rank's micro-batch reads them (each of its tp ranks: they all run the same micro-batch); the
// gradient comes back from the one of them with the encoding rank's tp rank (stage 0's input gradient is
// the same on every tp rank).
//
// Why a group never spans shards: every pipeline runs the same schedule (step_layout::slots), so the ranks
// of one pipeline rank reach a slot's encoder action at the same position of their action lists, and a
// collective among them (the Ulysses all-to-alls inside the encoder, the exchange of rows after it) meets in
// the same order on every member, as ring attention does among the ranks of one stage. Shards on different
// pipeline ranks run the action at different points (the joint pipeline fills each stage's bubbles on its
// own), so a group across them could wait on a member blocked in the LLM's transfers, behind the group.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../seq/long_short.hpp"
#include "../seq/types.hpp"
#include "step_plan.hpp"

namespace hetmesh::train {

/// `policy` over an encoder domain whose shard rows have `pool` ranks: its node size becomes
/// gcd(pool, devices per node), so a Ulysses group (aligned, dividing the node size) stays in one row.
/// Errors: pool < 1 (invalid_argument). O(1).
[[nodiscard]] HETMESH_COMPILED seq::long_short_policy domain_policy(seq::long_short_policy policy, int pool)
#if HETMESH_BODIES
{
  if (pool < 1)
    throw_error<invalid_argument>("train::domain_policy: a pool of {} ranks; expected >= 1", pool);
  policy.cluster.devices_per_node = std::gcd(pool, std::max(policy.cluster.devices_per_node, 1));
  return policy;
}
#else
    ;
#endif

/// The distinct items of encoder `encoder` among `landings` (one slot's), in first-landing order.
/// O(landings log landings).
[[nodiscard]] HETMESH_COMPILED std::vector<seq::seq_desc> slot_items(
    const std::vector<slot_landing>& landings, int encoder)
#if HETMESH_BODIES
{
  std::vector<seq::seq_desc> out;
  std::map<std::int64_t, std::int64_t> seen;
  for (const auto& l : landings) {
    if (l.encoder != encoder) continue;
    const auto [it, fresh] = seen.emplace(l.item, l.item_tokens);
    if (fresh)
      out.push_back({l.item, l.item_tokens});
    else if (it->second != l.item_tokens)
      throw_error<invalid_argument>(
          "train::plan_encoder_domain: encoder {} item {} lands with {} and {} tokens; expected one length",
          encoder, l.item, it->second, l.item_tokens);
  }
  return out;
}
#else
    ;
#endif

/// The encoder domain's plan of `plan` with `shards` encoder shards per pipeline (the schedule's) and
/// encoders 0 .. encoders - 1: per slot and encoder, the long-short plan of the slot's distinct items over
/// shards x plan.encoder_row() domain ranks (domain_policy over the row), with `heads[k]` as encoder k's
/// heads where given and
/// >= 0 (else policy.heads). A slot or encoder without items gets an empty plan
/// (ranks = 0). Errors: a landing of an encoder index outside [0, encoders) (invalid_argument); the
/// planner's (capacity_error: an item needs a group larger than a shard's row allows). Pure: equal
/// on every rank; O(slots x encoders x (items log items + items x domain)).
[[nodiscard]] HETMESH_COMPILED std::vector<std::vector<seq::long_short_plan>> plan_encoder_domain(
    const step_layout& plan, int shards, int encoders, const seq::long_short_policy& policy,
    std::span<const int> heads = {})
#if HETMESH_BODIES
{
  std::vector<std::vector<seq::long_short_plan>> out(plan.encoder_landings.size());
  const int row = plan.encoder_row();
  const auto dp = domain_policy(policy, row);
  for (std::size_t m = 0; m < plan.encoder_landings.size(); ++m) {
    const auto& landings = plan.encoder_landings[m];
    for (const auto& l : landings)
      if (l.encoder < 0 || l.encoder >= encoders)
        throw_error<invalid_argument>(
            "train::system::run: encoder item {} names encoder {}, but {} encoders were passed to run; "
            "expected an encoder (bind_encoder) for every encoder index of the batch",
            l.item, l.encoder, encoders);
    out[m].resize(static_cast<std::size_t>(std::max(encoders, 0)));
    if (landings.empty() || shards < 1) continue;
    for (int k = 0; k < encoders; ++k) {
      const auto items = slot_items(landings, k);
      if (items.empty()) continue;
      auto pk = dp;
      if (static_cast<std::size_t>(k) < heads.size() && heads[static_cast<std::size_t>(k)] >= 0)
        pk.heads = heads[static_cast<std::size_t>(k)];
      out[m][static_cast<std::size_t>(k)] = pk.plan(items, shards * row);
    }
  }
  return out;
}
#else
    ;
#endif

/// Why `plan`'s encoder domain splits the items it splits: per slot, encoder and split item (degree > 1,
/// in that order), a plan_reason of kind split whose cause is over_memory (more tokens than the policy's
/// max_tokens_per_rank) or else over_balance (a cost above the long-short plan's balance_limit, with at
/// least min_split_tokens tokens). Items run whole get none. Pure; O(domain items).
[[nodiscard]] HETMESH_COMPILED std::vector<plan_reason> split_reasons(const step_layout& plan)
#if HETMESH_BODIES
{
  std::vector<plan_reason> out;
  for (std::size_t m = 0; m < plan.encoder_domain.size(); ++m)
    for (std::size_t k = 0; k < plan.encoder_domain[m].size(); ++k) {
      const auto& ls = plan.encoder_domain[m][k];
      for (const auto& a : ls.items) {
        if (a.degree <= 1) continue;
        plan_reason r;
        r.kind = reason_kind::split;
        r.cause = a.item.length > ls.policy.max_tokens_per_rank ? reason_cause::over_memory
                                                                : reason_cause::over_balance;
        r.encoder = static_cast<int>(k);
        r.slot = static_cast<int>(m);
        r.id = a.item.id;
        r.tokens = a.item.length;
        r.limit = ls.policy.max_tokens_per_rank;
        r.min_split = ls.policy.min_split_tokens;
        r.ranks = a.degree;
        r.cost = a.cost.units();
        r.cost_limit = ls.balance_limit.units();
        out.push_back(r);
      }
    }
  return out;
}
#else
    ;
#endif

/// Sets the split reasons of `plan` (split_reasons) after its encoder domain was planned: reasons of kind
/// split are replaced, the others (HDP's) kept in front. O(reasons + domain items).
HETMESH_COMPILED void set_split_reasons(step_layout& plan)
#if HETMESH_BODIES
{
  std::erase_if(plan.reasons, [](const plan_reason& r) { return r.kind == reason_kind::split; });
  for (auto& r : split_reasons(plan)) plan.reasons.push_back(r);
}
#else
    ;
#endif

/// Checks that every item of encoder `encoder` that `plan`'s encoder domain splits over a group can split
/// over it given the encoder's declared `heads` (its attention_heads(): 0 splits any way, h > 0 needs
/// groups dividing h). Errors: invalid_argument naming the item, the group and the heads, before any rank
/// runs it. O(domain items).
HETMESH_COMPILED void check_encoder_heads(const step_layout& plan, int encoder, int heads)
#if HETMESH_BODIES
{
  if (heads == 0) return;
  for (const auto& slot : plan.encoder_domain) {
    if (static_cast<std::size_t>(encoder) >= slot.size()) continue;
    for (const auto& a : slot[static_cast<std::size_t>(encoder)].items)
      if (a.degree > 1 && (heads < 0 || heads % a.degree != 0))
        throw_error<invalid_argument>(
            "train::system::run: encoder {} item {} is split over {} ranks, but the encoder declares {} "
            "attention heads; expected groups dividing them: make the plan with plan(batch, encoders...) so "
            "it "
            "reads each encoder's attention_heads()",
            encoder, a.item.id, a.degree, heads);
  }
}
#else
    ;
#endif

/// Where a domain rank sits (see the file comment): its shard, its row position, and the pool rank and tp
/// rank of that position.
struct domain_place {
  int shard = 0;      ///< the encoder shard (its pipeline rank: plan.pipeline.encoder_shard_to_rank)
  int position = 0;   ///< the row position: pool_rank x tp + tp_rank
  int pool_rank = 0;  ///< the pool rank of the position
  int tp_rank = 0;    ///< the tp rank of the position
  friend constexpr bool operator==(const domain_place&, const domain_place&) = default;
};

/// Where domain rank `d` of `plan`'s encoder domain sits. Pre: 0 <= d < shards x plan.encoder_row(). O(1).
[[nodiscard]] HETMESH_COMPILED domain_place domain_place_of(const step_layout& plan, int d) noexcept
#if HETMESH_BODIES
{
  const int row = plan.encoder_row(), q = d % row;
  return {d / row, q, q / plan.tp, q % plan.tp};
}
#else
    ;
#endif

/// Calls `f(domain_rank, tokens)` for each piece of `a` (a long-short assignment): its group's ranks in
/// group order with their token ranges (one call, the whole item, for a short item). O(degree).
template <class F>
void for_each_piece(const seq::long_short_assignment& a, F&& f) {
  if (a.degree <= 1) {
    f(a.first_rank, seq::token_range{0, a.item.length});
    return;
  }
  for (int t = 0; t < a.degree; ++t) f(a.first_rank + t, a.splits[static_cast<std::size_t>(t)]);
}

/// Per encoder, item id -> its assignment in `plans` (one slot's plans). O(items log items).
[[nodiscard]] HETMESH_COMPILED std::vector<std::map<std::int64_t, const seq::long_short_assignment*>>
assignment_index(const std::vector<seq::long_short_plan>& plans)
#if HETMESH_BODIES
{
  std::vector<std::map<std::int64_t, const seq::long_short_assignment*>> out(plans.size());
  for (std::size_t k = 0; k < plans.size(); ++k)
    for (const auto& a : plans[k].items) out[k][a.item.id] = &a;
  return out;
}
#else
    ;
#endif

}  // namespace hetmesh::train
