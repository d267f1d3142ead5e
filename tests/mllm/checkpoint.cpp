// SPDX-License-Identifier: Apache-2.0
// examples/mllm_train/checkpoint.hpp: a save loads back bit for bit on every rank; `latest` names the
// newest complete step, a half-written step directory is never read and older steps are pruned; and a
// damaged checkpoint (a flipped byte, a truncated or missing file, a FIFO, a NaN or Inf value, a negative
// second moment, an impossible Adam step, another world size or model split, a tampered manifest or
// `latest`) is refused with an error naming the file and the field. (Kills at every file operation of a
// save: examples/mllm_train/checkpoint_test.cmake.)
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <mllm_train/checkpoint.hpp>

#include "support/special_files.hpp"

namespace {

namespace fs = std::filesystem;
namespace ck = mllm::ckpt;

// A temporary folder removed at scope exit.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static int n = 0;
    path = fs::temp_directory_path() /
           ("hetmesh-mllm-ckpt-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct tensor {
  std::int64_t id = 0;
  std::vector<float> value, m, v;
  std::int64_t t = 0;
};
using rank_tensors = std::vector<tensor>;

// Two tensors per rank whose values depend on the rank, the step and the tensor.
std::vector<rank_tensors> make_world(int ranks, std::int64_t step) {
  std::vector<rank_tensors> out(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    for (std::int64_t id : {3 + r, 10 + r}) {
      tensor t{id, {}, {}, {}, step + 1};
      for (int i = 0; i < 5 + r; ++i) {
        t.value.push_back(0.25F * static_cast<float>(i + id) - static_cast<float>(step));
        t.m.push_back(-0.5F * static_cast<float>(i));
        t.v.push_back(0.125F * static_cast<float>(i * i));
      }
      out[static_cast<std::size_t>(r)].push_back(std::move(t));
    }
  return out;
}

// The whole save protocol as train() runs it (begin, every rank, commit with a data file).
void save(const fs::path& root, std::int64_t step, const std::vector<rank_tensors>& world) {
  ck::begin_save(root, step);
  for (std::size_t r = 0; r < world.size(); ++r) {
    std::vector<ck::tensor_view> views;
    for (const auto& t : world[r]) views.push_back({t.id, t.value, t.m, t.v, t.t});
    ck::save_rank(root, step, static_cast<int>(r), views);
  }
  ck::commit_save(root, step, static_cast<int>(world.size()), [&](const fs::path& p) {
    std::ofstream(p, std::ios::binary) << "{\"step\": " << step + 1 << "}\n";
  });
}

// The message of what `f` throws ("" when it returns).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string load_error(const fs::path& root, int ranks = 2) {
  return error_of([&] { (void)ck::load_latest(root, 0, ranks); });
}

void overwrite(const fs::path& p, std::streamoff at, const void* bytes, std::size_t n) {
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(at);
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
  REQUIRE(f.good());
}

// The offset of tensor 0's value[i] in a rank file: header (8 + 4 * 8 bytes), tensor header (3 * 8).
constexpr std::streamoff value_at(int i) { return 40 + 24 + 4 * i; }

}  // namespace

TEST_CASE("a saved checkpoint loads back bit for bit on every rank, with its data position") {
  temp_dir d;
  const auto world = make_world(2, 4);
  save(d.path, 4, world);
  CHECK(ck::latest_name(d.path) == "step-00000004");
  for (int r = 0; r < 2; ++r) {
    const auto from = ck::load_latest(d.path, r, 2);
    CHECK(from.step == 4);
    CHECK(from.ranks == 2);
    CHECK(from.dir == d.path / "step-00000004");
    std::ifstream data(from.data_file());
    CHECK(std::string(std::istreambuf_iterator<char>(data), {}) == "{\"step\": 5}\n");
    REQUIRE(from.mine.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      const auto& want = world[static_cast<std::size_t>(r)][i];
      std::vector<float> value(want.value.size()), m(value.size()), v(value.size());
      CHECK(from.mine.restore(i, want.id, value, m, v) == want.t);
      CHECK(value == want.value);
      CHECK(m == want.m);
      CHECK(v == want.v);
    }
    std::vector<float> wrong(3);
    CHECK(error_of([&] {
            (void)from.mine.restore(0, 99, wrong, wrong, wrong);
          }).find("another model split") != std::string::npos);
  }
}

TEST_CASE("latest names the newest complete step; a torn step directory is ignored, then replaced") {
  temp_dir d;
  for (std::int64_t s = 0; s < 3; ++s) save(d.path, s, make_world(2, s));
  // Pruned only after latest moved: the new step and the one before it stay.
  CHECK(!fs::exists(d.path / "step-00000000"));
  CHECK(fs::exists(d.path / "step-00000001" / "manifest"));
  CHECK(ck::latest_name(d.path) == "step-00000002");
  // A save killed after some rank files: latest still names step 2, which loads.
  ck::begin_save(d.path, 3);
  const auto next = make_world(2, 3);
  std::vector<ck::tensor_view> views;
  for (const auto& t : next[0]) views.push_back({t.id, t.value, t.m, t.v, t.t});
  ck::save_rank(d.path, 3, 0, views);
  CHECK(ck::load_latest(d.path, 1, 2).step == 2);
  // The next save of step 3 starts its directory afresh.
  std::ofstream(d.path / "step-00000003" / "stray") << "left by a killed save";
  save(d.path, 3, next);
  CHECK(!fs::exists(d.path / "step-00000003" / "stray"));
  CHECK(ck::load_latest(d.path, 1, 2).step == 3);
  // A save never writes into the directory latest names.
  CHECK(error_of([&] { ck::begin_save(d.path, 3); }).find("would overwrite") != std::string::npos);
}

using testsupport::with_file_size_limit;

TEST_CASE("a full disk during a save fails it naming the file; latest and the step before stay whole") {
  temp_dir d;
  const auto world = make_world(2, 4);
  save(d.path, 4, world);
  // A rank file holds two tensors of 5-6 values with their two moments (over 120 bytes): 64 bytes do not
  // hold it, so the first rank file of step 5 fails part-way.
  const int rc = with_file_size_limit(64, [&] {
    const auto e = error_of([&] { save(d.path, 5, make_world(2, 5)); });
    if (e.empty()) return 2;                                      // the save claimed success
    return e.find("step-00000005") != std::string::npos ? 0 : 3;  // the error names the file
  });
  CHECK(rc == 0);
  CHECK(ck::latest_name(d.path) == "step-00000004");
  for (int r = 0; r < 2; ++r) {
    const auto from = ck::load_latest(d.path, r, 2);
    CHECK(from.step == 4);
    std::vector<float> value(world[static_cast<std::size_t>(r)][0].value.size()), m(value.size()),
        v(value.size());
    (void)from.mine.restore(0, world[static_cast<std::size_t>(r)][0].id, value, m, v);
    CHECK(value == world[static_cast<std::size_t>(r)][0].value);
  }
  // The next save, with room, replaces the torn step 5 and moves latest.
  save(d.path, 5, make_world(2, 5));
  CHECK(ck::load_latest(d.path, 1, 2).step == 5);
}

TEST_CASE("a damaged file is refused before anything is read from it, naming it") {
  temp_dir d;
  save(d.path, 1, make_world(2, 1));
  const fs::path dir = d.path / "step-00000001";
  SUBCASE("a flipped byte in a rank file") {
    const char x = 0x5a;
    overwrite(dir / "rank-1.bin", value_at(2), &x, 1);
    const auto e = load_error(d.path);
    CHECK(e.find("rank-1.bin': checksum") != std::string::npos);
    CHECK(e.find("corrupt") != std::string::npos);
  }
  SUBCASE("a flipped byte in the data position") {
    const char x = '9';
    overwrite(dir / "data.ckpt", 10, &x, 1);
    CHECK(load_error(d.path).find("data.ckpt': checksum") != std::string::npos);
  }
  SUBCASE("a truncated rank file") {
    fs::resize_file(dir / "rank-0.bin", 50);
    CHECK(load_error(d.path).find("rank-0.bin' has 50 bytes; the manifest says") != std::string::npos);
  }
  SUBCASE("a missing rank file") {
    fs::remove(dir / "rank-1.bin");
    CHECK(load_error(d.path).find("cannot open '" + (dir / "rank-1.bin").string()) != std::string::npos);
  }
  SUBCASE("a FIFO for a rank file (refused, not blocked on)") {
    fs::remove(dir / "rank-0.bin");
    REQUIRE(::mkfifo((dir / "rank-0.bin").c_str(), 0644) == 0);
    CHECK(load_error(d.path).find("rank-0.bin' is not a regular file") != std::string::npos);
  }
  SUBCASE("no manifest") {
    fs::remove(dir / "manifest");
    CHECK(load_error(d.path).find("manifest") != std::string::npos);
  }
  SUBCASE("a tampered manifest") {
    std::ofstream(dir / "manifest", std::ios::app) << "file extra.bin 1 0000000000000000\n";
    CHECK(load_error(d.path).find("unexpected line") != std::string::npos);
  }
  SUBCASE("a manifest of another step than its directory") {
    fs::rename(dir, d.path / "step-00000007");
    std::ofstream(d.path / "latest", std::ios::trunc) << "step-00000007\n";
    CHECK(load_error(d.path).find("step 1; its directory is 'step-00000007'") != std::string::npos);
  }
  SUBCASE("another world size") {
    CHECK(load_error(d.path, 3).find("written by 2 ranks; this run has 3") != std::string::npos);
  }
  SUBCASE("no latest, or a latest that names no step directory") {
    fs::remove(d.path / "latest");
    CHECK(load_error(d.path).find("holds no complete checkpoint") != std::string::npos);
    CHECK(ck::latest_name(d.path).empty());
    std::ofstream(d.path / "latest") << "../../etc\n";
    CHECK(load_error(d.path).find("expected the name of a step directory") != std::string::npos);
  }
}

TEST_CASE("NaN or Inf state and impossible counters are refused, naming the file, the tensor and the field") {
  temp_dir d;
  auto world = make_world(2, 5);
  std::string want;
  SUBCASE("a NaN weight") {
    world[1][0].value[2] = std::numeric_limits<float>::quiet_NaN();
    want = "rank-1.bin': tensor 4 value[2] = nan; expected a finite value";
  }
  SUBCASE("an Inf first moment") {
    world[0][1].m[1] = -std::numeric_limits<float>::infinity();
    want = "rank-0.bin': tensor 10 adam m[1] = -inf";
  }
  SUBCASE("a negative second moment") {
    world[0][0].v[3] = -1.0F;
    want = "tensor 3 adam v[3] = -1; expected a finite, non-negative value";
  }
  SUBCASE("a negative Adam step") {
    world[1][1].t = -1;
    want = "rank-1.bin': tensor 11 Adam step -1; expected 0 to 6 after step 5";
  }
  SUBCASE("more Adam steps than steps run") {
    world[0][0].t = 7;
    want = "tensor 3 Adam step 7; expected 0 to 6";
  }
  save(d.path, 5, world);  // saving does not judge the state; loading does, on every rank alike
  for (int r = 0; r < 2; ++r) {
    const auto e = error_of([&] { (void)ck::load_latest(d.path, r, 2); });
    CHECK_MESSAGE(e.find(want) != std::string::npos, e);
  }
}
