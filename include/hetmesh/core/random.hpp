// SPDX-License-Identifier: Apache-2.0
// hetmesh: deterministic randomness. Planners and the data plane need the same stream on every rank,
// compiler and standard library, so nothing here uses std:: distributions or std::shuffle (whose
// outputs are implementation-defined).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>
#include "../config.hpp"

namespace hetmesh {

/// The splitmix64 finaliser: a bijective 64-bit mix.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// A counter-based value: a pure function of its keys, e.g. `key_hash({seed, rank, index})`. The
/// basis of verifiable test data and of per-(seed, source, epoch) permutations.
[[nodiscard]] constexpr std::uint64_t key_hash(std::initializer_list<std::uint64_t> keys) noexcept {
  std::uint64_t h = 0x243f6a8885a308d3ULL;
  for (std::uint64_t k : keys) h = mix64(h ^ mix64(k));
  return h;
}

/// A small, fast, portable generator (splitmix64 sequence). Satisfies UniformRandomBitGenerator.
class rng {
 public:
  /// The type of the values drawn (UniformRandomBitGenerator).
  using result_type = std::uint64_t;
  /// The generator whose sequence is fixed by `seed`: the same seed gives the same values on every rank and
  /// platform.
  constexpr explicit rng(std::uint64_t seed) noexcept : state_(seed) {}
  /// Smallest value drawn: 0.
  static constexpr result_type min() noexcept { return 0; }
  /// Largest value drawn: 2^64 - 1.
  static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }
  /// The next value of the sequence. Cost: O(1).
  constexpr result_type operator()() noexcept {
    state_ += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform integer in [0, bound), bound > 0, without modulo bias (rejection of the short tail).
  constexpr std::uint64_t below(std::uint64_t bound) noexcept {
    const std::uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    for (;;) {
      const std::uint64_t x = (*this)();
      if (x >= threshold) return x % bound;
    }
  }
  /// Uniform integer in [lo, hi], lo <= hi.
  constexpr std::int64_t uniform(std::int64_t lo, std::int64_t hi) noexcept {
    return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
  }
  /// Uniform double in [0, 1).
  constexpr double unit() noexcept { return static_cast<double>((*this)() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

/// Fisher-Yates shuffle with hetmesh::rng: the same permutation everywhere for the same seed.
template <class T>
constexpr void shuffle(std::span<T> items, rng& g) noexcept {
  for (std::size_t i = items.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(g.below(i));
    std::swap(items[i - 1], items[j]);
  }
}

/// The permutation of [0, n) for `seed`: deterministic on every platform.
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed);

}  // namespace hetmesh

#if HETMESH_BODIES

namespace hetmesh {

HETMESH_COMPILED std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), std::int64_t{0});
  rng g(seed);
  shuffle(std::span<std::int64_t>(p), g);
  return p;
}

}  // namespace hetmesh
#endif  // HETMESH_BODIES
