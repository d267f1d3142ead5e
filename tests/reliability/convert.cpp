// SPDX-License-Identifier: Apache-2.0
// The converters (data/convert.hpp) on bad input: tokens that are not integral or do not fit the dtype,
// duplicate WebDataset keys, a directory for a file. Each is a data_error naming the line; a failed
// conversion leaves no output and an earlier good output intact.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <hetmesh/data/convert.hpp>

#include "data/fixtures.hpp"

using namespace hetmesh;
using namespace hetmesh::data;
using doctest::Contains;

namespace {
std::string write(const test::temp_dir& d, const std::string& name, const std::string& text) {
  std::ofstream(d / name) << text;
  return d / name;
}
int files_in(const test::temp_dir& d) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(d.path)) ++n;
  return n;
}
}  // namespace

TEST_CASE("convert indexed: a fractional token is refused with its line, not truncated") {
  test::temp_dir d;
  const auto in = write(d, "in.jsonl", "{\"tokens\": [1, 2]}\n\n{\"tokens\": [3, 1.5]}\n");
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_indexed(in, d / "out"), Contains("line 3: \"tokens\"[1] = 1.5"),
                       data_error);
  CHECK_FALSE(std::filesystem::exists(d / "out.bin"));
  CHECK_FALSE(std::filesystem::exists(d / "out.idx"));
  CHECK(files_in(d) == 1);  // no temporaries either
}

TEST_CASE("convert indexed: negative and out-of-dtype tokens are refused naming the range") {
  test::temp_dir d;
  auto in = write(d, "neg.jsonl", "{\"tokens\": [-1]}\n");
  CHECK_THROWS_WITH_AS(
      (void)convert_jsonl_to_indexed(in, d / "out", dtype::int32),
      Contains("line 1: \"tokens\"[0] = -1; expected an integer token id in [0, 2147483647]"), data_error);
  in = write(d, "big.jsonl", "{\"tokens\": [65536]}\n");
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_indexed(in, d / "out", dtype::uint16),
                       Contains("in [0, 65535]"), data_error);
  in = write(d, "huge.jsonl", "{\"tokens\": [18446744073709551615]}\n");
  CHECK_THROWS_AS((void)convert_jsonl_to_indexed(in, d / "out", dtype::int32), data_error);
  in = write(d, "str.jsonl", "{\"tokens\": [\"7\"]}\n");
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_indexed(in, d / "out"), Contains("\"tokens\"[0] = \"7\""),
                       data_error);
}

TEST_CASE("convert indexed: a failed conversion leaves an earlier good dataset intact") {
  test::temp_dir d;
  const auto good = write(d, "good.jsonl", "{\"tokens\": [5, 6, 7]}\n{\"tokens\": [8]}\n");
  (void)convert_jsonl_to_indexed(good, d / "out");
  const std::string before = [&] {
    std::ifstream f(d / "out.bin", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }();
  const auto bad = write(d, "bad.jsonl", "{\"tokens\": [1, 2, 3, 4, 5, 6]}\n{\"tokens\": [1.5]}\n");
  CHECK_THROWS_AS((void)convert_jsonl_to_indexed(bad, d / "out"), data_error);
  std::ifstream f(d / "out.bin", std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(f), {}) == before);
  const indexed_dataset ds(d / "out");
  CHECK(ds.size() == 2);
  CHECK(ds.length(0) == 3);
  CHECK(files_in(d) == 4);  // good.jsonl, bad.jsonl, out.bin, out.idx: no temporary
}

TEST_CASE("convert: a directory for the JSONL input is refused, not read as an empty dataset") {
  test::temp_dir d;
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_indexed(d.path, d / "out"),
                       Contains("is a directory; expected a regular file"), data_error);
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_webdataset(d / "missing.jsonl", d / "out", 2),
                       Contains("cannot open JSONL"), data_error);
}

TEST_CASE("convert webdataset: duplicate keys are refused naming both lines; nothing is written") {
  test::temp_dir d;
  const auto in = write(d, "in.jsonl",
                        "{\"key\": \"a\", \"tokens\": 3}\n{\"key\": \"b\", \"tokens\": 4}\n"
                        "{\"key\": \"c\", \"tokens\": 4}\n{\"key\": \"a\", \"tokens\": 5}\n");
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_webdataset(in, d / "shard", 2),
                       Contains("line 4: key 'a' was already used on line 1"), data_error);
  CHECK(files_in(d) == 1);  // the first, full shard was not published either
}

TEST_CASE("convert webdataset: mistyped fields name the field and line") {
  test::temp_dir d;
  auto in = write(d, "t.jsonl", "{\"tokens\": 2.5}\n");
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_webdataset(in, d / "s", 2),
                       Contains("line 1: \"tokens\" = 2.5; expected a non-negative integer"), data_error);
  in = write(d, "n.jsonl", "{\"tokens\": -4}\n");
  CHECK_THROWS_AS((void)convert_jsonl_to_webdataset(in, d / "s", 2), data_error);
  in = write(d, "k.jsonl", "{\"tokens\": 2, \"key\": 9}\n");
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_webdataset(in, d / "s", 2),
                       Contains("\"key\" = 9; expected a string"), data_error);
  in = write(d, "f.jsonl", "{\"tokens\": 2, \"files\": [\"x\"]}\n");
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_webdataset(in, d / "s", 2), Contains("\"files\" = [\"x\"]"),
                       data_error);
  in = write(d, "tt.jsonl", "{\"text_tokens\": 5}\n");
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_webdataset(in, d / "s", 2),
                       Contains("\"text_tokens\" is number; expected an array"), data_error);
}

TEST_CASE("webdataset reader: a shard with a repeated key is refused, not merged into one sample") {
  test::temp_dir d;
  {
    wds_writer w(d / "x.tar");
    const std::string meta = "{\"tokens\": 1}";
    const auto* b = reinterpret_cast<const std::byte*>(meta.data());
    const std::vector<std::pair<std::string, std::vector<std::byte>>> m{{"json", {b, b + meta.size()}}};
    w.add("a", m);
    CHECK_THROWS_WITH_AS(w.add("a", m), Contains("key 'a' is already in shard"), invalid_argument);
  }
  CHECK(files_in(d) == 0);  // an unfinished writer publishes nothing
  // Hand-made tar: two "k.json" members in a row.
  std::vector<std::byte> tar;
  for (int i = 0; i < 2; ++i) {
    const auto h = tar::header("k.json", 13);
    tar.insert(tar.end(), h.begin(), h.end());
    const std::string meta = "{\"tokens\": 1}";
    for (char c : meta) tar.push_back(static_cast<std::byte>(c));
    tar.resize(tar.size() + (512 - 13), std::byte{0});
  }
  tar.resize(tar.size() + 1024, std::byte{0});
  hetmesh::data::detail::write_file_atomic(d / "dup.tar", tar);
  CHECK_THROWS_WITH_AS((void)build_wds_index(d / "dup.tar"), Contains("sample 'k' has two '.json' members"),
                       data_error);
}
