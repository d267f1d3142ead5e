// SPDX-License-Identifier: Apache-2.0
// hetmesh-data-convert as a user runs it: bad arguments and bad input exit 2 with one line on stderr,
// "hetmesh-data-convert: error: ...", naming the option, argument or line; nothing is written.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/fixtures.hpp"

namespace {

struct result {
  int code = -1;
  std::string out, err;
  [[nodiscard]] bool one_line_error() const {
    return err.rfind("hetmesh-data-convert: error: ", 0) == 0 && err.find('\n') == err.size() - 1;
  }
};

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

result run(const std::vector<std::string>& args) {
  const hetmesh::data::test::temp_dir io;
  std::string cmd = quote(HETMESH_DATA_CONVERT_EXE);
  for (const auto& a : args) {
    cmd += ' ';
    cmd += quote(a);
  }
  cmd += " >" + quote(io / "out") + " 2>" + quote(io / "err");
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, slurp(io / "out"), slurp(io / "err")};
}

void check_refused(const std::vector<std::string>& args, const std::string& mention) {
  std::string line;
  for (const auto& a : args) line += a + " ";
  CAPTURE(line);
  const result r = run(args);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK_MESSAGE(r.one_line_error(), r.err);
  CHECK_MESSAGE(r.err.find(mention) != std::string::npos, r.err);
}

}  // namespace

TEST_CASE("hetmesh-data-convert: bad arguments are refused, naming the flag and what was expected") {
  hetmesh::data::test::temp_dir d;
  std::ofstream(d / "in.jsonl") << "{\"tokens\": [1, 2, 3]}\n";
  const std::string in = d / "in.jsonl", out = d / "out";
  check_refused({"indexed", in, out, "--dtype"}, "option --dtype needs a value; expected uint16|int32");
  check_refused({"indexed", in, out, "--bogus"}, "unknown option '--bogus'");
  check_refused({"indexed", in, out, "--dtype", "float32"},
                "option --dtype 'float32': expected one of uint16, int32");
  check_refused({"indexed", in, out, "stray"}, "unexpected argument 'stray'");
  check_refused({"webdataset", in, out, "--per-shard", "12abc"},
                "option --per-shard '12abc': expected an integer");
  check_refused({"webdataset", in, out, "--per-shard", "abc"}, "option --per-shard 'abc'");
  check_refused({"webdataset", in, out, "--per-shard", "0"}, "out of range");
  check_refused({"webdataset", in}, "missing argument OUT_PREFIX");
  check_refused({"info", out, "extra"}, "unexpected argument 'extra'");
  check_refused({"frobnicate", in}, "unknown command 'frobnicate'");
  CHECK(std::filesystem::directory_iterator(d.path) != std::filesystem::directory_iterator());
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(d.path)) ++n;
  CHECK(n == 1);  // only the input: nothing was written
}

TEST_CASE("hetmesh-data-convert: bad tokens name the line; a good conversion still works") {
  hetmesh::data::test::temp_dir d;
  std::ofstream(d / "frac.jsonl") << "{\"tokens\": [1]}\n{\"tokens\": [1.5]}\n";
  std::ofstream(d / "neg.jsonl") << "{\"tokens\": [-1]}\n";
  std::ofstream(d / "dup.jsonl") << "{\"key\": \"k\", \"tokens\": 1}\n{\"key\": \"k\", \"tokens\": 2}\n";
  check_refused({"indexed", d / "frac.jsonl", d / "o"}, "line 2: \"tokens\"[0] = 1.5");
  check_refused({"indexed", d / "neg.jsonl", d / "o", "--dtype", "uint16"}, "line 1: \"tokens\"[0] = -1");
  check_refused({"webdataset", d / "dup.jsonl", d / "w"}, "key 'k' was already used on line 1");
  check_refused({"indexed", d.path, d / "o"}, "is a directory; expected a regular file");
  CHECK_FALSE(std::filesystem::exists(d / "o.bin"));
  std::ofstream(d / "ok.jsonl") << "{\"key\": \"a\", \"tokens\": 3}\n{\"key\": \"b\", \"tokens\": 4}\n";
  const result r = run({"webdataset", d / "ok.jsonl", d / "w", "--per-shard=1"});
  CHECK(r.code == 0);
  CHECK(r.out.find("\"samples\": 2") != std::string::npos);
  const result info = run({"info", d / "w-000001.tar"});
  CHECK(info.code == 0);
  CHECK(info.out.find("\"text_tokens\": 4") != std::string::npos);
}
