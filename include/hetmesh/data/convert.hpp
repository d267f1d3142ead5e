// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: converters from JSONL (one JSON object per line) to the two on-disk formats.
//  - to a Megatron indexed dataset: each line is one document of one sequence, from its "tokens" array
//    (ids) or its "text" string through a tokenizer hook (default: the UTF-8 bytes, ids 0..255);
//  - to WebDataset shards: each line becomes one sample: its `.json` is the line itself (which must say
//    "tokens", or carry "text_tokens" from which the count is taken), plus one member per entry of
//    "files": {"jpg": "/path/x.jpg", ...} read from disk; a "loss_mask" array (0 or 1 per entry of
//    "text_tokens") is checked and kept, and the loader hands it on (data::sample::loss_mask).
// Blank lines are skipped; a malformed line is a data_error naming the file and line number.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../core/checked.hpp"
#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/json_file.hpp"
#include "../core/lines.hpp"
#include "indexed_dataset.hpp"
#include "webdataset.hpp"

namespace hetmesh::data {

/// Text to token ids, for the converters; byte_tokenizer is the default.
using tokenizer = std::function<std::vector<std::int64_t>(const std::string& text)>;

/// The default tokenizer: one id per UTF-8 byte.
[[nodiscard]] inline std::vector<std::int64_t> byte_tokenizer(const std::string& text) {
  std::vector<std::int64_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

/// What a conversion did: lines read, samples and tokens written, files created.
struct convert_stats {
  ///@{
  /// Lines read, samples written and tokens written.
  std::int64_t lines = 0, samples = 0, tokens = 0;
  ///@}
  std::vector<std::string> outputs{};  ///< the files written
};

/// The longest JSONL line the converters read (256 MiB: a sample of ~30 million tokens); a longer line
/// is refused with its number instead of being read whole.
inline constexpr std::size_t max_jsonl_line_bytes = std::size_t{256} << 20;

/// The largest member file the WebDataset converter reads into a shard (1 GiB).
inline constexpr std::int64_t max_wds_member_bytes = large_file_bytes;

namespace detail {
/// Calls f(json object, line number) for each non-blank line of the JSONL file `path` (lines up to
/// max_jsonl_line_bytes); data_error naming
/// the file and line for a line that is not a JSON object, and that context added to whatever f throws.
template <class F>
void for_each_jsonl(const std::string& path, F&& f) {
  // A regular file (a directory, FIFO or device is refused by name, core/files.hpp); its lines are
  // bounded, so its size is not.
  regular_file_stream in(path, std::numeric_limits<std::int64_t>::max(), "JSONL");
  std::string line{};
  std::int64_t no = 0;
  while (read_line_bounded(in, line, max_jsonl_line_bytes, path, static_cast<std::size_t>(no) + 1)) {
    ++no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = parse_json_bounded(line, path, json_max_depth, no);
    if (!j.is_object()) throw_error<data_error>("'{}' line {}: not a JSON object", path, no);
    try {
      f(j, no);
    } catch (error& e) {
      e.add_context(hetmesh::format("'{}' line {}", path, no));
      throw;
    } catch (const nlohmann::json::exception& e) {
      throw_error<data_error>("'{}' line {}: {}", path, no, e.what());
    }
  }
}

/// The largest token id `type` can store (its maximum; token ids are never negative).
[[nodiscard]] inline std::int64_t max_token_id(dtype type) {
  switch (type) {
    case dtype::uint8:
      return 255;
    case dtype::int8:
      return 127;
    case dtype::int16:
      return 32767;
    case dtype::uint16:
      return 65535;
    case dtype::int32:
      return 2147483647;
    default:
      return std::numeric_limits<std::int64_t>::max();
  }
}

/// The "tokens" array as ids, each checked: an integer (not 1.5, not "7"), >= 0 and at most what `type`
/// holds; data_error naming the element, its value and the range otherwise.
[[nodiscard]] inline std::vector<std::int64_t> token_ids(const nlohmann::json& arr, dtype type) {
  std::vector<std::int64_t> ids;
  ids.reserve(arr.size());
  const std::int64_t hi = max_token_id(type);
  for (std::size_t k = 0; k < arr.size(); ++k) {
    const auto& v = arr[k];
    bool ok = v.is_number_integer();
    std::int64_t id = 0;
    if (ok && v.is_number_unsigned()) ok = v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi);
    if (ok) {
      id = v.get<std::int64_t>();
      ok = id >= 0 && id <= hi;
    }
    if (!ok)
      throw_error<data_error>("\"tokens\"[{}] = {}; expected an integer token id in [0, {}] (dtype {})", k,
                              v.dump(), hi, type);
    ids.push_back(id);
  }
  return ids;
}

/// Checks what a JSONL line says about its WebDataset sample before anything is read or written:
/// "key" a string of 1 to 200 characters without '.', '/' or NUL (a '.' would split the member names
/// elsewhere); "text_tokens" an array of token ids in [0, 2^31); "tokens", when given with
/// "text_tokens", equal to its length; "items" an array of objects with a "tokens" count in [0, 2^40];
/// "files" an object whose extensions are 1 to 32 characters of [A-Za-z0-9_-] and whose paths are strings.
/// data_error naming the field otherwise.
inline void check_wds_line(const nlohmann::json& j) {
  if (j.contains("key")) {
    const auto& k = j["key"];
    if (!k.is_string()) throw_error<data_error>("\"key\" = {}; expected a string", k.dump());
    const auto& key = k.get_ref<const std::string&>();
    if (key.empty() || key.size() > 200 ||
        key.find_first_of(std::string_view("./\0", 3)) != std::string::npos)
      throw_error<data_error>("\"key\" = {}; expected 1 to 200 characters without '.', '/' or NUL", k.dump());
  }
  if (j.contains("text_tokens")) {
    const auto& t = j["text_tokens"];
    if (!t.is_array())
      throw_error<data_error>("\"text_tokens\" is {}; expected an array of token ids", t.type_name());
    for (std::size_t i = 0; i < t.size(); ++i)
      if (!t[i].is_number_integer() ||
          (t[i].is_number_unsigned() && t[i].get<std::uint64_t>() > 2147483647u) ||
          t[i].get<std::int64_t>() < 0 || t[i].get<std::int64_t>() > 2147483647)
        throw_error<data_error>("\"text_tokens\"[{}] = {}; expected a token id in [0, 2147483647]", i,
                                t[i].dump());
    if (j.contains("tokens") && j["tokens"] != nlohmann::json(t.size()))
      throw_error<data_error>("\"tokens\" = {} but \"text_tokens\" has {} entries; expected them to agree",
                              j["tokens"].dump(), t.size());
  }
  if (j.contains("items")) {
    const auto& items = j["items"];
    if (!items.is_array()) throw_error<data_error>("\"items\" is {}; expected an array", items.type_name());
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto& it = items[i];
      const bool ok =
          it.is_object() && it.contains("tokens") && it["tokens"].is_number_integer() &&
          !(it["tokens"].is_number_unsigned() && it["tokens"].get<std::uint64_t>() > (1ull << 40)) &&
          it["tokens"].get<std::int64_t>() >= 0 && it["tokens"].get<std::int64_t>() <= (1ll << 40);
      if (!ok)
        throw_error<data_error>("\"items\"[{}] = {}; expected an object with a \"tokens\" count in [0, 2^40]",
                                i, it.dump());
    }
  }
  if (j.contains("files")) {
    if (!j["files"].is_object())
      throw_error<data_error>("\"files\" = {}; expected an object of extension: path", j["files"].dump());
    for (const auto& [ext, path] : j["files"].items()) {
      const bool ext_ok =
          !ext.empty() && ext.size() <= 32 && ext != "json" &&
          ext.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
              std::string::npos;
      if (!path.is_string() || !ext_ok)
        throw_error<data_error>(
            "\"files\".{} = {}; expected a path string under an extension of 1 to 32 characters "
            "[A-Za-z0-9_-] "
            "other than json",
            ext, path.dump());
    }
  }
}
}  // namespace detail

/// JSONL -> `prefix.bin`/`prefix.idx`. Not collective; deterministic; O(input bytes).
inline convert_stats convert_jsonl_to_indexed(const std::string& jsonl, const std::string& prefix,
                                              dtype type = dtype::int32,
                                              const tokenizer& tok = byte_tokenizer) {
  convert_stats st;
  indexed_dataset_writer w(prefix, type);
  detail::for_each_jsonl(jsonl, [&](const nlohmann::json& j, std::int64_t) {
    std::vector<std::int64_t> ids;
    if (j.contains("tokens") && j["tokens"].is_array())
      ids = detail::token_ids(j["tokens"], type);
    else if (j.contains("text") && j["text"].is_string())
      ids = tok(j["text"].get<std::string>());
    else
      throw_error<data_error>("no \"tokens\" array and no \"text\" string; expected one of them");
    if (j.contains("loss_mask"))  // refused rather than dropped: the mask would be lost
      throw_error<data_error>(
          "a \"loss_mask\", but an indexed dataset holds token ids only; expected no mask here (convert to "
          "WebDataset, convert_jsonl_to_webdataset, to keep it)");
    w.add_sequence(std::span<const std::int64_t>(ids));
    w.end_document();
    ++st.lines;
    ++st.samples;
    st.tokens =
        checked_add(st.tokens, static_cast<std::int64_t>(ids.size()), "total tokens of the conversion");
  });
  w.finish();
  st.outputs = {prefix + ".bin", prefix + ".idx"};
  return st;
}

/// JSONL -> WebDataset shards `<prefix>-000000.tar`, ... of `per_shard` samples each, each with its
/// index beside it. Keys are the line's "key" or "s<line number>", and must be unique over the whole
/// conversion (a repeated key is a data_error naming both lines). Every shard is written under a temporary
/// name and all are published together at the end, so a failed conversion leaves none of its shards and
/// no earlier file of the same name damaged. Not collective; deterministic; O(input bytes).
inline convert_stats convert_jsonl_to_webdataset(const std::string& jsonl, const std::string& prefix,
                                                 std::int64_t per_shard) {
  if (per_shard < 1)
    throw_error<invalid_argument>("convert_jsonl_to_webdataset: per_shard = {}; expected >= 1", per_shard);
  convert_stats st;
  std::vector<std::unique_ptr<wds_writer>> shards;
  std::map<std::string, std::int64_t> key_line;
  detail::for_each_jsonl(jsonl, [&](nlohmann::json j, std::int64_t no) {
    detail::check_wds_line(j);
    std::int64_t tokens = 0;
    if (j.contains("tokens")) {
      const auto& t = j["tokens"];
      // An integer that is non-negative (as a signed value) and fits int64 (as an unsigned one).
      const bool ok =
          t.is_number_unsigned()
              ? t.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
              : t.is_number_integer() && t.get<std::int64_t>() >= 0;
      if (!ok) throw_error<data_error>("\"tokens\" = {}; expected a non-negative integer count", t.dump());
      tokens = t.get<std::int64_t>();
    } else {
      if (!j.contains("text_tokens") || !j["text_tokens"].is_array())
        throw_error<data_error>("no \"tokens\" count and no \"text_tokens\" list; expected one of them");
      tokens = static_cast<std::int64_t>(j["text_tokens"].size());
      j["tokens"] = tokens;
    }
    if (j.contains("loss_mask")) {  // checked here, so the loader never meets a bad one
      const auto mask = detail::loss_mask_of(j["loss_mask"], "this line");
      if (!j.contains("text_tokens") || !j["text_tokens"].is_array() ||
          j["text_tokens"].size() != mask.size())
        throw_error<data_error>(
            "\"loss_mask\" has {} entries; expected one per entry of \"text_tokens\" ({})", mask.size(),
            j.contains("text_tokens") && j["text_tokens"].is_array() ? std::to_string(j["text_tokens"].size())
                                                                     : std::string("absent"));
    }
    std::vector<std::pair<std::string, std::vector<std::byte>>> members;
    if (j.contains("files")) {
      for (const auto& [ext, path] : j["files"].items()) {
        // A regular file only: /dev/zero, a FIFO, a directory or a /proc file is refused by name.
        const std::string text = read_regular_file(path.get<std::string>(), max_wds_member_bytes,
                                                   hetmesh::format("\"files\".{}", ext));
        const auto* b = reinterpret_cast<const std::byte*>(text.data());
        members.emplace_back(ext, std::vector<std::byte>(b, b + text.size()));
      }
    }
    if (j.contains("key") && !j["key"].is_string())
      throw_error<data_error>("\"key\" = {}; expected a string", j["key"].dump());
    const std::string key = j.contains("key") ? j["key"].get<std::string>() : hetmesh::format("s{:09}", no);
    if (const auto [it, fresh] = key_line.emplace(key, no); !fresh)
      throw_error<data_error>(
          "key '{}' was already used on line {}; expected unique keys (a repeated key "
          "would merge two samples into one)",
          key, it->second);
    const std::string meta = j.dump();
    const auto* mb = reinterpret_cast<const std::byte*>(meta.data());
    members.insert(members.begin(), {"json", std::vector<std::byte>(mb, mb + meta.size())});
    if (st.samples % per_shard == 0) {
      if (!shards.empty()) shards.back()->close();
      st.outputs.push_back(hetmesh::format("{}-{:06}.tar", prefix, st.outputs.size()));
      shards.push_back(std::make_unique<wds_writer>(st.outputs.back()));
    }
    shards.back()->add(key, members);
    ++st.lines;
    ++st.samples;
    st.tokens = checked_add(st.tokens, tokens, "total tokens of the conversion");
  });
  for (auto& w : shards) w->close();
  for (auto& w : shards) w->commit();
  return st;
}

}  // namespace hetmesh::data
