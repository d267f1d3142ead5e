// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the unified multimodal micro-batch, as the runtime hands it to the user's stages. A step's
// batch is a list of documents (text token ids, with placeholder tokens where encoder outputs land);
// a partition plan (seq::cp_partition, seq::hdp_plan, whole sequences) gives each rank some runs of
// those documents' tokens; the builders here turn (batch, plan, rank) into the rank's micro-batch:
// tokens, per-document positions (TransformerEngine's rule under CP: a token keeps its position in its
// document whichever rank holds it), cu_seqlens, document ids, where encoder outputs land, and loss
// targets and weights. Targets come from the whole batch, so a token whose successor sits on another
// rank still gets its target, and the union over the ranks of a step counts every target exactly once.
// Ulysses takes any of these views as its ranks' tokens before the all-to-all (its plan needs only
// their sizes); a contiguous split is make_cp_micro_batch of seq::partition_contiguous. The step's
// documents and their checks are in document.hpp, which this header includes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/exactly_once.hpp"
#include "../core/format.hpp"
#include "../core/sort.hpp"
#include "../seq/cp.hpp"
#include "../seq/hdp.hpp"
#include "../seq/types.hpp"
#include "document.hpp"

namespace hetmesh::model {

/// A run of consecutive tokens of one document that a rank holds: the document (index in the step and
/// id), the positions it covers (past the document's length: padding), and where it starts locally.
struct token_segment {
  std::int64_t doc = 0;           ///< index of the document in the step
  std::int64_t doc_id = 0;        ///< id of the document
  seq::token_range positions;     ///< positions in the (padded) document
  std::int64_t local_offset = 0;  ///< first local token of the run

  friend constexpr bool operator==(const token_segment&, const token_segment&) = default;
};

/// Where a piece of an encoder item's output lands in this rank's tokens: output tokens
/// [item_tokens.begin, item_tokens.end) of item `item` of encoder `encoder` go to local tokens
/// [local_offset, local_offset + item_tokens.size()). Under CP an item may land in several pieces (one per
/// run of consecutive local tokens that holds it; pieces adjacent in both the item and the buffer are one).
struct encoder_landing {
  int encoder = 0;                ///< index of the encoder
  std::int64_t item = 0;          ///< item id
  seq::token_range item_tokens;   ///< the item's output tokens that land here
  std::int64_t local_offset = 0;  ///< first local token they replace

  friend constexpr bool operator==(const encoder_landing&, const encoder_landing&) = default;
};

/// The micro-batch view a stage reads: spans into a model::micro_batch, which owns them. Per local token
/// (size() of them): token id, position in its document, document id, index in the step's stream
/// (-1 for padding), loss target (ignore_target when it does not count) and loss weight (0 or 1).
/// cu_seqlens has one boundary per document on this rank, in TransformerEngine's form (THD: every
/// document of the step, possibly empty here). The step's token and target counts let every rank
/// normalise its loss the same way: loss = sum(weight * token_loss) / step_targets.
struct micro_batch_view {
  int rank = 0;                                ///< rank (within the partition's group) holding it
  int index = 0;                               ///< micro-batch index on that rank
  std::span<const std::int64_t> tokens;        ///< per local token: token id (padding: pad_token)
  std::span<const std::int64_t> positions;     ///< per local token: position in its document
  std::span<const std::int64_t> doc_ids;       ///< per local token: document id
  std::span<const std::int64_t> stream_index;  ///< per local token: index in the step's stream, -1 = padding
  std::span<const std::int64_t> targets;       ///< per local token: next token id, or ignore_target
  std::span<const double> loss_weights;        ///< per local token: 1 when its target counts, else 0
  std::span<const std::int64_t> cu_seqlens;    ///< local per-document boundaries, from 0 to size()
  std::span<const std::int64_t> seqlen_docs;   ///< document id of each cu_seqlens interval
  std::span<const token_segment> segments;     ///< runs of documents, in local order
  std::span<const encoder_landing> encoder_outputs;  ///< where encoder outputs land
  std::int64_t step_tokens = 0;                      ///< tokens of the step (padding excluded)
  std::int64_t step_targets = 0;                     ///< targets that count in the step, over every rank

  /// Local tokens (padding included).
  [[nodiscard]] std::int64_t size() const noexcept { return static_cast<std::int64_t>(tokens.size()); }
  /// Local targets that count (sum of loss_weights). O(size()).
  [[nodiscard]] std::int64_t local_targets() const noexcept {
    std::int64_t n = 0;
    for (double w : loss_weights) n += w != 0.0 ? 1 : 0;
    return n;
  }
};

/// The storage of one rank's micro-batch; `view()` is what stages read. Built by make_cp_micro_batch,
/// make_hdp_micro_batch or make_segment_micro_batch.
struct micro_batch {
  int rank = 0;                                  ///< rank holding it
  int index = 0;                                 ///< micro-batch index on that rank
  std::vector<std::int64_t> tokens;              ///< see micro_batch_view
  std::vector<std::int64_t> positions;           ///< see micro_batch_view
  std::vector<std::int64_t> doc_ids;             ///< see micro_batch_view
  std::vector<std::int64_t> stream_index;        ///< see micro_batch_view
  std::vector<std::int64_t> targets;             ///< see micro_batch_view
  std::vector<double> loss_weights;              ///< see micro_batch_view
  std::vector<std::int64_t> cu_seqlens;          ///< see micro_batch_view
  std::vector<std::int64_t> seqlen_docs;         ///< see micro_batch_view
  std::vector<token_segment> segments;           ///< see micro_batch_view
  std::vector<encoder_landing> encoder_outputs;  ///< see micro_batch_view
  std::int64_t step_tokens = 0;                  ///< see micro_batch_view
  std::int64_t step_targets = 0;                 ///< see micro_batch_view

  /// The view over this storage; valid while *this lives and is not modified. O(1).
  [[nodiscard]] micro_batch_view view() const noexcept {
    return {rank,         index,      tokens,      positions, doc_ids,         stream_index, targets,
            loss_weights, cu_seqlens, seqlen_docs, segments,  encoder_outputs, step_tokens,  step_targets};
  }
  friend bool operator==(const micro_batch&, const micro_batch&) = default;
};

/// What every rank's builder needs to know of the whole step, computed once per step: where each document
/// starts in the step's stream, the documents by id, and the step's token and target counts.
struct step_summary {
  std::vector<std::int64_t> offsets;  ///< per document its first stream token, then the total
  std::vector<std::pair<std::int64_t, std::int64_t>> ids;  ///< (document id, index), sorted by id
  std::int64_t tokens = 0;                                 ///< tokens of the step
  std::int64_t targets = 0;                                ///< targets that count in the step

  /// The index of the document with id `id`, or -1. O(log documents).
  [[nodiscard]] std::int64_t find(std::int64_t id) const noexcept {
    const auto it = std::lower_bound(ids.begin(), ids.end(), std::pair<std::int64_t, std::int64_t>{id, -1});
    return it != ids.end() && it->first == id ? it->second : -1;
  }
};

namespace detail {
/// Calls f(position, counts) for positions [begin, end) of `d` (past its length: counts = false), in
/// order, with target_counts' rule. O(end - begin + log items).
template <class F>
void for_each_target(const document& d, std::int64_t begin, std::int64_t end, F&& f) {
  const auto& items = d.items;
  // First item that may contain begin + 1 (items are sorted and disjoint).
  auto j = static_cast<std::size_t>(
      std::partition_point(items.begin(), items.end(),
                           [&](const encoder_item& it) { return it.position + it.tokens <= begin + 1; }) -
      items.begin());
  for (std::int64_t p = begin; p < end; ++p) {
    const std::int64_t next = p + 1;
    while (j < items.size() && items[j].position + items[j].tokens <= next) ++j;
    const bool placeholder = j < items.size() && items[j].position <= next;
    const bool counts = next < d.length() && !placeholder &&
                        (d.loss_mask.empty() || d.loss_mask[static_cast<std::size_t>(p)] != 0);
    f(p, counts);
  }
}
}  // namespace detail

/// The step's summary, once per step, for the builders (which otherwise compute it per call). Pure;
/// O(tokens + documents log documents).
[[nodiscard]] HETMESH_COMPILED step_summary summarize_step(const step_batch& b)
#if HETMESH_BODIES
{
  step_summary s;
  s.offsets.reserve(b.documents.size() + 1);
  s.offsets.push_back(0);
  s.ids.reserve(b.documents.size());
  for (std::size_t i = 0; i < b.documents.size(); ++i) {
    const auto& d = b.documents[i];
    s.offsets.push_back(s.offsets.back() + d.length());
    s.ids.emplace_back(d.id, static_cast<std::int64_t>(i));
    detail::for_each_target(d, 0, d.length(),
                            [&](std::int64_t, bool counts) { s.targets += counts ? 1 : 0; });
  }
  s.tokens = s.offsets.back();
  std::sort(s.ids.begin(), s.ids.end());
  return s;
}
#else
    ;
#endif

namespace detail {
/// Appends the run `positions` of document `doc` to `mb`: per token fields, the segment, and the
/// landings of the document's items that intersect the run.
HETMESH_COMPILED void append_run(micro_batch& mb, const step_batch& b, const step_summary& s,
                                 std::int64_t doc, seq::token_range positions)
#if HETMESH_BODIES
{
  if (positions.size() <= 0) return;
  const auto& d = b.documents[static_cast<std::size_t>(doc)];
  const std::int64_t local = static_cast<std::int64_t>(mb.tokens.size());
  mb.segments.push_back({doc, d.id, positions, local});
  for_each_target(d, positions.begin, positions.end, [&](std::int64_t p, bool counts) {
    const bool real = p < d.length();
    mb.tokens.push_back(real ? d.tokens[static_cast<std::size_t>(p)] : b.pad_token);
    mb.positions.push_back(p);
    mb.doc_ids.push_back(d.id);
    mb.stream_index.push_back(real ? s.offsets[static_cast<std::size_t>(doc)] + p : -1);
    mb.targets.push_back(counts ? d.tokens[static_cast<std::size_t>(p + 1)] : ignore_target);
    mb.loss_weights.push_back(counts ? 1.0 : 0.0);
  });
  for (const auto& it : d.items) {
    const std::int64_t lo = std::max(positions.begin, it.position);
    const std::int64_t hi = std::min(positions.end, it.position + it.tokens);
    if (lo >= hi) continue;
    const encoder_landing l{
        it.encoder, it.id, {lo - it.position, hi - it.position}, local + (lo - positions.begin)};
    auto& out = mb.encoder_outputs;
    if (!out.empty() && out.back().encoder == l.encoder && out.back().item == l.item &&
        out.back().item_tokens.end == l.item_tokens.begin &&
        out.back().local_offset + out.back().item_tokens.size() == l.local_offset) {
      out.back().item_tokens.end = l.item_tokens.end;  // continues the previous run's piece: one landing
    } else {
      out.push_back(l);
    }
  }
}
#else
    ;
#endif

/// cu_seqlens over the segments: one interval per maximal group of consecutive segments of one document.
HETMESH_COMPILED void close_by_segments(micro_batch& mb)
#if HETMESH_BODIES
{
  mb.cu_seqlens.assign(1, 0);
  mb.seqlen_docs.clear();
  for (std::size_t i = 0; i < mb.segments.size(); ++i) {
    const auto& sg = mb.segments[i];
    if (i > 0 && mb.segments[i - 1].doc == sg.doc) {
      mb.cu_seqlens.back() += sg.positions.size();
    } else {
      mb.seqlen_docs.push_back(sg.doc_id);
      mb.cu_seqlens.push_back(sg.local_offset + sg.positions.size());
    }
  }
}
#else
    ;
#endif
}  // namespace detail

/// Micro-batch of `rank` under a context-parallel partition of the batch (THD per document, zigzag of
/// one sequence, or contiguous), made by seq::partition* from document_lengths(b). The rank's tokens are in
/// the partition's local order (THD: per document, chunk r then chunk 2cp-1-r); padding tokens get
/// pad_token, the positions that continue their document, stream index -1 and weight 0. cu_seqlens and
/// seqlen_docs are the partition's (TransformerEngine's cu_seqlens_padded / cp under THD).
/// Preconditions: `s` is summarize_step(b); `p` was made from document_lengths(b) (checked:
/// invalid_argument otherwise); 0 <= rank < p.policy.cp (checked). Postconditions: over all ranks, every
/// stream token appears exactly once and every counting target exactly once. Pure; O(local tokens + local
/// chunks x items per document + documents).
[[nodiscard]] HETMESH_COMPILED micro_batch make_cp_micro_batch(const step_batch& b, const step_summary& s,
                                                               const seq::cp_partition& p, int rank,
                                                               int index = 0)
#if HETMESH_BODIES
{
  if (p.cu_seqlens != s.offsets)
    throw_error<invalid_argument>(
        "make_cp_micro_batch: the partition's cu_seqlens {} do not match the batch's document lengths {}; "
        "expected a partition of document_lengths(batch)",
        p.cu_seqlens, s.offsets);
  if (rank < 0 || rank >= static_cast<int>(p.ranks.size()))
    throw_error<invalid_argument>("make_cp_micro_batch: rank {}; expected a rank in [0, {})", rank,
                                  p.ranks.size());
  const auto& sh = p.ranks[static_cast<std::size_t>(rank)];
  micro_batch mb;
  mb.rank = rank;
  mb.index = index;
  mb.step_tokens = s.tokens;
  mb.step_targets = s.targets;
  const auto n = static_cast<std::size_t>(sh.tokens());
  for (auto* v : {&mb.tokens, &mb.positions, &mb.doc_ids, &mb.stream_index, &mb.targets}) v->reserve(n);
  mb.loss_weights.reserve(n);
  for (const auto& c : sh.chunks) detail::append_run(mb, b, s, c.doc, c.positions);
  mb.cu_seqlens = sh.cu_seqlens;
  mb.seqlen_docs.clear();
  for (auto d : sh.local_docs) mb.seqlen_docs.push_back(b.documents[static_cast<std::size_t>(d)].id);
  return mb;
}
#else
    ;
#endif

/// make_cp_micro_batch with the step's summary computed here: O(step tokens) more.
[[nodiscard]] HETMESH_COMPILED micro_batch make_cp_micro_batch(const step_batch& b,
                                                               const seq::cp_partition& p, int rank,
                                                               int index = 0)
#if HETMESH_BODIES
{
  return make_cp_micro_batch(b, summarize_step(b), p, rank, index);
}
#else
    ;
#endif

/// Micro-batch made of the given segments of documents, in that order: whole sequences on one rank
/// ({id, [0, length)}), a pack, or any pieces a plan hands one rank. cu_seqlens has one interval per
/// maximal group of consecutive segments of one document (a ring's two zigzag chunks form one).
/// Preconditions: `s` is summarize_step(b); every seq_id names a document of `b`, every range lies inside
/// it (both checked: invalid_argument). Pure; O(local tokens + segments x (items per document + log
/// documents)).
[[nodiscard]] HETMESH_COMPILED micro_batch
make_segment_micro_batch(const step_batch& b, const step_summary& s,
                         std::span<const seq::seq_segment> segments, int rank = 0, int index = 0)
#if HETMESH_BODIES
{
  micro_batch mb;
  mb.rank = rank;
  mb.index = index;
  mb.step_tokens = s.tokens;
  mb.step_targets = s.targets;
  for (const auto& sg : segments) {
    const std::int64_t doc = s.find(sg.seq_id);
    if (doc < 0)
      throw_error<invalid_argument>(
          "make_segment_micro_batch: the plan names document id {}, which is not in the step's batch",
          sg.seq_id);
    const auto& d = b.documents[static_cast<std::size_t>(doc)];
    if (sg.tokens.begin < 0 || sg.tokens.end > d.length() || sg.tokens.begin > sg.tokens.end)
      throw_error<invalid_argument>(
          "make_segment_micro_batch: segment {} of document id {}; expected a range inside its {} tokens",
          sg.tokens, sg.seq_id, d.length());
    detail::append_run(mb, b, s, doc, sg.tokens);
  }
  detail::close_by_segments(mb);
  return mb;
}
#else
    ;
#endif

/// make_segment_micro_batch with the step's summary computed here: O(step tokens) more.
[[nodiscard]] HETMESH_COMPILED micro_batch make_segment_micro_batch(
    const step_batch& b, std::span<const seq::seq_segment> segments, int rank = 0, int index = 0)
#if HETMESH_BODIES
{
  return make_segment_micro_batch(b, summarize_step(b), segments, rank, index);
}
#else
    ;
#endif

/// Micro-batch of one HDP micro-batch (a pack of whole sequences, or this rank's two zigzag chunks of a
/// ring's sequence) of a seq::hdp_plan made from document_descs(b). `rank` is the pool rank holding it.
/// Same contract as make_segment_micro_batch; over every micro-batch of every rank of the plan, every
/// stream token and every counting target appears exactly once.
[[nodiscard]] inline micro_batch make_hdp_micro_batch(const step_batch& b, const step_summary& s,
                                                      const seq::hdp_micro_batch& m, int rank = 0,
                                                      int index = 0) {
  return make_segment_micro_batch(b, s, m.segments, rank, index);
}

/// make_hdp_micro_batch with the step's summary computed here: O(step tokens) more.
[[nodiscard]] inline micro_batch make_hdp_micro_batch(const step_batch& b, const seq::hdp_micro_batch& m,
                                                      int rank = 0, int index = 0) {
  return make_hdp_micro_batch(b, summarize_step(b), m, rank, index);
}

/// How the micro-batches of one step fail to hold every stream token exactly once (an
/// exactly_once_violation message), or, failing that, every counting target exactly once; empty when
/// they do. For tests and heavy-level checks. O(tokens log tokens).
[[nodiscard]] HETMESH_COMPILED std::string micro_batch_exactly_once_violation(
    const step_batch& b, std::span<const micro_batch> parts)
#if HETMESH_BODIES
{
  const auto s = summarize_step(b);
  std::vector<id_range> expected{{0, 0, s.tokens}}, assigned;
  std::int64_t targets = 0;
  for (const auto& mb : parts) {
    for (std::size_t i = 0; i < mb.stream_index.size(); ++i) {
      if (mb.stream_index[i] >= 0) assigned.push_back({0, mb.stream_index[i], mb.stream_index[i] + 1});
      targets += mb.loss_weights[i] != 0.0 ? 1 : 0;
    }
  }
  auto v = exactly_once_violation(std::move(expected), std::move(assigned));
  if (!v.empty()) return "stream " + v;
  if (targets != s.targets)
    return hetmesh::format("the micro-batches count {} targets; the step has {}", targets, s.targets);
  return {};
}
#else
    ;
#endif

}  // namespace hetmesh::model

template <>
struct fmt::formatter<hetmesh::model::token_segment> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::model::token_segment& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "doc{}{}@{}", s.doc_id, s.positions, s.local_offset);
  }
};
template <>
struct fmt::formatter<hetmesh::model::encoder_landing> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::model::encoder_landing& l, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "enc{}:item{}{}@{}", l.encoder, l.item, l.item_tokens,
                              l.local_offset);
  }
};
template <>
struct fmt::formatter<hetmesh::model::micro_batch_view> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::model::micro_batch_view& v, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(),
                              "micro_batch{{rank={}, mb={}, tokens={}, targets={}, segments={}, encoder={}}}",
                              v.rank, v.index, v.size(), v.local_targets(), v.segments, v.encoder_outputs);
  }
};
template <>
struct fmt::formatter<hetmesh::model::micro_batch> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::model::micro_batch& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", m.view());
  }
};
