// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: in-process sources. A memory source is records the user fills in this process (text
// token ids in the model's int64 type, encoder items of any modality -- an image, an audio clip, a
// video's frames as patch rows -- and an optional loss mask); a generated source is a pure function
// index -> record, with a declared size or unbounded. Both enter a mixture as a source_spec with format
// source_format::in_process, and from there on they are sources like the files: mixed by weight and
// curriculum, filtered into long/short buckets, shuffled per epoch, balanced by the planner, and resumed
// from the same per-source cursor. Records are checked when they enter (a memory source's at
// construction, a generated one's at each generation), so a bad record is a data_error naming the source
// and the index, never a silent wrong batch. run::to_step_batch then projects the loaded batch onto the
// model's model::step_batch (int64 ids, items as placeholder runs) in one call.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <ranges>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../seq/sample.hpp"
#include "mixture.hpp"
#include "sample.hpp"
#include "source.hpp"

namespace hetmesh::data {

/// One record of an in-process source: a sample as the user holds it. Token ids are int64, the model's
/// type (model::document::tokens); the source narrows them to the data plane's int32 after checking them.
struct memory_record {
  std::vector<std::int64_t> tokens{};     ///< text token ids, each in [0, vocab) (record_checks::vocab)
  std::vector<loaded_item> items{};       ///< encoder items, in the sample's order (make_item builds one)
  std::vector<std::uint8_t> loss_mask{};  ///< empty, or one 0/1 per text token (data::sample::loss_mask)
  friend bool operator==(const memory_record&, const memory_record&) = default;
};

/// What an in-process source checks of every record, besides what always holds (at least one text token
/// or encoder item; ids in [0, 2^31); items with a kind and at least one token; a loss mask of one 0/1
/// per text token, or none).
struct record_checks {
  std::int64_t vocab = 0;  ///< 0: unknown; otherwise every text token id is below it
  /// The item kinds the model's encoders take (run::record_projection::encoders: an item's kind must start
  /// with one of them). Empty: any kind.
  std::vector<std::string> kinds{};
  friend bool operator==(const record_checks&, const record_checks&) = default;
};

/// An encoder item of `kind` that becomes `tokens` LLM tokens, its payload the bytes of `values` (e.g. a
/// video clip: frames x patches rows of floats, tokens = the encoder's output tokens). Pre: `values`'
/// elements are trivially copyable. O(bytes).
template <std::ranges::contiguous_range R>
requires std::ranges::sized_range<R> && std::is_trivially_copyable_v<std::ranges::range_value_t<R>>
[[nodiscard]] loaded_item make_item(std::string kind, std::int64_t tokens, const R& values) {
  const auto bytes = std::ranges::size(values) * sizeof(std::ranges::range_value_t<R>);
  loaded_item it{.kind = std::move(kind), .tokens = tokens, .payload = std::vector<std::byte>(bytes)};
  if (bytes > 0) std::memcpy(it.payload.data(), std::ranges::data(values), bytes);
  return it;
}

/// The payload of `item` as values of T (what make_item stored), copied out. Throws data_error naming the
/// kind when the payload's size is not a multiple of sizeof(T). O(bytes).
template <class T>
requires std::is_trivially_copyable_v<T>
[[nodiscard]] std::vector<T> payload_as(const loaded_item& item) {
  if (item.payload.size() % sizeof(T) != 0)
    throw_error<data_error>(
        "payload_as: item '{}' holds {} bytes; expected a multiple of {} (the element size)", item.kind,
        item.payload.size(), sizeof(T));
  std::vector<T> out(item.payload.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), item.payload.data(), item.payload.size());
  return out;
}

/// Generates record `index` of a generated source. Called from loader threads concurrently: must be a
/// pure function of the index (the same record every call, on every rank).
using record_generator = std::function<memory_record(std::int64_t index)>;
/// The lengths of record `index` (tokens, item_tokens; bytes may be 0) without generating it: what the
/// planner asks for every sample it draws. Optional; without it the planner generates the record.
using record_lengths = std::function<seq::sample_meta(std::int64_t index)>;
/// The size of a generated source that never runs dry: its loader hands out indices in order (0, 1, 2,
/// ...) instead of a per-epoch permutation, which could not be held.
inline constexpr std::int64_t unbounded = -1;

namespace detail {

/// Checks `r` against `c` and the rules that always hold, and narrows it to a data::sample. Throws
/// data_error naming the source, the record's index, the field and what was expected. O(tokens + items).
[[nodiscard]] HETMESH_COMPILED sample checked_sample(memory_record&& r, const record_checks& c,
                                                     std::string_view source, std::int64_t index);

/// The metadata of a loaded sample: its text tokens, its items' tokens, its bytes (4 per id + payloads).
[[nodiscard]] HETMESH_COMPILED seq::sample_meta meta_of(const sample& s);

/// Mixes a checked sample's content into `h` (a source's fingerprint). O(bytes).
HETMESH_COMPILED void append_content(hasher& h, const sample& s);

/// The records of a memory source, checked and narrowed once, shared (immutable) by its loaders.
class memory_reader final : public source_reader {
 public:
  memory_reader(std::vector<sample> records, std::int64_t bytes)
      : records_(std::move(records)), bytes_(bytes) {}
  [[nodiscard]] std::int64_t size() const override { return static_cast<std::int64_t>(records_.size()); }
  [[nodiscard]] seq::sample_meta meta(std::int64_t i) const override { return meta_of(at(i)); }
  HETMESH_COMPILED void load(std::int64_t i, sample& out) const override;
  [[nodiscard]] std::int64_t state_bytes() const override { return bytes_; }
  [[nodiscard]] std::int64_t mapped_data_bytes() const override { return 0; }

 private:
  [[nodiscard]] const sample& at(std::int64_t i) const { return records_[static_cast<std::size_t>(i)]; }
  std::vector<sample> records_;
  std::int64_t bytes_;
};

/// A generated source: records made on demand by the user's generator, checked each time.
class generated_reader final : public source_reader {
 public:
  generated_reader(std::string name, std::int64_t size, record_generator gen, record_checks checks,
                   record_lengths lengths)
      : name_(std::move(name)),
        size_(size),
        gen_(std::move(gen)),
        checks_(std::move(checks)),
        lengths_(std::move(lengths)) {}
  [[nodiscard]] std::int64_t size() const override {
    return size_ == unbounded ? seq::sample_id_layout::max_position + 1 : size_;
  }
  [[nodiscard]] seq::sample_meta meta(std::int64_t i) const override {
    if (!lengths_) return meta_of(generate(i));
    auto m = lengths_(i);
    m.id = 0;
    m.owner = 0;
    return m;
  }
  HETMESH_COMPILED void load(std::int64_t i, sample& out) const override;
  [[nodiscard]] bool in_order() const noexcept override { return size_ == unbounded; }
  [[nodiscard]] std::int64_t state_bytes() const override { return static_cast<std::int64_t>(sizeof(*this)); }
  [[nodiscard]] std::int64_t mapped_data_bytes() const override { return 0; }
  /// Record i, generated and checked.
  [[nodiscard]] sample generate(std::int64_t i) const { return checked_sample(gen_(i), checks_, name_, i); }

 private:
  std::string name_;
  std::int64_t size_;
  record_generator gen_;
  record_checks checks_;
  record_lengths lengths_;
};

/// One source loader's view of a shared in-process reader: the spec's token filter, and a read count of
/// its own (a data_loader sums reads over a source's loaders). Reports the shared content as mapped
/// (shared, not owned), so k_s loaders do not count it k_s times.
class in_process_view final : public source_reader {
 public:
  in_process_view(std::shared_ptr<const source_reader> base, const source_spec& spec)
      : base_(std::move(base)) {
    if (base_->in_order() && (spec.min_tokens != 0 || spec.max_tokens != 0))
      throw_error<invalid_argument>(
          "source '{}': an unbounded generated source cannot take a token filter [{}, {}) (it would have to "
          "scan every record); expected min_tokens = max_tokens = 0, or a declared size",
          spec.name, spec.min_tokens, spec.max_tokens);
    apply_filter(spec, base_->size(), [&](std::int64_t i) { return base_->meta(i); });
  }
  [[nodiscard]] std::int64_t size() const override { return filtered_size(); }
  [[nodiscard]] seq::sample_meta meta(std::int64_t i) const override { return base_->meta(underlying(i)); }
  void load(std::int64_t i, sample& out) const override {
    base_->load(underlying(i), out);
    count_read();
  }
  void prefetch(std::int64_t i) const noexcept override { base_->prefetch(underlying(i)); }
  [[nodiscard]] bool in_order() const noexcept override { return base_->in_order(); }
  [[nodiscard]] std::int64_t state_bytes() const override {
    return static_cast<std::int64_t>(sizeof(*this)) + filter_bytes();
  }
  [[nodiscard]] std::int64_t mapped_data_bytes() const override { return base_->state_bytes(); }

 private:
  std::shared_ptr<const source_reader> base_;
};

/// The hook that opens views of `base` (fingerprint `fp`).
[[nodiscard]] HETMESH_COMPILED in_process_source hook_of(std::shared_ptr<const source_reader> base,
                                                         std::uint64_t fp);

}  // namespace detail

/// An in-process source over `records`, for source_spec::in_process (with format
/// source_format::in_process). Checks every record against `checks` now (data_error naming the source
/// `name` and the record's index), narrows the ids to int32, and shares the records, immutable, between
/// the source's loaders. The fingerprint hashes the content, so equal records on every rank give equal
/// configurations. Throws invalid_argument for no records. O(records + bytes).
[[nodiscard]] inline in_process_source from_memory(std::string_view name, std::vector<memory_record> records,
                                                   const record_checks& checks = {}) {
  if (records.empty())
    throw_error<invalid_argument>("source '{}': from_memory got no records; expected at least one", name);
  std::vector<sample> checked;
  checked.reserve(records.size());
  hasher h;
  append_all(h, std::string_view("memory"), records.size());
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < records.size(); ++i) {
    checked.push_back(
        detail::checked_sample(std::move(records[i]), checks, name, static_cast<std::int64_t>(i)));
    detail::append_content(h, checked.back());
    bytes += checked.back().heap_bytes();
  }
  bytes += static_cast<std::int64_t>(checked.capacity() * sizeof(sample));
  return detail::hook_of(std::make_shared<detail::memory_reader>(std::move(checked), bytes), h.digest());
}

/// A generated source of `size` records (or `unbounded`), record i = gen(i), for source_spec::in_process
/// (with format source_format::in_process). `lengths`, when given, spares the planner generating each
/// drawn record to learn its lengths; a load whose record disagrees with it is a data_error. Every
/// generated record is checked against `checks` (data_error naming the source `name` and the index). The
/// fingerprint hashes the size and the first (up to 8) records, generated and checked here. An unbounded
/// source is read in index order (0, 1, 2, ...; no epochs) and takes no token filter. Throws
/// invalid_argument for a size that is neither positive nor `unbounded`, or no generator.
[[nodiscard]] inline in_process_source from_generator(std::string_view name, std::int64_t size,
                                                      record_generator gen, record_checks checks = {},
                                                      record_lengths lengths = {}) {
  if ((size <= 0 && size != unbounded) || size > seq::sample_id_layout::max_position + 1)
    throw_error<invalid_argument>(
        "source '{}': from_generator size {}; expected in [1, {}] or data::unbounded", name, size,
        seq::sample_id_layout::max_position + 1);
  if (!gen) throw_error<invalid_argument>("source '{}': from_generator has no generator", name);
  auto reader = std::make_shared<detail::generated_reader>(std::string(name), size, std::move(gen),
                                                           std::move(checks), std::move(lengths));
  hasher h;
  append_all(h, std::string_view("generated"), size);
  const std::int64_t probe = size == unbounded ? 8 : std::min<std::int64_t>(size, 8);
  for (std::int64_t i = 0; i < probe; ++i) detail::append_content(h, reader->generate(i));
  return detail::hook_of(std::move(reader), h.digest());
}

}  // namespace hetmesh::data

#if HETMESH_BODIES

namespace hetmesh::data::detail {

HETMESH_COMPILED sample checked_sample(memory_record&& r, const record_checks& c, std::string_view source,
                                       std::int64_t index) {
  const auto fail = [&](const std::string& what) {
    throw_error<data_error>("source '{}' record {}: {}", source, index, what);
  };
  if (r.tokens.empty() && r.items.empty())
    fail("is empty (no text tokens, no encoder items); expected at least one of either");
  const std::int64_t limit =
      c.vocab > 0 ? c.vocab : std::int64_t{std::numeric_limits<std::int32_t>::max()} + 1;
  sample s;
  s.tokens.resize(r.tokens.size());
  for (std::size_t k = 0; k < r.tokens.size(); ++k) {
    const std::int64_t t = r.tokens[k];
    if (t < 0 || t >= limit)
      fail(hetmesh::format("token {} has id {}; expected in [0, {}) ({})", k, t, limit,
                           c.vocab > 0 ? "record_checks::vocab" : "data::sample holds int32 ids"));
    s.tokens[k] = static_cast<std::int32_t>(t);
  }
  for (std::size_t j = 0; j < r.items.size(); ++j) {
    const auto& it = r.items[j];
    if (it.kind.empty())
      fail(hetmesh::format("item {} has no kind; expected its modality (e.g. \"video\")", j));
    if (it.tokens <= 0)
      fail(hetmesh::format("item {} ('{}') becomes {} tokens; expected at least one (an empty item)", j,
                           it.kind, it.tokens));
    if (!c.kinds.empty() && std::none_of(c.kinds.begin(), c.kinds.end(),
                                         [&](const std::string& k) { return it.kind.starts_with(k); }))
      fail(hetmesh::format(
          "item {} has kind '{}'; expected a kind the encoders take [{}] (record_checks::kinds)", j, it.kind,
          fmt::join(c.kinds, ", ")));
  }
  if (!r.loss_mask.empty() && r.loss_mask.size() != r.tokens.size())
    fail(hetmesh::format("has a loss mask of {} entries for {} text tokens; expected one per token (or none)",
                         r.loss_mask.size(), r.tokens.size()));
  for (std::size_t k = 0; k < r.loss_mask.size(); ++k)
    if (r.loss_mask[k] > 1)
      fail(hetmesh::format("loss mask entry {} is {}; expected 0 or 1", k, r.loss_mask[k]));
  s.items = std::move(r.items);
  s.loss_mask = std::move(r.loss_mask);
  return s;
}

HETMESH_COMPILED seq::sample_meta meta_of(const sample& s) {
  seq::sample_meta m{.tokens = static_cast<std::int64_t>(s.tokens.size())};
  m.bytes = m.tokens * 4;
  for (const auto& it : s.items) {
    m.item_tokens.push_back(it.tokens);
    m.bytes += static_cast<std::int64_t>(it.payload.size());
  }
  return m;
}

HETMESH_COMPILED void append_content(hasher& h, const sample& s) {
  append_all(h, s.tokens, s.loss_mask);
  h.add_u64(s.items.size());
  for (const auto& it : s.items) {
    append_all(h, it.kind, it.tokens, it.payload.size());
    if (!it.payload.empty())
      h.add_bytes(reinterpret_cast<const unsigned char*>(it.payload.data()), it.payload.size());
  }
}

HETMESH_COMPILED void memory_reader::load(std::int64_t i, sample& out) const {
  const sample& r = at(i);
  out.tokens.assign(r.tokens.begin(), r.tokens.end());
  out.items.assign(r.items.begin(), r.items.end());
  out.loss_mask.assign(r.loss_mask.begin(), r.loss_mask.end());
  count_read();
}

HETMESH_COMPILED void generated_reader::load(std::int64_t i, sample& out) const {
  sample s = generate(i);
  if (lengths_) {  // the planner priced the record by its declared lengths: they must be the record's
    const auto want = lengths_(i);
    const auto got = meta_of(s);
    if (want.tokens != got.tokens || want.item_tokens != got.item_tokens)
      throw_error<data_error>(
          "source '{}' record {}: the generator made {} text tokens and items of [{}] tokens; its lengths "
          "hook says {} and [{}]; expected the same (both pure functions of the index)",
          name_, i, got.tokens, fmt::join(got.item_tokens, ", "), want.tokens,
          fmt::join(want.item_tokens, ", "));
  }
  out.tokens = std::move(s.tokens);
  out.items = std::move(s.items);
  out.loss_mask = std::move(s.loss_mask);
  count_read();
}

HETMESH_COMPILED in_process_source hook_of(std::shared_ptr<const source_reader> base, std::uint64_t fp) {
  return {.open = [base = std::move(base)](const source_spec& spec) -> std::unique_ptr<source_reader> {
            return std::make_unique<in_process_view>(base, spec);
          },
          .fingerprint = fp};
}

}  // namespace hetmesh::data::detail
#endif  // HETMESH_BODIES
