// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: a source's access state. A `source_reader` is the open files and index of one source
// (a Megatron indexed dataset list, a list of WebDataset shards, or an in-process source:
// data/memory_source.hpp), with the optional long/short token filter applied. A `source_loader` adds the
// per-epoch shuffle state (the permutation keyed by (seed, source, epoch)). Exactly one loader per source
// holds this state, or k_s of them when the source is scaled out; trainer ranks never hold it. Every
// component reports the memory it holds.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/random.hpp"
#include "indexed_dataset.hpp"
#include "mixture.hpp"
#include "sample.hpp"

namespace hetmesh::data {

struct wds_record;
/// The user's payload-decoding hook of WebDataset sources: fills `out.tokens` and `out.items` from a
/// record (data/webdataset.hpp defines wds_record).
using wds_decoder = std::function<void(const wds_record&, sample& out)>;

/// Read access to one source: sample count, metadata and payload of sample i (i in [0, size())).
/// Implementations are immutable after opening, so concurrent meta()/load() calls are safe.
class source_reader {
 public:
  virtual ~source_reader() = default;
  /// Number of samples (after the source's token filter).
  [[nodiscard]] virtual std::int64_t size() const = 0;
  /// Metadata of sample i, without reading its payload. Pre: 0 <= i < size().
  [[nodiscard]] virtual seq::sample_meta meta(std::int64_t i) const = 0;
  /// Metadata of a run of samples at once: out[k] = meta(indices[k]), overwriting out[k]'s fields and
  /// reusing its item_tokens capacity (no heap allocation for text samples). One virtual call per run
  /// instead of one per sample: what the planner's batch lookup calls. Pre: indices.size() ==
  /// out.size(), every index in [0, size()).
  virtual void meta_run(std::span<const std::int64_t> indices, std::span<seq::sample_meta> out) const {
    for (std::size_t k = 0; k < indices.size(); ++k) out[k] = meta(indices[k]);
  }
  /// Fills out.tokens / out.items (out.ref is the caller's). Counts one read.
  virtual void load(std::int64_t i, sample& out) const = 0;
  /// A hint that sample i will be loaded soon: starts bringing its first bytes into the cache so that a
  /// run of short samples read in shuffled order does not stall on every sample's first cache miss.
  /// Never reads past the sample; may do nothing.
  virtual void prefetch(std::int64_t /*i*/) const noexcept {}
  /// Heap bytes plus resident index bytes of this open source (its access state).
  [[nodiscard]] virtual std::int64_t state_bytes() const = 0;
  /// Bytes of payload files mapped (page cache, shared, touched on demand): reported, not owned.
  [[nodiscard]] virtual std::int64_t mapped_data_bytes() const = 0;
  /// Whether the source's loader takes positions as indices (index = position in every epoch) instead of
  /// shuffling them: an unbounded generated source, whose permutation could not be held, says true.
  [[nodiscard]] virtual bool in_order() const noexcept { return false; }
  /// Loads served so far (the test of "nothing read twice").
  [[nodiscard]] std::int64_t reads() const noexcept { return reads_.load(std::memory_order_relaxed); }

 protected:
  /// Counts one load, for reads().
  void count_read() const noexcept { reads_.fetch_add(1, std::memory_order_relaxed); }
  /// Applies a [min, max) token filter: the kept underlying indices (empty filter keeps everything and
  /// stores nothing).
  template <class MetaOf>
  void apply_filter(const source_spec& spec, std::int64_t total, MetaOf&& meta_of) {
    total_ = total;
    if (spec.min_tokens == 0 && spec.max_tokens == 0) return;
    filtered_ = true;
    for (std::int64_t i = 0; i < total; ++i) {
      const auto m = meta_of(i);
      const std::int64_t t = m.tokens + m.encoder_tokens();
      if (t >= spec.min_tokens && (spec.max_tokens == 0 || t < spec.max_tokens)) keep_.push_back(i);
    }
  }
  /// Samples kept by the filter (all when there is no filter).
  [[nodiscard]] std::int64_t filtered_size() const noexcept {
    return filtered_ ? static_cast<std::int64_t>(keep_.size()) : total_;
  }
  /// The underlying index of kept sample i.
  [[nodiscard]] std::int64_t underlying(std::int64_t i) const noexcept {
    return filtered_ ? keep_[static_cast<std::size_t>(i)] : i;
  }
  /// Heap bytes of the filter.
  [[nodiscard]] std::int64_t filter_bytes() const noexcept {
    return static_cast<std::int64_t>(keep_.capacity() * 8);
  }

 private:
  bool filtered_ = false;
  std::int64_t total_ = 0;
  std::vector<std::int64_t> keep_{};
  // Written on every load: on a cache line of its own, so that loads through another reader (k_s loaders
  // of a source, on other worker threads) and lookups of this reader's fields do not bounce the line.
  alignas(64) mutable std::atomic<std::int64_t> reads_{0};
  [[maybe_unused]] char own_line_[64 - sizeof(std::atomic<std::int64_t>)]{};
};

/// Megatron indexed datasets, concatenated in the order given.
class indexed_source final : public source_reader {
 public:
  /// Opens the indexed datasets of `spec.paths` (concatenated) and applies its token filter. Throws
  /// data_error on a corrupt file.
  explicit indexed_source(const source_spec& spec) {
    std::int64_t total = 0;
    for (const auto& p : spec.paths) {
      parts_.emplace_back(p);
      starts_.push_back(total);
      total += parts_.back().size();
    }
    apply_filter(spec, total, [&](std::int64_t i) { return raw_meta(i); });
  }
  /// Samples kept by the filter.
  [[nodiscard]] std::int64_t size() const override { return filtered_size(); }
  /// Metadata of sample i.
  [[nodiscard]] seq::sample_meta meta(std::int64_t i) const override { return raw_meta(underlying(i)); }
  HETMESH_COMPILED void meta_run(std::span<const std::int64_t> indices,
                                 std::span<seq::sample_meta> out) const override;
  HETMESH_COMPILED void load(std::int64_t i, sample& out) const override;
  HETMESH_COMPILED void prefetch(std::int64_t i) const noexcept override;
  [[nodiscard]] HETMESH_COMPILED std::int64_t state_bytes() const override;
  [[nodiscard]] HETMESH_COMPILED std::int64_t mapped_data_bytes() const override;

 private:
  [[nodiscard]] std::pair<std::size_t, std::int64_t> locate(std::int64_t i) const noexcept {
    if (parts_.size() == 1) return {0, i};  // the common case: one file, no search
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), i) - 1;
    const auto part = static_cast<std::size_t>(it - starts_.begin());
    return {part, i - *it};
  }
  [[nodiscard]] HETMESH_COMPILED seq::sample_meta raw_meta(std::int64_t i) const;
  std::vector<indexed_dataset> parts_{};
  std::vector<std::int64_t> starts_{};
};

namespace detail {
/// Opens a WebDataset source; set by data/webdataset.hpp when a translation unit includes it, so that
/// the JSON it needs is paid for only where WebDataset is used.
inline std::unique_ptr<source_reader> (*open_webdataset)(const source_spec&, const wds_decoder&) = nullptr;
}  // namespace detail

/// Opens the reader a spec names. Throws data_error for missing/corrupt files, with the source named.
[[nodiscard]] inline std::unique_ptr<source_reader> open_source(const source_spec& spec,
                                                                const wds_decoder& decode = {}) {
  try {
    if (spec.format == source_format::indexed) return std::make_unique<indexed_source>(spec);
    if (spec.format == source_format::in_process) {
      if (!spec.in_process.open)
        throw_error<invalid_argument>(
            "source '{}' is an in_process source without a hook; expected data::from_memory or "
            "data::from_generator (data/memory_source.hpp) in source_spec::in_process",
            spec.name);
      return spec.in_process.open(spec);
    }
    if (detail::open_webdataset == nullptr)
      throw_error<invalid_argument>(
          "source '{}' is a WebDataset source: include <hetmesh/data/webdataset.hpp> in the program (the "
          "WebDataset reader parses JSON, so the umbrella headers leave it out)",
          spec.name);
    return detail::open_webdataset(spec, decode);
  } catch (error& e) {
    e.add_context(hetmesh::format("opening source '{}'", spec.name));
    throw;
  }
}

/// The seed of source s's permutation in epoch e: a pure function of (seed, source, epoch).
[[nodiscard]] constexpr std::uint64_t epoch_seed(std::uint64_t seed, int source,
                                                 std::int64_t epoch) noexcept {
  return key_hash({seed, static_cast<std::uint64_t>(source), static_cast<std::uint64_t>(epoch)});
}

/// One source loader: an open reader plus the shuffle state (the permutation of the epoch in use).
/// Serves metadata lookups and loads by (epoch, position). Thread-safe (a mutex guards the epoch cache;
/// one load at a time, which is what makes k_s loaders per source the source's parallelism).
class source_loader {
 public:
  /// Opens source `source` of the mixture from `spec`; `seed` fixes its per-epoch permutations.
  source_loader(const source_spec& spec, int source, std::uint64_t seed, const wds_decoder& decode = {})
      : reader_(open_source(spec, decode)), source_(source), seed_(seed) {}

  /// Number of samples.
  [[nodiscard]] std::int64_t size() const noexcept { return reader_->size(); }
  /// The sample index at `position` of `epoch` (permutation keyed by (seed, source, epoch)). Throws
  /// data_error naming the source, the epoch and position and the range unless epoch >= 0 and 0 <=
  /// position < size() (a tampered checkpoint must not read outside the permutation).
  [[nodiscard]] HETMESH_COMPILED std::int64_t index_at(std::int64_t epoch, std::int64_t position);
  /// The sample indices at positions [position, position + out.size()) of `epoch`, into `out`, under one
  /// acquisition of the lock (the planner's batch lookup: one call per run of a source, not per sample).
  /// Throws data_error as index_at does unless the whole run lies in [0, size()).
  HETMESH_COMPILED void index_run(std::int64_t epoch, std::int64_t position, std::span<std::int64_t> out);
  /// Metadata of sample `index`.
  [[nodiscard]] seq::sample_meta meta(std::int64_t index) const { return reader_->meta(index); }
  /// Metadata of a run of samples: out[k] = meta(indices[k]) (source_reader::meta_run).
  void meta_run(std::span<const std::int64_t> indices, std::span<seq::sample_meta> out) const {
    reader_->meta_run(indices, out);
  }
  /// Loads the sample at (epoch, position). Cost: the read plus the user's decode.
  [[nodiscard]] sample load(std::int64_t epoch, std::int64_t position) {
    return load({source_, epoch, position, index_at(epoch, position)});
  }
  /// Loads the sample `ref` names (its index already resolved by the planner). Loads through one loader
  /// are serialised (a read lock separate from the shuffle state, so planning never waits for a read):
  /// k_s loaders are the source's read parallelism.
  [[nodiscard]] sample load(const sample_ref& ref) {
    sample s;
    load_into(ref, s);
    return s;
  }
  /// As load(ref), into `out`, reusing its buffers' capacity (what a recycling caller wants).
  void load_into(const sample_ref& ref, sample& out) {
    std::lock_guard lock(read_mutex_);
    out.ref = ref;
    reader_->load(ref.index, out);
    check_loss_mask(out, "data::source_loader");
  }
  /// Loads a run of samples under one acquisition of the read lock: refs[k] into out(k) (a sample&),
  /// prefetching each next sample while the current one is copied. on_error(k) is called inside the
  /// catch block of a failed load (std::current_exception() is valid there) and the run goes on, so one
  /// bad sample fails its step without the rest of the run being skipped silently.
  template <class Out, class OnError>
  void load_run(std::span<const sample_ref> refs, Out&& out, OnError&& on_error) {
    std::lock_guard lock(read_mutex_);
    for (std::size_t k = 0; k < refs.size(); ++k) {
      if (k + 2 < refs.size()) reader_->prefetch(refs[k + 2].index);
      try {
        sample& dst = out(k);
        dst.ref = refs[k];
        reader_->load(refs[k].index, dst);
        check_loss_mask(dst, "data::source_loader");
      } catch (...) {
        on_error(k);
      }
    }
  }
  /// The reader, for accounting and tests.
  [[nodiscard]] const source_reader& reader() const noexcept { return *reader_; }
  /// Access state in bytes: the reader's state plus the cached permutation.
  [[nodiscard]] HETMESH_COMPILED std::int64_t state_bytes() const;

 private:
  // Two cached epochs: prefetching reads ahead across an epoch boundary while the previous epoch's last
  // samples are still being loaded, and recomputing a permutation per request would cost O(n) each.
  HETMESH_COMPILED const std::vector<std::int64_t>& perm_locked(std::int64_t epoch);
  std::unique_ptr<source_reader> reader_;
  int source_;
  std::uint64_t seed_;
  mutable std::mutex mutex_;
  std::mutex read_mutex_;
  std::int64_t perm_epoch_[2] = {-1, -1};
  std::vector<std::int64_t> perm_[2];
};

}  // namespace hetmesh::data

#if HETMESH_BODIES

namespace hetmesh::data {

HETMESH_COMPILED void indexed_source::meta_run(std::span<const std::int64_t> indices,
                                               std::span<seq::sample_meta> out) const {
  if (parts_.size() == 1) {  // the common case: one file, no search for the part
    const auto& d = parts_.front();
    const auto elem = static_cast<std::int64_t>(dtype_size(d.type()));
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const auto len = d.length(underlying(indices[k]));
      auto& m = out[k];  // every field, as meta() would return it
      m.id = 0;
      m.tokens = len;
      m.item_tokens.clear();
      m.bytes = len * elem;
      m.owner = 0;
    }
    return;
  }
  source_reader::meta_run(indices, out);
}

HETMESH_COMPILED void indexed_source::load(std::int64_t i, sample& out) const {
  const auto [part, local] = locate(underlying(i));
  out.tokens.clear();
  out.items.clear();
  out.loss_mask.clear();  // an indexed dataset holds no loss masks
  parts_[part].read_tokens(local, out.tokens);
  count_read();
}

HETMESH_COMPILED void indexed_source::prefetch(std::int64_t i) const noexcept {
  const auto [part, local] = locate(underlying(i));
  const auto bytes = parts_[part].raw(local);
  // The first 4 KiB: enough for the hardware prefetcher to take over on longer samples.
  const std::size_t n = std::min<std::size_t>(bytes.size(), 1024);
  for (std::size_t k = 0; k < n; k += 64) __builtin_prefetch(bytes.data() + k, 0, 0);
}

HETMESH_COMPILED std::int64_t indexed_source::state_bytes() const {
  std::int64_t b =
      sizeof(*this) + filter_bytes() +
      static_cast<std::int64_t>(parts_.capacity() * sizeof(indexed_dataset) + starts_.capacity() * 8);
  for (const auto& p : parts_) b += p.index_bytes();
  return b;
}

HETMESH_COMPILED std::int64_t indexed_source::mapped_data_bytes() const {
  std::int64_t b = 0;
  for (const auto& p : parts_) b += p.data_bytes();
  return b;
}

HETMESH_COMPILED seq::sample_meta indexed_source::raw_meta(std::int64_t i) const {
  const auto [part, local] = locate(i);
  const auto len = parts_[part].length(local);
  return {.tokens = len,
          .item_tokens = {},
          .bytes = len * static_cast<std::int64_t>(dtype_size(parts_[part].type()))};
}

HETMESH_COMPILED std::int64_t source_loader::index_at(std::int64_t epoch, std::int64_t position) {
  if (epoch < 0 || position < 0 || position >= size())
    throw_error<data_error>(
        "source {}: epoch {}, position {}; expected epoch >= 0 and position in [0, {}) (the source's size)",
        source_, epoch, position, size());
  if (reader_->in_order()) return position;
  std::lock_guard lock(mutex_);
  return perm_locked(epoch)[static_cast<std::size_t>(position)];
}

HETMESH_COMPILED void source_loader::index_run(std::int64_t epoch, std::int64_t position,
                                               std::span<std::int64_t> out) {
  const auto n = static_cast<std::int64_t>(out.size());
  if (epoch < 0 || position < 0 || n > size() || position > size() - n)
    throw_error<data_error>(
        "source {}: epoch {}, positions [{}, {}); expected epoch >= 0 and positions in [0, {}) (the "
        "source's size)",
        source_, epoch, position, position + n, size());
  if (reader_->in_order()) {
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = position + static_cast<std::int64_t>(k);
    return;
  }
  std::lock_guard lock(mutex_);
  const auto& perm = perm_locked(epoch);
  std::copy_n(perm.begin() + position, out.size(), out.begin());
}

HETMESH_COMPILED std::int64_t source_loader::state_bytes() const {
  std::lock_guard lock(mutex_);
  return reader_->state_bytes() + static_cast<std::int64_t>((perm_[0].capacity() + perm_[1].capacity()) * 8) +
         static_cast<std::int64_t>(sizeof(*this));
}

HETMESH_COMPILED const std::vector<std::int64_t>& source_loader::perm_locked(std::int64_t epoch) {
  for (int k = 0; k < 2; ++k)
    if (perm_epoch_[k] == epoch) return perm_[k];
  const int victim = perm_epoch_[0] < perm_epoch_[1] ? 0 : 1;
  perm_[victim] = permutation(reader_->size(), epoch_seed(seed_, source_, epoch));
  perm_epoch_[victim] = epoch;
  return perm_[victim];
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
