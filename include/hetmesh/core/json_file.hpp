// SPDX-License-Identifier: Apache-2.0
// hetmesh: JSON from outside, read with a nesting-depth limit and a size limit (issue 37). Input nested
// 100000 levels deep ("[[[[...") overflowed the stack of the parser's recursion and of the value's
// destruction; here the depth is counted by a pre-scan of the brackets outside strings (O(bytes), no
// allocation) and refused before nlohmann-json builds anything. Errors are data_error naming the file (or
// the caller's label) and the line. Kept out of the umbrellas: nlohmann/json.hpp is slow to compile
// (docs/compile-time.md), so only the readers of JSON include this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "error.hpp"
#include "files.hpp"

namespace hetmesh {

/// The nesting limit of JSON read from outside: 128 levels of objects and arrays (the deepest file the
/// library reads nests 4).
inline constexpr int json_max_depth = 128;

/// Throws data_error "WHERE:LINE: JSON nested deeper than MAX levels; expected at most MAX" when the
/// brackets of `text` (outside strings) nest deeper than `max_depth`. `first_line` is the number of the
/// text's first line in its file (JSONL passes the line's number). Malformed text is left to the parser.
/// O(bytes); no allocation.
inline void check_json_depth(std::string_view text, std::string_view where, int max_depth = json_max_depth,
                             std::int64_t first_line = 1) {
  int depth = 0;
  bool in_string = false, escaped = false;
  std::int64_t line = first_line;
  for (const char c : text) {
    if (c == '\n') ++line;
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw_error<data_error>("{}:{}: JSON nested deeper than {} levels; expected at most {} levels", where,
                                line, max_depth, max_depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

namespace detail {
/// The line of byte `byte` (1-based, as nlohmann counts; 0 or past the end: the last byte) of `text`.
[[nodiscard]] inline std::int64_t json_line_at(std::string_view text, std::size_t byte,
                                               std::int64_t first_line) {
  std::int64_t line = first_line;
  const std::size_t end = byte > 0 && byte - 1 < text.size() ? byte - 1 : text.size();
  for (std::size_t i = 0; i < end; ++i) line += text[i] == '\n' ? 1 : 0;
  return line;
}

/// A SAX handler of nlohmann-json that builds nothing and records the byte at which the parser stopped:
/// for the errors that carry no position (out_of_range 406, a number too large for a double).
template <class Json>
struct json_stop_position {
  std::size_t byte = 0;  ///< Where the parser reported its error (0: none).
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(typename Json::number_integer_t) { return true; }
  bool number_unsigned(typename Json::number_unsigned_t) { return true; }
  bool number_float(typename Json::number_float_t, const typename Json::string_t&) { return true; }
  bool string(typename Json::string_t&) { return true; }
  bool binary(typename Json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool key(typename Json::string_t&) { return true; }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t position, const std::string&, const typename Json::exception&) {
    byte = position;
    return false;
  }
};

/// nlohmann's message without its "[json.exception.KIND.ID] " prefix.
[[nodiscard]] inline std::string json_reason(const char* what) {
  std::string reason = what;
  if (const auto p = reason.find("] "); p != std::string::npos) reason = reason.substr(p + 2);
  return reason;
}
}  // namespace detail

/// Parses `text` as one JSON document of at most `max_depth` levels (check_json_depth). A syntax error, or
/// a number too large for a double ("1e999"), is a data_error "WHERE:LINE: invalid JSON (REASON)" with
/// nlohmann's reason; never a json::exception. `Json` is nlohmann::json or nlohmann::ordered_json.
/// O(bytes).
template <class Json = nlohmann::json>
[[nodiscard]] Json parse_json_bounded(std::string_view text, std::string_view where,
                                      int max_depth = json_max_depth, std::int64_t first_line = 1) {
  check_json_depth(text, where, max_depth, first_line);
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw_error<data_error>("{}:{}: invalid JSON ({})", where, detail::json_line_at(text, e.byte, first_line),
                            detail::json_reason(e.what()));
  } catch (const nlohmann::json::exception& e) {
    // Only parse_error carries the byte: a second pass over the text, building nothing, finds it.
    detail::json_stop_position<Json> stop;
    (void)Json::sax_parse(text, &stop);
    throw_error<data_error>("{}:{}: invalid JSON ({})", where,
                            detail::json_line_at(text, stop.byte, first_line), detail::json_reason(e.what()));
  }
}

/// The JSON document in the regular file `path`: read_regular_file (refuses a directory, FIFO, socket or
/// device, and a file over `max_bytes`), then parse_json_bounded. `what` names the file's role in errors
/// ("mixture", "data checkpoint"). Not collective; O(bytes).
template <class Json = nlohmann::json>
[[nodiscard]] Json read_json_file(const std::string& path, std::string_view what,
                                  std::int64_t max_bytes = small_file_bytes, int max_depth = json_max_depth) {
  const std::string text = read_regular_file(path, max_bytes, what);
  return parse_json_bounded<Json>(text, path, max_depth);
}

}  // namespace hetmesh
