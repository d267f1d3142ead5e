// SPDX-License-Identifier: Apache-2.0
// Benchmark workloads: the synthetic Byted-like generator. The vendored files are found and read by
// ../support/workloads.hpp and hetmesh::balance::read_lengths.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include <hetmesh/core/random.hpp>
#include <hetmesh/seq/types.hpp>

namespace hetmesh::bench {

/// A synthetic "Byted-like" length distribution. ByteScale publishes only aggregate shares
/// (bytescale_length_facts.json); the bucket weights below are OUR choice, made so that: 80% of
/// samples are <= 4K; 0.05% are 2M and hold 12.1% of tokens; >= 128K holds 44.3% of tokens (1M: 9.7%,
/// 512K: 8.8%, 256K: 6.4%, 128K: 7.3%); > 256K holds 37%; mean length ~8.7K. Lengths are log-uniform
/// inside each bucket. (Samples >= 128K come out at 0.7% rather than the published 1%: the published
/// shares are not all consistent with log-uniform buckets.)
struct length_bucket {
  std::int64_t lo, hi;
  double p;
};
inline const std::vector<length_bucket>& byted_like_buckets() {
  static const std::vector<length_bucket> b{{64, 4096, 0.80},
                                            {4096, 32768, 0.1686},
                                            {32768, 131072, 0.0243},
                                            {131072, 262144, 0.003425},
                                            {262144, 524288, 0.001503},
                                            {524288, 1048576, 0.001032},
                                            {1048576, 2097152, 0.000582},
                                            {2097152, 2097152, 0.0005}};
  return b;
}

inline std::vector<seq::seq_desc> byted_like_batch(std::int64_t tokens, std::uint64_t seed) {
  const auto& b = byted_like_buckets();
  double sum = 0;
  for (const auto& x : b) sum += x.p;
  rng g(seed);
  std::vector<seq::seq_desc> out;
  std::int64_t total = 0;
  while (total < tokens) {
    double u = g.unit() * sum;
    std::size_t k = 0;
    while (k + 1 < b.size() && u >= b[k].p) u -= b[k++].p;
    const double lo = static_cast<double>(b[k].lo), hi = static_cast<double>(b[k].hi);
    const auto l = static_cast<std::int64_t>(lo * std::exp(std::log(hi / lo) * g.unit()));
    out.push_back({static_cast<std::int64_t>(out.size()), std::max<std::int64_t>(1, l)});
    total += out.back().length;
  }
  return out;
}

}  // namespace hetmesh::bench
