// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan: output. Every subcommand builds one nlohmann::json document (the JSON format is the
// contract; tables and CSV are views of the same numbers), and `--format` picks how it is printed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "args.hpp"

namespace hetmesh_plan {

using json = nlohmann::ordered_json;

/// The output formats a subcommand may offer.
enum class output_format { json, table, csv, ascii };

[[nodiscard]] inline std::string_view name_of(output_format f) {
  switch (f) {
    case output_format::json:
      return "json";
    case output_format::table:
      return "table";
    case output_format::csv:
      return "csv";
    case output_format::ascii:
      return "ascii";
  }
  return "json";
}

/// Reads `--format` and checks it is one the subcommand offers (`allowed`, first = default).
[[nodiscard]] inline output_format format_of(const parsed& args, std::span<const output_format> allowed) {
  const std::string& v = args.str("format");
  for (const auto f : allowed)
    if (name_of(f) == v) return f;
  std::vector<std::string_view> names;
  for (const auto f : allowed) names.push_back(name_of(f));
  usage_fail("option --format '{}': this subcommand prints one of {}", v, fmt::join(names, ", "));
}

namespace detail {

[[nodiscard]] inline bool is_scalar_array(const json& j) {
  return j.is_array() && std::all_of(j.begin(), j.end(), [](const json& e) { return e.is_primitive(); });
}

inline void write_json(std::ostream& os, const json& j, int indent) {
  // Arrays of scalars (token indices, action lists) stay on one line: they are long and a line per
  // element would bury the structure. Everything else is indented by two spaces per level.
  const std::string pad(static_cast<std::size_t>(indent) * 2, ' ');
  const std::string inner(static_cast<std::size_t>(indent + 1) * 2, ' ');
  if (j.is_object() && !j.empty()) {
    os << "{\n";
    std::size_t i = 0;
    for (auto it = j.begin(); it != j.end(); ++it, ++i) {
      os << inner << json(it.key()).dump() << ": ";
      write_json(os, it.value(), indent + 1);
      os << (i + 1 < j.size() ? ",\n" : "\n");
    }
    os << pad << "}";
  } else if (j.is_array() && !j.empty() && !is_scalar_array(j)) {
    os << "[\n";
    for (std::size_t i = 0; i < j.size(); ++i) {
      os << inner;
      write_json(os, j[i], indent + 1);
      os << (i + 1 < j.size() ? ",\n" : "\n");
    }
    os << pad << "]";
  } else if (j.is_array()) {
    os << "[";
    for (std::size_t i = 0; i < j.size(); ++i) os << (i ? ", " : "") << j[i].dump();
    os << "]";
  } else {
    os << j.dump();
  }
}

}  // namespace detail

/// Throws invalid_argument naming the first number of `doc` that is not finite (its JSON path and
/// value): a modelled figure that came out inf or nan means the inputs lie outside the model's range,
/// and the tool refuses them rather than print a wrong number with exit 0.
inline void require_finite(const json& doc, const std::string& path = "") {
  if (doc.is_number_float() && !std::isfinite(doc.get<double>())) {
    hetmesh::throw_error<hetmesh::invalid_argument>(
        "the modelled result {} is {}; expected a finite number: the inputs lie outside the model's range",
        path.empty() ? "(document)" : path, doc.get<double>());
  }
  if (doc.is_object()) {
    for (auto it = doc.begin(); it != doc.end(); ++it) require_finite(*it, path + "." + it.key());
  } else if (doc.is_array()) {
    for (std::size_t i = 0; i < doc.size(); ++i) require_finite(doc[i], path + "[" + std::to_string(i) + "]");
  }
}

/// Prints `j` as valid JSON, indented, with scalar arrays inline; ends with a newline.
inline void print_json(std::ostream& os, const json& j) {
  detail::write_json(os, j, 0);
  os << '\n';
}

/// A table of strings. Columns that hold only numbers are right-aligned.
struct table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;

  void print(std::ostream& os) const {
    const std::size_t n = header.size();
    std::vector<std::size_t> width(n, 0);
    std::vector<bool> numeric(n, true);
    for (std::size_t c = 0; c < n; ++c) width[c] = header[c].size();
    for (const auto& r : rows) {
      for (std::size_t c = 0; c < n && c < r.size(); ++c) {
        width[c] = std::max(width[c], r[c].size());
        if (!looks_numeric(r[c])) numeric[c] = false;
      }
    }
    auto line = [&](const std::vector<std::string>& cells) {
      std::string out;
      for (std::size_t c = 0; c < n; ++c) {
        const std::string cell = c < cells.size() ? cells[c] : "";
        out += numeric[c] ? fmt::format("{:>{}}", cell, width[c]) : fmt::format("{:<{}}", cell, width[c]);
        if (c + 1 < n) out += "  ";
      }
      while (!out.empty() && out.back() == ' ') out.pop_back();
      os << out << '\n';
    };
    line(header);
    std::vector<std::string> rule;
    for (std::size_t c = 0; c < n; ++c) rule.emplace_back(width[c], '-');
    line(rule);
    for (const auto& r : rows) line(r);
  }

  /// RFC 4180 CSV: fields with a comma, quote or newline are quoted.
  void print_csv(std::ostream& os) const {
    auto line = [&](const std::vector<std::string>& cells) {
      for (std::size_t c = 0; c < cells.size(); ++c) os << (c ? "," : "") << csv_field(cells[c]);
      os << '\n';
    };
    line(header);
    for (const auto& r : rows) line(r);
  }

  [[nodiscard]] static std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string out = "\"";
    for (const char ch : s) {
      if (ch == '"') out += '"';
      out += ch;
    }
    return out + "\"";
  }

 private:
  [[nodiscard]] static bool looks_numeric(const std::string& s) {
    // A cell is numeric when it starts like a number ("12", "-0.5", "1.3 GiB", "4.2x"): units stay
    // in the cell, and the column lines up on its right edge.
    if (s.empty()) return true;
    const std::size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    return i < s.size() && s[i] >= '0' && s[i] <= '9';
  }
};

/// A number with `digits` significant digits, for tables (JSON keeps full precision).
[[nodiscard]] inline std::string sig(double v, int digits = 4) { return fmt::format("{:.{}g}", v, digits); }
/// A fixed-point number with `decimals` decimals, for tables.
[[nodiscard]] inline std::string fixed_str(double v, int decimals = 3) {
  return fmt::format("{:.{}f}", v, decimals);
}

/// Bytes with a binary unit (GiB, MiB, ...), for tables.
[[nodiscard]] inline std::string bytes_str(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024.0 && u < 5) {
    b /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

}  // namespace hetmesh_plan
