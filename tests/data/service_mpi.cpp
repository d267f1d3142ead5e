// SPDX-License-Identifier: Apache-2.0
// The data service and delivery under mpirun: the same bodies as on loopback threads, each rank a
// process. With 6 ranks: 4 trainers (tp = 2, dp = 2) and 2 data-plane hosts. CTest runs it only under
// mpirun -np 6 (test_data_mpi_mpi); run with another number of ranks, each case fails saying so.
#include <doctest/doctest.h>

#include <optional>

#include <hetmesh/comm/mpi.hpp>

#include "data/routes_body.hpp"
#include "data/service_body.hpp"

using namespace hetmesh;
using namespace hetmesh::data;

TEST_CASE("service under MPI: hosts in their own processes serve the trainers") {
  auto world = comm::mpi::communicator::world({.timeout = std::chrono::seconds(60), .verify = true});
  REQUIRE_MESSAGE(world.size() == 6, "needs exactly 6 ranks (mpirun -np 6)");
  const trainer_mesh layout = mesh::make_mesh(mesh::tp(2), mesh::dp(2));
  CHECK(test::service_body(world, layout, 5) == "");
}

TEST_CASE("delivery under MPI: loading ranks broadcast to their tensor group") {
  auto world = comm::mpi::communicator::world({.timeout = std::chrono::seconds(60), .verify = true});
  REQUIRE_MESSAGE(world.size() == 6, "needs exactly 6 ranks (mpirun -np 6)");
  // All 6 ranks are trainers here: tp = 3, dp = 2. Every loading rank reads its own copy of the corpus
  // with serve_dp = its index; the others receive by broadcast and check against the generator.
  const trainer_mesh layout = mesh::make_mesh(mesh::tp(3), mesh::dp(2));
  const int me = world.rank();
  const int dp = (me / 3) % 2;
  const bool loads = me % 3 == 0;
  test::temp_dir dir;
  if (loads) test::service_corpus::write(dir);
  const auto cfg = test::service_corpus::config(layout, dir.path);
  test::generator_metadata meta{&cfg};
  auto st = initial_state(cfg);
  std::optional<data_loader> dl;
  if (loads) dl.emplace(cfg, loader_options{.workers = 1, .prefetch_steps = 1, .serve_dp = {dp}});
  for (int step = 0; step < 4; ++step) {
    std::optional<step_batch> b;
    if (loads) b = dl->next();
    const auto got = run::deliver(world, cfg, b ? &*b : nullptr);
    auto planned = plan_step(cfg, st, meta);
    st = planned.next;
    CHECK(got == construct(planned.plan, test::generator_samples(planned.plan), dp, cfg.micro_batches));
  }
}

TEST_CASE("delivery by plan under MPI: 4 trainers and 2 hosts of 5 sources") {
  auto world = comm::mpi::communicator::world({.timeout = std::chrono::seconds(60), .verify = true});
  REQUIRE_MESSAGE(world.size() == 6, "needs exactly 6 ranks (mpirun -np 6)");
  for (auto c : {routestest::routed_case::hdp, routestest::routed_case::joint_pp4,
                 routestest::routed_case::searched, routestest::routed_case::encoder_pool})
    for (std::uint64_t seed : {11u, 12u}) {
      const int kind = static_cast<int>(c);
      CAPTURE(kind);
      CAPTURE(seed);
      CHECK(routestest::routed_body(world, c, 4, seed) == "");
    }
}
