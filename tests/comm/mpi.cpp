// SPDX-License-Identifier: Apache-2.0
// MPI backend: the same conformance body as loopback, on MPI_COMM_WORLD and sub-groups, in polling
// and blocking modes; then the failure modes (a missing rank, mismatched sizes), each ending in the
// documented error. Runs under `mpirun -np 4` through CTest, or as a one-rank job when run directly.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <vector>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/group_cache.hpp>
#include <hetmesh/comm/mpi.hpp>

#include "conformance.hpp"

namespace comm = hetmesh::comm;
namespace mpi = hetmesh::comm::mpi;
using namespace std::chrono_literals;

namespace {
mpi::options checked_options() {
  mpi::options o;
  o.timeout = 30s;
  o.verify = true;
  return o;
}
}  // namespace

TEST_CASE("mpi: the conformance suite passes on the world and on sub-groups") {
  auto world = mpi::communicator::world(checked_options());
  CHECK(world.ranks()[static_cast<std::size_t>(world.rank())] == world.rank());
  CHECK(comm::testing::conform_with_groups(world) > 0);
}

TEST_CASE("mpi: the conformance suite passes in blocking mode, on a duplicate") {
  auto world = mpi::communicator::world();
  auto dup = world.dup();
  dup.set_options({.timeout = 30s, .verify = false, .blocking = true});
  comm::testing::conformance_options opt;
  opt.sizes = {0, 1, 7, 1000};
  CHECK(comm::testing::conform(dup, opt) > 0);
}

TEST_CASE("mpi: group_cache and split create communicators whose ranks() are world ranks") {
  auto world = mpi::communicator::world(checked_options());
  comm::group_cache<mpi::communicator> cache(world);
  std::vector<int> odd_even;
  for (int r = 0; r < world.size(); ++r)
    if (r % 2 == world.rank() % 2) odd_even.push_back(r);
  auto& g = cache.get(std::span<const int>(odd_even));
  CHECK(&g == &cache.get(std::span<const int>(odd_even)));
  CHECK(std::equal(g.ranks().begin(), g.ranks().end(), odd_even.begin(), odd_even.end()));
  auto s = comm::split(world, 0, -world.rank());
  CHECK(s.ranks()[0] == world.size() - 1);
  std::vector<int> x{world.rank()};
  comm::all_reduce(s, std::span<int>(x), comm::reduce_op::sum);
  CHECK(x[0] == world.size() * (world.size() - 1) / 2);
}

TEST_CASE("mpi: a missing rank makes the others raise timeout_error, and the communicator is then unusable") {
  auto world = mpi::communicator::world();
  if (world.size() < 2) return;
  auto dup = world.dup();
  dup.set_options({.timeout = 300ms, .verify = false, .blocking = false});
  const bool missing = world.rank() == world.size() - 1;
  const auto start = std::chrono::steady_clock::now();
  if (!missing) {
    CHECK_THROWS_AS(comm::barrier(dup), hetmesh::timeout_error);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    CHECK(dup.broken());
    CHECK_THROWS_AS(comm::barrier(dup), hetmesh::backend_error);
  }
  comm::barrier(world);
  // The late rank arrives now, so the abandoned barrier completes and the duplicate can be freed.
  if (missing) comm::barrier(dup);
}

TEST_CASE("mpi: mismatched sizes raise mismatch_error on every rank") {
  auto world = mpi::communicator::world(checked_options());
  std::vector<int> x(world.rank() == 0 ? 5 : 4, 1);
  if (world.size() > 1)
    CHECK_THROWS_AS(comm::all_reduce(world, std::span<int>(x), comm::reduce_op::sum),
                    hetmesh::mismatch_error);
  std::vector<int> y(4, world.rank());
  const int root = world.rank() == 0 && world.size() > 1 ? 1 : 0;
  if (world.size() > 1)
    CHECK_THROWS_AS(comm::broadcast(world, std::span<int>(y), root), hetmesh::mismatch_error);
  comm::barrier(world);  // still in step after the checks
}

TEST_CASE("mpi: a receive of the wrong size raises mismatch_error") {
  auto world = mpi::communicator::world(checked_options());
  if (world.size() < 2) return;
  for (const int sent : {6, 3}) {
    if (world.rank() == 0) {
      std::vector<int> x(static_cast<std::size_t>(sent), 7);
      comm::send(world, std::span<const int>(x), 1, 9);
    } else if (world.rank() == 1) {
      std::vector<int> x(4);
      CHECK_THROWS_AS(comm::recv(world, std::span<int>(x), 0, 9), hetmesh::mismatch_error);
    }
  }
  comm::barrier(world);
}

TEST_CASE("mpi: bad local input is rejected before anything is communicated") {
  auto world = mpi::communicator::world(checked_options());
  std::vector<int> a(4), b(4 * static_cast<std::size_t>(world.size()) + 1);
  CHECK_THROWS_AS(comm::send(world, std::span<const int>(a), world.size()), hetmesh::invalid_argument);
  CHECK_THROWS_AS(comm::all_gather(world, std::span<const int>(a), std::span<int>(b)),
                  hetmesh::invalid_argument);
  CHECK_THROWS_AS((void)mpi::communicator::borrow(MPI_COMM_NULL), hetmesh::invalid_argument);
  comm::barrier(world);
}
