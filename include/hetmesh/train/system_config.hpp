// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: what train::system is configured with besides its policy types: the run-time options,
// the pipeline configuration (depth, schedule family, encoder placement), the optimizer hook's concept, the
// encoders' bindings, and plan_system_step, the system's plan as a function of its parameters alone.
#pragma once

#include <concepts>
#include <cstdint>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "../balance/planner.hpp"
#include "../core/format.hpp"
#include "../model/encoder_batch.hpp"
#include "../model/micro_batch.hpp"
#include "../pipeline/joint.hpp"
#include "../pipeline/schedule_family.hpp"
#include "../run/ring_attention.hpp"
#include "../seq/long_short.hpp"
#include "families.hpp"
#include "partition_family.hpp"
#include "pipeline_plan.hpp"
#include "system_mesh.hpp"

namespace hetmesh::train {

/// An optimizer hook for a stage of type S: called once per step, after the gradient reduction, as
/// `o(s.parameters(), s.gradients())` (ranges of spans; it updates the parameters in place). The encoders'
/// parameters get the same call after the stage's.
template <class O, class S>
concept optimizer_hook = requires(O& o, S& s) {
  o(s.parameters(), s.gradients());
};

/// The element type of a stage's parameters (the span element of s.parameters()).
template <class S>
using stage_value_t =
    typename std::ranges::range_value_t<decltype(std::declval<S&>().parameters())>::element_type;

/// Options of train::system that are run-time values.
struct system_options {
  run::ring_attention_options attention{};  ///< tags and overlap of ring attention calls
  balance::step_model cost{};  ///< what a balance:: balancer prices HDP work with (unused otherwise)
  /// Reduce gradients and stats in rank order (an all-gather, then rank 0 + rank 1 + ...): bitwise the
  /// same result on every backend (loopback's all-reduce already adds in rank order, MPI's and NCCL's
  /// need not), at the cost of moving every rank's buffer to every rank. Off: the backend's all-reduce.
  bool reproducible = false;
  /// Long-short sequence parallelism for encoder items (MegaScale-Omni), per encoder and slot over the
  /// encoder domain (train/encoder_domain.hpp: every pipeline's encoder shards): an item above
  /// max_tokens_per_rank (or too costly to balance) is split over a Ulysses group inside one shard's pool
  /// row, shorter ones run whole, balanced by the policy's cost. Its `heads` applies only to encoders whose
  /// heads plan() was not given: system::plan(batch, encoders...) reads each encoder's attention_heads().
  seq::long_short_policy encoder_sp{};
  /// The mesh the world is laid out by (train/system_mesh.hpp): tp, the pool's cp order, ep and etp, and
  /// Megatron's order string. Every group the system uses comes from it by name; ctx.tp and ctx.ep are its
  /// tp and ep groups.
  system_mesh mesh{};
};

/// The pipeline of train::system: its depth (a run-time value: the cluster's), the schedule family and
/// the encoder placement (policy types; their members are parameters).
template <pipeline::schedule_family Schedule = pipeline::one_f_one_b,
          class Placement = pipeline::encoder_on_first_stage>
struct pipeline_config {
  int pp = 1;            ///< pipeline depth: the world is (pp + encoder-pool ranks) x pool ranks
  Schedule schedule{};   ///< the schedule family (e.g. pipeline::zero_bubble)
  Placement encoders{};  ///< where the encoders run (pipeline::colocated_encoder: the joint pipeline)
};

/// The step plan train::system<Partition, Kernel, Comm, Balancer, Schedule, Placement>::plan makes, as a
/// function of its parameters alone: plan_step(partition, docs, pool, balancer, cost), then
/// attach_pipeline(plan, pipeline.schedule, pipeline.encoders, pipeline.pp, batch, encoder_sp, encoder_heads,
/// tp)
/// (`batch`: the batch the documents came from, for its encoder items; null for none). Needs no communicator,
/// so tools and benchmarks plan at any scale; the system calls it with its pool (world / (tp x (pp +
/// encoder-pool ranks))) and its tp (the encoder domain's rows are tp x pool ranks; the LLM's part of the
/// plan does not depend on tp). Pure: a function of (policies, pool, documents, batch, tp), equal on every
/// rank; not collective.
/// Errors: the family's and attach_pipeline's. Cost: the family's planner plus the schedule's generation and
/// verification.
template <class Partition, class Balancer, pipeline::schedule_family Schedule, class Placement>
requires partition_family<Partition, Balancer>
[[nodiscard]] step_plan_t<Partition, Balancer> plan_system_step(
    const Partition& partition, const Balancer& balancer,
    const pipeline_config<Schedule, Placement>& pipeline, const balance::step_model& cost, int pool,
    std::span<const seq::seq_desc> docs, const model::step_batch* batch = nullptr,
    const seq::long_short_policy& encoder_sp = {}, std::span<const int> encoder_heads = {}, int tp = 1) {
  auto p = plan_step(partition, docs, pool, balancer, cost);
  attach_pipeline(p, pipeline.schedule, pipeline.encoders, pipeline.pp, batch, encoder_sp, encoder_heads, tp);
  return p;
}

/// An encoder of the model, as train::system::run takes it: the user's model::encoder_stage and a callable
/// `input(const model::encoder_batch_view&, std::span<T>)` that writes the encoder's input for the items
/// of the view (e.g. their image patches), input_size(view) elements. Item k of a document (encoder
/// index e) runs on the e-th encoder passed to run.
template <class Encoder, class Input>
struct encoder_binding {
  Encoder* stage = nullptr;  ///< the user's encoder; outlives the step
  Input input;               ///< its input source
};

/// The attention heads of an encoder stage, or of an encoder_binding's stage (model::encoder_stage
/// requirement 8: `int attention_heads() const`).
template <class E>
[[nodiscard]] int encoder_heads_of(const E& e) {
  if constexpr (requires { e.stage->attention_heads(); }) {
    return static_cast<int>(e.stage->attention_heads());
  } else {
    static_assert(
        requires { e.attention_heads(); },
        "train: expected an encoder stage with `int attention_heads() const` (model::encoder_stage "
        "requirement 8) or its train::bind_encoder binding");
    return static_cast<int>(e.attention_heads());
  }
}

/// encoder_binding for `e` and `input`.
template <class Encoder, class Input>
[[nodiscard]] encoder_binding<Encoder, std::decay_t<Input>> bind_encoder(Encoder& e, Input&& input) {
  return {&e, std::forward<Input>(input)};
}

}  // namespace hetmesh::train

template <class Schedule, class Placement>
struct fmt::formatter<hetmesh::train::pipeline_config<Schedule, Placement>> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::pipeline_config<Schedule, Placement>& c, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "pipeline{{pp={}, schedule={}, encoders={}}}", c.pp, c.schedule,
                              c.encoders);
  }
};
