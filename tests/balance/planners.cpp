// SPDX-License-Identifier: Apache-2.0
// Planners: DP/micro-batch balancing, the step simulator, ByteScale's balance scheduler, the gap-filling
// planner and the strategy comparison -- properties over seeded inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include <hetmesh/balance/bytescale.hpp>
#include <hetmesh/balance/dp.hpp>
#include <hetmesh/balance/planner.hpp>
#include <hetmesh/balance/strategies.hpp>
#include <hetmesh_tools/balancer_names.hpp>  // names -> balancers: the tools' mapping

#include "support.hpp"

using namespace hetmesh;

namespace {
const cost::llm_compute llm{cost::bytescale_fig6a_layer(), 32, 3.0};

std::vector<seq::seq_desc> permuted(const std::vector<seq::seq_desc>& v, std::uint64_t seed) {
  const auto p = permutation(static_cast<std::int64_t>(v.size()), seed);
  std::vector<seq::seq_desc> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[static_cast<std::size_t>(p[i])];
  return out;
}
}  // namespace

TEST_CASE("plan_dp: exactly once, capacity, permutation invariance, balance") {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    const auto seqs = test::random_batch(seed, 300, 16, 8192);
    for (int mbs : {0, 6}) {
      balance::dp_policy pol{
          .ranks = 8,
          .capacity = 8192,
          .micro_batches = mbs,
          .solver = seed % 2 ? balance::dp_solver::lpt : balance::dp_solver::karmarkar_karp};
      const auto plan = balance::plan_dp(seqs, llm, pol);
      std::multiset<std::int64_t> ids;
      cost::fixed biggest{};
      for (std::size_t r = 0; r < plan.per_rank.size(); ++r) {
        if (mbs > 0) CHECK(plan.per_rank[r].size() == static_cast<std::size_t>(mbs));
        cost::fixed sum{};
        for (const auto& mb : plan.per_rank[r]) {
          CHECK(mb.tokens <= pol.capacity);
          std::int64_t t = 0;
          for (const auto& s : mb.seqs) {
            ids.insert(s.id);
            t += s.length;
            biggest = std::max(biggest, llm.sequence_fixed(s.length));
          }
          CHECK(t == mb.tokens);
          sum += mb.time;
        }
        CHECK(sum == plan.rank_time[r]);
      }
      REQUIRE(ids.size() == seqs.size());
      for (const auto& s : seqs) CHECK(ids.count(s.id) == 1);
      // Permuting the input gives the very same plan.
      CHECK(balance::plan_dp(permuted(seqs, seed + 50), llm, pol) == plan);
      // Balanced: the slowest rank is within the largest item of the mean.
      cost::fixed total{};
      for (auto t : plan.rank_time) total += t;
      const auto mean = cost::fixed::from_ticks(total.ticks / pol.ranks);
      CHECK(plan.makespan() <= mean + biggest);
    }
  }
}

TEST_CASE("plan_dp: bad input and capacity") {
  std::vector<seq::seq_desc> seqs{{1, 100}, {2, 9000}};
  CHECK_THROWS_WITH_AS((void)balance::plan_dp(seqs, llm, {.ranks = 2, .capacity = 8192}),
                       doctest::Contains("sequence 2 has 9000 tokens"), capacity_error);
  std::vector<seq::seq_desc> many(10, {0, 5000});
  for (int i = 0; i < 10; ++i) many[static_cast<std::size_t>(i)].id = i;
  CHECK_THROWS_AS((void)balance::plan_dp(many, llm, {.ranks = 2, .capacity = 8192, .micro_batches = 4}),
                  capacity_error);
  CHECK_THROWS_AS((void)balance::plan_dp(seqs, llm, {.ranks = 0}), invalid_argument);
  CHECK(to_string(balance::dp_policy{.ranks = 2}) ==
        "dp_policy(ranks=2, capacity=8192, micro_batches=0, solver=karmarkar_karp)");
}

TEST_CASE("simulate: a ring waits for its slowest member; pipelines add a bubble") {
  using balance::task;
  const auto ms = [](double x) { return cost::fixed::from_units(x); };
  std::vector<task> tasks{{{0}, 0, ms(5)}, {{1}, 1, ms(1)}, {{0, 1}, 2, ms(2)}, {{1}, 3, ms(1)}};
  const auto t = balance::simulate(2, tasks);
  CHECK(t.finish[0] == ms(7));
  CHECK(t.finish[1] == ms(8));
  CHECK(t.busy[1] == ms(4));
  CHECK(t.step == ms(8));
  const auto p = balance::simulate(2, tasks, 2);
  CHECK(p.finish[0] == ms(3.5 + 2.5));  // (5 + 2) / 2 plus a bubble of (2-1)/2 * 5
  CHECK_THROWS_AS((void)balance::simulate(1, tasks), invalid_argument);
}

TEST_CASE("step_model: ring_step_overhead adds layers x D per ring micro-batch, nothing without a ring") {
  balance::step_model m;
  m.llm = cost::llm_compute{cost::quadratic_time{1e-4, 1e-2, 0.5}, 4, 3.0};
  balance::step_model o = m;
  o.ring_step_overhead = 0.25;
  CHECK(o.ring_time(1000, 1, false) == m.ring_time(1000, 1, false));
  CHECK(o.pack_time(std::vector<std::int64_t>{10, 20}) == m.pack_time(std::vector<std::int64_t>{10, 20}));
  for (int d : {2, 4})
    CHECK(o.ring_time(1000, d, false).units() ==
          doctest::Approx(m.ring_time(1000, d, false).units() + 4 * d * 0.25));
  CHECK(o != m);
  CHECK(plan_hash(o) != plan_hash(m));
}

TEST_CASE("step_model::with_moe: the balancer's micro-batch prices gain the experts' work and all-to-alls") {
  balance::step_model m;
  m.llm = cost::llm_compute{cost::quadratic_time{1e-4, 1e-2, 0.5}, 4, 3.0};
  const cost::moe_layer moe{
      .compute = {.experts = 8, .top_k = 2, .expert_per_token = 3e-3, .router_per_token = 1e-4},
      .hidden = 64};
  const std::vector<int> group{0, 1, 2, 3};
  const auto with = m.with_moe(moe, 2, group, 1e-3);
  const auto t = moe.even_training(m.net, group);
  const std::vector<std::int64_t> docs{100, 300};
  // Two of four layers: per layer half the MoE term (forward units), less half the dense MLP it replaces.
  const double per_layer = 0.5 * ((t.b / 3.0 - 1e-3) * 400.0 + t.c / 3.0);  // c once per packed row
  CHECK(with.pack_time(docs).units() == doctest::Approx(m.pack_time(docs).units() + m.llm.scale() * per_layer)
                                            .epsilon(1e-6));  // fixed-point units
  CHECK(with.pack_time(docs) > m.pack_time(docs));
  CHECK(with.ring_time(4000, 4, false) > m.ring_time(4000, 4, false));
  CHECK(m.with_moe(moe, 0, group) == m);
  CHECK(plan_hash(with) != plan_hash(m));
  CHECK_THROWS_AS((void)m.with_moe(moe, 5, group), invalid_argument);
}

TEST_CASE("bytescale_placement: exactly once, rings, deadlock freedom, permutation invariance") {
  balance::step_model m;
  m.net.devices_per_node = 8;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    const auto seqs = test::random_batch(seed, 400, 64, 120000);
    seq::hdp_policy hdp{.capacity = 8192};
    if (seed % 2 == 0) {
      hdp.offload.enabled = true;
      hdp.model = seq::offload_model{.layer = {.a = 1e-9, .b = 1e-5, .c = 0.0},
                                     .activation = {.alpha = 1.0, .beta = 0.0, .layers = 8},
                                     .d2h_bandwidth = 1e9,
                                     .h2d_bandwidth = 1e9};
    }
    for (auto mode : {balance::hdp_balance_mode::dp, balance::hdp_balance_mode::pp}) {
      const balance::bytescale_policy pol{.delta = 0.05, .mode = mode};
      const auto plan = balance::plan_bytescale(seqs, hdp, 32, m, pol);
      test::check_exactly_once(plan, seqs);
      balance::verify_deadlock_free(plan);
      for (std::size_t i = 0; i < plan.sharding.items.size(); ++i) {
        const auto& ring = plan.placement[i].ring;
        CHECK(static_cast<int>(ring.size()) == plan.sharding.items[i].degree);
        CHECK(std::set<int>(ring.begin(), ring.end()).size() == ring.size());
        if (plan.sharding.items[i].packed) CHECK(plan.sharding.items[i].tokens <= hdp.capacity);
      }
      CHECK(plan_hash(balance::plan_bytescale(permuted(seqs, seed), hdp, 32, m, pol)) == plan_hash(plan));
      // The slack rule keeps every rank within delta of the busiest plus one item (DP-Balance); PP-Balance
      // may stack two items of its level on one pipeline.
      const auto t = balance::simulate(32, balance::tasks_of(plan, m));
      cost::fixed biggest{};
      for (std::size_t i = 0; i < plan.sharding.items.size(); ++i)
        biggest =
            std::max(biggest, balance::hdp_item_time(plan.sharding.items[i], m, plan.placement[i].ring));
      const auto mn = *std::min_element(t.finish.begin(), t.finish.end());
      const double items = mode == balance::hdp_balance_mode::dp ? 1.0 : 2.0;
      CHECK(t.step.units() <= mn.units() * 1.05 + items * biggest.units() + 1e-9);
    }
  }
}

TEST_CASE("bytescale_placement: DP-Balance aligns lengths in time; PP-Balance keeps pipelines on one level") {
  // 64 sequences of 8K (one per micro-batch) and 2048 of 256 (32 per pack) over 16 ranks.
  std::vector<seq::seq_desc> seqs;
  for (int i = 0; i < 64; ++i) seqs.push_back({i, 8192});
  for (int i = 0; i < 2048; ++i) seqs.push_back({1000 + i, 256});
  balance::step_model m;
  const seq::hdp_policy hdp{.capacity = 8192};
  const auto dp = balance::plan_bytescale(seqs, hdp, 16, m, {.mode = balance::hdp_balance_mode::dp});
  balance::verify_deadlock_free(dp);
  for (const auto& rank : dp.per_rank) {
    REQUIRE(rank.size() >= 4);
    for (std::size_t k = 0; k < 4; ++k) CHECK(rank[k].tokens == 8192);  // time steps 0-3: all long
    for (std::size_t k = 0; k < rank.size(); ++k)
      if (k >= 4) CHECK(rank[k].segments.size() > 1);  // afterwards: packs of short ones
  }
  const auto pp =
      balance::plan_bytescale(seqs, hdp, 16, m, {.mode = balance::hdp_balance_mode::pp, .buckets = 2});
  balance::verify_deadlock_free(pp);
  int mixed = 0;
  std::size_t long_rank_mbs = 0, short_rank_mbs = 0;
  for (const auto& rank : pp.per_rank) {
    int longs = 0, packs = 0;
    for (const auto& mb : rank) (mb.segments.size() == 1 ? longs : packs) += 1;
    if (longs > 0 && packs > 0) ++mixed;
    if (packs == 0) long_rank_mbs = std::max(long_rank_mbs, rank.size());
    if (longs == 0) short_rank_mbs = std::max(short_rank_mbs, rank.size());
  }
  CHECK(mixed <= 16 / 2 + 1);             // at most the pipelines of the bucket straddling both levels
  CHECK(short_rank_mbs > long_rank_mbs);  // pipelines of shorter work run more micro-batches
}

TEST_CASE("verify_deadlock_free detects rings run in crossed orders") {
  // Two rings over ranks {0, 1}: both ranks must run them in the same relative order.
  std::vector<seq::seq_desc> seqs{{1, 20000}, {2, 18000}};
  const seq::hdp_policy hdp{.capacity = 16384};
  auto sh = seq::hdp_shard(seqs, hdp, 2);
  REQUIRE(sh.items.size() == 2);
  std::vector<seq::hdp_placement> pl{{{0, 1}, 0}, {{0, 1}, 1}};
  auto plan = seq::hdp_assemble(sh, pl);
  balance::verify_deadlock_free(plan);
  std::swap(plan.per_rank[1][0], plan.per_rank[1][1]);  // rank 1 now waits in item 1 while rank 0 waits in 0
  CHECK_THROWS_WITH_AS(balance::verify_deadlock_free(plan), doctest::Contains("deadlocks after 0 of 2 items"),
                       error);
  // A micro-batch listed on a rank that is not in its ring is malformed.
  auto bad = seq::hdp_assemble(sh, pl);
  bad.per_rank[0][0].ring_position = 1;
  CHECK_THROWS_AS(balance::verify_deadlock_free(bad), invalid_argument);
}

TEST_CASE("plan_gap_filling_hdp: properties, groups, and near the lower bound") {
  balance::step_model m;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const auto seqs = test::random_batch(seed, 600, 64, 60000);
    const seq::hdp_policy hdp{.capacity = 8192};
    const auto plan = balance::plan_gap_filling_hdp(seqs, hdp, 32, m);
    test::check_exactly_once(plan, seqs);
    balance::verify_deadlock_free(plan);
    for (const auto& it : plan.sharding.items)
      if (it.packed) CHECK(it.tokens <= hdp.capacity);
    CHECK(balance::plan_gap_filling_hdp(permuted(seqs, seed), hdp, 32, m) == plan);
    // Groups of 8: every item stays in the group of its sequences' loader.
    std::vector<int> owner(seqs.size());
    for (std::size_t i = 0; i < seqs.size(); ++i) owner[i] = static_cast<int>((seqs[i].id * 13) % 32);
    const auto grouped = balance::plan_gap_filling_hdp(seqs, hdp, 32, m, {.group_size = 8}, owner);
    test::check_exactly_once(grouped, seqs);
    balance::verify_deadlock_free(grouped);
    std::map<std::int64_t, int> group_of;
    for (std::size_t i = 0; i < seqs.size(); ++i) group_of[seqs[i].id] = owner[i] / 8;
    for (std::size_t i = 0; i < grouped.sharding.items.size(); ++i)
      for (int r : grouped.placement[i].ring)
        for (const auto& s : grouped.sharding.items[i].seqs) CHECK(r / 8 == group_of[s.id]);
  }
  CHECK_THROWS_AS((void)balance::plan_gap_filling_hdp(test::random_batch(1, 10, 10, 100), {.capacity = 64}, 6,
                                                      m, {.group_size = 4}),
                  invalid_argument);
}

TEST_CASE(
    "compare_strategies: every strategy runs; HDP strategies respect the lower bound; ours is near it") {
  balance::strategy_config cfg;
  cfg.ranks = 64;
  cfg.hdp.capacity = 16384;
  const auto seqs = test::prolong_batch(3, 64LL * 8 * 16384);
  const auto res =
      balance::compare_strategies(seqs, cfg, balance::random_placement{}, balance::token_count{},
                                  balance::static_dp_cp{}, balance::bytescale{}, balance::gap_filling_hdp{});
  REQUIRE(res.size() == hetmesh::tools::strategy_names.size());
  // The tools' name-driven compare runs the same five with the same results.
  const auto named = hetmesh::tools::compare_strategies(seqs, cfg);
  REQUIRE(named.size() == res.size());
  for (std::size_t i = 0; i < res.size(); ++i) {
    CHECK(named[i].name == res[i].name);
    CHECK(named[i].step == res[i].step);
  }
  for (const auto& r : res) {
    CHECK(r.step.ticks > 0);
    CHECK(r.imbalance >= 1.0);
    if (r.name != "static_dp_cp") CHECK(r.step >= r.lower_bound);
  }
  const auto by = [&](std::string_view n) {
    return *std::find_if(res.begin(), res.end(), [&](const auto& r) { return r.name == n; });
  };
  CHECK(by("gap_filling_hdp").ratio_to_lower_bound < 1.05);
  CHECK(by("gap_filling_hdp").step <= by("bytescale_hdp").step);
  CHECK(by("bytescale_hdp").step < by("token_count").step);
  CHECK(by("token_count").step < by("random").step);
  CHECK_THROWS_WITH_AS((void)hetmesh::tools::run_strategy("magic", seqs, cfg),
                       doctest::Contains("unknown strategy 'magic'"), invalid_argument);
}

TEST_CASE("compare_strategies: heavy-tailed synthetic batch, gap_filling_hdp within 2% of the lower bound") {
  // Lengths log-skewed over [64, 300000]: about 110 of 1,700 sequences are rings (up to ~17 ranks) that
  // carry 90% of the work. Before ring gaps were filled, the planner reached 1.063 here: every ring
  // member free before the ring's last member idled (mean busy 1.006 x the bound, step 1.063 x), which
  // is the balancer's gap, not the bound's. Filled, the step is 1.008 x the bound (seeds 1-3). The
  // bound leaves out the per-row constant of every micro-batch and of every ring member (packing and
  // ring degrees are not known to it): about 0.7% of this batch's work, so 1.02 leaves ~1% of slack.
  balance::strategy_config cfg;
  cfg.ranks = 64;
  cfg.hdp.capacity = 16384;
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const auto seqs = test::heavy_tailed_batch(seed, 64LL * 8 * 16384);
    const auto res = balance::compare_strategies(seqs, cfg, balance::bytescale{}, balance::gap_filling_hdp{});
    const auto by = [&](std::string_view n) {
      return *std::find_if(res.begin(), res.end(), [&](const auto& r) { return r.name == n; });
    };
    CAPTURE(seed);
    CHECK(by("gap_filling_hdp").step >= by("gap_filling_hdp").lower_bound);
    CHECK(by("gap_filling_hdp").ratio_to_lower_bound < 1.02);
    CHECK(by("gap_filling_hdp").step < by("bytescale_hdp").step);
  }
}

TEST_CASE("step_lower_bound: ring rank-time and the capacity rule; below every HDP plan; order-free") {
  // One communication-bound sequence of 64 C tokens on a pool of 128: its ring needs >= 64 ranks, and a
  // ring of D ranks keeps D ranks busy for its ring time, more than its work / D.
  balance::strategy_config cfg;
  cfg.ranks = 128;
  cfg.hdp.capacity = 8192;
  cfg.model.net.inter_bw_gbps = 25.0;
  const std::int64_t s = 64 * 8192;
  const std::vector<seq::seq_desc> one{{7, s}};
  const auto t = balance::step_lower_bound_terms(one, cfg);
  std::int64_t area = std::numeric_limits<std::int64_t>::max(), best = area;
  for (int d = 64; d <= 128; ++d) {
    const auto rt = cfg.model.ring_time(s, d, cfg.model.spans_nodes(d)).ticks;
    area = std::min(area, d * rt);
    best = std::min(best, rt);
  }
  CHECK(t.area.ticks == (area + 127) / 128);
  CHECK(t.longest.ticks == best);
  CHECK(t.chain.ticks == 0);  // 64 ranks: two such rings fit side by side
  CHECK(balance::step_lower_bound(one, cfg) == std::max(t.area, t.longest));
  // Three of them at 65 C tokens need > half the pool each: they run one after another.
  const std::vector<seq::seq_desc> three{{1, 65 * 8192}, {2, 65 * 8192}, {3, 65 * 8192}};
  const auto t3 = balance::step_lower_bound_terms(three, cfg);
  CHECK(t3.chain.ticks == 3 * t3.longest.ticks);
  CHECK(balance::step_lower_bound(three, cfg) >= t3.chain);

  // Seeded heavy-tailed batches: the bound is at least the work-only bound, below every HDP strategy's
  // modelled step (with and without offloading, pp 1 and 4), and independent of the batch's order.
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    balance::strategy_config c;
    c.ranks = 32;
    c.hdp.capacity = 8192;
    c.hdp.offload.enabled = seed % 2 == 0;
    c.model.pp_stages = seed <= 2 ? 1 : 4;
    c.model.net.inter_bw_gbps = 25.0;
    const auto seqs = test::heavy_tailed_batch(seed, 32LL * 4 * 8192);
    const auto lb = balance::step_lower_bound(seqs, c);
    CAPTURE(seed);
    CHECK(lb >= balance::step_lower_bound_terms(seqs, c).work_only);
    CHECK(balance::step_lower_bound(permuted(seqs, seed + 11), c) == lb);
    const auto res =
        balance::compare_strategies(seqs, c, balance::random_placement{.seed = seed}, balance::token_count{},
                                    balance::bytescale{}, balance::gap_filling_hdp{});
    for (const auto& r : res) {
      CAPTURE(r.name);
      CHECK(r.lower_bound == lb);
      CHECK(r.step >= lb);
    }
  }
}

namespace {
/// The step model of bench/balance/compare.cpp's exact instances at 1/64 scale: 8 ranks, one per node,
/// the quadratic term, the KV bytes per token and the per-hop latency x 64 (full-size rings' per-rank
/// compute and traffic on short sequences).
balance::strategy_config scaled_down_8() {
  balance::strategy_config cfg;
  cfg.ranks = 8;
  cfg.hdp.capacity = 8192;
  cfg.model.net.intra_bw_gbps = 150.0;
  cfg.model.net.inter_bw_gbps = 25.0;
  cfg.model.net.devices_per_node = 1;
  cfg.model.net.nodes = 8;
  cfg.model.net.inter_latency_us *= 64;
  cfg.model.llm.layer.a *= 64;
  cfg.model.kv_bytes_per_token *= 64;
  return cfg;
}
}  // namespace

TEST_CASE(
    "plan_gap_filling_hdp: the improvement pass beats the constructive placement where one rank holds "
    "four rings") {
  // The rings of the Byted-like batch of seed 1001 scaled down 64 times (docs/balance.md, exact optima),
  // with seeded short sequences of about the same tokens. Placed longest first on the least-loaded
  // ranks, the 24,385-token ring takes the three ranks free first, the two 3-rank rings after it then
  // share a rank, and one rank carries four rings back to back (the step); re-placing that ring on
  // ranks free later (best fit) and the rings after it greedily lets the 3-rank rings run side by side.
  const auto cfg = scaled_down_8();
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    std::vector<seq::seq_desc> seqs;
    for (std::int64_t l : {32768, 32768, 30850, 24745, 24385, 19422, 19278, 16324, 14096})
      seqs.push_back({static_cast<std::int64_t>(seqs.size()), l});
    rng g(seed);
    for (std::int64_t tokens = 0; tokens < 330000;) {
      const auto l = 1 + static_cast<std::int64_t>(g.below(190));
      seqs.push_back({static_cast<std::int64_t>(seqs.size()), l});
      tokens += l;
    }
    const auto on = balance::run_strategy(balance::gap_filling_hdp{}, seqs, cfg);
    const auto off = balance::run_strategy(balance::gap_filling_hdp{.local_search = false}, seqs, cfg);
    CAPTURE(seed);
    CAPTURE(off.ratio_to_lower_bound);
    CAPTURE(on.ratio_to_lower_bound);
    // The constructive plan has the rank with four rings.
    const auto most_rings = [&](const balance::gap_filling_hdp& b) {
      const auto p = balance::plan_gap_filling_hdp(seqs, cfg.hdp, cfg.ranks, cfg.model, {0, b.local_search});
      std::vector<int> rings(8, 0);
      for (std::size_t i = 0; i < p.sharding.items.size(); ++i)
        if (!p.sharding.items[i].packed)
          for (int r : p.placement[i].ring) ++rings[static_cast<std::size_t>(r)];
      return *std::max_element(rings.begin(), rings.end());
    };
    CHECK(most_rings({.local_search = false}) == 4);
    CHECK(on.step < off.step);
    CHECK(on.step >= on.lower_bound);
    CHECK(on.ratio_to_lower_bound < off.ratio_to_lower_bound - 0.03);
  }
}

TEST_CASE("plan_gap_filling_hdp: the improvement pass keeps every property and never worsens the step") {
  // Seeded heavy-tailed batches on small pools (rings of 2 to half the pool), pipelines of 1 and 2 stages,
  // one group and groups of 4: the plan with the pass is exactly-once, within capacity, deadlock-free,
  // independent of the input order, and its modelled step is at most the constructive plan's.
  int better = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    balance::strategy_config cfg = seed % 3 == 0 ? scaled_down_8() : balance::strategy_config{};
    cfg.ranks = seed % 3 == 0 ? 8 : 16;
    cfg.hdp.capacity = 8192;
    cfg.model.pp_stages = seed % 4 == 1 ? 2 : 1;
    cfg.model.net.inter_bw_gbps = 25.0;
    const int group = seed % 5 == 0 ? 4 : 0;
    // Lengths log-skewed up to half a group's capacity: rings of 2 to half the group.
    const auto seqs = test::random_batch(seed, 500, 64, (group > 0 ? group : cfg.ranks) * 8192LL / 2);
    std::vector<int> owner(seqs.size());
    for (std::size_t i = 0; i < owner.size(); ++i)
      owner[i] = static_cast<int>(i % static_cast<std::size_t>(cfg.ranks));
    CAPTURE(seed);
    const auto plan =
        balance::plan_gap_filling_hdp(seqs, cfg.hdp, cfg.ranks, cfg.model, {group, true}, owner);
    test::check_exactly_once(plan, seqs);
    balance::verify_deadlock_free(plan);
    for (std::size_t i = 0; i < plan.sharding.items.size(); ++i) {
      const auto& it = plan.sharding.items[i];
      if (it.packed) CHECK(it.tokens <= cfg.hdp.capacity);
      CHECK(static_cast<int>(plan.placement[i].ring.size()) == it.degree);
      CHECK(std::set<int>(plan.placement[i].ring.begin(), plan.placement[i].ring.end()).size() ==
            plan.placement[i].ring.size());
      if (group > 0)
        for (int r : plan.placement[i].ring) CHECK(r / group == plan.placement[i].ring.front() / group);
    }
    // The same plan from the batch in another order (owners permuted alike).
    const auto p = permutation(static_cast<std::int64_t>(seqs.size()), seed + 5);
    std::vector<seq::seq_desc> shuffled(seqs.size());
    std::vector<int> shuffled_owner(seqs.size());
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      shuffled[i] = seqs[static_cast<std::size_t>(p[i])];
      shuffled_owner[i] = owner[static_cast<std::size_t>(p[i])];
    }
    CHECK(balance::plan_gap_filling_hdp(shuffled, cfg.hdp, cfg.ranks, cfg.model, {group, true},
                                        shuffled_owner) == plan);
    const auto off =
        balance::plan_gap_filling_hdp(seqs, cfg.hdp, cfg.ranks, cfg.model, {group, false}, owner);
    const auto step = [&](const seq::hdp_plan& q) {
      return balance::simulate(cfg.ranks, balance::tasks_of(q, cfg.model), cfg.model.pp_stages).step;
    };
    CHECK(step(plan) <= step(off));
    CHECK(step(plan) >= balance::step_lower_bound(seqs, cfg));
    better += step(plan) < step(off) ? 1 : 0;
  }
  MESSAGE("the pass improved " << better << " of 12 batches");
  CHECK(better > 0);  // 4 of 12 when written
}

TEST_CASE("improve_layout: re-packing the largest rings finds a packing that no local move finds") {
  // Six rings on 9 ranks (members x time; no short sequences). Placed longest first on the least-loaded
  // ranks (as plan_gap_filling_hdp's constructive pass places them), the two longest run side by side
  // and the next four then wait for each other's ranks. A packing with no idle rank exists; the local
  // moves (a)-(f) alone do not reach it, the re-packing move (g) (repack_rings) does: the step drops to
  // the area bound, sum of members x time over the ranks.
  using namespace balance::detail;
  const int pool = 9;
  const std::vector<int> width{5, 4, 3, 6, 4, 5};
  const std::vector<double> units{29, 28, 22, 22, 18, 17};
  const balance::step_model m;
  balance::detail::ring_layout lay;
  balance::detail::load_set loads(pool);
  std::int64_t area = 0;
  for (std::size_t j = 0; j < width.size(); ++j) {
    std::vector<int> ring = loads.least(width[j]);
    std::sort(ring.begin(), ring.end());
    lay.time.push_back(cost::fixed::from_units(units[j]));
    loads.run(ring, lay.time.back());
    lay.order.push_back(j);
    lay.ranks.push_back(std::move(ring));
    lay.min_degree.push_back(width[j]);
    lay.max_degree.push_back(width[j]);
    area += width[j] * lay.time.back().ticks;
  }
  const std::int64_t area_bound = (area + pool - 1) / pool;
  const short_set none;
  const auto time_of = [&](std::size_t j, std::span<const int>) { return cost::fixed::from_units(units[j]); };
  const layout_eval start = evaluate_layout(lay, none, pool, 8192, m);
  CHECK(start.step.ticks > area_bound);
  // The local moves alone (move (g) off: no work allowed for it).
  ring_layout local = lay;
  layout_eval local_ev = start;
  improve_layout(local, local_ev, none, pool, 8192, m, time_of, search_budget{.repack_work = 0});
  CHECK(local_ev.step.ticks > area_bound);
  // With move (g).
  ring_layout packed = lay;
  layout_eval packed_ev = start;
  improve_layout(packed, packed_ev, none, pool, 8192, m, time_of);
  CHECK(packed_ev.step.ticks == area_bound);
  CHECK(packed_ev.step < local_ev.step);
  // Still a layout of the same rings: each on its own number of distinct ranks of the pool, every ring
  // once in the order, and the evaluation is that of the layout.
  std::vector<std::size_t> order = packed.order;
  std::sort(order.begin(), order.end());
  for (std::size_t j = 0; j < width.size(); ++j) {
    CHECK(order[j] == j);
    CHECK(static_cast<int>(packed.ranks[j].size()) == width[j]);
    CHECK(std::set<int>(packed.ranks[j].begin(), packed.ranks[j].end()).size() == packed.ranks[j].size());
    CHECK(packed.ranks[j].front() >= 0);
    CHECK(packed.ranks[j].back() < pool);
  }
  CHECK(evaluate_layout(packed, none, pool, 8192, m).step == packed_ev.step);
  // Deterministic.
  ring_layout again = lay;
  layout_eval again_ev = start;
  improve_layout(again, again_ev, none, pool, 8192, m, time_of);
  CHECK(again.ranks == packed.ranks);
  CHECK(again.order == packed.order);
}
