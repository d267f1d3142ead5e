// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: memory accounting per component. Each entry is bytes a component holds: heap it
// allocated (exact, from container capacities) plus index bytes it mapped and touched (resident). Payload
// files mapped for reading are page cache shared by every process on the node; they are reported as
// `mapped` and not added to the totals.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"

namespace hetmesh::data {

/// One accounted allocation of the data plane: what holds it, for whom, how many bytes.
struct memory_entry {
  std::string component{};  ///< "source_loader", "prefetch", "planner", "constructor"
  std::string owner{};      ///< e.g. "web#0" (source web, loader 0) or "rank 3"
  std::int64_t bytes = 0;   ///< heap bytes owned
  std::int64_t mapped = 0;  ///< bytes of mapped files (page cache, shared): reported, not owned
  friend bool operator==(const memory_entry&, const memory_entry&) = default;
};

/// The data plane's memory, entry by entry: what benchmarks compare (access state once per source vs on every
/// rank).
struct memory_report {
  std::vector<memory_entry> entries{};  ///< one per component and owner

  /// Heap bytes of all entries.
  [[nodiscard]] std::int64_t total() const noexcept {
    std::int64_t t = 0;
    for (const auto& e : entries) t += e.bytes;
    return t;
  }
  /// Heap bytes of the entries of `component`.
  [[nodiscard]] HETMESH_COMPILED std::int64_t total_of(std::string_view component) const noexcept;
  /// Number of entries of `component`.
  [[nodiscard]] HETMESH_COMPILED std::int64_t count_of(std::string_view component) const noexcept;
  /// Appends an entry.
  HETMESH_COMPILED void add(std::string component, std::string owner, std::int64_t bytes,
                            std::int64_t mapped = 0);
};

}  // namespace hetmesh::data

template <>
struct fmt::formatter<hetmesh::data::memory_report> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::memory_report& r, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out = hetmesh::format_to(ctx.out(), "memory_report(total={} B", r.total());
    for (const char* c : {"source_loader", "prefetch", "planner", "constructor"})
      if (r.count_of(c) > 0)
        out = hetmesh::format_to(out, ", {}: {} x, {} B", c, r.count_of(c), r.total_of(c));
    return hetmesh::format_to(out, ")");
  }
};

#if HETMESH_BODIES

namespace hetmesh::data {

HETMESH_COMPILED std::int64_t memory_report::total_of(std::string_view component) const noexcept {
  std::int64_t t = 0;
  for (const auto& e : entries)
    if (e.component == component) t += e.bytes;
  return t;
}

HETMESH_COMPILED std::int64_t memory_report::count_of(std::string_view component) const noexcept {
  std::int64_t n = 0;
  for (const auto& e : entries) n += e.component == component ? 1 : 0;
  return n;
}

HETMESH_COMPILED void memory_report::add(std::string component, std::string owner, std::int64_t bytes,
                                         std::int64_t mapped) {
  entries.push_back({std::move(component), std::move(owner), bytes, mapped});
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
