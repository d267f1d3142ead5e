// SPDX-License-Identifier: Apache-2.0
// The data service and delivery under mpirun: the same bodies as on loopback threads, each rank a
// process. With 6 ranks: 4 trainers (tp = 2, dp = 2) and 2 data-plane hosts. CTest runs it only under
// mpirun -np 6 (test_data_mpi_mpi); run with another number of ranks, each case fails saying so.
#include <doctest/doctest.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <hetmesh/comm/mpi.hpp>
#include <hetmesh/data/checkpoint.hpp>

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
    std::optional<loaded_batch> b;
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

TEST_CASE(
    "service fault: a host killed; its trainers get a clear error, and resuming gives the same stream") {
  // Runs only as test_data_mpi_fault (mpirun --enable-recovery -np 6, HETMESH_TEST_FAULT=1): host 5 dies
  // at step 2. Before it, host 4 sends every trainer the checkpoint (the planner state before step 2).
  if (std::getenv("HETMESH_TEST_FAULT") == nullptr) return;
  auto world = comm::mpi::communicator::world({.timeout = std::chrono::seconds(2), .verify = false});
  REQUIRE_MESSAGE(world.size() == 6, "needs exactly 6 ranks (mpirun -np 6)");
  const trainer_mesh layout = mesh::make_mesh(mesh::tp(2), mesh::dp(2));
  const auto sl = service_layout_of(layout, world.size());
  const int me = world.rank(), victim = 5, keeper = 4, fail_step = 2, steps = 5;
  constexpr int ckpt_tag = 0x5e0;
  if (sl.is_host(me)) {
    test::temp_dir dir;
    test::service_corpus::write(dir);
    const auto cfg = test::service_corpus::config(layout, dir.path);
    data_loader dl(cfg, {.workers = 0, .prefetch_steps = 0, .serve_dp = served_by(sl, layout, me)});
    for (int step = 0; step <= fail_step; ++step) {
      if (step == fail_step && me == keeper) {
        const std::string text = checkpoint_to_json(cfg, dl.state()).dump();
        std::vector<std::uint8_t> bytes(text.begin(), text.end());
        for (int t = 0; t < sl.trainers; ++t) {
          std::int64_t n = static_cast<std::int64_t>(bytes.size());
          comm::send(world, std::span<const std::int64_t>(&n, 1), t, ckpt_tag);
          comm::send(world, std::span<const std::uint8_t>(bytes), t, ckpt_tag);
        }
      }
      if (step == fail_step && me == victim) std::raise(SIGKILL);
      run::serve_step(world, cfg, dl.next());
    }
    return;
  }
  // Trainers: steps before the failure arrive; at fail_step the dp index served by the dead host fails.
  const auto cfg = test::service_corpus::config(layout, "/nonexistent");
  test::generator_metadata meta{&cfg};
  std::vector<batch_plan> stream;  // the uninterrupted stream, planned from the generator
  auto st = initial_state(cfg);
  for (int step = 0; step < steps; ++step) {
    auto planned = plan_step(cfg, st, meta);
    st = planned.next;
    stream.push_back(planned.plan);
  }
  const int dp = layout.dp_of(me);
  std::vector<std::uint8_t> bytes;
  for (int step = 0; step <= fail_step; ++step) {
    if (step == fail_step) {  // the keeper sends the checkpoint between serving steps 1 and 2
      std::int64_t n = 0;
      comm::recv(world, std::span<std::int64_t>(&n, 1), keeper, ckpt_tag);
      bytes.resize(static_cast<std::size_t>(n));
      comm::recv(world, std::span<std::uint8_t>(bytes), keeper, ckpt_tag);
    }
    const bool dead_host = sl.host_of(dp) == victim;
    if (step == fail_step && dead_host) {
      const auto start = std::chrono::steady_clock::now();
      try {
        (void)run::receive_step(world, cfg, step);
        FAIL("step " << step << " arrived without host " << victim);
      } catch (const hetmesh::timeout_error& e) {
        const std::string what = e.what();
        CHECK_MESSAGE(what.find("timed out after 2000 ms") != std::string::npos, what);
        CHECK_MESSAGE(what.find(hetmesh::format("rank {}/6", me)) != std::string::npos, what);
      }
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(8));
    } else {
      const auto got = run::receive_step(world, cfg, step);
      CHECK(got == construct(stream[static_cast<std::size_t>(step)],
                             test::generator_samples(stream[static_cast<std::size_t>(step)]), dp,
                             cfg.micro_batches));
    }
  }
  // Resume from the checkpoint the surviving host sent: a fresh loader over its own copy of the corpus
  // continues with exactly the planned stream from fail_step on.
  test::temp_dir dir;
  test::service_corpus::write(dir);
  const auto local = test::service_corpus::config(layout, dir.path);
  data_loader resumed(local, {.workers = 1, .prefetch_steps = 1, .serve_dp = {dp}});
  resumed.restore(
      checkpoint_from_json(local, nlohmann::json::parse(std::string(bytes.begin(), bytes.end()))));
  for (int step = fail_step; step < steps; ++step) {
    const auto b = resumed.next();
    CHECK(b.plan == stream[static_cast<std::size_t>(step)]);
    CHECK(construct(b.plan, b.samples, dp, local.micro_batches) ==
          construct(stream[static_cast<std::size_t>(step)],
                    test::generator_samples(stream[static_cast<std::size_t>(step)]), dp,
                    local.micro_batches));
  }
}
