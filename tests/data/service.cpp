// SPDX-License-Identifier: Apache-2.0
// The data plane in processes of its own (run/data_service.hpp), on loopback threads: hosts load only their
// share and send it; trainers receive exactly the micro-batches an independent plan gives; a host and
// trainers out of step, and a host that never sends, are errors, not hangs.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include <hetmesh/comm/loopback.hpp>

#include "data/service_body.hpp"

using namespace hetmesh;
using namespace hetmesh::data;
using namespace std::chrono_literals;

namespace {
std::vector<std::string> run_service(const trainer_mesh& layout, int hosts, int steps) {
  std::vector<std::string> failures(static_cast<std::size_t>(layout.world() + hosts));
  comm::loopback::run(layout.world() + hosts, [&](comm::loopback::communicator& world) {
    failures[static_cast<std::size_t>(world.rank())] = test::service_body(world, layout, steps);
  });
  return failures;
}
}  // namespace

TEST_CASE("service: hosts serve their shares; every trainer gets the independently planned micro-batches") {
  struct shape {
    trainer_mesh layout;
    int hosts;
  };
  for (const auto& s : {shape{mesh::make_mesh("tp-cp-dp-pp", mesh::tp(2), mesh::dp(2)), 2},
                        shape{mesh::make_mesh("tp-cp-dp-pp", mesh::cp(2), mesh::dp(3), mesh::pp(3)), 2},
                        shape{mesh::make_mesh("dp-cp-pp", mesh::cp(2), mesh::dp(3), mesh::pp(2)), 3},
                        shape{mesh::make_mesh("tp-ep-dp", mesh::tp(2), mesh::ep(2), mesh::dp(2)), 3},
                        shape{mesh::make_mesh(mesh::dp(4)), 1}}) {
    // Not a structured binding: CAPTURE is a lambda, and clang++ 14 cannot capture bindings (P1091).
    const trainer_mesh& layout = s.layout;
    const int hosts = s.hosts;
    const std::string mesh_str = layout.str();
    CAPTURE(mesh_str);
    CAPTURE(hosts);
    for (const auto& f : run_service(layout, hosts, 4)) CHECK(f == "");
  }
}

TEST_CASE("service: the layout of trainers and hosts is checked") {
  const trainer_mesh t = mesh::make_mesh(mesh::tp(2), mesh::dp(2));
  CHECK_THROWS_AS((void)service_layout_of(t, 4), invalid_argument);  // no host
  CHECK_THROWS_AS((void)service_layout_of(t, 7), invalid_argument);  // 3 hosts for 2 indices
  const auto sl = service_layout_of(t, 6);
  CHECK(sl == service_layout{4, 2});
  CHECK(to_string(sl) == "service_layout(trainers=[0, 4), hosts=[4, 6))");
  CHECK(served_by(sl, t, 4) == std::vector<int>{0});
  CHECK(served_by(sl, t, 5) == std::vector<int>{1});
  test::temp_dir dir;
  test::service_corpus::write(dir);
  const auto cfg = test::service_corpus::config(t, dir.path);
  for (const auto& bad : {std::vector<int>{0, 0}, std::vector<int>{2}, std::vector<int>{-1}})
    CHECK_THROWS_WITH_AS(data_loader(cfg, {.serve_dp = bad}), doctest::Contains("serve_dp"),
                         invalid_argument);
}

TEST_CASE("service: a host out of step is a mismatch_error; a host that never sends is a timeout") {
  const trainer_mesh t{};
  test::temp_dir dir;
  test::service_corpus::write(dir);
  const auto cfg = test::service_corpus::config(t, dir.path);
  // The host serves step 0 while the trainer waits for step 1.
  CHECK_THROWS_AS(comm::loopback::run(2,
                                      [&](comm::loopback::communicator& world) {
                                        if (world.rank() == 1) {
                                          data_loader dl(cfg, {.workers = 0, .prefetch_steps = 0});
                                          run::serve_step(world, cfg, dl.next());
                                        } else {
                                          (void)run::receive_step(world, cfg, 1);
                                        }
                                      }),
                  mismatch_error);
  // The host stops before serving: the trainer's receive ends in the backend's timeout.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(comm::loopback::run(
                      2,
                      [&](comm::loopback::communicator& world) {
                        if (world.rank() == 0) (void)run::receive_step(world, cfg, 0);
                      },
                      300ms),
                  timeout_error);
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
}
