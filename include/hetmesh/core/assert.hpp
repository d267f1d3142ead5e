// SPDX-License-Identifier: Apache-2.0
// hetmesh: leveled assertions. A failed check throws hetmesh::assertion_error (never aborts), naming
// the expression, the location and a formatted explanation.
#pragma once

/// \file
/// Leveled assertions: HETMESH_ASSERT and HETMESH_ASSERT_AT throw hetmesh::assertion_error, never abort.

#include <string_view>

#include <fmt/format.h>

#include "../config.hpp"
#include "error.hpp"

namespace hetmesh {

/// Assertion levels as values, for `if constexpr (assertion_enabled(assertion_level::heavy))`.
enum class assertion_level : int {
  off = HETMESH_ASSERTION_LEVEL_OFF,
  normal = HETMESH_ASSERTION_LEVEL_NORMAL,
  collective = HETMESH_ASSERTION_LEVEL_COLLECTIVE,
  heavy = HETMESH_ASSERTION_LEVEL_HEAVY,
};

/// True when checks of level `level` are compiled in.
[[nodiscard]] constexpr bool assertion_enabled(assertion_level level) noexcept {
  return static_cast<int>(level) <= HETMESH_ASSERTION_LEVEL && level != assertion_level::off;
}

namespace detail {
[[noreturn]] [[gnu::cold]] [[gnu::noinline]] inline void assertion_failed_v(std::string_view expr,
                                                                            std::string_view file, int line,
                                                                            fmt::string_view format,
                                                                            fmt::format_args args) {
  throw assertion_error(
      hetmesh::format("assertion `{}` failed at {}:{}: {}", expr, file, line, fmt::vformat(format, args)));
}

/// A failed HETMESH_ASSERT: formats the explanation out of line (see throw_error).
template <class... Args>
[[noreturn]] void assertion_failed(std::string_view expr, std::string_view file, int line,
                                   format_string_t<Args...> format, Args&&... args) {
  assertion_failed_v(expr, file, line, format, fmt::make_format_args(args...));
}
}  // namespace detail

}  // namespace hetmesh

/// HETMESH_ASSERT_AT(level, cond, fmt, args...): checks `cond` when `level` (off, normal, collective,
/// heavy) is enabled; otherwise the condition is not evaluated.
#define HETMESH_ASSERT_AT(level, cond, ...)                                          \
  do {                                                                               \
    if constexpr (::hetmesh::assertion_enabled(::hetmesh::assertion_level::level)) { \
      if (!(cond)) {                                                                 \
        ::hetmesh::detail::assertion_failed(#cond, __FILE__, __LINE__, __VA_ARGS__); \
      }                                                                              \
    }                                                                                \
  } while (false)

/// HETMESH_ASSERT(cond, fmt, args...): a normal-level precondition check.
#define HETMESH_ASSERT(cond, ...) HETMESH_ASSERT_AT(normal, cond, __VA_ARGS__)
