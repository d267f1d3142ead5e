// SPDX-License-Identifier: Apache-2.0
// tools/common/hetmesh_tools/args.hpp: the strict argument parser the tools share. Every refusal is a
// usage_error naming the option or argument and what was expected.
#include <doctest/doctest.h>

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
