// SPDX-License-Identifier: Apache-2.0
// Formats: Megatron indexed datasets (byte-exact layout, round trip, corruption), WebDataset tar shards
// (round trip, index beside the shard, corruption and stale index), and the JSONL converters.
#include <doctest/doctest.h>

#include <fstream>

#include <hetmesh/data/constructor.hpp>
#include <hetmesh/data/convert.hpp>
#include <hetmesh/data/indexed_dataset.hpp>
#include <hetmesh/data/source.hpp>
#include <hetmesh/data/webdataset.hpp>

#include "fixtures.hpp"

using namespace hetmesh;
using namespace hetmesh::data;

namespace {
std::vector<unsigned char> slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void spit(const std::string& p, const std::vector<unsigned char>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
template <class T>
T at(const std::vector<unsigned char>& b, std::size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}
}  // namespace

TEST_CASE("indexed dataset: the .idx layout is Megatron's MMapIndexedDataset byte for byte") {
  test::temp_dir dir;
  const auto prefix = dir / "ds";
  // Two documents: {3, 5} elements and {2} elements, uint16.
  indexed_dataset_writer w(prefix, dtype::uint16);
  const std::vector<int> a{1, 2, 3}, b{40000, 5, 6, 7, 8}, c{9, 65535};
  w.add_sequence(std::span<const int>(a));
  w.add_sequence(std::span<const int>(b));
  w.end_document();
  w.add_sequence(std::span<const int>(c));
  w.end_document();
  w.finish();
  const auto idx = slurp(prefix + ".idx");
  REQUIRE(idx.size() == 34 + 3 * 4 + 3 * 8 + 3 * 8);
  CHECK(std::memcmp(idx.data(), "MMIDIDX\0\0", 9) == 0);
  CHECK(at<std::uint64_t>(idx, 9) == 1);   // version
  CHECK(idx[17] == 8);                     // uint16 code
  CHECK(at<std::uint64_t>(idx, 18) == 3);  // sequences
  CHECK(at<std::uint64_t>(idx, 26) == 3);  // document entries: 0, 2, 3
  CHECK(at<std::int32_t>(idx, 34) == 3);
  CHECK(at<std::int32_t>(idx, 38) == 5);
  CHECK(at<std::int32_t>(idx, 42) == 2);
  CHECK(at<std::int64_t>(idx, 46) == 0);  // pointers in bytes
  CHECK(at<std::int64_t>(idx, 54) == 6);
  CHECK(at<std::int64_t>(idx, 62) == 16);
  CHECK(at<std::int64_t>(idx, 70) == 0);  // document indices
  CHECK(at<std::int64_t>(idx, 78) == 2);
  CHECK(at<std::int64_t>(idx, 86) == 3);
  const auto bin = slurp(prefix + ".bin");
  REQUIRE(bin.size() == 20);
  CHECK(at<std::uint16_t>(bin, 6) == 40000);

  indexed_dataset ds(prefix);
  CHECK(ds.size() == 3);
  CHECK(ds.documents() == 2);
  CHECK(ds.document(0) == std::pair<std::int64_t, std::int64_t>{0, 2});
  CHECK(ds.type() == dtype::uint16);
  std::vector<std::int32_t> t;
  ds.read_tokens(1, t);
  CHECK(t == std::vector<std::int32_t>{40000, 5, 6, 7, 8});
  t.clear();
  ds.read_tokens(2, t);
  CHECK(t == std::vector<std::int32_t>{9, 65535});
  CHECK(fmt::format("{}", ds).find("3 sequences") != std::string::npos);
}

TEST_CASE("indexed dataset: verifiable round trip for every integer dtype") {
  test::temp_dir dir;
  for (auto type : {dtype::uint16, dtype::int32, dtype::int64}) {
    const auto prefix = dir / fmt::format("d{}", static_cast<int>(type));
    if (type == dtype::int64) {
      // int64 is a valid Megatron dtype but not a token type: it opens, and reading tokens says why not.
      indexed_dataset_writer w(prefix, type);
      const std::vector<std::int64_t> v{1, 2};
      w.add_sequence(std::span<const std::int64_t>(v));
      w.finish();
      indexed_dataset ds(prefix);
      std::vector<std::int32_t> out;
      CHECK_THROWS_AS(ds.read_tokens(0, out), invalid_argument);
      continue;
    }
    test::make_indexed(prefix, 11, 2, 200, 1, 90, type);
    indexed_dataset ds(prefix);
    REQUIRE(ds.size() == 200);
    for (std::int64_t i = 0; i < ds.size(); ++i) {
      std::vector<std::int32_t> out;
      ds.read_tokens(i, out);
      REQUIRE(out == test::expected_tokens(11, 2, i, 1, 90));
    }
  }
  indexed_dataset_writer bad(dir / "bad", dtype::uint8);
  const std::vector<int> v{300};
  CHECK_THROWS_AS(bad.add_sequence(std::span<const int>(v)), invalid_argument);
}

TEST_CASE("indexed dataset: corrupt, truncated and mismatched files are data errors") {
  test::temp_dir dir;
  const auto prefix = dir / "ds";
  test::make_indexed(prefix, 3, 0, 50, 1, 30);
  const auto idx = slurp(prefix + ".idx");
  const auto bin = slurp(prefix + ".bin");
  auto expect_error = [&](const char* what, const std::string& needle) {
    INFO(what);
    try {
      indexed_dataset ds(prefix);
      FAIL("opened a bad dataset");
    } catch (const data_error& e) {
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  auto i2 = idx;
  i2[0] = 'X';
  spit(prefix + ".idx", i2);
  expect_error("bad magic", "magic");
  i2 = idx;
  i2[9] = 2;
  spit(prefix + ".idx", i2);
  expect_error("bad version", "version 2");
  i2 = idx;
  i2[17] = 42;
  spit(prefix + ".idx", i2);
  expect_error("bad dtype", "dtype code 42");
  i2 = idx;
  i2.resize(i2.size() - 3);
  spit(prefix + ".idx", i2);
  expect_error("truncated index", "truncated or corrupt");
  i2 = idx;
  i2[34 + 50 * 4 + 8 * 7] ^= 2;  // pointer of sequence 7
  spit(prefix + ".idx", i2);
  expect_error("pointer", "index and data do not match");
  spit(prefix + ".idx", idx);
  auto b2 = bin;
  b2.resize(b2.size() - 2);
  spit(prefix + ".bin", b2);
  expect_error("truncated bin", "does not match its data");
  spit(prefix + ".bin", bin);
  CHECK_NOTHROW(indexed_dataset{prefix});
  std::filesystem::remove(prefix + ".bin");
  expect_error("missing bin", "cannot open");
}

TEST_CASE("webdataset: shards round trip, the index is stored beside each shard and reused") {
  test::temp_dir dir;
  const auto shards = test::make_wds(dir, "mm", 5, 1, 2, 40, 3, 60);
  for (const auto& s : shards) CHECK(std::filesystem::exists(wds_index_path(s)));
  source_spec spec{.name = "mm", .format = source_format::webdataset, .paths = shards};
  auto src = open_source(spec);
  REQUIRE(src->size() == 80);
  for (std::int64_t i = 0; i < 80; ++i) {
    const auto m = src->meta(i);
    const auto want = test::expected_tokens(5, 1, i, 3, 60);
    REQUIRE(m.tokens == static_cast<std::int64_t>(want.size()));
    REQUIRE(m.item_tokens == std::vector<std::int64_t>{test::item_tokens(5, 1, i)});
    sample s;
    src->load(i, s);
    REQUIRE(s.tokens == want);
    REQUIRE(s.items.size() == 1);
    CHECK(s.items[0].kind == "jpg");
    REQUIRE(s.items[0].payload.size() == static_cast<std::size_t>(100 + i % 700));
    for (std::size_t k = 0; k < s.items[0].payload.size(); ++k)
      REQUIRE(s.items[0].payload[k] == test::payload_byte(5, 1, i, 0, static_cast<std::int64_t>(k)));
  }
  // A stored index equals a rebuilt one; a user hook decodes payloads its own way.
  CHECK(open_wds_index(shards[0]) == build_wds_index(shards[0]));
  auto hooked = open_source(spec, [](const wds_record& r, sample& out) {
    out.tokens = {static_cast<std::int32_t>(r.members.size())};
  });
  sample s;
  hooked->load(3, s);
  CHECK(s.tokens == std::vector<std::int32_t>{2});
  CHECK(src->reads() == 80);
}

TEST_CASE("webdataset: truncated or corrupt shards and stale indexes are data errors") {
  test::temp_dir dir;
  const auto shards = test::make_wds(dir, "x", 9, 0, 1, 10, 3, 20);
  const auto tar = slurp(shards[0]);
  const auto idx_path = wds_index_path(shards[0]);
  auto t2 = tar;
  t2.resize(t2.size() - 1024 - 700);
  spit(shards[0], t2);
  std::filesystem::remove(idx_path);
  CHECK_THROWS_WITH_AS((void)build_wds_index(shards[0]), doctest::Contains("truncated"), data_error);
  t2 = tar;
  t2[2048 + 10] ^= 0x20;  // a byte inside the name in the header of sample 1
  spit(shards[0], t2);
  CHECK_THROWS_WITH_AS((void)build_wds_index(shards[0]), doctest::Contains("checksum"), data_error);
  // Index stored for the good shard; the shard then replaced by a different one of another size.
  spit(shards[0], tar);
  store_wds_index(shards[0], build_wds_index(shards[0]));
  t2 = tar;
  t2.insert(t2.end(), 512, 0);
  spit(shards[0], t2);
  CHECK_THROWS_WITH_AS(wds_shard{shards[0]}, doctest::Contains("does not match its data"), data_error);
  // Same size, different layout: caught when the member's header is re-checked on read.
  auto idx = build_wds_index(shards[0]);
  spit(shards[0], tar);
  std::swap(idx.samples[0].offsets[1], idx.samples[1].offsets[1]);
  idx.shard_bytes = static_cast<std::int64_t>(tar.size());
  store_wds_index(shards[0], idx);
  wds_shard sh(shards[0]);
  CHECK_THROWS_WITH_AS((void)sh.record(0), doctest::Contains("does not match its data"), data_error);
  std::ofstream(idx_path) << "{not json";
  CHECK_THROWS_AS(wds_shard{shards[0]}, data_error);
}

TEST_CASE("tar: headers carry valid ustar checksums; GNU tar can list our shards") {
  const auto h = tar::header("abc_000001.jpg", 1234);
  REQUIRE(h.size() == 512);
  tar::member m;
  char type = 0;
  std::vector<std::byte> arch = h;
  arch.resize(512 + 1536, std::byte{0});
  REQUIRE(tar::parse_header(arch, 0, "mem", m, type));
  CHECK(m.name == "abc_000001.jpg");
  CHECK(m.size == 1234);
  CHECK(m.offset == 512);
  const std::string long_name = std::string(120, 'd') + "/k.json";
  const auto h2 = tar::header(long_name, 1);
  std::vector<std::byte> a2 = h2;
  a2.resize(512 * 4, std::byte{0});
  REQUIRE(tar::parse_header(a2, 0, "mem", m, type));
  CHECK(m.name == long_name);
  test::temp_dir dir;
  const auto shards = test::make_wds(dir, "g", 1, 0, 1, 3, 1, 5);
  if (std::system("tar --version > /dev/null 2>&1") == 0) {
    const auto cmd = fmt::format("tar -tf {} > {}", shards[0], dir / "list.txt");
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::ifstream in(dir / "list.txt");
    std::vector<std::string> names;
    for (std::string l; std::getline(in, l);) names.push_back(l);
    CHECK(names == std::vector<std::string>{"g_000000.json", "g_000000.jpg", "g_000001.json", "g_000001.jpg",
                                            "g_000002.json", "g_000002.jpg"});
  }
}

TEST_CASE("convert: JSONL to an indexed dataset and to WebDataset shards") {
  test::temp_dir dir;
  {
    std::ofstream out(dir / "in.jsonl");
    out << R"({"tokens": [5, 6, 7]})"
        << "\n\n"
        << R"({"text": "hi!"})"
        << "\n"
        << R"({"tokens": []})"
        << "\n";
  }
  const auto st = convert_jsonl_to_indexed(dir / "in.jsonl", dir / "out", dtype::int32);
  CHECK(st.samples == 3);
  CHECK(st.tokens == 6);
  indexed_dataset ds(dir / "out");
  REQUIRE(ds.size() == 3);
  CHECK(ds.documents() == 3);
  std::vector<std::int32_t> t;
  ds.read_tokens(1, t);
  CHECK(t == std::vector<std::int32_t>{'h', 'i', '!'});
  {
    std::ofstream out(dir / "bad.jsonl");
    out << R"({"tokens": [1]})"
        << "\n"
        << R"({"nothing": 1})"
        << "\n";
  }
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_indexed(dir / "bad.jsonl", dir / "bad"),
                       doctest::Contains("line 2"), data_error);

  {
    std::ofstream(dir / "a.jpg") << "JPEGDATA";
    std::ofstream out(dir / "mm.jsonl");
    for (int i = 0; i < 5; ++i)
      out << nlohmann::json{{"text_tokens", std::vector<int>(static_cast<std::size_t>(i + 1), i)},
                            {"items", {{{"ext", "jpg"}, {"tokens", 64}}}},
                            {"files", {{"jpg", dir / "a.jpg"}}}}
                 .dump()
          << "\n";
  }
  const auto ws = convert_jsonl_to_webdataset(dir / "mm.jsonl", dir / "mm", 2);
  REQUIRE(ws.outputs.size() == 3);
  auto src = open_source({.name = "mm", .format = source_format::webdataset, .paths = ws.outputs});
  REQUIRE(src->size() == 5);
  sample s;
  src->load(4, s);
  CHECK(s.tokens == std::vector<std::int32_t>(5, 4));
  REQUIRE(s.items.size() == 1);
  CHECK(std::string(reinterpret_cast<const char*>(s.items[0].payload.data()), s.items[0].payload.size()) ==
        "JPEGDATA");
}

TEST_CASE("loss masks: JSONL to WebDataset to the loaded sample to the packed micro-batch, checked at each") {
  test::temp_dir dir;
  rng g(77);
  std::vector<std::vector<int>> tokens, masks;  // masks[i] empty: sample i has none
  {
    std::ofstream out(dir / "sft.jsonl");
    for (int i = 0; i < 7; ++i) {
      tokens.emplace_back(static_cast<std::size_t>(1 + g.below(9)));
      for (auto& t : tokens.back()) t = static_cast<int>(g.below(1000));
      masks.emplace_back();
      if (i % 3 != 1)
        for (std::size_t k = 0; k < tokens.back().size(); ++k)
          masks.back().push_back(static_cast<int>(g.below(2)));
      nlohmann::json j{{"text_tokens", tokens.back()}};
      if (!masks.back().empty()) j["loss_mask"] = masks.back();
      out << j.dump() << "\n";
    }
  }
  const auto ws = convert_jsonl_to_webdataset(dir / "sft.jsonl", dir / "sft", 3);
  const source_spec spec{.name = "sft", .format = source_format::webdataset, .paths = ws.outputs};
  source_loader loader(spec, 0, 5);
  batch_plan plan;
  std::vector<sample> loaded;
  for (std::int64_t i = 0; i < 7; ++i) {
    const sample_ref ref{0, 0, i, i};
    loaded.push_back(loader.load(ref));
    const auto& s = loaded.back();
    CHECK(std::vector<int>(s.tokens.begin(), s.tokens.end()) == tokens[static_cast<std::size_t>(i)]);
    CHECK(std::vector<int>(s.loss_mask.begin(), s.loss_mask.end()) == masks[static_cast<std::size_t>(i)]);
    plan.samples.push_back({.ref = ref, .meta = {}, .cost = 0, .dp_rank = 0, .micro_batch = i < 2 ? 0 : 1});
  }
  // Micro-batch 0 holds a masked and an unmasked sample, 1 the rest: each mask lands at its document's
  // tokens, 1 for a document without one; none at all when no document of a micro-batch has one.
  const auto mbs = construct(plan, loaded, 0, 2);
  for (int m = 0; m < 2; ++m) {
    const auto& mb = mbs[static_cast<std::size_t>(m)];
    REQUIRE(mb.loss_mask.size() == mb.tokens.size());
    std::vector<std::uint8_t> want;
    for (std::size_t i = 0; i < 7; ++i) {
      if ((i < 2 ? 0 : 1) != m) continue;
      const auto& s = loaded[i];
      if (s.loss_mask.empty())
        want.insert(want.end(), s.tokens.size(), 1);
      else
        want.insert(want.end(), s.loss_mask.begin(), s.loss_mask.end());
    }
    CHECK(mb.loss_mask == want);
    CHECK(deserialize(serialize(mb)) == mb);
  }
  auto unmasked = plan;
  unmasked.samples.resize(1);
  unmasked.samples[0].ref = {0, 0, 1, 1};
  CHECK(construct(unmasked, std::span<const sample>(&loaded[1], 1), 0, 1)[0].loss_mask.empty());

  // Bad masks: named with the sample and what was expected, at conversion, at load and on the wire.
  auto convert_line = [&](const std::string& line) {
    std::ofstream(dir / "bad.jsonl") << line << "\n";
    return convert_jsonl_to_webdataset(dir / "bad.jsonl", dir / "bad", 1);
  };
  CHECK_THROWS_WITH_AS(convert_line(R"({"text_tokens": [1, 2], "loss_mask": [1, 2]})"),
                       doctest::Contains("has 2 at token 1; expected 0 or 1"), data_error);
  CHECK_THROWS_WITH_AS(
      convert_line(R"({"text_tokens": [1, 2], "loss_mask": [1]})"),
      doctest::Contains("\"loss_mask\" has 1 entries; expected one per entry of \"text_tokens\" (2)"),
      data_error);
  CHECK_THROWS_WITH_AS(convert_line(R"({"tokens": 2, "loss_mask": [1, 0]})"), doctest::Contains("(absent)"),
                       data_error);
  std::ofstream(dir / "ids.jsonl") << R"({"tokens": [1, 2], "loss_mask": [1, 0]})"
                                   << "\n";
  CHECK_THROWS_WITH_AS((void)convert_jsonl_to_indexed(dir / "ids.jsonl", dir / "ids"),
                       doctest::Contains("an indexed dataset holds token ids only"), data_error);
  source_loader short_masks(spec, 0, 5, [](const wds_record& r, sample& out) {
    default_wds_decode(r, out);
    out.loss_mask.assign(out.tokens.size() + 1, 1);  // a user's decoder that gets the length wrong
  });
  CHECK_THROWS_WITH_AS((void)short_masks.load(sample_ref{0, 0, 3, 3}),
                       doctest::Contains("s0/e0/p3=#3 has a loss mask of"), data_error);
  auto wire = mbs[0];
  wire.loss_mask.pop_back();
  CHECK_THROWS_WITH_AS((void)deserialize(serialize(wire)), doctest::Contains("expected one per token"),
                       data_error);
  wire = mbs[0];
  wire.loss_mask[0] = 7;
  CHECK_THROWS_WITH_AS((void)deserialize(serialize(wire)), doctest::Contains("loss mask entry 7 at token 0"),
                       data_error);
}
