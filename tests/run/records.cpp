// SPDX-License-Identifier: Apache-2.0
// run::to_step_batch: the one projection of a loaded step (data::loaded_batch) onto the model's step batch
// (model::step_batch): ids, placeholders then text, per-encoder item numbering, loss masks, and the
// refusals (a sample not loaded here, an unknown kind, a mask of the wrong length, a size mismatch).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <hetmesh/model/micro_batch.hpp>
#include <hetmesh/run/records.hpp>

using namespace hetmesh;

namespace {

data::sample make_sample(data::sample_ref ref, std::vector<std::int32_t> tokens,
                         std::vector<data::loaded_item> items, std::vector<std::uint8_t> mask = {}) {
  data::sample s;
  s.ref = ref;
  s.tokens = std::move(tokens);
  s.items = std::move(items);
  s.loss_mask = std::move(mask);
  return s;
}

// Three samples: text only; an image and an audio clip with a mask; two images.
data::loaded_batch three_samples() {
  data::loaded_batch b;
  b.plan.step = 7;
  const data::sample_ref r0{.source = 0, .epoch = 0, .position = 3, .index = 11};
  const data::sample_ref r1{.source = 1, .epoch = 2, .position = 0, .index = 4};
  const data::sample_ref r2{.source = 2, .epoch = 0, .position = 1, .index = 9};
  for (const auto& r : {r0, r1, r2}) b.plan.samples.push_back({.ref = r});
  b.samples.push_back(make_sample(r0, {5, 6, 7}, {}));
  b.samples.push_back(make_sample(
      r1, {8, 2147483647},
      {{.kind = "image", .tokens = 2, .payload = {std::byte{1}}}, {.kind = "audio", .tokens = 1}}, {0, 1}));
  b.samples.push_back(make_sample(r2, {9}, {{.kind = "image", .tokens = 1}, {.kind = "image", .tokens = 3}}));
  return b;
}

}  // namespace

TEST_CASE("run::to_step_batch lays each sample out as a document: placeholders, then text") {
  const auto b = three_samples();
  const run::record_projection p{.encoders = {"image", "audio"}, .placeholder_token = -1, .pad_token = 99};
  const model::step_batch out = run::to_step_batch(b, p);
  CHECK(out.pad_token == 99);
  REQUIRE(out.documents.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(out.documents[i].id == b.plan.samples[i].ref.id());

  const auto& d0 = out.documents[0];
  CHECK(d0.tokens == std::vector<std::int64_t>{5, 6, 7});
  CHECK(d0.items.empty());
  CHECK(d0.loss_mask.empty());

  const auto& d1 = out.documents[1];
  CHECK(d1.tokens == std::vector<std::int64_t>{-1, -1, -1, 8, 2147483647});  // int32 ids widened, not wrapped
  REQUIRE(d1.items.size() == 2);
  CHECK(d1.items[0] == model::encoder_item{.encoder = 0, .id = 0, .position = 0, .tokens = 2});
  CHECK(d1.items[1] == model::encoder_item{.encoder = 1, .id = 0, .position = 2, .tokens = 1});
  CHECK(d1.loss_mask == std::vector<std::uint8_t>{1, 1, 1, 0, 1});

  const auto& d2 = out.documents[2];  // image ids go on from the step's earlier images
  REQUIRE(d2.items.size() == 2);
  CHECK(d2.items[0] == model::encoder_item{.encoder = 0, .id = 1, .position = 0, .tokens = 1});
  CHECK(d2.items[1] == model::encoder_item{.encoder = 0, .id = 2, .position = 1, .tokens = 3});
  CHECK(d2.tokens == std::vector<std::int64_t>{-1, -1, -1, -1, 9});

  CHECK_NOTHROW(model::check_step_batch(out));
  CHECK(run::to_step_batch(b, p) == out);  // pure
}

TEST_CASE("run::encoder_of: the first encoder whose entry prefixes the kind, -1 for none") {
  const run::record_projection p{.encoders = {"image", "aud", "", "image"}};
  CHECK(run::encoder_of(p, "image") == 0);
  CHECK(run::encoder_of(p, "aud0") == 1);  // numbered kinds of one sample
  CHECK(run::encoder_of(p, "aud12") == 1);
  CHECK(run::encoder_of(p, "video") == -1);  // an empty entry takes nothing
  CHECK(run::encoder_of(p, "imag") == -1);
}

TEST_CASE("run::to_step_batch refuses what it cannot project, naming the sample") {
  const run::record_projection p{.encoders = {"image", "audio"}};
  auto message = [&](const data::loaded_batch& b) {
    try {
      (void)run::to_step_batch(b, p);
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  {
    auto b = three_samples();
    b.samples.pop_back();
    CHECK(message(b).find("2 loaded samples for 3 planned") != std::string::npos);
  }
  {
    auto b = three_samples();
    b.samples[1] = data::sample{};  // outside serve_dp: left empty
    CHECK(message(b).find("was not loaded here") != std::string::npos);
  }
  {
    auto b = three_samples();
    b.samples[2].items[1].kind = "video";
    const auto m = message(b);
    CHECK(m.find("kind 'video'") != std::string::npos);
    CHECK(m.find("'image', 'audio'") != std::string::npos);
  }
  {
    auto b = three_samples();
    b.samples[1].loss_mask.push_back(1);
    CHECK(message(b).find("loss mask of 3 entries for 2 text tokens") != std::string::npos);
  }
  {
    auto b = three_samples();
    b.samples[2].items[0].tokens = -1;
    CHECK(message(b).find("-1 tokens") != std::string::npos);
  }
}
