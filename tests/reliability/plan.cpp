// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan as a user runs it, on bad input (issue 17): the tools' one argument parser (unknown
// options, missing values, trailing garbage, stray positionals, an option twice), options the tool would
// otherwise ignore, resource limits stated up front, and modelled figures that must stay finite. Every
// case exits 2 with one line "hetmesh-plan: error: ..." on stderr that names the option or the line,
// the value and what was expected, and prints nothing on stdout.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "../tools/run_tool.hpp"

using tools_test::scratch_dir;

namespace plan_bad_input {

struct bad {
  std::vector<std::string> args;
  std::string mention;  ///< what the one line must contain (the option, the value, what was expected)
};

void check_all(const std::vector<bad>& cases) {
  for (const auto& b : cases) {
    CAPTURE(fmt::format("{}", fmt::join(b.args, " ")));
    const tools_test::result r = tools_test::run(b.args);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK_MESSAGE(r.one_line_error(), r.err);
    CHECK_MESSAGE(r.err.find(b.mention) != std::string::npos, r.err);
  }
}

std::vector<std::string> zigzag(std::vector<std::string> extra) {
  std::vector<std::string> a{"cp", "--scheme", "zigzag", "--cp", "2", "--seqlen", "8"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace plan_bad_input

using plan_bad_input::check_all;
using plan_bad_input::zigzag;

TEST_CASE("hetmesh-plan: the one argument parser refuses what it cannot read, naming option and value") {
  check_all({
      {zigzag({"--bogus", "1"}), "unknown option '--bogus'; expected one of --scheme"},
      {{"pipeline", "--schedule", "1f1b", "--pp", "2", "--microbatches"},
       "option --microbatches needs a value; expected M"},
      {{"mesh", "--world", "--tp", "8"}, "option --world needs a value; expected N"},
      {{"mesh", "--world", "12abc"}, "option --world '12abc': expected an integer in [1, "},
      {{"pipeline", "--schedule", "1f1b", "--pp", "2.5", "--microbatches", "4"}, "option --pp '2.5'"},
      {{"mesh", "--world="}, "option --world '': expected an integer"},
      {{"mesh", "--world", "99999999999999999999"}, "out of range"},
      {{"mesh", "--world", "8", "stray"}, "unexpected argument 'stray'; expected 0 positional"},
      {{"mesh", "--world", "8", "--world", "16"}, "option --world given twice ('8', then '16')"},
      {{"mesh", "--world", "16", "--traffic", "tp=1", "--traffic", "tp=2"}, "option --traffic given twice"},
      {{"mesh", "--world", "16", "--tp", "8", "--traffic", "tp=1e9,cp=2,tp=5e9"},
       "option --traffic 'tp=1e9,cp=2,tp=5e9': dim tp given twice"},
      {zigzag({"--pad=yes"}), "option --pad takes no value, got 'yes'"},
      {{"mesh", "--world", "16", "--intra-gbps", "5x"}, "option --intra-gbps '5x': expected a finite number"},
      {{"mesh", "--world", "16", "--inter-gbps", "nan"}, "option --inter-gbps 'nan'"},
      {{"mesh", "--world", "16", "--inter-gbps", "inf"}, "option --inter-gbps 'inf'"},
      {{"mesh", "--world", "16", "--inter-gbps", "1e-300"}, "'1e-300': out of range; expected a number in"},
      {{"mesh", "--world", "16", "--tp", "8", "--traffic", "tp=-1"},
       "option --traffic tp=-1: expected bytes"},
      {{"mesh", "--world", "16", "--devices-per-node", "0"}, "option --devices-per-node '0': out of range"},
      {{"pipeline", "--schedule", "1f1b", "--pp", "2", "--microbatches", "0"}, "option --microbatches '0'"},
      {{"cp", "--scheme", "thd", "--cp", "2", "--cu-seqlens", "0,4,8x"},
       "option --cu-seqlens (entry 2) '8x'"},
      {{"pipeline", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--format", "yaml"},
       "option --format 'yaml': this subcommand prints one of json, csv, ascii, table"},
  });
}

TEST_CASE("hetmesh-plan: options it would ignore are refused, naming what they need") {
  const scratch_dir dir;
  const auto w = dir.write("w.txt", "100\n5000\n300\n");
  const std::vector<std::string> cmp{"compare", "--workload", w, "--ranks", "8", "--capacity", "8192"};
  auto with = [&](std::vector<std::string> extra, std::vector<std::string> base = {}) {
    if (base.empty()) base = cmp;
    base.insert(base.end(), extra.begin(), extra.end());
    return base;
  };
  const std::vector<std::string> bal{"balance", "--workload", w, "--ranks", "8", "--capacity", "8192"};
  const std::vector<std::string> sim{"simulate", "--schedule", "1f1b", "--pp", "4", "--workload", w};
  check_all({
      {with({"--context", "100"}),
       "option --context 100: shorter than the longest sample (5000 tokens, sample 1 of"},
      {with({"--strategy", "static_dp_cp", "--context", "100"}, bal), "expected --context >= 5000"},
      {with({"--kv-ratio", "0.5"}), "option --kv-ratio '0.5' applies only with --hidden"},
      {with({"--tflops", "900"}), "option --tflops '900' applies only with --hidden"},
      {with({"--hidden", "4096", "--kv-ratio", "2"}), "option --kv-ratio '2': out of range"},
      {with({"--layers", "1", "--pp", "4"}), "option --layers 1: fewer layers than --pp 4 stages"},
      {with({"--strategies", "random,token_count", "--context", "6000"}),
       "option --context '6000' applies only to strategy static_dp_cp"},
      {with({"--strategy", "random", "--group-size", "2"}, bal),
       "option --group-size '2' applies only to strategy gap_filling_hdp"},
      {with({"--strategies", "bytescale_hdp", "--seed", "3"}),
       "option --seed '3' applies only to strategy random"},
      {with({"--layers", "2"}, sim), "option --layers 2: fewer layers than the schedule's 4 stages"},
      {with({"--schedule", "zbv", "--pp", "2", "--layers", "3"}, {"simulate", "--workload", w}),
       "fewer layers than the schedule's 4 stages"},
      {with({"--width", "50"}, sim), "option --width '50' applies only to --format ascii"},
      {{"pipeline", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--width", "60"},
       "option --width '60' applies only to --format ascii"},
  });
}

TEST_CASE("hetmesh-plan: enormous inputs are refused up front with what they would need") {
  const scratch_dir dir;
  const auto huge = dir.write("huge.txt", "100\n9223372036854775807\n");
  const auto jsonl_huge = dir.write("huge.jsonl", "{\"text\": 18446744073709551615}\n");
  const auto items_huge =
      dir.write("items.jsonl", "{\"text\": 1, \"images\": [1099511627776, 1099511627776]}\n");
  std::string many;
  for (int i = 0; i < 1025; ++i) many += "1099511627776\n";
  const auto total_huge = dir.write("total.txt", many);
  const auto big = dir.write("big.txt", "1099511627776\n");
  const auto w = dir.write("w.txt", "100\n5000\n300\n");
  auto cmp = [](const std::string& f) {
    return std::vector<std::string>{"compare", "--workload", f, "--ranks", "8", "--capacity", "8192"};
  };
  check_all({
      {{"cp", "--scheme", "zigzag", "--cp", "2", "--seqlen", "1099511627776"},
       "option --seqlen: 1099511627776 tokens; the partition lists every token index, about"},
      {{"cp", "--scheme", "thd", "--cp", "2", "--cu-seqlens", "0,4,68719476736"},
       "expected at most 4194304 tokens"},
      {{"cp", "--scheme", "thd", "--cp", "65536", "--cu-seqlens",
        "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33",
        "--pad"},
       "expected at most 4194304 tokens"},
      {{"mesh", "--world", "1073741824"},
       "option --world 1073741824: the mesh lists every rank of every group"},
      {{"mesh", "--world", "1048576", "--tp", "1048576", "--cp", "1048576"},
       "option --cp 1048576: tp*cp*ep*pp = 1099511627776 so far exceeds --world 1048576"},
      {{"mesh", "--world", "1048576", "--tp", "8", "--cp", "4", "--ep", "2", "--pp", "4"},
       "mesh: the layout search would evaluate 629145600 placements (120 orders x 5 dims x 1048576 ranks)"},
      {{"pipeline", "--schedule", "1f1b", "--pp", "65536", "--microbatches", "1048576"},
       "needs about 206158430208 actions"},
      {{"pipeline", "--schedule", "interleaved-1f1b", "--pp", "1024", "--virtual", "1024", "--microbatches",
        "8"},
       "expected at most 2097152 actions"},
      {cmp("/dev/zero"), "workload file '/dev/zero' is a character device; expected a regular file"},
      {cmp(huge), ":2: length 9223372036854775807; expected at most 1099511627776 tokens"},
      {cmp(jsonl_huge), ":1: \"text\" is 18446744073709551615; expected at most 1099511627776"},
      {cmp(items_huge), ":1: the sample has more than 1099511627776 LLM tokens"},
      {cmp(total_huge), ":1025: the workload passes 1125899906842624 tokens in all"},
      {{"simulate", "--schedule", "1f1b", "--pp", "4", "--workload", big, "--hidden", "1048576"},
       "activation bytes on a stage; expected fewer than 2^62"},
      {{"simulate", "--schedule", "1f1b", "--pp", "4", "--workload", w, "--tflops", "1e-300"},
       "option --tflops '1e-300': out of range; expected a number in [0.001, 1e+06]"},
      {{"compare", "--workload", w, "--ranks", "8", "--capacity", "8192", "--hidden", "4096", "--tflops",
        "0"},
       "option --tflops '0': out of range"},
      {{"mesh", "--world", "64", "--tp", "8", "--traffic", "tp=1e300"}, "expected bytes in [0, 1e+14]"},
  });
  // At the edges of the accepted ranges the modelled figures stay finite and positive.
  const tools_test::result edge =
      tools_test::run({"mesh", "--world", "64", "--tp", "8", "--cp", "2", "--traffic",
                       "tp=1e14,cp=1e14,dp=1e14", "--intra-gbps", "1e-3", "--inter-gbps", "1e-3"});
  REQUIRE_MESSAGE(edge.code == 0, edge.err);
  CHECK(edge.json()["search"]["speedup"].get<double>() >= 1.0);
  CHECK(edge.json()["search"]["best"]["time_model_ms"].get<double>() > 0);
  const tools_test::result slow =
      tools_test::run({"simulate", "--schedule", "1f1b", "--pp", "4", "--workload", w, "--tflops", "1e-3"});
  REQUIRE_MESSAGE(slow.code == 0, slow.err);
  const double step = slow.json()["step_time_model_s"].get<double>();
  const double bubble = slow.json()["bubble_ratio"].get<double>();
  CHECK(step > 0);
  CHECK(step < 1e300);
  CHECK(bubble >= 0);
  CHECK(bubble < 1);
}
