// A user program: proves the headers, the targets and the components are usable from outside the
// source tree, by using a mesh, the loopback backend, a pipeline schedule and a planner.
#include <hetmesh/hetmesh.hpp>

#include <chrono>
#include <cstdio>
#include <span>
#include <vector>

#if HETMESH_HAS_MPI
#include <mpi.h>
#endif

#ifdef CONSUMER_WITH_NCCL
int consumer_nccl_version();
#endif

int main() {
  using namespace hetmesh::literals;
  namespace hm = hetmesh::mesh;
  namespace comm = hetmesh::comm;

  const auto mesh = hm::make_mesh(hm::tp(2_c), hm::dp(2));
  if (mesh.group_of(1, hm::dp) != std::vector<int>{1, 3}) return 1;
  std::printf("consumer: mesh %s\n", hetmesh::to_string(mesh).c_str());

  std::vector<int> sums(4, 0);
  comm::loopback::run(
      4,
      [&](comm::loopback::communicator& c) {
        std::vector<int> v{c.rank() + 1};
        comm::all_reduce(c, std::span<int>(v), comm::reduce_op::sum);
        sums[static_cast<std::size_t>(c.rank())] = v[0];
      },
      std::chrono::seconds(10));
  for (int s : sums)
    if (s != 10) return 2;

  const auto schedule = hetmesh::pipeline::one_f_one_b{}.generate(2, 4);
  if (schedule.num_ranks != 2) return 3;

  const std::vector<std::int64_t> costs{5, 4, 3, 3, 2, 1};
  const auto a = hetmesh::balance::lpt(costs, 2);
  if (a.bin_of.size() != costs.size()) return 4;

#if HETMESH_HAS_MPI
  int mpi_version = 0, mpi_subversion = 0;
  MPI_Get_version(&mpi_version, &mpi_subversion);
  std::printf("consumer: MPI %d.%d\n", mpi_version, mpi_subversion);
#endif
#ifdef CONSUMER_WITH_NCCL
  std::printf("consumer: NCCL %d\n", consumer_nccl_version());
  if (consumer_nccl_version() <= 0) return 5;
#endif
  std::printf("consumer: ok\n");
  return 0;
}
