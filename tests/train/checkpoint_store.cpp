// SPDX-License-Identifier: Apache-2.0
// The checkpoint store (train/checkpoint.hpp, train/checkpoint_store.hpp): round trips, reads under another
// split (tp blocks by rows or columns, ZeRO-like ranges), one copy of replicated pieces over loopback ranks,
// the asynchronous writer, a save killed at every file operation, and damaged checkpoints refused with a
// data_error naming the file and the field, with nothing written into the caller's buffer. The tool
// hetmesh-ckpt runs as a child process on a good and a damaged checkpoint (exit codes 0, 1, 2).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/train/checkpoint.hpp>

namespace {

using namespace hetmesh;
using train::piece_key;
using train::tensor_shard;
namespace fs = std::filesystem;

struct temp_root {
  std::string path;
  temp_root() {
    std::string tmpl = (fs::temp_directory_path() / "hetmesh-ckpt-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_root() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  [[nodiscard]] std::string operator/(const std::string& name) const { return path + "/" + name; }
};

// The element of the full tensor `tensor`'s field at index g: a pure function, never zero.
template <class T>
T value(std::int64_t tensor, const std::string& field, std::int64_t g, std::int64_t step = 0) {
  return static_cast<T>(1 + tensor * 1000 + g) * (field == "value" ? T(1) : T(-0.5)) + static_cast<T>(step);
}

template <class T = float>
train::checkpoint_piece<T> piece(std::int64_t tensor, const std::string& field, tensor_shard block,
                                 std::int64_t full, std::int64_t begin, std::int64_t count,
                                 std::int64_t step = 0) {
  train::checkpoint_piece<T> p{{tensor, field, block, full, begin, count}, {}};
  for (std::int64_t i = 0; i < count; ++i)
    p.data.push_back(value<T>(tensor, field, block.global(begin + i), step));
  return p;
}

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> out;
  for (char c : s) out.push_back(static_cast<std::byte>(c));
  return out;
}

// Rank r of 2: tensor 1 (6 x 8) split by columns (tp 2), tensor 2 (8 x 6) split by rows, tensor 3 (48
// elements) as ZeRO ranges of 24, each with "value" and "adam.m"; counters and one blob on both.
template <class T = float>
train::rank_snapshot<T> two_rank_snapshot(int r, std::int64_t step = 5) {
  train::rank_snapshot<T> s;
  for (const char* f : {"value", "adam.m"}) {
    s.pieces.push_back(piece<T>(1, f, {6, 8, 1, r, 2}, 48, 0, 24, step));
    s.pieces.push_back(piece<T>(2, f, {8, 6, 0, r, 2}, 48, 0, 24, step));
    s.pieces.push_back(piece<T>(3, f, {}, 48, 24 * r, 24, step));
  }
  s.counters = {{"step", step}, {"adam.t/1", 7}};
  s.blobs["data"] = bytes_of("position 12");
  return s;
}

std::string save_two_ranks(const std::string& root, std::int64_t step = 5,
                           const std::string& layout = "tp2") {
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    (void)train::save_checkpoint(c, root, step, two_rank_snapshot(c.rank(), step), {layout});
  });
  return root + "/" + train::checkpoint_step_name(step);
}

// Every element of `k` equals value(), read through `r`.
template <class T = float>
void check_read(const train::checkpoint_reader& r, const piece_key& k, std::int64_t step = 5) {
  std::vector<T> out(static_cast<std::size_t>(k.count), T(-777));
  r.fill(k, std::span<T>(out));
  for (std::int64_t i = 0; i < k.count; ++i)
    REQUIRE(out[static_cast<std::size_t>(i)] ==
            value<T>(k.tensor, k.field, k.block.global(k.begin + i), step));
}

}  // namespace

TEST_CASE("checkpoint store: a round trip keeps every piece, counter and blob; latest names the step") {
  const temp_root root;
  comm::loopback::run(1, [&](comm::loopback::communicator& c) {
    train::rank_snapshot<double> s;
    s.pieces.push_back(piece<double>(4, "value", {}, 10, 0, 10));
    s.pieces.push_back(piece<double>(4, "adam.v", {}, 10, 0, 10));
    s.counters = {{"step", 3}};
    s.blobs["rng/trainer"] = bytes_of("seed 99");
    const auto dir = train::save_checkpoint(c, root.path, 3, s, {"tp1 pp1"});
    CHECK(dir == root / "step-00000003");
  });
  CHECK(train::latest_checkpoint(root.path) == root / "step-00000003");
  const train::checkpoint_reader r(root.path);
  CHECK(r.manifest().step == 3);
  CHECK(r.manifest().layout == "tp1 pp1");
  CHECK(r.manifest().dtype == "float64");
  CHECK(r.manifest().library == "0.1.0");
  CHECK(r.has(4, "adam.v"));
  CHECK_FALSE(r.has(4, "adam.m"));
  CHECK(r.counter("step") == 3);
  CHECK_FALSE(r.counter("nope").has_value());
  CHECK(r.blob("rng/trainer") == bytes_of("seed 99"));
  check_read<double>(r, {4, "value", {}, 10, 0, 10}, 0);
  check_read<double>(r, {4, "adam.v", {}, 10, 3, 4}, 0);
  CHECK(std::vector<std::string>{"manifest.json", "shard-00000.bin"} == [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(r.directory())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }());
}

TEST_CASE("checkpoint store: reads reshard tp blocks and ZeRO ranges into any other block and range") {
  const temp_root root;
  save_two_ranks(root.path);
  const train::checkpoint_reader r(root.path);
  for (const char* f : {"value", "adam.m"}) {
    CAPTURE(f);
    for (std::int64_t t : {1, 2, 3}) {
      const std::int64_t rows = t == 2 ? 8 : 6, cols = t == 2 ? 6 : 8;
      check_read(r, {t, f, {}, 48, 0, 48});  // whole
      check_read(r, {t, f, {}, 48, 5, 30});  // a range of the whole
      for (int axis : {0, 1})
        for (int parts : {1, 2, 3}) {
          if ((axis == 0 ? rows : cols) % parts != 0) continue;
          const std::int64_t n = 48 / parts;
          for (int part = 0; part < parts; ++part) {
            check_read(r, {t, f, {rows, cols, axis, part, parts}, 48, 0, n});      // a block
            check_read(r, {t, f, {rows, cols, axis, part, parts}, 48, 1, n / 2});  // a ZeRO range of it
            check_read(r, {t, f, {rows, cols, axis, part, parts}, 48, n / 2, n - n / 2});
          }
        }
    }
  }
  std::vector<float> none;
  r.fill(piece_key{1, "value", {}, 48, 7, 0}, std::span<float>(none));  // an empty range reads nothing
}

TEST_CASE("checkpoint store: replicated pieces are written once, by the lowest rank holding them (4 ranks)") {
  const temp_root root;
  comm::loopback::run(4, [&](comm::loopback::communicator& c) {
    train::rank_snapshot<float> s;
    s.pieces.push_back(piece(7, "value", {}, 12, 0, 12));                          // replicated on every rank
    s.pieces.push_back(piece(8, "value", {4, 6, 1, c.rank() % 2, 2}, 24, 0, 12));  // tp 2, dp 2
    s.pieces.push_back(piece(9, "adam.m", {}, 40, 10 * c.rank(), 10));             // ZeRO: a range per rank
    s.counters = {{"step", 11}};
    s.blobs["data"] = bytes_of("common");
    s.blobs["rng/rank" + std::to_string(c.rank())] = bytes_of("mine " + std::to_string(c.rank()));
    (void)train::save_checkpoint(c, root.path, 11, s);
  });
  const train::checkpoint_reader r(root.path);
  const auto& m = r.manifest();
  CHECK(m.ranks == 4);
  CHECK(m.pieces.size() == 1 + 2 + 4);
  std::map<std::string, int> per_file;
  for (const auto& p : m.pieces) ++per_file[p.file];
  CHECK(per_file["shard-00000.bin"] == 3);  // tensor 7, tensor 8 block 0, tensor 9 range 0
  CHECK(per_file["shard-00001.bin"] == 2);  // tensor 8 block 1, tensor 9 range 1
  CHECK(per_file["shard-00002.bin"] == 1);
  CHECK(per_file["shard-00003.bin"] == 1);
  CHECK(m.blobs.size() == 5);
  CHECK(r.blob("data") == bytes_of("common"));
  CHECK(r.blob("rng/rank3") == bytes_of("mine 3"));
  CHECK(m.files[0].bytes == 32 + 4 * (12 + 12 + 10) + 6 + 6);
  check_read(r, {7, "value", {}, 12, 0, 12}, 0);
  check_read(r, {8, "value", {4, 6, 0, 1, 2}, 24, 0, 12}, 0);
  check_read(r, {9, "adam.m", {}, 40, 0, 40}, 0);
}

TEST_CASE(
    "checkpoint store: a rank's bad snapshot or disagreeing counters fail every rank, and nothing lands") {
  const temp_root root;
  save_two_ranks(root.path, 5);
  CHECK_THROWS_AS(comm::loopback::run(3,
                                      [&](comm::loopback::communicator& c) {
                                        auto s = two_rank_snapshot(c.rank() % 2, 6);
                                        if (c.rank() == 2) s.pieces[0].data.pop_back();  // one element short
                                        (void)train::save_checkpoint(c, root.path, 6, s);
                                      }),
                  invalid_argument);
  CHECK_THROWS_AS(comm::loopback::run(2,
                                      [&](comm::loopback::communicator& c) {
                                        auto s = two_rank_snapshot(c.rank(), 6);
                                        s.counters["step"] = 6 + c.rank();
                                        (void)train::save_checkpoint(c, root.path, 6, s);
                                      }),
                  mismatch_error);
  // Rank 1 cannot write (its root is a regular file): it rethrows its data_error, rank 0 stops too and
  // removes the save's temporary directory.
  std::ofstream(root / "a-file") << "x";
  std::vector<std::string> errors(2);
  CHECK_THROWS_AS(comm::loopback::run(
                      2,
                      [&](comm::loopback::communicator& c) {
                        try {
                          (void)train::save_checkpoint(c, c.rank() == 0 ? root.path : root / "a-file", 6,
                                                       two_rank_snapshot(c.rank(), 6));
                        } catch (const data_error& e) {
                          errors[static_cast<std::size_t>(c.rank())] = "data_error " + std::string(e.what());
                          throw;
                        } catch (const error& e) {
                          errors[static_cast<std::size_t>(c.rank())] = e.what();
                          throw;
                        }
                      }),
                  invalid_argument);  // run() rethrows rank 0's
  CHECK(errors[0].find("writing the shards: 1 of the group of 2 ranks failed") != std::string::npos);
  CHECK(errors[1].rfind("data_error ", 0) == 0);
  CHECK(errors[1].find("a-file") != std::string::npos);
  CHECK(train::latest_checkpoint(root.path) == root / "step-00000005");
  CHECK_FALSE(fs::exists(root / "step-00000006"));
  for (const auto& e : fs::directory_iterator(root.path))
    CHECK(e.path().filename().string().rfind(".tmp-", 0) == std::string::npos);
}

TEST_CASE(
    "checkpoint store: the asynchronous writer saves in the background, prunes to keep, spreads errors") {
  const temp_root root;
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    train::checkpoint_writer w;
    for (std::int64_t step : {1, 2, 3})
      w.save_async(c, root.path, step, two_rank_snapshot(c.rank(), step), {"a", 2});
    CHECK(w.pending());
    w.wait(c);
    CHECK_FALSE(w.pending());
  });
  CHECK(train::latest_checkpoint(root.path) == root / "step-00000003");
  CHECK_FALSE(fs::exists(root / "step-00000001"));
  CHECK(fs::exists(root / "step-00000002"));
  const train::checkpoint_reader r(root.path);
  check_read(r, {2, "adam.m", {}, 48, 0, 48}, 3);
  // Rank 1 cannot write (its root is a regular file): rank 0's commit waits for its index, times out, and
  // wait(c) fails both ranks (each with its own error).
  std::ofstream(root / "a-file") << "x";
  CHECK_THROWS_AS(comm::loopback::run(2,
                                      [&](comm::loopback::communicator& c) {
                                        train::checkpoint_writer w;
                                        const auto dir = c.rank() == 0 ? root.path : root / "a-file";
                                        w.save_async(c, dir, 4, two_rank_snapshot(c.rank(), 4), {"", 2, 0.2});
                                        w.wait(c);
                                      }),
                  timeout_error);
  CHECK(train::latest_checkpoint(root.path) == root / "step-00000003");
}

TEST_CASE("checkpoint store: a commit fails at once on a rank's error marker, naming the rank") {
  const temp_root root;
  const std::string tmp = root / ".tmp-step-00000001-x";
  fs::create_directories(tmp);
  const auto s = two_rank_snapshot(0, 1);
  train::write_checkpoint_part(tmp, 0, 1, 42, s, std::vector<char>(s.pieces.size(), 1),
                               std::vector<char>(1, 1));
  std::ofstream(tmp + "/error-00001.txt") << "disk full";
  try {
    (void)train::commit_checkpoint({root.path, tmp, 1, 42, 2, "float32", "", 2, 60});
    FAIL("expected a data_error");
  } catch (const data_error& e) {
    CHECK(std::string(e.what()).find("rank 1 failed: disk full") != std::string::npos);
  }
  CHECK_FALSE(train::latest_checkpoint(root.path).has_value());
}

TEST_CASE("checkpoint store: a save killed at any file operation leaves the previous checkpoint loadable") {
  const temp_root root;
  save_two_ranks(root.path, 1);
  int killed = 0;
  for (int op = 1; op < 200; ++op) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the child saves step 2 and is killed before operation `op`
      ::setenv("HETMESH_CKPT_KILL_AT", ("2:" + std::to_string(op)).c_str(), 1);
      try {
        save_two_ranks(root.path, 2);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CAPTURE(op);
    const auto latest = train::latest_checkpoint(root.path);
    REQUIRE(latest.has_value());
    const train::checkpoint_reader r(root.path);  // whole, whichever step `latest` names
    const std::int64_t step = r.manifest().step;
    CHECK((step == 1 || step == 2));
    check_read(r, {3, "value", {}, 48, 0, 48}, step);
    if (WIFEXITED(status)) {
      CHECK(WEXITSTATUS(status) == 0);
      CHECK(step == 2);
      break;
    }
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
    ++killed;
    fs::remove_all(root / "step-00000002");  // the next try saves step 2 afresh
    std::ofstream(root / "latest", std::ios::trunc) << "step-00000001\n";
  }
  CHECK(killed > 10);
  save_two_ranks(root.path, 3);  // a later save clears the killed saves' temporaries
  for (const auto& e : fs::directory_iterator(root.path))
    CHECK(e.path().filename().string().rfind(".tmp-", 0) == std::string::npos);
}

namespace {

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void spit(const std::string& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

// Edits the manifest's JSON and seals it again (a new checksum), so that the edit itself is what is caught.
void edit_manifest(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(slurp(dir + "/manifest.json"));
  edit(j);
  j.erase("checksum");
  j["checksum"] = train::checksum_text(train::text_checksum(j.dump()));
  spit(dir + "/manifest.json", j.dump(1));
}
void flip_byte(const std::string& path, std::size_t at) {
  std::string s = slurp(path);
  s.at(at) = static_cast<char>(s[at] ^ 0x20);
  spit(path, s);
}
// The index in manifest.pieces of tensor t field f's piece with block part `part` and begin `begin`.
std::size_t piece_at(const nlohmann::json& j, std::int64_t t, const std::string& f, int part,
                     std::int64_t begin) {
  const auto& ps = j["pieces"];
  for (std::size_t i = 0; i < ps.size(); ++i)
    if (ps[i]["tensor"] == t && ps[i]["field"] == f && ps[i]["block"]["part"] == part &&
        ps[i]["begin"] == begin)
      return i;
  FAIL("no such piece");
  return 0;
}

struct damage {
  const char* name;
  std::function<void(const std::string& root, const std::string& step_dir)> apply;
  std::vector<std::string> mentions;  // the file and the field the error names
  piece_key load{3, "value", {}, 48, 0, 48};
};

std::vector<damage> damages() {
  using nlohmann::json;
  const auto m = [](std::function<void(json&)> f) {
    return [f](const std::string&, const std::string& d) { edit_manifest(d, f); };
  };
  return {
      {"truncated shard",
       [](auto&, auto& d) {
         fs::resize_file(d + "/shard-00001.bin", fs::file_size(d + "/shard-00001.bin") - 1);
       },
       {"shard-00001.bin", "files[1].bytes"}},
      {"flipped byte in a shard",
       [](auto&, auto& d) { flip_byte(d + "/shard-00000.bin", 100); },
       {"shard-00000.bin", "files[0].checksum"}},
      {"flipped byte in a shard's header",
       [](auto&, auto& d) { flip_byte(d + "/shard-00001.bin", 9); },
       {"shard-00001.bin", "manifest id"}},
      {"flipped byte in the manifest",
       [](auto&, auto& d) {
         const auto s = slurp(d + "/manifest.json");
         flip_byte(d + "/manifest.json", s.find("tp2") + 1);
       },
       {"manifest.json", "manifest.checksum"}},
      {"wrong tensor id",
       m([](json& j) { j["pieces"][0]["tensor"] = 99; }),
       {"manifest.json", "pieces[0].tensor = 99"}},
      {"overlapping ranges",
       m([](json& j) { j["pieces"][piece_at(j, 3, "value", 0, 24)]["begin"] = 20; }),
       {"manifest.json", "tensor 3 field 'value'", "starts again"}},
      {"a piece's offset past its file",
       m([](json& j) { j["pieces"][1]["offset"] = 1 << 20; }),
       {"manifest.json", "pieces[1]: offset 1048576"}},
      {"two pieces at one offset",
       m([](json& j) { j["pieces"][1]["offset"] = j["pieces"][0]["offset"]; }),
       {"manifest.json", "overlap in 'shard-00000.bin'"}},
      {"begin + count past the block",
       m([](json& j) { j["pieces"][0]["begin"] = 10; }),
       {"manifest.json", "pieces[0]", "begin 10 + count 24"}},
      {"block parts not dividing the columns",
       m([](json& j) { j["pieces"][piece_at(j, 1, "value", 0, 0)]["block"]["parts"] = 3; }),
       {"manifest.json", "block.parts = 3"}},
      {"block rows x cols not the full size",
       m([](json& j) { j["pieces"][piece_at(j, 2, "value", 0, 0)]["block"]["rows"] = 7; }),
       {"manifest.json", "rows 7 x cols 6"}},
      {"a negative count",
       m([](json& j) { j["pieces"][0]["count"] = -5; }),
       {"manifest.json", "pieces[0]", "count -5"}},
      {"a negative file size",
       m([](json& j) { j["files"][0]["bytes"] = -1; }),
       {"manifest.json", "files[0].bytes = -1"}},
      {"a huge full size (2^62)",
       m([](json& j) { j["tensors"][0]["full"] = std::int64_t{1} << 62; }),
       {"manifest.json", "tensors[0].full = 4611686018427387904"}},
      {"a huge offset (2^62)",
       m([](json& j) { j["pieces"][0]["offset"] = std::int64_t{1} << 62; }),
       {"manifest.json", "pieces[0].offset"}},
      {"a missing shard file",
       [](auto&, auto& d) { fs::remove(d + "/shard-00001.bin"); },
       {"shard-00001.bin", "cannot open"}},
      {"a shard replaced by a directory",
       [](auto&, auto& d) {
         fs::remove(d + "/shard-00000.bin");
         fs::create_directory(d + "/shard-00000.bin");
       },
       {"shard-00000.bin", "a directory"}},
      {"an extra unknown file",
       [](auto&, auto& d) { spit(d + "/stray.bin", "x"); },
       {"stray.bin", "does not list"}},
      {"a manifest from another checkpoint of the same step",
       [](auto& root, auto& d) {
         const std::string other = root + "/other";
         save_two_ranks(other, 5);
         fs::copy_file(other + "/step-00000005/manifest.json", d + "/manifest.json",
                       fs::copy_options::overwrite_existing);
       },
       {"shard-00000.bin", "manifest id"}},
      {"a manifest of another step",
       m([](json& j) { j["step"] = 7; }),
       {"manifest.json", "manifest.step = 7"}},
      {"a wrong dtype", m([](json& j) { j["dtype"] = "float16"; }), {"manifest.json", "dtype = 'float16'"}},
      {"another format version", m([](json& j) { j["version"] = 2; }), {"manifest.json", "version = 2"}},
      {"another format", m([](json& j) { j["format"] = "torch-dcp"; }), {"manifest.json", "manifest.format"}},
      {"latest naming a missing directory",
       [](auto& root, auto&) { spit(root + "/latest", "step-00000009\n"); },
       {"latest", "step-00000009"}},
      {"latest with garbage",
       [](auto& root, auto&) { spit(root + "/latest", "\x01\x02garbage"); },
       {"latest", "expected one line"}},
      {"an empty manifest",
       [](auto&, auto& d) { spit(d + "/manifest.json", ""); },
       {"manifest.json", "invalid JSON"}},
      {"a manifest that is not JSON",
       [](auto&, auto& d) { spit(d + "/manifest.json", "step 5\nranks 2\n"); },
       {"manifest.json", "invalid JSON"}},
      {"a string where a number is expected",
       m([](json& j) { j["step"] = "5"; }),
       {"manifest.json", "manifest.step = \"5\""}},
      {"an object where an array is expected",
       m([](json& j) { j["pieces"] = json::object(); }),
       {"manifest.json", "manifest.pieces"}},
      {"a tensor field missing",
       m([](json& j) { j["tensors"][0].erase("full"); }),
       {"manifest.json", "tensors[0].full is missing"}},
      {"a field the tensor does not list",
       m([](json& j) { j["tensors"][0]["fields"] = {"value"}; }),
       {"manifest.json", "field = 'adam.m'"}},
      {"a piece covering half the tensor",
       m([](json& j) { j["pieces"].erase(piece_at(j, 3, "value", 0, 24)); }),
       {"manifest.json", "tensor 3 field 'value'", "end at element 24"}},
      {"a tensor with no piece",
       m([](json& j) {
         j["tensors"].push_back({{"id", 50}, {"full", 4}, {"fields", {"value"}}});
       }),
       {"manifest.json", "tensor 50 field 'value'", "no piece"}},
      {"a file listed for the wrong rank",
       m([](json& j) { j["files"][1]["rank"] = 0; }),
       {"manifest.json", "files[1]"}},
      {"a counter that is not an integer",
       m([](json& j) { j["counters"]["step"] = 1.5; }),
       {"manifest.json", "manifest.counters.step = 1.5"}},
      {"a full-size mismatch between the load and the manifest",
       [](auto&, auto&) {},
       {"step-00000005", "tensor 3 field 'value' has 48 elements; expected 50"},
       piece_key{3, "value", {}, 50, 0, 50}},
      {"a tensor the checkpoint lacks",
       [](auto&, auto&) {},
       {"step-00000005", "tensor 4 field 'value' is not in it"},
       piece_key{4, "value", {}, 48, 0, 48}},
  };
}

}  // namespace

TEST_CASE("checkpoint store: damaged checkpoints are refused with a data_error naming the file and field") {
  const temp_root good;
  save_two_ranks(good.path);
  int cases = 0;
  for (const auto& d : damages()) {
    CAPTURE(d.name);
    const temp_root root;
    fs::copy(good.path, root.path, fs::copy_options::recursive);
    d.apply(root.path, root / "step-00000005");
    std::vector<float> out(static_cast<std::size_t>(d.load.count), -777.0f);
    try {
      const train::checkpoint_reader r(root.path);
      r.fill(d.load, std::span<float>(out));
      FAIL("expected a data_error");
    } catch (const data_error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      for (const auto& s : d.mentions) CHECK(what.find(s) != std::string::npos);
    }
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == -777.0f; }));  // nothing written
    ++cases;
  }
  CHECK(cases >= 20);
  // The element type: a float32 checkpoint loaded as double is refused before anything is written.
  const train::checkpoint_reader r(good.path);
  std::vector<double> out(48, -1.0);
  CHECK_THROWS_WITH_AS(r.fill(piece_key{1, "value", {}, 48, 0, 48}, std::span<double>(out)),
                       doctest::Contains("dtype = 'float32'; expected 'float64'"), data_error);
  CHECK(std::all_of(out.begin(), out.end(), [](double x) { return x == -1.0; }));
  // A malformed request is the caller's error.
  std::vector<float> few(3);
  CHECK_THROWS_AS(r.fill(piece_key{1, "value", {}, 48, 0, 4}, std::span<float>(few)), invalid_argument);
  CHECK_THROWS_AS(r.fill(piece_key{1, "value", {6, 8, 1, 0, 3}, 48, 0, 3}, std::span<float>(few)),
                  invalid_argument);
}

TEST_CASE("checkpoint store: a collective load of a damaged checkpoint fails every rank, without a hang") {
  const temp_root root;
  save_two_ranks(root.path);
  flip_byte(root / "step-00000005/shard-00001.bin", 200);
  CHECK_THROWS_AS(
      comm::loopback::run(
          2, [&](comm::loopback::communicator& c) { (void)train::load_checkpoint(c, root.path); }),
      data_error);
  const temp_root fine;
  save_two_ranks(fine.path);
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    const auto r = train::load_checkpoint(c, fine.path);
    check_read(r, {1, "value", {6, 8, 0, c.rank(), 2}, 48, 0, 24});
  });
}

#ifdef HETMESH_CKPT_EXE
namespace {
struct tool_result {
  int code = -1;
  std::string out, err;
};
tool_result run_tool(const std::string& args) {
  const temp_root io;
  const std::string cmd =
      std::string(HETMESH_CKPT_EXE) + " " + args + " >" + (io / "out") + " 2>" + (io / "err");
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, slurp(io / "out"), slurp(io / "err")};
}
}  // namespace

TEST_CASE("hetmesh-ckpt: info and verify exit 0 on a good checkpoint, 1 on damage, 2 on misuse") {
  const temp_root root;
  save_two_ranks(root.path, 5, "tp2-pp1");
  auto r = run_tool("info " + root.path);
  CHECK(r.code == 0);
  CHECK(r.out.find("step      5") != std::string::npos);
  CHECK(r.out.find("tp2-pp1") != std::string::npos);
  CHECK(r.out.find("shard-00001.bin") != std::string::npos);
  r = run_tool("verify " + (root / "step-00000005"));
  CHECK(r.code == 0);
  CHECK(r.out.rfind("ok: ", 0) == 0);
  flip_byte(root / "step-00000005/shard-00001.bin", 64);
  r = run_tool("verify " + root.path);
  CHECK(r.code == 1);
  CHECK(r.err.find("shard-00001.bin") != std::string::npos);
  CHECK(r.err.find("checksum") != std::string::npos);
  CHECK(run_tool("info " + root.path).code == 0);  // info reads the manifest only
  CHECK(run_tool("").code == 2);
  CHECK(run_tool("verify").code == 2);
  CHECK(run_tool("verify " + (root / "missing")).code == 2);
  CHECK(run_tool("verify " + root.path + " extra").code == 2);
  CHECK(run_tool("check " + root.path).code == 2);
  CHECK(run_tool("verify --bogus " + root.path).code == 2);
  const temp_root empty;
  CHECK(run_tool("verify " + empty.path).code == 2);  // not a checkpoint at all
  fs::remove(root / "step-00000005/manifest.json");
  r = run_tool("info " + (root / "step-00000005"));
  CHECK(r.code == 1);  // a step directory without its manifest is damaged
  CHECK(r.err.find("manifest.json") != std::string::npos);
}
#endif
