// SPDX-License-Identifier: Apache-2.0
// In-process sources (issue 34, item 4): records filled in memory and records generated from their index,
// mixed with an indexed file source in one mixture. Every sample is checked against the function that
// made it; epochs deliver each record once; the quotas follow the weights and the curriculum; the stream
// does not depend on workers or loaders; resume from a checkpoint gives the same next batches; the planner
// balances an in-memory source exactly as the same data in a file; video items reach model::step_batch
// through run::to_step_batch; bad records are refused naming the source, the record and the field.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <set>

#include <hetmesh/data/checkpoint.hpp>
#include <hetmesh/data/loader.hpp>
#include <hetmesh/data/memory_source.hpp>
#include <hetmesh/data/mixture_json.hpp>
#include <hetmesh/run/records.hpp>

#include "fixtures.hpp"

using namespace hetmesh;
using namespace hetmesh::data;

namespace memsrc_test {

constexpr std::int64_t vocab = 1000;
constexpr std::int64_t clips = 24;      // records of the in-memory video source
constexpr std::int64_t generated = 40;  // records of the generated source
constexpr std::int64_t web = 30;        // documents of the indexed file
constexpr std::int64_t patches = 4;     // patches (LLM tokens) per video frame
constexpr std::int64_t dim = 3;         // floats per patch row

std::uint64_t h(std::initializer_list<std::uint64_t> k) { return key_hash(k); }

// Record i of the in-memory video source: a clip of 1-3 frames (frames x patches rows of dim floats), then
// a prompt of 2-6 text tokens whose first target does not count.
memory_record clip(std::int64_t i) {
  const auto u = static_cast<std::uint64_t>(i);
  const std::int64_t frames = 1 + i % 3;
  std::vector<float> rows(static_cast<std::size_t>(frames * patches * dim));
  for (std::size_t k = 0; k < rows.size(); ++k) rows[k] = static_cast<float>(h({11, u, k}) % 1000) / 8.0F;
  memory_record r;
  r.items.push_back(make_item("video", frames * patches, rows));
  const auto n = static_cast<std::size_t>(2 + h({12, u}) % 5);
  for (std::size_t k = 0; k < n; ++k) r.tokens.push_back(static_cast<std::int64_t>(h({13, u, k}) % vocab));
  r.loss_mask.assign(n, 1);
  r.loss_mask[0] = 0;
  return r;
}
std::vector<memory_record> clip_records() {
  std::vector<memory_record> out;
  for (std::int64_t i = 0; i < clips; ++i) out.push_back(clip(i));
  return out;
}

// Record i of the generated source: 3-34 text tokens; every fourth record starts with an image.
memory_record synth(std::int64_t i) {
  const auto u = static_cast<std::uint64_t>(i);
  memory_record r;
  if (i % 4 == 0)
    r.items.push_back(make_item("image", 8, std::vector<std::uint8_t>(5, static_cast<std::uint8_t>(i))));
  const auto n = static_cast<std::size_t>(3 + h({21, u}) % 32);
  for (std::size_t k = 0; k < n; ++k) r.tokens.push_back(static_cast<std::int64_t>(h({22, u, k}) % vocab));
  return r;
}

// (The test cases sit in this namespace too: the test binary is a unity build, and its other files have
// helpers of the same names in anonymous namespaces.)

// The three sources: video in memory, generated text (+ images), and an indexed file. The generated and
// file sources follow a curriculum.
struct mixed {
  test::temp_dir dir;
  mixture_config cfg;
  explicit mixed(std::int64_t batch = 8) {
    test::make_indexed(dir / "web", 3, 2, web, 1, 60);
    cfg = mixture_config{
        .seed = 5,
        .global_batch = batch,
        .sources = {{.name = "clips",
                     .format = source_format::in_process,
                     .weight = {{0, 0.25}},
                     .in_process =
                         from_memory("clips", clip_records(), {.vocab = vocab, .kinds = {"video"}})},
                    {.name = "synthetic",
                     .format = source_format::in_process,
                     .weight = {{0, 0.25}, {20, 0.5}},
                     .in_process = from_generator("synthetic", generated, synth, {.vocab = vocab})},
                    {.name = "web", .paths = {dir / "web"}, .weight = {{0, 0.5}, {20, 0.25}}}},
        .cost = {.text = {.a = 1, .b = 1}, .item = {.a = 0, .b = 2}},
        .layout = mesh::make_mesh(mesh::dp(2)),
        .micro_batches = 2,
    };
  }
};

// The record a loaded sample must equal, by source and index.
void verify(const sample& s) {
  const auto widened = std::vector<std::int64_t>(s.tokens.begin(), s.tokens.end());
  if (s.ref.source == 2) {
    REQUIRE(s.tokens == test::expected_tokens(3, 2, s.ref.index, 1, 60));
    REQUIRE(s.items.empty());
    return;
  }
  const memory_record want = s.ref.source == 0 ? clip(s.ref.index) : synth(s.ref.index);
  REQUIRE(widened == want.tokens);
  REQUIRE(s.items == want.items);
  REQUIRE(s.loss_mask == want.loss_mask);
}

std::uint64_t digest(const loaded_batch& b) {
  hasher g;
  append(g, b.plan);
  for (const auto& s : b.samples) {
    append_all(g, s.ref, s.tokens, s.loss_mask, s.items.size());
    for (const auto& it : s.items) append_all(g, it.kind, it.tokens, it.payload.size());
  }
  return g.digest();
}

TEST_CASE("memory source: mixed with a generated and a file source, every record once per epoch, verified") {
  mixed m;
  data_loader dl(m.cfg, {.workers = 2, .prefetch_steps = 2});
  std::map<std::pair<int, std::int64_t>, std::set<std::int64_t>> seen;
  std::vector<std::int64_t> count(3, 0);
  double expected[3] = {0, 0, 0};
  const int steps = 40;
  for (int step = 0; step < steps; ++step) {
    const auto b = dl.next();
    REQUIRE(b.samples.size() == 8);
    for (std::size_t i = 0; i < b.samples.size(); ++i) {
      const auto& s = b.samples[i];
      REQUIRE(s.ref == b.plan.samples[i].ref);
      REQUIRE(static_cast<std::int64_t>(s.tokens.size()) == b.plan.samples[i].meta.tokens);
      verify(s);
      REQUIRE(seen[{s.ref.source, s.ref.epoch}].insert(s.ref.index).second);  // never twice in an epoch
      ++count[static_cast<std::size_t>(s.ref.source)];
    }
    const auto w = real_weights_at(m.cfg, step);
    for (int s = 0; s < 3; ++s) expected[s] += w[static_cast<std::size_t>(s)] * 8;
    // Weights hold in expectation and better: each source within one sample of its schedule's integral.
    for (int s = 0; s < 3; ++s) REQUIRE(std::abs(static_cast<double>(count[s]) - expected[s]) <= 1.0 + 1e-9);
  }
  // Every finished epoch delivered each record exactly once (a later epoch exists: the earlier is complete).
  const std::int64_t sizes[3] = {clips, generated, web};
  int complete = 0;
  for (const auto& [key, idx] : seen)
    if (seen.contains({key.first, key.second + 1})) {
      CHECK(static_cast<std::int64_t>(idx.size()) == sizes[key.first]);
      CHECK(*idx.begin() == 0);
      CHECK(*idx.rbegin() == sizes[key.first] - 1);
      ++complete;
    }
  CHECK(complete >= 5);  // 40 steps x 8 samples: several epochs of each source
  CHECK(dl.reads(0) >= count[0]);
}

TEST_CASE("memory source: the stream does not depend on workers, loaders per source or a rebuilt config") {
  std::vector<std::uint64_t> first;
  {
    mixed m;
    data_loader dl(m.cfg, {.workers = 0, .prefetch_steps = 0});
    for (int step = 0; step < 12; ++step) first.push_back(digest(dl.next()));
  }
  for (int workers : {1, 3}) {
    mixed m;  // fresh records, fresh generator hook: equal content, equal configuration
    data_loader dl(m.cfg, {.workers = workers, .prefetch_steps = 3, .loaders_per_source = workers});
    for (int step = 0; step < 12; ++step) REQUIRE(digest(dl.next()) == first[static_cast<std::size_t>(step)]);
    // k_s loaders share one copy of the records: reported once as mapped per loader, owned state small.
    const auto mem = dl.memory();
    CHECK(mem.count_of("source_loader") == 3 * workers);
  }
  // Configurations compare and hash by content: equal records give equal configurations; other records not.
  mixed a, b;
  b.cfg.sources[2].paths = a.cfg.sources[2].paths;
  CHECK(a.cfg == b.cfg);
  CHECK(plan_hash(a.cfg) == plan_hash(b.cfg));
  auto other = clip_records();
  other[5].tokens[0] = (other[5].tokens[0] + 1) % vocab;
  b.cfg.sources[0].in_process = from_memory("clips", other);
  CHECK(!(a.cfg == b.cfg));
  CHECK(plan_hash(a.cfg) != plan_hash(b.cfg));
}

TEST_CASE("memory source: resume from a checkpoint gives the same next batches") {
  std::vector<std::uint64_t> straight;
  {
    mixed m;
    data_loader dl(m.cfg, {.workers = 2, .prefetch_steps = 2});
    for (int step = 0; step < 30; ++step) straight.push_back(digest(dl.next()));
  }
  test::temp_dir ckdir;
  const std::string ckpt = ckdir / "state.json";
  {
    mixed m;
    data_loader dl(m.cfg, {.workers = 2, .prefetch_steps = 4});
    for (int step = 0; step < 13; ++step)
      REQUIRE(digest(dl.next()) == straight[static_cast<std::size_t>(step)]);
    save_checkpoint(ckpt, m.cfg, dl.state());
    (void)dl.next();  // lost, as in a crash
  }
  mixed m;  // a new process: the sources are rebuilt from scratch
  data_loader dl(m.cfg, {.workers = 1, .prefetch_steps = 1, .loaders_per_source = 2});
  const auto st = load_checkpoint(ckpt, m.cfg);
  CHECK(st.step == 13);
  CHECK(st.cursors[0].position + st.cursors[1].position > 0);  // the in-process sources' cursors came back
  dl.restore(st);
  for (int step = 13; step < 30; ++step)
    REQUIRE(digest(dl.next()) == straight[static_cast<std::size_t>(step)]);
}

TEST_CASE("memory source: balanced exactly as the same data in an indexed file") {
  // The same text records, once in memory and once written as an indexed dataset: the planner sees the
  // same lengths, so both give the same sample order, prices, ranks and micro-batches.
  test::temp_dir dir;
  test::make_indexed(dir / "same", 9, 0, 50, 1, 120);
  std::vector<memory_record> recs;
  for (std::int64_t i = 0; i < 50; ++i) {
    const auto t = test::expected_tokens(9, 0, i, 1, 120);
    recs.push_back({.tokens = std::vector<std::int64_t>(t.begin(), t.end())});
  }
  auto cfg_of = [&](source_spec s) {
    return mixture_config{.seed = 4,
                          .global_batch = 12,
                          .sources = {std::move(s)},
                          .cost = {.text = {.a = 1, .b = 3}},
                          .layout = mesh::make_mesh(mesh::dp(3)),
                          .micro_batches = 2};
  };
  data_loader file(cfg_of({.name = "t", .paths = {dir / "same"}}), {.workers = 1});
  data_loader mem(
      cfg_of({.name = "t", .format = source_format::in_process, .in_process = from_memory("t", recs)}),
      {.workers = 1});
  for (int step = 0; step < 10; ++step) {
    const auto a = file.next(), b = mem.next();
    REQUIRE(a.plan.samples.size() == b.plan.samples.size());
    CHECK(a.plan.rank_cost == b.plan.rank_cost);
    for (std::size_t i = 0; i < a.plan.samples.size(); ++i) {
      const auto &x = a.plan.samples[i], &y = b.plan.samples[i];
      REQUIRE(x.ref == y.ref);
      REQUIRE(x.cost == y.cost);
      REQUIRE(x.dp_rank == y.dp_rank);
      REQUIRE(x.micro_batch == y.micro_batch);
      REQUIRE(a.samples[i].tokens == b.samples[i].tokens);
    }
  }
}

TEST_CASE("memory source: video items reach model::step_batch in one call, payload rows intact") {
  mixed m;
  data_loader dl(m.cfg, {.workers = 1});
  const run::record_projection proj{.encoders = {"video", "image"}, .placeholder_token = 7, .pad_token = 0};
  int videos = 0;
  for (int step = 0; step < 6; ++step) {
    const loaded_batch b = dl.next();
    const model::step_batch sb =
        run::to_step_batch(b, proj);  // the one call: int32 ids widened, items laid out
    model::check_step_batch(sb);
    REQUIRE(sb.documents.size() == b.samples.size());
    for (std::size_t i = 0; i < b.samples.size(); ++i) {
      const auto& s = b.samples[i];
      const auto& d = sb.documents[i];
      CHECK(d.id == s.ref.id());
      if (s.ref.source != 0) continue;
      const memory_record want = clip(s.ref.index);
      const std::int64_t frames = 1 + s.ref.index % 3;
      REQUIRE(d.items.size() == 1);
      CHECK(d.items[0].encoder == 0);
      CHECK(d.items[0].position == 0);
      CHECK(d.items[0].tokens == frames * patches);
      // Placeholders, then the record's own int64 ids, unchanged.
      CHECK(std::vector<std::int64_t>(d.tokens.begin() + frames * patches, d.tokens.end()) == want.tokens);
      CHECK(d.tokens[0] == 7);
      CHECK(d.loss_mask.size() == d.tokens.size());
      CHECK(d.loss_mask[static_cast<std::size_t>(frames * patches)] == 0);  // the record's mask carried over
      // The encoder's input: the clip's rows, as floats, from the loaded sample.
      CHECK(payload_as<float>(s.items[0]) == payload_as<float>(want.items[0]));
      CHECK(payload_as<float>(s.items[0]).size() == static_cast<std::size_t>(frames * patches * dim));
      ++videos;
    }
  }
  CHECK(videos > 5);
  // An item kind no encoder takes is refused at the projection, naming the kind.
  const run::record_projection text_only{.encoders = {"image"}};
  bool refused = false;
  for (int step = 0; step < 4 && !refused; ++step) {
    const auto b = dl.next();
    bool has_video = false;
    for (const auto& s : b.samples) has_video = has_video || s.ref.source == 0;
    if (!has_video) continue;
    CHECK_THROWS_WITH_AS((void)run::to_step_batch(b, text_only), doctest::Contains("kind 'video'"),
                         invalid_argument);
    refused = true;
  }
  CHECK(refused);
}

TEST_CASE("memory source: a mixture with one has no JSON; the error names the source") {
  memsrc_test::mixed m;
  try {
    (void)mixture_to_json(m.cfg);
    FAIL("mixture_to_json accepted an in-process source");
  } catch (const invalid_argument& e) {
    CHECK(std::string(e.what()).find("'clips' is an in-process source") != std::string::npos);
  }
  m.cfg.sources.erase(m.cfg.sources.begin(), m.cfg.sources.begin() + 2);  // the file source alone
  m.cfg.sources[0].weight = {{0, 1.0}};
  CHECK(mixture_from_json(mixture_to_json(m.cfg)) == m.cfg);
}

TEST_CASE("memory source: bad records and bad specs get clear errors") {
  auto one = [](memory_record r, record_checks c = {}) {
    std::vector<memory_record> v{clip(0), clip(1), clip(2), std::move(r)};
    return from_memory("bad", std::move(v), c);
  };
  CHECK_THROWS_WITH_AS(one({}),
                       "source 'bad' record 3: is empty (no text tokens, no encoder items); expected at "
                       "least one of either",
                       data_error);
  CHECK_THROWS_WITH_AS(
      one({.tokens = {1, 2, 1000}}, {.vocab = vocab}),
      "source 'bad' record 3: token 2 has id 1000; expected in [0, 1000) (record_checks::vocab)", data_error);
  CHECK_THROWS_WITH_AS(one({.tokens = {-1}}),
                       doctest::Contains("token 0 has id -1; expected in [0, 2147483648)"), data_error);
  CHECK_THROWS_WITH_AS(one({.tokens = {std::int64_t{1} << 31}}),
                       doctest::Contains("data::sample holds int32 ids"), data_error);
  memory_record audio{.tokens = {1}};
  audio.items.push_back(make_item("audio", 5, std::vector<float>(5, 1.0F)));
  CHECK_THROWS_WITH_AS(
      one(audio, {.kinds = {"video", "img"}}),
      "source 'bad' record 3: item 0 has kind 'audio'; expected a kind the encoders take [video, "
      "img] (record_checks::kinds)",
      data_error);
  memory_record hollow{.tokens = {1}};
  hollow.items.push_back({.kind = "video", .tokens = 0});
  CHECK_THROWS_WITH_AS(
      one(hollow), doctest::Contains("item 0 ('video') becomes 0 tokens; expected at least one"), data_error);
  CHECK_THROWS_WITH_AS(one({.tokens = {1, 2}, .loss_mask = {1}}),
                       doctest::Contains("loss mask of 1 entries for 2 text tokens"), data_error);
  CHECK_THROWS_AS((void)from_memory("none", {}), invalid_argument);
  CHECK_THROWS_AS((void)from_generator("g", 0, synth), invalid_argument);
  CHECK_THROWS_AS((void)from_generator("g", 10, record_generator{}), invalid_argument);
  CHECK_THROWS_WITH_AS((void)payload_as<double>(make_item("x", 1, std::vector<float>(3))),
                       doctest::Contains("holds 12 bytes; expected a multiple of 8"), data_error);

  // A generated record is checked when it is made: record 13 is bad, and loading it names it.
  const source_spec gen{
      .name = "gen",
      .format = source_format::in_process,
      .in_process = from_generator(
          "gen", 20, [](std::int64_t i) { return i == 13 ? memory_record{.tokens = {5000}} : synth(i); },
          {.vocab = vocab})};
  source_loader l(gen, 0, 1);
  CHECK(l.load({0, 0, 0, 12}).tokens.size() == synth(12).tokens.size());
  CHECK_THROWS_WITH_AS((void)l.load({0, 0, 0, 13}),
                       "source 'gen' record 13: token 0 has id 5000; expected in [0, "
                       "1000) (record_checks::vocab)",
                       data_error);
  // A lengths hook that disagrees with the generator is caught at the load.
  const source_spec liar{.name = "liar",
                         .format = source_format::in_process,
                         .in_process = from_generator("liar", 10, synth, {}, [](std::int64_t i) {
                           seq::sample_meta m{};
                           m.tokens = static_cast<std::int64_t>(synth(i).tokens.size()) + (i == 9);
                           for (const auto& it : synth(i).items) m.item_tokens.push_back(it.tokens);
                           return m;
                         })};
  source_loader ll(liar, 0, 1);
  CHECK(ll.meta(3).tokens == static_cast<std::int64_t>(synth(3).tokens.size()));  // planned from the hook
  CHECK_NOTHROW((void)ll.load({0, 0, 0, 3}));
  CHECK_THROWS_WITH_AS((void)ll.load({0, 0, 0, 9}), doctest::Contains("its lengths hook says"), data_error);

  // Specs: an in_process source needs its hook and no paths; a hook needs format in_process.
  mixed m;
  auto cfg = m.cfg;
  cfg.sources[0].format = source_format::indexed;
  CHECK_THROWS_WITH_AS(validate(cfg), doctest::Contains("expected format = source_format::in_process"),
                       invalid_argument);
  cfg = m.cfg;
  cfg.sources[0].in_process = {};
  CHECK_THROWS_WITH_AS(validate(cfg), doctest::Contains("an in_process source has no hook and 0 paths"),
                       invalid_argument);
  cfg = m.cfg;
  cfg.sources[1].paths = {"x"};
  CHECK_THROWS_AS(validate(cfg), invalid_argument);
  CHECK(to_string(m.cfg.sources[0]).find("in_process") != std::string::npos);
}

TEST_CASE("memory source: long/short buckets over one memory source; an unbounded generator never runs dry") {
  // One set of records, two specs: a short bucket (< 20 tokens with items) and a long one.
  const auto hook = from_generator("g", generated, synth);
  source_loader shorts(
      {.name = "short", .format = source_format::in_process, .max_tokens = 20, .in_process = hook}, 0, 1);
  source_loader longs(
      {.name = "long", .format = source_format::in_process, .min_tokens = 20, .in_process = hook}, 1, 1);
  CHECK(shorts.size() + longs.size() == generated);
  CHECK(shorts.size() > 0);
  CHECK(longs.size() > 0);
  for (std::int64_t p = 0; p < shorts.size(); ++p) {
    const auto mm = shorts.meta(shorts.index_at(0, p));
    CHECK(mm.tokens + mm.encoder_tokens() < 20);
  }

  // Unbounded: read in index order, epoch 0 forever, no permutation held.
  mixture_config cfg{.seed = 2,
                     .global_batch = 6,
                     .sources = {{.name = "stream",
                                  .format = source_format::in_process,
                                  .weight = {{0, 0.5}},
                                  .in_process = from_generator("stream", unbounded, synth)},
                                 {.name = "clips",
                                  .format = source_format::in_process,
                                  .weight = {{0, 0.5}},
                                  .in_process = from_memory("clips", clip_records())}},
                     .layout = mesh::make_mesh(mesh::dp(2))};
  data_loader dl(cfg, {.workers = 1});
  std::int64_t next = 0;
  for (int step = 0; step < 20; ++step) {
    const auto b = dl.next();
    for (const auto& s : b.samples) {
      if (s.ref.source != 0) continue;
      CHECK(s.ref.epoch == 0);
      CHECK(s.ref.index == next++);
      CHECK(std::vector<std::int64_t>(s.tokens.begin(), s.tokens.end()) == synth(s.ref.index).tokens);
    }
  }
  CHECK(next == 60);
  CHECK(dl.memory().total_of("source_loader") < 4096);  // no permutation of 2^37 entries
  // An unbounded source cannot be filtered by length (the filter would scan it).
  CHECK_THROWS_WITH_AS(source_loader({.name = "u",
                                      .format = source_format::in_process,
                                      .max_tokens = 20,
                                      .in_process = from_generator("u", unbounded, synth)},
                                     0, 1),
                       doctest::Contains("cannot take a token filter"), invalid_argument);
}

}  // namespace memsrc_test
