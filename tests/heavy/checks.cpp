// SPDX-License-Identifier: Apache-2.0
// The heavy and collective checks themselves (built at HETMESH_ASSERTION_LEVEL 3): each is handed a
// deliberately corrupted plan, schedule or disagreeing rank and must fail loudly, naming the offence.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <hetmesh/balance/reorder.hpp>
#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/exactly_once.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/lower.hpp>
#include <hetmesh/pipeline/verify.hpp>
#include <hetmesh/run/pipeline_executor.hpp>
#include <hetmesh/seq/hdp.hpp>

static_assert(HETMESH_ASSERTION_LEVEL == HETMESH_ASSERTION_LEVEL_HEAVY,
              "test_heavy_checks is built at heavy level");

using hetmesh::id_range;

TEST_CASE("exactly_once_violation names gaps, overlaps, unknown and repeated ids") {
  const std::vector<id_range> in{{7, 0, 100}, {3, 0, 10}, {5, 0, 0}};
  CHECK(hetmesh::exactly_once_violation(in, {{3, 0, 10}, {7, 50, 100}, {7, 0, 50}}).empty());
  CHECK(hetmesh::exactly_once_violation(in, {{3, 0, 10}, {7, 0, 40}, {7, 50, 100}}) ==
        "id 7: tokens [40, 50) never assigned");
  CHECK(hetmesh::exactly_once_violation(in, {{3, 0, 10}, {7, 0, 60}, {7, 50, 100}}) ==
        "id 7: tokens [50, 60) assigned twice");
  CHECK(hetmesh::exactly_once_violation(in, {{3, 0, 10}, {3, 0, 10}, {7, 0, 100}}) ==
        "id 3: tokens [0, 10) assigned twice");
  CHECK(hetmesh::exactly_once_violation(in, {{3, 0, 10}, {7, 0, 100}, {9, 0, 1}}) ==
        "id 9 is assigned (tokens [0, 1)) but not in the input");
  CHECK(hetmesh::exactly_once_violation(in, {{3, 0, 10}, {7, 0, 101}}) ==
        "id 7: tokens [100, 101) assigned but the input ends at 100");
  CHECK(hetmesh::exactly_once_violation(in, {{7, 0, 100}}) == "id 3: tokens [0, 10) never assigned");
  CHECK(hetmesh::exactly_once_violation({{1, 0, 1}, {1, 0, 1}}, {{1, 0, 1}}) ==
        "id 1 appears twice in the input");
}

TEST_CASE("a corrupted HDP plan fails the exactly-once check the planners run at heavy level") {
  const std::vector<hetmesh::seq::seq_desc> seqs{{1, 40000}, {2, 100}, {3, 9000}, {4, 0}};
  auto plan = hetmesh::seq::plan_hdp(seqs, {.capacity = 8192}, 8);  // checks itself at this level
  CHECK(hetmesh::seq::hdp_exactly_once_violation(seqs, plan).empty());
  auto lost = plan;  // a ring member loses its chunk
  auto& row = *std::find_if(lost.per_rank.begin(), lost.per_rank.end(),
                            [](const auto& mbs) { return !mbs.empty() && mbs.front().degree > 1; });
  row.front().segments.pop_back();
  CHECK(hetmesh::seq::hdp_exactly_once_violation(seqs, lost).find("id 1: tokens") != std::string::npos);
  CHECK(hetmesh::seq::hdp_exactly_once_violation(seqs, lost).find("never assigned") != std::string::npos);
  auto twice = plan;  // a micro-batch listed twice
  auto& busy = *std::find_if(twice.per_rank.begin(), twice.per_rank.end(),
                             [](const auto& mbs) { return !mbs.empty(); });
  busy.push_back(busy.front());
  CHECK(hetmesh::seq::hdp_exactly_once_violation(seqs, twice).find("assigned twice") != std::string::npos);
}

TEST_CASE("a corrupted grouped-reorder plan fails the exactly-once check") {
  std::vector<hetmesh::seq::sample_meta> s{
      {.id = 10, .tokens = 500, .item_tokens = {64, 128}, .owner = 0},
      {.id = 11, .tokens = 300, .item_tokens = {}, .owner = 1},
      {.id = 12, .tokens = 900, .item_tokens = {256}, .owner = 2},
      {.id = 13, .tokens = 100, .item_tokens = {32, 32, 32}, .owner = 3}};
  const auto plan = hetmesh::balance::plan_grouped_reorder(s, 4);
  CHECK(hetmesh::balance::reorder_exactly_once_violation(s, plan).empty());
  auto lost = plan;
  lost.llm_rank[1] = -1;  // sample 11's LLM part goes nowhere
  CHECK(hetmesh::balance::reorder_exactly_once_violation(s, lost) == "id 11: tokens [0, 1) never assigned");
  auto out = plan;
  out.encoder_rank.back() = 4;  // sample 13's last item to a rank outside the group
  CHECK(hetmesh::balance::reorder_exactly_once_violation(s, out) == "id 13: tokens [3, 4) never assigned");
  s.push_back({.id = 14, .tokens = 10, .item_tokens = {}, .owner = 0});  // a sample the plan never saw
  CHECK(hetmesh::balance::reorder_exactly_once_violation(s, plan) == "id 14: tokens [0, 1) never assigned");
}

TEST_CASE("heavy: a schedule that cannot finish trips assert_deadlock_free") {
  using namespace hetmesh::pipeline;
  const schedule ok = one_f_one_b{}.generate(2, 3);  // verified inside the generator at this level
  CHECK_NOTHROW(assert_deadlock_free(ok, "test"));
  CHECK_NOTHROW(assert_deadlock_free(add_send_recv(ok), "test"));
  schedule bad = ok;  // rank 1 runs its list backwards: backward before its forward
  std::reverse(bad.ranks[1].begin(), bad.ranks[1].end());
  CHECK_THROWS_WITH_AS(assert_deadlock_free(bad, "test"),
                       doctest::Contains("test: schedule 1f1b fails verification"), hetmesh::assertion_error);
}

TEST_CASE("collective: ranks running different schedules fail plan agreement before any transfer") {
  using namespace hetmesh::pipeline;
  const schedule s = add_send_recv(one_f_one_b{}.generate(2, 2));
  schedule other = s;
  other.name = "1f1b (stale)";
  CHECK_THROWS_WITH_AS(hetmesh::comm::loopback::run(2,
                                                    [&](hetmesh::comm::loopback::communicator& c) {
                                                      hetmesh::run::execute_pipeline(
                                                          c, c.rank() == 1 ? other : s,
                                                          hetmesh::run::stage_functions<double>{}, {});
                                                    }),
                       doctest::Contains("pipeline schedule hashes disagree"), hetmesh::mismatch_error);
}

TEST_CASE("collective: on the device path too (emulated device memory), different schedules fail agreement") {
  using namespace hetmesh::pipeline;
  const schedule s = add_send_recv(one_f_one_b{}.generate(2, 2));
  schedule other = s;
  other.name = "1f1b (stale)";
  CHECK_THROWS_WITH_AS(hetmesh::comm::loopback::run(
                           2,
                           [&](hetmesh::comm::loopback::communicator& c) {
                             hetmesh::comm::emulated_device<hetmesh::comm::loopback::communicator> dev(c);
                             hetmesh::model::emulated_device_memory mem;
                             hetmesh::run::execute_pipeline(dev, c.rank() == 1 ? other : s,
                                                            hetmesh::run::stage_functions<double>{}, {}, mem);
                           }),
                       doctest::Contains("pipeline schedule hashes disagree"), hetmesh::mismatch_error);
}
