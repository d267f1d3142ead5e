// SPDX-License-Identifier: Apache-2.0
// train::system under mpirun -np 8: the same parity bodies as the loopback cases of test_train (pp = 1) and
// test_train_pipeline (pipelines with encoders), each rank a process. CTest runs it only under mpirun -np 8
// (test_train_mpi_mpi); the device path's cases too, over comm::emulated_device on the MPI processes; and a
// 5-D layout (tp 2 x pp 2 x ZeRO-1 x HDP) whose losses equal the loopback run's bit for bit.
#include <doctest/doctest.h>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/comm/mpi.hpp>

#include "support/rank0.hpp"
#include "train/cases.hpp"
#include "train/device_cases.hpp"
#include "train/five_d_body.hpp"
#include "train/pipeline_cases.hpp"

using namespace hetmesh;
using namespace traintest;

TEST_CASE("MPI: train::system one step's gradients equal a single-rank run's") {
  auto w = comm::mpi::communicator::world({.timeout = std::chrono::seconds(60), .verify = true});
  REQUIRE_MESSAGE(w.size() == 8, "needs exactly 8 ranks (mpirun -np 8)");
  parity_cases([&](auto body) { return body(w); });
}

TEST_CASE("MPI: train::system pipelined multimodal steps' gradients equal a single-rank run's") {
  auto w = comm::mpi::communicator::world({.timeout = std::chrono::seconds(60), .verify = true});
  REQUIRE_MESSAGE(w.size() == 8, "needs exactly 8 ranks (mpirun -np 8)");
  pipeline_cases([&](auto body) { return body(w); });
}

TEST_CASE("MPI: long-short SP with encoders that attend inside items keeps the gradients") {
  auto w = comm::mpi::communicator::world({.timeout = std::chrono::seconds(60), .verify = true});
  REQUIRE_MESSAGE(w.size() == 8, "needs exactly 8 ranks (mpirun -np 8)");
  long_short_cases([&](auto body) { return body(w); });
}

TEST_CASE("MPI: train::system's device path over the emulated device equals the host path bit for bit") {
  auto w = comm::mpi::communicator::world({.timeout = std::chrono::seconds(60), .verify = true});
  REQUIRE_MESSAGE(w.size() == 8, "needs exactly 8 ranks (mpirun -np 8)");
  device_cases([&](auto body) { return body(w); });
}

TEST_CASE("MPI: tp 2 x pp 2 x ZeRO-1 x HDP gives the loopback losses bit for bit") {
  auto w = comm::mpi::communicator::world({.timeout = std::chrono::seconds(60), .verify = true});
  REQUIRE_MESSAGE(w.size() == 8, "needs exactly 8 ranks (mpirun -np 8)");
  const five_d_layout layout{.pp = 2, .mesh = {.tp = 2}, .zero = true};
  const seq::hdp<seq::no_offload> hdp{.capacity = 12};
  const auto got = five_d_losses(w, hdp, layout);
  if (w.rank() == 0) {  // the same steps on 8 loopback threads of this process
    const auto want = testsupport::rank0_of(
        8, [&](comm::loopback::communicator& c) { return five_d_losses(c, hdp, layout); });
    CHECK(got == want);
    CHECK(got.size() == 5);
  }
}
