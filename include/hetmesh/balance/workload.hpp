// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: length lists, the plainest workload: one sequence length (tokens) per line, as in
// ProLong's document lengths or a trace exported from a data plane. Blank lines and lines starting
// with '#' are skipped. hetmesh-plan, the benchmarks and the tests read them here, so a file is read
// the same way (and fails with the same message) everywhere; sample_batch turns one into a batch.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <istream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../config.hpp"
#include "../core/checked.hpp"
#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/lines.hpp"
#include "../core/random.hpp"
#include "../seq/types.hpp"

namespace hetmesh::balance {

/// One line of a length list. Returns nullopt for a blank line or a '#' comment (surrounding spaces,
/// tabs and carriage returns ignored), else the length: one positive decimal integer ("+8" accepted).
/// Throws data_error "FILE:LINE: ..." naming what was found and what was expected when the line is
/// not a positive integer in int64 range. `file` and `line_no` only name the place in errors.
/// Pure; O(line size). Not collective.
[[nodiscard]] HETMESH_COMPILED std::optional<std::int64_t> parse_length_line(std::string_view line,
                                                                             std::string_view file,
                                                                             std::size_t line_no);

/// Every length of the list read from `in`, in file order; `file` names it in errors.
/// Throws data_error as parse_length_line does, on a line longer than 1 MiB (short_line_bytes), on a read
/// error, and when the list holds no length;
/// overflow_error naming the file and line when the lengths' total leaves int64 (planners sum them).
/// Pure apart from reading `in`; O(bytes). Not collective.
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> read_lengths(std::istream& in,
                                                                      std::string_view file);

/// The length list in `file`, a regular file of at most 1 GiB (core/files.hpp: a directory, FIFO or
/// device is refused by name). Throws data_error when it cannot be opened or is refused, and as
/// read_lengths(istream). O(bytes). Not collective.
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> read_lengths(const std::filesystem::path& file);

/// A batch of about `tokens` tokens drawn with replacement from `lengths` (an empirical length
/// distribution): uniform draws until the total reaches `tokens`; ids 0..n-1 in draw order.
/// Pre: `lengths` non-empty (else invalid_argument) and positive. Post: the total is >= tokens and
/// less than tokens + the longest length. Deterministic in `seed`; O(result). Not collective.
[[nodiscard]] HETMESH_COMPILED std::vector<seq::seq_desc> sample_batch(std::span<const std::int64_t> lengths,
                                                                       std::int64_t tokens,
                                                                       std::uint64_t seed);

}  // namespace hetmesh::balance

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED std::optional<std::int64_t> parse_length_line(std::string_view line, std::string_view file,
                                                               std::size_t line_no) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!line.empty() && blank(line.front())) line.remove_prefix(1);
  while (!line.empty() && blank(line.back())) line.remove_suffix(1);
  if (line.empty() || line.front() == '#') return std::nullopt;
  const char* first = line.data();
  const char* last = line.data() + line.size();
  if (*first == '+') ++first;
  std::int64_t n = 0;
  const auto [ptr, ec] = std::from_chars(first, last, n);
  if (ec != std::errc{} || ptr != last)
    throw_error<data_error>("{}:{}: '{}{}' is not a length; expected one positive integer per line", file,
                            line_no, line.substr(0, 80), line.size() > 80 ? "..." : "");
  if (n <= 0) throw_error<data_error>("{}:{}: length {}; expected a positive token count", file, line_no, n);
  return n;
}

HETMESH_COMPILED std::vector<std::int64_t> read_lengths(std::istream& in, std::string_view file) {
  std::vector<std::int64_t> out;
  std::string raw;
  std::size_t line = 0;
  std::int64_t total = 0;
  while (read_line_bounded(in, raw, short_line_bytes, file, line + 1))
    if (const auto n = parse_length_line(raw, file, ++line)) {
      total = checked_add(total, *n, hetmesh::format("{}:{}: the total of the lengths", file, line));
      out.push_back(*n);
    }
  if (in.bad()) throw_error<data_error>("{}: read error after line {}", file, line);
  if (out.empty()) throw_error<data_error>("{}: no lengths; expected one positive integer per line", file);
  return out;
}

HETMESH_COMPILED std::vector<std::int64_t> read_lengths(const std::filesystem::path& file) {
  regular_file_stream in(file.string(), large_file_bytes, "length list");
  return read_lengths(in, file.string());
}

HETMESH_COMPILED std::vector<seq::seq_desc> sample_batch(std::span<const std::int64_t> lengths,
                                                         std::int64_t tokens, std::uint64_t seed) {
  if (lengths.empty()) throw_error<invalid_argument>("balance::sample_batch: no lengths to draw from");
  for (std::size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] <= 0)
      throw_error<invalid_argument>(
          "balance::sample_batch: lengths[{}] = {}; expected a positive token count", i, lengths[i]);
  rng g(seed);
  std::vector<seq::seq_desc> out;
  std::int64_t total = 0;
  while (total < tokens) {
    const auto l = lengths[static_cast<std::size_t>(g.below(lengths.size()))];
    out.push_back({static_cast<std::int64_t>(out.size()), l});
    total = checked_add(total, l, "balance::sample_batch: the batch's total tokens");
  }
  return out;
}

}  // namespace hetmesh::balance
#endif  // HETMESH_BODIES
