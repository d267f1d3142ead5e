// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: the small value types every partitioner shares. A sequence is known by an id and a
// length (bytes are never needed to plan); a piece of it by a half-open token range.
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"

namespace hetmesh::seq {

/// What a partition family (seq::partition_family) splits: the LLM backbone's sequences, or the
/// encoders' items.
enum class partition_role : std::uint8_t {
  llm,      ///< the LLM backbone's sequences (static CP, Ulysses, HDP)
  encoder,  ///< an encoder's items (long-short SP)
};

/// One sequence (sample, document) to partition: a caller-chosen id, unique within a batch, and
/// its length in tokens. Planners sort by (-length, id), so equal lengths never tie.
struct seq_desc {
  std::int64_t id = 0;      ///< sequence id, unique in the batch
  std::int64_t length = 0;  ///< tokens

  friend constexpr bool operator==(const seq_desc&, const seq_desc&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Half-open token range [begin, end) inside one sequence.
struct token_range {
  std::int64_t begin = 0;  ///< first token
  std::int64_t end = 0;    ///< one past the last token

  /// Tokens in the range.
  [[nodiscard]] constexpr std::int64_t size() const noexcept { return end - begin; }
  friend constexpr bool operator==(const token_range&, const token_range&) = default;
  /// Orders ranges by (begin, end).
  friend constexpr auto operator<=>(const token_range&, const token_range&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// A piece of one sequence held by one rank: which sequence (by id) and which tokens.
struct seq_segment {
  std::int64_t seq_id = 0;  ///< the sequence
  token_range tokens;       ///< its tokens held here

  friend constexpr bool operator==(const seq_segment&, const seq_segment&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Builds seq_descs with ids 0..n-1 from plain lengths (convenience for callers without ids).
[[nodiscard]] HETMESH_COMPILED std::vector<seq_desc> with_index_ids(std::span<const std::int64_t> lengths);

/// Validates planner input: throws invalid_argument, prefixed with `who` (the calling planner's name),
/// naming the first sequence with a negative length or the first id that appears twice. Planners rely
/// on unique ids for their total order, so every planner over seq_descs (here and in balance/) calls
/// this first. Post: returns normally iff all lengths >= 0 and ids are unique. Pure; O(n log n).
HETMESH_COMPILED void check_seq_descs(std::span<const seq_desc> seqs, const char* who)
#if HETMESH_BODIES
{
  std::vector<std::int64_t> ids;
  ids.reserve(seqs.size());
  for (const auto& s : seqs) {
    if (s.length < 0)
      throw_error<invalid_argument>("{}: sequence id {} has length {}; expected a length >= 0", who, s.id,
                                    s.length);
    ids.push_back(s.id);
  }
  if (std::adjacent_find(ids.begin(), ids.end(), std::greater_equal<>{}) == ids.end()) return;  // ascending
  std::sort(ids.begin(), ids.end());
  for (std::size_t i = 1; i < ids.size(); ++i)
    if (ids[i] == ids[i - 1])
      throw_error<invalid_argument>("{}: sequence id {} appears twice; expected unique ids", who, ids[i]);
}
#else
    ;
#endif

/// The total order every planner over seq_descs sorts by: longest first, then smallest id. A strict
/// weak ordering, total over unique ids, so sorts with it are deterministic across ranks and builds.
/// Pure; O(1).
[[nodiscard]] inline bool longer_first(const seq_desc& a, const seq_desc& b) noexcept {
  return a.length != b.length ? a.length > b.length : a.id < b.id;
}

namespace detail {
/// ceil(a / b) for a >= 0, b > 0.
[[nodiscard]] constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept {
  return (a + b - 1) / b;
}
}  // namespace detail

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::seq_desc> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::seq_desc& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "seq{{id={}, len={}}}", s.id, s.length);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::token_range> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::token_range& r, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "[{},{})", r.begin, r.end);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::seq_segment> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::seq_segment& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}{}", s.seq_id, s.tokens);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::partition_role> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::seq::partition_role r, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", r == hetmesh::seq::partition_role::llm ? "llm" : "encoder");
  }
};

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED void seq_desc::hash_append(hasher& h) const { append_all(h, id, length); }

HETMESH_COMPILED void token_range::hash_append(hasher& h) const { append_all(h, begin, end); }

HETMESH_COMPILED void seq_segment::hash_append(hasher& h) const { append_all(h, seq_id, tokens); }

HETMESH_COMPILED std::vector<seq_desc> with_index_ids(std::span<const std::int64_t> lengths) {
  std::vector<seq_desc> out(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) out[i] = {static_cast<std::int64_t>(i), lengths[i]};
  return out;
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
