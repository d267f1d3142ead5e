// SPDX-License-Identifier: Apache-2.0
// hetmesh: printing. Every user-visible type has an fmt::formatter; `hetmesh::to_string(x)` is
// fmt::format("{}", x). Formatters of hetmesh types derive from `empty_spec_formatter`, which accepts
// only the empty format spec `{}` and rejects anything else with a clear fmt::format_error.
#pragma once

#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "error.hpp"

namespace hetmesh {

/// Base of hetmesh's fmt::formatter specialisations: parses `{}` and nothing else.
struct empty_spec_formatter {
  /// Accepts `{}` only: a spec such as `{:x}` throws fmt::format_error (at compile time under FMT_STRING).
  constexpr auto parse(fmt::format_parse_context& ctx) -> decltype(ctx.begin()) {
    auto it = ctx.begin();
    if (it != ctx.end() && *it != '}') throw fmt::format_error("hetmesh types take no format spec: use {}");
    return it;
  }
};

/// The text of any printable value.
template <class T>
[[nodiscard]] std::string to_string(const T& v) {
  return hetmesh::format("{}", v);
}

}  // namespace hetmesh
