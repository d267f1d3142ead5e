// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: one rank's run of a step plan, the part of train::system::run between the plan and the
// reduction. A step_rank holds what this rank reads of the plan (its micro-batches by slot, built once from
// the plan's token layouts; Ulysses' group streams; the encoder work derived from the plan's encoder
// domain); a stage_runner (train/stage_runner.hpp) is what the pipeline executor calls for each compute
// action (stage forward and backward, encoder forward and backward, sizes), with the activation stores and
// the step's accumulators, reaching the user's stage through a stage_entry; an encoder_landing reshards the
// encoder shards' rows to stage 0's order and back.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../comm/group_cache.hpp"
#include "../core/cpu_time.hpp"
#include "../core/error.hpp"
#include "../model/attention.hpp"
#include "../model/encoder_batch.hpp"
#include "../model/micro_batch.hpp"
#include "../model/stage.hpp"
#include "../pipeline/action.hpp"
#include "../pipeline/schedule_family.hpp"
#include "../run/ring_attention.hpp"
#include "build.hpp"
#include "context.hpp"
#include "encoder_context.hpp"
#include "encoders.hpp"
#include "partition_family.hpp"
#include "step_plan.hpp"
#include "step_stats.hpp"
#include "system_config.hpp"
#include "zero.hpp"

namespace hetmesh::train::detail {

/// What one pool rank reads of a plan for a step: its micro-batches by slot (null: the slot runs empty),
/// their planned entries, and for attention over groups the group's stream per slot. Built once per step.
struct step_rank {
  std::vector<model::micro_batch> built;              ///< this rank's micro-batches, plan order
  std::vector<const model::micro_batch*> by_slot;     ///< per slot
  std::vector<const planned_micro_batch*> planned;    ///< per slot
  std::vector<std::vector<std::int64_t>> stream_doc;  ///< groups: per slot, each group token's document
  std::vector<std::vector<std::int64_t>> stream_pos;  ///< groups: per slot, each group token's position
  model::micro_batch empty{};                         ///< what an empty slot's view shows

  /// The view of slot `mb` (empty when this rank has no micro-batch in it).
  [[nodiscard]] model::micro_batch_view view(int mb) const {
    const auto* p = by_slot[static_cast<std::size_t>(mb)];
    return (p != nullptr ? *p : empty).view();
  }
};

/// The micro-batch's tokens must be the ring position's tokens in the schedule's local order: the stage's
/// q, k, v rows are the ring's rows. Errors: invalid_argument naming the micro-batch. O(tokens).
inline void check_ring_order(const seq::ring_schedule& s, int position, const model::micro_batch_view& v) {
  const auto meta = run::ring_meta(s, position);
  const auto n = static_cast<std::size_t>(v.size());
  bool ok = meta.pos.size() == n;
  for (std::size_t t = 0; ok && t < n; ++t) ok = meta.pos[t] == v.positions[t];
  if (!ok)
    throw_error<invalid_argument>(
        "train::system::run: micro-batch {} has {} tokens that do not follow its ring's {} tokens at "
        "position {} "
        "in order; expected the plan's micro-batches",
        v.index, n, meta.pos.size(), position);
}

/// The step_rank of pool rank `j` under `plan` for `batch` (summary `s`), checked against the plan's rings
/// and encoder landings; with `group` > 0, the streams of its group (`group` consecutive pool ranks) from
/// the members' token layouts. Errors: build_micro_batches', check_ring_order's, check_landings'.
/// O(local tokens + group tokens).
HETMESH_COMPILED step_rank make_step_rank(const step_layout& plan, const model::step_batch& batch,
                                          const model::step_summary& s, int j, int group)
#if HETMESH_BODIES
{
  step_rank r;
  r.built = build_rank_micro_batches(plan, batch, s, j);
  const auto slots = static_cast<std::size_t>(std::max(plan.slots, 1));
  r.by_slot.assign(slots, nullptr);
  r.planned.assign(slots, nullptr);
  const auto& mine = plan.per_rank[static_cast<std::size_t>(j)];
  for (std::size_t i = 0; i < mine.size(); ++i) {
    r.by_slot[static_cast<std::size_t>(mine[i].slot)] = &r.built[i];
    r.planned[static_cast<std::size_t>(mine[i].slot)] = &mine[i];
    check_ring_order(plan.rings[static_cast<std::size_t>(mine[i].ring)], mine[i].position, r.built[i].view());
  }
  check_landings(plan, r.by_slot, j);
  if (group > 0) {
    r.stream_doc.resize(slots);
    r.stream_pos.resize(slots);
    const int first = j / group * group;
    for (int member = first; member < first + group; ++member)
      for (const auto& pm : plan.per_rank[static_cast<std::size_t>(member)])
        for (const auto& run : pm.runs)
          for (auto p = run.positions.begin; p < run.positions.end; ++p) {
            r.stream_doc[static_cast<std::size_t>(pm.slot)].push_back(
                plan.documents[static_cast<std::size_t>(run.doc)].id);
            r.stream_pos[static_cast<std::size_t>(pm.slot)].push_back(p);
          }
  }
  return r;
}
#else
    ;
#endif

/// The reshard between the encoder shards' concatenated outputs and stage 0's input in landing order
/// (encoder_work::reshard), through the memory policy: one copy or add per run of rows, in run order.
template <class T, class Memory>
struct encoder_landing {
  const encoder_work* work = nullptr;  ///< this rank's encoder work
  const Memory* mem = nullptr;         ///< the system's memory policy

  /// Stage 0's input of slot `mb` in landing order, from the shards' concatenation `in`.
  [[nodiscard]] auto gather(int mb, std::span<const T> in) const {
    typename Memory::template buffer<T> out;
    out.resize(static_cast<std::size_t>(work->landing_size[static_cast<std::size_t>(mb)]));
    mem->fill(out.span(), T(0));
    for (const auto& r : work->reshard[static_cast<std::size_t>(mb)])
      mem->copy(out.span().subspan(static_cast<std::size_t>(r.dst), static_cast<std::size_t>(r.n)),
                in.subspan(static_cast<std::size_t>(r.src), static_cast<std::size_t>(r.n)));
    return out;
  }
  /// The shards' gradient `gin` of slot `mb` from the landing-order gradient `g` (overwrites gin).
  void scatter(int mb, std::span<const T> g, std::span<T> gin) const {
    mem->fill(gin, T(0));
    for (const auto& r : work->reshard[static_cast<std::size_t>(mb)])
      mem->add(gin.subspan(static_cast<std::size_t>(r.src), static_cast<std::size_t>(r.n)),
               g.subspan(static_cast<std::size_t>(r.dst), static_cast<std::size_t>(r.n)));
  }
  /// Elements of stage 0's input of slot `mb` in landing order.
  [[nodiscard]] std::int64_t size(int mb) const { return work->landing_size[static_cast<std::size_t>(mb)]; }
};

/// Adds one call's thread CPU time to a total and records it as an action (seconds since `origin`).
struct cpu_scope {
  double& total;                             ///< the running total
  std::vector<pipeline::timed_action>& log;  ///< where the call is recorded
  pipeline::action what;                     ///< the call
  double origin;                             ///< the step's CPU origin
  double start = thread_cpu_seconds();       ///< when the call began
  ~cpu_scope() {
    const double end = thread_cpu_seconds();
    total += end - start;
    log.push_back({0, what, start - origin, end - origin});
  }
};

/// What the runtime lends a stage_runner for one step: the communicators, the kernel, the memory policy and
/// the options, all owned by train::system.
template <class Comm, class Kernel, class Memory>
struct step_resources {
  Comm* pool = nullptr;                            ///< this pipeline rank's pool
  Comm* group = nullptr;                           ///< attention over groups: this rank's group
  comm::group_cache<Comm>* item_groups = nullptr;  ///< the encoder items' Ulysses groups in the row
  Kernel* kernel = nullptr;                        ///< the user's attention kernel
  Memory* mem = nullptr;                           ///< the memory policy
  run::ring_attention_options attention{};         ///< ring calls' options
  int pool_size = 1;                               ///< ranks of the pool
  Comm* tp = nullptr;                              ///< the stages' ctx.tp (null: tp = 1)
  Comm* ep = nullptr;                              ///< the stages' ctx.ep (null: ep = 1)
  Comm* row = nullptr;                             ///< the encoder row: tp x pool ranks, by row position
  int row_size = 1;                                ///< ranks of the encoder row
};

/// train::system::run's compile-time checks of its types: the kernel for element type T, the backbone
/// stage against its Context, the schedule family against the stage's split backward, the optimizer hook
/// (or a sharded optimizer) and each encoder against its EncoderContext. Each failure is one static_assert
/// naming what to provide.
template <class Kernel, class Schedule, class Context, class EncoderContext, class Stage, class Optimizer,
          class T, class... Encoders>
constexpr void check_run_types() {
  static_assert(model::attention_kernel<Kernel, T>,
                "train::system: Kernel must model model::attention_kernel<Kernel, T> for the stage's element "
                "type T: `forward(const attention_block<T>&, attention_forward_out<T>)` and "
                "`backward(const attention_block<T>&, attention_backward_io<T>)`");
  static_assert(model::check_backbone_stage<Stage, T, Context>());
  static_assert(pipeline::check_schedule_accepts<Schedule, model::split_backward_stage<Stage, T, Context>>());
  static_assert(optimizer_hook<Optimizer, Stage> || sharded_optimizer<Optimizer>,
                "train::system::run: the optimizer hook must be callable as "
                "`optimizer(stage.parameters(), stage.gradients())`, or be a sharded optimizer "
                "(train::zero1)");
  static_assert((model::check_encoder_stage<std::remove_pointer_t<decltype(std::declval<Encoders&>().stage)>,
                                            T, EncoderContext>() &&
                 ...));
}

}  // namespace hetmesh::train::detail
