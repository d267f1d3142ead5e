// SPDX-License-Identifier: Apache-2.0
// Trust boundaries of the library's files (issue 37): every reader refuses a directory, a FIFO (without
// blocking), a device and a file over its limit, and JSON nested past the depth limit; every writer
// refuses a folder or a device as its target and a failed write (a read-only folder, a full disk), and
// leaves an earlier file of the same name intact. Each case ends within a few seconds.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <hetmesh/balance/workload.hpp>
#include <hetmesh/core/files.hpp>
#include <hetmesh/core/json_file.hpp>
#include <hetmesh/data/checkpoint.hpp>
#include <hetmesh/data/convert.hpp>
#include <hetmesh/data/indexed_dataset.hpp>
#include <hetmesh/data/mixture_json.hpp>
#include <hetmesh/data/webdataset.hpp>

#include "data/fixtures.hpp"
#include "support/special_files.hpp"

using namespace hetmesh;
using doctest::Contains;

namespace files_test {

using data::test::temp_dir;

std::string read_back(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using testsupport::make_fifo;
using testsupport::make_sparse;
using testsupport::with_file_size_limit;

std::string nested(int depth) { return std::string(static_cast<std::size_t>(depth), '['); }

/// The files in `dir` (to check no temporary is left).
int count_files(const std::string& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace files_test

using namespace files_test;

TEST_CASE("read_regular_file: a directory, a FIFO, a device, /proc and a huge file are refused by name") {
  temp_dir d;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS((void)read_regular_file(d.path, 100, "workload"),
                       Contains("is a directory; expected a regular file"), data_error);
  CHECK_THROWS_WITH_AS((void)read_regular_file(make_fifo(d), 100, "workload"),
                       Contains("is a FIFO (named pipe); expected a regular file"), data_error);
  CHECK_THROWS_WITH_AS((void)read_regular_file("/dev/zero", 100, "workload"),
                       Contains("is a character device"), data_error);
  CHECK_THROWS_WITH_AS((void)read_regular_file("/proc/self/status", 1 << 20, "workload"),
                       Contains("grew past the 0 bytes"), data_error);
  CHECK_THROWS_WITH_AS((void)read_regular_file(make_sparse(d, "big", 4096), 4095, "workload"),
                       Contains("has 4096 bytes; expected at most 4095 bytes"), data_error);
  CHECK_THROWS_WITH_AS((void)read_regular_file(d / "missing", 100, "workload"),
                       Contains("cannot open workload"), data_error);
  CHECK_THROWS_WITH_AS((void)regular_file_stream(make_fifo(d, "f2"), 100, "length list"), Contains("FIFO"),
                       data_error);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  std::ofstream(d / "ok") << "abc\n";
  CHECK(read_regular_file(d / "ok", 4, "x") == "abc\n");
}

TEST_CASE("JSON: nesting past the limit is refused with the file and line; strings do not count") {
  CHECK_THROWS_WITH_AS((void)parse_json_bounded(nested(100000), "deep.json"),
                       Contains("deep.json:1: JSON nested deeper than 128 levels"), data_error);
  CHECK_THROWS_WITH_AS((void)parse_json_bounded("{\"a\":\n" + std::string(200, '{'), "d.json"),
                       Contains("d.json:2: JSON nested deeper"), data_error);
  CHECK_THROWS_WITH_AS((void)parse_json_bounded("[1,\n2,,]", "bad.json"),
                       Contains("bad.json:2: invalid JSON"), data_error);
  const auto j = parse_json_bounded("{\"s\": \"" + nested(1000) + "\\\"\"}", "s.json");
  CHECK(j["s"].get<std::string>().size() == 1001);
  CHECK(parse_json_bounded(std::string(128, '[') + std::string(128, ']'), "x").is_array());
  temp_dir d;
  std::ofstream(d / "deep.json") << nested(100000);
  CHECK_THROWS_WITH_AS((void)read_json_file(d / "deep.json", "mixture"), Contains("nested deeper"),
                       data_error);
}

TEST_CASE("JSON: a number too large for a double is a data_error with the line (fuzz_json_bounded finding)") {
  // nlohmann throws out_of_range 406 here, not parse_error: it escaped parse_json_bounded and terminated
  // the process (found by fuzz_json_bounded on "555555555E0000000800000000").
  CHECK_THROWS_WITH_AS((void)parse_json_bounded("{\"a\":\n [1,\n  1e999]}", "n.json"),
                       Contains("n.json:3: invalid JSON (number overflow parsing '1e999')"), data_error);
  CHECK_THROWS_WITH_AS((void)parse_json_bounded("555555555E0000000800000000", "f.json"),
                       Contains("f.json:1: invalid JSON (number overflow"), data_error);
  CHECK_THROWS_WITH_AS((void)parse_json_bounded<nlohmann::ordered_json>("[\n\n-1e400]", "o.json", 128, 10),
                       Contains("o.json:12: invalid JSON"), data_error);
  temp_dir d;
  std::ofstream(d / "big.json") << "{\"w\": 2e308}";
  CHECK_THROWS_WITH_AS((void)read_json_file(d / "big.json", "mixture"), Contains("big.json:1: invalid JSON"),
                       data_error);
  CHECK(parse_json_bounded("[1.7e308, -1e-400]", "ok.json")[0].get<double>() > 1e308);
}

TEST_CASE("write_file_atomic: a folder or a device as the target, a read-only folder, a full disk") {
  temp_dir d;
  const std::string out = d / "out.json";
  write_file_atomic(out, "good");
  CHECK(read_back(out) == "good");
  std::filesystem::create_directory(d / "sub");
  CHECK_THROWS_WITH_AS(
      write_file_atomic(d / "sub", "x", "report"),
      Contains((std::string("cannot write report '") + (d / "sub") + "': it is a directory").c_str()),
      data_error);
  CHECK_THROWS_WITH_AS(write_file_atomic("/dev/full", "x", "report"), Contains("it is a character device"),
                       data_error);
  // A full disk, injected: the file may not grow past 2 bytes.
  const int rc = with_file_size_limit(2, [&] {
    try {
      write_file_atomic(out, "a much longer content", "report");
      return 1;
    } catch (const data_error& e) {
      return std::string(e.what()).find("File too large") != std::string::npos ? 0 : 2;
    }
  });
  CHECK(rc == 0);
  CHECK(read_back(out) == "good");
  CHECK(count_files(d.path) == 2);  // out.json and sub: no temporary left
  // A read-only folder: root writes there anyway, so the case says so and checks nothing.
  std::filesystem::create_directory(d / "ro");
  ::chmod((d / "ro").c_str(), 0500);
  if (::geteuid() == 0) {
    MESSAGE("running as root: a read-only folder is writable, that case is not checked");
  } else {
    CHECK_THROWS_WITH_AS(write_file_atomic(d / "ro/x", "x"), Contains("expected a writable folder"),
                         data_error);
  }
  ::chmod((d / "ro").c_str(), 0700);
}

TEST_CASE("data checkpoint and mixture: FIFO, directory, nested, huge; the writer keeps the earlier file") {
  temp_dir d;
  const auto t0 = std::chrono::steady_clock::now();
  const data::mixture_config cfg{
      .seed = 7,
      .global_batch = 4,
      .sources = {{.name = "a", .paths = {"a"}, .weight = {{0, 1.0}}}},
      .cost = {.text = {.a = 1, .b = 1}},
      .layout = mesh::make_mesh(mesh::dp(2)),
      .micro_batches = 1,
  };
  for (const auto& [path, says] :
       {std::pair{make_fifo(d), std::string("FIFO")},
        {d.path, "a directory"},
        {std::string("/dev/zero"), "character device"},
        {make_sparse(d, "huge.json", (std::int64_t{64} << 20) + 1), "expected at most"}}) {
    CAPTURE(path);
    CHECK_THROWS_WITH_AS((void)data::load_checkpoint(path, cfg), Contains(says.c_str()), data_error);
    CHECK_THROWS_WITH_AS((void)data::read_mixture_file(path), Contains(says.c_str()), data_error);
  }
  std::ofstream(d / "deep.json") << nested(100000);
  CHECK_THROWS_WITH_AS((void)data::load_checkpoint(d / "deep.json", cfg), Contains("nested deeper"),
                       data_error);
  CHECK_THROWS_WITH_AS((void)data::read_mixture_file(d / "deep.json"), Contains("nested deeper"), data_error);
  const std::string ck = d / "state.json";
  const auto st = data::initial_state(cfg);
  data::save_checkpoint(ck, cfg, st);
  const std::string before = read_back(ck);
  CHECK_THROWS_AS(data::save_checkpoint(d.path, cfg, st), data_error);
  CHECK_THROWS_WITH_AS(data::save_checkpoint("/dev/full", cfg, st), Contains("character device"), data_error);
  CHECK(read_back(ck) == before);
  CHECK_NOTHROW((void)data::load_checkpoint(ck, cfg));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("length lists, indexed datasets, shards: special files are refused, never mapped or read") {
  temp_dir d;
  CHECK_THROWS_WITH_AS((void)balance::read_lengths(std::filesystem::path(make_fifo(d))), Contains("FIFO"),
                       data_error);
  CHECK_THROWS_WITH_AS((void)balance::read_lengths(std::filesystem::path(d.path)), Contains("a directory"),
                       data_error);
  CHECK_THROWS_WITH_AS((void)balance::read_lengths(std::filesystem::path("/dev/zero")),
                       Contains("character device"), data_error);
  // An indexed dataset whose .bin is a FIFO and whose .idx is a directory.
  make_fifo(d, "ds.bin");
  std::filesystem::create_directory(d / "ds.idx");
  CHECK_THROWS_WITH_AS(data::indexed_dataset(d / "ds"), Contains("indexed dataset index"), data_error);
  CHECK_THROWS_WITH_AS(data::build_wds_index(d / "ds.bin"), Contains("WebDataset shard"), data_error);
  CHECK_THROWS_WITH_AS(data::build_wds_index("/dev/zero"), Contains("character device"), data_error);
}

TEST_CASE("WebDataset converter: special, /proc, garbage, mismatched and huge-id members are refused") {
  temp_dir d;
  const auto t0 = std::chrono::steady_clock::now();
  std::ofstream(d / "ok.bin") << "payload";
  const std::string fifo = make_fifo(d);
  struct bad_line {
    std::string line, says;
  };
  const std::string ok = d / "ok.bin";
  for (const auto& b : {
           bad_line{R"({"tokens": 3, "files": {"bin": "/dev/zero"}})",
                    "\"files\".bin '/dev/zero' is a character"},
           bad_line{R"({"tokens": 3, "files": {"bin": "/proc/self/status"}})", "grew past"},
           bad_line{R"({"tokens": 3, "files": {"bin": ")" + fifo + "\"}}", "FIFO"},
           bad_line{R"({"tokens": 3, "files": {"bin": ")" + d.path + "\"}}", "a directory"},
           bad_line{R"({"tokens": 3, "files": {"b/in": ")" + ok + "\"}}", "[A-Za-z0-9_-]"},
           bad_line{R"({"tokens": 3, "files": {"bin": 7}})", "expected a path string"},
           bad_line{R"({"tokens": 5, "text_tokens": [1, 2]})", "\"text_tokens\" has 2 entries"},
           bad_line{R"({"text_tokens": [1, 18446744073709551615]})",
                    "\"text_tokens\"[1] = 18446744073709551615"},
           bad_line{R"({"text_tokens": [-1]})", "\"text_tokens\"[0] = -1"},
           bad_line{R"({"tokens": 1, "items": [{"tokens": 1e30}]})", "\"items\"[0]"},
           bad_line{R"({"tokens": 1, "key": "a.b"})", "without '.'"},
           bad_line{"\xff\xfe garbage", "invalid JSON"},
           bad_line{nested(100000), "nested deeper"},
       }) {
    CAPTURE(b.line);
    std::ofstream(d / "in.jsonl") << R"({"tokens": 1})"
                                  << "\n"
                                  << b.line << "\n";
    CHECK_THROWS_WITH_AS((void)data::convert_jsonl_to_webdataset(d / "in.jsonl", d / "out", 10),
                         Contains(b.says.c_str()), data_error);
    CHECK(!std::filesystem::exists(d / "out-000000.tar"));
  }
  CHECK_THROWS_WITH_AS((void)data::convert_jsonl_to_webdataset(fifo, d / "out", 10), Contains("JSONL"),
                       data_error);
  CHECK_THROWS_WITH_AS((void)data::convert_jsonl_to_indexed("/dev/zero", d / "out"),
                       Contains("character device"), data_error);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  std::ofstream(d / "in.jsonl") << R"({"text_tokens": [1, 2], "tokens": 2, "files": {"bin": ")" << ok
                                << "\"}}\n";
  CHECK(data::convert_jsonl_to_webdataset(d / "in.jsonl", d / "out", 10).samples == 1);
}

TEST_CASE("converter shards: a folder or a device as the output is refused and nothing is left") {
  temp_dir d;
  std::ofstream(d / "in.jsonl") << R"({"tokens": [1, 2]})"
                                << "\n";
  std::filesystem::create_directory(d / "out.bin");
  CHECK_THROWS_WITH_AS((void)data::convert_jsonl_to_indexed(d / "in.jsonl", d / "out"),
                       Contains("a directory"), data_error);
  std::filesystem::create_directory(d / "w-000000.tar");
  std::ofstream(d / "w.jsonl") << R"({"tokens": 2})"
                               << "\n";
  CHECK_THROWS_WITH_AS((void)data::convert_jsonl_to_webdataset(d / "w.jsonl", d / "w", 1),
                       Contains("a directory"), data_error);
  CHECK(count_files(d.path) == 4);  // in.jsonl, out.bin/, w-000000.tar/, w.jsonl: no temporary left
}
