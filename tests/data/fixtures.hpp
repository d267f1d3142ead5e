// SPDX-License-Identifier: Apache-2.0
// Verifiable test data for hetmesh::data: every length and token is a pure function of (seed, source,
// sample, index) through key_hash, so a wrong, missing or repeated byte is detected, not averaged away.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <hetmesh/core/random.hpp>
#include <hetmesh/data/indexed_dataset.hpp>
#include <hetmesh/data/webdataset.hpp>

namespace hetmesh::data::test {

/// A fresh directory under TMPDIR, removed when the object dies.
struct temp_dir {
  std::string path;
  temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "hetmesh-data-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  [[nodiscard]] std::string operator/(const std::string& name) const { return path + "/" + name; }
};

/// Length of sample i of source `src`: in [lo, hi].
inline std::int64_t sample_length(std::uint64_t seed, int src, std::int64_t i, std::int64_t lo,
                                  std::int64_t hi) {
  return lo + static_cast<std::int64_t>(
                  key_hash({seed, static_cast<std::uint64_t>(src), static_cast<std::uint64_t>(i), 0xffff}) %
                  static_cast<std::uint64_t>(hi - lo + 1));
}
/// Token k of sample i of source `src`: below `vocab`.
inline std::int32_t sample_token(std::uint64_t seed, int src, std::int64_t i, std::int64_t k,
                                 std::int64_t vocab = 60000) {
  return static_cast<std::int32_t>(
      key_hash({seed, static_cast<std::uint64_t>(src), static_cast<std::uint64_t>(i),
                static_cast<std::uint64_t>(k) + 1}) %
      static_cast<std::uint64_t>(vocab));
}
inline std::vector<std::int32_t> expected_tokens(std::uint64_t seed, int src, std::int64_t i, std::int64_t lo,
                                                 std::int64_t hi) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(sample_length(seed, src, i, lo, hi)));
  for (std::size_t k = 0; k < t.size(); ++k) t[k] = sample_token(seed, src, i, static_cast<std::int64_t>(k));
  return t;
}

/// Writes an indexed dataset of `n` sequences (one per document) with verifiable tokens.
inline void make_indexed(const std::string& prefix, std::uint64_t seed, int src, std::int64_t n,
                         std::int64_t lo, std::int64_t hi, dtype type = dtype::uint16) {
  indexed_dataset_writer w(prefix, type);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto t = expected_tokens(seed, src, i, lo, hi);
    w.add_sequence(std::span<const std::int32_t>(t));
    w.end_document();
  }
  w.finish();
}

/// Payload byte k of item j of sample i.
inline std::byte payload_byte(std::uint64_t seed, int src, std::int64_t i, int j, std::int64_t k) {
  return static_cast<std::byte>(
      key_hash({seed, static_cast<std::uint64_t>(src), static_cast<std::uint64_t>(i),
                static_cast<std::uint64_t>(j) + 100, static_cast<std::uint64_t>(k)}) &
      0xffU);
}
inline std::int64_t item_tokens(std::uint64_t seed, int src, std::int64_t i) {
  return 16 + 16 * (key_hash({seed, 7, static_cast<std::uint64_t>(src), static_cast<std::uint64_t>(i)}) % 8);
}

/// Writes `shards` WebDataset shards of `per_shard` samples: `.json` (tokens, text_tokens, one "jpg"
/// item) and a `.jpg` payload of verifiable bytes. Global sample i = shard * per_shard + local.
inline std::vector<std::string> make_wds(const temp_dir& dir, const std::string& name, std::uint64_t seed,
                                         int src, int shards, std::int64_t per_shard, std::int64_t lo,
                                         std::int64_t hi) {
  std::vector<std::string> paths;
  for (int sh = 0; sh < shards; ++sh) {
    paths.push_back(dir / fmt::format("{}-{:03}.tar", name, sh));
    wds_writer w(paths.back());
    for (std::int64_t l = 0; l < per_shard; ++l) {
      const std::int64_t i = sh * per_shard + l;
      const auto toks = expected_tokens(seed, src, i, lo, hi);
      nlohmann::json j{{"tokens", toks.size()},
                       {"text_tokens", toks},
                       {"items", {{{"ext", "jpg"}, {"tokens", item_tokens(seed, src, i)}}}}};
      const std::string js = j.dump();
      std::vector<std::byte> jpg(static_cast<std::size_t>(100 + i % 700));
      for (std::size_t k = 0; k < jpg.size(); ++k)
        jpg[k] = payload_byte(seed, src, i, 0, static_cast<std::int64_t>(k));
      const auto* b = reinterpret_cast<const std::byte*>(js.data());
      std::vector<std::pair<std::string, std::vector<std::byte>>> members{{"json", {b, b + js.size()}},
                                                                          {"jpg", std::move(jpg)}};
      w.add(fmt::format("{}_{:06}", name, i), members);
    }
    w.finish();
  }
  return paths;
}

}  // namespace hetmesh::data::test
