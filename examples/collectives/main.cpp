// SPDX-License-Identifier: Apache-2.0
// example_collectives: one program, two engines. Run it directly and its ranks are 4 threads
// (loopback); run it under `mpirun -np N` and its ranks are MPI processes. The same templated step
// runs on either: average "gradients", gather every rank's variable-length sample list, reshard
// tokens with all_to_all_v, and pass a block around a ring of ranks chosen at run time.
//
//   ./example_collectives [ranks]         # loopback, default 4 threads
//   mpirun -np 4 ./example_collectives    # MPI (when built with hetmesh::mpi)
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/comm/ring.hpp>
#if HETMESH_HAS_MPI
#include <hetmesh/comm/mpi.hpp>
#endif
#include <hetmesh_tools/args.hpp>

namespace comm = hetmesh::comm;

template <comm::communicator C>
void step(C& c, const char* engine) {
  const int me = c.rank(), n = c.size();

  // 1. Data-parallel gradient averaging.
  std::vector<double> grad(6);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = me + 0.5 * static_cast<double>(i);
  comm::all_reduce(c, std::span<double>(grad), comm::reduce_op::avg);

  // 2. Each rank holds a different number of samples; everyone learns everyone's list.
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(me + 1));
  std::iota(lengths.begin(), lengths.end(), std::int64_t{100 * me});
  const auto all = comm::all_gather_vectors(c, std::span<const std::int64_t>(lengths));

  // 3. Reshard: rank i sends j+1 tokens to rank j (encoder outputs to the LLM ranks that own them).
  std::vector<std::int64_t> send_counts(static_cast<std::size_t>(n)),
      recv_counts(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j)
    send_counts[static_cast<std::size_t>(j)] = j + 1, recv_counts[static_cast<std::size_t>(j)] = me + 1;
  std::vector<std::int64_t> send_displs(static_cast<std::size_t>(n)),
      recv_displs(static_cast<std::size_t>(n));
  std::exclusive_scan(send_counts.begin(), send_counts.end(), send_displs.begin(), std::int64_t{0});
  std::exclusive_scan(recv_counts.begin(), recv_counts.end(), recv_displs.begin(), std::int64_t{0});
  std::vector<int> tokens(static_cast<std::size_t>(n * (n + 1) / 2), me),
      got(static_cast<std::size_t>(n * (me + 1)));
  comm::all_to_all_v(c, std::span<const int>(tokens), std::span<const std::int64_t>(send_counts),
                     std::span<const std::int64_t>(send_displs), std::span<int>(got),
                     std::span<const std::int64_t>(recv_counts), std::span<const std::int64_t>(recv_displs));

  // 4. A dynamic ring (hybrid data parallelism): the even ranks, in reverse, on the parent communicator.
  std::vector<int> ring;
  for (int r = n - 1; r >= 0; --r)
    if (r % 2 == 0) ring.push_back(r);
  std::vector<int> block{me}, from(1, -1);
  if (me % 2 == 0)
    comm::ring_exchange(c, std::span<const int>(ring), std::span<const int>(block), std::span<int>(from));

  comm::barrier(c);
  if (me == 0) {
    fmt::print("[{}] {} ranks\n", engine, n);
    fmt::print("  averaged gradient: {}\n", grad);
    fmt::print("  gathered sample lengths: {}\n", all);
    fmt::print("  rank 0 received tokens: {}\n", got);
    fmt::print("  ring [{}]: rank 0 got the block of rank {}\n", fmt::join(ring, ","), from[0]);
  }
}

int main(int argc, char** argv) {
  int n = 4;  // loopback ranks
  if (!hetmesh::tools::parse_command_line(argc, argv, "example_collectives",
                                          {{"RANKS", "", "loopback ranks (threads)", &n, 1, 1024}},
                                          "usage: example_collectives [RANKS]"))
    return 2;
  const bool under_mpirun =
      std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
  try {
    if (under_mpirun) {
#if HETMESH_HAS_MPI
      comm::mpi::environment env(&argc, &argv);
      auto world = comm::mpi::communicator::world();
      step(world, "mpi");
      return 0;
#else
      std::fprintf(stderr, "example_collectives was built without MPI; running on loopback\n");
#endif
    }
    comm::loopback::run(n, [](comm::loopback::communicator& c) { step(c, "loopback"); });
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_collectives: %s\n", e.what());
    return 1;
  }
}
