// SPDX-License-Identifier: Apache-2.0
// Benchmark support: `--name value` command-line options bound to the fields they set.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>

namespace hetmesh::bench {

/// One `--name value` option and the field its value is stored in (numbers by std::stoll/std::stoi).
struct option {
  std::string_view name;  ///< with its dashes, e.g. "--max-bytes"
  std::variant<std::string*, std::int64_t*, int*> target;
};

/// Parses argv[1..argc) as `--name value` pairs into `options`' targets, later pairs overriding
/// earlier ones. Throws std::runtime_error on a name without a value and on an unknown name (the
/// message lists the known ones), and whatever std::stoll/std::stoi throw on a bad number.
inline void parse_options(int argc, char** argv, std::initializer_list<option> options) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const option* match = nullptr;
    for (const auto& o : options)
      if (o.name == k) match = &o;
    if (!match) {
      std::string known;
      for (const auto& o : options) known += (known.empty() ? "" : ", ") + std::string(o.name);
      throw std::runtime_error("unknown option " + k + " (expected " + known + ")");
    }
    if (i + 1 >= argc) throw std::runtime_error("missing value after " + k);
    const std::string v = argv[++i];
    if (auto* s = std::get_if<std::string*>(&match->target)) **s = v;
    if (auto* n = std::get_if<std::int64_t*>(&match->target)) **n = std::stoll(v);
    if (auto* n = std::get_if<int*>(&match->target)) **n = std::stoi(v);
  }
}

}  // namespace hetmesh::bench
