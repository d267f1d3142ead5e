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

#include "support.hpp"

using namespace hetmesh;

TEST_CASE("plan_strategy: every sequence once, items priced by their tasks, agrees with run_strategy") {
  const auto seqs = test::random_batch(21, 400, 64, 120000);
  balance::strategy_config cfg;
  cfg.ranks = 32;
  cfg.hdp.capacity = 16384;
  for (const auto name : balance::strategy_names) {
    CAPTURE(name);
    const auto plan = balance::plan_strategy(name, seqs, cfg);
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
    const auto r = balance::run_strategy(name, seqs, cfg);
    CHECK(r.tasks == static_cast<std::int64_t>(plan.tasks.size()));
    CHECK(r.step == balance::simulate(cfg.ranks, plan.tasks, cfg.model.pp_stages).step);
    CHECK(r.comm_bytes == balance::ring_comm_bytes(plan, cfg.model));
    CHECK(r.comm_bytes > 0.0);  // 120K-token sequences need rings at C = 16K
  }
  CHECK_THROWS_WITH_AS((void)balance::plan_strategy("magic", seqs, cfg),
                       doctest::Contains("balance::plan_strategy: unknown strategy 'magic'"),
                       invalid_argument);
  cfg.ranks = 0;
  CHECK_THROWS_AS((void)balance::plan_strategy("random", seqs, cfg), invalid_argument);
}
