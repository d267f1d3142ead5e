// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: WebDataset tar shards for multimodal samples. A sample is the run of consecutive
// members sharing a key (the member name up to the first '.' of its base name): a `.json` with lengths
// and metadata beside payloads such as `.jpg`, `.wav`, `.npy`. The lengths live in the json:
//   {"tokens": <text tokens>, "items": [{"ext": "jpg", "tokens": 256}, ...], "text_tokens": [ids...], ...}
// An index is built once per shard and stored beside it (`<shard>.hmidx.json`): member offsets and the
// lengths, so planning never touches payloads. Decoding payloads is the user's hook (`wds_decoder`).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../core/json_file.hpp"
#include "detail/file.hpp"
#include "sample.hpp"
#include "source.hpp"
#include "tar.hpp"

namespace hetmesh::data {

/// Splits a member name into (key, extension) the WebDataset way: at the first '.' of the base name.
[[nodiscard]] inline std::pair<std::string, std::string> wds_split(std::string_view name) {
  const auto slash = name.rfind('/');
  const auto dot = name.find('.', slash == std::string_view::npos ? 0 : slash + 1);
  if (dot == std::string_view::npos) return {std::string(name), std::string()};
  return {std::string(name.substr(0, dot)), std::string(name.substr(dot + 1))};
}

/// One sample's entry in a shard index.
struct wds_entry {
  std::string key{};                ///< sample key (member name without extension)
  std::vector<std::string> exts{};  ///< extensions of its members
  ///@{
  /// Offset and size of each member's content, parallel to exts.
  std::vector<std::int64_t> offsets{}, sizes{};  // of each member's content, parallel to exts
  ///@}
  seq::sample_meta meta{};  ///< metadata, from the json member
  friend bool operator==(const wds_entry&, const wds_entry&) = default;
};

/// The index of one shard: its size when indexed (a changed shard no longer matches) and its samples.
struct wds_index {
  static constexpr int version = 1;  ///< format version of the index file
  std::int64_t shard_bytes = 0;      ///< size of the shard it indexes, to detect a stale index
  std::vector<wds_entry> samples{};  ///< one entry per sample, in archive order
  friend bool operator==(const wds_index&, const wds_index&) = default;
};

/// The path of the index stored beside `shard`.
[[nodiscard]] inline std::string wds_index_path(const std::string& shard) { return shard + ".hmidx.json"; }

namespace detail {
inline seq::sample_meta meta_from_json(const nlohmann::json& j, const std::string& where) {
  seq::sample_meta m{};
  if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_number_integer())
    throw_error<data_error>(
        "{}: the .json member has no integer \"tokens\" field; expected {{\"tokens\": N, \"items\": [...]}}",
        where);
  m.tokens = j["tokens"].get<std::int64_t>();
  if (m.tokens < 0) throw_error<data_error>("{}: \"tokens\" is {}; expected >= 0", where, m.tokens);
  if (j.contains("items")) {
    for (const auto& it : j["items"]) {
      if (!it.is_object() || !it.contains("tokens") || !it["tokens"].is_number_integer() ||
          it["tokens"].get<std::int64_t>() < 0)
        throw_error<data_error>("{}: an entry of \"items\" lacks a non-negative integer \"tokens\": {}",
                                where, it.dump());
      m.item_tokens.push_back(it["tokens"].get<std::int64_t>());
    }
  }
  return m;
}

/// A sample json's "loss_mask" array as bytes (0 = that text token's target does not count, 1 = it does);
/// data_error starting with `where` (the sample) when it is not an array of 0 and 1. O(entries).
inline std::vector<std::uint8_t> loss_mask_of(const nlohmann::json& m, std::string_view where) {
  if (!m.is_array())
    throw_error<data_error>("{}: \"loss_mask\" is {}; expected an array of 0 and 1, one per text token",
                            where, m.type_name());
  std::vector<std::uint8_t> out;
  out.reserve(m.size());
  for (const auto& v : m) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > 1)
      throw_error<data_error>("{}: \"loss_mask\" has {} at token {}; expected 0 or 1", where, v.dump(),
                              out.size());
    out.push_back(static_cast<std::uint8_t>(v.get<std::int64_t>()));
  }
  return out;
}
}  // namespace detail

/// Builds the index of `shard` by one pass over its headers, parsing each sample's `.json`. Throws
/// data_error for a corrupt or truncated shard, a sample without `.json`, or keys that repeat
/// non-consecutively (the shard would not stream as WebDataset). Cost O(members + json bytes).
[[nodiscard]] inline wds_index build_wds_index(const std::string& shard) {
  detail::mapped_file f(shard, "WebDataset shard");
  const auto members = tar::list(f.bytes(), shard);
  wds_index idx{};
  idx.shard_bytes = f.size();
  std::set<std::string> seen{};
  for (const auto& m : members) {
    auto [key, ext] = wds_split(m.name);
    if (idx.samples.empty() || idx.samples.back().key != key) {
      if (!seen.insert(key).second)
        throw_error<data_error>(
            "shard '{}': sample key '{}' appears again at offset {} after other samples; expected each "
            "sample's members together and keys unique",
            shard, key, m.offset);
      idx.samples.push_back(wds_entry{.key = key});
    }
    auto& e = idx.samples.back();
    if (std::find(e.exts.begin(), e.exts.end(), ext) != e.exts.end())
      throw_error<data_error>("shard '{}': sample '{}' has two '.{}' members (a duplicate key); expected one",
                              shard, key, ext);
    e.exts.push_back(ext);
    e.offsets.push_back(m.offset);
    e.sizes.push_back(m.size);
  }
  for (auto& e : idx.samples) {
    std::int64_t json_at = -1, bytes = 0;
    for (std::size_t k = 0; k < e.exts.size(); ++k) {
      bytes += e.sizes[k];
      if (e.exts[k] == "json") json_at = static_cast<std::int64_t>(k);
    }
    const std::string where = hetmesh::format("shard '{}', sample '{}'", shard, e.key);
    if (json_at < 0)
      throw_error<data_error>("{}: no .json member; every sample needs one with its lengths", where);
    const auto k = static_cast<std::size_t>(json_at);
    const auto* p = reinterpret_cast<const char*>(f.bytes().data() + e.offsets[k]);
    const auto j = parse_json_bounded(std::string_view(p, static_cast<std::size_t>(e.sizes[k])),
                                      hetmesh::format("{}: the .json member", where));
    e.meta = detail::meta_from_json(j, where);
    e.meta.bytes = bytes;
  }
  return idx;
}

/// Stores `idx` beside `shard` (atomically).
inline void store_wds_index(const std::string& shard, const wds_index& idx) {
  nlohmann::json j;
  j["format"] = "hetmesh-wds-index";
  j["version"] = wds_index::version;
  j["shard_bytes"] = idx.shard_bytes;
  auto& arr = j["samples"] = nlohmann::json::array();
  for (const auto& e : idx.samples)
    arr.push_back({{"key", e.key},
                   {"exts", e.exts},
                   {"offsets", e.offsets},
                   {"sizes", e.sizes},
                   {"tokens", e.meta.tokens},
                   {"items", e.meta.item_tokens},
                   {"bytes", e.meta.bytes}});
  const std::string text = j.dump();
  detail::write_file_atomic(wds_index_path(shard), std::as_bytes(std::span<const char>(text)));
}

/// Loads the index stored beside `shard`, building and storing it first when absent. Throws data_error
/// when the stored index is malformed or was built for a shard of a different size.
[[nodiscard]] inline wds_index open_wds_index(const std::string& shard) {
  const std::string path = wds_index_path(shard);
  const std::int64_t shard_bytes = detail::file_size_or_missing(shard);
  if (shard_bytes < 0) throw_error<data_error>("shard '{}' does not exist", shard);
  if (detail::file_size_or_missing(path) < 0) {
    auto idx = build_wds_index(shard);
    store_wds_index(shard, idx);
    return idx;
  }
  nlohmann::json j;
  try {
    j = read_json_file(path, "WebDataset index", large_file_bytes);
  } catch (data_error& e) {
    e.add_context("delete the index to rebuild it");
    throw;
  }
  if (!j.is_object() || j.value("format", "") != "hetmesh-wds-index")
    throw_error<data_error>("'{}' is not a hetmesh WebDataset index (corrupt?); delete it to rebuild", path);
  if (j.value("version", 0) != wds_index::version)
    throw_error<data_error>("'{}' has version {}; expected {}", path, j.value("version", 0),
                            wds_index::version);
  wds_index idx{};
  try {
    idx.shard_bytes = j.at("shard_bytes").get<std::int64_t>();
    for (const auto& s : j.at("samples")) {
      wds_entry e;
      e.key = s.at("key").get<std::string>();
      e.exts = s.at("exts").get<std::vector<std::string>>();
      e.offsets = s.at("offsets").get<std::vector<std::int64_t>>();
      e.sizes = s.at("sizes").get<std::vector<std::int64_t>>();
      e.meta.tokens = s.at("tokens").get<std::int64_t>();
      e.meta.item_tokens = s.at("items").get<std::vector<std::int64_t>>();
      e.meta.bytes = s.at("bytes").get<std::int64_t>();
      if (e.offsets.size() != e.exts.size() || e.sizes.size() != e.exts.size())
        throw_error<data_error>("sample '{}' lists {} extensions, {} offsets and {} sizes", e.key,
                                e.exts.size(), e.offsets.size(), e.sizes.size());
      idx.samples.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& ex) {
    throw_error<data_error>("'{}' is malformed: {}", path, ex.what());
  } catch (data_error& ex) {
    ex.add_context(hetmesh::format("'{}' is malformed", path));
    throw;
  }
  if (idx.shard_bytes != shard_bytes)
    throw_error<data_error>(
        "index '{}' was built for a shard of {} bytes but '{}' has {}: the index does not match its data",
        path, idx.shard_bytes, shard, shard_bytes);
  return idx;
}

/// A sample as read from a shard, before decoding: its key, members (extension and bytes, in shard
/// order), and parsed `.json`. What a `wds_decoder` receives.
struct wds_record {
  std::string_view key{};  ///< the sample's key
  /// (extension, content) of each member
  std::vector<std::pair<std::string_view, std::span<const std::byte>>> members{};
  nlohmann::json json{};                   ///< the parsed json member
  const seq::sample_meta* meta = nullptr;  ///< metadata, when known
};

// wds_decoder, the user's payload-decoding hook, is declared in source.hpp.

/// The default decoder: text token ids from the json's "text_tokens" array, their loss mask from its
/// "loss_mask" array when present (0 or 1 per text token: 0 = that token's target does not count; the
/// loader checks it: data::check_loss_mask), and one encoder item per entry of "items" whose payload is the
/// raw bytes of the member with that "ext".
inline void default_wds_decode(const wds_record& r, sample& out) {
  if (r.json.contains("text_tokens")) out.tokens = r.json["text_tokens"].get<std::vector<std::int32_t>>();
  if (r.json.contains("loss_mask"))
    out.loss_mask =
        detail::loss_mask_of(r.json["loss_mask"], hetmesh::format("webdataset sample '{}'", r.key));
  if (!r.json.contains("items")) return;
  for (const auto& it : r.json["items"]) {
    loaded_item item{.kind = it.value("ext", ""), .tokens = it["tokens"].get<std::int64_t>(), .payload = {}};
    for (const auto& [ext, bytes] : r.members)
      if (ext == item.kind) item.payload.assign(bytes.begin(), bytes.end());
    out.items.push_back(std::move(item));
  }
}

/// An open shard: the mapped tar and its index. Reading a sample re-checks each member's tar header
/// against the index (name, size, checksum), so a shard replaced under a stale index is caught.
class wds_shard {
 public:
  /// Opens the shard at `path` and its index (built and stored beside it when missing).
  explicit wds_shard(const std::string& path)
      : index_(open_wds_index(path)), file_(path, "WebDataset shard") {
    if (file_.size() != index_.shard_bytes)
      throw_error<data_error>("shard '{}' changed size after indexing ({} -> {} bytes)", path,
                              index_.shard_bytes, file_.size());
  }
  /// Number of samples.
  [[nodiscard]] std::int64_t size() const noexcept {
    return static_cast<std::int64_t>(index_.samples.size());
  }
  /// The index.
  [[nodiscard]] const wds_index& index() const noexcept { return index_; }
  /// Path of the shard.
  [[nodiscard]] const std::string& path() const noexcept { return file_.path(); }

  /// The raw record of sample i (views into the mapping; valid while the shard lives).
  [[nodiscard]] wds_record record(std::int64_t i) const {
    const auto& e = index_.samples[static_cast<std::size_t>(i)];
    wds_record r{.key = e.key, .members = {}, .json = nullptr, .meta = &e.meta};
    for (std::size_t k = 0; k < e.exts.size(); ++k) {
      tar::member m;
      char type = 0;
      const std::int64_t at = e.offsets[k] - tar::block;
      if (at < 0 || !tar::parse_header(file_.bytes(), at, file_.path(), m, type) || m.size != e.sizes[k] ||
          m.name != e.key + "." + e.exts[k])
        throw_error<data_error>(
            "shard '{}': the index says member '{}.{}' ({} bytes) is at byte {}, the shard has '{}' ({} "
            "bytes) there: "
            "the index does not match its data",
            file_.path(), e.key, e.exts[k], e.sizes[k], e.offsets[k], m.name, m.size);
      const auto bytes =
          file_.bytes().subspan(static_cast<std::size_t>(e.offsets[k]), static_cast<std::size_t>(e.sizes[k]));
      r.members.emplace_back(e.exts[k], bytes);
      if (e.exts[k] == "json") {
        r.json =
            parse_json_bounded(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                               hetmesh::format("shard '{}', sample '{}': the .json member", path(), e.key));
      }
    }
    return r;
  }
  /// Heap bytes of the index held in memory.
  [[nodiscard]] std::int64_t index_heap_bytes() const noexcept {
    std::int64_t b = static_cast<std::int64_t>(index_.samples.capacity() * sizeof(wds_entry));
    for (const auto& e : index_.samples)
      b += static_cast<std::int64_t>(e.key.capacity() + e.exts.capacity() * sizeof(std::string) +
                                     16 * e.offsets.capacity() + 8 * e.meta.item_tokens.capacity());
    return b;
  }

 private:
  wds_index index_{};
  detail::mapped_file file_;
};

/// Writes a WebDataset shard: each add() appends one sample's members as consecutive ustar files named
/// KEY.EXT; finish() closes the archive and stores its index beside it. Not thread-safe.
class wds_writer {
 public:
  /// Starts the archive for `path`, under a temporary name until commit() (detail::atomic_file).
  explicit wds_writer(std::string path) : path_(std::move(path)), file_(path_) {}

  /// Appends one sample. Pre: a "json" member whose content carries the lengths (see the file comment);
  /// the key contains no '.'; keys are unique within the shard (else invalid_argument naming the key: a
  /// repeated key would merge two samples into one on reading).
  void add(std::string_view key, std::span<const std::pair<std::string, std::vector<std::byte>>> members) {
    if (key.empty() || key.find('.') != std::string_view::npos)
      throw_error<invalid_argument>(
          "wds_writer: key '{}' must be non-empty and contain no '.' (the key ends at the first '.')", key);
    if (!keys_.insert(std::string(key)).second)
      throw_error<invalid_argument>("wds_writer: key '{}' is already in shard '{}'; expected unique keys",
                                    key, path_);
    for (const auto& [ext, bytes] : members) {
      const auto h = tar::header(hetmesh::format("{}.{}", key, ext), static_cast<std::int64_t>(bytes.size()));
      file_.write(h);
      file_.write(bytes);
      const auto pad = static_cast<std::size_t>(
          (tar::block - static_cast<std::int64_t>(bytes.size()) % tar::block) % tar::block);
      file_.write(std::span<const std::byte>(zeros_.data(), pad));
    }
  }
  /// Writes the end of the archive (two zero blocks) and builds its index, leaving both unpublished:
  /// a converter closes every shard it writes and commits them together at the end.
  void close() {
    if (closed_) return;
    file_.write(zeros_);
    file_.write(zeros_);
    file_.close();
    index_ = build_wds_index(file_.temp_path());
    closed_ = true;
  }
  /// Publishes the shard under its name (rename), then its index beside it.
  void commit() {
    close();
    file_.commit();
    store_wds_index(path_, index_);
  }
  /// close() then commit(): the archive and its index in place.
  void finish() { commit(); }

 private:
  std::string path_{};
  detail::atomic_file file_;
  std::set<std::string> keys_{};
  wds_index index_{};
  bool closed_ = false;
  std::vector<std::byte> zeros_ = std::vector<std::byte>(tar::block, std::byte{0});
};

/// WebDataset shards, concatenated in the order given; payloads decoded by the user's hook.
class webdataset_source final : public source_reader {
 public:
  /// Opens the shards of `spec.paths` (concatenated) with `decode` and applies its token filter.
  webdataset_source(const source_spec& spec, wds_decoder decode)
      : decode_(decode ? std::move(decode) : wds_decoder(default_wds_decode)) {
    std::int64_t total = 0;
    for (const auto& p : spec.paths) {
      shards_.emplace_back(p);
      starts_.push_back(total);
      total += shards_.back().size();
    }
    apply_filter(spec, total, [&](std::int64_t i) { return raw_meta(i); });
  }
  [[nodiscard]] std::int64_t size() const override { return filtered_size(); }
  [[nodiscard]] seq::sample_meta meta(std::int64_t i) const override { return raw_meta(underlying(i)); }
  void load(std::int64_t i, sample& out) const override {
    const auto [part, local] = locate(underlying(i));
    const auto rec = shards_[part].record(local);
    out.tokens.clear();
    out.items.clear();
    out.loss_mask.clear();
    decode_(rec, out);
    count_read();
  }
  [[nodiscard]] std::int64_t state_bytes() const override {
    std::int64_t b =
        sizeof(*this) + filter_bytes() +
        static_cast<std::int64_t>(shards_.capacity() * sizeof(wds_shard) + starts_.capacity() * 8);
    for (const auto& s : shards_) b += s.index_heap_bytes();
    return b;
  }
  [[nodiscard]] std::int64_t mapped_data_bytes() const override {
    std::int64_t b = 0;
    for (const auto& s : shards_) b += s.index().shard_bytes;
    return b;
  }

 private:
  [[nodiscard]] std::pair<std::size_t, std::int64_t> locate(std::int64_t i) const noexcept {
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), i) - 1;
    return {static_cast<std::size_t>(it - starts_.begin()), i - *it};
  }
  [[nodiscard]] seq::sample_meta raw_meta(std::int64_t i) const {
    const auto [part, local] = locate(i);
    return shards_[part].index().samples[static_cast<std::size_t>(local)].meta;
  }
  wds_decoder decode_;
  std::vector<wds_shard> shards_{};
  std::vector<std::int64_t> starts_{};
};

namespace detail {
/// Registers webdataset_source with open_source (see detail::open_webdataset in source.hpp).
inline const bool webdataset_registered = [] {
  open_webdataset = [](const source_spec& spec, const wds_decoder& decode) -> std::unique_ptr<source_reader> {
    return std::make_unique<webdataset_source>(spec, decode);
  };
  return true;
}();
}  // namespace detail

}  // namespace hetmesh::data
