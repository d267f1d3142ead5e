// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: text import and export of schedules. The CSV form is PyTorch's (`_dump_csv` /
// `_load_csv`): one row per rank, the rank's actions comma-separated in order, empty fields for idle
// steps; a lowered schedule also in the "compute_comms" form PyTorch's runtime loads (with its send and
// reduction waits). The table form is PyTorch's `_format_pipeline_order` grid (steps down, ranks across).
// An overlapped forward-backward is one field, `(0F3;3B1)OVERLAP_F_B`, in both directions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "action.hpp"

namespace hetmesh::pipeline {

/// The schedule as PyTorch CSV text: row r holds rank r's actions. Pure; O(actions).
[[nodiscard]] HETMESH_COMPILED std::string to_csv(const schedule& s)
#if HETMESH_BODIES
{
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
#else
    ;
#endif

namespace detail {

/// True when `field` is one of the actions of PyTorch's runtime that carry no data dependency of their
/// own: WAIT_SEND_F / WAIT_SEND_B (retire a send), WAIT_REDUCE_GRAD (retire a REDUCE_GRAD), UNSHARD /
/// RESHARD (FSDP). hetmesh's IR derives the first three from the schedule and has no FSDP, so from_csv
/// skips them; to_compute_comms_csv writes the waits. The text must have the action form
/// `<stage><TYPE>[<microbatch>]`.
[[nodiscard]] HETMESH_COMPILED bool is_pytorch_runtime_marker(std::string_view field) noexcept
#if HETMESH_BODIES
{
  while (!field.empty() && (field.front() == ' ' || field.front() == '\t')) field.remove_prefix(1);
  while (!field.empty() && (field.back() == ' ' || field.back() == '\t' || field.back() == '\r'))
    field.remove_suffix(1);
  std::size_t i = 0;
  while (i < field.size() && field[i] >= '0' && field[i] <= '9') ++i;
  if (i == 0) return false;
  std::size_t j = i;
  while (j < field.size() && ((field[j] >= 'A' && field[j] <= 'Z') || field[j] == '_')) ++j;
  for (std::size_t k = j; k < field.size(); ++k)
    if (field[k] < '0' || field[k] > '9') return false;
  const std::string_view type = field.substr(i, j - i);
  const bool needs_mb = type == "WAIT_SEND_F" || type == "WAIT_SEND_B";
  const bool no_mb = type == "WAIT_REDUCE_GRAD" || type == "UNSHARD" || type == "RESHARD";
  return (needs_mb && j < field.size()) || (no_mb && j == field.size());
}
#else
    ;
#endif

}  // namespace detail

/// A lowered schedule (compute, SEND/RECV, REDUCE_GRAD: add_send_recv's result, optionally after
/// add_reduce_grad) as CSV in the "compute_comms" form PyTorch's `_PipelineScheduleRuntime._load_csv`
/// reads and runs. PyTorch's runtime retires every send with a matching wait, so the waits are written
/// where PyTorch's own `_add_wait_send` puts them: `WAIT_SEND_F` of stage s, micro-batch m right after
/// the rank's first action after that send whose backward part (a B or I, or the backward half of an
/// OVERLAP_F_B) is (s, m); the other sends' waits at the end of the row in send order;
/// and `WAIT_REDUCE_GRAD` right after each `REDUCE_GRAD`. No UNSHARD/RESHARD (those are for FSDP
/// stages, which this CSV does not prepare). Throws invalid_argument when the schedule holds encoder
/// actions (PyTorch has none). Pure; O(actions * sends in flight).
[[nodiscard]] HETMESH_COMPILED std::string to_compute_comms_csv(const schedule& s)
#if HETMESH_BODIES
{
  std::string out;
  std::vector<action> pending;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    pending.clear();
    bool first = true;
    auto put = [&](std::string_view text) {
      if (!first) out += ',';
      out += text;
      first = false;
    };
    for (const auto& a : s.ranks[r]) {
      if (a.type == action_type::encoder_forward || a.type == action_type::encoder_backward ||
          a.type == action_type::send_ef || a.type == action_type::recv_ef ||
          a.type == action_type::send_eb || a.type == action_type::recv_eb)
        throw_error<invalid_argument>(
            "pipeline to_compute_comms_csv({}): rank {} runs the encoder action {}, which PyTorch's runtime "
            "does not have; expected a schedule of F, B, I, W, SEND/RECV and REDUCE_GRAD actions",
            s.name, r, to_text(a));
      put(to_text(a));
      if (a.type == action_type::send_f || a.type == action_type::send_b) pending.push_back(a);
      if (a.type == action_type::reduce_grad) put(hetmesh::format("{}WAIT_REDUCE_GRAD", a.stage));
      // Each backward half of the action (the action itself, or an OVERLAP_F_B's B) retires the forward
      // send of its (stage, micro-batch), in the order of the halves.
      for (const action& p : parts(a)) {
        if (p.type != action_type::backward && p.type != action_type::backward_input) continue;
        const auto it =
            std::find(pending.begin(), pending.end(), action{p.stage, action_type::send_f, p.microbatch});
        if (it != pending.end()) {
          put(hetmesh::format("{}WAIT_SEND_F{}", p.stage, p.microbatch));
          pending.erase(it);
        }
      }
    }
    for (const auto& p : pending)
      put(hetmesh::format("{}WAIT_SEND_{}{}", p.stage, p.type == action_type::send_f ? 'F' : 'B',
                          p.microbatch));
    out += "\r\n";
  }
  return out;
}
#else
    ;
#endif

/// Parses PyTorch CSV text into a schedule. Row r is rank r; empty fields (PyTorch's None) are skipped,
/// and so are PyTorch's runtime markers WAIT_SEND_F, WAIT_SEND_B, WAIT_REDUCE_GRAD, UNSHARD and RESHARD
/// (see detail::is_pytorch_runtime_marker), so the compute_comms CSV of to_compute_comms_csv or of
/// PyTorch's `_dump_csv` reads back as its compute, send/receive and REDUCE_GRAD actions.
/// The stage-to-rank map, stage count and micro-batch count are inferred from the compute actions, as
/// PyTorch's `_validate_schedule` infers them; a stage seen on two ranks is an error naming both.
/// `name` labels the result. Throws invalid_argument on malformed text. Pure; O(length).
[[nodiscard]] HETMESH_COMPILED schedule from_csv(std::string_view text, std::string name = "csv")
#if HETMESH_BODIES
{
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
      if (field.find_first_not_of(" \t") != std::string_view::npos &&
          !detail::is_pytorch_runtime_marker(field)) {
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
#else
    ;
#endif

/// The compute actions of one rank, space separated ("0F0 0F1 0B0 ..."): what `hetmesh-plan pipeline`
/// prints. Communication actions are left out. Pure.
[[nodiscard]] HETMESH_COMPILED std::string compute_text(const schedule& s, int rank)
#if HETMESH_BODIES
{
  std::string out;
  for (const auto& a : s.ranks.at(static_cast<std::size_t>(rank))) {
    if (!is_compute(a.type) && a.type != action_type::reduce_grad) continue;
    if (!out.empty()) out += ' ';
    out += to_text(a);
  }
  return out;
}
#else
    ;
#endif

/// PyTorch's `_format_pipeline_order` grid: a header of "Rank r" columns, then one "Step k:" row per
/// position, each cell the rank's k-th action (empty when the rank has fewer). Pure; O(actions).
[[nodiscard]] HETMESH_COMPILED std::string format_pipeline_order(const schedule& s)
#if HETMESH_BODIES
{
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
#else
    ;
#endif

}  // namespace hetmesh::pipeline
