// SPDX-License-Identifier: Apache-2.0
// examples/mllm_train/data.hpp: the sources are byte-for-byte reproducible, the step batches valid,
// deterministic and resumable, the curriculum visible, the encoder features class-dependent, and the
// example uses only the data room's public API.
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <hetmesh/train/build.hpp>
#include <mllm_train/data.hpp>

namespace {

namespace fs = std::filesystem;

#ifndef HETMESH_SOURCE_DIR
#error "HETMESH_SOURCE_DIR is not defined: call hetmesh_use_workloads(test_mllm_data)"
#endif

// A temporary folder removed at scope exit.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string p = (fs::temp_directory_path() / "hetmesh-mllm-data-XXXXXX").string();
    REQUIRE(::mkdtemp(p.data()) != nullptr);
    path = p;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

mllm::data_config test_config() {
  mllm::data_config c;
  c.samples_dir = std::string(HETMESH_SOURCE_DIR) + "/examples/data";
  return c;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The class of a multimodal document: its token after the last item, minus the first class token.
std::int64_t class_of(const hetmesh::model::document& d) {
  const auto& last = d.items.back();
  return d.tokens[static_cast<std::size_t>(last.position + last.tokens)] - mllm::first_class_token;
}

// One shared set of sources for the tests that only read them.
const fs::path& shared_sources() {
  static temp_dir dir;
  static const bool made = mllm::make_sources(dir.path, test_config());
  (void)made;
  return dir.path;
}

}  // namespace

TEST_CASE("make_sources: same bytes in two folders, skipped when present, redone when the config changes") {
  const auto cfg = test_config();
  temp_dir a, b;
  CHECK(mllm::make_sources(a.path, cfg));
  CHECK(mllm::make_sources(b.path, cfg));
  for (const auto& f : mllm::source_files(cfg)) {
    INFO(f);
    REQUIRE(fs::exists(a.path / f));
    CHECK(fs::file_size(a.path / f) > 0);
    CHECK(read_bytes(a.path / f) == read_bytes(b.path / f));
  }
  const auto manifest = read_bytes(a.path / "manifest.json");
  CHECK_FALSE(mllm::make_sources(a.path, cfg));  // idempotent: found, not rewritten
  CHECK(read_bytes(a.path / "manifest.json") == manifest);
  auto other = cfg;
  other.seed = 2;
  CHECK_FALSE(mllm::sources_present(a.path, other));
  CHECK(mllm::make_sources(a.path, other));
  CHECK(read_bytes(a.path / "text.bin") != read_bytes(b.path / "text.bin"));
  CHECK(mllm::sources_present(a.path, other));
  CHECK_FALSE(mllm::sources_present(a.path, cfg));
  CHECK_THROWS(mllm::step_source(a.path, cfg));  // the dir holds another config's sources
}

TEST_CASE("step_source: valid batches of about tokens_per_step tokens, placeholders where the items are") {
  const auto cfg = test_config();
  mllm::step_source src(shared_sources(), cfg);
  const std::int64_t base = mllm::first_class_token + cfg.classes;
  const auto chain = mllm::text_gen::successors(cfg);
  std::int64_t follows = 0, transitions = 0;
  for (int s = 0; s < 30; ++s) {
    INFO("step " << s);
    const auto b = src.next();
    CHECK(src.summary().step == s);
    CHECK_NOTHROW(hetmesh::model::check_step_batch(b));
    CHECK(b.pad_token == mllm::pad_token);
    REQUIRE(static_cast<std::int64_t>(b.documents.size()) == src.mixture().global_batch);
    std::int64_t tokens = 0;
    std::int64_t next_id[2] = {0, 0};
    for (const auto& d : b.documents) {
      REQUIRE(d.length() > 0);
      CHECK(d.loss_mask.empty());
      tokens += d.length();
      std::vector<char> in_item(static_cast<std::size_t>(d.length()), 0);
      for (const auto& it : d.items) {
        REQUIRE((it.encoder == mllm::vision_index || it.encoder == mllm::audio_index));
        CHECK(it.id == next_id[it.encoder]++);  // ids 0.. per encoder, in document order
        CHECK(it.tokens >= cfg.min_item_tokens);
        CHECK(it.tokens <= cfg.max_item_tokens);
        CHECK(it.encoder == d.items.front().encoder);  // one modality per sample
        REQUIRE(it.position + it.tokens <= d.length());
        for (auto p = it.position; p < it.position + it.tokens; ++p) in_item[static_cast<std::size_t>(p)] = 1;
        CHECK(static_cast<std::int64_t>(src.item_features(it.encoder, it.id).size()) ==
              it.tokens * src.width(it.encoder));
      }
      for (std::size_t p = 0; p < in_item.size(); ++p)  // placeholders exactly where the items are
        CHECK((d.tokens[p] == mllm::placeholder_token) == (in_item[p] != 0));
      for (auto t : d.tokens) {
        CHECK(t >= mllm::placeholder_token);
        CHECK(t < cfg.vocab);
      }
      if (d.items.empty()) {  // text: ordinary tokens only
        CHECK(d.length() >= cfg.min_doc_tokens);
        CHECK(d.length() <= cfg.max_doc_tokens);
        CHECK(*std::min_element(d.tokens.begin(), d.tokens.end()) >= base);
        for (std::size_t p = 1; p < d.tokens.size(); ++p, ++transitions)
          follows += d.tokens[p] == chain[static_cast<std::size_t>(d.tokens[p - 1] - base)] ? 1 : 0;
      } else {  // placeholders, then the class token and its tail
        const auto& last = d.items.back();
        const auto after = static_cast<std::size_t>(last.position + last.tokens);
        REQUIRE(after + 1 + static_cast<std::size_t>(cfg.class_tail) <= d.tokens.size());
        const auto c = class_of(d);
        CHECK(c >= 0);
        CHECK(c < cfg.classes);
        for (int k = 0; k < cfg.class_tail; ++k)
          CHECK(d.tokens[after + 1 + static_cast<std::size_t>(k)] ==
                mllm::text_gen::class_tail_token(cfg, c, k));
        for (auto p = after + 1; p < d.tokens.size(); ++p) CHECK(d.tokens[p] >= base);
      }
    }
    CHECK(next_id[0] == src.items(0));
    CHECK(next_id[1] == src.items(1));
    CHECK(tokens == src.summary().tokens);
    CHECK(tokens > cfg.tokens_per_step / 3);  // "about": a fixed sample count of varying lengths
    CHECK(tokens < cfg.tokens_per_step * 3);
  }
  // Text is learnable: about 1 - noise of its transitions follow the chain.
  MESSAGE("text transitions on the chain: " << follows << " of " << transitions);
  CHECK(static_cast<double>(follows) > (0.95 - cfg.noise) * static_cast<double>(transitions));
  CHECK(static_cast<double>(follows) < (1.0 - cfg.noise / 2) * static_cast<double>(transitions));
  // The chain is one cycle through every text token.
  std::set<std::int64_t> seen;
  std::int64_t t = base;
  for (std::size_t k = 0; k < chain.size(); ++k, t = chain[static_cast<std::size_t>(t - base)])
    seen.insert(t);
  CHECK(t == base);
  CHECK(seen.size() == chain.size());
}

TEST_CASE("step_source: two sources give identical batches and features; the curriculum shifts the mix") {
  const auto cfg = test_config();
  mllm::step_source a(shared_sources(), cfg), b(shared_sources(), cfg);
  std::int64_t text_early = 0, mm_early = 0, text_late = 0, mm_late = 0;
  const std::int64_t steps = cfg.curriculum_steps + 10;
  for (std::int64_t s = 0; s < steps; ++s) {
    INFO("step " << s);
    const auto ba = a.next();
    REQUIRE(ba == b.next());
    for (int e = 0; e < 2; ++e) {
      REQUIRE(a.items(e) == b.items(e));
      for (std::int64_t i = 0; i < a.items(e); ++i) {
        const auto fa = a.item_features(e, i), fb = b.item_features(e, i);
        CHECK(std::equal(fa.begin(), fa.end(), fb.begin(), fb.end()));
      }
    }
    const auto& q = a.summary().quotas;
    REQUIRE(q.size() == 3);
    if (s < 5) {
      text_early += q[0];
      mm_early += q[1] + q[2];
    } else if (s >= cfg.curriculum_steps) {
      text_late += q[0];
      mm_late += q[1] + q[2];
    }
  }
  MESSAGE("text/multimodal samples, first 5 steps: "
          << text_early << "/" << mm_early << "; after the curriculum: " << text_late << "/" << mm_late);
  CHECK(text_early > 2 * mm_early);  // 0.8 text at step 0
  CHECK(mm_late > 2 * text_late);    // 0.8 multimodal from curriculum_steps on
}

TEST_CASE(
    "step_source: resumed from its state (or its checkpoint file), it continues with the same batches") {
  const auto cfg = test_config();
  const int total = 14, k = 6;
  std::vector<hetmesh::model::step_batch> straight;
  std::vector<std::vector<float>> straight_features;
  {
    mllm::step_source src(shared_sources(), cfg);
    for (int s = 0; s < total; ++s) {
      straight.push_back(src.next());
      std::vector<float> f;
      for (int e = 0; e < 2; ++e)
        for (std::int64_t i = 0; i < src.items(e); ++i) {
          const auto v = src.item_features(e, i);
          f.insert(f.end(), v.begin(), v.end());
        }
      straight_features.push_back(std::move(f));
    }
  }
  hetmesh::data::planner_state st;
  temp_dir tmp;
  {
    mllm::step_source first(shared_sources(), cfg);
    for (int s = 0; s < k; ++s) REQUIRE(first.next() == straight[static_cast<std::size_t>(s)]);
    st = first.state();
    CHECK(first.step() == k);
    first.save(tmp.path / "data-state.json");
    (void)first.next();  // the interrupted run went on a little before it died
  }
  for (int way = 0; way < 2; ++way) {
    INFO((way == 0 ? "restore(state)" : "load(file)"));
    mllm::step_source resumed(shared_sources(), cfg);
    (void)resumed.next();  // whatever it did before restoring does not matter
    if (way == 0)
      resumed.restore(st);
    else
      resumed.load(tmp.path / "data-state.json");
    CHECK(resumed.step() == k);
    for (int s = k; s < total; ++s) {
      INFO("step " << s);
      CHECK(resumed.next() == straight[static_cast<std::size_t>(s)]);
      std::vector<float> f;
      for (int e = 0; e < 2; ++e)
        for (std::int64_t i = 0; i < resumed.items(e); ++i) {
          const auto v = resumed.item_features(e, i);
          f.insert(f.end(), v.begin(), v.end());
        }
      CHECK(f == straight_features[static_cast<std::size_t>(s)]);
    }
  }
}

TEST_CASE("step_source: features are the class pattern plus small noise; input() writes pieces at offsets") {
  const auto cfg = test_config();
  mllm::step_source src(shared_sources(), cfg);
  std::set<std::pair<int, std::int64_t>> classes_seen;
  std::int64_t checked = 0;
  for (std::int64_t s = 0; s < cfg.curriculum_steps + 5; ++s) {
    const auto b = src.next();
    for (const auto& d : b.documents)
      for (const auto& it : d.items) {
        const auto c = class_of(d);
        classes_seen.insert({it.encoder, c});
        const auto f = src.item_features(it.encoder, it.id);
        const int w = src.width(it.encoder);
        std::vector<float> copy(f.size());
        src.features(it.encoder, it.id, copy);
        CHECK(std::equal(copy.begin(), copy.end(), f.begin()));
        for (std::int64_t r = 0; r < it.tokens; ++r)
          for (int j = 0; j < w; ++j) {
            const float v = f[static_cast<std::size_t>(r * w + j)];
            const float p = mllm::class_pattern(cfg, it.encoder, c, j);
            CHECK(std::abs(v - p) <= cfg.feature_noise + 1e-6);  // pattern of ITS class, noise bounded
            CHECK(v != p);                                       // and noise there is
          }
        ++checked;
      }
  }
  CHECK(checked > 50);
  CHECK(classes_seen.size() >= 10);  // both encoders, most classes
  // Classes are told apart by their patterns (and image patterns differ from audio ones).
  for (int e = 0; e < 2; ++e)
    for (int c1 = 0; c1 < cfg.classes; ++c1)
      for (int c2 = c1 + 1; c2 < cfg.classes; ++c2) {
        int differ = 0;
        for (int j = 0; j < mllm::feature_width(cfg, e); ++j)
          differ += mllm::class_pattern(cfg, e, c1, j) != mllm::class_pattern(cfg, e, c2, j) ? 1 : 0;
        CHECK(differ >= 1);
      }
  CHECK_THROWS_AS((void)src.item_features(0, src.items(0)), std::out_of_range);
  std::vector<float> wrong(3);
  if (src.items(0) > 0) CHECK_THROWS_AS(src.features(0, 0, wrong), std::invalid_argument);

  // input(): two pieces of the vision encoder's batch: item 0 whole, then rows [1, 3) of item 1 (a
  // long-short split), in buffer order.
  REQUIRE(src.items(0) >= 2);
  const int w = src.width(0);
  const auto f0 = src.item_features(0, 0), f1 = src.item_features(0, 1);
  const std::int64_t n0 = static_cast<std::int64_t>(f0.size()) / w;
  const std::int64_t n1 = static_cast<std::int64_t>(f1.size()) / w;
  REQUIRE(n1 >= 3);
  std::vector<hetmesh::model::encoder_piece> pieces{
      {.item = 0, .item_tokens = n0, .tokens = {0, n0}, .offset = 0},
      {.item = 1, .item_tokens = n1, .tokens = {1, 3}, .offset = n0}};
  const hetmesh::model::encoder_batch_view v{
      .encoder = 0, .rank = 0, .index = 0, .pieces = pieces, .tokens = n0 + 2};
  std::vector<double> out(static_cast<std::size_t>((n0 + 2) * w), -7.0);
  src.input<double>(0)(v, std::span<double>(out));
  for (std::int64_t k = 0; k < n0 * w; ++k)
    CHECK(out[static_cast<std::size_t>(k)] == static_cast<double>(f0[static_cast<std::size_t>(k)]));
  for (std::int64_t k = 0; k < 2 * w; ++k)
    CHECK(out[static_cast<std::size_t>(n0 * w + k)] ==
          static_cast<double>(f1[static_cast<std::size_t>(w + k)]));
  std::vector<float> small(static_cast<std::size_t>(n0 * w));
  CHECK_THROWS_AS(src.input(0)(v, std::span<float>(small)), std::out_of_range);
}

TEST_CASE("examples/mllm_train uses only the data room's public API (no detail:: names)") {
  const fs::path dir = fs::path(HETMESH_SOURCE_DIR) / "examples" / "mllm_train";
  REQUIRE(fs::exists(dir / "data.hpp"));
  // `detail::` as a whole name (not the tail of another identifier such as ckpt_detail::).
  const auto internal = [](const std::string& line) {
    for (auto at = line.find("detail::"); at != std::string::npos; at = line.find("detail::", at + 1)) {
      const char before = at == 0 ? ' ' : line[at - 1];
      if (!(std::isalnum(static_cast<unsigned char>(before)) || before == '_')) return true;
    }
    return false;
  };
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const auto ext = e.path().extension().string();
    if (ext != ".hpp" && ext != ".cpp" && ext != ".h" && ext != ".cuh") continue;
    ++files;
    std::ifstream in(e.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      INFO(e.path().string() << ":" << n << ": " << line);
      CHECK_FALSE(internal(line));
    }
  }
  CHECK(files >= 1);
}

TEST_CASE("step_source: answer_only_loss masks the captions (only the targets the class decides count)") {
  auto cfg = test_config();
  cfg.answer_only_loss = true;
  temp_dir dir;
  REQUIRE(mllm::make_sources(dir.path, cfg));
  mllm::step_source masked(dir.path, cfg), plain(shared_sources(), test_config());
  std::int64_t multimodal = 0;
  for (int s = 0; s < 12; ++s) {
    INFO("step " << s);
    const auto b = masked.next();
    const auto u = plain.next();
    CHECK_NOTHROW(hetmesh::model::check_step_batch(b));
    REQUIRE(b.documents.size() == u.documents.size());
    for (std::size_t i = 0; i < b.documents.size(); ++i) {
      const auto& d = b.documents[i];
      CHECK(d.tokens == u.documents[i].tokens);  // the mask changes what counts, not the data
      CHECK(d.items == u.documents[i].items);
      const auto text = masked.part_bytes(d, hetmesh::data::text_part);
      if (d.items.empty()) {  // text documents: no mask, every target counts
        CHECK(d.loss_mask.empty());
        CHECK(text.size() == 8 * d.tokens.size());
        continue;
      }
      ++multimodal;
      REQUIRE(d.loss_mask.size() == d.tokens.size());
      const auto caption = d.items.back().position + d.items.back().tokens;  // the class token's position
      for (std::int64_t p = 0; p < d.length(); ++p)
        CHECK(d.loss_mask[static_cast<std::size_t>(p)] == (p < caption + cfg.class_tail ? 1 : 0));
      // The last placeholder predicts the class, then class_tail tokens follow from it: nothing else counts.
      CHECK(hetmesh::train::document_targets(d) == 1 + cfg.class_tail);
      CHECK(hetmesh::train::document_targets(u.documents[i]) > 1 + cfg.class_tail);
      const auto want = hetmesh::train::text_part_bytes(d);  // delivery by plan moves the mask with the text
      CHECK(std::vector<std::uint8_t>(text.begin(), text.end()) == want);
    }
  }
  CHECK(multimodal > 10);
}
