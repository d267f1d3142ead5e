// SPDX-License-Identifier: Apache-2.0
// Solver properties over seeded random inputs, and approximation bounds against brute force.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include <hetmesh/balance/partition.hpp>
#include <hetmesh/balance/solvers.hpp>
#include <hetmesh/core/random.hpp>

using namespace hetmesh;
using balance::assignment;

namespace {

std::vector<std::int64_t> random_costs(std::uint64_t seed, int n, std::int64_t lo, std::int64_t hi) {
  rng g(seed);
  std::vector<std::int64_t> c(static_cast<std::size_t>(n));
  for (auto& x : c) x = g.uniform(lo, hi);
  return c;
}

// Exactly once, bins in range, loads are the sums of their items.
void check_consistent(const assignment& a, const std::vector<std::int64_t>& costs, int bins) {
  REQUIRE(a.bin_of.size() == costs.size());
  if (bins > 0) REQUIRE(a.bins() == bins);
  std::vector<std::int64_t> sum(static_cast<std::size_t>(a.bins()), 0);
  for (std::size_t i = 0; i < costs.size(); ++i) {
    REQUIRE(a.bin_of[i] >= 0);
    REQUIRE(a.bin_of[i] < a.bins());
    sum[static_cast<std::size_t>(a.bin_of[i])] += costs[i];
  }
  CHECK(sum == a.load);
}

// Per bin, the sorted list of costs it holds.
std::vector<std::vector<std::int64_t>> bin_contents(const assignment& a,
                                                    const std::vector<std::int64_t>& costs) {
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(a.bins()));
  for (std::size_t i = 0; i < costs.size(); ++i)
    out[static_cast<std::size_t>(a.bin_of[i])].push_back(costs[i]);
  for (auto& b : out) std::sort(b.begin(), b.end());
  return out;
}

// Optimal makespan by exhaustive search (first item pinned to bin 0 by symmetry).
std::int64_t brute_makespan(const std::vector<std::int64_t>& c, int m) {
  std::vector<std::int64_t> load(static_cast<std::size_t>(m), 0);
  std::int64_t best = std::accumulate(c.begin(), c.end(), std::int64_t{0});
  auto rec = [&](auto&& self, std::size_t i) -> void {
    if (i == c.size()) {
      best = std::min(best, *std::max_element(load.begin(), load.end()));
      return;
    }
    for (int b = 0; b < m; ++b) {
      if (i == 0 && b > 0) break;
      load[static_cast<std::size_t>(b)] += c[i];
      if (load[static_cast<std::size_t>(b)] < best) self(self, i + 1);
      load[static_cast<std::size_t>(b)] -= c[i];
    }
  };
  rec(rec, 0);
  return best;
}

// Fewest bins of `cap` that hold `c`, by exhaustive search.
int brute_bins(std::vector<std::int64_t> c, std::int64_t cap) {
  std::sort(c.rbegin(), c.rend());
  for (int k = 1;; ++k) {
    std::vector<std::int64_t> free_space(static_cast<std::size_t>(k), cap);
    auto rec = [&](auto&& self, std::size_t i) -> bool {
      if (i == c.size()) return true;
      for (int b = 0; b < k; ++b) {
        auto& f = free_space[static_cast<std::size_t>(b)];
        if (f >= c[i]) {
          f -= c[i];
          if (self(self, i + 1)) return true;
          f += c[i];
        }
        if (f == cap) break;  // empty bins are interchangeable
      }
      return false;
    };
    if (rec(rec, 0)) return k;
  }
}

}  // namespace

TEST_CASE("lpt, karmarkar_karp, best_fit_decreasing: exactly once and consistent loads") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const int n = static_cast<int>(seed * 7 % 97);
    const int m = 1 + static_cast<int>(seed % 9);
    const auto c = random_costs(seed, n, 0, 1000);
    check_consistent(balance::lpt(c, m), c, m);
    check_consistent(balance::karmarkar_karp(c, m), c, m);
    const auto bfd = balance::best_fit_decreasing(c, 1000);
    check_consistent(bfd, c, -1);
    for (auto l : bfd.load) CHECK(l <= 1000);
  }
}

TEST_CASE("solvers are invariant under input permutation (bin contents, not just loads)") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    auto c = random_costs(seed, 60, 1, 30);  // many ties: the (-cost, index) key must make them harmless
    const auto p = permutation(static_cast<std::int64_t>(c.size()), seed + 100);
    std::vector<std::int64_t> d(c.size());
    for (std::size_t i = 0; i < c.size(); ++i) d[i] = c[static_cast<std::size_t>(p[i])];
    CHECK(bin_contents(balance::lpt(c, 7), c) == bin_contents(balance::lpt(d, 7), d));
    CHECK(bin_contents(balance::karmarkar_karp(c, 7), c) == bin_contents(balance::karmarkar_karp(d, 7), d));
    CHECK(bin_contents(balance::best_fit_decreasing(c, 50), c) ==
          bin_contents(balance::best_fit_decreasing(d, 50), d));
    CHECK(plan_hash(balance::lpt(c, 7)) == plan_hash(balance::lpt(c, 7)));
  }
}

TEST_CASE("approximation bounds against brute force on small inputs") {
  int kk_better_or_equal = 0;
  int cases = 0;
  for (std::uint64_t seed = 1; seed <= 150; ++seed) {
    const int m = 2 + static_cast<int>(seed % 3);
    const int n = 4 + static_cast<int>(seed % 6);
    const auto c = random_costs(seed * 31, n, 1, 100);
    const std::int64_t opt = brute_makespan(c, m);
    const auto l = balance::lpt(c, m).makespan();
    const auto k = balance::karmarkar_karp(c, m).makespan();
    // LPT: makespan <= (4/3 - 1/(3m)) OPT, i.e. 3m * lpt <= (4m - 1) * OPT.
    CHECK_MESSAGE(3 * m * l <= (4 * m - 1) * opt, "seed ", seed, " lpt ", l, " opt ", opt);
    // LDM: two-way <= 7/6 OPT; m-way <= 4/3 - 1/(3m) (Michiels et al.).
    if (m == 2) {
      CHECK_MESSAGE(6 * k <= 7 * opt, "seed ", seed, " kk ", k, " opt ", opt);
    } else {
      CHECK_MESSAGE(3 * m * k <= (4 * m - 1) * opt, "seed ", seed, " kk ", k, " opt ", opt);
    }
    CHECK(l >= opt);
    CHECK(k >= opt);
    CHECK(opt >= balance::makespan_lower_bound(c, m));
    kk_better_or_equal += k <= l ? 1 : 0;
    ++cases;
  }
  // KK is not always better than LPT, but it should be on most instances.
  CHECK(kk_better_or_equal * 10 >= cases * 7);
}

TEST_CASE("best_fit_decreasing: bins <= 11/9 OPT + 6/9 against brute force") {
  for (std::uint64_t seed = 1; seed <= 120; ++seed) {
    const int n = 3 + static_cast<int>(seed % 8);
    const auto c = random_costs(seed * 17, n, 1, 60);
    const auto a = balance::best_fit_decreasing(c, 100);
    const int opt = brute_bins(c, 100);
    CHECK_MESSAGE(9 * a.bins() <= 11 * opt + 6, "seed ", seed, " bfd ", a.bins(), " opt ", opt);
    CHECK(a.bins() >= opt);
  }
}

TEST_CASE("karmarkar_karp: classic instances and many bins") {
  // {8,7,6,5,4} in two bins: OPT is 15/15, LPT ends at 17/13, two-way differencing leaves a difference
  // of 2 (8-7, 6-5, 4-1, 3-1), i.e. 16/14.
  std::vector<std::int64_t> c{8, 7, 6, 5, 4};
  CHECK(balance::lpt(c, 2).makespan() == 17);
  CHECK(balance::karmarkar_karp(c, 2).makespan() <= 16);
  // Far more bins than items: every item alone, no O(n m) blow-up.
  const auto big = random_costs(5, 300, 1, 1'000'000);
  const auto a = balance::karmarkar_karp(big, 16384);
  check_consistent(a, big, 16384);
  CHECK(a.makespan() == *std::max_element(big.begin(), big.end()));
  CHECK(balance::lpt(big, 16384).makespan() == a.makespan());
}

TEST_CASE("bad input is rejected with the offending value named") {
  std::vector<std::int64_t> c{3, -1};
  CHECK_THROWS_AS((void)balance::lpt(c, 2), invalid_argument);
  CHECK_THROWS_WITH_AS((void)balance::karmarkar_karp(std::vector<std::int64_t>{1}, 0),
                       doctest::Contains("bins = 0"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)balance::best_fit_decreasing(std::vector<std::int64_t>{5, 11}, 10),
                       doctest::Contains("item 1 has size 11"), capacity_error);
  const auto empty = balance::lpt(std::vector<std::int64_t>{}, 3);
  CHECK(empty.load == std::vector<std::int64_t>{0, 0, 0});
  CHECK(to_string(balance::lpt(std::vector<std::int64_t>{2, 1}, 2)) ==
        "assignment(items=2, bins=2, makespan=2, load=[2, 1])");
}

TEST_CASE("decreasing_order: (-cost, index) order, by comparison below 128 items and by radix from 128") {
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    const int n = static_cast<int>(seed * 53 % 700);
    // Many ties, small prices, prices of every byte width up to 2^62.
    const std::int64_t hi = seed % 4 == 0   ? 3
                            : seed % 4 == 1 ? 1000000
                            : seed % 4 == 2 ? std::int64_t{1} << 40
                                            : std::int64_t{1} << 62;
    auto c = random_costs(seed, n, 0, hi);
    if (seed % 5 == 0 && n > 0) c[0] = 0;
    std::vector<int> expected(static_cast<std::size_t>(n));
    std::iota(expected.begin(), expected.end(), 0);
    std::sort(expected.begin(), expected.end(), [&](int a, int b) {
      const auto ca = c[static_cast<std::size_t>(a)], cb = c[static_cast<std::size_t>(b)];
      return ca != cb ? ca > cb : a < b;
    });
    REQUIRE(balance::decreasing_order(c) == expected);
  }
  CHECK(balance::decreasing_order(std::vector<std::int64_t>(300, 7)).back() ==
        299);  // all equal: index order
}

TEST_CASE(
    "list_schedule: LPT in the decreasing order, the heap and the scan agree; members() is items_of()") {
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const int n = 1 + static_cast<int>(seed * 37 % 300);
    // Few distinct costs: many ties, so the tie-breaks (lower index first, then lowest bin) are exercised.
    const auto c = random_costs(seed, n, 0, seed % 2 == 0 ? 5 : 1000);
    for (int bins : {1, 2, 7, 16, 17, 64}) {
      const auto order = balance::decreasing_order(c);
      const auto a = balance::list_schedule(c, order, bins);
      check_consistent(a, c, bins);
      // Brute-force reference: the greedy with an explicit argmin over loads (lowest bin on ties).
      std::vector<std::int64_t> load(static_cast<std::size_t>(bins), 0);
      for (int i : order) {
        const auto b = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        REQUIRE(a.bin_of[static_cast<std::size_t>(i)] == static_cast<int>(b));
        load[b] += c[static_cast<std::size_t>(i)];
      }
      CHECK(a == balance::lpt(c, bins));
      const auto m = a.members();
      for (int b = 0; b < bins; ++b) CHECK(m[static_cast<std::size_t>(b)] == a.items_of(b));
    }
  }
  const std::vector<std::int64_t> c{4, 2, 3};
  CHECK_THROWS_WITH_AS((void)balance::list_schedule(c, std::vector<int>{0, 1}, 2),
                       doctest::Contains("2 entries"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)balance::list_schedule(c, std::vector<int>{0, 1, 1}, 2),
                       doctest::Contains("item 1 appears twice"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)balance::list_schedule(c, std::vector<int>{0, 1, 3}, 2),
                       doctest::Contains("item 3"), invalid_argument);
  CHECK_THROWS_AS((void)balance::decreasing_order(std::vector<std::int64_t>{1, -2}), invalid_argument);
}

TEST_CASE("partitioner policies: the solvers as types; round robin deals out in order; bad input named") {
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const int n = static_cast<int>(seed * 11 % 89);
    const int m = 1 + static_cast<int>(seed % 7);
    const auto c = random_costs(seed, n, 0, 5000);
    CAPTURE(seed);
    CHECK(balance::lpt_partition{}.split(c, m) == balance::lpt(c, m));
    CHECK(balance::karmarkar_karp_partition{}.split(c, m) == balance::karmarkar_karp(c, m));
    const auto rr = balance::round_robin_partition{}.split(c, m);
    check_consistent(rr, c, m);
    for (std::size_t i = 0; i < c.size(); ++i)
      CHECK(rr.bin_of[i] == static_cast<int>(i % static_cast<std::size_t>(m)));
  }
  const std::vector<std::int64_t> bad{3, -1};
  CHECK_THROWS_WITH_AS((void)balance::round_robin_partition{}.split(bad, 2), doctest::Contains("-1"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)balance::round_robin_partition{}.split(std::vector<std::int64_t>{1}, 0),
                       doctest::Contains("bins"), invalid_argument);
  CHECK(plan_hash(balance::lpt_partition{}) != plan_hash(balance::karmarkar_karp_partition{}));
  CHECK(fmt::format("{}", balance::round_robin_partition{}) == "round_robin_partition");
}
