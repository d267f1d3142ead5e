// SPDX-License-Identifier: Apache-2.0
// Mixture and planner: weights and curricula, modality/bucket mixes, JSON <-> aggregate, quotas within
// one sample of the schedule at every step, exactly-once per epoch, balanced rank shares, determinism.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <span>

#include <hetmesh/core/random.hpp>
#include <hetmesh/data/checkpoint.hpp>
#include <hetmesh/data/mixture_json.hpp>
#include <hetmesh/data/planner.hpp>
#include <hetmesh/mesh/decoupled.hpp>

using namespace hetmesh;
using namespace hetmesh::data;

namespace {
// Metadata from a table: sizes per source and lengths as a pure function; permutation per epoch.
struct table_meta {
  std::uint64_t seed;
  std::vector<std::int64_t> sizes;
  std::int64_t source_size(int s) const { return sizes[static_cast<std::size_t>(s)]; }
  std::pair<std::int64_t, seq::sample_meta> lookup(int s, std::int64_t e, std::int64_t p) const {
    const auto perm = permutation(sizes[static_cast<std::size_t>(s)], epoch_seed_of(s, e));
    const auto idx = perm[static_cast<std::size_t>(p)];
    const auto len =
        1 + static_cast<std::int64_t>(
                key_hash({seed, static_cast<std::uint64_t>(s), static_cast<std::uint64_t>(idx)}) % 500);
    return {idx, seq::sample_meta{.tokens = len, .item_tokens = {}, .bytes = 2 * len}};
  }
  std::uint64_t epoch_seed_of(int s, std::int64_t e) const {
    return key_hash({seed, static_cast<std::uint64_t>(s), static_cast<std::uint64_t>(e)});
  }
};
static_assert(metadata_source<table_meta>);
static_assert(!batch_metadata_source<table_meta>);

// The same table answering runs of positions at once (the planner's batch lookup); counts its calls.
struct table_meta_runs : table_meta {
  std::int64_t runs = 0;
  void lookup_run(int s, std::int64_t e, std::int64_t p, std::span<std::int64_t> index,
                  std::span<seq::sample_meta> meta) {
    ++runs;
    REQUIRE(index.size() == meta.size());
    for (std::size_t k = 0; k < index.size(); ++k) {
      auto [i, m] = lookup(s, e, p + static_cast<std::int64_t>(k));
      index[k] = i;
      meta[k] = std::move(m);
    }
  }
};
static_assert(batch_metadata_source<table_meta_runs>);

mixture_config three_sources() {
  return mixture_config{
      .seed = 42,
      .global_batch = 37,
      .sources = {{.name = "web", .paths = {"w"}, .weight = {{0, 0.6}, {100, 0.2}}},
                  {.name = "code", .paths = {"c"}, .weight = {{0, 0.3}, {100, 0.3}}},
                  {.name = "math", .paths = {"m"}, .weight = {{0, 0.1}, {100, 0.5}}}},
      .cost = {.text = {.a = 1, .b = 1}},
      .layout = mesh::make_mesh(mesh::tp(2), mesh::dp(4)),
      .micro_batches = 2,
  };
}
}  // namespace

TEST_CASE("schedules: piecewise-linear weights, constant outside the control points") {
  const weight_schedule s{{10, 0.2}, {20, 0.6}, {40, 0.0}};
  CHECK(evaluate(s, 0) == doctest::Approx(0.2));
  CHECK(evaluate(s, 15) == doctest::Approx(0.4));
  CHECK(evaluate(s, 30) == doctest::Approx(0.3));
  CHECK(evaluate(s, 1000) == doctest::Approx(0.0));
  const auto cfg = three_sources();
  const auto w = weights_at(cfg, 50);
  CHECK(w[0] + w[1] + w[2] == weight_one);
  CHECK(w[0] == 400'000'000);
  CHECK(w[2] == 300'000'000);
}

TEST_CASE("mixture: bad weights and bad configurations are invalid_argument naming the problem") {
  auto cfg = three_sources();
  cfg.sources[0].weight = {{0, 0.5}};
  CHECK_THROWS_WITH_AS(validate(cfg), doctest::Contains("sum to 0.9"), invalid_argument);
  cfg = three_sources();
  cfg.sources[2].weight = {{0, 0.1}, {100, 0.6}};  // sums to 1.1 from step 100 on
  CHECK_THROWS_WITH_AS(validate(cfg), doctest::Contains("at step 100"), invalid_argument);
  cfg = three_sources();
  cfg.sources[1].weight = {{5, 0.3}, {5, 0.3}};
  CHECK_THROWS_WITH_AS(validate(cfg), doctest::Contains("strictly increasing"), invalid_argument);
  cfg = three_sources();
  cfg.sources[1].name = "web";
  CHECK_THROWS_AS(validate(cfg), invalid_argument);
  cfg = three_sources();
  cfg.global_batch = 0;
  CHECK_THROWS_AS(validate(cfg), invalid_argument);
  cfg = three_sources();
  cfg.sources[0].weight = {{0, -0.1}};
  CHECK_THROWS_AS(validate(cfg), invalid_argument);
}

TEST_CASE(
    "mixture: modality and long/short bucket mixes multiply; a group with weight but no source is an error") {
  mixture_config cfg{
      .global_batch = 10,
      .sources =
          {{.name = "txt_s", .paths = {"a"}, .weight = {{0, 3}}, .modality = "text", .bucket = "short"},
           {.name = "txt_s2", .paths = {"a"}, .weight = {{0, 1}}, .modality = "text", .bucket = "short"},
           {.name = "txt_l", .paths = {"a"}, .weight = {{0, 1}}, .modality = "text", .bucket = "long"},
           {.name = "img_s", .paths = {"b"}, .weight = {{0, 1}}, .modality = "image", .bucket = "short"},
           {.name = "img_l", .paths = {"b"}, .weight = {{0, 1}}, .modality = "image", .bucket = "long"}},
      .modalities = {{"image", {{0, 0.4}}}, {"text", {{0, 0.6}}}},
      .buckets = {{"long", {{0, 0.25}}}, {"short", {{0, 0.75}}}},
  };
  validate(cfg);
  const auto w = real_weights_at(cfg, 0);
  CHECK(w[0] == doctest::Approx(0.6 * 0.75 * 0.75));
  CHECK(w[1] == doctest::Approx(0.6 * 0.75 * 0.25));
  CHECK(w[2] == doctest::Approx(0.6 * 0.25));
  CHECK(w[3] == doctest::Approx(0.4 * 0.75));
  CHECK(w[4] == doctest::Approx(0.4 * 0.25));
  cfg.sources.pop_back();
  CHECK_THROWS_WITH_AS(validate(cfg), doctest::Contains("modality 'image' x bucket 'long'"),
                       invalid_argument);
  cfg = {};
  cfg.global_batch = 1;
  cfg.sources = {{.name = "a", .paths = {"a"}, .modality = "audio"}};
  cfg.modalities = {{"text", {{0, 1.0}}}};
  CHECK_THROWS_WITH_AS(validate(cfg), doctest::Contains("not in the modality mix"), invalid_argument);
}

TEST_CASE("mixture: the JSON file and the C++ aggregate are the same value") {
  const auto cfg = three_sources();
  const auto j = mixture_to_json(cfg);
  CHECK(mixture_from_json(j) == cfg);
  CHECK(plan_hash(mixture_from_json(j)) == plan_hash(cfg));
  const auto text = R"({"seed": 42, "global_batch": 37,
    "sources": [{"name": "web", "paths": ["w"], "weight": [[0, 0.6], [100, 0.2]]},
                {"name": "code", "paths": ["c"], "weight": 0.3},
                {"name": "math", "format": "indexed", "paths": ["m"], "weight": [[0, 0.1], [100, 0.5]]}],
    "cost": {"linear": 1, "quadratic": 1}, "layout": {"tp": 2, "dp": 4}, "micro_batches": 2})";
  auto parsed = mixture_from_json(nlohmann::json::parse(text));
  // The layout in any order, with ep: the same mesh as in C++, and it round-trips.
  auto ordered = nlohmann::json::parse(text);
  ordered["layout"] = {{"order", "tp-dp-ep-cp-pp"}, {"tp", 2}, {"dp", 2}, {"ep", 2}};
  const auto with_ep = mixture_from_json(ordered);
  CHECK(with_ep.layout == trainer_mesh(mesh::make_mesh("tp-dp-ep", mesh::tp(2), mesh::dp(2), mesh::ep(2))));
  CHECK(with_ep.layout.dp_size() == 4);
  CHECK(mixture_from_json(mixture_to_json(with_ep)) == with_ep);
  ordered["layout"] = {{"order", "tp-dp"}, {"tp", 2}, {"dp", 2}, {"cp", 2}};  // cp of extent 2, not listed
  CHECK_THROWS_AS((void)mixture_from_json(ordered), invalid_argument);
  auto want = cfg;
  want.sources[1].weight = {{0, 0.3}};
  CHECK(parsed == want);
  CHECK_THROWS_WITH_AS(
      (void)mixture_from_json(nlohmann::json::parse(
          R"({"global_batch": 1, "sources": [{"name": "a", "paths": ["a"], "wieght": 1}]})")),
      doctest::Contains("unknown key \"wieght\""), invalid_argument);
  CHECK_THROWS_AS((void)mixture_from_json(nlohmann::json::parse(
                      R"({"global_batch": 4, "sources": [{"name": "a", "paths": ["a"], "weight": 0.7}]})")),
                  invalid_argument);
  CHECK(fmt::format("{}", cfg).find("3 sources") != std::string::npos);
}

TEST_CASE(
    "planner: realised mixture within one sample of the schedule at every step, exactly once per epoch") {
  for (std::uint64_t trial = 0; trial < 6; ++trial) {
    rng g(trial);
    mixture_config cfg;
    cfg.seed = trial;
    cfg.global_batch = g.uniform(1, 50);
    const int n = static_cast<int>(g.uniform(1, 7));
    std::vector<double> w0(static_cast<std::size_t>(n)), w1(static_cast<std::size_t>(n));
    double s0 = 0, s1 = 0;
    for (int s = 0; s < n; ++s) {
      w0[static_cast<std::size_t>(s)] = g.unit() < 0.2 ? 0.0 : g.unit();
      w1[static_cast<std::size_t>(s)] = g.unit();
      s0 += w0[static_cast<std::size_t>(s)];
      s1 += w1[static_cast<std::size_t>(s)];
    }
    if (s0 == 0) w0[0] = s0 = 1;
    table_meta meta{trial, {}};
    for (int s = 0; s < n; ++s) {
      cfg.sources.push_back({.name = fmt::format("s{}", s),
                             .paths = {"p"},
                             .weight = {{0, w0[static_cast<std::size_t>(s)] / s0},
                                        {40, w1[static_cast<std::size_t>(s)] / s1}}});
      meta.sizes.push_back(g.uniform(1, 60));
    }
    cfg.layout = mesh::make_mesh(mesh::dp(g.uniform(1, 5)));
    cfg.micro_batches = static_cast<int>(g.uniform(1, 3));
    validate(cfg);
    auto st = initial_state(cfg);
    std::vector<double> ideal(static_cast<std::size_t>(n), 0.0);
    std::vector<std::int64_t> realised(static_cast<std::size_t>(n), 0);
    std::map<std::pair<int, std::int64_t>, std::vector<std::int64_t>> drawn;  // (source, epoch) -> indices
    for (int step = 0; step < 80; ++step) {
      const auto planned = plan_step(cfg, st, meta);
      const auto& p = planned.plan;
      REQUIRE(static_cast<std::int64_t>(p.samples.size()) == cfg.global_batch);
      // The batch lookup gives the same plan and state, in at most quota / size + 1 calls per source
      // (a run ends only where an epoch does).
      table_meta_runs batch{meta, 0};
      const auto by_runs = plan_step(cfg, st, batch);
      REQUIRE(by_runs.plan == p);
      REQUIRE(plan_hash(by_runs.plan) == plan_hash(p));
      REQUIRE(by_runs.next == planned.next);
      std::int64_t most_runs = 0;
      for (int s = 0; s < n; ++s)
        if (const auto q = p.quotas[static_cast<std::size_t>(s)]; q > 0)
          most_runs += q / meta.sizes[static_cast<std::size_t>(s)] + 2;
      REQUIRE(batch.runs <= most_runs);
      const auto w = real_weights_at(cfg, step);
      for (int s = 0; s < n; ++s) {
        ideal[static_cast<std::size_t>(s)] +=
            w[static_cast<std::size_t>(s)] * static_cast<double>(cfg.global_batch);
        realised[static_cast<std::size_t>(s)] += p.quotas[static_cast<std::size_t>(s)];
        REQUIRE(std::abs(static_cast<double>(realised[static_cast<std::size_t>(s)]) -
                         ideal[static_cast<std::size_t>(s)]) < 1.0 + 1e-6);
      }
      std::vector<std::int64_t> load(static_cast<std::size_t>(cfg.layout.dp_size()), 0);
      for (const auto& smp : p.samples) {
        drawn[{smp.ref.source, smp.ref.epoch}].push_back(smp.ref.index);
        REQUIRE(smp.dp_rank >= 0);
        REQUIRE(smp.dp_rank < cfg.layout.dp_size());
        REQUIRE(smp.micro_batch < cfg.micro_batches);
        load[static_cast<std::size_t>(smp.dp_rank)] += smp.cost;
      }
      REQUIRE(load == p.rank_cost);
      // Ranks and micro-batches are exactly balance::lpt's, of the step and of each rank's share (the
      // planner sorts once for both).
      std::vector<std::int64_t> costs;
      for (const auto& smp : p.samples) costs.push_back(smp.cost);
      const auto ranks = balance::lpt(costs, cfg.layout.dp_size());
      for (int r = 0; r < cfg.layout.dp_size(); ++r) {
        std::vector<std::int64_t> share;
        std::vector<int> got;
        for (std::size_t i = 0; i < p.samples.size(); ++i) {
          REQUIRE(p.samples[i].dp_rank == ranks.bin_of[i]);
          if (p.samples[i].dp_rank != r) continue;
          share.push_back(p.samples[i].cost);
          got.push_back(p.samples[i].micro_batch);
        }
        REQUIRE(got == balance::lpt(share, cfg.micro_batches).bin_of);
      }
      // The replayed state equals the incrementally advanced one.
      if (step % 20 == 19) REQUIRE(state_at(cfg, step + 1, meta.sizes) == planned.next);
      st = planned.next;
    }
    for (const auto& [key, idx] : drawn) {
      std::set<std::int64_t> uniq(idx.begin(), idx.end());
      REQUIRE(uniq.size() == idx.size());  // nothing twice within an epoch
      const auto size = meta.sizes[static_cast<std::size_t>(key.first)];
      if (key.second < st.cursors[static_cast<std::size_t>(key.first)].epoch)
        REQUIRE(static_cast<std::int64_t>(idx.size()) == size);
    }
  }
}

TEST_CASE(
    "planner: deterministic plans; balancing lowers the largest rank cost; capacity and dry sources are "
    "errors") {
  const auto cfg = three_sources();
  table_meta meta{42, {500, 800, 300}};
  const auto a = plan_step(cfg, initial_state(cfg), meta);
  const auto b = plan_step(cfg, initial_state(cfg), meta);
  CHECK(plan_hash(a.plan) == plan_hash(b.plan));
  CHECK(a.plan == b.plan);
  std::int64_t worst_lpt = 0, worst_rr = 0;
  auto st = initial_state(cfg);
  for (int step = 0; step < 20; ++step) {
    const auto x = plan_step(cfg, st, meta);  // the default partitioner: LPT
    CHECK(x.plan == plan_step(cfg, st, meta, balance::lpt_partition{}).plan);
    const auto y = plan_step(cfg, st, meta, balance::round_robin_partition{});
    CHECK(x.next == y.next);  // the same samples, only placed differently
    const auto check_split = [&]<class P>(P split) {
      CAPTURE(P::name);
      table_meta_runs batch{meta, 0};
      const auto p = plan_step(cfg, st, meta, split);
      CHECK(plan_step(cfg, st, batch, split).plan == p.plan);  // batch lookup: the same plan
      // The planner's fast LPT path (one sort for ranks and micro-batches) and a partitioner's own
      // split give the same shares: recompute each rank's share with split.split on the batch's prices.
      std::vector<std::int64_t> prices;
      for (const auto& smp : p.plan.samples) prices.push_back(smp.cost);
      const auto ranks = split.split(prices, cfg.layout.dp_size());
      CHECK(ranks.load == p.plan.rank_cost);
      for (std::size_t i = 0; i < p.plan.samples.size(); ++i)
        CHECK(p.plan.samples[i].dp_rank == ranks.bin_of[i]);
    };
    check_split(balance::lpt_partition{});
    check_split(balance::karmarkar_karp_partition{});
    check_split(balance::round_robin_partition{});
    worst_lpt += *std::max_element(x.plan.rank_cost.begin(), x.plan.rank_cost.end());
    worst_rr += *std::max_element(y.plan.rank_cost.begin(), y.plan.rank_cost.end());
    st = x.next;
  }
  CHECK(worst_lpt < worst_rr);
  auto cap = cfg;
  cap.max_tokens_per_micro_batch = 100;
  CHECK_THROWS_AS((void)plan_step(cap, initial_state(cap), meta), capacity_error);
  auto dry = cfg;
  dry.sources[2].max_epochs = 1;
  table_meta small{42, {500, 800, 5}};
  st = initial_state(dry);
  try {
    for (int step = 0; step < 10; ++step) st = plan_step(dry, st, small).next;
    FAIL("the source did not run dry");
  } catch (const data_error& e) {
    CHECK(std::string(e.what()).find("'math' ran dry") != std::string::npos);
  }
  table_meta_runs small_runs{small, 0};  // the batch lookup runs dry at the same step, with the same error
  st = initial_state(dry);
  try {
    for (int step = 0; step < 10; ++step) st = plan_step(dry, st, small_runs).next;
    FAIL("the source did not run dry");
  } catch (const data_error& e) {
    CHECK(std::string(e.what()).find("'math' ran dry") != std::string::npos);
  }
}

TEST_CASE("delivery: every rank of a data-parallel index receives its batch, at every pipeline stage") {
  const trainer_mesh t = mesh::make_mesh("tp-cp-dp-pp", mesh::tp(2), mesh::cp(2), mesh::dp(3), mesh::pp(4));
  const auto groups = delivery_plan(t);
  REQUIRE(groups.size() == 3);
  std::set<int> all;
  for (const auto& g : groups) {
    CHECK(g.ranks.front() == g.loader);
    CHECK(g.ranks.size() == 16);  // 4 ranks of each of the 4 stages
    CHECK(g.loader == 4 * g.dp);  // tp = cp = pp = 0
    for (int r : g.ranks) {
      CHECK(all.insert(r).second);
      CHECK((r / 4) % 3 == g.dp);
    }
  }
  CHECK(all.size() == 48);
  const auto one = delivery_of(mesh::make_mesh(mesh::tp(4), mesh::dp(2)), 1);
  CHECK(one.ranks == std::vector<int>{4, 5, 6, 7});
  // Another order: dp fastest.
  const auto two = delivery_of(mesh::make_mesh("dp-tp", mesh::tp(4), mesh::dp(2)), 1);
  CHECK(two.ranks == std::vector<int>{1, 3, 5, 7});
  CHECK_THROWS_AS((void)delivery_of(t, 3), invalid_argument);
}

TEST_CASE("trainer mesh: the data-parallel index flattens ep and dp (ep fastest); one value per mesh") {
  const trainer_mesh t = mesh::make_mesh("tp-ep-dp-pp", mesh::tp(2), mesh::ep(2), mesh::dp(3), mesh::pp(2));
  CHECK(t.world() == 24);
  CHECK(t.dp_size() == 6);
  for (int r = 0; r < 24; ++r) CHECK(t.dp_of(r) == (r / 2) % 6);
  CHECK(trainer_mesh(mesh::make_mesh(mesh::tp(2), mesh::dp(4))) ==
        trainer_mesh(mesh_of_order("tp-cp-ep-dp-pp", {{mesh::tp, 2}, {mesh::dp, 4}})));
  // Decoupled meshes: the data plane delivers by the LLM mesh.
  const auto llm = mesh::make_mesh("dp-tp", mesh::tp(2), mesh::dp(2));
  const trainer_mesh dm = mesh::decoupled(mesh::make_mesh(mesh::dim("esp")(4)), llm,
                                          mesh::topology{.nodes = 1, .devices_per_node = 4});
  CHECK(dm == trainer_mesh(llm));
  CHECK(dm.dp_of(1) == 1);
  CHECK(trainer_mesh().world() == 1);
  CHECK(trainer_mesh().dp_size() == 1);
  CHECK_THROWS_AS((void)mesh_of_order("tp-xx", {{mesh::tp, 2}}), invalid_argument);
  CHECK_THROWS_AS((void)mesh_of_order("tp", {{mesh::tp, 2}, {mesh::dp, 2}}), invalid_argument);
  // A sub-mesh (not over ranks 0..n-1) is refused.
  CHECK_THROWS_AS((void)trainer_mesh(mesh::make_mesh(mesh::tp(2), mesh::dp(2)).submesh({{mesh::tp, 1}})),
                  invalid_argument);
}

TEST_CASE("checkpoint: versioned JSON round trip; another mixture or version is refused") {
  const auto cfg = three_sources();
  table_meta meta{42, {50, 80, 30}};
  auto st = initial_state(cfg);
  for (int i = 0; i < 7; ++i) st = plan_step(cfg, st, meta).next;
  const auto j = checkpoint_to_json(cfg, st);
  CHECK(j["version"] == checkpoint_version);
  CHECK(checkpoint_from_json(cfg, j) == st);
  CHECK(j.dump().size() < 1000);
  auto other = cfg;
  other.seed = 43;
  CHECK_THROWS_AS((void)checkpoint_from_json(other, j), mismatch_error);
  auto moved = cfg;
  moved.sources[0].paths = {"/elsewhere/w"};  // data may move
  CHECK(checkpoint_from_json(moved, j) == st);
  auto j2 = j;
  j2["version"] = 99;
  CHECK_THROWS_AS((void)checkpoint_from_json(cfg, j2), data_error);
}
