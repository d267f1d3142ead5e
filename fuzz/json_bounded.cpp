// SPDX-License-Identifier: Apache-2.0
// Fuzz target: JSON from outside (core/json_file.hpp parse_json_bounded). The input is the document's
// text. The reader must return a value nested at most json_max_depth levels, or throw data_error
// "WHERE:LINE: ..." naming the label and a line of the text. Any other exception (a json::exception
// escaping), a crash or a stack overflow is a finding. The first byte, when it is a control byte below
// 0x08, also selects a smaller depth limit (its value) so that the limit's edge is reached quickly.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <hetmesh/core/json_file.hpp>

namespace {

/// The nesting depth of `j` (a scalar is 0, [] is 1), counted without recursion.
int depth_of(const nlohmann::json& j) {
  int deepest = 0;
  std::vector<std::pair<const nlohmann::json*, int>> todo{{&j, 0}};
  while (!todo.empty()) {
    const auto [v, d] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, d + 1);
    for (const auto& child : *v) todo.emplace_back(&child, d + 1);
  }
  return deepest;
}

/// Whether `msg` is "fuzz.json:LINE: ..." with 1 <= LINE <= `lines`.
bool names_a_line(std::string_view msg, std::int64_t lines) {
  constexpr std::string_view label = "fuzz.json:";
  if (msg.substr(0, label.size()) != label) return false;
  std::size_t i = label.size();
  std::int64_t line = 0;
  while (i < msg.size() && msg[i] >= '0' && msg[i] <= '9' && line < lines + 1)
    line = line * 10 + (msg[i++] - '0');
  return i > label.size() && i < msg.size() && msg[i] == ':' && line >= 1 && line <= lines;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  int max_depth = hetmesh::json_max_depth;
  if (!text.empty() && static_cast<unsigned char>(text[0]) < 0x08) {
    max_depth = static_cast<unsigned char>(text[0]);
    text.remove_prefix(1);
  }
  std::int64_t lines = 1;
  for (const char c : text) lines += c == '\n' ? 1 : 0;
  try {
    const auto j = hetmesh::parse_json_bounded(text, "fuzz.json", max_depth);
    if (depth_of(j) > max_depth) __builtin_trap();
  } catch (const hetmesh::data_error& e) {
    if (!names_a_line(e.what(), lines)) __builtin_trap();
  }
  return 0;
}
