// SPDX-License-Identifier: Apache-2.0
// train::system's device path on 8 loopback ranks over comm::emulated_device (device_cases.hpp), bit for bit
// against the host path; the same cases run under mpirun -np 8 in test_train_mpi.
#include <doctest/doctest.h>

#include "support/rank0.hpp"
#include "train/device_cases.hpp"

using namespace traintest;

TEST_CASE("train::system's device path equals the host path bit for bit (emulated device, 8 ranks)") {
  device_cases([](auto body) { return testsupport::rank0_of(8, body); });
}
