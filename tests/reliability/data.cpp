// SPDX-License-Identifier: Apache-2.0
// Bad input to the data plane (issue 17): tampered checkpoints, mistyped mixture JSON, sizes whose
// products or sums leave int64. Each case asserts a typed exception whose message names the field.
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include <hetmesh/balance/workload.hpp>
#include <hetmesh/core/checked.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/data/checkpoint.hpp>
#include <hetmesh/data/loader.hpp>
#include <hetmesh/data/mixture_json.hpp>
#include <hetmesh/data/planner.hpp>

#include "data/fixtures.hpp"

using namespace hetmesh;
using namespace hetmesh::data;
using doctest::Contains;

namespace {

constexpr std::int64_t i64max = std::numeric_limits<std::int64_t>::max();

// Sizes and lengths as pure functions of (seed, source, index).
struct table_meta {
  std::uint64_t seed;
  std::vector<std::int64_t> sizes;
  std::int64_t len_override = 0;
  std::int64_t source_size(int s) const { return sizes[static_cast<std::size_t>(s)]; }
  std::pair<std::int64_t, hetmesh::seq::sample_meta> lookup(int s, std::int64_t, std::int64_t p) const {
    const auto len =
        len_override != 0
            ? len_override
            : 1 + static_cast<std::int64_t>(
                      key_hash({seed, static_cast<std::uint64_t>(s), static_cast<std::uint64_t>(p)}) % 500);
    return {p, hetmesh::seq::sample_meta{.tokens = len, .item_tokens = {}, .bytes = 2 * len}};
  }
};

mixture_config two_sources() {
  return mixture_config{
      .seed = 7,
      .global_batch = 10,
      .sources = {{.name = "web", .paths = {"w"}, .weight = {{0, 0.7}}},
                  {.name = "code", .paths = {"c"}, .weight = {{0, 0.3}}}},
      .cost = {.text = {.a = 1, .b = 1}},
      .layout = hetmesh::mesh::make_mesh(hetmesh::mesh::dp(2)),
      .micro_batches = 2,
  };
}

nlohmann::json good_checkpoint(const mixture_config& cfg) {
  table_meta meta{3, {40, 40}};
  auto st = initial_state(cfg);
  for (int i = 0; i < 3; ++i) st = plan_step(cfg, st, meta).next;
  return checkpoint_to_json(cfg, st);
}

nlohmann::json good_mixture() {
  return nlohmann::json::parse(R"({"seed": 1, "global_batch": 8,
    "sources": [{"name": "a", "paths": ["/x"], "weight": 0.5}, {"name": "b", "paths": ["/y"], "weight": 0.5}],
    "cost": {"linear": 1, "quadratic": 0}, "layout": {"dp": 2}, "micro_batches": 1})");
}

}  // namespace

// ---------------------------------------------------------------------------------------------- checked
TEST_CASE("checked arithmetic: in-range results, overflow_error naming what overflowed") {
  CHECK(checked_add(i64max - 1, 1, "x") == i64max);
  CHECK(checked_mul(-3, 4, "x") == -12);
  CHECK(checked_sub(0, i64max, "x") == -i64max);
  CHECK_THROWS_WITH_AS((void)checked_add(i64max, 1, "token total"), Contains("token total"), overflow_error);
  CHECK_THROWS_WITH_AS((void)checked_mul(std::int64_t{1} << 32, std::int64_t{1} << 31, "bytes of the plan"),
                       Contains("bytes of the plan: 4294967296 x 2147483648 overflows"), overflow_error);
  CHECK_THROWS_AS((void)checked_sub(std::numeric_limits<std::int64_t>::min(), 1, "x"), overflow_error);
  const std::vector<std::int64_t> v{i64max / 2, i64max / 2, 2};
  CHECK_THROWS_WITH_AS((void)checked_sum(v, "lengths"),
                       Contains("lengths: the sum overflows int64 at element 2"),
                       invalid_argument);  // overflow_error is an invalid_argument
}

// ------------------------------------------------------------------------------------------ checkpoints
TEST_CASE("checkpoint: a negative position is refused naming the JSON path") {
  const auto cfg = two_sources();
  auto j = good_checkpoint(cfg);
  j["sources"][0]["position"] = -5;
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j),
                       Contains("checkpoint.sources[0] ('web').position = -5; expected >= 0"), data_error);
}

TEST_CASE("checkpoint: negative epoch and negative step are refused") {
  const auto cfg = two_sources();
  auto j = good_checkpoint(cfg);
  j["sources"][1]["epoch"] = -1;
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("sources[1] ('code').epoch = -1"),
                       data_error);
  j = good_checkpoint(cfg);
  j["step"] = -3;
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("checkpoint.step = -3; expected >= 0"),
                       data_error);
}

TEST_CASE("checkpoint: an epoch past max_epochs is refused") {
  auto cfg = two_sources();
  cfg.sources[0].max_epochs = 2;
  auto j = good_checkpoint(cfg);
  j["sources"][0]["epoch"] = 2;
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("epoch = 2; expected in [0, 2)"),
                       data_error);
}

TEST_CASE("checkpoint: an absurd carry (1e18 as an integer, or as a float) is refused") {
  const auto cfg = two_sources();
  auto j = good_checkpoint(cfg);
  j["sources"][0]["carry"] = std::int64_t{1'000'000'000'000'000'000};
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("('web').carry = 1000000000000000000"),
                       data_error);
  j["sources"][0]["carry"] = 1e18;
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("carry = 1e+18; expected an integer"),
                       data_error);
}

TEST_CASE("checkpoint: carries that do not sum to zero are refused") {
  const auto cfg = two_sources();
  auto j = good_checkpoint(cfg);
  j["sources"][0]["carry"] = j["sources"][0]["carry"].get<std::int64_t>() + 1;
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("carry sum to 1; expected 0"),
                       data_error);
}

TEST_CASE("checkpoint: wrong types name the field instead of json.exception") {
  const auto cfg = two_sources();
  auto j = good_checkpoint(cfg);
  j["step"] = "3";
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j),
                       Contains("checkpoint.step = \"3\"; expected an integer"), data_error);
  j = good_checkpoint(cfg);
  j["sources"][1]["position"] = 1.5;
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("checkpoint.sources[1].position = 1.5"),
                       data_error);
  j = good_checkpoint(cfg);
  j["sources"] = 3;
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j),
                       Contains("checkpoint.sources = 3; expected a list"), data_error);
  j = good_checkpoint(cfg);
  j["sources"][0]["name"] = 5;
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("checkpoint.sources[0].name = 5"),
                       data_error);
  j = good_checkpoint(cfg);
  j["version"] = "1";
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("checkpoint.version"), data_error);
  j = good_checkpoint(cfg);
  j["sources"][0].erase("epoch");
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("checkpoint.sources[0].epoch: missing"),
                       data_error);
  j = good_checkpoint(cfg);
  j["step"] = std::uint64_t{18'000'000'000'000'000'000u};
  CHECK_THROWS_WITH_AS((void)checkpoint_from_json(cfg, j), Contains("expected an integer in int64"),
                       data_error);
}

TEST_CASE("checkpoint file: errors name the file; a tampered file never reaches the reader") {
  const auto cfg = two_sources();
  test::temp_dir dir;
  const auto path = dir / "state.json";
  auto j = good_checkpoint(cfg);
  j["sources"][0]["position"] = -5;
  std::ofstream(path) << j.dump();
  CHECK_THROWS_WITH_AS((void)load_checkpoint(path, cfg), Contains("state.json"), data_error);
  CHECK_THROWS_WITH_AS((void)load_checkpoint(path, cfg), Contains("position = -5"), data_error);
  std::ofstream(path) << "{\"format\": ";
  CHECK_THROWS_WITH_AS((void)load_checkpoint(path, cfg), Contains("invalid JSON"), data_error);
}

TEST_CASE("checkpoint writer: a failed write leaves the previous good file") {
  const auto cfg = two_sources();
  test::temp_dir dir;
  const auto path = dir / "state.json";
  const auto st = checkpoint_from_json(cfg, good_checkpoint(cfg));
  save_checkpoint(path, cfg, st);
  // A failed write: the target is now a non-empty folder, so the rename fails after the temporary was
  // written; the temporary is removed and nothing else changes.
  const auto folder = dir / "as_folder";
  std::filesystem::create_directories(folder + "/x");
  CHECK_THROWS_WITH_AS(save_checkpoint(folder, cfg, initial_state(cfg)), Contains("it is a directory"),
                       data_error);
  CHECK(load_checkpoint(path, cfg) == st);
  std::filesystem::remove_all(folder);
  // A new save replaces the old file whole.
  save_checkpoint(path, cfg, initial_state(cfg));
  CHECK(load_checkpoint(path, cfg) == initial_state(cfg));
  for (const auto& e : std::filesystem::directory_iterator(dir.path))
    CHECK(e.path().filename() == "state.json");  // no temporaries left
}

TEST_CASE("restore and index_at: a position past the source's size is refused before any read") {
  test::temp_dir dir;
  test::make_indexed(dir / "a", 1, 0, 20, 4, 30);
  test::make_indexed(dir / "b", 1, 1, 20, 4, 30);
  mixture_config cfg = two_sources();
  cfg.sources[0].paths = {dir / "a"};
  cfg.sources[1].paths = {dir / "b"};
  data_loader dl(cfg, {.workers = 0, .prefetch_steps = 0});
  auto st = dl.state();
  st.cursors[1].position = 21;
  CHECK_THROWS_WITH_AS(dl.restore(st), Contains("sources[1] ('code').position = 21; expected in [0, 20]"),
                       data_error);
  st.cursors[1].position = -5;
  CHECK_THROWS_WITH_AS(dl.restore(st), Contains("position = -5"), data_error);
  source_loader l(cfg.sources[0], 0, 7);
  CHECK_THROWS_WITH_AS((void)l.index_at(0, -5),
                       Contains("position -5; expected epoch >= 0 and position in [0, 20)"), data_error);
  CHECK_THROWS_AS((void)l.index_at(0, 20), data_error);
  CHECK_THROWS_AS((void)l.index_at(-1, 0), data_error);
  CHECK(l.index_at(0, 19) >= 0);
}

TEST_CASE("plan_step: a hand-made state with a negative position is refused") {
  const auto cfg = two_sources();
  table_meta meta{3, {40, 40}};
  auto st = initial_state(cfg);
  st.cursors[0].position = -2;
  CHECK_THROWS_WITH_AS((void)plan_step(cfg, st, meta), Contains("position = -2"), data_error);
  st = initial_state(cfg);
  st.cursors[0].position = 41;
  CHECK_THROWS_WITH_AS((void)plan_step(cfg, st, meta), Contains("position 41"), data_error);
}

// --------------------------------------------------------------------------------------------- overflow
TEST_CASE("overflow: global_batch near 2^63 is refused by validate with the bound") {
  auto cfg = two_sources();
  cfg.global_batch = i64max - 1;
  CHECK_THROWS_WITH_AS(validate(cfg),
                       Contains("global_batch = 9223372036854775806; expected in [1, 2147483647]"),
                       invalid_argument);
}

TEST_CASE("overflow: a quadratic cost coefficient near 2^63 gives overflow_error naming the sample") {
  auto cfg = two_sources();
  cfg.cost.text.a = i64max / 2;
  table_meta meta{3, {40, 40}};
  CHECK_THROWS_WITH_AS((void)plan_step(cfg, initial_state(cfg), meta), Contains("sample price"),
                       overflow_error);
  CHECK_THROWS_WITH_AS((void)plan_step(cfg, initial_state(cfg), meta), Contains("pricing source 0"),
                       overflow_error);
}

TEST_CASE("overflow: prices that fit one by one but whose sum leaves int64 are refused") {
  auto cfg = two_sources();
  cfg.cost.text = {.a = 0, .b = i64max / 4, .c = 0};
  table_meta meta{3, {40, 40}, 2};  // each sample: 2 tokens, price ~ 2^62
  CHECK_THROWS_WITH_AS((void)plan_step(cfg, initial_state(cfg), meta), Contains("summed price of the batch"),
                       overflow_error);
}

TEST_CASE("overflow: sequence lengths whose sum leaves int64 are refused, not reported negative") {
  auto cfg = two_sources();
  cfg.cost.text = {.a = 0, .b = 0, .c = 0};
  cfg.micro_batches = 1;
  cfg.layout = hetmesh::mesh::make_mesh(hetmesh::mesh::dp(1));
  table_meta meta{3, {40, 40}, i64max / 4};
  CHECK_THROWS_WITH_AS((void)plan_step(cfg, initial_state(cfg), meta), Contains("micro-batch token count"),
                       overflow_error);
}

TEST_CASE("validate: negative cost coefficients and capacity are refused") {
  auto cfg = two_sources();
  cfg.cost.item.b = -1;
  CHECK_THROWS_WITH_AS(validate(cfg), Contains("mixture.cost: item coefficients"), invalid_argument);
  cfg = two_sources();
  cfg.max_tokens_per_micro_batch = -1;
  CHECK_THROWS_WITH_AS(validate(cfg), Contains("max_tokens_per_micro_batch = -1"), invalid_argument);
}

// ----------------------------------------------------------------------------------------- mixture JSON
TEST_CASE("mixture JSON: the good spelling parses") {
  CHECK(mixture_from_json(good_mixture()).global_batch == 8);
}

TEST_CASE("mixture JSON: type errors name the path and field, never json.exception") {
  struct bad {
    const char* pointer;
    nlohmann::json value;
    const char* says;
  };
  const bad cases[] = {
      {"/seed", "seven", "mixture.seed = \"seven\"; expected an integer"},
      {"/seed", -1, "mixture.seed = -1; expected a non-negative integer"},
      {"/global_batch", 8.5, "mixture.global_batch = 8.5; expected an integer"},
      {"/sources/1/name", 3, "mixture.sources[1].name = 3; expected a string"},
      {"/sources/0/paths", "/x", "mixture.sources[0].paths = \"/x\"; expected a list of strings"},
      {"/sources/0/paths/0", 1, "mixture.sources[0].paths = [1]; expected a list of strings"},
      {"/sources/0/min_tokens", "10", "mixture.sources[0].min_tokens = \"10\"; expected an integer"},
      {"/sources/1/max_epochs", 1.5, "mixture.sources[1].max_epochs = 1.5"},
      {"/sources/0/format", 2, "mixture.sources[0].format = 2; expected a string"},
      {"/sources/0/modality", nullptr, "mixture.sources[0].modality = null"},
      {"/cost/quadratic", "big", "mixture.cost.quadratic = \"big\""},
      {"/layout/dp", 4294967296LL, "mixture.layout.dp = 4294967296; expected an integer in range"},
      {"/micro_batches", true, "mixture.micro_batches = true"},
      {"/balance", "lpt", "mixture.balance: the load-time balancer is no longer a mixture field"},
      {"/sources/0/weight", "half", "mixture.sources[0].weight: a weight is a number or a list"},
      {"/sources/0/weight", nlohmann::json::parse("[[0.5, 1]]"), "is not a [step, weight] pair"},
      {"/sources", nlohmann::json::object(), "mixture.sources = {}; expected a list of sources"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.pointer);
    auto j = good_mixture();
    j[nlohmann::json::json_pointer(c.pointer)] = c.value;
    CHECK_THROWS_WITH_AS((void)mixture_from_json(j), Contains(c.says), invalid_argument);
    try {
      (void)mixture_from_json(j);
    } catch (const std::exception& e) {
      CHECK(std::string(e.what()).find("json.exception") == std::string::npos);
    }
  }
}

TEST_CASE("mixture JSON: a missing required field is named") {
  auto j = good_mixture();
  j.erase("global_batch");
  CHECK_THROWS_WITH_AS((void)mixture_from_json(j), Contains("mixture.global_batch: missing"),
                       invalid_argument);
  j = good_mixture();
  j["sources"][0].erase("paths");
  CHECK_THROWS_WITH_AS((void)mixture_from_json(j), Contains("mixture.sources[0].paths: missing"),
                       invalid_argument);
}

// ---------------------------------------------------------------------------------------- length lists
TEST_CASE("length lists: lengths whose total leaves int64 are refused naming the file and line") {
  std::istringstream in("4611686018427387904\n4611686018427387904\n");
  CHECK_THROWS_WITH_AS((void)balance::read_lengths(in, "big.txt"),
                       Contains("big.txt:2: the total of the lengths"), overflow_error);
  const std::vector<std::int64_t> lens{i64max / 2 + 1};
  CHECK_THROWS_WITH_AS((void)balance::sample_batch(lens, i64max, 1),
                       Contains("sample_batch: the batch's total"), overflow_error);
  const std::vector<std::int64_t> bad{4, -2};
  CHECK_THROWS_WITH_AS((void)balance::sample_batch(bad, 10, 1), Contains("lengths[1] = -2"),
                       invalid_argument);
}
