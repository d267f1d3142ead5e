// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: the one projection from the data room's records to the model room's. data:: holds what a
// loader read (data::loaded_batch: the step's data plan and its samples, text ids as int32, encoder items
// by kind with their payload bytes); model:: holds what the stages read (model::step_batch: documents with
// int64 token ids in which each encoder item is a run of placeholder tokens). A trainer turns the one into
// the other with run::to_step_batch instead of bridging the two families by hand. It lives in run/, the
// room that may include both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../data/loader.hpp"
#include "../data/sample.hpp"
#include "../model/micro_batch.hpp"

namespace hetmesh::run {

/// How to_step_batch lays a loaded sample out as a model::document.
struct record_projection {
  /// The model's encoders by the kinds of item each encodes (data::loaded_item::kind): an item goes to the
  /// first encoder e whose entry is a prefix of its kind ("image" takes "image"; "img" takes the numbered
  /// kinds "img0", "img1", ... of a WebDataset sample with several images). An empty entry takes nothing.
  std::vector<std::string> encoders{};
  std::int64_t placeholder_token = 0;  ///< token id of an encoder item's placeholder tokens
  std::int64_t pad_token = 0;          ///< model::step_batch::pad_token
  friend bool operator==(const record_projection&, const record_projection&) = default;
};

/// The encoder that takes item kind `kind` under `p` (the first whose entry is a non-empty prefix of it), or
/// -1 when none does. O(encoders x kind length).
[[nodiscard]] HETMESH_COMPILED int encoder_of(const record_projection& p, std::string_view kind) noexcept
#if HETMESH_BODIES
{
  for (std::size_t e = 0; e < p.encoders.size(); ++e)
    if (!p.encoders[e].empty() && kind.starts_with(p.encoders[e])) return static_cast<int>(e);
  return -1;
}
#else
    ;
#endif

/// The model's view of one loaded step: one model::document per sample, in the plan's order (the data
/// plan's canonical order, so every rank that loaded the same step builds the same batch).
///
/// Contract, per sample i (b.samples[i], planned as b.plan.samples[i]):
/// - the document's id is the sample's stream id, b.plan.samples[i].ref.id();
/// - its tokens are, first, each encoder item's placeholders in the sample's item order (item.tokens
///   tokens of p.placeholder_token each, consecutive), then the sample's text ids widened to int64;
/// - its items name the encoder of their kind (encoder_of), number items per encoder from 0 in the
///   step's document order, and start at their first placeholder (model::encoder_item::position);
/// - its loss mask is empty when the sample's is (every target counts), else a 1 per placeholder (whether a
///   placeholder's target counts is model::target_counts' business) followed by the sample's mask.
/// The result's pad_token is p.pad_token. Payload bytes are not read: the encoders' inputs stay the user's
/// (items are numbered in the order a loop over b.samples and their items meets them).
///
/// Throws invalid_argument naming the sample when b.samples and b.plan.samples differ in size, when a
/// sample was not loaded on this process (its ref is not the plan's: data::loader_options::serve_dp left
/// it empty), when an item's kind has no encoder in p (naming the kind and the encoders) or has negative
/// tokens, and when a sample's loss mask does not have one entry per text token. Pure; O(tokens + items).
[[nodiscard]] HETMESH_COMPILED model::step_batch to_step_batch(const data::loaded_batch& b,
                                                               const record_projection& p)
#if HETMESH_BODIES
{
  if (b.samples.size() != b.plan.samples.size())
    throw_error<invalid_argument>(
        "run::to_step_batch: step {} has {} loaded samples for {} planned; expected one "
        "per planned sample",
        b.plan.step, b.samples.size(), b.plan.samples.size());
  model::step_batch out;
  out.pad_token = p.pad_token;
  out.documents.reserve(b.samples.size());
  std::vector<std::int64_t> next_id(p.encoders.size(), 0);
  for (std::size_t i = 0; i < b.samples.size(); ++i) {
    const data::sample& s = b.samples[i];
    const data::sample_ref& want = b.plan.samples[i].ref;
    if (!(s.ref == want))
      throw_error<invalid_argument>(
          "run::to_step_batch: step {} sample {} ({}) was not loaded here (got {}); "
          "expected every planned sample (data::loader_options::serve_dp)",
          b.plan.step, i, want, s.ref);
    if (!s.loss_mask.empty() && s.loss_mask.size() != s.tokens.size())
      throw_error<invalid_argument>(
          "run::to_step_batch: sample {} has a loss mask of {} entries for {} text "
          "tokens; expected one per token",
          want, s.loss_mask.size(), s.tokens.size());
    model::document d;
    d.id = want.id();
    for (const data::loaded_item& it : s.items) {
      const int e = encoder_of(p, it.kind);
      if (e < 0) {
        std::string list;
        for (const auto& k : p.encoders) list += hetmesh::format("{}'{}'", list.empty() ? "" : ", ", k);
        throw_error<invalid_argument>(
            "run::to_step_batch: sample {} has an item of kind '{}'; expected one of "
            "the encoders' kinds (prefixes) [{}]",
            want, it.kind, list);
      }
      if (it.tokens < 0)
        throw_error<invalid_argument>("run::to_step_batch: sample {} item '{}' has {} tokens; expected >= 0",
                                      want, it.kind, it.tokens);
      d.items.push_back({.encoder = e,
                         .id = next_id[static_cast<std::size_t>(e)]++,
                         .position = d.length(),
                         .tokens = it.tokens});
      d.tokens.insert(d.tokens.end(), static_cast<std::size_t>(it.tokens), p.placeholder_token);
    }
    if (!s.loss_mask.empty()) {
      d.loss_mask.assign(d.tokens.size(), 1);
      d.loss_mask.insert(d.loss_mask.end(), s.loss_mask.begin(), s.loss_mask.end());
    }
    d.tokens.insert(d.tokens.end(), s.tokens.begin(), s.tokens.end());
    out.documents.push_back(std::move(d));
  }
  return out;
}
#else
    ;
#endif

}  // namespace hetmesh::run
