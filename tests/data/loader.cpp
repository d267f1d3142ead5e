// SPDX-License-Identifier: Apache-2.0
// The runtime data plane over real files: the stream is the planner's, verified byte for byte; resume
// from a checkpoint equals an uninterrupted run (also with other worker and loader counts); auto-scaling
// follows cost and weight; memory per trainer rank does not grow with the number of sources; delivery to
// hybrid-parallel groups reads each sample once and broadcasts it.
#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <thread>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/data/checkpoint.hpp>
#include <hetmesh/data/constructor.hpp>
#include <hetmesh/data/loader.hpp>
#include <hetmesh/run/delivery.hpp>

#include "fixtures.hpp"

using namespace hetmesh;
using namespace hetmesh::data;

namespace {

// Two text sources (indexed, one split in two files) and one multimodal WebDataset source.
struct corpus {
  test::temp_dir dir;
  mixture_config cfg;
  explicit corpus(std::int64_t batch = 16) {
    test::make_indexed(dir / "web0", 1, 0, 60, 1, 80);
    test::make_indexed(dir / "code", 1, 1, 45, 20, 200);
    const auto shards = test::make_wds(dir, "img", 1, 2, 3, 10, 4, 30);
    cfg = mixture_config{
        .seed = 1,
        .global_batch = batch,
        .sources = {{.name = "web", .paths = {dir / "web0"}, .weight = {{0, 0.5}, {30, 0.2}}},
                    {.name = "code", .paths = {dir / "code"}, .weight = {{0, 0.3}, {30, 0.3}}},
                    {.name = "img",
                     .format = source_format::webdataset,
                     .paths = shards,
                     .weight = {{0, 0.2}, {30, 0.5}},
                     .modality = "text"}},
        .cost = {.text = {.a = 1, .b = 1}, .item = {.a = 0, .b = 1}},
        .layout = mesh::make_mesh(mesh::dp(2)),
        .micro_batches = 2,
    };
  }
};

// Checks a loaded sample against the generator: tokens (and payloads) are functions of the global index.
void verify(const sample& s) {
  const int src = s.ref.source;
  const std::int64_t lo = src == 0 ? 1 : src == 1 ? 20 : 4, hi = src == 0 ? 80 : src == 1 ? 200 : 30;
  REQUIRE(s.tokens == test::expected_tokens(1, src, s.ref.index, lo, hi));
  if (src == 2) {
    REQUIRE(s.items.size() == 1);
    REQUIRE(s.items[0].tokens == test::item_tokens(1, 2, s.ref.index));
    REQUIRE(s.items[0].payload.size() == static_cast<std::size_t>(100 + s.ref.index % 700));
    REQUIRE(s.items[0].payload[7] == test::payload_byte(1, 2, s.ref.index, 0, 7));
  }
}

std::uint64_t batch_hash(const loaded_batch& b) {
  hasher h;
  append(h, b.plan);
  for (const auto& s : b.samples) append_all(h, s.ref, s.tokens, s.items.size());
  for (const auto& s : b.samples)
    for (const auto& it : s.items) append_all(h, it.kind, it.tokens, it.payload.size());
  return h.digest();
}

}  // namespace

TEST_CASE("data_loader: delivers the planner's stream, verified byte for byte, exactly once per epoch") {
  corpus c;
  data_loader dl(c.cfg, {.workers = 3, .prefetch_steps = 3});
  std::map<std::pair<int, std::int64_t>, std::set<std::int64_t>> seen;
  std::vector<std::int64_t> count(3, 0);
  for (int step = 0; step < 20; ++step) {
    const auto b = dl.next();
    REQUIRE(b.plan.step == step);
    REQUIRE(b.samples.size() == 16);
    for (std::size_t i = 0; i < b.samples.size(); ++i) {
      REQUIRE(b.samples[i].ref == b.plan.samples[i].ref);
      REQUIRE(static_cast<std::int64_t>(b.samples[i].tokens.size()) == b.plan.samples[i].meta.tokens);
      verify(b.samples[i]);
      REQUIRE(seen[{b.samples[i].ref.source, b.samples[i].ref.epoch}].insert(b.samples[i].ref.index).second);
      ++count[static_cast<std::size_t>(b.samples[i].ref.source)];
    }
    // The constructor packs each rank's share: cu_seqlens, positions restarting per document.
    for (int r = 0; r < 2; ++r) {
      const auto mbs = construct(b.plan, b.samples, r, 2);
      for (const auto& mb : mbs) {
        REQUIRE(mb.cu_seqlens.back() == static_cast<std::int32_t>(mb.tokens.size()));
        for (std::size_t d = 0; d + 1 < mb.cu_seqlens.size(); ++d)
          if (mb.cu_seqlens[d + 1] > mb.cu_seqlens[d])
            REQUIRE(mb.positions[static_cast<std::size_t>(mb.cu_seqlens[d])] == 0);
        REQUIRE(deserialize(serialize(mb)) == mb);
      }
    }
  }
  // Every sample handed out was read exactly once (prefetched steps beyond 20 may add reads, not repeats).
  for (int s = 0; s < 3; ++s) CHECK(dl.reads(s) >= count[static_cast<std::size_t>(s)]);
  for (const auto& [key, idx] : seen) {
    const std::int64_t size = key.first == 0 ? 60 : key.first == 1 ? 45 : 30;
    CHECK(static_cast<std::int64_t>(idx.size()) <= size);
  }
  CHECK(seen.count({0, 1}) == 1);  // web wrapped into its second epoch: epoch 0 was complete
  CHECK(seen[{0, 0}].size() == 60);
}

TEST_CASE(
    "data_loader: resume from a checkpoint equals the uninterrupted stream, with other worker and loader "
    "counts") {
  corpus c;
  std::vector<std::uint64_t> straight;
  {
    data_loader dl(c.cfg, {.workers = 2, .prefetch_steps = 2});
    for (int step = 0; step < 24; ++step) straight.push_back(batch_hash(dl.next()));
  }
  const std::string ckpt = c.dir / "state.json";
  {
    data_loader dl(c.cfg, {.workers = 4, .prefetch_steps = 5});
    for (int step = 0; step < 9; ++step)
      REQUIRE(batch_hash(dl.next()) == straight[static_cast<std::size_t>(step)]);
    save_checkpoint(ckpt, c.cfg, dl.state());
    (void)dl.next();  // progress after the checkpoint is lost, as in a crash
  }
  for (int workers : {0, 1, 3}) {
    data_loader dl(c.cfg, {.workers = workers, .prefetch_steps = 1, .loaders_per_source = workers + 1});
    dl.restore(load_checkpoint(ckpt, c.cfg));
    for (int step = 9; step < 24; ++step) {
      auto b = dl.next();
      REQUIRE(batch_hash(b) == straight[static_cast<std::size_t>(step)]);
      dl.recycle(std::move(b));  // reused buffers must not leak into later samples
    }
  }
  // The replayed state at step 9 is the checkpoint's.
  std::vector<std::int64_t> sizes{60, 45, 30};
  CHECK(state_at(c.cfg, 9, sizes) == load_checkpoint(ckpt, c.cfg));
}

TEST_CASE("data_loader: auto-scaling follows cost and weight, and never changes the stream") {
  // Pure sizing: a source twice as costly at equal weight gets about twice the loaders.
  const std::vector<double> cost{1000, 2000, 100};
  const std::vector<std::int64_t> w{weight_one / 3, weight_one / 3, weight_one - 2 * (weight_one / 3)};
  const auto k = autoscale_loaders(cost, w, 12, 8);
  CHECK(k[0] + k[1] + k[2] <= 12);
  CHECK(k[1] > k[0]);
  CHECK(k[0] > k[2]);
  CHECK(k[2] >= 1);
  const std::vector<std::int64_t> w2{weight_one / 10, weight_one * 8 / 10, weight_one / 10};
  const auto k2 = autoscale_loaders(std::vector<double>{1000, 1000, 1000}, w2, 12, 8);
  CHECK(k2[1] == 8);
  CHECK_THROWS_AS((void)autoscale_loaders(cost, w, 2, 8), invalid_argument);

  corpus c;
  std::vector<std::uint64_t> fixed_run;
  {
    data_loader dl(c.cfg, {.workers = 2, .prefetch_steps = 2});
    for (int step = 0; step < 16; ++step) fixed_run.push_back(batch_hash(dl.next()));
  }
  // A slow decode hook on the image source makes it the costly one; the autoscaler gives it more loaders.
  auto slow = [](const wds_record& r, sample& out) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    default_wds_decode(r, out);
  };
  data_loader dl(c.cfg,
                 {.workers = 4,
                  .prefetch_steps = 2,
                  .autoscale = {.enabled = true, .interval_steps = 4, .loader_budget = 8}},
                 slow);
  for (int step = 0; step < 16; ++step)
    REQUIRE(batch_hash(dl.next()) == fixed_run[static_cast<std::size_t>(step)]);
  CHECK(dl.cost_ns(2) > dl.cost_ns(0));
  CHECK(dl.loaders(2) > dl.loaders(0));
  CHECK(dl.loaders(0) + dl.loaders(1) + dl.loaders(2) <= 8);
  CHECK(dl.memory().count_of("source_loader") == dl.loaders(0) + dl.loaders(1) + dl.loaders(2));
}

TEST_CASE("data_loader: a source that runs dry and a corrupt shard are errors after every earlier step") {
  corpus c;
  c.cfg.sources[1].max_epochs = 1;  // code: 45 samples, ~5 per step
  data_loader dl(c.cfg, {.workers = 2, .prefetch_steps = 3});
  int delivered = 0;
  try {
    for (; delivered < 40; ++delivered) (void)dl.next();
    FAIL("the source never ran dry");
  } catch (const data_error& e) {
    CHECK(std::string(e.what()).find("'code' ran dry") != std::string::npos);
  }
  CHECK(delivered >= 8);
  CHECK_THROWS_AS((void)dl.next(), data_error);  // and it stays failed: nothing is skipped

  corpus bad;
  const auto shard = bad.cfg.sources[2].paths[1];
  {
    std::FILE* f = std::fopen(shard.c_str(), "r+b");
    REQUIRE(f != nullptr);
    std::fseek(f, 512 * 2 + 100, SEEK_SET);  // inside the second member's header
    std::fputc('Z', f);
    std::fclose(f);
  }
  data_loader dl2(bad.cfg, {.workers = 2, .prefetch_steps = 2});
  CHECK_THROWS_WITH_AS(
      [&] {
        for (int i = 0; i < 40; ++i) (void)dl2.next();
      }(),
      doctest::Contains("checksum"), data_error);
}

TEST_CASE(
    "memory: loader state lives once per source; a trainer rank's share does not grow with the sources") {
  test::temp_dir dir;
  std::vector<std::int64_t> trainer_rank_bytes;
  std::vector<std::int64_t> loader_bytes;
  for (int nsrc : {1, 4, 16}) {
    mixture_config cfg{.seed = 3, .global_batch = 32, .layout = mesh::make_mesh(mesh::dp(4))};
    for (int s = 0; s < nsrc; ++s) {
      const auto prefix = dir / fmt::format("m{}_{}", nsrc, s);
      test::make_indexed(prefix, 3, s, 200, 50, 50);  // equal lengths: batches differ only in content
      cfg.sources.push_back({.name = fmt::format("s{}", s), .paths = {prefix}, .weight = {{0, 1.0 / nsrc}}});
    }
    cfg.sources.back().weight = {{0, 1.0 - (nsrc - 1) * (1.0 / nsrc)}};
    data_loader dl(cfg, {.workers = 1, .prefetch_steps = 1});
    const auto b = dl.next();
    const auto mem = dl.memory();
    CHECK(mem.count_of("source_loader") == nsrc);
    loader_bytes.push_back(mem.total_of("source_loader"));
    // A trainer rank holds its constructed micro-batches only.
    std::int64_t rank0 = 0;
    for (const auto& mb : construct(b.plan, b.samples, 0, 1)) rank0 += mb.heap_bytes();
    trainer_rank_bytes.push_back(rank0);
  }
  CHECK(trainer_rank_bytes[0] == trainer_rank_bytes[1]);
  CHECK(trainer_rank_bytes[1] == trainer_rank_bytes[2]);
  CHECK(loader_bytes[2] > 8 * loader_bytes[0]);  // the loaders' total grows with sources, once each
}

// The data-parallel index of `rank`, computed from its coordinates: ep and dp flattened, ep fastest.
int expected_dp(const trainer_mesh& t, int rank) {
  const auto& m = t.mesh();
  const auto c = m.coord_of(rank);
  const std::int64_t e = m.has(mesh::ep) ? c[m.index_of(mesh::ep)] : 0;
  const std::int64_t ne = m.has(mesh::ep) ? m.extent(mesh::ep) : 1;
  const std::int64_t d = m.has(mesh::dp) ? c[m.index_of(mesh::dp)] : 0;
  return static_cast<int>(e + ne * d);
}

TEST_CASE(
    "delivery: in every mesh order (and with ep) each data-parallel index's batch reaches exactly the ranks "
    "of that index; each sample read once") {
  struct mesh_case {
    const char* name;
    trainer_mesh mesh;
  };
  const std::vector<mesh_case> cases = {
      {"tp-cp-dp-pp", mesh::make_mesh("tp-cp-dp-pp", mesh::tp(2), mesh::dp(2), mesh::pp(3))},
      {"tp-dp-cp-pp", mesh::make_mesh("tp-dp-cp-pp", mesh::tp(2), mesh::dp(2), mesh::cp(3))},
      {"pp-dp-tp", mesh::make_mesh("pp-dp-tp", mesh::tp(2), mesh::dp(2), mesh::pp(3))},
      {"tp-ep-dp-pp", mesh::make_mesh("tp-cp-ep-dp-pp", mesh::ep(2), mesh::dp(2), mesh::pp(3))},
      {"searched dp-tp-ep-pp", mesh_of_order("dp-tp-ep-pp", {{mesh::tp, 3}, {mesh::dp, 2}, {mesh::ep, 2}})},
  };
  for (const auto& mc : cases) {
    CAPTURE(mc.name);
    corpus c(12);
    c.cfg.layout = mc.mesh;
    const trainer_mesh& t = c.cfg.layout;
    REQUIRE(t.world() == 12);
    data_loader dl(c.cfg, {.workers = 0, .prefetch_steps = 1});  // reads happen inside next() only
    std::vector<loaded_batch> batches;
    for (int i = 0; i < 2; ++i) batches.push_back(dl.next());
    const std::int64_t reads_before = dl.reads(0) + dl.reads(1) + dl.reads(2);
    CHECK(reads_before == 2 * 12);  // every sample of the steps read exactly once
    // The groups partition the trainers; each group is the set of ranks whose coordinates name its index.
    std::vector<int> seen(12, 0);
    for (const auto& g : delivery_plan(t)) {
      CHECK(g.loader == g.ranks.front());
      for (int r : g.ranks) {
        ++seen[static_cast<std::size_t>(r)];
        CHECK(expected_dp(t, r) == g.dp);
      }
    }
    for (int r = 0; r < 12; ++r) CHECK(seen[static_cast<std::size_t>(r)] == 1);
    std::vector<std::vector<std::vector<thd_micro_batch>>> got(batches.size(),
                                                               std::vector<std::vector<thd_micro_batch>>(12));
    comm::loopback::run(12, [&](comm::loopback::communicator& world) {
      const int me = world.rank();
      const bool loads = me == delivery_of(t, t.dp_of(me)).loader;
      for (std::size_t i = 0; i < batches.size(); ++i)
        got[i][static_cast<std::size_t>(me)] = run::deliver(world, c.cfg, loads ? &batches[i] : nullptr);
    });
    CHECK(dl.reads(0) + dl.reads(1) + dl.reads(2) == reads_before);  // delivery read nothing
    for (std::size_t i = 0; i < batches.size(); ++i) {
      std::set<std::vector<std::int64_t>> distinct;  // per index, the ids it got: indices differ
      for (int r = 0; r < 12; ++r) {
        const int dp = expected_dp(t, r);
        const auto& mine = got[i][static_cast<std::size_t>(r)];
        CHECK(mine == construct(batches[i].plan, batches[i].samples, dp, c.cfg.micro_batches));
      }
      for (int d = 0; d < t.dp_size(); ++d) {
        std::vector<std::int64_t> ids;
        for (const auto& smp : batches[i].plan.samples)
          if (smp.dp_rank == d) ids.push_back(smp.meta.id);
        distinct.insert(ids);
      }
      CHECK(distinct.size() == static_cast<std::size_t>(t.dp_size()));
    }
  }
}

TEST_CASE("source_loader: index_run and meta_run equal index_at and meta position by position") {
  corpus c;
  test::make_indexed(c.dir / "web1", 2, 0, 33, 1, 80);
  auto two_parts = c.cfg.sources[0];
  two_parts.paths.push_back(c.dir / "web1");
  auto filtered = c.cfg.sources[1];
  filtered.min_tokens = 60;
  filtered.max_tokens = 150;
  for (const auto& spec : {c.cfg.sources[0], two_parts, filtered, c.cfg.sources[2]}) {
    source_loader l(spec, 0, 7);
    const std::int64_t n = l.size();
    REQUIRE(n > 3);
    for (std::int64_t e : {0, 1, 4}) {
      std::vector<std::int64_t> index(static_cast<std::size_t>(n - 2));
      std::vector<seq::sample_meta> meta(index.size(), seq::sample_meta{.id = 9, .tokens = 1, .owner = 3});
      l.index_run(e, 1, index);
      l.meta_run(index, meta);
      for (std::size_t k = 0; k < index.size(); ++k) {
        REQUIRE(index[k] == l.index_at(e, 1 + static_cast<std::int64_t>(k)));
        REQUIRE(meta[k] == l.meta(index[k]));
      }
    }
    std::vector<std::int64_t> past(3);
    CHECK_THROWS_AS(l.index_run(0, n - 2, past), data_error);  // runs past the epoch's end
    CHECK_THROWS_AS(l.index_run(-1, 0, past), data_error);
    CHECK_THROWS_AS(l.index_run(0, -1, past), data_error);
  }
}
