// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan end to end: each subcommand is run as a child process on small inputs; the JSON it
// prints is checked against properties and independent formulas (not against recorded output), and
// bad input must give exit code 2 with a one-line error on stderr.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "run_tool.hpp"

using tools_test::result;
using tools_test::run;
using tools_test::scratch_dir;

namespace {

std::vector<std::int64_t> iota_range(std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(hi - lo));
  std::iota(v.begin(), v.end(), lo);
  return v;
}

// Megatron-LM / TransformerEngine zigzag, written from the rule: a document at `offset` of padded
// length `len` is cut into 2cp chunks; rank r holds chunk r, then chunk 2cp-1-r.
void append_zigzag(std::vector<std::int64_t>& out, std::int64_t offset, std::int64_t len, int cp, int r) {
  const std::int64_t c = len / (2 * cp);
  for (auto i : iota_range(offset + r * c, offset + (r + 1) * c)) out.push_back(i);
  for (auto i : iota_range(offset + (2 * cp - 1 - r) * c, offset + (2 * cp - r) * c)) out.push_back(i);
}

void check_bad_input(const std::vector<std::string>& args, const std::string& must_mention = "") {
  CAPTURE(fmt::format("{}", fmt::join(args, " ")));
  const result r = run(args);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK_MESSAGE(r.one_line_error(), r.err);
  if (!must_mention.empty()) CHECK_MESSAGE(r.err.find(must_mention) != std::string::npos, r.err);
}

}  // namespace

TEST_CASE("hetmesh-plan: help, unknown commands and options") {
  const result top = run({"--help"});
  CHECK(top.code == 0);
  for (const std::string cmd : {"mesh", "cp", "pipeline", "simulate", "compare", "balance"}) {
    CAPTURE(cmd);
    CHECK(top.out.find(std::string("  ") + cmd + " ") != std::string::npos);
    const result h = run({cmd, "--help"});
    CHECK(h.code == 0);
    CHECK(h.out.rfind(std::string("usage: hetmesh-plan ") + cmd, 0) == 0);
    CHECK(h.out.find("--format") != std::string::npos);
    CHECK(h.out.find("example") != std::string::npos);
    const result h2 = run({"help", cmd});
    CHECK(h2.code == 0);
    CHECK(h2.out == h.out);
  }
  const result none = run({});
  CHECK(none.code == 2);
  CHECK(none.err.find("usage:") != std::string::npos);
  check_bad_input({"frobnicate"}, "unknown command 'frobnicate'");
  check_bad_input({"cp", "--scheme", "zigzag", "--cp", "2", "--seqlen", "8", "--bogus", "1"}, "--bogus");
  check_bad_input({"cp", "--scheme", "zigzag", "--cp", "2", "--seqlen"}, "needs a value");
  check_bad_input({"cp", "--scheme", "zigzag", "--cp", "two", "--seqlen", "8"},
                  "option --cp 'two': expected an integer");
  check_bad_input({"cp", "--scheme", "zigzag", "--cp", "2", "--cp", "4", "--seqlen", "8"}, "given twice");
  check_bad_input({"cp", "--cp", "2", "--seqlen", "8"}, "--scheme");
  check_bad_input({"cp", "--scheme", "zigzag", "--cp", "2", "--seqlen", "8", "--format", "csv"}, "--format");
  check_bad_input({"cp", "--scheme", "zigzag", "--cp", "2", "--seqlen", "8", "positional"},
                  "unexpected argument");
}

TEST_CASE("hetmesh-plan cp: zigzag matches Megatron-LM's chunks and assigns every token once") {
  for (const int cp : {1, 2, 3, 4, 8}) {
    for (const std::int64_t k : {1, 3, 5}) {
      const std::int64_t seqlen = 2 * cp * k;
      CAPTURE(cp);
      CAPTURE(seqlen);
      const result r =
          run({"cp", "--scheme", "zigzag", "--cp", std::to_string(cp), "--seqlen", std::to_string(seqlen)});
      REQUIRE(r.code == 0);
      CHECK(r.err.empty());
      const auto j = r.json();
      CHECK(j["scheme"] == "zigzag");
      CHECK(j["cp"] == cp);
      REQUIRE(j["ranks"].size() == static_cast<std::size_t>(cp));
      std::vector<std::int64_t> all;
      for (int rank = 0; rank < cp; ++rank) {
        const auto& e = j["ranks"][static_cast<std::size_t>(rank)];
        CHECK(e["rank"] == rank);
        const auto idx = e["indices"].get<std::vector<std::int64_t>>();
        std::vector<std::int64_t> expected;
        append_zigzag(expected, 0, seqlen, cp, rank);
        CHECK(idx == expected);
        all.insert(all.end(), idx.begin(), idx.end());
      }
      std::sort(all.begin(), all.end());
      CHECK(all == iota_range(0, seqlen));
    }
  }
}

TEST_CASE("hetmesh-plan cp: thd per document, with TransformerEngine's padding") {
  const std::vector<std::int64_t> lengths{5, 7, 16, 1, 12};
  for (const int cp : {1, 2, 4}) {
    CAPTURE(cp);
    std::string cu = "0";
    std::int64_t at = 0;
    for (auto l : lengths) {  // not `"," + std::to_string(...)`: a g++ 12 -O3 -Wrestrict false positive
      cu += ',';
      cu += std::to_string(at += l);
    }
    const result r = run({"cp", "--scheme", "thd", "--cp", std::to_string(cp), "--cu-seqlens", cu, "--pad"});
    REQUIRE(r.code == 0);
    const auto j = r.json();
    // Each document padded at its own end to a multiple of 2cp.
    std::vector<std::int64_t> padded{0};
    for (auto l : lengths) padded.push_back(padded.back() + (l + 2 * cp - 1) / (2 * cp) * (2 * cp));
    CHECK(j["cu_seqlens_padded"].get<std::vector<std::int64_t>>() == padded);
    REQUIRE(j["ranks"].size() == static_cast<std::size_t>(cp));
    std::vector<std::int64_t> all;
    for (int rank = 0; rank < cp; ++rank) {
      std::vector<std::int64_t> expected;
      for (std::size_t d = 0; d < lengths.size(); ++d)
        append_zigzag(expected, padded[d], padded[d + 1] - padded[d], cp, rank);
      const auto idx = j["ranks"][static_cast<std::size_t>(rank)]["indices"].get<std::vector<std::int64_t>>();
      CHECK(idx == expected);
      all.insert(all.end(), idx.begin(), idx.end());
    }
    std::sort(all.begin(), all.end());
    CHECK(all == iota_range(0, padded.back()));
  }
  // Without --pad, lengths 2cp divides are split as they are and no padded offsets are printed.
  const result ok = run({"cp", "--scheme", "thd", "--cp", "2", "--cu-seqlens", "0,8,12", "--format", "json"});
  REQUIRE(ok.code == 0);
  const auto j = ok.json();
  CHECK_FALSE(j.contains("cu_seqlens_padded"));
  CHECK(j["ranks"][0]["indices"].get<std::vector<std::int64_t>>() ==
        std::vector<std::int64_t>{0, 1, 6, 7, 8, 11});
  // The table view prints the same partition, one row per rank.
  const result t = run({"cp", "--scheme", "thd", "--cp", "2", "--cu-seqlens", "0,8,12", "--format", "table"});
  REQUIRE(t.code == 0);
  CHECK(t.out.find("0-1,6-8,11") != std::string::npos);
}

TEST_CASE("hetmesh-plan cp: inputs a scheme cannot split exit 2") {
  check_bad_input({"cp", "--scheme", "thd", "--cp", "2", "--cu-seqlens", "0,5,12"}, "multiple of 2*cp");
  check_bad_input({"cp", "--scheme", "thd", "--cp", "2", "--cu-seqlens", "0,5,12"}, "pass --pad");
  check_bad_input({"cp", "--scheme", "zigzag", "--cp", "4", "--seqlen", "12"}, "multiple of 2*cp");
  check_bad_input({"cp", "--scheme", "zigzag", "--cp", "0", "--seqlen", "8"}, "--cp");
  check_bad_input({"cp", "--scheme", "thd", "--cp", "2", "--cu-seqlens", "1,5"}, "start at 0");
  check_bad_input({"cp", "--scheme", "thd", "--cp", "2", "--cu-seqlens", "0,8,4"}, "decreases");
  check_bad_input({"cp", "--scheme", "thd", "--cp", "2", "--cu-seqlens", "0,x"}, "expected an integer");
  check_bad_input({"cp", "--scheme", "thd", "--cp", "2", "--seqlen", "8"}, "--cu-seqlens");
  check_bad_input({"cp", "--scheme", "ring", "--cp", "2", "--seqlen", "8"}, "expected one of");
}

TEST_CASE("hetmesh-plan mesh: groups partition the world along every dim") {
  const int world = 64, dpn = 8;
  const result r =
      run({"mesh", "--world", "64", "--tp", "8", "--cp", "2", "--pp", "2", "--devices-per-node", "8"});
  REQUIRE(r.code == 0);
  const auto j = r.json();
  CHECK(j["world"] == world);
  CHECK(j["order"] == "tp-cp-ep-dp-pp");
  std::int64_t product = 1;
  std::int64_t expected_stride = 1;
  for (const auto& d : j["dims"]) {
    CAPTURE(d["name"].get<std::string>());
    const auto extent = d["extent"].get<std::int64_t>();
    product *= extent;
    // Megatron order: each dim's stride is the product of the faster dims' extents.
    CHECK(d["stride"] == expected_stride);
    expected_stride *= extent;
    std::vector<int> seen;
    bool intra = true;
    for (const auto& g : d["groups"]) {
      const auto ranks = g.get<std::vector<int>>();
      REQUIRE(ranks.size() == static_cast<std::size_t>(extent));
      for (std::size_t i = 0; i < ranks.size(); ++i)
        CHECK(ranks[i] == ranks[0] + static_cast<int>(i) * d["stride"].get<int>());
      if (ranks.front() / dpn != ranks.back() / dpn) intra = false;
      seen.insert(seen.end(), ranks.begin(), ranks.end());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int> everyone(world);
    std::iota(everyone.begin(), everyone.end(), 0);
    CHECK(seen == everyone);
    CHECK(d["intra_node"] == intra);
  }
  CHECK(product == world);
  // The layout search ranks the orders of tp, cp, dp, pp (extent > 1) against the given order.
  const auto& search = j["search"];
  CHECK(search["orders"] == 24);
  CHECK(search["baseline"]["order"] == "tp-cp-dp-pp");
  CHECK(search["best"]["time_model_ms"].get<double>() <= search["baseline"]["time_model_ms"].get<double>());
  CHECK(search["speedup"].get<double>() >= 1.0);
  CHECK(search["reasons"].size() >= 1);
  CHECK(search["reasons"][0].get<std::string>().find("best order") != std::string::npos);
  // With traffic only along dp, the best order keeps dp's groups inside one node (the baseline
  // puts them across nodes), and says so.
  const result dp_heavy =
      run({"mesh", "--world", "64", "--tp", "8", "--cp", "2", "--pp", "2", "--traffic", "dp=1e10"});
  REQUIRE(dp_heavy.code == 0);
  const auto heavy = dp_heavy.json()["search"];
  const auto dp_of = [](const nlohmann::json& cand) -> nlohmann::json {
    for (const auto& d : cand["dims"])
      if (d["name"] == "dp") return d;
    return nullptr;
  };
  CHECK(dp_of(heavy["best"])["in_node"] == true);
  CHECK(dp_of(heavy["baseline"])["in_node"] == false);
  CHECK(heavy["speedup"].get<double>() > 1.0);
  CHECK(heavy["reasons"].dump().find("dp") != std::string::npos);
  // dp is derived from the world: 64 / (8 * 2 * 2) = 2.
  const auto dp =
      std::find_if(j["dims"].begin(), j["dims"].end(), [](const auto& d) { return d["name"] == "dp"; });
  REQUIRE(dp != j["dims"].end());
  CHECK((*dp)["extent"] == 2);

  const result t = run({"mesh", "--world", "16", "--tp", "8", "--order", "tp-dp", "--format", "table"});
  REQUIRE(t.code == 0);
  CHECK(t.out.find("0,1,2,3,4,5,6,7") != std::string::npos);

  check_bad_input({"mesh", "--world", "60", "--tp", "8"}, "divisible");
  check_bad_input({"mesh", "--world", "64", "--tp", "8", "--dp", "4"}, "64");
  check_bad_input({"mesh", "--world", "16", "--tp", "8", "--order", "tp-xx"}, "xx");
  check_bad_input({"mesh", "--world", "16", "--tp", "8", "--order", "cp-tp"}, "dp");
  check_bad_input({"mesh", "--world", "16", "--tp", "-8"}, "--tp");
  check_bad_input({"mesh", "--world", "16", "--tp", "8", "--traffic", "xx=5"}, "unknown dim 'xx'");
  check_bad_input({"mesh", "--world", "16", "--tp", "8", "--traffic", "tp"}, "DIM=BYTES");
  check_bad_input({"mesh", "--world", "12", "--tp", "4", "--devices-per-node", "8"}, "whole number of nodes");
  check_bad_input({"mesh", "--world", "16", "--etp", "2"}, "--moe");
}

TEST_CASE("hetmesh-plan mesh --moe: Megatron-LM's decoder and expert groups, its refusals, many shapes") {
  // 16 ranks, tp = cp = pp = 2, ep = 4, etp = 1 (values recorded from megatron-core 0.16.1; the full
  // comparison is scripts/peers/mesh_vs_megatron.py).
  const result r = run(
      {"mesh", "--moe", "--world", "16", "--tp", "2", "--cp", "2", "--pp", "2", "--ep", "4", "--etp", "1"});
  REQUIRE(r.code == 0);
  const auto j = r.json();
  CHECK(j["sizes"]["dp"] == 2);
  CHECK(j["sizes"]["edp"] == 2);
  std::map<std::string, std::vector<std::vector<int>>> fam;
  for (const auto& f : j["families"])
    fam[f["name"].get<std::string>()] = f["groups"].get<std::vector<std::vector<int>>>();
  CHECK(fam.size() == 17);
  CHECK(fam["DATA_PARALLEL_GROUP_WITH_CP"].front() == std::vector<int>{0, 2, 4, 6});
  CHECK(fam["EXPERT_MODEL_PARALLEL_GROUP"].front() == std::vector<int>{0, 1, 2, 3});
  CHECK(fam["EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP"].front() ==
        std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(fam["EXPERT_DATA_PARALLEL_GROUP"].front() == std::vector<int>{0, 4});
  CHECK(fam["MODEL_PARALLEL_GROUP"].front() == std::vector<int>{0, 1, 8, 9});

  const result t = run({"mesh", "--moe", "--world", "16", "--tp", "2", "--ep", "4", "--format", "table"});
  REQUIRE(t.code == 0);
  CHECK(t.out.find("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP") != std::string::npos);
  CHECK(t.out.find("etp=2 ep=4 edp=2") != std::string::npos);  // etp defaults to tp, as in Megatron

  check_bad_input({"mesh", "--moe", "--world", "16", "--tp", "4", "--pp", "2", "--ep", "2", "--etp", "1",
                   "--order", "tp-cp-ep-pp-dp"},
                  "when not using pp-last rank ordering");
  check_bad_input({"mesh", "--moe", "--world", "12", "--tp", "2", "--pp", "2", "--ep", "2"},
                  "expert_tensor_model_pipeline_parallel");
  check_bad_input({"mesh", "--moe", "--world", "10", "--tp", "4"}, "is not divisible by tp*pp*cp");
  check_bad_input({"mesh", "--moe", "--world", "16", "--tp", "2", "--dp", "4"},
                  "dp = world / (tp*cp*pp) = 8");

  // --shapes: one JSON object per line in and out; a refused shape says why and the rest still print.
  scratch_dir dir;
  const std::string path =
      dir.write("shapes.jsonl",
                "{\"world\": 8, \"tp\": 2, \"ep\": 2, \"etp\": 1}\n"
                "{\"world\": 10, \"tp\": 4}\n"
                "{\"world\": 16, \"tp\": 2, \"cp\": 2, \"pp\": 2, \"ep\": 4, \"etp\": 1, "
                "\"order\": \"tp-cp-ep-pp-dp\"}\n");
  const result s = run({"mesh", "--moe", "--shapes", path});
  REQUIRE(s.code == 0);
  std::istringstream lines(s.out);
  std::vector<nlohmann::json> docs;
  for (std::string line; std::getline(lines, line);) docs.push_back(nlohmann::json::parse(line));
  REQUIRE(docs.size() == 3);
  CHECK(docs[0]["sizes"]["edp"] == 4);
  CHECK(docs[1]["refused"].get<std::string>().find("world_size (10)") != std::string::npos);
  CHECK(docs[2]["order"] == "tp-cp-ep-pp-dp");
  check_bad_input({"mesh", "--moe", "--shapes", (dir.path / "missing.jsonl").string()}, "cannot open");
}

namespace {
// A compute action in PyTorch's notation, <stage><F|B|I|W><microbatch>, parsed by hand (std::regex
// trips a GCC 12 -Wmaybe-uninitialized false positive under the sanitizer build).
struct parsed_action {
  int stage;
  char type;
  int mb;
};
std::optional<parsed_action> parse_action(const std::string& t) {
  std::size_t i = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  if (i == 0 || i + 1 >= t.size() || std::string("FBIW").find(t[i]) == std::string::npos) return std::nullopt;
  const std::size_t j = i + 1;
  for (std::size_t k = j; k < t.size(); ++k)
    if (!std::isdigit(static_cast<unsigned char>(t[k]))) return std::nullopt;
  return parsed_action{std::stoi(t.substr(0, i)), t[i], std::stoi(t.substr(j))};
}
}  // namespace

TEST_CASE("hetmesh-plan pipeline: every schedule runs each micro-batch through each stage once") {
  for (const std::string name :
       {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "interleaved-zero-bubble", "zbv", "looped-bfs"}) {
    for (const int pp : {2, 4}) {
      const int m = 8;
      CAPTURE(name);
      CAPTURE(pp);
      const std::vector<std::string> base{
          "pipeline", "--schedule", name, "--pp", std::to_string(pp), "--microbatches", std::to_string(m)};
      const result r = run(base);
      REQUIRE_MESSAGE(r.code == 0, r.err);
      const auto j = r.json();
      CHECK(j["schedule"] == name);
      CHECK(j["pp"] == pp);
      REQUIRE(j["ranks"].size() == static_cast<std::size_t>(pp));
      const auto stage_to_rank = j["stage_to_rank"].get<std::vector<int>>();
      const int stages = static_cast<int>(stage_to_rank.size());
      CHECK(stages % pp == 0);
      // count[type][stage][mb]
      std::map<char, std::vector<std::vector<int>>> count;
      for (char t : std::string("FBIW"))
        count[t].assign(static_cast<std::size_t>(stages), std::vector<int>(m, 0));
      for (int rank = 0; rank < pp; ++rank) {
        std::set<std::pair<int, int>> forwarded;
        for (const auto& a : j["ranks"][static_cast<std::size_t>(rank)]) {
          const std::string text = a.get<std::string>();
          const auto pa = parse_action(text);
          REQUIRE_MESSAGE(pa.has_value(), text);
          const int st = pa->stage, mb = pa->mb;
          const char type = pa->type;
          REQUIRE(st < stages);
          REQUIRE(mb < m);
          CHECK(stage_to_rank[static_cast<std::size_t>(st)] == rank);
          if (type == 'F') forwarded.insert({st, mb});
          if (type != 'F') CHECK_MESSAGE(forwarded.count({st, mb}) == 1, text, " before its forward");
          ++count[type][static_cast<std::size_t>(st)][static_cast<std::size_t>(mb)];
        }
      }
      for (int st = 0; st < stages; ++st) {
        for (int mb = 0; mb < m; ++mb) {
          const auto at = [&](char t) {
            return count[t][static_cast<std::size_t>(st)][static_cast<std::size_t>(mb)];
          };
          CHECK(at('F') == 1);
          CHECK(((at('B') == 1 && at('I') == 0 && at('W') == 0) ||
                 (at('B') == 0 && at('I') == 1 && at('W') == 1)));
        }
      }
      // CSV: one row per rank; its compute fields are the JSON list, in order.
      auto csv_args = base;
      csv_args.insert(csv_args.end(), {"--format", "csv"});
      const result c = run(csv_args);
      REQUIRE(c.code == 0);
      std::vector<std::string> lines;
      std::istringstream in(c.out);
      for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(line);
      }
      REQUIRE(lines.size() == static_cast<std::size_t>(pp));
      for (int rank = 0; rank < pp; ++rank) {
        std::vector<std::string> fields;
        std::istringstream row(lines[static_cast<std::size_t>(rank)]);
        for (std::string f; std::getline(row, f, ',');)
          if (parse_action(f)) fields.push_back(f);
        CHECK(fields == j["ranks"][static_cast<std::size_t>(rank)].get<std::vector<std::string>>());
      }
      // table: PyTorch's step grid, one column per rank; ascii: a simulated timeline, one row per rank.
      auto grid = base;
      grid.insert(grid.end(), {"--format", "table"});
      const result g = run(grid);
      CHECK(g.code == 0);
      CHECK(g.out.find("Rank " + std::to_string(pp - 1)) != std::string::npos);
      CHECK(g.out.find("0F0") != std::string::npos);
      auto ascii = base;
      ascii.insert(ascii.end(), {"--format", "ascii", "--width", "60"});
      const result a = run(ascii);
      CHECK(a.code == 0);
      for (int rank = 0; rank < pp; ++rank) {
        const auto at = a.out.find("rank " + std::to_string(rank) + " |");
        REQUIRE(at != std::string::npos);
        const auto bar = a.out.find('|', at);
        CHECK(a.out.find('|', bar + 1) == bar + 61);  // exactly --width columns
      }
    }
  }
  // Interleaved schedules take --virtual: stages = pp * virtual.
  const result v = run(
      {"pipeline", "--schedule", "interleaved-1f1b", "--pp", "2", "--microbatches", "4", "--virtual", "3"});
  REQUIRE(v.code == 0);
  CHECK(v.json()["stage_to_rank"].size() == 6);
  check_bad_input({"pipeline", "--schedule", "2f2b", "--pp", "2", "--microbatches", "4"}, "expected one of");
  check_bad_input({"pipeline", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--virtual", "2"},
                  "virtual");
  // interleaved-1f1b: PyTorch's rule by default (M < pp and M = 6 over pp = 4 accepted, M = 9 refused);
  // --group-size picks Megatron-LM's rule, which refuses 6 over pp = 4.
  for (const char* m : {"2", "6"})
    CHECK(run({"pipeline", "--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", m}).code == 0);
  check_bad_input({"pipeline", "--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "9"},
                  "multiple of the number of rounds");
  check_bad_input(
      {"pipeline", "--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "6", "--group-size", "4"},
      "group size");
  // zero-bubble = interleaved-zero-bubble --virtual 1: both refuse pp = 2, M = 5 (PyTorch's rounds).
  check_bad_input({"pipeline", "--schedule", "zero-bubble", "--pp", "2", "--microbatches", "5"},
                  "multiple of the number of rounds");
  check_bad_input({"pipeline", "--schedule", "interleaved-zero-bubble", "--pp", "2", "--microbatches", "5",
                   "--virtual", "1"},
                  "multiple of the number of rounds");
  check_bad_input(
      {"pipeline", "--schedule", "looped-bfs", "--pp", "2", "--microbatches", "4", "--group-size", "2"},
      "--group-size");
  check_bad_input({"pipeline", "--schedule", "1f1b", "--pp", "0", "--microbatches", "4"}, "--pp");
}

TEST_CASE("hetmesh-plan pipeline --lowered: SEND/RECV in the JSON; PyTorch's compute_comms CSV with waits") {
  const std::vector<std::string> base{"pipeline",       "--schedule", "interleaved-1f1b", "--pp", "2",
                                      "--microbatches", "4",          "--lowered"};
  const result j = run(base);
  REQUIRE_MESSAGE(j.code == 0, j.err);
  const auto ranks = j.json()["ranks"];
  REQUIRE(ranks.size() == 2);
  const auto row0 = ranks[0].get<std::vector<std::string>>();
  CHECK(std::count(row0.begin(), row0.end(), "0SEND_F0") == 1);
  CHECK(std::count(row0.begin(), row0.end(), "0REDUCE_GRAD") == 1);
  auto csv_args = base;
  csv_args.insert(csv_args.end(), {"--format", "csv"});
  const result c = run(csv_args);
  REQUIRE_MESSAGE(c.code == 0, c.err);
  std::istringstream in(c.out);
  int rows = 0;
  for (std::string line; std::getline(in, line); ++rows) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::vector<std::string> fields;
    std::istringstream row(line);
    for (std::string f; std::getline(row, f, ',');) fields.push_back(f);
    // JSON's actions in order, each send retired by one later wait, each reduction by its wait.
    std::vector<std::string> kept;
    std::map<std::string, int> open;
    for (const auto& f : fields) {
      const auto send = f.find("SEND_"), wait = f.find("WAIT_");
      if (wait != std::string::npos) {
        if (f.find("REDUCE_GRAD") != std::string::npos) {
          CHECK(f.substr(0, f.find('W')) + "REDUCE_GRAD" == kept.back());
        } else {
          const std::string key = f.substr(0, wait) + f.substr(wait + 5);  // "0WAIT_SEND_F1" -> "0SEND_F1"
          CHECK_MESSAGE(open[key]-- == 1, f);
        }
        continue;
      }
      if (send != std::string::npos) ++open[f];
      kept.push_back(f);
    }
    for (const auto& [k, n] : open) CHECK_MESSAGE(n == 0, k);
    CHECK(kept == ranks[static_cast<std::size_t>(rows)].get<std::vector<std::string>>());
  }
  CHECK(rows == 2);
}

namespace {

// A deterministic mixed workload: mostly short documents and a few longer than the capacity.
std::vector<std::int64_t> test_lengths() {
  std::vector<std::int64_t> out;
  std::uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 120; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out.push_back(i % 23 == 5 ? 9000 + static_cast<std::int64_t>(x % 12000)
                              : 64 + static_cast<std::int64_t>(x % 3000));
  }
  return out;
}

std::string lines_of(const std::vector<std::int64_t>& v) {
  std::string s = "# test workload\n";
  for (auto l : v) s += std::to_string(l) + "\n";
  return s;
}

}  // namespace

TEST_CASE("hetmesh-plan compare: five strategies, consistent numbers, independent traffic model") {
  const scratch_dir dir;
  const auto lengths = test_lengths();
  const auto file = dir.write("w.txt", lines_of(lengths));
  const std::int64_t cap = 4096, layers = 32;
  const double kv = 4096.0;  // default model: ByteScale's 7B-class layer, GQA KV bytes per token
  const result r = run(
      {"compare", "--workload", file, "--ranks", "8", "--capacity", std::to_string(cap), "--repeat", "1"});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto j = r.json();
  CHECK(j["workload"] == file);
  CHECK(j["ranks"] == 8);
  const std::int64_t total = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
  CHECK(j["config"]["tokens"] == total);
  CHECK(j["config"]["samples"] == lengths.size());
  const std::vector<std::string> names{"random", "token_count", "static_dp_cp", "bytescale_hdp",
                                       "gap_filling_hdp"};
  REQUIRE(j["strategies"].size() == names.size());
  // Ring traffic, from the rule: a sequence longer than C runs on ceil(s / C) ranks (no offloading);
  // static_dp_cp puts every token on a ring of cp = ceil(longest / C) ranks.
  double hdp_bytes = 0;
  std::int64_t longest = 0;
  for (auto s : lengths) {
    longest = std::max(longest, s);
    if (s > cap)
      hdp_bytes += 3.0 * layers * static_cast<double>((s + cap - 1) / cap - 1) * kv * static_cast<double>(s);
  }
  const double static_bytes =
      3.0 * layers * static_cast<double>((longest + cap - 1) / cap - 1) * kv * static_cast<double>(total);
  const double lb = j["lower_bound_model_s"].get<double>();
  CHECK(lb > 0);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& s = j["strategies"][i];
    CAPTURE(names[i]);
    CHECK(s["name"] == names[i]);
    const double step = s["step_time_model_s"].get<double>();
    CHECK(step > 0);
    CHECK(s["imbalance"].get<double>() >= 1.0 - 1e-9);
    CHECK(s["vs_lower_bound"].get<double>() == doctest::Approx(step / lb).epsilon(1e-6));
    CHECK(s["vs_lower_bound"].get<double>() >= 1.0 - 1e-6);
    CHECK(s["plan_ms"].get<double>() >= 0);
    const double expected = names[i] == "static_dp_cp" ? static_bytes : hdp_bytes;
    CHECK(s["comm_bytes"].get<double>() == doctest::Approx(expected).epsilon(1e-9));
  }
  // A subset, in the order asked for; the table and CSV views carry the same strategies.
  const result sub = run({"compare", "--workload", file, "--ranks", "8", "--capacity", "4096", "--strategies",
                          "gap_filling_hdp,random", "--repeat", "1"});
  REQUIRE(sub.code == 0);
  REQUIRE(sub.json()["strategies"].size() == 2);
  CHECK(sub.json()["strategies"][0]["name"] == "gap_filling_hdp");
  CHECK(sub.json()["strategies"][1]["name"] == "random");
  const result t =
      run({"compare", "--workload", file, "--ranks", "8", "--capacity", "4096", "--format", "table"});
  REQUIRE(t.code == 0);
  for (const auto& n : names) CHECK(t.out.find("\n" + n + " ") != std::string::npos);
  const result c =
      run({"compare", "--workload", file, "--ranks", "8", "--capacity", "4096", "--format", "csv"});
  REQUIRE(c.code == 0);
  CHECK(c.out.rfind("name,step_time_model_s,imbalance,vs_lower_bound,comm_bytes,plan_ms\n", 0) == 0);
  CHECK(std::count(c.out.begin(), c.out.end(), '\n') == 6);

  check_bad_input(
      {"compare", "--workload", file, "--ranks", "8", "--capacity", "4096", "--strategies", "fastest"},
      "fastest");
  check_bad_input({"compare", "--workload", file, "--ranks", "0", "--capacity", "4096"}, "--ranks");
  check_bad_input({"compare", "--workload", file, "--ranks", "2", "--capacity", "100"}, "capacity");
  check_bad_input({"compare", "--workload", file, "--ranks", "8"}, "--capacity");
}

TEST_CASE("hetmesh-plan balance: every token of every sample on exactly one rank, for each strategy") {
  const scratch_dir dir;
  const auto lengths = test_lengths();
  const auto file = dir.write("w.txt", lines_of(lengths));
  const int ranks = 8;
  for (const std::string strategy :
       {"random", "token_count", "static_dp_cp", "bytescale_hdp", "gap_filling_hdp"}) {
    CAPTURE(strategy);
    const result r = run({"balance", "--strategy", strategy, "--workload", file, "--ranks",
                          std::to_string(ranks), "--capacity", "4096"});
    REQUIRE_MESSAGE(r.code == 0, r.err);
    const auto j = r.json();
    CHECK(j["strategy"] == strategy);
    REQUIRE(j["per_rank"].size() == static_cast<std::size_t>(ranks));
    // Items: each sample in exactly one item; rings of distinct ranks in range.
    std::vector<int> in_items(lengths.size(), 0);
    for (const auto& it : j["items"]) {
      for (const auto& id : it["sequences"]) ++in_items.at(id.get<std::size_t>());
      auto ring = it["ring"].get<std::vector<int>>();
      std::sort(ring.begin(), ring.end());
      CHECK(std::adjacent_find(ring.begin(), ring.end()) == ring.end());
      CHECK(ring.front() >= 0);
      CHECK(ring.back() < ranks);
    }
    CHECK(std::all_of(in_items.begin(), in_items.end(), [](int k) { return k == 1; }));
    // Segments: per sample, the ranges over all ranks tile [0, length) exactly.
    std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> ranges(lengths.size());
    std::int64_t tokens = 0;
    for (const auto& rk : j["per_rank"]) {
      std::int64_t prev_order = -1;
      std::int64_t rank_tokens = 0;
      for (const auto& mb : rk["micro_batches"]) {
        CHECK(mb["order"].get<std::int64_t>() >= prev_order);  // runs in order-key order (no deadlock)
        prev_order = mb["order"].get<std::int64_t>();
        for (const auto& sg : mb["segments"]) {
          ranges.at(sg["seq"].get<std::size_t>())
              .push_back({sg["begin"].get<std::int64_t>(), sg["end"].get<std::int64_t>()});
          rank_tokens += sg["end"].get<std::int64_t>() - sg["begin"].get<std::int64_t>();
        }
      }
      CHECK(rk["tokens"] == rank_tokens);
      tokens += rank_tokens;
      // static_dp_cp leaves ranks beyond dp x cp idle; the HDP strategies use every rank here.
      if (strategy != "static_dp_cp") CHECK(rk["busy_model_ms"].get<double>() > 0);
    }
    CHECK(tokens == std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0}));
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      auto& v = ranges[i];
      std::sort(v.begin(), v.end());
      std::int64_t at = 0;
      for (const auto& [b, e] : v) {
        CHECK(b == at);
        at = e;
      }
      CHECK(at == lengths[i]);
    }
    const double lb = j["lower_bound_model_s"].get<double>();
    CHECK(j["vs_lower_bound"].get<double>() ==
          doctest::Approx(j["step_time_model_s"].get<double>() / lb).epsilon(1e-6));
    const result t = run({"balance", "--strategy", strategy, "--workload", file, "--ranks", "8", "--capacity",
                          "4096", "--format", "table"});
    REQUIRE(t.code == 0);
    CHECK(std::count(t.out.begin(), t.out.end(), '\n') == ranks + 4);
  }
  check_bad_input(
      {"balance", "--strategy", "roundrobin", "--workload", file, "--ranks", "8", "--capacity", "4096"},
      "roundrobin");
}

TEST_CASE("hetmesh-plan workloads: JSONL multimodal samples, and errors that name the line") {
  const scratch_dir dir;
  const auto jsonl = dir.write("mm.jsonl",
                               "{\"id\": \"a\", \"text\": 900, \"images\": [576, 576]}\n"
                               "\n"
                               "{\"id\": 7, \"text\": 3000, \"audio\": [750]}\n"
                               "{\"text\": 10, \"images\": [], \"source\": \"web\"}\n");
  const result r =
      run({"compare", "--workload", jsonl, "--ranks", "2", "--capacity", "8192", "--repeat", "1"});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto j = r.json();
  CHECK(j["config"]["samples"] == 3);
  CHECK(j["config"]["tokens"] == 900 + 576 + 576 + 3000 + 750 + 10);
  CHECK(j["config"]["encoder_items"] == 3);
  CHECK(j["config"]["longest"] == 3750);

  // The shipped demo workloads parse.
  for (const char* shipped : {"examples/data/prolong_sample.txt", "examples/data/multimodal_sample.jsonl"}) {
    const result s = run({"compare", "--workload", std::string(HETMESH_SOURCE_DIR) + "/" + shipped, "--ranks",
                          "64", "--capacity", "16384", "--strategies", "gap_filling_hdp", "--repeat", "1"});
    CHECK_MESSAGE(s.code == 0, s.err);
  }
  CHECK(run({"compare", "--workload", std::string(HETMESH_SOURCE_DIR) + "/examples/data/prolong_sample.txt",
             "--ranks", "64", "--capacity", "16384", "--strategies", "gap_filling_hdp", "--repeat", "1"})
            .json()["config"]["samples"] == 2000);

  struct bad {
    const char* text;
    const char* mention;
  };
  for (const bad& b :
       {bad{"100\n200\nabc\n", ":3: 'abc' is not a length"}, bad{"100\n-5\n", ":2: length -5"},
        bad{"100\n0\n", ":2: length 0"},
        bad{"100\n{\"text\": 5}\n", ":2: a JSON object in a file of plain lengths"},
        bad{"{\"text\": 5}\n100\n", ":2: a plain value in a JSONL file"},
        bad{"{\"text\": 5, \"image\": [3]}\n", ":1: unknown key \"image\""},
        bad{"{\"text\": 5.5}\n", ":1: \"text\" is 5.5"}, bad{"{\"text\": -1}\n", ":1: \"text\" is -1"},
        bad{"{\"images\": [5]}\n", ":1: missing \"text\""},
        bad{"{\"text\": 5, \"images\": [0]}\n", ":1: \"images[0]\" is 0"},
        bad{"{\"text\": 5, \"audio\": 7}\n", ":1: \"audio\" is 7"},
        bad{"{\"text\": 5,\n", ":1: invalid JSON"}, bad{"# only a comment\n\n", "no samples"}}) {
    CAPTURE(b.text);
    const auto f = dir.write("bad.txt", b.text);
    check_bad_input({"compare", "--workload", f, "--ranks", "2", "--capacity", "8192"}, b.mention);
  }
  check_bad_input(
      {"compare", "--workload", (dir.path / "missing.txt").string(), "--ranks", "2", "--capacity", "8192"},
      "cannot open");
}

TEST_CASE("hetmesh-plan simulate: variable micro-batches, bubbles, and a Perfetto trace") {
  const scratch_dir dir;
  const auto lengths = test_lengths();
  const auto file = dir.write("w.txt", lines_of(lengths));
  const auto trace = (dir.path / "trace.json").string();
  const int pp = 4;
  const result r = run({"simulate", "--schedule", "1f1b", "--pp", std::to_string(pp), "--workload", file,
                        "--capacity", "24000", "--trace", trace});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto j = r.json();
  CHECK(j["schedule"] == "1f1b");
  CHECK(j["pp"] == pp);
  const int m = j["microbatches"].get<int>();
  // Every sample lands in one micro-batch of at most the capacity.
  const auto tokens = j["microbatch_tokens"].get<std::vector<std::int64_t>>();
  REQUIRE(tokens.size() == static_cast<std::size_t>(m));
  CHECK(std::accumulate(tokens.begin(), tokens.end(), std::int64_t{0}) ==
        std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0}));
  CHECK(std::all_of(tokens.begin(), tokens.end(), [](std::int64_t t) { return t > 0 && t <= 24000; }));
  const double step = j["step_time_model_s"].get<double>();
  CHECK(step > 0);
  // Bubble: 1 - busy / (ranks x step), from the per-rank busy times.
  double busy = 0;
  REQUIRE(j["per_rank"].size() == static_cast<std::size_t>(pp));
  for (const auto& rk : j["per_rank"]) {
    CHECK(rk["busy_model_s"].get<double>() <= step + 1e-9);
    CHECK(rk["peak_activation_bytes"].get<std::int64_t>() > 0);
    busy += rk["busy_model_s"].get<double>();
  }
  CHECK(j["bubble_ratio"].get<double>() == doctest::Approx(1.0 - busy / (pp * step)).epsilon(1e-9));
  // At equal costs 1F1B's bubble is (p-1)/(m+p-1) of the compute-bound step when transfers are small.
  CHECK(j["uniform_bubble_ratio"].get<double>() >= (pp - 1.0) / (m + pp - 1.0) - 1e-6);
  // The trace: Chrome trace events, one complete event per compute action (F and B per stage and
  // micro-batch).
  const auto t = nlohmann::json::parse(tools_test::slurp(trace));
  std::size_t complete = 0;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "X") {
      ++complete;
      CHECK(e["dur"].get<double>() >= 0);
      CHECK(e["tid"].get<int>() < pp);
    }
  CHECK(complete == static_cast<std::size_t>(2 * pp * m));
  CHECK(j["trace"] == trace);

  const result tab = run({"simulate", "--schedule", "zbv", "--pp", "2", "--workload", file, "--microbatches",
                          "6", "--format", "table"});
  REQUIRE_MESSAGE(tab.code == 0, tab.err);
  CHECK(tab.out.find("zbv pp=2 stages=4: 6 micro-batches") != std::string::npos);
  const result asc = run({"simulate", "--schedule", "interleaved-1f1b", "--pp", "2", "--workload", file,
                          "--microbatches", "4", "--format", "ascii", "--width", "40"});
  REQUIRE_MESSAGE(asc.code == 0, asc.err);
  CHECK(asc.out.find("rank 1 |") != std::string::npos);

  check_bad_input({"simulate", "--schedule", "1f1b", "--pp", "2", "--workload", file, "--capacity", "100"},
                  "capacity");
  check_bad_input(
      {"simulate", "--schedule", "1f1b", "--pp", "2", "--workload", file, "--microbatches", "100000"},
      "--microbatches");
  check_bad_input({"simulate", "--schedule", "1f1b", "--pp", "2", "--workload", file, "--trace",
                   (dir.path / "no" / "such" / "dir.json").string()},
                  "--trace");
}

TEST_CASE("hetmesh-data-convert: progress on stderr for long conversions, nothing for short ones") {
  const scratch_dir dir;
  std::string jsonl;
  for (int i = 0; i < 2000; ++i)
    jsonl += fmt::format("{{\"text\": \"sample {} of the progress test\"}}\n", i);
  const auto in = dir.write("in.jsonl", jsonl);
  const auto out = (dir.path / "out").string();
  // A short conversion (shorter than the quiet period) prints its JSON on stdout and nothing on stderr.
  // The period is set long here: with the default 1.5 s of wall time, a loaded CI machine that stalls the
  // process that long would make the output depend on the scheduler.
  const result quiet =
      tools_test::run_exe(HETMESH_DATA_CONVERT_EXE, {"indexed", in, out}, "HETMESH_PROGRESS_AFTER_MS=600000");
  CHECK(quiet.code == 0);
  CHECK(quiet.err.empty());
  CHECK(quiet.json()["samples"] == 2000);
  // With the quiet period at 0 (what a long conversion reaches), stderr (a file here, not a terminal)
  // gets plain lines, no carriage returns, ending with the whole input read.
  const result shown = tools_test::run_exe(HETMESH_DATA_CONVERT_EXE, {"indexed", in, out + "2"},
                                           "HETMESH_PROGRESS_AFTER_MS=0");
  CHECK(shown.code == 0);
  CHECK(shown.json()["samples"] == 2000);
  CHECK_MESSAGE(shown.err.rfind("hetmesh-data-convert: ", 0) == 0, shown.err);
  CHECK(shown.err.find('\r') == std::string::npos);
  CHECK_MESSAGE(shown.err.find(fmt::format("100% ({:.1f} MB of {:.1f} MB read)", jsonl.size() / 1e6,
                                           jsonl.size() / 1e6)) != std::string::npos,
                shown.err);
  CHECK(shown.err.find(", done\n") != std::string::npos);
  // A failed conversion ends with its error, not with "done".
  const auto bad = dir.write("bad.jsonl", "{\"text\": \"a\"}\n{\"neither\": 1}\n");
  const result failed = tools_test::run_exe(HETMESH_DATA_CONVERT_EXE, {"indexed", bad, out + "3"},
                                            "HETMESH_PROGRESS_AFTER_MS=0");
  CHECK(failed.code == 2);  // bad input: exit 2, one error line (tools/common/hetmesh_tools/args.hpp)
  CHECK(failed.err.find("done") == std::string::npos);
  CHECK_MESSAGE(failed.err.find("line 2") != std::string::npos, failed.err);
}

TEST_CASE("hetmesh-plan pipeline dualpipev: PyTorch's order with its overlapped actions; refusals exit 2") {
  const result r = run({"pipeline", "--schedule", "dualpipev", "--pp", "2", "--microbatches", "4"});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto j = r.json();
  CHECK(j["schedule"] == "dualpipev");
  CHECK(j["stages"] == 4);
  CHECK(j["stage_to_rank"].get<std::vector<int>>() == std::vector<int>{0, 1, 1, 0});
  // torch 2.15.0 ScheduleDualPipeV(pp=2, n_microbatches=4).pipeline_order[0]
  CHECK(j["ranks"][0].get<std::vector<std::string>>() ==
        std::vector<std::string>{"0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "(0F3;3B1)OVERLAP_F_B",
                                 "(3F2;0B0)OVERLAP_F_B", "3B2", "(3F3;0B1)OVERLAP_F_B", "3B3", "0I2", "0W2",
                                 "0I3", "0W3"});
  const result csv =
      run({"pipeline", "--schedule", "dualpipev", "--pp", "2", "--microbatches", "4", "--format", "csv"});
  REQUIRE(csv.code == 0);
  CHECK(csv.out.find("3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2") != std::string::npos);
  // PyTorch refuses fewer micro-batches than stages; so does the tool, naming the rule
  check_bad_input({"pipeline", "--schedule", "dualpipev", "--pp", "2", "--microbatches", "3"},
                  "microbatches >= 2 * pp = 4");
  check_bad_input({"pipeline", "--schedule", "dualpipev", "--pp", "4", "--microbatches", "7"}, "dualpipev");
  check_bad_input(
      {"pipeline", "--schedule", "dualpipev", "--pp", "2", "--microbatches", "4", "--virtual", "3"},
      "--virtual 3");
  check_bad_input(
      {"pipeline", "--schedule", "dualpipev", "--pp", "2", "--microbatches", "4", "--group-size", "2"},
      "--group-size");
  // simulate: an overlapped action is one event of its halves' summed cost; too few micro-batches refused
  const scratch_dir dir;
  const auto file = dir.write("w.txt", lines_of(test_lengths()));
  const result sim = run({"simulate", "--schedule", "dualpipev", "--pp", "2", "--workload", file,
                          "--microbatches", "6", "--format", "table"});
  REQUIRE_MESSAGE(sim.code == 0, sim.err);
  CHECK(sim.out.find("dualpipev pp=2 stages=4: 6 micro-batches") != std::string::npos);
  check_bad_input(
      {"simulate", "--schedule", "dualpipev", "--pp", "4", "--workload", file, "--microbatches", "7"},
      "2 * pp = 8");
}
