// SPDX-License-Identifier: Apache-2.0
// Delivery by plan on loopback threads (tests/data/routes_body.hpp): an HDP plan, a joint pipeline at pp = 4
// and static CP over a searched mesh, 8 trainers and 3 data-plane hosts over 5 sources, seeded random steps;
// and the pure pieces (rank maps, the host-per-source-group layout, the share a trainer runs on).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <hetmesh/comm/loopback.hpp>

#include "data/routes_body.hpp"

using namespace hetmesh;

namespace {
std::vector<std::string> routes_run(routestest::routed_case c, int trainers, int hosts, std::uint64_t seed) {
  std::vector<std::string> failures(static_cast<std::size_t>(trainers + hosts));
  comm::loopback::run(trainers + hosts, [&](comm::loopback::communicator& world) {
    failures[static_cast<std::size_t>(world.rank())] = routestest::routed_body(world, c, trainers, seed);
  });
  return failures;
}
}  // namespace

TEST_CASE("routes: every part reaches exactly the ranks that read it, with the source's bytes") {
  for (auto c : {routestest::routed_case::hdp, routestest::routed_case::joint_pp4,
                 routestest::routed_case::searched, routestest::routed_case::encoder_pool})
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      const int kind = static_cast<int>(c);
      CAPTURE(kind);
      CAPTURE(seed);
      for (const auto& f : routes_run(c, 8, 3, seed)) CHECK(f == "");
    }
}

TEST_CASE("routes: rank maps, hosts of sources, plan queries") {
  const auto sys = train::system_ranks(2, 3);
  CHECK(sys.trainers() == 6);
  CHECK(sys.at(2, 1) == std::vector<int>{5});
  // tp fastest then dp, cp, pp: pool rank = cp + 2 dp, tp peers together.
  const auto m =
      train::mesh_ranks(mesh::make_mesh("tp-dp-cp-pp", mesh::tp(2), mesh::dp(2), mesh::cp(2), mesh::pp(2)));
  CHECK(m.pool == 4);
  CHECK(m.pp == 2);
  CHECK(m.at(0, 0) == std::vector<int>{0, 1});
  CHECK(m.at(0, 1) == std::vector<int>{4, 5});  // cp = 1
  CHECK(m.at(0, 2) == std::vector<int>{2, 3});  // dp = 1
  CHECK(m.at(1, 3) == std::vector<int>{14, 15});
  CHECK_THROWS_AS((void)train::system_ranks(0, 1), invalid_argument);

  const data::source_hosts sh{.trainers = 4, .hosts = 2, .sources = 5};
  CHECK(sh.sources_of(4) == std::vector<int>{0, 2, 4});
  CHECK(sh.sources_of(5) == std::vector<int>{1, 3});
  CHECK(sh.host_of_sample(seq::make_sample_id(3, 7, 11)) == 5);
  CHECK_THROWS_AS((void)sh.host_of_sample(seq::make_sample_id(5, 0, 0)), invalid_argument);
  CHECK_THROWS_AS((data::source_hosts{.trainers = 4, .hosts = 6, .sources = 5}.validate()), invalid_argument);
  CHECK(fmt::format("{}", sh) == "source_hosts(trainers=[0, 4), hosts=[4, 6), sources=5)");

  data::route_plan p{3, {{7, data::text_part, {0, 2}}, {7, 0, {1}}, {9, data::text_part, {2}}}};
  CHECK(p.parts_of(2) == std::vector<std::size_t>{0, 2});
  CHECK(p.ranks_of(7) == std::vector<int>{0, 1, 2});
  CHECK(fmt::format("{}", p) == "route_plan{trainers=3, parts=3, copies=4}");
  CHECK(train::document_targets(10, std::vector<model::encoder_item>{{0, 1, 0, 3}, {0, 2, 6, 4}}) ==
        9 - 2 - 4);
}

TEST_CASE("routes: a share that lacks a document its rank reads is an error") {
  std::vector<seq::seq_desc> docs{{1, 12}, {2, 30}};
  const auto plan = train::plan_step(seq::cp_zigzag{.cp = 2, .pad = true}, docs, 2);
  train::rank_share share;
  share.batch.documents.push_back({1, std::vector<std::int64_t>(12, 5), {}, {}});
  const int reader = plan.per_rank[0].empty() ? 1 : 0;
  const auto needs = train::documents_of(plan, reader);
  REQUIRE(!needs.empty());
  if (needs.size() == 1 && needs[0] == 1)
    CHECK_NOTHROW((void)train::detail::sparse_step(plan, share, reader));
  share.batch.documents.clear();
  CHECK_THROWS_AS((void)train::detail::sparse_step(plan, share, reader), invalid_argument);
}
