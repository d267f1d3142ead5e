// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the documents of one step as the micro-batch builders (micro_batch.hpp) take them:
// per document its id, text token ids (with placeholder tokens where encoder outputs land), its encoder
// items and an optional loss mask; the rule for which token's next-token target counts; the batch's
// validation; and the per-document lengths and descriptors the partition planners take.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/sort.hpp"
#include "../seq/types.hpp"

namespace hetmesh::model {

/// Target id of a token whose loss does not count (PyTorch's ignore_index).
inline constexpr std::int64_t ignore_target = -100;

/// One encoder item of a document (an image, an audio clip, a video): which encoder encodes it, its
/// id, and the placeholder tokens of the document its output replaces, [position, position + tokens).
struct encoder_item {
  int encoder = 0;            ///< index of the encoder in the model's list of encoders
  std::int64_t id = 0;        ///< item id, unique per encoder within the step
  std::int64_t position = 0;  ///< first placeholder token in the document
  std::int64_t tokens = 0;    ///< output tokens of the encoder = placeholder tokens in the document

  friend constexpr bool operator==(const encoder_item&, const encoder_item&) = default;
};

/// One document (sample) of a step: its id, its text token ids (placeholders included) and its encoder
/// items. `loss_mask`, when not empty, has one entry per token: 0 means that token's next-token loss
/// does not count (a prompt, a system turn).
struct document {
  std::int64_t id = 0;                  ///< document id, unique in the step
  std::vector<std::int64_t> tokens;     ///< token ids, placeholders included
  std::vector<encoder_item> items;      ///< encoder items, by position, not overlapping
  std::vector<std::uint8_t> loss_mask;  ///< empty, or per token: 0 = its target does not count

  /// Tokens of the document.
  [[nodiscard]] std::int64_t length() const noexcept { return static_cast<std::int64_t>(tokens.size()); }
  friend bool operator==(const document&, const document&) = default;
};

/// The documents of one step, in stream order, and the token id written into padding (CP pads each
/// document to a multiple of 2cp).
struct step_batch {
  std::vector<document> documents;  ///< in stream order
  std::int64_t pad_token = 0;       ///< token id of padding

  friend bool operator==(const step_batch&, const step_batch&) = default;
};

/// Per document, its length: the input of seq::partition_thd and friends. O(documents).
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> document_lengths(const step_batch& b)
#if HETMESH_BODIES
{
  std::vector<std::int64_t> out;
  out.reserve(b.documents.size());
  for (const auto& d : b.documents) out.push_back(d.length());
  return out;
}
#else
    ;
#endif

/// Per document, (id, length): the input of seq::plan_hdp. O(documents).
[[nodiscard]] HETMESH_COMPILED std::vector<seq::seq_desc> document_descs(const step_batch& b)
#if HETMESH_BODIES
{
  std::vector<seq::seq_desc> out;
  out.reserve(b.documents.size());
  for (const auto& d : b.documents) out.push_back({d.id, d.length()});
  return out;
}
#else
    ;
#endif

/// Whether document `d`'s token at `pos` has a target that counts: a next token exists in the document,
/// it is not an encoder placeholder, and the loss mask (if any) keeps it. Pre: 0 <= pos < d.length().
/// O(items).
[[nodiscard]] HETMESH_COMPILED bool target_counts(const document& d, std::int64_t pos) noexcept
#if HETMESH_BODIES
{
  const std::int64_t next = pos + 1;
  if (next >= d.length()) return false;
  if (!d.loss_mask.empty() && d.loss_mask[static_cast<std::size_t>(pos)] == 0) return false;
  for (const auto& it : d.items)
    if (next >= it.position && next < it.position + it.tokens) return false;
  return true;
}
#else
    ;
#endif

/// Validates a step's batch: throws invalid_argument naming the first document with a repeated id, a loss
/// mask of the wrong size, an encoder item outside its document, overlapping or out of order items, a
/// negative encoder index, or an (encoder, item id) pair used twice. Pure; O(n log n) in items and documents.
HETMESH_COMPILED void check_step_batch(const step_batch& b)
#if HETMESH_BODIES
{
  std::vector<std::int64_t> ids;
  std::vector<std::pair<int, std::int64_t>> items;
  for (std::size_t i = 0; i < b.documents.size(); ++i) {
    const auto& d = b.documents[i];
    ids.push_back(d.id);
    if (!d.loss_mask.empty() && d.loss_mask.size() != d.tokens.size())
      throw_error<invalid_argument>(
          "step_batch: document {} (id {}) has a loss mask of {} entries for {} tokens", i, d.id,
          d.loss_mask.size(), d.tokens.size());
    std::int64_t end = 0;
    for (const auto& it : d.items) {
      if (it.encoder < 0)
        throw_error<invalid_argument>("step_batch: document id {} item {} names encoder {}; expected >= 0",
                                      d.id, it.id, it.encoder);
      if (it.tokens < 0 || it.position < end || it.position + it.tokens > d.length())
        throw_error<invalid_argument>(
            "step_batch: document id {} item {} (encoder {}) covers tokens [{}, {}); expected items in "
            "position order, not overlapping, inside the document's {} tokens",
            d.id, it.id, it.encoder, it.position, it.position + it.tokens, d.length());
      end = it.position + it.tokens;
      items.emplace_back(it.encoder, it.id);
    }
  }
  hetmesh::indirect_sort(ids.begin(), ids.end());
  for (std::size_t i = 1; i < ids.size(); ++i)
    if (ids[i] == ids[i - 1])
      throw_error<invalid_argument>("step_batch: document id {} appears twice; expected unique ids", ids[i]);
  hetmesh::indirect_sort(items.begin(), items.end());
  for (std::size_t i = 1; i < items.size(); ++i)
    if (items[i] == items[i - 1])
      throw_error<invalid_argument>("step_batch: encoder {} item id {} appears twice; expected unique ids",
                                    items[i].first, items[i].second);
}
#else
    ;
#endif

}  // namespace hetmesh::model
