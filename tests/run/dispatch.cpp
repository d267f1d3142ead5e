// SPDX-License-Identifier: Apache-2.0
// Token dispatch by plan on loopback ranks. Property test over seeded random problems with 1-8 ranks:
// random cuts, THD context-parallel and HDP partitions; every token arrives exactly once at its planned
// rank and row, pads and unplanned rows stay untouched, and gather_tokens restores the sources bitwise,
// for int64 rows and for rows of a struct. The device path (comm::emulated_device with
// model::emulated_device_memory) gives the host run's buffers bit for bit. Then the planner's and
// executor's refusals. The same property runs under mpirun in exchange_mpi.cpp.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/host_memory.hpp>

#include "emulated_kernel.hpp"
#include "exchange_bodies.hpp"

using namespace hetmesh;

namespace {

/// dispatch_tokens then gather_tokens of the case's rows (width columns made by make(seq, pos, column)) on
/// host vectors and again over emulated device memory from the same sentinel-filled buffers: the targets
/// and the gathered sources equal bit for bit. Collective over c.
template <class T, class Make>
void dispatch_host_vs_device(comm::loopback::communicator& c, const runtest::dispatch_case& dc,
                             std::int64_t width, Make make, T sentinel) {
  const int me = c.rank();
  const auto plan = balance::plan_token_dispatch(c.size(), dc.sources, dc.targets);
  const auto w = static_cast<std::size_t>(width);
  std::vector<T> src = runtest::dispatch_sources<T>(me, dc, plan, w, make, sentinel);
  const std::vector<T> empty_dst(
      static_cast<std::size_t>(plan.target_rows[static_cast<std::size_t>(me)] + 1) * w, sentinel),
      empty_src(src.size(), sentinel);
  auto dst = empty_dst, back = empty_src;
  run::dispatch_tokens(c, plan, std::span<const T>(src), std::span<T>(dst), width);
  run::gather_tokens(c, plan, std::span<const T>(dst), std::span<T>(back), width);

  comm::emulated_device<comm::loopback::communicator> dev(c);
  model::emulated_device_memory mem;
  const auto src_d = runtest::upload(mem, src);
  auto dst_d = runtest::upload(mem, empty_dst), back_d = runtest::upload(mem, empty_src);
  run::dispatch_tokens(dev, plan, src_d.span(), dst_d.span(), width, mem);
  run::gather_tokens(dev, plan, std::span<const T>(dst_d.span()), back_d.span(), width, mem);
  CHECK_MESSAGE(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(dst_d.span())), dst),
                "rank ", me, ": targets differ from the host run");
  CHECK_MESSAGE(runtest::bitwise_equal(runtest::download(mem, std::span<const T>(back_d.span())), back),
                "rank ", me, ": gathered sources differ from the host run");
  CHECK_MESSAGE(runtest::bitwise_equal(back, src), "rank ", me,
                ": gather_tokens did not restore the sources");
}

}  // namespace

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

TEST_CASE(
    "token dispatch over emulated device memory equals the host run bit for bit (typed rows and bytes)") {
  for (int n = 1; n <= 8; ++n)
    for (int kind = 0; kind < 3; ++kind)
      for (std::uint64_t seed = 0; seed < 3; ++seed) {
        CAPTURE(n);
        CAPTURE(kind);
        CAPTURE(seed);
        const auto dc = runtest::make_dispatch_case(n, kind, seed);
        comm::loopback::run(n, [&](comm::loopback::communicator& c) {
          dispatch_host_vs_device<double>(
              c, dc, 3,
              [&](std::int64_t id, std::int64_t p, std::size_t k) {
                return static_cast<double>(id) + static_cast<double>(p) * 0x1.0p-12 +
                       static_cast<double>(k) * 0.25;
              },
              -1.0);
          dispatch_host_vs_device<runtest::token_record>(
              c, dc, 2,
              [&](std::int64_t id, std::int64_t p, std::size_t k) {
                return runtest::token_record{id, static_cast<std::int32_t>(p), static_cast<float>(k) + 0.5f};
              },
              runtest::token_record{-1, -1, -1.0f});
        });
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
    msg.clear();
    try {  // the device path gathers the hashes through the memory policy
      comm::loopback::run(2, [&](comm::loopback::communicator& c) {
        const auto& plan = c.rank() == 0 ? a : b;
        comm::emulated_device<comm::loopback::communicator> dev(c);
        model::emulated_device_memory mem;
        model::emulated_device_memory::buffer<int> s, t;
        s.resize(16), t.resize(16);
        run::dispatch_tokens(dev, plan, std::span<const int>(s.span()), t.span(), 1, mem);
      });
    } catch (const mismatch_error& e) {
      msg = e.what();
    }
    CHECK(msg.find("token dispatch plan hashes disagree across the group of 2 ranks") != std::string::npos);
  }
}
