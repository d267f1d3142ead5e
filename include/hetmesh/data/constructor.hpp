// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: data constructors. From a step plan and its loaded samples, build one data-parallel
// rank's packed micro-batches in the layout varlen attention kernels take: the documents' tokens back to
// back, cu_seqlens (prefix sums of document lengths, starting at 0), positions restarting at 0 in every
// document, the loss mask when a document has one, and the encoder items with the document that owns each. A
// micro-batch also flattens to bytes (and back) so the loading rank can broadcast it to the rest of its
// group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "planner.hpp"
#include "sample.hpp"

namespace hetmesh::data {

/// One micro-batch as the backbone consumes it: documents packed back to back (THD layout) with their encoder
/// items.
struct thd_micro_batch {
  std::vector<std::int32_t> tokens{};       ///< token ids, documents back to back
  std::vector<std::int32_t> cu_seqlens{0};  ///< cumulative document lengths, from 0
  std::vector<std::int32_t> positions{};    ///< position of each token within its document
  std::vector<sample_ref> refs{};           ///< one per document, in order
  std::vector<loaded_item> items{};         ///< encoder items of all documents, in order
  std::vector<std::int32_t> item_owner{};   ///< document (index into refs) of each item
  /// Empty when no document of it has a loss mask (every target counts), else one per token: the documents'
  /// masks back to back (1 for every token of a document without one).
  std::vector<std::uint8_t> loss_mask{};

  /// Number of documents.
  [[nodiscard]] std::int64_t documents() const noexcept { return static_cast<std::int64_t>(refs.size()); }
  /// Heap bytes held, for memory accounting.
  [[nodiscard]] HETMESH_COMPILED std::int64_t heap_bytes() const noexcept;
  friend bool operator==(const thd_micro_batch&, const thd_micro_batch&) = default;
};

/// Rank `dp_rank`'s micro-batches of a step: documents in plan order within each micro-batch. Pre:
/// samples[i] is the loaded plan.samples[i]. Local, deterministic; O(tokens + payload bytes).
[[nodiscard]] HETMESH_COMPILED std::vector<thd_micro_batch> construct(const batch_plan& plan,
                                                                      std::span<const sample> samples,
                                                                      int dp_rank, int micro_batches);

/// Flattens a micro-batch to bytes (host byte order: the receivers are ranks of the same job).
[[nodiscard]] HETMESH_COMPILED std::vector<std::byte> serialize(const thd_micro_batch& mb);

/// The inverse of serialize(); throws data_error on truncated or inconsistent bytes.
[[nodiscard]] HETMESH_COMPILED thd_micro_batch deserialize(std::span<const std::byte> bytes);

}  // namespace hetmesh::data

template <>
struct fmt::formatter<hetmesh::data::thd_micro_batch> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::thd_micro_batch& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "micro_batch({} documents, {} tokens, {} items, cu_seqlens={})",
                              m.refs.size(), m.tokens.size(), m.items.size(), m.cu_seqlens);
  }
};

#if HETMESH_BODIES
#include <cstring>

#include "../core/numeric.hpp"

namespace hetmesh::data {

HETMESH_COMPILED std::int64_t thd_micro_batch::heap_bytes() const noexcept {
  auto b = static_cast<std::int64_t>(
      4 * (tokens.capacity() + cu_seqlens.capacity() + positions.capacity() + item_owner.capacity()) +
      refs.capacity() * sizeof(sample_ref) + items.capacity() * sizeof(loaded_item) + loss_mask.capacity());
  for (const auto& it : items) b += static_cast<std::int64_t>(it.payload.capacity() + it.kind.capacity());
  return b;
}

HETMESH_COMPILED std::vector<thd_micro_batch> construct(const batch_plan& plan,
                                                        std::span<const sample> samples, int dp_rank,
                                                        int micro_batches) {
  if (samples.size() != plan.samples.size())
    throw_error<invalid_argument>(
        "construct: {} loaded samples for a plan of {}; expected one per planned sample", samples.size(),
        plan.samples.size());
  std::vector<thd_micro_batch> out(static_cast<std::size_t>(micro_batches));
  std::vector<std::vector<std::int32_t>> lengths(out.size());  // documents per micro-batch, in order
  for (std::size_t i = 0; i < plan.samples.size(); ++i) {
    const auto& p = plan.samples[i];
    if (p.dp_rank != dp_rank) continue;
    if (samples[i].ref != p.ref)
      throw_error<data_error>("construct: loaded sample {} is {} but the plan says {}", i, samples[i].ref,
                              p.ref);
    auto& mb = out[static_cast<std::size_t>(p.micro_batch)];
    const auto& toks = samples[i].tokens;
    const auto& mask = samples[i].loss_mask;
    check_loss_mask(samples[i], "construct");
    if (!mask.empty()) {
      mb.loss_mask.resize(mb.tokens.size(), 1);  // earlier documents without a mask: every target counts
      mb.loss_mask.insert(mb.loss_mask.end(), mask.begin(), mask.end());
    } else if (!mb.loss_mask.empty()) {
      mb.loss_mask.insert(mb.loss_mask.end(), toks.size(), 1);
    }
    mb.tokens.insert(mb.tokens.end(), toks.begin(), toks.end());
    for (std::size_t k = 0; k < toks.size(); ++k) mb.positions.push_back(static_cast<std::int32_t>(k));
    lengths[static_cast<std::size_t>(p.micro_batch)].push_back(static_cast<std::int32_t>(toks.size()));
    for (const auto& it : samples[i].items) {
      mb.items.push_back(it);
      mb.item_owner.push_back(static_cast<std::int32_t>(mb.refs.size()));
    }
    mb.refs.push_back(p.ref);
  }
  for (std::size_t k = 0; k < out.size(); ++k) out[k].cu_seqlens = prefix_sums(lengths[k]);
  return out;
}

namespace detail {
struct byte_writer {
  std::vector<std::byte>& out;
  template <class T>
  void pod(const T& v) {
    const auto* b = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), b, b + sizeof v);
  }
  template <class T>
  void array(std::span<const T> v) {
    pod(static_cast<std::int64_t>(v.size()));
    const auto* b = reinterpret_cast<const std::byte*>(v.data());
    out.insert(out.end(), b, b + v.size_bytes());
  }
};
struct byte_reader {
  std::span<const std::byte> in;
  std::size_t at = 0;
  void need(std::size_t n) {
    if (at + n > in.size())
      throw_error<data_error>("packed micro-batch bytes are truncated: need {} at offset {}, have {}", n, at,
                              in.size());
  }
  template <class T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
  template <class T>
  std::vector<T> array() {
    const auto n = pod<std::int64_t>();
    if (n < 0 || static_cast<std::uint64_t>(n) > in.size())
      throw_error<data_error>("packed micro-batch bytes: bad array length {}", n);
    need(static_cast<std::size_t>(n) * sizeof(T));
    std::vector<T> v(static_cast<std::size_t>(n));
    if (!v.empty()) std::memcpy(v.data(), in.data() + at, v.size() * sizeof(T));  // empty: data() may be null
    at += v.size() * sizeof(T);
    return v;
  }
};
}  // namespace detail

HETMESH_COMPILED std::vector<std::byte> serialize(const thd_micro_batch& mb) {
  std::vector<std::byte> out{};
  detail::byte_writer w{out};
  w.array<std::int32_t>(mb.tokens);
  w.array<std::int32_t>(mb.cu_seqlens);
  w.array<std::int32_t>(mb.positions);
  w.array<sample_ref>(mb.refs);
  w.array<std::int32_t>(mb.item_owner);
  w.array<std::uint8_t>(mb.loss_mask);
  w.pod(static_cast<std::int64_t>(mb.items.size()));
  for (const auto& it : mb.items) {
    w.array<char>(it.kind);
    w.pod(it.tokens);
    w.array<std::byte>(it.payload);
  }
  return out;
}

HETMESH_COMPILED thd_micro_batch deserialize(std::span<const std::byte> bytes) {
  detail::byte_reader r{bytes};
  thd_micro_batch mb;
  mb.tokens = r.array<std::int32_t>();
  mb.cu_seqlens = r.array<std::int32_t>();
  mb.positions = r.array<std::int32_t>();
  mb.refs = r.array<sample_ref>();
  mb.item_owner = r.array<std::int32_t>();
  mb.loss_mask = r.array<std::uint8_t>();
  const auto n = r.pod<std::int64_t>();
  if (n < 0 || n != static_cast<std::int64_t>(mb.item_owner.size()))
    throw_error<data_error>("packed micro-batch bytes: {} items but {} owners", n, mb.item_owner.size());
  for (std::int64_t k = 0; k < n; ++k) {
    const auto kind = r.array<char>();
    loaded_item it{.kind = std::string(kind.begin(), kind.end()),
                   .tokens = r.pod<std::int64_t>(),
                   .payload = r.array<std::byte>()};
    mb.items.push_back(std::move(it));
  }
  if (r.at != bytes.size())
    throw_error<data_error>("packed micro-batch bytes: {} trailing bytes", bytes.size() - r.at);
  if (mb.cu_seqlens.empty() || mb.cu_seqlens.back() != static_cast<std::int32_t>(mb.tokens.size()) ||
      mb.positions.size() != mb.tokens.size() || mb.cu_seqlens.size() != mb.refs.size() + 1)
    throw_error<data_error>(
        "packed micro-batch bytes: inconsistent sizes (tokens {}, positions {}, cu_seqlens {}, documents {})",
        mb.tokens.size(), mb.positions.size(), mb.cu_seqlens.size(), mb.refs.size());
  if (!mb.loss_mask.empty() && mb.loss_mask.size() != mb.tokens.size())
    throw_error<data_error>(
        "packed micro-batch bytes: a loss mask of {} entries for {} tokens; expected one per token",
        mb.loss_mask.size(), mb.tokens.size());
  for (std::size_t k = 0; k < mb.loss_mask.size(); ++k)
    if (mb.loss_mask[k] > 1)
      throw_error<data_error>("packed micro-batch bytes: loss mask entry {} at token {}; expected 0 or 1",
                              mb.loss_mask[k], k);
  return mb;
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
