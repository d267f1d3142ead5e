// SPDX-License-Identifier: Apache-2.0
// The main of the MPI test binaries: MPI is initialised around doctest. Under mpirun (CTest's
// test_comm_mpi, test_data_mpi; HETMESH_TEST_UNDER_MPI=1) every rank runs the same test cases in the same
// order; run directly, it is a one-rank MPI job. Ranks other than 0 report only failures.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include <hetmesh/comm/mpi.hpp>

int main(int argc, char** argv) {
  hetmesh::comm::mpi::environment env(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context ctx(argc, argv);
  if (rank != 0) ctx.setOption("minimal", true);
  int rc = ctx.run();
  // Fault tests (HETMESH_TEST_FAULT) kill a rank: the survivors can neither agree over the world any more
  // nor finalize (MPI_Finalize waits for the communicator creation the dead rank never joins), so each
  // exits with its own status at once.
  if (std::getenv("HETMESH_TEST_FAULT") != nullptr) {
    std::fflush(nullptr);
    std::_Exit(rc);
  }
  // Every rank exits with the worst status, so mpirun reports a failure seen on any rank.
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
