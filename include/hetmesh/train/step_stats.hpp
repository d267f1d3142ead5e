// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: step_stats, what one step of train::system::run did (reduced over the world) and this
// rank's own times.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/format.hpp"
#include "../pipeline/simulate.hpp"
#include "step_plan.hpp"
#include "zero.hpp"

namespace hetmesh::train {

/// What one step did, the same on every rank (reduced over the world), plus this rank's own times.
struct step_stats {
  double loss = 0.0;               ///< the step's loss: sum over ranks of the last stage's loss terms
  std::int64_t targets = 0;        ///< sum over ranks of loss weights: the step's target count, exactly once
  std::int64_t tokens = 0;         ///< real (non-padding) tokens run over every pipeline: the step's tokens
  std::int64_t micro_batches = 0;  ///< non-empty micro-batches run over every pipeline
  std::int64_t encoder_items = 0;  ///< encoder items encoded over every rank (an item split over ranks
                                   ///< of its document counts on each)
  std::uint64_t plan_hash = 0;     ///< the plan's hash
  /// The plan's reasons (step_layout::reasons: why a document above capacity got its ring or offload, why
  /// an encoder item was split): how many there were, and the first max_reasons of them.
  std::int64_t reason_count = 0;
  std::vector<plan_reason> reasons;  ///< the plan's first reasons (at most max_reasons)
  /// The most reasons a step_stats carries (the count says how many the plan had).
  static constexpr std::size_t max_reasons = 8;
  double forward_seconds = 0.0;   ///< this rank: time in forward actions (encoders included)
  double backward_seconds = 0.0;  ///< this rank: time in backward actions (I and W included)
  double busy_seconds = 0.0;      ///< this rank: time in compute actions (forward + backward)
  double cpu_busy_seconds = 0.0;  ///< this rank: thread CPU time in the stages and encoders (its own work,
                                  ///< whatever else shares the cores)
  double step_seconds = 0.0;      ///< this rank: the pipeline's wall time, communication included
  double reduce_seconds = 0.0;    ///< this rank: gradient reduction time
  double cpu_step_seconds = 0.0;  ///< this rank: thread CPU time of the whole run() call
  double cpu_comm_seconds = 0.0;  ///< this rank: thread CPU time moving bytes: the pipeline's SEND/RECV
                                  ///< actions, the step's barrier, the gradient and stats reductions
  double cpu_optimizer_seconds = 0.0;  ///< this rank: thread CPU time in the optimizer hook
  std::int64_t activation_peak_bytes =
      0;                             ///< this rank: peak resident bytes of the stages' saved activations
  std::int64_t offloaded_bytes = 0;  ///< this rank: activation bytes offloaded (selective offload)
  std::int64_t parameter_bytes = 0;  ///< this rank: bytes of its stage's and encoders' parameters
  std::int64_t gradient_bytes = 0;   ///< this rank: bytes of their gradient tensors
  /// This rank: bytes of optimizer state after the step (train::optimizer_state_bytes: Adam's moments; with
  /// train::zero1, those of this rank's shards only).
  std::int64_t optimizer_state_bytes = 0;
  /// This rank's executed actions with their wall times (seconds since the step began), the simulator's
  /// trace format (pipeline::timed_action; its rank is this rank's world rank).
  std::vector<pipeline::timed_action> timeline;
  /// This rank's calls into the stages and encoders with their thread CPU times (start and end: CPU
  /// seconds since the step began), for cost calibration where ranks share cores.
  std::vector<pipeline::timed_action> cpu_actions;

  /// This rank's thread CPU time in the library during run(): the whole call less the user's stage and
  /// encoder calls (cpu_busy_seconds), the bytes on the wire (cpu_comm_seconds) and the optimizer hook;
  /// what remains is plan agreement, micro-batch building, dispatch and bookkeeping. Never negative.
  [[nodiscard]] double library_cpu_seconds() const noexcept {
    const double d = cpu_step_seconds - cpu_busy_seconds - cpu_comm_seconds - cpu_optimizer_seconds;
    return d > 0.0 ? d : 0.0;
  }
};

/// Copies the reasons of `plan` into `st`: their count and the first step_stats::max_reasons. O(that).
HETMESH_COMPILED void record_reasons(step_stats& st, const step_layout& plan)
#if HETMESH_BODIES
{
  st.reason_count = static_cast<std::int64_t>(plan.reasons.size());
  const auto n = std::min(plan.reasons.size(), step_stats::max_reasons);
  st.reasons.assign(plan.reasons.begin(), plan.reasons.begin() + static_cast<std::ptrdiff_t>(n));
}
#else
    ;
#endif

/// Bytes of the tensors of a range of spans of T (a stage's parameters() or gradients()).
template <class T, class Range>
[[nodiscard]] std::int64_t tensor_bytes(Range&& tensors) {
  std::int64_t n = 0;
  for (auto t : tensors) n += static_cast<std::int64_t>(std::span<T>(t).size_bytes());
  return n;
}

/// Fills st's memory figures for this rank: the bytes of the stage's and the bound encoders' parameters and
/// gradients, and the optimizer's state (optimizer_state_bytes).
template <class T, class Stage, class Bound, class Optimizer>
void record_memory(step_stats& st, Stage& stage, Bound& bound, const Optimizer& optimizer) {
  st.parameter_bytes = tensor_bytes<T>(stage.parameters());
  st.gradient_bytes = tensor_bytes<T>(stage.gradients());
  if constexpr (requires {
                  stage.expert_parameters();
                  stage.expert_gradients();
                }) {
    st.parameter_bytes += tensor_bytes<T>(stage.expert_parameters());
    st.gradient_bytes += tensor_bytes<T>(stage.expert_gradients());
  }
  std::apply(
      [&](auto&... e) {
        ((st.parameter_bytes += tensor_bytes<T>(e.stage->parameters()),
          st.gradient_bytes += tensor_bytes<T>(e.stage->gradients())),
         ...);
      },
      bound);
  st.optimizer_state_bytes = optimizer_state_bytes(optimizer);
}

}  // namespace hetmesh::train

template <>
struct fmt::formatter<hetmesh::train::step_stats> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::step_stats& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(),
                              "step{{loss={:.6g}, targets={}, tokens={}, micro_batches={}, encoder_items={}, "
                              "plan={:#018x}, forward={:.3g}s, backward={:.3g}s, busy={:.3g}s, step={:.3g}s, "
                              "reduce={:.3g}s, reasons={}}}",
                              s.loss, s.targets, s.tokens, s.micro_batches, s.encoder_items, s.plan_hash,
                              s.forward_seconds, s.backward_seconds, s.busy_seconds, s.step_seconds,
                              s.reduce_seconds, s.reason_count);
  }
};
