#include <doctest/doctest.h>

#include <hetmesh/core/random.hpp>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

TEST_CASE("permutation is a permutation and depends only on the seed") {
  for (std::int64_t n : {0, 1, 2, 7, 1000}) {
    auto p = hetmesh::permutation(n, 5);
    auto q = hetmesh::permutation(n, 5);
    CHECK(p == q);
    std::vector<std::int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int64_t> iota(static_cast<std::size_t>(n));
    std::iota(iota.begin(), iota.end(), 0);
    CHECK(sorted == iota);
  }
  CHECK(hetmesh::permutation(1000, 5) != hetmesh::permutation(1000, 6));
}

TEST_CASE("rng.below is within bounds and covers them") {
  hetmesh::rng g(7);
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const auto v = g.below(13);
    REQUIRE(v < 13);
    seen.insert(v);
  }
  CHECK(seen.size() == 13);
  for (int i = 0; i < 1000; ++i) {
    const auto u = g.unit();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    const auto k = g.uniform(-3, 3);
    REQUIRE(k >= -3);
    REQUIRE(k <= 3);
  }
}

TEST_CASE("key_hash separates its keys") {
  CHECK(hetmesh::key_hash({1, 2}) != hetmesh::key_hash({2, 1}));
  CHECK(hetmesh::key_hash({1, 2}) == hetmesh::key_hash({1, 2}));
  CHECK(hetmesh::key_hash({0}) != hetmesh::key_hash({0, 0}));
}
