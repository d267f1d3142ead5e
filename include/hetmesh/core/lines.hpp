// SPDX-License-Identifier: Apache-2.0
// hetmesh: line readers with a bound. std::getline grows its string until it meets '\n', so a file
// without one (/dev/zero, a binary file given by mistake) is read whole into memory before any check can
// refuse it. Every reader of untrusted line-oriented input (length lists, workloads, JSONL) reads through
// read_line_bounded instead, which refuses a line past its bound with the file, the line and the bound.
#pragma once

#include <cstddef>
#include <istream>
#include <string>
#include <string_view>

#include "../config.hpp"
#include "error.hpp"

namespace hetmesh {

/// The line bound of readers whose lines are short by nature (a length, a small JSON object): 1 MiB.
inline constexpr std::size_t short_line_bytes = std::size_t{1} << 20;

/// Reads the next line of `in` into `line` (without its '\n'), as std::getline does, but reads at most
/// `max_bytes` bytes of it. Returns false (and sets eofbit) when `in` is at its end with no line left.
/// Throws data_error "FILE:LINE: line longer than N bytes; expected ..." naming `file`, `line_no` (the
/// number of the line being read) and the bound when the line is longer. O(line size); reads only `in`.
[[nodiscard]] HETMESH_COMPILED bool read_line_bounded(std::istream& in, std::string& line,
                                                      std::size_t max_bytes, std::string_view file,
                                                      std::size_t line_no);

}  // namespace hetmesh

#if HETMESH_BODIES

namespace hetmesh {

HETMESH_COMPILED bool read_line_bounded(std::istream& in, std::string& line, std::size_t max_bytes,
                                        std::string_view file, std::size_t line_no) {
  line.clear();
  auto* buf = in.rdbuf();
  if (buf == nullptr || !in.good()) {
    in.setstate(std::ios::failbit);
    return false;
  }
  bool any = false;
  for (;;) {
    const auto c = buf->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(any ? std::ios::eofbit : std::ios::eofbit | std::ios::failbit);
      return any;
    }
    any = true;
    if (c == '\n') return true;
    if (line.size() >= max_bytes)
      throw_error<data_error>(
          "{}:{}: line longer than {} bytes; expected lines of at most {} bytes (is this the "
          "right file?)",
          file, line_no, max_bytes, max_bytes);
    line.push_back(static_cast<char>(c));
  }
}

}  // namespace hetmesh
#endif  // HETMESH_BODIES
