// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the encoder micro-batch, as encoder stages read it. Under long-short sequence
// parallelism (seq::plan_long_short) a short item runs whole on one rank and a long one is split into
// contiguous pieces over a Ulysses group; an encoder rank's batch lists its items or pieces in buffer order.
// Where each item's output lands in the LLM's sequence is the LLM micro-batch's business
// (micro_batch_view::encoder_outputs).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../seq/long_short.hpp"
#include "../seq/types.hpp"

namespace hetmesh::model {

/// The encoder items one encoder rank runs in one encoder micro-batch, and where each sits in the rank's
/// encoder buffers: item `item` contributes its tokens `tokens` at `offset` (a long item split by
/// Ulysses gives each rank of its group a contiguous range).
struct encoder_piece {
  std::int64_t item = 0;         ///< item id
  std::int64_t item_tokens = 0;  ///< the item's full length in tokens
  seq::token_range tokens;       ///< tokens of the item held here
  std::int64_t offset = 0;       ///< first token of the piece in the rank's buffer
  int degree = 1;                ///< ranks the item is split over (1: whole here)
  int group_rank = 0;            ///< this rank's index in the item's group

  friend constexpr bool operator==(const encoder_piece&, const encoder_piece&) = default;
};

/// View of an encoder micro-batch, as encoder stages read it.
struct encoder_batch_view {
  int encoder = 0;                        ///< index of the encoder in the model's list
  int rank = 0;                           ///< rank within the encoder's group
  int index = 0;                          ///< micro-batch index
  std::span<const encoder_piece> pieces;  ///< the items (or pieces) it runs, in buffer order
  std::int64_t tokens = 0;                ///< tokens of all pieces

  /// Tokens of all pieces (the rank's encoder input and output length, in tokens).
  [[nodiscard]] std::int64_t size() const noexcept { return tokens; }
};

/// The storage of an encoder micro-batch; `view()` is what encoder stages read.
struct encoder_batch {
  int encoder = 0;                    ///< see encoder_batch_view
  int rank = 0;                       ///< see encoder_batch_view
  int index = 0;                      ///< see encoder_batch_view
  std::vector<encoder_piece> pieces;  ///< see encoder_batch_view
  std::int64_t tokens = 0;            ///< see encoder_batch_view

  /// The view over this storage; valid while *this lives and is not modified. O(1).
  [[nodiscard]] encoder_batch_view view() const noexcept { return {encoder, rank, index, pieces, tokens}; }
  friend bool operator==(const encoder_batch&, const encoder_batch&) = default;
};

/// Encoder micro-batch of `rank` under a long-short plan: its items in plan order (long items first),
/// whole or its Ulysses piece. Pre: 0 <= rank < plan.ranks (checked). Over all ranks every item token
/// appears exactly once (long_short_plan's guarantee). Pure; O(items).
[[nodiscard]] HETMESH_COMPILED encoder_batch make_encoder_batch(const seq::long_short_plan& plan, int encoder,
                                                                int rank, int index = 0)
#if HETMESH_BODIES
{
  if (rank < 0 || rank >= plan.ranks)
    throw_error<invalid_argument>("make_encoder_batch: rank {}; expected a rank in [0, {})", rank,
                                  plan.ranks);
  encoder_batch eb;
  eb.encoder = encoder;
  eb.rank = rank;
  eb.index = index;
  for (const auto& a : plan.items) {
    const int k = rank - a.first_rank;
    if (k < 0 || k >= a.degree) continue;
    const seq::token_range r =
        a.degree == 1 ? seq::token_range{0, a.item.length} : a.splits[static_cast<std::size_t>(k)];
    eb.pieces.push_back({a.item.id, a.item.length, r, eb.tokens, a.degree, k});
    eb.tokens += r.size();
  }
  return eb;
}
#else
    ;
#endif

}  // namespace hetmesh::model

template <>
struct fmt::formatter<hetmesh::model::encoder_piece> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::model::encoder_piece& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "item{}{}/{}@{}", p.item, p.tokens, p.item_tokens, p.offset);
  }
};
template <>
struct fmt::formatter<hetmesh::model::encoder_batch_view> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::model::encoder_batch_view& v, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "encoder_batch{{encoder={}, rank={}, mb={}, tokens={}, pieces={}}}",
                              v.encoder, v.rank, v.index, v.tokens, v.pieces);
  }
};
template <>
struct fmt::formatter<hetmesh::model::encoder_batch> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::model::encoder_batch& b, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", b.view());
  }
};
