// SPDX-License-Identifier: Apache-2.0
// Ring attention under mpirun -np 8: the bodies of test_run's ring attention cases (zigzag CP, THD,
// HDP rings on one parent communicator), each rank a process, and the device path over MPI
// (comm::emulated_device<mpi::communicator>, model::emulated_device_memory) bit for bit against the host
// path. CTest runs it only under mpirun -np 8 (test_run_mpi_mpi); with another number of ranks each case
// fails saying so.
#include <doctest/doctest.h>

#include <hetmesh/comm/mpi.hpp>

#include "run/ring_attention_body.hpp"

using namespace hetmesh;
using namespace ringtest;

namespace {

comm::mpi::communicator world() {
  return comm::mpi::communicator::world({.timeout = std::chrono::seconds(60), .verify = true});
}

}  // namespace

TEST_CASE("MPI: ring attention over a zigzag CP ring of 8 equals full causal attention") {
  auto w = world();
  REQUIRE_MESSAGE(w.size() == 8, "needs exactly 8 ranks (mpirun -np 8)");
  check_verdict(zigzag_body<double>(w), 1e-10, 96, "zigzag cp=8 double");
  check_verdict(zigzag_body<float>(w), 1e-5, 96, "zigzag cp=8 float");
}

TEST_CASE("MPI: ring attention over THD-packed documents equals full causal attention") {
  auto w = world();
  REQUIRE_MESSAGE(w.size() == 8, "needs exactly 8 ranks (mpirun -np 8)");
  check_verdict(thd_body<double>(w), 1e-10, 74, "thd cp=4 double");
  check_verdict(thd_body<float>(w), 1e-5, 74, "thd cp=4 float");
}

TEST_CASE("MPI: ring attention over HDP rings on one parent communicator equals full causal attention") {
  auto w = world();
  REQUIRE_MESSAGE(w.size() == 8, "needs exactly 8 ranks (mpirun -np 8)");
  for (auto placement : {planner::waves, planner::least_loaded, planner::bytescale})
    for (std::uint64_t seed : {5u, 6u}) {
      const auto h = make_hdp_case(seed, placement);
      std::int64_t tokens = 0;
      for (const auto& s : h.seqs) tokens += s.length;
      check_verdict(hdp_body<double>(w, seed, placement), 1e-10, tokens, "hdp double");
      check_verdict(hdp_body<float>(w, seed, placement), 1e-5, tokens, "hdp float");
    }
}

TEST_CASE("MPI: ring attention with communication overlapped with compute gives the same results") {
  auto w = world();
  REQUIRE_MESSAGE(w.size() == 8, "needs exactly 8 ranks (mpirun -np 8)");
  CHECK(zigzag_body<double>(w, false).same_as(zigzag_body<double>(w, true)));
  CHECK(hdp_body<double>(w, 6, planner::bytescale, false)
            .same_as(hdp_body<double>(w, 6, planner::bytescale, true)));
}

TEST_CASE("MPI: ring attention on emulated device memory equals the host path bit for bit") {
  auto w = world();
  REQUIRE_MESSAGE(w.size() == 8, "needs exactly 8 ranks (mpirun -np 8)");
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    const auto z = zigzag_body<double>(w, overlap, true);
    check_verdict(z, 1e-10, 96, "device zigzag cp=8 double");
    check_device(z, 8, "device zigzag cp=8 double");
    const auto h = make_hdp_case(6, planner::bytescale);
    std::int64_t tokens = 0;
    for (const auto& s : h.seqs) tokens += s.length;
    const auto d = hdp_body<float>(w, 6, planner::bytescale, overlap, true);
    check_verdict(d, 1e-5, tokens, "device hdp float");
    check_device(d, 8, "device hdp float");
  }
}
