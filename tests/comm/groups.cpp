// SPDX-License-Identifier: Apache-2.0
// Groups and rings on loopback: the group cache (keyed by ordered rank lists, e.g. a mesh's groups),
// split, and dynamic rings on the parent communicator with their peer counts.
#include <doctest/doctest.h>

#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <hetmesh/comm/detail/checks.hpp>
#include <hetmesh/comm/group_cache.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/comm/ring.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/mesh/layout.hpp>

#include "p2p_only.hpp"

namespace comm = hetmesh::comm;
namespace lb = hetmesh::comm::loopback;

namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(what);
}

}  // namespace

TEST_CASE("group_cache: mesh groups get one communicator each, created once, with the mesh's rank order") {
  using namespace hetmesh::mesh;
  const auto m = make_mesh(tp(2), cp(2), dp(2));  // 8 ranks, tp fastest
  lb::run(8, [&](lb::communicator& world) {
    comm::group_cache<lb::communicator> cache(world);
    for (int round = 0; round < 2; ++round) {
      for (const auto& d : {tp, cp, dp}) {
        const std::vector<int> members = m.group_of(world.rank(), d);
        auto& g = cache.get(std::span<const int>(members));
        require(&g == &cache.get(std::span<const int>(members)), "same communicator on a second lookup");
        require(std::equal(g.ranks().begin(), g.ranks().end(), members.begin(), members.end()),
                "group order");
        std::vector<int> x{world.rank()};
        comm::all_reduce(g, std::span<int>(x), comm::reduce_op::sum);
        require(x[0] == std::accumulate(members.begin(), members.end(), 0), "sum over the group");
      }
    }
    require(cache.size() == 3, "three groups cached after two rounds");
    // A partition (the path NCCL needs): every rank passes the same list of groups.
    const auto part = m.groups(dp, cp);
    auto& g = cache.get_partition(std::span<const std::vector<int>>(part));
    require(&g == &cache.get_partition(std::span<const std::vector<int>>(part)), "partition cached");
    require(g.size() == 4, "dp x cp group of 4");
    std::vector<int> x{world.rank()};
    comm::all_reduce(g, std::span<int>(x), comm::reduce_op::max);
    const auto mine = m.group_of(world.rank(), dp, cp);
    require(x[0] == *std::max_element(mine.begin(), mine.end()), "max over the partition group");
    // The whole world in parent order is the parent itself.
    std::vector<int> all(8);
    std::iota(all.begin(), all.end(), 0);
    require(&cache.get(std::span<const int>(all)) == &world, "identity group is the parent");
  });
}

TEST_CASE("group_cache and split reject bad groups") {
  lb::run(3, [](lb::communicator& world) {
    comm::group_cache<lb::communicator> cache(world);
    CHECK_THROWS_AS(cache.get(std::span<const int>()), hetmesh::invalid_argument);
    const int out_of_range[] = {world.rank(), 3};
    CHECK_THROWS_AS(cache.get(std::span<const int>(out_of_range)), hetmesh::invalid_argument);
    const int twice[] = {world.rank(), world.rank()};
    CHECK_THROWS_AS(cache.get(std::span<const int>(twice)), hetmesh::invalid_argument);
    const std::vector<std::vector<int>> overlap{{0, 1}, {1, 2}}, gap{{0}, {2}};
    CHECK_THROWS_AS(cache.get_partition(std::span<const std::vector<int>>(overlap)),
                    hetmesh::invalid_argument);
    CHECK_THROWS_AS(cache.get_partition(std::span<const std::vector<int>>(gap)), hetmesh::invalid_argument);
    CHECK_THROWS_AS((void)comm::split(world, -1, 0), hetmesh::invalid_argument);
    comm::barrier(world);
  });
}

TEST_CASE("split orders each color by key, then rank") {
  lb::run(5, [](lb::communicator& world) {
    auto g = comm::split(world, world.rank() % 2, -world.rank());
    std::vector<int> want;
    for (int r = 4; r >= 0; --r)
      if (r % 2 == world.rank() % 2) want.push_back(r);
    require(std::equal(g.ranks().begin(), g.ranks().end(), want.begin(), want.end()), "split order");
  });
}

TEST_CASE("dynamic rings: a different set of rings every step, all on the parent communicator") {
  constexpr int n = 6;
  lb::run(n, [](lb::communicator& world) {
    comm::testing::p2p_only c(world);  // no subgroup or split: a ring over it creates no communicator
    for (std::uint64_t step = 0; step < 25; ++step) {
      // This step's rings: a seeded permutation of the ranks cut into rings of 1..4 ranks.
      const auto perm = hetmesh::permutation(n, 77 + step);
      hetmesh::rng g(step);
      std::vector<std::vector<int>> rings;
      for (std::size_t i = 0; i < perm.size();) {
        const auto len = std::min<std::size_t>(1 + g.below(4), perm.size() - i);
        rings.emplace_back(perm.begin() + static_cast<std::ptrdiff_t>(i),
                           perm.begin() + static_cast<std::ptrdiff_t>(i + len));
        i += len;
      }
      for (const auto& ring : rings) {
        const auto pos = comm::ring_position(std::span<const int>(ring), c.rank());
        if (!pos) continue;
        const auto k = static_cast<int>(ring.size());
        std::vector<std::int64_t> send(3), recv(3);
        for (std::size_t i = 0; i < 3; ++i)
          send[i] =
              static_cast<std::int64_t>(hetmesh::key_hash({step, static_cast<std::uint64_t>(c.rank()), i}));
        comm::ring_exchange(c, std::span<const int>(ring), std::span<const std::int64_t>(send),
                            std::span<std::int64_t>(recv), 3);
        const int prev = ring[static_cast<std::size_t>((*pos + k - 1) % k)];
        for (std::size_t i = 0; i < 3; ++i)
          require(recv[i] == static_cast<std::int64_t>(
                                 hetmesh::key_hash({step, static_cast<std::uint64_t>(prev), i})),
                  "ring data from the predecessor");
      }
    }
    const int outside[] = {(world.rank() + 1) % n};
    std::vector<int> s(1), r(1);
    CHECK_THROWS_AS(
        comm::ring_exchange(c, std::span<const int>(outside), std::span<const int>(s), std::span<int>(r)),
        hetmesh::invalid_argument);
  });
}

TEST_CASE("ring_peer_counts counts distinct neighbours per rank") {
  const std::vector<std::vector<int>> rings{{0, 1, 2}, {3}, {4, 5}, {2, 0}};
  CHECK(comm::ring_peer_counts(std::span<const std::vector<int>>(rings), 7) ==
        std::vector<int>{2, 2, 2, 0, 1, 1, 0});
  const std::vector<std::vector<int>> bad{{0, 9}};
  CHECK_THROWS_AS((void)comm::ring_peer_counts(std::span<const std::vector<int>>(bad), 4),
                  hetmesh::invalid_argument);
  // Property over random ring sets: the relation is symmetric, so the counts sum to an even number,
  // and no rank has more than 2 * (rings it is in) peers or more than n - 1.
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    hetmesh::rng g(seed);
    const int n = 2 + static_cast<int>(g.below(10));
    std::vector<std::vector<int>> rs;
    std::vector<int> membership(static_cast<std::size_t>(n));
    for (int k = 0; k < 1 + static_cast<int>(g.below(5)); ++k) {
      auto perm = hetmesh::permutation(n, seed * 31 + static_cast<std::uint64_t>(k));
      perm.resize(1 + g.below(static_cast<std::uint64_t>(n)));
      rs.emplace_back(perm.begin(), perm.end());
      for (auto r : perm) ++membership[static_cast<std::size_t>(r)];
    }
    const auto counts = comm::ring_peer_counts(std::span<const std::vector<int>>(rs), n);
    CHECK(std::accumulate(counts.begin(), counts.end(), 0) % 2 == 0);
    for (int r = 0; r < n; ++r) {
      CHECK(counts[static_cast<std::size_t>(r)] <= 2 * membership[static_cast<std::size_t>(r)]);
      CHECK(counts[static_cast<std::size_t>(r)] <= n - 1);
    }
  }
}

namespace {

// A group of `n` ranks seen from one member: only what describe() and the argument checks read.
struct large_group {
  using is_communicator = void;
  static constexpr comm::memory_space memory = comm::memory_space::host;
  std::vector<int> members;
  int me = 0;
  [[nodiscard]] int rank() const { return me; }
  [[nodiscard]] int size() const { return static_cast<int>(members.size()); }
  [[nodiscard]] std::span<const int> ranks() const { return members; }
  void group_p2p(std::span<const comm::p2p_op>) { throw std::logic_error("large_group: no transport"); }
};
static_assert(comm::communicator<large_group>);

}  // namespace

TEST_CASE("describe prints a large group as its first 4 and last 2 ranks and its size") {
  large_group g{std::vector<int>(16384), 5};
  for (int r = 0; r < 16384; ++r) g.members[static_cast<std::size_t>(r)] = 2 * r + 1;
  CHECK(comm::describe(g) == "group [1,3,5,7,...,32765,32767] of 16384 rank 5/16384");
  try {  // an error message that names the group stays short
    comm::detail::check_tag(g, "send", -1);
    FAIL("check_tag accepted tag -1");
  } catch (const hetmesh::invalid_argument& e) {
    const std::string what = e.what();
    CHECK(what.find("group [1,3,5,7,...,32765,32767] of 16384 rank 5/16384") != std::string::npos);
    CHECK(what.size() < 200);
  }
  large_group seven{{0, 1, 2, 3, 4, 5, 6}, 6};
  CHECK(comm::describe(seven) == "group [0,1,2,3,...,5,6] of 7 rank 6/7");
  large_group six{{0, 2, 4, 6, 8, 10}, 1};  // up to 6 ranks print whole
  CHECK(comm::describe(six) == "group [0,2,4,6,8,10] rank 1/6");
  lb::run(3, [](lb::communicator& c) {
    require(comm::describe(c) == fmt::format("group [0,1,2] rank {}/3", c.rank()), "describe");
  });
}
