// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the balance tests: seeded workloads and the exactly-once check of an HDP plan.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include <hetmesh/balance/workload.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/seq/hdp.hpp>

#include "support/workloads.hpp"

namespace hetmesh::test {

/// Heavy-tailed lengths: mostly short, a few long (log-uniform between lo and hi).
inline std::vector<seq::seq_desc> random_batch(std::uint64_t seed, int n, std::int64_t lo, std::int64_t hi) {
  rng g(seed);
  std::vector<seq::seq_desc> out;
  const double span = std::log(static_cast<double>(hi) / static_cast<double>(lo));
  for (int i = 0; i < n; ++i) {
    const auto len =
        static_cast<std::int64_t>(static_cast<double>(lo) * std::exp(span * g.unit() * g.unit()));
    out.push_back({static_cast<std::int64_t>(1000 + 7 * i), std::max<std::int64_t>(1, len)});
  }
  return out;
}

/// A batch of about `tokens` tokens sampled from the vendored ProLong document lengths
/// (tests/data/workloads/prolong_doc_lengths.txt; a missing file fails the test).
inline std::vector<seq::seq_desc> prolong_batch(std::uint64_t seed, std::int64_t tokens) {
  static const std::vector<std::int64_t> lens =
      balance::read_lengths(workload_file("prolong_doc_lengths.txt"));
  return balance::sample_batch(lens, tokens, seed);
}

/// The heavy-tailed synthetic batch: about `tokens` tokens sampled from 20,000 random_batch(seed, ...,
/// 64, 300000) lengths. Kept as an explicit case beside the ProLong one (see planners.cpp).
inline std::vector<seq::seq_desc> heavy_tailed_batch(std::uint64_t seed, std::int64_t tokens) {
  std::vector<std::int64_t> lens;
  for (const auto& s : random_batch(seed, 20000, 64, 300000)) lens.push_back(s.length);
  return balance::sample_batch(lens, tokens, seed);
}

/// Every token of every sequence is held by exactly one (rank, micro-batch) segment.
inline void check_exactly_once(const seq::hdp_plan& plan, const std::vector<seq::seq_desc>& seqs) {
  std::map<std::int64_t, std::vector<seq::token_range>> got;
  for (const auto& rank : plan.per_rank)
    for (const auto& mb : rank)
      for (const auto& sg : mb.segments) got[sg.seq_id].push_back(sg.tokens);
  std::int64_t nonempty = 0;
  for (const auto& s : seqs) {
    if (s.length == 0) continue;
    ++nonempty;
    auto& v = got[s.id];
    std::sort(v.begin(), v.end());
    std::int64_t at = 0;
    for (const auto& r : v) {
      REQUIRE(r.begin == at);
      at = r.end;
    }
    REQUIRE(at == s.length);
  }
  CHECK(static_cast<std::int64_t>(got.size()) == nonempty);
}

}  // namespace hetmesh::test
