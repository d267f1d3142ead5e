// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: timelines for people. `chrome_trace` (trace_json.hpp) writes the Chrome trace event JSON
// that Perfetto (ui.perfetto.dev) and chrome://tracing open: one track per rank, one complete ("X") event per
// action. `ascii_timeline` draws the same step in a terminal: one row per rank, one character per time
// slot (F forward, B backward, I input-backward, W weight-backward, X overlapped forward-backward, e/b
// encoder forward/backward, '.' idle). `svg_timeline` draws it as an SVG picture: one lane per rank, one box
// per compute action (coloured by type, labelled with its micro-batch where it fits), communication as thin
// grey bars.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "action.hpp"
#include "io.hpp"
#include "lower.hpp"
#include "simulate.hpp"

namespace hetmesh::pipeline {

namespace detail {
inline char timeline_glyph(action_type t) {
  switch (t) {
    case action_type::forward:
      return 'F';
    case action_type::backward:
      return 'B';
    case action_type::backward_input:
      return 'I';
    case action_type::backward_weight:
      return 'W';
    case action_type::encoder_forward:
      return 'e';
    case action_type::encoder_backward:
      return 'b';
    case action_type::reduce_grad:
      return 'R';
    case action_type::overlap_f_b:
      return 'X';
    default:
      return '~';
  }
}
}  // namespace detail

/// A terminal drawing of a timeline, `width` columns wide (at least 10; smaller values mean 10): a header
/// with the time scale, then one row per rank. Each action fills the slots it covers; a slot shows the action
/// that covers most of it. With `microbatch_digits`, an action's first slot shows its micro-batch number mod
/// 10 instead of its letter, which makes 1F1B patterns readable. Pure; O(width * ranks + actions).
[[nodiscard]] inline std::string ascii_timeline(const std::vector<timed_action>& timeline, int width = 100,
                                                bool microbatch_digits = false) {
  width = std::max(width, 10);
  double end = 0;
  int ranks = 0;
  for (const auto& t : timeline) {
    end = std::max(end, t.end);
    ranks = std::max(ranks, t.rank + 1);
  }
  if (ranks == 0 || end <= 0) return "(empty timeline)\n";
  const double slot = end / width;
  std::vector<std::string> rows(static_cast<std::size_t>(ranks),
                                std::string(static_cast<std::size_t>(width), '.'));
  std::vector<std::vector<double>> cover(static_cast<std::size_t>(ranks),
                                         std::vector<double>(static_cast<std::size_t>(width), 0.0));
  for (const auto& t : timeline) {
    if (t.end <= t.start) continue;
    const int first = std::clamp(static_cast<int>(std::floor(t.start / slot)), 0, width - 1);
    const int last = std::clamp(static_cast<int>(std::ceil(t.end / slot)) - 1, 0, width - 1);
    for (int k = first; k <= last; ++k) {
      const double lo = std::max(t.start, k * slot), hi = std::min(t.end, (k + 1) * slot);
      auto& c = cover[static_cast<std::size_t>(t.rank)][static_cast<std::size_t>(k)];
      if (hi - lo > c) {
        c = hi - lo;
        char g = detail::timeline_glyph(t.what.type);
        if (microbatch_digits && k == first && t.what.microbatch >= 0)
          g = static_cast<char>('0' + t.what.microbatch % 10);
        rows[static_cast<std::size_t>(t.rank)][static_cast<std::size_t>(k)] = g;
      }
    }
  }
  std::string out = hetmesh::format(
      "time 0 .. {:.6g} s, {:.3g} s per column; F fwd, B bwd, I bwd-input, W bwd-weight, "
      "e/b encoder fwd/bwd, . idle\n",
      end, slot);
  const int label = static_cast<int>(hetmesh::format("{}", ranks - 1).size());
  for (int r = 0; r < ranks; ++r)
    out += hetmesh::format("rank {:>{}} |{}|\n", r, label, rows[static_cast<std::size_t>(r)]);
  return out;
}

/// The text `hetmesh-plan pipeline --format F` prints for a schedule:
///   "actions"    each rank's compute actions in order, one line per rank ("rank 0: 0F0 0F1 ...");
///   "csv"        PyTorch's compute-only CSV (what its `_load_csv(format="compute_only")` reads);
///   "csv-comms"  PyTorch CSV of the schedule lowered with add_send_recv (compute + SEND/RECV);
///   "table"      PyTorch's `_format_pipeline_order` grid of the lowered schedule;
///   "ascii"      the timeline simulated at F=1, B=2, I=W=1 (transfers free), `width` columns.
/// Throws invalid_argument for other formats. Pure.
[[nodiscard]] inline std::string render(const schedule& s, std::string_view format, int width = 100) {
  if (format == "actions") {
    std::string out;
    for (int r = 0; r < s.total_ranks(); ++r) out += hetmesh::format("rank {}: {}\n", r, compute_text(s, r));
    return out;
  }
  if (format == "csv") return to_csv(strip_comm(s));
  if (format == "csv-comms") return to_csv(add_send_recv(s));
  if (format == "table") return format_pipeline_order(add_send_recv(s));
  if (format == "ascii") return ascii_timeline(simulate(s, uniform_costs{}.model()).timeline, width, true);
  throw_error<invalid_argument>(
      "pipeline render: unknown format \"{}\"; expected actions, csv, csv-comms, table or ascii", format);
}

namespace detail {
inline const char* timeline_colour(action_type t) {
  switch (t) {
    case action_type::forward:
      return "#4e79a7";
    case action_type::backward:
      return "#59a14f";
    case action_type::backward_input:
      return "#8cd17d";
    case action_type::backward_weight:
      return "#499894";
    case action_type::encoder_forward:
      return "#f28e2b";
    case action_type::encoder_backward:
      return "#b6992d";
    case action_type::reduce_grad:
      return "#e15759";
    case action_type::overlap_f_b:
      return "#b07aa1";
    default:
      return "#bab0ac";
  }
}
}  // namespace detail

/// An SVG picture of a timeline (simulated, or measured by run::execute_pipeline / train::gather_report),
/// `width` pixels wide (at least 200), titled `title` (XML-escaped): a time axis, one 22-pixel lane per
/// rank, compute actions as boxes coloured by type with their micro-batch number where the box is wide
/// enough, communication as thin grey bars, and a legend. Pure; O(actions + ranks).
[[nodiscard]] inline std::string svg_timeline(const std::vector<timed_action>& timeline,
                                              std::string_view title, int width = 900) {
  width = std::max(width, 200);
  double t0 = 0, end = 0;
  int ranks = 0;
  bool first = true;
  for (const auto& t : timeline) {
    t0 = first ? t.start : std::min(t0, t.start);
    end = first ? t.end : std::max(end, t.end);
    first = false;
    ranks = std::max(ranks, t.rank + 1);
  }
  const double span = end > t0 ? end - t0 : 1.0;
  constexpr int left = 60, top = 40, lane = 22, legend = 30;
  const double scale = static_cast<double>(width - left - 10) / span;
  std::string esc;
  for (char c : title) {
    if (c == '<')
      esc += "&lt;";
    else if (c == '>')
      esc += "&gt;";
    else if (c == '&')
      esc += "&amp;";
    else
      esc += c;
  }
  const int height = top + ranks * lane + legend + 10;
  std::string out = hetmesh::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"16\" font-size=\"13\">{}</text>\n",
      width, height, left, esc);
  for (int i = 0; i <= 4; ++i) {  // time axis in milliseconds
    const double x = left + (width - left - 10) * i / 4.0;
    out += hetmesh::format(
        "<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#ddd\"/><text x=\"{:.1f}\" y=\"{}\" "
        "text-anchor=\"middle\" fill=\"#555\">{:.3g} ms</text>\n",
        x, top - 4, x, top + ranks * lane, x, top - 8, span * 1e3 * i / 4.0);
  }
  for (int r = 0; r < ranks; ++r)
    out += hetmesh::format("<text x=\"4\" y=\"{}\">rank {}</text>\n", top + r * lane + 15, r);
  for (const auto& t : timeline) {
    const double x = left + (t.start - t0) * scale, w = std::max((t.end - t.start) * scale, 0.5);
    const int y = top + t.rank * lane;
    if (is_comm(t.what.type)) {
      out += hetmesh::format("<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"3\" fill=\"#bab0ac\"/>\n",
                             x, y + lane - 5, w);
      continue;
    }
    out += hetmesh::format(
        "<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"white\" "
        "stroke-width=\"0.5\"><title>{} rank {} {:.3f}-{:.3f} ms</title></rect>\n",
        x, y + 2, w, lane - 8, detail::timeline_colour(t.what.type), to_text(t.what), t.rank,
        (t.start - t0) * 1e3, (t.end - t0) * 1e3);
    if (t.what.type == action_type::overlap_f_b && w >= 28)  // both halves' micro-batches: "F/B"
      out +=
          hetmesh::format("<text x=\"{:.2f}\" y=\"{}\" text-anchor=\"middle\" fill=\"white\">{}/{}</text>\n",
                          x + w / 2, y + lane - 9, t.what.microbatch, t.what.backward_microbatch);
    else if (w >= 14 && t.what.microbatch >= 0)
      out += hetmesh::format("<text x=\"{:.2f}\" y=\"{}\" text-anchor=\"middle\" fill=\"white\">{}</text>\n",
                             x + w / 2, y + lane - 9, t.what.microbatch);
  }
  int lx = left;
  const int ly = top + ranks * lane + 12;
  for (auto [type, name] : {std::pair{action_type::forward, "forward"},
                            {action_type::backward, "backward"},
                            {action_type::backward_input, "backward (input)"},
                            {action_type::backward_weight, "backward (weight)"},
                            {action_type::encoder_forward, "encoder forward"},
                            {action_type::encoder_backward, "encoder backward"},
                            {action_type::overlap_f_b, "overlapped F+B"},
                            {action_type::send_f, "communication"}}) {
    out += hetmesh::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" "
        "y=\"{}\">{}</text>\n",
        lx, ly, detail::timeline_colour(type), lx + 14, ly + 9, name);
    lx += 14 + 7 * static_cast<int>(std::string_view(name).size()) + 12;
  }
  out += "</svg>\n";
  return out;
}

}  // namespace hetmesh::pipeline
