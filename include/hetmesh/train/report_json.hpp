// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: a gathered step report as JSON, and its timeline as a Chrome trace (Perfetto,
// chrome://tracing) in the pipeline simulator's format. JSON lives in headers the umbrellas leave out, so
// a plain include does not pay for nlohmann/json; include this one where a report is written.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "../pipeline/trace_json.hpp"
#include "report.hpp"

namespace hetmesh::train {

/// One of a plan's reasons as JSON: its kind ("ring", "offload", "split"), cause, the document or item
/// (id, tokens; encoder and slot for a split), the ranks it got, the figures the decision compared (HDP:
/// capacity, ranks without offloading, ratio, ratio_max; split: max_tokens_per_rank, min_split_tokens,
/// cost, cost_limit) and the sentence the plan prints ("why"). Pure.
[[nodiscard]] inline nlohmann::json to_json(const plan_reason& r) {
  static constexpr const char* kinds[] = {"ring", "offload", "split"};
  static constexpr const char* causes[] = {"offload_off", "link_unknown", "untimed_compute", "saves_no_rank",
                                           "copies_hide", "over_memory",  "over_balance"};
  nlohmann::json j{{"kind", kinds[static_cast<int>(r.kind)]},
                   {"cause", causes[static_cast<int>(r.cause)]},
                   {"id", r.id},
                   {"tokens", r.tokens},
                   {"ranks", r.ranks},
                   {"why", hetmesh::format("{}", r)}};
  if (r.kind == reason_kind::split) {
    j.update({{"encoder", r.encoder},
              {"slot", r.slot},
              {"max_tokens_per_rank", r.limit},
              {"min_split_tokens", r.min_split},
              {"cost", r.cost},
              {"cost_limit", r.cost_limit}});
  } else {
    j.update({{"capacity", r.limit},
              {"ranks_without_offload", r.ranks_without_offload},
              {"ratio", r.ratio},
              {"ratio_max", r.ratio_max}});
  }
  return j;
}

/// The report as JSON: the step's loss, targets, tokens, micro-batches, encoder items, plan hash (hex
/// string), the plan's reasons (reason_count; "reasons": the first ones, each as to_json(plan_reason)),
/// per-rank busy / forward / backward / step / thread-CPU busy seconds, thread-CPU seconds of run(), of
/// moving bytes and in the library, the library's share, and both imbalances. The timeline is left to
/// step_trace. Pure.
[[nodiscard]] inline nlohmann::json to_json(const step_report& r) {
  auto reasons = nlohmann::json::array();
  for (const auto& x : r.stats.reasons) reasons.push_back(to_json(x));
  return {{"loss", r.stats.loss},
          {"targets", r.stats.targets},
          {"tokens", r.stats.tokens},
          {"micro_batches", r.stats.micro_batches},
          {"encoder_items", r.stats.encoder_items},
          {"plan_hash", hetmesh::format("{:#018x}", r.stats.plan_hash)},
          {"reason_count", r.stats.reason_count},
          {"reasons", std::move(reasons)},
          {"busy_s", r.busy_seconds},
          {"forward_s", r.forward_seconds},
          {"backward_s", r.backward_seconds},
          {"step_s", r.step_seconds},
          {"cpu_busy_s", r.cpu_busy_seconds},
          {"cpu_step_s", r.cpu_step_seconds},
          {"cpu_comm_s", r.cpu_comm_seconds},
          {"library_cpu_s", r.library_cpu_seconds},
          {"library_share", r.library_share()},
          {"parameter_bytes", r.parameter_bytes},
          {"gradient_bytes", r.gradient_bytes},
          {"optimizer_state_bytes", r.optimizer_state_bytes},
          {"imbalance", r.imbalance()},
          {"cpu_imbalance", r.cpu_imbalance()}};
}

/// The measured timeline of every rank as a Chrome trace (pipeline::chrome_trace). Pure.
[[nodiscard]] inline nlohmann::json step_trace(
    const step_report& r, const std::string& process_name = "hetmesh train step (measured)") {
  return pipeline::chrome_trace(r.timeline, process_name);
}

}  // namespace hetmesh::train
