// SPDX-License-Identifier: Apache-2.0
// hetmesh: the exactly-once property as a function, for the planners' heavy-level checks and for tests.
// A plan assigns every token of every input sequence (or every sample) exactly once: the pieces it hands
// out for one id tile that id's range with no gap, no overlap and nothing outside it, and it names no id
// that is not in the input.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "sort.hpp"

namespace hetmesh {

/// The half-open token range [begin, end) of the sequence or sample `id`. A whole sample is [0, 1) or
/// [0, length).
struct id_range {
  std::int64_t id = 0;     ///< the sequence or sample
  std::int64_t begin = 0;  ///< first token of the range
  std::int64_t end = 0;    ///< one past its last token
  friend bool operator==(const id_range&, const id_range&) = default;
};

/// How `assigned` fails to tile `expected` exactly once: the first offence found, as a message ("id 7:
/// tokens [0, 40) assigned twice", "id 9: tokens [10, 20) never assigned", "id 12 is assigned but not in
/// the input"); empty when every token of every expected range is assigned exactly once and nothing
/// else is. Empty pieces ([b, b)) are ignored. Pre: ids in `expected` unique (a repeated id is reported).
/// Deterministic; O(n log n) in the number of ranges. Heavy: call it under
/// `HETMESH_ASSERT_AT(heavy, ...)` or in tests, not on a hot path.
[[nodiscard]] HETMESH_COMPILED std::string exactly_once_violation(std::vector<id_range> expected,
                                                                  std::vector<id_range> assigned);

}  // namespace hetmesh

#if HETMESH_BODIES

namespace hetmesh {

HETMESH_COMPILED std::string exactly_once_violation(std::vector<id_range> expected,
                                                    std::vector<id_range> assigned) {
  const auto key = [](const id_range& r) { return std::tuple(r.id, r.begin, r.end); };
  const auto by_key = [&](const id_range& a, const id_range& b) { return key(a) < key(b); };
  indirect_sort(expected.begin(), expected.end(), by_key);
  std::erase_if(assigned, [](const id_range& r) { return r.begin == r.end; });
  indirect_sort(assigned.begin(), assigned.end(), by_key);
  for (std::size_t i = 1; i < expected.size(); ++i)
    if (expected[i].id == expected[i - 1].id)
      return fmt::format("id {} appears twice in the input", expected[i].id);
  std::size_t a = 0;
  for (const auto& e : expected) {
    if (a < assigned.size() && assigned[a].id < e.id)
      return fmt::format("id {} is assigned (tokens [{}, {})) but not in the input", assigned[a].id,
                         assigned[a].begin, assigned[a].end);
    std::int64_t at = e.begin;  // tokens [e.begin, at) are covered once so far
    for (; a < assigned.size() && assigned[a].id == e.id; ++a) {
      const auto& p = assigned[a];
      if (p.begin < at)
        return fmt::format("id {}: tokens [{}, {}) assigned twice", e.id, p.begin, std::min(at, p.end));
      if (p.begin > at) return fmt::format("id {}: tokens [{}, {}) never assigned", e.id, at, p.begin);
      if (p.end > e.end)
        return fmt::format("id {}: tokens [{}, {}) assigned but the input ends at {}", e.id,
                           std::max(p.begin, e.end), p.end, e.end);
      at = p.end;
    }
    if (at < e.end) return fmt::format("id {}: tokens [{}, {}) never assigned", e.id, at, e.end);
  }
  if (a < assigned.size())
    return fmt::format("id {} is assigned (tokens [{}, {})) but not in the input", assigned[a].id,
                       assigned[a].begin, assigned[a].end);
  return {};
}

}  // namespace hetmesh
#endif  // HETMESH_BODIES
