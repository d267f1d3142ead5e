// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: the one sample record the data, balance and seq rooms share. A sample is known by a
// stable id, its text length and the token counts of its encoder items; bytes are never needed to plan.
// The id is a pure function of where the sample sits in the data stream (source, epoch, position), so
// every rank that sees the sample names it the same way, a checkpoint can name it, and a reorder plan
// can be matched to what a loader read without any side table.
#pragma once

#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"

namespace hetmesh::seq {

/// The parts a sample id is made of: the source's index in the mixture, the source's epoch and the
/// position in that epoch's permutation.
struct sample_origin {
  std::int64_t source = 0;    ///< source index in the mixture
  std::int64_t epoch = 0;     ///< epoch of the source
  std::int64_t position = 0;  ///< position in the epoch's permutation
  friend constexpr bool operator==(const sample_origin&, const sample_origin&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Bit layout of a sample id, a non-negative std::int64_t (bit 63 is always 0):
///   bits  0..36  position  (37 bits: < 2^37, about 1.4e11 samples per source and epoch)
///   bits 37..50  epoch     (14 bits: < 16384 epochs per source)
///   bits 51..62  source    (12 bits: < 4096 sources)
/// A bit field, not a hash: ids are unique by construction (no collisions to reason about), ordered by
/// (source, epoch, position), and decode back to their parts. make_sample_id refuses parts outside
/// these limits rather than wrapping them into another sample's id.
struct sample_id_layout {
  static constexpr int position_bits = 37;  ///< bits of the position
  static constexpr int epoch_bits = 14;     ///< bits of the epoch
  static constexpr int source_bits = 12;    ///< bits of the source index
  static constexpr std::int64_t max_position = (std::int64_t{1} << position_bits) - 1;  ///< largest position
  static constexpr std::int64_t max_epoch = (std::int64_t{1} << epoch_bits) - 1;        ///< largest epoch
  static constexpr std::int64_t max_source = (std::int64_t{1} << source_bits) - 1;      ///< largest source
};
static_assert(sample_id_layout::position_bits + sample_id_layout::epoch_bits +
                      sample_id_layout::source_bits ==
                  63,
              "a sample id uses the 63 value bits of a non-negative int64");

/// The stable id of the sample at `position` of `epoch` of `source` (layout: sample_id_layout).
/// Throws invalid_argument naming the part and its limit when a part is negative or too large.
/// Pure; O(1). Inverse: sample_origin_of.
[[nodiscard]] HETMESH_COMPILED std::int64_t make_sample_id(std::int64_t source, std::int64_t epoch,
                                                           std::int64_t position);
/// The stable id of the sample at `o` (see make_sample_id).
[[nodiscard]] HETMESH_COMPILED std::int64_t make_sample_id(const sample_origin& o);

/// The (source, epoch, position) an id was made from. Throws invalid_argument for a negative id (never
/// made by make_sample_id). Pure; O(1).
[[nodiscard]] HETMESH_COMPILED sample_origin sample_origin_of(std::int64_t id);

/// What the planners know of a sample before its bytes are read: the one record shared by data/
/// (the data planner and source readers), balance/ (grouped reordering, reshard) and seq/.
///  - `id`: stable and unique across the data stream (make_sample_id); planners break ties by it;
///  - `tokens`: text (LLM) tokens; `item_tokens`: the tokens each encoder item (image, audio clip, ...)
///    becomes, in the sample's item order;
///  - `bytes`: payload bytes on disk (what a loader will read; 0 where unknown);
///  - `owner`: the rank, local to the group that plans, that loaded the sample (grouped reordering
///    reads it; the data planner leaves it 0).
struct sample_meta {
  std::int64_t id = 0;                      ///< stable sample id (make_sample_id)
  std::int64_t tokens = 0;                  ///< text tokens
  std::vector<std::int64_t> item_tokens{};  ///< token count of each encoder item
  std::int64_t bytes = 0;                   ///< payload bytes on disk
  int owner = 0;                            ///< group-local rank that loaded it

  /// Tokens of all encoder items. O(items).
  [[nodiscard]] std::int64_t encoder_tokens() const noexcept {
    std::int64_t t = 0;
    for (auto v : item_tokens) t += v;
    return t;
  }
  /// Where the sample sits in the stream, decoded from its id.
  [[nodiscard]] HETMESH_COMPILED sample_origin origin() const;
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const sample_meta&, const sample_meta&) = default;
};

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::sample_origin> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::sample_origin& o, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "s{}/e{}/p{}", o.source, o.epoch, o.position);
  }
};

template <>
struct fmt::formatter<hetmesh::seq::sample_meta> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::sample_meta& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "sample(id={}, tokens={}, items={}, bytes={}, owner={})", m.id,
                              m.tokens, m.item_tokens, m.bytes, m.owner);
  }
};

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED void sample_origin::hash_append(hasher& h) const { append_all(h, source, epoch, position); }

HETMESH_COMPILED std::int64_t make_sample_id(std::int64_t source, std::int64_t epoch, std::int64_t position) {
  using L = sample_id_layout;
  const auto check = [](const char* what, std::int64_t v, std::int64_t max) {
    if (v < 0 || v > max)
      throw_error<invalid_argument>("sample id: {} = {} does not fit; expected 0 <= {} <= {}", what, v, what,
                                    max);
  };
  check("source", source, L::max_source);
  check("epoch", epoch, L::max_epoch);
  check("position", position, L::max_position);
  return (source << (L::position_bits + L::epoch_bits)) | (epoch << L::position_bits) | position;
}

HETMESH_COMPILED std::int64_t make_sample_id(const sample_origin& o) {
  return make_sample_id(o.source, o.epoch, o.position);
}

HETMESH_COMPILED sample_origin sample_origin_of(std::int64_t id) {
  using L = sample_id_layout;
  if (id < 0)
    throw_error<invalid_argument>("sample id {} is negative; expected an id from make_sample_id", id);
  return {.source = id >> (L::position_bits + L::epoch_bits),
          .epoch = (id >> L::position_bits) & L::max_epoch,
          .position = id & L::max_position};
}

HETMESH_COMPILED sample_origin sample_meta::origin() const { return sample_origin_of(id); }

HETMESH_COMPILED void sample_meta::hash_append(hasher& h) const {
  append_all(h, id, tokens, item_tokens, bytes, owner);
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
