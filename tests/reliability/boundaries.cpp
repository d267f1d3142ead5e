// SPDX-License-Identifier: Apache-2.0
// The tools at their trust boundaries (issue 37), run as a user runs them (child processes): a FIFO, a
// directory, /dev/zero, a huge or deeply nested file where a file is expected ends in exit 2 and one
// line naming the path within 5 s; an output onto a folder, onto /dev/full or past a full disk exits
// non-zero naming the path and leaves an earlier file of that name intact; sizes are refused before
// allocation, naming the flag and the limit.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/fixtures.hpp"
#include "support/special_files.hpp"

namespace boundaries_test {

using hetmesh::data::test::temp_dir;

struct tool_result {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

std::string read_back(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// Runs `exe args` under `timeout 20` (a hang fails the case instead of the suite). `prefix` runs before
/// it in the same shell (ulimit); `stdout_to` replaces the captured stdout (/dev/full).
tool_result run_tool(const std::string& exe, const std::vector<std::string>& args,
                     const std::string& prefix = "", const std::string& stdout_to = "") {
  const temp_dir io;
  std::string cmd = prefix + "exec timeout 20 " + shell_quote(exe);
  for (const auto& a : args) cmd += ' ' + shell_quote(a);
  cmd += " >" + (stdout_to.empty() ? shell_quote(io / "out") : stdout_to) + " 2>" + shell_quote(io / "err");
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(("sh -c " + shell_quote(cmd)).c_str());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, read_back(io / "out"), read_back(io / "err"), s};
}

/// Exit 2 within 5 s, one line on stderr mentioning `mention`.
void expect_refused(const std::string& exe, const std::vector<std::string>& args, const std::string& mention,
                    const std::string& prefix = "") {
  std::string line;
  for (const auto& a : args) line += a + " ";
  CAPTURE(line);
  const tool_result r = run_tool(exe, args, prefix);
  CHECK(r.code == 2);
  CHECK(r.seconds < 5);
  CHECK_MESSAGE(r.err.find('\n') == r.err.size() - 1, r.err);
  CHECK_MESSAGE(r.err.find(mention) != std::string::npos, r.err);
}

using testsupport::make_fifo;
using testsupport::make_sparse;

const std::string plan = HETMESH_PLAN_EXE;
const std::string convert = HETMESH_DATA_CONVERT_EXE;

}  // namespace boundaries_test

using namespace boundaries_test;

TEST_CASE(
    "hetmesh-plan workloads: FIFO, directory, /dev/zero, huge and nested files exit 2 naming the path") {
  temp_dir d;
  const std::string deep = d / "deep.jsonl";
  std::ofstream(deep) << "{\"id\": 0, \"text\": " << std::string(100000, '[') << "\n";
  for (const std::string cmd : {"compare", "balance", "simulate"}) {
    CAPTURE(cmd);
    auto args = [&](const std::string& w) {
      return cmd == "simulate"
                 ? std::vector<std::string>{cmd, "--schedule", "1f1b", "--workload", w, "--pp", "2"}
                 : std::vector<std::string>{cmd, "--workload", w, "--ranks", "2", "--capacity", "8192"};
    };
    expect_refused(plan, args(make_fifo(d, "fifo-" + cmd)),
                   "is a FIFO (named pipe); expected a regular file");
    expect_refused(plan, args(d.path), "is a directory; expected a regular file");
    expect_refused(plan, args("/dev/zero"), "is a character device");
    expect_refused(plan, args(make_sparse(d, "huge-" + cmd, (std::int64_t{1} << 30) + 1)),
                   "expected at most 1073741824 bytes");
    expect_refused(plan, args(deep), "deep.jsonl:1: JSON nested deeper than 128 levels");
  }
}

TEST_CASE("hetmesh-plan: 2^24 ranks are refused before allocation, naming --ranks and the limit") {
  temp_dir d;
  std::ofstream(d / "w.txt") << "1000\n2000\n";
  for (const std::string cmd : {"compare", "balance"})
    expect_refused(plan, {cmd, "--workload", d / "w.txt", "--ranks", "16777216", "--capacity", "8192"},
                   "option --ranks '16777216': out of range; expected");
}

TEST_CASE("hetmesh-plan mesh --moe --shapes: float world, absurd sizes, nested lines and special files") {
  temp_dir d;
  struct bad {
    std::string line, mention;
  };
  for (const auto& b :
       {bad{R"({"world": 16.5, "tp": 2})", "\"world\" = 16.5; expected an integer in [1, 1048576]"},
        bad{R"({"world": 16, "tp": 2.0})", "\"tp\" = 2.0"}, bad{R"({"world": "16"})", "\"world\" = \"16\""},
        bad{R"({"world": 1e300})", "\"world\" = 1e+300"},
        bad{R"({"world": 18446744073709551615})", "\"world\" = 18446744073709551615"},
        bad{R"({"world": 16, "tp": -2})", "\"tp\" = -2"},
        bad{R"({"world": 16, "ep": 1099511627776})", "\"ep\" = 1099511627776"},
        bad{R"({"tp": 2})", "no \"world\""}, bad{R"({"world": 16, "order": 5})", "\"order\" = 5"},
        bad{R"([16])", "expected a JSON object"}, bad{std::string(100000, '['), ":2: JSON nested deeper"}}) {
    CAPTURE(b.line);
    std::ofstream(d / "s.jsonl") << R"({"world": 8})"
                                 << "\n"
                                 << b.line << "\n";
    expect_refused(plan, {"mesh", "--moe", "--shapes", d / "s.jsonl"}, b.mention);
  }
  expect_refused(plan, {"mesh", "--moe", "--shapes", make_fifo(d, "fifo")}, "FIFO");
  expect_refused(plan, {"mesh", "--moe", "--shapes", d.path}, "a directory");
  {
    std::ofstream many(d / "many.jsonl");
    for (int i = 0; i < 5; ++i)
      many << R"({"world": 1048576, "tp": 3})"
           << "\n";
  }
  expect_refused(plan, {"mesh", "--moe", "--shapes", d / "many.jsonl"}, "expected at most 4194304");
}

TEST_CASE("hetmesh-plan simulate --trace: a folder, /dev/full, a full disk; the earlier trace survives") {
  temp_dir d;
  std::ofstream(d / "w.txt") << "1000\n2000\n3000\n4000\n";
  const std::string trace = d / "t.json";
  const auto args = [&](const std::string& t) {
    return std::vector<std::string>{"simulate", "--schedule", "1f1b", "--workload", d / "w.txt", "--pp",
                                    "2",        "--trace",    t};
  };
  REQUIRE(run_tool(plan, args(trace)).code == 0);
  const std::string good = read_back(trace);
  REQUIRE(good.size() > 100);
  std::filesystem::create_directory(d / "dir.json");
  expect_refused(plan, args(d / "dir.json"),
                 "cannot write --trace '" + (d / "dir.json") + "': it is a directory");
  expect_refused(plan, args("/dev/full"), "cannot write --trace '/dev/full': it is a character device");
  // A full disk, injected: files may not grow past 1 KiB (ulimit -f counts 512-byte blocks; SIGXFSZ is
  // ignored, so the write fails with EFBIG).
  expect_refused(plan, args(trace), "cannot write --trace '" + trace + "'", "trap '' XFSZ; ulimit -f 2; ");
  CHECK(read_back(trace) == good);
  // stdout onto /dev/full: exit 2 and a line, not exit 0 with nothing written.
  const tool_result r = run_tool(plan, {"mesh", "--world", "8", "--tp", "2"}, "", "/dev/full");
  CHECK(r.code == 2);
  CHECK(r.err.find("cannot write the output to stdout") != std::string::npos);
}

TEST_CASE("hetmesh-data-convert: FIFO and device inputs and members exit 2; outputs onto a folder refused") {
  temp_dir d;
  expect_refused(convert, {"webdataset", make_fifo(d, "in.jsonl"), d / "o"}, "is a FIFO");
  expect_refused(convert, {"indexed", "/dev/zero", d / "o"}, "is a character device");
  std::ofstream(d / "m.jsonl") << R"({"tokens": 2, "files": {"bin": "/dev/zero"}})"
                               << "\n";
  expect_refused(convert, {"webdataset", d / "m.jsonl", d / "o"},
                 "\"files\".bin '/dev/zero' is a character device");
  std::ofstream(d / "p.jsonl") << R"({"tokens": 2, "files": {"txt": "/proc/self/status"}})"
                               << "\n";
  expect_refused(convert, {"webdataset", d / "p.jsonl", d / "o"}, "grew past");
  std::ofstream(d / "n.jsonl") << std::string(100000, '{') << "\n";
  expect_refused(convert, {"indexed", d / "n.jsonl", d / "o"}, "n.jsonl:1: JSON nested deeper");
  std::ofstream(d / "ok.jsonl") << R"({"tokens": [1, 2]})"
                                << "\n";
  std::filesystem::create_directory(d / "x.idx");
  expect_refused(convert, {"indexed", d / "ok.jsonl", d / "x"}, "it is a directory");
  CHECK(!std::filesystem::exists(d / "x.bin"));
}
