// SPDX-License-Identifier: Apache-2.0
// tools/common/hetmesh_tools/args.hpp: the strict argument parser the tools share. Every refusal is a
// usage_error naming the option or argument and what was expected.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../../tools/common/hetmesh_tools/args.hpp"

using namespace hetmesh::tools;
using doctest::Contains;

namespace {
constexpr option_spec opts[] = {{"--per-shard", "N", "samples per shard"},
                                {"--dtype", "uint16|int32", "element type"},
                                {"--verbose", "", "a switch"},
                                {"--traffic", "DIM=BYTES", "repeatable", true}};
constexpr std::string_view names[] = {"IN", "OUT"};
parsed_args parse(std::vector<std::string> a) { return parse_args(a, opts, names); }
}  // namespace

TEST_CASE("args: options anywhere, both spellings, switches, repeatable options, --") {
  const auto a = parse({"--per-shard", "12", "in", "--dtype=int32", "out", "--verbose", "--traffic", "tp=1",
                        "--traffic=dp=2"});
  CHECK(a.positionals() == std::vector<std::string>{"in", "out"});
  CHECK(a.integer("--per-shard", 0, 1, 100) == 12);
  CHECK(a.choice("--dtype", "uint16", {"uint16", "int32"}) == "int32");
  CHECK(a.has("--verbose"));
  CHECK(a.all("--traffic") == std::vector<std::string>{"tp=1", "dp=2"});
  CHECK(a.integer("--absent", 7) == 7);
  const auto b = parse({"--", "-in", "--out"});
  CHECK(b.positionals() == std::vector<std::string>{"-in", "--out"});
}

TEST_CASE("args: unknown options are refused, naming the option and the accepted ones") {
  CHECK_THROWS_WITH_AS(parse({"in", "out", "--bogus"}),
                       Contains("unknown option '--bogus'; expected one of --per-shard"), usage_error);
  CHECK_THROWS_WITH_AS(parse({"in", "out", "--bogus=1"}), Contains("unknown option '--bogus'"), usage_error);
  CHECK_THROWS_AS(parse({"in", "out", "-x"}), hetmesh::invalid_argument);
}

TEST_CASE("args: an option without its value is refused, naming what it expected") {
  CHECK_THROWS_WITH_AS(parse({"in", "out", "--dtype"}),
                       Contains("option --dtype needs a value; expected uint16|int32"), usage_error);
  CHECK_THROWS_WITH_AS(parse({"in", "--per-shard", "--dtype", "int32", "out"}),
                       Contains("option --per-shard needs a value; expected N"), usage_error);
  CHECK_THROWS_WITH_AS(parse({"in", "out", "--verbose=1"}), Contains("--verbose takes no value"),
                       usage_error);
}

TEST_CASE("args: numbers with trailing garbage, fractions or out of range are refused") {
  CHECK_THROWS_WITH_AS((void)parse({"in", "out", "--per-shard", "12abc"}).integer("--per-shard", 1, 1, 100),
                       Contains("option --per-shard '12abc': expected an integer in [1, 100]"), usage_error);
  CHECK_THROWS_WITH_AS((void)parse({"in", "out", "--per-shard", "abc"}).integer("--per-shard", 1, 1, 100),
                       Contains("option --per-shard 'abc'"), usage_error);
  CHECK_THROWS_AS((void)parse({"in", "out", "--per-shard=1.5"}).integer("--per-shard", 1), usage_error);
  CHECK_THROWS_AS((void)parse({"in", "out", "--per-shard= 3"}).integer("--per-shard", 1), usage_error);
  CHECK_THROWS_AS((void)parse({"in", "out", "--per-shard="}).integer("--per-shard", 1), usage_error);
  CHECK_THROWS_WITH_AS((void)parse({"in", "out", "--per-shard", "0"}).integer("--per-shard", 1, 1, 100),
                       Contains("'0': out of range"), usage_error);
  CHECK_THROWS_WITH_AS(
      (void)parse({"in", "out", "--per-shard", "99999999999999999999"}).integer("--per-shard", 1),
      Contains("out of range"), usage_error);
  CHECK(parse_int("-42", "x") == -42);
}

TEST_CASE("args: a value outside the choices, an option twice, stray and missing positionals") {
  CHECK_THROWS_WITH_AS(
      (void)parse({"in", "out", "--dtype", "float"}).choice("--dtype", "int32", {"uint16", "int32"}),
      Contains("option --dtype 'float': expected one of uint16, int32"), usage_error);
  CHECK_THROWS_WITH_AS(parse({"in", "out", "--per-shard", "1", "--per-shard", "2"}),
                       Contains("option --per-shard given twice ('1', then '2')"), usage_error);
  CHECK_THROWS_WITH_AS(parse({"in", "out", "extra"}), Contains("unexpected argument 'extra'; expected 2"),
                       usage_error);
  CHECK_THROWS_WITH_AS(parse({"in"}), Contains("missing argument OUT"), usage_error);
  CHECK_THROWS_WITH_AS(parse({}), Contains("missing argument IN"), usage_error);
}

TEST_CASE("args: parse_into binds options and positionals to variables; the last value of an option counts") {
  std::string out = "default.json", pos;
  int steps = 6;
  std::int64_t bytes = 1;
  double lr = 0.5;
  bool quick = false;
  const bound_option bound[] = {
      {"--out", "FILE", "results", &out},  {"--steps", "N", "steps", &steps, 1, 100},
      {"--bytes", "N", "bytes", &bytes},   {"--lr", "X", "rate", &lr},
      {"--quick", "", "a switch", &quick}, {"DIR", "", "a positional", &pos}};
  parse_into(std::vector<std::string>{}, bound);
  CHECK(out == "default.json");  // not given: the defaults stay
  CHECK(steps == 6);
  CHECK_FALSE(quick);
  parse_into(std::vector<std::string>{"--steps", "3", "d", "--bytes=4294967296", "--lr", "2e-3", "--quick",
                                      "--steps", "4", "--out=o.json"},
             bound);
  CHECK(steps == 4);  // given twice: the last counts
  CHECK(bytes == 4294967296);
  CHECK(lr == 2e-3);
  CHECK(quick);
  CHECK(out == "o.json");
  CHECK(pos == "d");
  CHECK(arguments(0, nullptr).empty());
}

TEST_CASE("args: parse_into refuses, naming the option: range, the target's type, garbage, unknown, extra") {
  int steps = 6;
  double lr = 0.5;
  bool quick = false;
  std::string pos;
  const bound_option bound[] = {{"--steps", "N", "steps", &steps, 1},
                                {"--lr", "X", "rate", &lr},
                                {"--quick", "", "a switch", &quick},
                                {"DIR", "", "a positional", &pos}};
  auto parse_bound = [&](std::vector<std::string> a) { parse_into(a, bound); };
  CHECK_THROWS_WITH_AS(parse_bound({"--steps", "0"}), Contains("option --steps '0': out of range"),
                       usage_error);
  CHECK_THROWS_WITH_AS(parse_bound({"--steps", "4294967296"}),
                       Contains("expected an integer in [1, 2147483647]"),
                       usage_error);  // an int target takes no more than an int holds
  CHECK_THROWS_WITH_AS(parse_bound({"--lr", "1e-3x"}), Contains("option --lr '1e-3x'"), usage_error);
  CHECK_THROWS_WITH_AS(parse_bound({"--quick=yes"}), Contains("option --quick takes no value"), usage_error);
  CHECK_THROWS_WITH_AS(parse_bound({"--stepz", "3"}), Contains("unknown option '--stepz'"), usage_error);
  CHECK_THROWS_WITH_AS(parse_bound({"a", "b"}), Contains("unexpected argument 'b'"), usage_error);
  CHECK_THROWS_WITH_AS(parse_bound({"--steps"}), Contains("option --steps needs a value"), usage_error);
}

TEST_CASE("args: a command without options says so when given one") {
  std::string pos;
  const bound_option bound[] = {{"STEPS", "", "a positional", &pos}};
  CHECK_THROWS_WITH_AS(parse_into(std::vector<std::string>{"--bogus"}, bound),
                       Contains("unknown option '--bogus'; this command takes no options"), usage_error);
}
