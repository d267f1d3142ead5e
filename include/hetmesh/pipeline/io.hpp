// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: text import and export of schedules. The CSV form is PyTorch's (`_dump_csv` /
// `_load_csv`): one row per rank, the rank's actions comma-separated in order, empty fields for idle
// steps. The table form is PyTorch's `_format_pipeline_order` grid (steps down, ranks across). An
// overlapped forward-backward is one field, `(0F3;3B1)OVERLAP_F_B`, in both directions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "action.hpp"

namespace hetmesh::pipeline {

/// The schedule as PyTorch CSV text: row r holds rank r's actions. Pure; O(actions).
[[nodiscard]] inline std::string to_csv(const schedule& s) {
  std::string out;
  for (const auto& row : s.ranks) {
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (i != 0) out += ',';
      out += to_text(row[i]);
    }
    out += "\r\n";  // csv.writer's default line terminator
  }
  return out;
}

/// Parses PyTorch CSV text into a schedule. Row r is rank r; empty fields (PyTorch's None) are skipped.
/// The stage-to-rank map, stage count and micro-batch count are inferred from the compute actions, as
/// PyTorch's `_validate_schedule` infers them; a stage seen on two ranks is an error naming both.
/// `name` labels the result. Throws invalid_argument on malformed text. Pure; O(length).
[[nodiscard]] inline schedule from_csv(std::string_view text, std::string name = "csv") {
  schedule s;
  s.name = std::move(name);
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::vector<action> row;
    std::size_t f = 0;
    while (f <= line.size()) {
      std::size_t comma = line.find(',', f);
      if (comma == std::string_view::npos) comma = line.size();
      std::string_view field = line.substr(f, comma - f);
      if (field.find_first_not_of(" \t") != std::string_view::npos) {
        try {
          row.push_back(parse_action(field));
        } catch (error& e) {
          e.add_context(hetmesh::format("pipeline CSV row {} (rank {}) field {}", s.ranks.size(),
                                        s.ranks.size(), row.size()));
          throw;
        }
      }
      f = comma + 1;
    }
    s.ranks.push_back(std::move(row));
  }
  int max_stage = -1, max_mb = -1, max_shard = -1;
  for (const auto& row : s.ranks)
    for (const auto& whole : row)
      for (const action& a : parts(whole)) {  // an OVERLAP_F_B names two stages and micro-batches
        if (a.type == action_type::encoder_forward || a.type == action_type::encoder_backward ||
            a.type == action_type::send_ef || a.type == action_type::recv_eb ||
            a.type == action_type::recv_ef || a.type == action_type::send_eb) {
          max_shard = std::max(max_shard, a.stage);
        } else {
          max_stage = std::max(max_stage, a.stage);
        }
        max_mb = std::max(max_mb, a.microbatch);
      }
  // Every stage, encoder shard and micro-batch up to the largest named must run at least one action, so
  // none can exceed the number of actions: refuse "0F959319657" before sizing tables by it.
  std::int64_t actions = 0;  // an overlapped F+B counts as its two halves
  for (const auto& row : s.ranks)
    for (const auto& a : row) actions += parts(a).count;
  for (const auto& [what, top] : {std::pair{"stage", max_stage}, std::pair{"encoder shard", max_shard},
                                  std::pair{"micro-batch", max_mb}})
    if (top >= actions)
      throw_error<invalid_argument>(
          "pipeline CSV: {} {} named, but the CSV has only {} action(s); expected {}s numbered from 0 with "
          "each one run",
          what, top, actions, what);
  s.num_stages = max_stage + 1;
  s.num_microbatches = max_mb + 1;
  s.stage_to_rank.assign(static_cast<std::size_t>(s.num_stages), -1);
  s.encoder_shard_to_rank.assign(static_cast<std::size_t>(max_shard + 1), -1);
  int llm_ranks = 0;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    for (const auto& whole : s.ranks[r]) {
      for (const action& a : parts(whole)) {
        std::vector<int>* map = nullptr;
        const char* what = "stage";
        if (a.type == action_type::forward || a.type == action_type::backward ||
            a.type == action_type::backward_input || a.type == action_type::backward_weight) {
          map = &s.stage_to_rank;
          llm_ranks = std::max(llm_ranks, static_cast<int>(r) + 1);
        } else if (a.type == action_type::encoder_forward || a.type == action_type::encoder_backward) {
          map = &s.encoder_shard_to_rank;
          what = "encoder shard";
        }
        if (map == nullptr) continue;
        int& owner = (*map)[static_cast<std::size_t>(a.stage)];
        if (owner == -1) owner = static_cast<int>(r);
        if (owner != static_cast<int>(r))
          throw_error<invalid_argument>(
              "pipeline CSV: {} {} appears on rank {} (action {}) and on rank {}; expected every {} on one "
              "rank",
              what, a.stage, r, to_text(whole), owner, what);
      }
    }
  }
  for (int st = 0; st < s.num_stages; ++st)
    if (s.stage_to_rank[static_cast<std::size_t>(st)] < 0)
      throw_error<invalid_argument>(
          "pipeline CSV: stage {} has no compute action on any rank; expected stages 0..{} each to run F", st,
          s.num_stages - 1);
  for (std::size_t e = 0; e < s.encoder_shard_to_rank.size(); ++e)
    if (s.encoder_shard_to_rank[e] < 0)
      throw_error<invalid_argument>(
          "pipeline CSV: encoder shard {} is named by a transfer but runs no EF/EB; expected EF on its rank",
          e);
  s.num_ranks = llm_ranks;
  return s;
}

/// The compute actions of one rank, space separated ("0F0 0F1 0B0 ..."): what `hetmesh-plan pipeline`
/// prints. Communication actions are left out. Pure.
[[nodiscard]] inline std::string compute_text(const schedule& s, int rank) {
  std::string out;
  for (const auto& a : s.ranks.at(static_cast<std::size_t>(rank))) {
    if (!is_compute(a.type) && a.type != action_type::reduce_grad) continue;
    if (!out.empty()) out += ' ';
    out += to_text(a);
  }
  return out;
}

/// PyTorch's `_format_pipeline_order` grid: a header of "Rank r" columns, then one "Step k:" row per
/// position, each cell the rank's k-th action (empty when the rank has fewer). Pure; O(actions).
[[nodiscard]] inline std::string format_pipeline_order(const schedule& s) {
  std::size_t steps = 0;
  for (const auto& r : s.ranks) steps = std::max(steps, r.size());
  const std::size_t nr = s.ranks.size();
  const std::size_t label_digits = hetmesh::format("{}", steps == 0 ? 0 : steps - 1).size();
  std::vector<std::string> step_labels(steps);
  for (std::size_t i = 0; i < steps; ++i) step_labels[i] = hetmesh::format("Step {:0>{}}", i, label_digits);
  std::vector<std::vector<std::string>> cells(nr, std::vector<std::string>(steps));
  for (std::size_t r = 0; r < nr; ++r)
    for (std::size_t i = 0; i < s.ranks[r].size(); ++i) cells[r][i] = to_text(s.ranks[r][i]);
  // PyTorch sizes rank r's column by the longest of its actions and the step label.
  const std::size_t label_width = steps == 0 ? 5 : step_labels[0].size();
  std::vector<std::size_t> width(nr, label_width);
  for (std::size_t r = 0; r < nr; ++r)
    for (std::size_t i = 0; i < steps; ++i) width[r] = std::max(width[r], cells[r][i].size());
  std::string out(label_width + 2, ' ');
  for (std::size_t r = 0; r < nr; ++r) {
    if (r != 0) out += ' ';
    out += hetmesh::format("{:<{}}", hetmesh::format("Rank {}", r), width[r]);
  }
  out += '\n';
  for (std::size_t i = 0; i < steps; ++i) {
    out += step_labels[i] + ": ";
    for (std::size_t r = 0; r < nr; ++r) {
      if (r != 0) out += ' ';
      out += hetmesh::format("{:<{}}", cells[r][i], width[r]);
    }
    out += '\n';
  }
  return out;
}

}  // namespace hetmesh::pipeline
