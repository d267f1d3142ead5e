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

/// The report as JSON: the step's loss, targets, tokens, micro-batches, encoder items, plan hash (hex
/// string), per-rank busy / forward / backward / step / thread-CPU busy seconds, thread-CPU seconds of
/// run(), of moving bytes and in the library, the library's share, and both imbalances. The timeline is
/// left to step_trace. Pure.
[[nodiscard]] inline nlohmann::json to_json(const step_report& r) {
  return {{"loss", r.stats.loss},
          {"targets", r.stats.targets},
          {"tokens", r.stats.tokens},
          {"micro_batches", r.stats.micro_batches},
          {"encoder_items", r.stats.encoder_items},
          {"plan_hash", hetmesh::format("{:#018x}", r.stats.plan_hash)},
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
