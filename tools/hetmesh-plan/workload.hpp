// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan: workload files. A workload is the metadata of one global batch: per sample, its text
// tokens and the LLM tokens of its encoder items. Two line formats are accepted (not mixed in a file):
//
//   plain:  one positive integer per line, the sample's length in tokens        4096
//   JSONL:  one object per line                       {"id": 7, "text": 900, "images": [576, 576], "audio":
//   [750]}
//
// Blank lines and lines starting with '#' are skipped; plain lines follow balance::parse_length_line.
// Lines, samples and token counts are bounded (max_sample_tokens and below).
// Every problem is a hetmesh::data_error that names the file, the line number and what was expected.
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/balance/workload.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/files.hpp>
#include <hetmesh/core/json_file.hpp>
#include <hetmesh/core/lines.hpp>

namespace hetmesh_plan {

/// One sample of a workload. `llm_tokens()` is the length of its LLM sequence: text plus the LLM
/// tokens every encoder item turns into.
struct sample {
  std::string id;  // the JSONL "id" as text, or the 0-based line index of a plain file
  std::int64_t text = 0;
  std::vector<std::int64_t> images;
  std::vector<std::int64_t> audio;

  [[nodiscard]] std::int64_t llm_tokens() const {
    // Each count is at most max_sample_tokens and the sum is checked on parsing: no overflow here.
    return text + std::accumulate(images.begin(), images.end(), std::int64_t{0}) +
           std::accumulate(audio.begin(), audio.end(), std::int64_t{0});
  }
};

/// A parsed workload file.
struct workload {
  std::string path;
  bool multimodal = false;  // JSONL input
  std::vector<sample> samples;

  [[nodiscard]] std::vector<std::int64_t> lengths() const {
    std::vector<std::int64_t> out;
    out.reserve(samples.size());
    for (const auto& s : samples) out.push_back(s.llm_tokens());
    return out;
  }
  [[nodiscard]] std::int64_t total_tokens() const {
    std::int64_t t = 0;  // bounded by max_total_tokens on parsing
    for (const auto& s : samples) t += s.llm_tokens();
    return t;
  }
};

/// Limits of a workload, stated up front: one sample of at most 2^40 tokens (a trillion), at most 2^24
/// samples, at most 2^50 tokens in all, lines of at most 1 MiB. Past them the planners' sums and the
/// modelled times stop meaning anything (or stop fitting int64), and a file without newlines
/// (/dev/zero) would be read whole.
inline constexpr std::int64_t max_sample_tokens = std::int64_t{1} << 40;
inline constexpr std::size_t max_samples = std::size_t{1} << 24;
inline constexpr std::int64_t max_total_tokens = std::int64_t{1} << 50;

namespace detail {

[[noreturn]] inline void bad_line(const std::string& path, std::size_t line, const std::string& what) {
  hetmesh::throw_error<hetmesh::data_error>("{}:{}: {}", path, line, what);
}

[[nodiscard]] inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A token count from JSON: an integer >= 0 (a float such as 576.0 is rejected: lengths are counts).
[[nodiscard]] inline std::int64_t json_count(const nlohmann::json& v, const std::string& path,
                                             std::size_t line, std::string_view key) {
  if (!v.is_number_integer()) {
    bad_line(path, line,
             fmt::format("\"{}\" is {}; expected a non-negative integer token count", key, v.dump()));
  }
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(max_sample_tokens))
    bad_line(path, line,
             fmt::format("\"{}\" is {}; expected at most {} tokens", key, v.dump(), max_sample_tokens));
  const auto n = v.get<std::int64_t>();
  if (n < 0) bad_line(path, line, fmt::format("\"{}\" is {}; expected a non-negative token count", key, n));
  if (n > max_sample_tokens)
    bad_line(path, line, fmt::format("\"{}\" is {}; expected at most {} tokens", key, n, max_sample_tokens));
  return n;
}

[[nodiscard]] inline std::vector<std::int64_t> json_counts(const nlohmann::json& v, const std::string& path,
                                                           std::size_t line, std::string_view key) {
  if (!v.is_array()) {
    bad_line(path, line,
             fmt::format("\"{}\" is {}; expected an array of token counts like [576, 576]", key, v.dump()));
  }
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto n = json_count(v[i], path, line, fmt::format("{}[{}]", key, i));
    if (n == 0)
      bad_line(path, line, fmt::format("\"{}[{}]\" is 0; expected an encoder item of >= 1 token", key, i));
    out.push_back(n);
  }
  return out;
}

[[nodiscard]] inline sample parse_jsonl_line(std::string_view text, const std::string& path,
                                             std::size_t line) {
  // Depth-limited (core/json_file.hpp): "[[[[..." 100000 deep is refused, not a stack overflow.
  const nlohmann::json j =
      hetmesh::parse_json_bounded(text, path, hetmesh::json_max_depth, static_cast<std::int64_t>(line));
  if (!j.is_object()) bad_line(path, line, "expected a JSON object like {\"id\": 0, \"text\": 1024}");
  sample s;
  bool has_text = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "id") {
      if (it->is_string()) {
        s.id = it->get<std::string>();
      } else if (it->is_number_integer()) {
        s.id = it->dump();
      } else {
        bad_line(path, line, fmt::format("\"id\" is {}; expected a string or an integer", it->dump()));
      }
    } else if (key == "text") {
      s.text = json_count(*it, path, line, "text");
      has_text = true;
    } else if (key == "images") {
      s.images = json_counts(*it, path, line, "images");
    } else if (key == "audio") {
      s.audio = json_counts(*it, path, line, "audio");
    } else if (key != "source") {
      // Unknown keys are refused: a misspelt "image" would otherwise silently drop encoder work.
      bad_line(path, line,
               fmt::format("unknown key \"{}\"; expected only id, text, images, audio, source", key));
    }
  }
  if (!has_text) bad_line(path, line, "missing \"text\"; expected the sample's text token count");
  std::int64_t tokens = s.text;
  for (const auto* v : {&s.images, &s.audio})
    for (const auto n : *v) {
      tokens += n;  // each <= 2^40 and at most 2^20 items a line: no overflow before the check
      if (tokens > max_sample_tokens)
        bad_line(path, line,
                 fmt::format("the sample has more than {} LLM tokens (text + items); expected at most {}",
                             max_sample_tokens, max_sample_tokens));
    }
  if (s.llm_tokens() == 0) bad_line(path, line, "the sample has no tokens; expected text + items >= 1");
  return s;
}

}  // namespace detail

/// Parses a workload from `in`; `path` names it in errors. Throws hetmesh::data_error.
[[nodiscard]] inline workload parse_workload(std::istream& in, const std::string& path) {
  workload w;
  w.path = path;
  std::string raw;
  std::size_t line = 0;
  int kind = 0;  // 0 unknown, 1 plain, 2 JSONL
  std::int64_t total = 0;
  while (hetmesh::read_line_bounded(in, raw, hetmesh::short_line_bytes, path, line + 1)) {
    ++line;
    const auto text = detail::trim(raw);
    if (text.empty() || text.front() == '#') continue;
    const int this_kind = text.front() == '{' ? 2 : 1;
    if (kind != 0 && this_kind != kind) {
      detail::bad_line(path, line,
                       kind == 1 ? "a JSON object in a file of plain lengths; expected one integer per line"
                                 : "a plain value in a JSONL file; expected one JSON object per line");
    }
    kind = this_kind;
    if (kind == 2) {
      auto s = detail::parse_jsonl_line(text, path, line);
      if (s.id.empty()) s.id = std::to_string(w.samples.size());
      w.samples.push_back(std::move(s));
    } else {
      // The same line rule (and messages) as every other reader of length lists.
      const auto n = hetmesh::balance::parse_length_line(text, path, line);
      if (*n > max_sample_tokens)
        detail::bad_line(path, line,
                         fmt::format("length {}; expected at most {} tokens", *n, max_sample_tokens));
      w.samples.push_back({std::to_string(w.samples.size()), *n, {}, {}});
    }
    total += w.samples.back().llm_tokens();  // <= 2^50 + 2^40: no overflow
    if (total > max_total_tokens)
      detail::bad_line(path, line,
                       fmt::format("the workload passes {} tokens in all; expected at most {}",
                                   max_total_tokens, max_total_tokens));
    if (w.samples.size() > max_samples)
      detail::bad_line(path, line,
                       fmt::format("more than {} samples; expected at most {}", max_samples, max_samples));
  }
  if (in.bad()) hetmesh::throw_error<hetmesh::data_error>("{}: read error after line {}", path, line);
  if (w.samples.empty()) {
    hetmesh::throw_error<hetmesh::data_error>("{}: no samples; expected one length per line or JSONL objects",
                                              path);
  }
  w.multimodal = kind == 2;
  return w;
}

/// Reads a workload file: a regular file of at most 1 GiB (a directory, FIFO or device is refused by name).
/// Throws hetmesh::data_error when it cannot be opened, is refused, or cannot be parsed.
[[nodiscard]] inline workload read_workload(const std::string& path) {
  hetmesh::regular_file_stream in(path, hetmesh::large_file_bytes, "workload file");
  return parse_workload(in, path);
}

}  // namespace hetmesh_plan
