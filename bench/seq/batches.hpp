// SPDX-License-Identifier: Apache-2.0
// Batch builders for the seq/ benchmarks, from the vendored length data (tests/data/workloads), read
// at run time. "byted_like" and "github_like" rebuild ByteScale's published token shares of the long
// tail (bytescale_length_facts.json) on top of real short documents (prolong_doc_lengths.txt):
// where the paper gives only a combined share, the split below is ours and is stated in the JSON.
// The folder is found by ../support/workloads.hpp; length files are read by
// hetmesh::balance::read_lengths and read_azure_csv.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/seq/types.hpp>

namespace seqbench {

namespace fs = std::filesystem;

struct long_bucket {
  std::int64_t lo, hi;  // lengths drawn log-uniformly in [lo, hi]
  double token_share;
};

struct batch_spec {
  std::string name;
  std::vector<long_bucket> tail;  // long tail, by token share
  std::string body;               // "prolong" | "azure_conv" | "azure_code"
  std::string note;
};

inline std::vector<batch_spec> specs(const fs::path& dir) {
  std::ifstream in(dir / "bytescale_length_facts.json");
  if (!in)
    hetmesh::throw_error<hetmesh::data_error>("cannot open {}",
                                              (dir / "bytescale_length_facts.json").string());
  const auto f = nlohmann::json::parse(in);
  const auto& b = f.at("byted");
  const auto& part = b.at("token_share_by_bucket_lower_bound_partial");
  const double s2m = part.at("2M").get<double>(), s1m = part.at("1M").get<double>();
  const double s128 = part.at("128K").get<double>(),
               s256_512 = part.at("256K_and_512K_together").get<double>();
  const auto& g = f.at("github");
  const double g128 = g.at("share_of_tokens_gt_128k").get<double>(),
               g256 = g.at("share_of_tokens_gt_256k").get<double>();
  constexpr std::int64_t K = 1024;
  return {
      {"byted_like",
       {{2048 * K, 2048 * K, s2m},
        {1024 * K, 2048 * K - 1, s1m},
        {512 * K, 1024 * K - 1, s256_512 / 2},
        {256 * K, 512 * K - 1, s256_512 / 2},
        {128 * K, 256 * K - 1, s128}},
       "prolong",
       "ByteScale Byted token shares (2M, 1M, 128K from the paper; the 256K+512K share split evenly: our "
       "choice); "
       "body: ProLong documents"},
      {"github_like",
       {{1024 * K, 2048 * K - 1, g256 * 0.2},
        {512 * K, 1024 * K - 1, g256 * 0.3},
        {256 * K, 512 * K - 1, g256 * 0.5},
        {128 * K, 256 * K - 1, g128 - g256}},
       "prolong",
       "ByteScale GitHub token shares (>128K 16.2%, >256K 9.8%; the >256K share split 0.2/0.3/0.5 over "
       "1M/512K/256K: "
       "our choice); body: ProLong documents"},
      {"prolong", {}, "prolong", "ProLong document lengths only (real)"},
      {"azure_code", {}, "azure_code", "Azure 2023 code trace, context + generated (real)"},
  };
}

/// One global batch of about `target` tokens: the tail buckets filled to their token shares, then
/// body samples (drawn with replacement) until the target. Ids are 0..n-1. Deterministic in seed.
inline std::vector<hetmesh::seq::seq_desc> make_batch(const batch_spec& spec,
                                                      const std::vector<std::int64_t>& body,
                                                      std::int64_t target, std::uint64_t seed) {
  hetmesh::rng g(seed);
  std::vector<hetmesh::seq::seq_desc> out;
  std::int64_t total = 0;
  for (const auto& b : spec.tail) {
    const auto want = static_cast<std::int64_t>(b.token_share * static_cast<double>(target));
    std::int64_t got = 0;
    while (got + b.lo / 2 < want) {
      const double u = g.unit();
      const auto len =
          b.lo == b.hi ? b.lo
                       : static_cast<std::int64_t>(std::exp(std::log(static_cast<double>(b.lo)) +
                                                            u * std::log(static_cast<double>(b.hi) / b.lo)));
      out.push_back({static_cast<std::int64_t>(out.size()), len});
      got += len;
    }
    total += got;
  }
  const std::int64_t tail_max = spec.tail.empty() ? 0 : 128 * 1024;
  while (total < target) {
    auto len = body[static_cast<std::size_t>(g.below(body.size()))];
    if (tail_max > 0 && len >= tail_max) continue;  // the tail is fixed by the shares above
    len = std::min(len, target - total);
    out.push_back({static_cast<std::int64_t>(out.size()), len});
    total += len;
  }
  return out;
}

}  // namespace seqbench
