#include <doctest/doctest.h>

#include <hetmesh/core/sort.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {
// Elements that compare by `key` only: ties between distinguishable elements show whether the erased
// sorts end in exactly std::sort's and std::stable_sort's orders.
struct item {
  int key;
  int tag;
  std::string payload;  // not trivially movable: the permutation must move, not copy bytes
  bool operator==(const item&) const = default;
};

std::vector<item> random_items(std::size_t n, int keys, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<item> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int k = static_cast<int>(rng() % static_cast<std::uint64_t>(keys));
    v[i] = {k, static_cast<int>(i), std::to_string(i * 7 + 1)};
  }
  return v;
}
}  // namespace

TEST_CASE("indirect_sort ends in std::sort's order, ties included") {
  const auto by_key = [](const item& a, const item& b) { return a.key < b.key; };
  for (std::size_t n : {0U, 1U, 2U, 5U, 16U, 17U, 100U, 1000U, 5000U})
    for (int keys : {1, 3, 50, 100000})
      for (std::uint64_t seed : {1U, 2U, 3U}) {
        auto a = random_items(n, keys, seed);
        auto b = a;
        std::sort(a.begin(), a.end(), by_key);
        hetmesh::indirect_sort(b.begin(), b.end(), by_key);
        CHECK(a == b);
      }
}

TEST_CASE("indirect_stable_sort ends in std::stable_sort's order") {
  const auto by_key = [](const item& a, const item& b) { return a.key < b.key; };
  for (std::size_t n : {0U, 1U, 7U, 33U, 1000U})
    for (int keys : {1, 4, 1000})
      for (std::uint64_t seed : {4U, 5U}) {
        auto a = random_items(n, keys, seed);
        auto b = a;
        std::stable_sort(a.begin(), a.end(), by_key);
        hetmesh::indirect_stable_sort(b.begin(), b.end(), by_key);
        CHECK(a == b);
      }
}

TEST_CASE("indirect_sort without a comparator sorts by <") {
  std::vector<std::pair<std::int64_t, int>> a{{3, 1}, {-1, 2}, {3, 0}, {7, 7}, {-1, 1}};
  auto b = a;
  std::sort(a.begin(), a.end());
  hetmesh::indirect_sort(b.begin(), b.end());
  CHECK(a == b);
}
