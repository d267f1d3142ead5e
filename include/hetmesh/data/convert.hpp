// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: converters from JSONL (one JSON object per line) to the two on-disk formats.
//  - to a Megatron indexed dataset: each line is one document of one sequence, from its "tokens" array
//    (ids) or its "text" string through a tokenizer hook (default: the UTF-8 bytes, ids 0..255);
//  - to WebDataset shards: each line becomes one sample: its `.json` is the line itself (which must say
//    "tokens", or carry "text_tokens" from which the count is taken), plus one member per entry of
//    "files": {"jpg": "/path/x.jpg", ...} read from disk.
// Blank lines are skipped; a malformed line is a data_error naming the file and line number.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
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

namespace detail {
template <class F>
void for_each_jsonl(const std::string& path, F&& f) {
  std::ifstream in(path);
  if (!in) throw_error<data_error>("cannot open JSONL '{}'", path);
  std::string line{};
  std::int64_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw_error<data_error>("'{}' line {}: not a JSON object", path, no);
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
      ids = j["tokens"].get<std::vector<std::int64_t>>();
    else if (j.contains("text") && j["text"].is_string())
      ids = tok(j["text"].get<std::string>());
    else
      throw_error<data_error>("no \"tokens\" array and no \"text\" string; expected one of them");
    w.add_sequence(std::span<const std::int64_t>(ids));
    w.end_document();
    ++st.lines;
    ++st.samples;
    st.tokens += static_cast<std::int64_t>(ids.size());
  });
  w.finish();
  st.outputs = {prefix + ".bin", prefix + ".idx"};
  return st;
}

/// JSONL -> WebDataset shards `<prefix>-000000.tar`, ... of `per_shard` samples each, each with its
/// index beside it. Keys are the line's "key" or "s<line number>".
inline convert_stats convert_jsonl_to_webdataset(const std::string& jsonl, const std::string& prefix,
                                                 std::int64_t per_shard) {
  if (per_shard < 1)
    throw_error<invalid_argument>("convert_jsonl_to_webdataset: per_shard = {}; expected >= 1", per_shard);
  convert_stats st;
  std::unique_ptr<wds_writer> w;
  auto open_next = [&] {
    if (w) w->finish();
    st.outputs.push_back(hetmesh::format("{}-{:06}.tar", prefix, st.outputs.size()));
    w = std::make_unique<wds_writer>(st.outputs.back());
  };
  detail::for_each_jsonl(jsonl, [&](nlohmann::json j, std::int64_t no) {
    if (!j.contains("tokens")) {
      if (!j.contains("text_tokens"))
        throw_error<data_error>("no \"tokens\" count and no \"text_tokens\"; expected one of them");
      j["tokens"] = j["text_tokens"].size();
    }
    std::vector<std::pair<std::string, std::vector<std::byte>>> members;
    if (j.contains("files")) {
      for (const auto& [ext, path] : j["files"].items()) {
        const std::string text = detail::read_text(path.get<std::string>());
        const auto* b = reinterpret_cast<const std::byte*>(text.data());
        members.emplace_back(ext, std::vector<std::byte>(b, b + text.size()));
      }
    }
    const std::string key = j.contains("key") ? j["key"].get<std::string>() : hetmesh::format("s{:09}", no);
    const std::string meta = j.dump();
    const auto* mb = reinterpret_cast<const std::byte*>(meta.data());
    members.insert(members.begin(), {"json", std::vector<std::byte>(mb, mb + meta.size())});
    if (st.samples % per_shard == 0) open_next();
    w->add(key, members);
    ++st.lines;
    ++st.samples;
    st.tokens += j["tokens"].get<std::int64_t>();
  });
  if (w) w->finish();
  return st;
}

}  // namespace hetmesh::data
