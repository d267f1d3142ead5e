// SPDX-License-Identifier: Apache-2.0
// run::ulysses_to_heads / ulysses_to_sequence on loopback ranks: exact data movement and its inverse
// for query- and key/value-shaped tensors (heads split, KV heads split, KV heads replicated under GQA),
// and Ulysses around a single-rank attention equal to full causal attention, forward and backward.
// The same bodies run under mpirun in exchange_mpi.cpp.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <hetmesh/comm/loopback.hpp>

#include "exchange_bodies.hpp"

using namespace hetmesh;

namespace {
struct ulysses_case {
  seq::ulysses_policy policy;
  std::int64_t total;
};
const ulysses_case cases[] = {
    {{.degree = 1, .heads = 2, .kv_heads = 1, .head_dim = 3}, 7},
    {{.degree = 2, .heads = 4, .kv_heads = 4, .head_dim = 3}, 11},   // KV heads split
    {{.degree = 4, .heads = 8, .kv_heads = 2, .head_dim = 2}, 13},   // GQA, each KV head on 2 ranks
    {{.degree = 4, .heads = 4, .kv_heads = 1, .head_dim = 5}, 9},    // MQA: one KV head on every rank
    {{.degree = 8, .heads = 16, .kv_heads = 8, .head_dim = 2}, 21},  // GQA with KV heads split
    {{.degree = 8, .heads = 8, .kv_heads = 2, .head_dim = 2}, 5},    // fewer tokens than ranks
};
}  // namespace

TEST_CASE("ulysses exchange on loopback: every head of every token lands where the plan says, and back") {
  std::uint64_t seed = 1;
  for (const auto& uc : cases) {
    const auto tokens = runtest::uneven_tokens(uc.policy.degree, uc.total, seed);
    CAPTURE(uc.policy);
    comm::loopback::run(uc.policy.degree, [&](comm::loopback::communicator& c) {
      runtest::ulysses_movement(c, uc.policy, tokens, seed);
    });
    ++seed;
  }
}

TEST_CASE("ulysses exchange on loopback: around single-rank attention it equals full causal attention") {
  const std::vector<std::int64_t> docs{9, 14, 3};  // 26 tokens in 3 documents
  std::uint64_t seed = 31;
  for (const auto& uc : cases) {
    if (uc.policy.head_dim < 2) continue;
    const auto tokens = runtest::uneven_tokens(uc.policy.degree, 26, seed);
    CAPTURE(uc.policy);
    comm::loopback::run(uc.policy.degree, [&](comm::loopback::communicator& c) {
      runtest::ulysses_attention(c, uc.policy, docs, tokens, seed);
    });
    seed += 7;
  }
}

TEST_CASE("ulysses exchange: wrong sizes and a group of the wrong degree are refused with the op and rank") {
  const seq::ulysses_policy pol{.degree = 2, .heads = 4, .kv_heads = 2, .head_dim = 2};
  const std::vector<std::int64_t> tokens{3, 2};
  const auto plan = seq::plan_ulysses(tokens, pol);
  std::string msg;
  try {
    comm::loopback::run(2, [&](comm::loopback::communicator& c) {
      std::vector<double> x(
          static_cast<std::size_t>(run::ulysses_sequence_size(plan, run::ulysses_part::query, c.rank())) + 1),
          y(static_cast<std::size_t>(run::ulysses_head_size(plan, run::ulysses_part::query)));
      run::ulysses_to_heads(c, plan, run::ulysses_part::query, std::span<const double>(x),
                            std::span<double>(y));
    });
  } catch (const invalid_argument& e) {
    msg = e.what();
  }
  CHECK(
      msg.find("run::ulysses_to_heads: rank 0 passed a sequence-sharded query-shaped tensor of 25 elements; "
               "expected 24") != std::string::npos);
  msg.clear();
  try {
    comm::loopback::run(3, [&](comm::loopback::communicator& c) {
      std::vector<double> x, y;
      run::ulysses_to_sequence(c, plan, run::ulysses_part::key_value, std::span<const double>(x),
                               std::span<double>(y));
    });
  } catch (const invalid_argument& e) {
    msg = e.what();
  }
  CHECK(msg.find("run::ulysses_to_sequence on group [0,1,2] rank 0/3: a group of 3 ranks") !=
        std::string::npos);
}
