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

#if HETMESH_CHECK_FORMAT_STRINGS
/// A failed HETMESH_ASSERT: formats the explanation out of line (see throw_error).
template <class... Args>
[[noreturn]] void assertion_failed(std::string_view expr, std::string_view file, int line,
                                   format_string_t<Args...> format, Args&&... args) {
  assertion_failed_v(expr, file, line, format, fmt::make_format_args(args...));
}
#else
/// A failed HETMESH_ASSERT: formats the explanation out of line (see throw_error). Not a template: the
/// arguments convert to type-erased format_args, as throw_error's do.
[[noreturn]] [[gnu::cold]] inline void assertion_failed(
    std::string_view expr, std::string_view file, int line, fmt::string_view format, format_arg a0 = {},
    format_arg a1 = {}, format_arg a2 = {}, format_arg a3 = {}, format_arg a4 = {}, format_arg a5 = {},
    format_arg a6 = {}, format_arg a7 = {}, format_arg a8 = {}, format_arg a9 = {}, format_arg a10 = {},
    format_arg a11 = {}, format_arg a12 = {}, format_arg a13 = {}, format_arg a14 = {}, format_arg a15 = {}) {
  const format_arg args[] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15};
  fmt::format_context::format_arg data[max_erased_args];
  assertion_failed_v(expr, file, line, format, format_arg::pack(args, data));
}

/// assertion_failed with more than max_erased_args arguments.
template <class... Args>
requires(sizeof...(Args) > max_erased_args)
    [[noreturn]] void assertion_failed(std::string_view expr, std::string_view file, int line,
                                       fmt::string_view format, Args&&... args) {
  assertion_failed_v(expr, file, line, format,
                     erased_args<fmt::format_context, std::remove_cvref_t<Args>...>(args...).get());
}
#endif
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
