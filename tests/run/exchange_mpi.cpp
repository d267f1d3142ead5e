// SPDX-License-Identifier: Apache-2.0
// The Ulysses and token-dispatch bodies of exchange_bodies.hpp on MPI ranks: under `mpirun -np 4`
// (CTest test_run_exchange_mpi_mpi) every group size from 1 to the world's runs on the world's first
// ranks; run directly it is a one-rank job.
#include <doctest/doctest.h>

#include <vector>

#include <hetmesh/comm/mpi.hpp>

#include "exchange_bodies.hpp"

namespace comm = hetmesh::comm;
namespace mpi = hetmesh::comm::mpi;
namespace seq = hetmesh::seq;

namespace {
/// Runs body(group) on the first n ranks of the world (the others skip it).
template <class F>
void on_first(mpi::communicator& world, int n, F&& body) {
  if (world.rank() >= n) return;
  std::vector<int> members(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) members[static_cast<std::size_t>(r)] = r;
  auto group = world.subgroup(std::span<const int>(members));
  body(group);
}
}  // namespace

TEST_CASE("mpi: the ulysses exchange moves heads exactly and equals full attention") {
  auto world = mpi::communicator::world();
  const seq::ulysses_policy pols[] = {{.degree = 1, .heads = 2, .kv_heads = 1, .head_dim = 3},
                                      {.degree = 2, .heads = 4, .kv_heads = 4, .head_dim = 3},
                                      {.degree = 4, .heads = 8, .kv_heads = 2, .head_dim = 2},
                                      {.degree = 4, .heads = 4, .kv_heads = 1, .head_dim = 5}};
  std::uint64_t seed = 1;
  for (const auto& pol : pols) {
    if (pol.degree > world.size()) continue;
    const auto tokens = runtest::uneven_tokens(pol.degree, 13, seed);
    const std::vector<std::int64_t> docs{9, 14, 3};
    const auto attn_tokens = runtest::uneven_tokens(pol.degree, 26, seed + 100);
    on_first(world, pol.degree, [&](mpi::communicator& c) {
      runtest::ulysses_movement(c, pol, tokens, seed);
      runtest::ulysses_attention(c, pol, docs, attn_tokens, seed);
    });
    ++seed;
  }
}

TEST_CASE("mpi: token dispatch is exactly once with an exact inverse over random plans") {
  auto world = mpi::communicator::world();
  for (int n = 1; n <= world.size(); ++n)
    for (int kind = 0; kind < 3; ++kind)
      for (std::uint64_t seed = 0; seed < 6; ++seed)
        on_first(world, n, [&](mpi::communicator& c) { runtest::dispatch_property(c, kind, seed); });
}
