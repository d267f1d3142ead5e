// SPDX-License-Identifier: Apache-2.0
// Token dispatch by plan on loopback ranks. Property test over seeded random problems with 1-8 ranks:
// random cuts, THD context-parallel and HDP partitions; every token arrives exactly once at its planned
// rank and row, pads and unplanned rows stay untouched, and gather_tokens restores the sources bitwise,
// for int64 rows and for rows of a struct. Then the planner's and executor's refusals. The same
// property runs under mpirun in exchange_mpi.cpp.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <hetmesh/comm/loopback.hpp>

#include "exchange_bodies.hpp"

using namespace hetmesh;

TEST_CASE("token dispatch on loopback: exactly once and an exact inverse, over random plans on 1-8 ranks") {
  for (int n = 1; n <= 8; ++n)
    for (int kind = 0; kind < 3; ++kind)
      for (std::uint64_t seed = 0; seed < 12; ++seed) {
        CAPTURE(n);
        CAPTURE(kind);
        CAPTURE(seed);
        comm::loopback::run(
            n, [&](comm::loopback::communicator& c) { runtest::dispatch_property(c, kind, seed); });
      }
}

TEST_CASE("plan_token_dispatch: a token planned twice or never, an unknown sequence, overlapping rows") {
  using balance::llm_block;
  const std::vector<balance::token_source> src{{7, 0, 0, 10}, {9, 1, 0, 4}};
  auto refusal = [&](std::vector<llm_block> t, int ranks = 2) {
    try {
      (void)balance::plan_token_dispatch(ranks, src, t);
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::vector<llm_block> good{{7, 1, {0, 6}, 0}, {7, 0, {6, 10}, 0}, {9, 0, {0, 4}, 4}};
  const auto plan = balance::plan_token_dispatch(2, src, good);
  CHECK(plan.tokens == 14);
  CHECK(plan.source_rows == std::vector<std::int64_t>{10, 4});
  CHECK(plan.target_rows == std::vector<std::int64_t>{8, 6});
  CHECK(refusal({{7, 1, {0, 6}, 0}, {7, 0, {5, 10}, 0}, {9, 0, {0, 4}, 5}})
            .find("sequence 7 (length 10): [5,10) on rank 0; expected tokens from 6 next (token 5 is planned "
                  "twice)") != std::string::npos);
  CHECK(refusal({{7, 1, {0, 6}, 0}, {7, 0, {7, 10}, 0}, {9, 0, {0, 4}, 4}})
            .find("token 6 is planned on no rank") != std::string::npos);
  CHECK(refusal({{7, 1, {0, 10}, 0}})
            .find("sequence 9 (length 4, on rank 1): tokens [0, 4) are planned on no rank") !=
        std::string::npos);
  CHECK(refusal({{7, 1, {0, 10}, 0}, {9, 0, {0, 4}, 0}, {8, 0, {0, 1}, 9}})
            .find("names sequence 8, which has no source") != std::string::npos);
  CHECK(refusal({{7, 1, {0, 10}, 0}, {9, 1, {0, 4}, 8}})
            .find("target rows [0, 10) and [8, 12) overlap on rank 1") != std::string::npos);
  CHECK(refusal(good, 1).find("expected a rank in [0, 1)") != std::string::npos);
}

TEST_CASE("dispatch_tokens and gather_tokens refuse buffers smaller than the plan, naming the op and rank") {
  const std::vector<balance::token_source> src{{7, 0, 0, 10}, {9, 1, 0, 4}};
  const std::vector<balance::llm_block> tgt{{7, 1, {0, 6}, 0}, {7, 0, {6, 10}, 0}, {9, 0, {0, 4}, 4}};
  const auto plan = balance::plan_token_dispatch(2, src, tgt);
  std::string msg;
  try {
    comm::loopback::run(2, [&](comm::loopback::communicator& c) {
      std::vector<int> s(40),
          t(static_cast<std::size_t>(plan.target_rows[static_cast<std::size_t>(c.rank())]) * 2);
      if (c.rank() == 1) t.resize(t.size() - 2);
      run::dispatch_tokens(c, plan, std::span<const int>(s), std::span<int>(t), 2);
    });
  } catch (const invalid_argument& e) {
    msg = e.what();
  }
  CHECK(msg.find(
            "run::dispatch_tokens: rank 1 passed a target buffer of 10 elements; expected a whole number of "
            "rows of 2 elements and at least 6 rows") != std::string::npos);
  msg.clear();
  try {
    comm::loopback::run(2, [&](comm::loopback::communicator& c) {
      std::vector<int> s(3), t(100);
      run::gather_tokens(c, plan, std::span<const int>(t), std::span<int>(s), 1);
    });
  } catch (const invalid_argument& e) {
    msg = e.what();
  }
  CHECK(msg.find("run::gather_tokens: rank 0 passed a source buffer of 3 elements") != std::string::npos);
}

TEST_CASE("dispatch_tokens: a rank holding another plan is caught at the collective assertion level") {
  if constexpr (!assertion_enabled(assertion_level::collective)) {
    MESSAGE(
        "built below the collective assertion level: plan agreement is not checked (test_run_exchange_heavy "
        "runs this case)");
  } else {
    const std::vector<balance::token_source> src{{7, 0, 0, 10}, {9, 1, 0, 4}};
    const auto a = balance::plan_token_dispatch(
        2, src, std::vector<balance::llm_block>{{7, 1, {0, 6}, 0}, {7, 0, {6, 10}, 0}, {9, 0, {0, 4}, 4}});
    const auto b = balance::plan_token_dispatch(
        2, src, std::vector<balance::llm_block>{{7, 1, {0, 5}, 0}, {7, 0, {5, 10}, 0}, {9, 0, {0, 4}, 5}});
    std::string msg;
    try {
      comm::loopback::run(2, [&](comm::loopback::communicator& c) {
        const auto& plan = c.rank() == 0 ? a : b;
        std::vector<int> s(16), t(16);
        run::dispatch_tokens(c, plan, std::span<const int>(s), std::span<int>(t), 1);
      });
    } catch (const mismatch_error& e) {
      msg = e.what();
    }
    CHECK(msg.find("token dispatch plan hashes disagree") != std::string::npos);
  }
}
