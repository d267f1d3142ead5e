// SPDX-License-Identifier: Apache-2.0
// hetmesh: checked integer arithmetic for sizes that come from input (batch sizes, token counts, cost
// coefficients). Signed overflow is undefined behaviour, and a wrapped size is a wrong answer with exit
// 0, so every product or sum of caller-provided sizes that could leave int64 goes through these helpers,
// which throw hetmesh::overflow_error naming what was being computed.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

#include "../config.hpp"
#include "error.hpp"

namespace hetmesh {

/// a + b, or overflow_error "`what`: a + b overflows int64". Pure; O(1).
[[nodiscard]] HETMESH_COMPILED std::int64_t checked_add(std::int64_t a, std::int64_t b,
                                                        std::string_view what);

/// a - b, or overflow_error "`what`: a - b overflows int64". Pure; O(1).
[[nodiscard]] HETMESH_COMPILED std::int64_t checked_sub(std::int64_t a, std::int64_t b,
                                                        std::string_view what);

/// a x b, or overflow_error "`what`: a x b overflows int64". Pure; O(1).
[[nodiscard]] HETMESH_COMPILED std::int64_t checked_mul(std::int64_t a, std::int64_t b,
                                                        std::string_view what);

/// The sum of `values`, or overflow_error naming `what` and the index where the running sum left int64.
/// Pure; O(n).
[[nodiscard]] HETMESH_COMPILED std::int64_t checked_sum(std::span<const std::int64_t> values,
                                                        std::string_view what);

}  // namespace hetmesh

#if HETMESH_BODIES

namespace hetmesh {

HETMESH_COMPILED std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    throw_error<overflow_error>("{}: {} + {} overflows int64 (at most {})", what, a, b,
                                std::numeric_limits<std::int64_t>::max());
  return r;
}

HETMESH_COMPILED std::int64_t checked_sub(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r))
    throw_error<overflow_error>("{}: {} - {} overflows int64 (at most {})", what, a, b,
                                std::numeric_limits<std::int64_t>::max());
  return r;
}

HETMESH_COMPILED std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw_error<overflow_error>("{}: {} x {} overflows int64 (at most {})", what, a, b,
                                std::numeric_limits<std::int64_t>::max());
  return r;
}

HETMESH_COMPILED std::int64_t checked_sum(std::span<const std::int64_t> values, std::string_view what) {
  std::int64_t r = 0;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (__builtin_add_overflow(r, values[i], &r))
      throw_error<overflow_error>("{}: the sum overflows int64 at element {} (value {})", what, i, values[i]);
  return r;
}

}  // namespace hetmesh
#endif  // HETMESH_BODIES
