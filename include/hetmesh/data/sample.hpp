// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: what a sample is, in the two forms the data plane moves: its metadata (lengths only:
// enough to plan and balance, never the bytes; the one record seq::sample_meta, shared with balance/)
// and its loaded form (token ids and encoder payloads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../seq/sample.hpp"

namespace hetmesh::data {

/// Where a sample sits in the stream: source, the source's epoch, its position in that epoch's
/// permutation, and the sample's index inside the source (= permutation[position]).
struct sample_ref {
  int source = 0;             ///< source index in the mixture
  std::int64_t epoch = 0;     ///< epoch of the source
  std::int64_t position = 0;  ///< position in the epoch's permutation
  std::int64_t index = 0;     ///< index of the sample in the source
  /// The sample's stable id (seq::make_sample_id of source, epoch, position). Throws invalid_argument
  /// when a part exceeds seq::sample_id_layout's limits.
  [[nodiscard]] std::int64_t id() const { return seq::make_sample_id(source, epoch, position); }
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const sample_ref&, const sample_ref&) = default;
};

/// One encoder input of a sample: its kind (the file extension in a WebDataset shard, e.g. "jpg"),
/// the tokens the encoder turns it into, and its payload bytes as decoded by the user's hook.
struct loaded_item {
  std::string kind{};                ///< modality, e.g. "image"
  std::int64_t tokens = 0;           ///< tokens it becomes in the LLM
  std::vector<std::byte> payload{};  ///< the raw bytes, decoded by the user's encoder
  friend bool operator==(const loaded_item&, const loaded_item&) = default;
};

/// A loaded sample: text token ids, their loss mask and encoder items.
struct sample {
  sample_ref ref{};                       ///< which sample
  std::vector<std::int32_t> tokens{};     ///< text token ids
  std::vector<loaded_item> items{};       ///< encoder items
  std::vector<std::uint8_t> loss_mask{};  ///< empty (every target counts), or one per token: 0 = the target
                                          ///< of that token (the next token) does not count, 1 = it does

  /// Heap bytes this sample holds (for memory accounting).
  [[nodiscard]] HETMESH_COMPILED std::int64_t heap_bytes() const noexcept;
  friend bool operator==(const sample&, const sample&) = default;
};

}  // namespace hetmesh::data

template <>
struct fmt::formatter<hetmesh::data::sample_ref> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::sample_ref& r, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "s{}/e{}/p{}=#{}", r.source, r.epoch, r.position, r.index);
  }
};
template <>
struct fmt::formatter<hetmesh::data::sample> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::sample& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "sample({}, {} tokens, {} items)", s.ref, s.tokens.size(),
                              s.items.size());
  }
};

namespace hetmesh::data {

/// Checks a loaded sample's loss mask: empty, or one entry per text token, each 0 or 1. Throws data_error
/// naming the sample and `where` (the reader or decoder that produced it) otherwise. O(tokens) with a mask.
HETMESH_COMPILED void check_loss_mask(const sample& s, std::string_view where);

}  // namespace hetmesh::data

#if HETMESH_BODIES

namespace hetmesh::data {

HETMESH_COMPILED void sample_ref::hash_append(hasher& h) const {
  append_all(h, source, epoch, position, index);
}

HETMESH_COMPILED std::int64_t sample::heap_bytes() const noexcept {
  auto b = static_cast<std::int64_t>(tokens.capacity() * sizeof(std::int32_t) +
                                     items.capacity() * sizeof(loaded_item) + loss_mask.capacity());
  for (const auto& it : items) b += static_cast<std::int64_t>(it.payload.capacity() + it.kind.capacity());
  return b;
}

HETMESH_COMPILED void check_loss_mask(const sample& s, std::string_view where) {
  if (s.loss_mask.empty()) return;
  if (s.loss_mask.size() != s.tokens.size())
    throw_error<data_error>(
        "{}: sample {} has a loss mask of {} entries for {} text tokens; expected one per token "
        "(or none)",
        where, s.ref, s.loss_mask.size(), s.tokens.size());
  for (std::size_t k = 0; k < s.loss_mask.size(); ++k)
    if (s.loss_mask[k] > 1)
      throw_error<data_error>("{}: sample {} has loss mask entry {} at token {}; expected 0 or 1", where,
                              s.ref, s.loss_mask[k], k);
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
