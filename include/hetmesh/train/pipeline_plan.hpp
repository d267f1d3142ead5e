// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the pipeline part of a step plan. The world is pp pipelines deep and `plan.world` ranks
// wide: world rank r is pipeline rank r / plan.world of the pipeline of pool rank r % plan.world
// (Megatron-LM's order: the pipeline dimension is the slowest). Every pipeline runs the same schedule,
// over the plan's slots (step_plan::slots): a pool rank with no micro-batch in a slot runs it empty. One
// schedule for all keeps ring attention deadlock-free at any depth: the ranks of one pipeline rank run
// the same action sequence, so the members of a ring meet in its slot in the same order. The schedule
// is a schedule family's (a pipeline:: policy type) for (pp, slots), with the step's encoders inserted
// by an encoder placement (pipeline::encoder_on_first_stage, pipeline::colocated_encoder: the joint
// encoder-LLM pipeline, or pipeline::encoder_pool: encoder-only ranks after each pipeline's LLM ranks,
// always present) when the step has encoder items, then lowered (SEND/RECV) and verified.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/function_ref.hpp"
#include "../model/micro_batch.hpp"
#include "../pipeline/generators.hpp"
#include "../pipeline/joint.hpp"
#include "../pipeline/lower.hpp"
#include "../pipeline/schedule_family.hpp"
#include "../pipeline/verify.hpp"
#include "encoder_domain.hpp"
#include "step_plan.hpp"

namespace hetmesh::train {

/// What the pipeline part of a plan sees of the step, for the schedule's costs (every pipeline runs one
/// schedule): per slot, the largest number of tokens a pool rank runs in it, and an even share of the
/// step's encoder tokens.
struct slot_load {
  std::vector<std::int64_t> tokens;          ///< per slot: max over pool ranks of its tokens
  std::vector<std::int64_t> encoder_tokens;  ///< per slot: the step's encoder tokens over the slots
};

/// The slot loads of `plan` (with `batch`, the batch it was made from, for encoder tokens; may be null).
/// Pure; O(micro-batches x chunks + documents x items).
[[nodiscard]] HETMESH_COMPILED slot_load slot_loads(const step_layout& plan, const model::step_batch* batch)
#if HETMESH_BODIES
{
  slot_load l;
  const auto n = static_cast<std::size_t>(std::max(plan.slots, 1));
  l.tokens.assign(n, 0);
  l.encoder_tokens.assign(n, 0);
  for (const auto& list : plan.per_rank)
    for (const auto& pm : list) {
      std::int64_t t = 0;
      for (const auto& c :
           plan.rings[static_cast<std::size_t>(pm.ring)].chunks[static_cast<std::size_t>(pm.position)])
        t += c.positions.size();
      auto& m = l.tokens[static_cast<std::size_t>(pm.slot)];
      m = std::max(m, t);
    }
  std::int64_t enc = 0;
  if (batch != nullptr)
    for (const auto& d : batch->documents)
      for (const auto& it : d.items) enc += it.tokens;
  for (auto& x : l.encoder_tokens)
    x = (enc + static_cast<std::int64_t>(n) - 1) / static_cast<std::int64_t>(n);
  return l;
}
#else
    ;
#endif

/// True when the batch has an encoder item.
[[nodiscard]] HETMESH_COMPILED bool has_encoder_items(const model::step_batch& b) noexcept
#if HETMESH_BODIES
{
  for (const auto& d : b.documents)
    if (!d.items.empty()) return true;
  return false;
}
#else
    ;
#endif

/// Per slot, the encoder landings of every pool rank's micro-batch in it (step_layout::encoder_landings),
/// for `plan` and the items of `batch`, the step it was made from (only documents' ids and items are read:
/// a batch of metadata serves), from the planned micro-batches' token runs: an item's rows that fall in a
/// run land at the run's tokens, and a piece continuing the previous one (in the item and in the buffer) is
/// one landing, as model::micro_batch::encoder_outputs has them. Pure; O(runs x items per document).
[[nodiscard]] HETMESH_COMPILED std::vector<std::vector<slot_landing>> plan_landings(
    const step_layout& plan, const model::step_batch& batch)
#if HETMESH_BODIES
{
  std::map<std::int64_t, const model::document*> by_id;
  for (const auto& d : batch.documents) by_id[d.id] = &d;
  std::vector<std::vector<slot_landing>> out(static_cast<std::size_t>(std::max(plan.slots, 1)));
  for (int r = 0; r < plan.world; ++r)
    for (const auto& pm : plan.per_rank[static_cast<std::size_t>(r)]) {
      auto& slot = out[static_cast<std::size_t>(pm.slot)];
      const auto first = slot.size();
      std::int64_t local = 0, last_end = -1;  // local offset of the run; where the last landing ended
      for (const auto& run : pm.runs) {
        const auto it = by_id.find(plan.documents[static_cast<std::size_t>(run.doc)].id);
        if (it != by_id.end())
          for (const auto& item : it->second->items) {
            const auto lo = std::max(run.positions.begin, item.position);
            const auto hi = std::min(run.positions.end, item.position + item.tokens);
            if (lo >= hi) continue;
            const seq::token_range rows{lo - item.position, hi - item.position};
            const auto at = local + (lo - run.positions.begin);
            if (slot.size() > first && slot.back().encoder == item.encoder && slot.back().item == item.id &&
                slot.back().rows.end == rows.begin && last_end == at)
              slot.back().rows.end = rows.end;
            else
              slot.push_back({r, item.encoder, item.id, item.tokens, rows});
            last_end = at + rows.size();
          }
        local += run.positions.size();
      }
    }
  return out;
}
#else
    ;
#endif

/// The pipeline stages of each pipeline rank (ascending) under `family` at depth `pp`, before any plan: the
/// stage layout of the family's schedule for the smallest micro-batch count from pp up that it accepts.
/// Every plan's schedule (attach_pipeline) places stages the same way: placement depends on the family and
/// pp, not on the batch. Errors: pp < 1, or no count in [pp, 5 pp] accepted (the family's invalid_argument).
template <pipeline::schedule_family Schedule>
[[nodiscard]] std::vector<std::vector<int>> stages_by_rank(const Schedule& family, int pp) {
  if (pp < 1) throw_error<invalid_argument>("train::stages_by_rank: pp = {}; expected >= 1", pp);
  for (int m = pp;; ++m) {
    try {
      const auto s = family.generate(pp, m);
      std::vector<std::vector<int>> out(static_cast<std::size_t>(pp));
      for (int st = 0; st < s.num_stages; ++st)
        out[static_cast<std::size_t>(s.rank_of_stage(st))].push_back(st);
      return out;
    } catch (const invalid_argument&) {
      if (m >= 5 * pp) throw;
    }
  }
}

namespace detail {

/// attach_pipeline's first half: checks pp and tp, sets plan.pp, plan.tp and plan.slots (raised to the
/// smallest count the family accepts: `generate(pp, m)` throws invalid_argument for a count it refuses) and
/// returns that schedule. Errors: attach_pipeline's.
HETMESH_COMPILED pipeline::schedule generate_for(step_layout& plan, int pp, int tp,
                                                 function_ref<pipeline::schedule(int, int)> generate)
#if HETMESH_BODIES
{
  if (pp < 1)
    throw_error<invalid_argument>("train::attach_pipeline: pp = {}; expected a pipeline depth >= 1", pp);
  if (tp < 1)
    throw_error<invalid_argument>("train::attach_pipeline: tp = {}; expected tensor-parallel ranks >= 1", tp);
  plan.pp = pp;
  plan.tp = tp;
  plan.encoder_landings.clear();
  // The smallest slot count >= the plan's that the family accepts (interleaved families need micro-batch
  // counts that group evenly): the extra slots run empty on every rank.
  const int want = std::max(plan.slots, 1);
  for (int m = want;; ++m) {
    try {
      auto s = generate(pp, m);
      plan.slots = m;
      return s;
    } catch (const invalid_argument&) {
      if (m >= want + 4 * pp) throw;  // no count near the plan's works: the family's own error
    }
  }
}
#else
    ;
#endif

/// attach_pipeline's second half: schedule `s` with the encoders placed (`place(s, costs, work)`: the
/// placement's pipeline::add_encoder) when `pool` (a separate encoder pool) or the batch has encoder items,
/// the landings, the encoder domain and the reasons, lowered and verified into plan.pipeline.
HETMESH_COMPILED void finish_pipeline(
    step_layout& plan, pipeline::schedule s, bool pool,
    function_ref<pipeline::schedule(const pipeline::schedule&, const pipeline::cost_model&,
                                    const pipeline::encoder_work&)>
        place,
    const model::step_batch* batch, const seq::long_short_policy& encoder_sp, std::span<const int> heads)
#if HETMESH_BODIES
{
  if (pool || (batch != nullptr && has_encoder_items(*batch))) {
    const auto load = slot_loads(plan, batch);
    auto at = [](const std::vector<std::int64_t>& v, int mb) {
      return mb >= 0 && mb < static_cast<int>(v.size()) ? static_cast<double>(v[static_cast<std::size_t>(mb)])
                                                        : 0.0;
    };
    pipeline::cost_model costs;
    costs.compute = [load, at, stages = s.num_stages](const pipeline::action& a) {
      const double f = (1.0 + at(load.tokens, a.microbatch)) / stages;
      switch (a.type) {
        case pipeline::action_type::forward:
        case pipeline::action_type::backward_input:
        case pipeline::action_type::backward_weight:
          return f;
        case pipeline::action_type::backward:
          return 2.0 * f;
        default:
          return 0.0;
      }
    };
    pipeline::encoder_work work;
    work.forward = [load, at](int mb) { return at(load.encoder_tokens, mb); };
    work.backward = [load, at](int mb) { return 2.0 * at(load.encoder_tokens, mb); };
    s = place(s, costs, work);
    if (batch != nullptr) plan.encoder_landings = plan_landings(plan, *batch);
  }
  plan.encoder_sp = encoder_sp;
  plan.encoder_heads.assign(heads.begin(), heads.end());
  plan.encoder_domain =
      plan_encoder_domain(plan, s.num_encoder_shards(), plan.encoders(), encoder_sp, plan.encoder_heads);
  set_split_reasons(plan);
  plan.pipeline = pipeline::add_send_recv(s);
  pipeline::assert_deadlock_free(plan.pipeline, "train::attach_pipeline");
}
#else
    ;
#endif

}  // namespace detail

/// Sets plan.pp and plan.pipeline: `family`'s schedule for (pp, slots), where slots is the smallest count
/// >= plan.slots the family accepts (plan.slots is raised to it; the extra slots run empty), with encoders
/// placed by `placement` when `with_encoders`, lowered and verified. Costs for the placement's simulation
/// come from the slot loads (forward: 1 + tokens; backward 2x; encoder: its tokens). With encoder items,
/// sets plan.encoder_landings (plan_landings), and in every case plan.encoder_sp, plan.encoder_heads
/// (`heads`: per encoder index, its attention heads, -1 unknown) and the encoder domain's plan under them
/// (plan_encoder_domain over the schedule's shards, each over the tp x pool ranks of its pipeline rank:
/// `tp` sets plan.tp). Pure. Errors: pp < 1 or tp < 1 (invalid_argument); the family's (e.g. interleaved
/// schedules' micro-batch rules) and the verifier's.
template <pipeline::schedule_family Schedule, class Placement>
void attach_pipeline(step_layout& plan, const Schedule& family, const Placement& placement, int pp,
                     const model::step_batch* batch, const seq::long_short_policy& encoder_sp = {},
                     std::span<const int> heads = {}, int tp = 1) {
  // A separate encoder pool is part of the world whether or not the step has encoder items: its ranks
  // take part in every schedule (with empty encoder work when there is none).
  static_assert(pipeline::encoder_placement<Placement>,
                "train: the encoder placement must be a pipeline::encoder_placement (pipeline/joint.hpp: "
                "pipeline::encoder_on_first_stage, pipeline::colocated_encoder for the joint pipeline, "
                "pipeline::encoder_pool, or a type of the user's with `place` and `encoder_ranks`)");
  auto generate = [&](int p, int m) { return family.generate(p, m); };
  auto place = [&](const pipeline::schedule& s, const pipeline::cost_model& costs,
                   const pipeline::encoder_work& work) {
    return pipeline::add_encoder(s, placement, costs, work);
  };
  auto s = detail::generate_for(plan, pp, tp, generate);
  detail::finish_pipeline(plan, std::move(s), placement.encoder_ranks() > 0, place, batch, encoder_sp, heads);
}

}  // namespace hetmesh::train
