// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: a rank's micro-batches of a step plan, from the whole step's batch or from the share of
// it that delivery by plan brought the rank (train/delivery.hpp): the documents its micro-batches read,
// in stream order, and the step's target count from the step's metadata.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../data/routes.hpp"
#include "../model/micro_batch.hpp"
#include "../model/micro_batch_runs.hpp"
#include "step_plan.hpp"

namespace hetmesh::train {

namespace detail {
/// The micro-batch of planned micro-batch `pm` of pool rank `rank`: its runs' tokens from `batch` (the
/// whole step, or a sparse step whose unread documents are empty), its attention intervals, the step's
/// token and target counts from `s` (the whole step's summary). Errors (invalid_argument): a run over a
/// document the batch holds at another length than the plan's. Pure; O(local tokens + runs x items).
[[nodiscard]] HETMESH_COMPILED model::micro_batch build_micro_batch(const step_layout& l,
                                                                    const planned_micro_batch& pm,
                                                                    const model::step_batch& batch,
                                                                    const model::step_summary& s, int rank)
#if HETMESH_BODIES
{
  model::micro_batch mb;
  mb.rank = rank;
  mb.index = pm.slot;
  mb.step_tokens = s.tokens;
  mb.step_targets = s.targets;
  const auto n = static_cast<std::size_t>(pm.tokens());
  for (auto* v : {&mb.tokens, &mb.positions, &mb.doc_ids, &mb.stream_index, &mb.targets}) v->reserve(n);
  mb.loss_weights.reserve(n);
  for (const auto& r : pm.runs) {
    const auto d = static_cast<std::size_t>(r.doc);
    if (d >= batch.documents.size() || batch.documents[d].length() != l.documents[d].length)
      throw_error<invalid_argument>(
          "train::build_micro_batches: pool rank {} slot {} reads document {} of {} tokens, which the batch "
          "holds with {}; expected the batch the plan was made from",
          rank, pm.slot, d < l.documents.size() ? l.documents[d].id : -1,
          d < l.documents.size() ? l.documents[d].length : -1,
          d < batch.documents.size() ? batch.documents[d].length() : -1);
    model::append_tokens(mb, batch, s, r.doc, r.positions);
  }
  if (pm.cu_seqlens.empty()) {
    model::close_by_segments(mb);
  } else {
    mb.cu_seqlens = pm.cu_seqlens;
    mb.seqlen_docs = pm.seqlen_docs;
  }
  return mb;
}
#else
    ;
#endif

/// build_micro_batches without the check that `batch` is the plan's (a sparse step passes: documents the
/// rank does not read may be empty, `s` is the whole step's).
[[nodiscard]] HETMESH_COMPILED std::vector<model::micro_batch> build_rank_micro_batches(
    const step_layout& plan, const model::step_batch& batch, const model::step_summary& s, int rank)
#if HETMESH_BODIES
{
  if (rank < 0 || rank >= plan.world)
    throw_error<invalid_argument>("train::build_micro_batches: rank {}; expected 0 <= rank < {}", rank,
                                  plan.world);
  std::vector<model::micro_batch> out;
  for (const auto& pm : plan.per_rank[static_cast<std::size_t>(rank)])
    out.push_back(build_micro_batch(plan, pm, batch, s, rank));
  return out;
}
#else
    ;
#endif
}  // namespace detail

/// The micro-batches `rank` runs under `plan`, in execution order, for the step `batch`: each planned
/// micro-batch's token runs (the family's layout: a static CP rank's share of its group's piece, an HDP
/// micro-batch's segments, ...) with the step's stream indices, token and target counts. Pre: `s` is
/// summarize_step(batch), the plan was made from document_descs(batch) (invalid_argument otherwise),
/// 0 <= rank < plan.world. Post: over every rank, each stream token and each counting target appears
/// exactly once. Pure; O(local tokens + documents).
[[nodiscard]] HETMESH_COMPILED std::vector<model::micro_batch> build_micro_batches(
    const step_layout& plan, const model::step_batch& batch, const model::step_summary& s, int rank)
#if HETMESH_BODIES
{
  if (model::document_descs(batch) != plan.documents)
    throw_error<invalid_argument>(
        "train::build_micro_batches: the step's documents do not match the plan's {} documents; expected "
        "the batch the plan was made from",
        plan.documents.size());
  return detail::build_rank_micro_batches(plan, batch, s, rank);
}
#else
    ;
#endif

/// The ids of the documents pool rank `r` builds micro-batches over under `plan` (its micro-batches' runs),
/// in first-use order, each once. Pre: 0 <= r < plan.world. O(r's runs x documents read).
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> documents_of(const step_layout& plan, int r)
#if HETMESH_BODIES
{
  std::vector<std::int64_t> out;
  for (const auto& pm : plan.per_rank[static_cast<std::size_t>(r)])
    for (const auto& run : pm.runs) {
      const auto id = plan.documents[static_cast<std::size_t>(run.doc)].id;
      if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
    }
  return out;
}
#else
    ;
#endif

/// The targets that count in a document of `length` tokens with encoder items `items` and no loss mask
/// (model::target_counts' rule: a next token exists and is not a placeholder). Pure; O(items).
[[nodiscard]] HETMESH_COMPILED std::int64_t document_targets(
    std::int64_t length, std::span<const model::encoder_item> items) noexcept
#if HETMESH_BODIES
{
  std::int64_t n = std::max<std::int64_t>(length - 1, 0);
  for (const auto& it : items)  // placeholders at positions 1 .. length - 1 are next tokens that do not count
    n -= std::max<std::int64_t>(
        0, std::min(it.position + it.tokens, length) - std::max<std::int64_t>(it.position, 1));
  return n;
}
#else
    ;
#endif

/// What one rank holds of a step under delivery by plan: the documents its micro-batches read (at least
/// documents_of(plan, pool rank); others are ignored), any order, and the whole step's target count (the
/// planners know it from the step's metadata: the sum of document_targets, or the loaders' counts where
/// samples carry loss masks).
struct rank_share {
  model::step_batch batch;        ///< the rank's documents (tokens, items, loss masks) and the pad token
  std::int64_t step_targets = 0;  ///< targets that count in the whole step

  friend bool operator==(const rank_share&, const rank_share&) = default;
};

/// The bytes of a document's text as delivery moves them: its token ids as std::int64_t in host byte
/// order. O(1).
[[nodiscard]] inline std::span<const std::uint8_t> text_bytes(const model::document& d) noexcept {
  return {reinterpret_cast<const std::uint8_t*>(d.tokens.data()), d.tokens.size() * sizeof(std::int64_t)};
}

/// The bytes of a document's text part with its loss mask: text_bytes(d), then, when `d` has a loss mask,
/// one byte per token (0: that token's target does not count). share_of reads both forms (8 or 9 bytes
/// per token). O(length).
[[nodiscard]] HETMESH_COMPILED std::vector<std::uint8_t> text_part_bytes(const model::document& d)
#if HETMESH_BODIES
{
  const auto t = text_bytes(d);
  std::vector<std::uint8_t> out(t.size() + d.loss_mask.size());
  std::copy(t.begin(), t.end(), out.begin());
  std::copy(d.loss_mask.begin(), d.loss_mask.end(), out.begin() + static_cast<std::ptrdiff_t>(t.size()));
  return out;
}
#else
    ;
#endif

/// The targets of document `d` that count in the loss (model::target_counts' rule, its loss mask
/// included). O(length x items) with a mask, O(items) without.
[[nodiscard]] HETMESH_COMPILED std::int64_t document_targets(const model::document& d) noexcept
#if HETMESH_BODIES
{
  if (d.loss_mask.empty()) return document_targets(d.length(), d.items);
  std::int64_t n = 0;
  for (std::int64_t p = 0; p < d.length(); ++p) n += model::target_counts(d, p) ? 1 : 0;
  return n;
}
#else
    ;
#endif

/// The rank share of a delivered share: per text part received, the document (id and tokens from its bytes,
/// text_bytes' or text_part_bytes' encoding: with 9 bytes per token, the last length bytes are its loss
/// mask; items from `items`, the items of plan.documents[i]), in stream order; step_targets the sum of
/// document_targets over the plan's documents, which cannot see the loss masks of documents this rank did
/// not receive: with loss masks, use the overload that takes the step (or set step_targets from the
/// loaders' counts). Errors (invalid_argument): items for another number of documents, a text part of a
/// sample not in the plan or whose byte count is neither 8 nor 9 x its length. O(received bytes + documents
/// x items).
[[nodiscard]] HETMESH_COMPILED rank_share share_of(const step_layout& plan,
                                                   std::span<const std::vector<model::encoder_item>> items,
                                                   const data::delivered_share& got,
                                                   std::int64_t pad_token = 0)
#if HETMESH_BODIES
{
  if (items.size() != plan.documents.size())
    throw_error<invalid_argument>("train::share_of: items for {} documents; expected the plan's {}",
                                  items.size(), plan.documents.size());
  rank_share out;
  out.batch.pad_token = pad_token;
  for (std::size_t i = 0; i < plan.documents.size(); ++i) {
    const auto& d = plan.documents[i];
    out.step_targets += document_targets(d.length, items[i]);
    if (!got.has(d.id)) continue;
    const auto b = got.find(d.id);
    const auto n = static_cast<std::size_t>(d.length);
    const std::size_t text = n * sizeof(std::int64_t);
    if (b.size() != text && b.size() != text + n)
      throw_error<invalid_argument>(
          "train::share_of: sample {} arrived with {} text bytes; expected {} tokens x 8 bytes ({}), or x 9 "
          "with a loss mask ({})",
          d.id, b.size(), d.length, text, text + n);
    model::document doc{d.id, std::vector<std::int64_t>(n), items[i], {}};
    std::memcpy(doc.tokens.data(), b.data(), text);
    if (b.size() > text) doc.loss_mask.assign(b.begin() + static_cast<std::ptrdiff_t>(text), b.end());
    out.batch.documents.push_back(std::move(doc));
  }
  for (const auto& p : got.parts)
    if (p.item == data::text_part && std::none_of(plan.documents.begin(), plan.documents.end(),
                                                  [&](const seq::seq_desc& d) { return d.id == p.sample; }))
      throw_error<invalid_argument>("train::share_of: sample {} arrived but is not in the plan", p.sample);
  return out;
}
#else
    ;
#endif

/// share_of with the items and pad token of `step`, the batch (or its metadata) the plan was made from, and
/// its target count (document_targets of each of its documents: loss masks included); its token values are
/// not read. Errors: share_of's, and invalid_argument for a step of other documents than the plan's.
/// O(received bytes + step tokens x items).
[[nodiscard]] HETMESH_COMPILED rank_share share_of(const step_layout& plan, const model::step_batch& step,
                                                   const data::delivered_share& got)
#if HETMESH_BODIES
{
  if (model::document_descs(step) != plan.documents)
    throw_error<invalid_argument>(
        "train::share_of: the step's documents do not match the plan's {} documents; expected the batch the "
        "plan was made from",
        plan.documents.size());
  std::vector<std::vector<model::encoder_item>> items;
  for (const auto& d : step.documents) items.push_back(d.items);
  auto out = share_of(plan, items, got, step.pad_token);
  out.step_targets = 0;
  for (const auto& d : step.documents) out.step_targets += document_targets(d);
  return out;
}
#else
    ;
#endif

namespace detail {
/// The step as rank `rank` sees it under delivery: every plan document in stream order (the share's
/// documents whole, the others empty), and the whole step's summary from the plan's lengths and the
/// share's target count. Errors (invalid_argument): a document the rank reads missing from the share, or
/// of another length. O(share tokens + documents log documents).
HETMESH_COMPILED std::pair<model::step_batch, model::step_summary> sparse_step(const step_layout& plan,
                                                                               const rank_share& share,
                                                                               int rank)
#if HETMESH_BODIES
{
  model::step_batch b;
  b.pad_token = share.batch.pad_token;
  model::step_summary s;
  s.offsets.push_back(0);
  for (std::size_t i = 0; i < plan.documents.size(); ++i) {
    const auto& d = plan.documents[i];
    s.offsets.push_back(s.offsets.back() + d.length);
    s.ids.emplace_back(d.id, static_cast<std::int64_t>(i));
    b.documents.push_back(model::document{d.id, {}, {}, {}});
  }
  s.tokens = s.offsets.back();
  s.targets = share.step_targets;
  std::sort(s.ids.begin(), s.ids.end());
  for (const auto& d : share.batch.documents) {
    const auto i = s.find(d.id);
    if (i >= 0) b.documents[static_cast<std::size_t>(i)] = d;
  }
  for (auto id : documents_of(plan, rank)) {
    const auto i = static_cast<std::size_t>(s.find(id));
    if (b.documents[i].length() != plan.documents[i].length)
      throw_error<invalid_argument>(
          "train::system::run: pool rank {} reads document {} of {} tokens but its share holds {}; expected "
          "the share delivery by plan brings it",
          rank, id, plan.documents[i].length, b.documents[i].length());
  }
  return {std::move(b), std::move(s)};
}
#else
    ;
#endif
}  // namespace detail

}  // namespace hetmesh::train
