// SPDX-License-Identifier: Apache-2.0
// model/ stage concepts: which types satisfy which concept (each requirement removed in turn), the model
// stages' forward and backward against hand-computed gradients over a pipeline-like order of micro-batches,
// split backward = full backward, several encoders of distinct types, and the stage context's ring.
#include <doctest/doctest.h>

#include <array>
#include <string_view>
#include <tuple>

#include <hetmesh/core/random.hpp>
#include <hetmesh/model/model.hpp>

using namespace hetmesh;
using namespace hetmesh::model;

namespace {

using ctx_t = stage_context<communicator_archetype, host_activation_store<double>>;

// A conforming backbone stage, with each requirement switchable off, to show the concept needs each one.
template <bool Tag, bool Size, bool Fwd, bool Bwd, bool Params, bool BwdI = true, bool BwdW = true>
struct probe {
  using is_backbone_stage = void;
  std::int64_t output_size(const micro_batch_view&) const requires Size { return 0; }
  void forward(ctx_t&, const micro_batch_view&, std::span<const double>, std::span<double>) requires Fwd {}
  void backward(ctx_t&, const micro_batch_view&, std::span<const double>, std::span<double>) requires Bwd {}
  void backward_input(ctx_t&, const micro_batch_view&, std::span<const double>,
                      std::span<double>) requires BwdI {}
  void backward_weight(ctx_t&, const micro_batch_view&) requires BwdW {}
  std::array<std::span<double>, 1> parameters() requires Params { return {}; }
  std::array<std::span<double>, 1> gradients() requires Params { return {}; }
};
template <bool Size, bool Fwd, bool Bwd, bool Params, bool BwdI, bool BwdW>
struct probe<false, Size, Fwd, Bwd, Params, BwdI, BwdW> {  // the same members, no opt-in tag
  std::int64_t output_size(const micro_batch_view&) const { return 0; }
  void forward(ctx_t&, const micro_batch_view&, std::span<const double>, std::span<double>) {}
  void backward(ctx_t&, const micro_batch_view&, std::span<const double>, std::span<double>) {}
  std::array<std::span<double>, 1> parameters() { return {}; }
  std::array<std::span<double>, 1> gradients() { return {}; }
};

static_assert(backbone_stage<probe<true, true, true, true, true>, double, ctx_t>);
static_assert(split_backward_stage<probe<true, true, true, true, true>, double, ctx_t>);
static_assert(!backbone_stage<probe<false, true, true, true, true>, double, ctx_t>);  // 1: opt-in
static_assert(!backbone_stage<probe<true, false, true, true, true>, double, ctx_t>);  // 2: output_size
static_assert(!backbone_stage<probe<true, true, false, true, true>, double, ctx_t>);  // 3: forward
static_assert(!backbone_stage<probe<true, true, true, false, true>, double, ctx_t>);  // 4: backward
static_assert(!backbone_stage<probe<true, true, true, true, false>, double, ctx_t>);  // 5: parameters
static_assert(!split_backward_stage<probe<true, true, true, true, true, false, true>, double, ctx_t>);
static_assert(!split_backward_stage<probe<true, true, true, true, true, true, false>, double, ctx_t>);
static_assert(backbone_stage<probe<true, true, true, true, true, false, false>, double, ctx_t>);
// Element types must match: a double stage is not a float stage.
static_assert(!backbone_stage<probe<true, true, true, true, true>, float, ctx_t>);

// Parameters as a range of spans: vectors and arrays of spans qualify; a range of vectors of another
// element type does not.
static_assert(span_range<std::vector<std::span<float>>, float>);
static_assert(span_range<std::array<std::span<float>, 3>&, float>);
static_assert(
    span_range<std::vector<std::vector<float>>&, float>);  // a vector<float>& converts to span<float>
static_assert(!span_range<std::vector<std::vector<double>>, float>);
static_assert(!span_range<int, float>);

struct video_modality {
  static constexpr std::string_view name = "video";
};
using vision = scale_encoder<double, vision_modality>;
using audio = scale_encoder<double, audio_modality>;
using video = scale_encoder<double, video_modality>;
static_assert(encoder_stage<vision, double> && encoder_stage<audio, double> && encoder_stage<video, double>);
static_assert(!std::is_same_v<vision, audio>);
// An encoder type without a modality is no encoder stage.
struct nameless {
  using is_encoder_stage = void;
  std::int64_t input_size(const encoder_batch_view&) const { return 0; }
  std::int64_t output_size(const encoder_batch_view&) const { return 0; }
  int attention_heads() const { return 0; }
  template <class C>
  void forward(C&, const encoder_batch_view&, std::span<const double>, std::span<double>) {}
  template <class C>
  void backward(C&, const encoder_batch_view&, std::span<const double>, std::span<double>) {}
  std::vector<std::span<double>> parameters() { return {}; }
  std::vector<std::span<double>> gradients() { return {}; }
};
static_assert(!encoder_stage<nameless, double>);

micro_batch tokens_batch(std::int64_t n) {
  step_batch b;
  document d;
  d.id = 1;
  for (std::int64_t i = 0; i < n; ++i) d.tokens.push_back(i + 3);
  b.documents.push_back(d);
  const seq::seq_segment all[1] = {{1, {0, n}}};
  return make_segment_micro_batch(b, all);
}

double value(std::uint64_t seed, std::uint64_t a, std::uint64_t b) {
  return static_cast<double>(key_hash({seed, a, b}) % 2001) / 1000.0 - 1.0;
}

}  // namespace

TEST_CASE("scale_stage: forward and backward over several micro-batches equal the hand-computed gradient") {
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    rng g(seed);
    const std::int64_t width = g.uniform(1, 5);
    const int mbs = static_cast<int>(g.uniform(1, 4));
    scale_stage<double> split(width, 0.5), full(width, 0.5);
    host_activation_store<double> store_split, store_full;
    std::vector<micro_batch> batches;
    std::vector<std::vector<double>> xs, dys;
    for (int m = 0; m < mbs; ++m) batches.push_back(tokens_batch(g.uniform(1, 9)));
    std::vector<double> expected(static_cast<std::size_t>(width), 0.0);
    // All forwards first (as a 1F1B warm-up does), then backwards in reverse order.
    for (int m = 0; m < mbs; ++m) {
      const auto v = batches[static_cast<std::size_t>(m)].view();
      const auto n = static_cast<std::size_t>(split.output_size(v));
      CHECK(n == static_cast<std::size_t>(v.size() * width));
      std::vector<double> x(n), y(n), y2(n), dy(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = value(seed, static_cast<std::uint64_t>(m), i);
      for (std::size_t i = 0; i < n; ++i) dy[i] = value(seed + 1000, static_cast<std::uint64_t>(m), i);
      for (std::size_t i = 0; i < n; ++i) expected[i % static_cast<std::size_t>(width)] += dy[i] * x[i];
      ctx_t cs{}, cf{};
      cs.activations = &store_split;
      cf.activations = &store_full;
      cs.micro_batch = cf.micro_batch = m;
      split.forward(cs, v, x, y);
      full.forward(cf, v, x, y2);
      for (std::size_t i = 0; i < n; ++i) CHECK(y[i] == 0.5 * x[i]);
      CHECK(y == y2);
      xs.push_back(x);
      dys.push_back(dy);
    }
    CHECK(store_split.slots() == static_cast<std::size_t>(mbs));
    for (int m = mbs - 1; m >= 0; --m) {
      const auto v = batches[static_cast<std::size_t>(m)].view();
      const auto& dy = dys[static_cast<std::size_t>(m)];
      std::vector<double> dx(dy.size()), dx2(dy.size());
      ctx_t cs{}, cf{};
      cs.activations = &store_split;
      cf.activations = &store_full;
      cs.micro_batch = cf.micro_batch = m;
      split.backward_input(cs, v, dy, dx);
      split.backward_weight(cs, v);
      full.backward(cf, v, dy, dx2);
      for (std::size_t i = 0; i < dy.size(); ++i) CHECK(dx[i] == 0.5 * dy[i]);
      CHECK(dx == dx2);
    }
    // Every slot was released; split backward adds what the full backward adds.
    CHECK(store_split.slots() == 0);
    CHECK(store_full.slots() == 0);
    const auto gs = split.gradients()[0], gf = full.gradients()[0];
    for (std::size_t h = 0; h < expected.size(); ++h) {
      CHECK(gs[h] == doctest::Approx(expected[h]).epsilon(1e-12));
      CHECK(gs[h] == gf[h]);
    }
    CHECK(split.parameters()[0].size() == static_cast<std::size_t>(width));
  }
}

TEST_CASE("scale_stage: a backward before its forward names the slot") {
  scale_stage<double> s(2);
  host_activation_store<double> store;
  ctx_t c{};
  c.activations = &store;
  c.stage = 1;
  c.micro_batch = 4;
  const auto mb = tokens_batch(3);
  std::vector<double> dy(6, 1.0), dx(6);
  s.backward_input(c, mb.view(), dy, dx);
  CHECK_THROWS_WITH_AS(s.backward_weight(c, mb.view()),
                       doctest::Contains("(stage 1, micro-batch 4, tensor 0) read before"), activation_error);
  std::vector<double> wrong(5);
  CHECK_THROWS_WITH_AS(s.forward(c, mb.view(), wrong, dx),
                       doctest::Contains("input has 5 elements; expected 6"), invalid_argument);
  ctx_t none{};
  CHECK_THROWS_WITH_AS((void)none.slots(), doctest::Contains("has no activation store"), invalid_argument);
}

TEST_CASE("encoders: several encoder types at once, each with its modality and buffers sized by its batch") {
  std::tuple<vision, audio, video> encoders{vision(3, 2.0), audio(1, -1.0), video(2, 0.25)};
  CHECK(std::get<0>(encoders).modality == "vision");
  CHECK(std::get<1>(encoders).modality == "audio");
  CHECK(std::get<2>(encoders).modality == "video");
  host_activation_store<double> store;
  int shard = 0;
  std::apply(
      [&](auto&... enc) {
        (
            [&](auto& e) {
              encoder_batch eb;
              eb.encoder = shard;
              eb.pieces = {{7, 4, {0, 4}, 0, 1, 0}, {9, 10, {5, 7}, 4, 2, 1}};
              eb.tokens = 6;
              const auto v = eb.view();
              const auto n = static_cast<std::size_t>(e.output_size(v));
              CHECK(n == static_cast<std::size_t>(e.input_size(v)));
              std::vector<double> x(n), y(n), dy(n, 1.0);
              for (std::size_t i = 0; i < n; ++i) x[i] = value(5, static_cast<std::uint64_t>(shard), i);
              ctx_t c{};
              c.activations = &store;
              c.stage = shard;
              e.forward(c, v, x, y);
              CHECK(y[1] == e.parameters()[0][1 % e.parameters()[0].size()] * x[1]);
              e.backward(c, v, dy, std::span<double>{});  // raw inputs need no gradient
              double sum = 0;
              for (std::size_t i = 0; i < n; i += e.gradients()[0].size()) sum += x[i];
              CHECK(e.gradients()[0][0] == doctest::Approx(sum));
              ++shard;
            }(enc),
            ...);
      },
      encoders);
  CHECK(store.slots() == 0);
}

TEST_CASE("output_sizes: the pipeline's buffer sizes for a micro-batch") {
  const auto mb = tokens_batch(5);
  const scale_stage<float> a(2), b(7);
  CHECK(output_sizes<float>(mb.view(), a, b) == std::vector<std::int64_t>{10, 35});
}

/// A backbone stage whose output differs by pipeline stage: the optional two-argument output_size.
struct per_stage_sizes : scale_stage<float> {
  per_stage_sizes() : scale_stage<float>(2) {}
  using scale_stage<float>::output_size;
  [[nodiscard]] std::int64_t output_size(const micro_batch_view& mb, int stage) const {
    return mb.size() * 100 + stage;
  }
};
static_assert(backbone_stage<per_stage_sizes, float>);
static_assert(sizes_output_per_stage<per_stage_sizes>);
static_assert(!sizes_output_per_stage<scale_stage<float>>);

TEST_CASE("stage_output_size: the per-stage output_size when the stage has one, else the one-argument form") {
  const auto mb = tokens_batch(5);
  const per_stage_sizes per_stage;
  const scale_stage<float> plain(3);
  CHECK(stage_output_size(per_stage, mb.view(), 0) == 500);
  CHECK(stage_output_size(per_stage, mb.view(), 3) == 503);
  CHECK(per_stage.output_size(mb.view()) == 10);  // the one-argument form is there, and not chosen
  CHECK(stage_output_size(plain, mb.view(), 0) == 15);
  CHECK(stage_output_size(plain, mb.view(), 4) == 15);
}

TEST_CASE("stage_context: ring neighbours are parent ranks, in ring order") {
  communicator_archetype parent;
  const std::vector<int> ring{5, 2, 7};
  stage_context<communicator_archetype> c{};
  c.ring = {&parent, ring, 0};
  CHECK(c.ring.size() == 3);
  CHECK(c.ring.split());
  CHECK(c.ring.next() == 2);
  CHECK(c.ring.prev() == 7);
  c.ring.position = 2;
  CHECK(c.ring.next() == 5);
  CHECK(c.ring.prev() == 2);
  const stage_context<communicator_archetype> whole{};
  CHECK(whole.ring.size() == 1);
  CHECK(!whole.ring.split());
  CHECK(whole.tp == nullptr);
  static_assert(std::is_same_v<decltype(c)::communicator_type, communicator_archetype>);
  static_assert(std::is_void_v<decltype(c)::store_type>);
}

TEST_CASE("stage_context: an HDP micro-batch's ring is its item's ring on the pool communicator") {
  communicator_archetype pool;
  std::vector<seq::seq_desc> seqs{{1, 300}, {2, 40}, {3, 30}, {4, 250}};
  seq::hdp_policy pol;
  pol.capacity = 64;
  const auto plan = seq::plan_hdp(seqs, pol, 8);
  int rings = 0;
  for (int r = 0; r < 8; ++r)
    for (const auto& mb : plan.per_rank[static_cast<std::size_t>(r)]) {
      const auto ring = hdp_ring(pool, plan, mb);
      CHECK(ring.parent == &pool);
      CHECK(ring.size() == mb.degree);
      CHECK(ring.at(ring.position) == r);  // the caller's own pool rank
      CHECK(ring.next() == plan.next_rank(mb));
      CHECK(ring.prev() == plan.prev_rank(mb));
      rings += ring.split() ? 1 : 0;
    }
  CHECK(rings > 0);
}
