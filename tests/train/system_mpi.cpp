// SPDX-License-Identifier: Apache-2.0
// train::system under mpirun -np 8: the same parity bodies as the loopback cases of test_train (pp = 1) and
// test_train_pipeline (pipelines with encoders), each rank a process. CTest runs it only under mpirun -np 8
// (test_train_mpi_mpi); the device path's cases too, over comm::emulated_device on the MPI processes.
#include <doctest/doctest.h>

#include <hetmesh/comm/mpi.hpp>

#include "train/cases.hpp"
#include "train/device_cases.hpp"
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
