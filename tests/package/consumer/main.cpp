// A user program: proves the headers, the targets and the components are usable from outside.
#include <hetmesh/hetmesh.hpp>

#include <cstdio>
#include <vector>

#if HETMESH_HAS_MPI
#  include <mpi.h>
#endif

#ifdef CONSUMER_WITH_NCCL
int consumer_nccl_version();
#endif

int main() {
  const std::vector<int> ranks{0, 1, 2, 3};
  if (hetmesh::plan_hash(ranks) == hetmesh::plan_hash(std::vector<int>{3, 2, 1, 0})) return 1;
  try {
    hetmesh::throw_error<hetmesh::invalid_argument>("expected {}", 1);
  } catch (const hetmesh::error&) {
  }
#if HETMESH_HAS_MPI
  int mpi_version = 0, mpi_subversion = 0;
  MPI_Get_version(&mpi_version, &mpi_subversion);
  std::printf("consumer: MPI %d.%d\n", mpi_version, mpi_subversion);
#endif
#ifdef CONSUMER_WITH_NCCL
  std::printf("consumer: NCCL %d\n", consumer_nccl_version());
  if (consumer_nccl_version() <= 0) return 1;
#endif
  std::printf("consumer: ok\n");
  return 0;
}
