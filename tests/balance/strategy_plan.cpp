// SPDX-License-Identifier: Apache-2.0
// The strategies' per-rank plans: every sequence in exactly one work item, each item priced by its
// task, and the plan agreeing with what run_strategy reports.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hetmesh/balance/strategies.hpp>
#include <hetmesh/balance/strategy_plan.hpp>
#include <hetmesh_tools/balancer_names.hpp>  // names -> balancers: the tools' mapping

#include "support.hpp"

using namespace hetmesh;

TEST_CASE("plan_strategy: every sequence once, items priced by their tasks, agrees with run_strategy") {
  const auto seqs = test::random_batch(21, 400, 64, 120000);
  balance::strategy_config cfg;
  cfg.ranks = 32;
  cfg.hdp.capacity = 16384;
  for (const auto name : hetmesh::tools::strategy_names) {
    CAPTURE(name);
    const auto plan = hetmesh::tools::plan_strategy(name, seqs, cfg);
    REQUIRE(plan.items.size() == plan.tasks.size());
    std::vector<std::int64_t> ids;
    for (std::size_t i = 0; i < plan.items.size(); ++i) {
      const auto& it = plan.items[i];
      CHECK(it.ring == plan.tasks[i].ranks);
      CHECK(it.order == plan.tasks[i].order);
      CHECK(it.tokens() > 0);
      for (const int r : it.ring) CHECK((r >= 0 && r < cfg.ranks));
      for (const auto& s : it.seqs) ids.push_back(s.id);
    }
    std::vector<std::int64_t> want;
    for (const auto& s : seqs) want.push_back(s.id);
    std::sort(ids.begin(), ids.end());
    std::sort(want.begin(), want.end());
    CHECK(ids == want);
    std::int64_t total = 0;
    for (const auto& s : seqs) total += s.length;
    CHECK(to_string(plan) == fmt::format("strategy_plan({} items, {} tokens)", plan.items.size(), total));
    CHECK(to_string(plan.items.front())
              .starts_with(fmt::format("work_item(ring={}, ", plan.items.front().ring)));
    const auto r = hetmesh::tools::run_strategy(name, seqs, cfg);
    CHECK(r.tasks == static_cast<std::int64_t>(plan.tasks.size()));
    CHECK(r.step == balance::simulate(cfg.ranks, plan.tasks, cfg.model.pp_stages).step);
    CHECK(r.comm_bytes == balance::ring_comm_bytes(plan, cfg.model));
    CHECK(r.comm_bytes > 0.0);  // 120K-token sequences need rings at C = 16K
  }
  CHECK_THROWS_WITH_AS((void)hetmesh::tools::plan_strategy("magic", seqs, cfg),
                       doctest::Contains("balance::plan_strategy: unknown strategy 'magic'"),
                       invalid_argument);
  cfg.ranks = 0;
  CHECK_THROWS_AS((void)hetmesh::tools::plan_strategy("random", seqs, cfg), invalid_argument);
  CHECK_THROWS_WITH_AS((void)balance::plan_strategy(balance::bytescale{}, seqs, cfg),
                       doctest::Contains("balance::bytescale_hdp: ranks = 0"), invalid_argument);
}

TEST_CASE("balancers: policy types hold their parameters, compare, hash and print") {
  static_assert(balance::balancer<balance::bytescale>);
  static_assert(!balance::balancer<balance::strategy_config>);
  const auto seqs = test::random_batch(5, 200, 64, 60000);
  balance::strategy_config cfg;
  cfg.ranks = 16;
  cfg.hdp.capacity = 16384;
  CHECK(balance::gap_filling_hdp{.group_size = 4} == balance::gap_filling_hdp{.group_size = 4});
  CHECK(balance::gap_filling_hdp{.group_size = 4} != balance::gap_filling_hdp{});
  CHECK(plan_hash(balance::random_placement{.seed = 1}) != plan_hash(balance::random_placement{.seed = 2}));
  CHECK(to_string(balance::bytescale{}) == "bytescale(delta=0.05, buckets=0)");
  CHECK(to_string(balance::gap_filling_hdp{.group_size = 4}) == "gap_filling_hdp(group_size=4)");
  CHECK(to_string(balance::static_dp_cp{.context = 8}) == "static_dp_cp(context=8)");
  CHECK(to_string(hetmesh::tools::balancer_policy{balance::token_count{}}) == "token_count");
  // The type's parameters reach the plan: a locality group keeps rings inside it.
  const auto grouped = balance::gap_filling_hdp{.group_size = 4}.plan(seqs, cfg);
  const auto named = hetmesh::tools::plan_strategy("gap_filling_hdp", seqs, cfg, {.group_size = 4});
  REQUIRE(grouped.items.size() == named.items.size());
  for (std::size_t i = 0; i < grouped.items.size(); ++i) CHECK(grouped.items[i].ring == named.items[i].ring);
  CHECK(balance::run_strategy(balance::random_placement{.seed = 3}, seqs, cfg).name == "random");
}
