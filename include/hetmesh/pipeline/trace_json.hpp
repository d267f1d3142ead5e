// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: the Chrome trace event JSON of a timeline (Perfetto, chrome://tracing). JSON lives
// in headers the umbrellas leave out, so a plain include does not pay for nlohmann/json; include this
// one where a trace is written.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "action.hpp"
#include "simulate.hpp"
#include "trace.hpp"

namespace hetmesh::pipeline {

/// Chrome trace event JSON of a timeline (simulated: simulation::timeline; executed: run::execute_pipeline's
/// `timeline` output). Times in seconds become microseconds. `process_name` labels the trace. Pure.
[[nodiscard]] inline nlohmann::json chrome_trace(const std::vector<timed_action>& timeline,
                                                 const std::string& process_name = "hetmesh pipeline") {
  nlohmann::json events = nlohmann::json::array();
  int max_rank = -1;
  for (const auto& t : timeline) max_rank = std::max(max_rank, t.rank);
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", process_name}}}});
  for (int r = 0; r <= max_rank; ++r) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", hetmesh::format("rank {}", r)}}}});
    events.push_back(
        {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", r}, {"args", {{"sort_index", r}}}});
  }
  for (const auto& t : timeline) {
    const char* cat =
        is_comm(t.what.type) ? "communication"
        : (t.what.type == action_type::encoder_forward || t.what.type == action_type::encoder_backward)
            ? "encoder"
            : "computation";
    nlohmann::json args = {{"stage", t.what.stage}, {"type", std::string(name_of(t.what.type))}};
    if (t.what.microbatch >= 0) args["microbatch"] = t.what.microbatch;
    if (t.what.type == action_type::overlap_f_b) {  // the backward half of an overlapped F+B
      args["backward_stage"] = t.what.backward_stage;
      args["backward_microbatch"] = t.what.backward_microbatch;
    }
    events.push_back({{"name", to_text(t.what)},
                      {"cat", cat},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", t.rank},
                      {"ts", t.start * 1e6},
                      {"dur", (t.end - t.start) * 1e6},
                      {"args", std::move(args)}});
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

}  // namespace hetmesh::pipeline
