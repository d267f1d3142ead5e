// SPDX-License-Identifier: Apache-2.0
// Defaults from the model (issue 34, item 1): an encoder declares its attention heads and plan(batch,
// encoders...) plans long-short SP with them, so a 2-head encoder trains under the default options with
// no option set; a short item is never split for balance; heads nobody declared split nothing and an item
// that must split says what to declare; a plan whose groups the encoder's heads cannot take is refused by
// run() before any rank runs it. And the model can be built before the first plan: local_stages() and
// num_stages() equal every plan's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/train/train.hpp>

#include "train/pipeline_body.hpp"

using namespace hetmesh;

namespace {

using traintest::kBlocks;
using traintest::kShape;

// A token-local encoder (it scales features) that declares `Heads` attention heads, as an encoder whose
// attention splits heads would: the planner may split its items only over groups dividing Heads.
template <int Heads, class Modality>
struct headed_encoder : model::scale_encoder<double, Modality> {
  using model::scale_encoder<double, Modality>::scale_encoder;
  [[nodiscard]] static constexpr int attention_heads() noexcept { return Heads; }
};

// A batch of `docs` documents whose item (encoder 0) covers tokens [1, 1 + item) of each.
model::step_batch items_batch(int docs, std::int64_t length, std::int64_t item) {
  auto b = traintest::random_batch(9, docs, length);
  for (std::size_t i = 0; i < b.documents.size(); ++i) {
    auto& d = b.documents[i];
    d.tokens.resize(static_cast<std::size_t>(length), 3);
    d.loss_mask.clear();
    d.items.clear();
    d.items.push_back({0, static_cast<std::int64_t>(i), 1, item});
  }
  return b;
}

// The Ulysses group sizes the plan's encoder domain uses for encoder 0.
std::set<int> degrees(const train::step_layout& plan) {
  std::set<int> out;
  for (const auto& slot : plan.encoder_domain)
    if (!slot.empty())
      for (const auto& a : slot[0].items) out.insert(a.degree);
  return out;
}

using sys_t = train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator>;

TEST_CASE("train: a 2-head encoder plans and trains under the default options; a 20-token item is whole") {
  comm::loopback::run(8, [](comm::loopback::communicator& c) {
    sys_t sys(seq::cp_thd{.cp = 1, .pad = true}, c);  // DP over 8 ranks: the encoder domain has 8 ranks
    headed_encoder<2, model::vision_modality> vision(kShape.width, 0.9);
    // One document with a 20-token item, the rest without: the item costs more than the mean per rank,
    // yet it stays whole (min_split_tokens).
    auto batch = items_batch(1, 24, 20);
    for (int d = 0; d < 7; ++d) {
      auto doc = traintest::random_batch(100 + static_cast<std::uint64_t>(d), 1, 20).documents[0];
      doc.id = 5000 + d;
      batch.documents.push_back(std::move(doc));
    }
    const auto plan = sys.plan(batch, vision);
    CHECK(plan.encoder_heads == std::vector<int>{2});
    CHECK(degrees(plan) == std::set<int>{1});
    traintest::tiny_stack<double> lm(kShape, 3, kBlocks, sys.num_stages(), sys.local_stages());
    const auto st = sys.run(plan, batch, lm, train::sgd<double>{0.0},
                            train::bind_encoder(vision, traintest::item_features<double>{kShape.width, 0}));
    CHECK(st.encoder_items == 1);
    CHECK(st.targets == model::summarize_step(batch).targets);
  });
}

TEST_CASE("train: the encoder's heads bound the long-short groups; undeclared heads split nothing") {
  comm::loopback::run(8, [](comm::loopback::communicator& c) {
    train::system_options o;
    o.encoder_sp.max_tokens_per_rank = 6;  // items of 16 tokens must split
    sys_t sys(seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{}, {}, c, {}, o);
    const auto batch = items_batch(2, 20, 16);  // two items: one group of 4 ranks each
    headed_encoder<2, model::vision_modality> two(kShape.width);
    headed_encoder<4, model::vision_modality> four(kShape.width);
    headed_encoder<3, model::vision_modality> three(kShape.width);
    // 16 tokens over groups of <= 6 per rank need 4 ranks: 4 heads allow it, 2 heads do not (capacity).
    CHECK(degrees(sys.plan(batch, four)) == std::set<int>{4});
    CHECK_THROWS_WITH_AS((void)sys.plan(batch, two), doctest::Contains("Ulysses groups must divide heads 2"),
                         capacity_error);
    CHECK_THROWS_WITH_AS((void)sys.plan(batch, three), doctest::Contains("divide heads 3"), capacity_error);
    // No heads given, none set: the item cannot split, and the error says what to declare.
    CHECK_THROWS_WITH_AS((void)sys.plan(batch), doctest::Contains("attention heads are unknown"),
                         capacity_error);
    // A plan made for 4 heads (the option) is refused at run for an encoder that declares 2, on every rank.
    train::system_options o4 = o;
    o4.encoder_sp.heads = 4;
    sys_t sys4(seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{}, {}, c, {}, o4);
    const auto plan = sys4.plan(batch);
    traintest::tiny_stack<double> lm(kShape, 3, kBlocks, sys4.num_stages(), sys4.local_stages());
    CHECK_THROWS_WITH_AS(
        (void)sys4.run(plan, batch, lm, train::sgd<double>{0.0},
                       train::bind_encoder(two, traintest::item_features<double>{kShape.width, 0})),
        doctest::Contains("is split over 4 ranks, but the encoder declares 2 attention heads"),
        invalid_argument);
  });
}

TEST_CASE("seq::plan_long_short: short items stay whole below min_split_tokens; heads 0 splits any way") {
  const std::vector<seq::seq_desc> one{{7, 20}};
  seq::long_short_policy pol{.heads = 8, .cluster = {.devices_per_node = 8}};
  CHECK(pol.plan(one, 8).items.at(0).degree == 1);  // 20 tokens cost more than the mean: still whole
  pol.min_split_tokens = 0;
  CHECK(pol.plan(one, 8).items.at(0).degree > 1);  // the balance rule alone splits it
  const std::vector<seq::seq_desc> big{{1, 100}};
  seq::long_short_policy local{.max_tokens_per_rank = 40, .heads = 0, .cluster = {.devices_per_node = 8}};
  const int d = local.plan(big, 8).items.at(0).degree;  // token-local: any group dividing the node
  CHECK((d == 4 || d == 8));
  seq::long_short_policy two_heads = local;
  two_heads.heads = 2;  // 100 tokens over groups of 2 hold 50 > 40 per rank
  CHECK_THROWS_AS((void)two_heads.plan(big, 8), capacity_error);
  seq::long_short_policy unknown{.max_tokens_per_rank = 40};
  CHECK_THROWS_AS((void)unknown.plan(big, 8), capacity_error);
  seq::long_short_policy bad{.heads = -2};
  CHECK_THROWS_WITH_AS((void)bad.plan(big, 8), doctest::Contains("expected heads >= 0 (or -1: unknown)"),
                       invalid_argument);
}

TEST_CASE("train: HDP with the default options forms rings for a document above capacity, never offloads") {
  std::vector<seq::seq_desc> docs{{1, 60}, {2, 10}, {3, 12}, {4, 9}};
  seq::hdp<seq::selective_offload> hdp{.capacity = 16};  // the default offload model: the link unknown
  auto largest_ring = [&](const auto& plan) {
    int d = 0;
    for (const auto& r : plan.rings) d = std::max(d, r.size());
    return d;
  };
  auto offloads = [&](const auto& plan) {
    for (const auto& list : plan.partition.hdp.per_rank)
      for (const auto& mb : list)
        if (mb.offload_ratio > 0) return true;
    return false;
  };
  const auto plain = train::plan_step(hdp, docs, 8);
  CHECK(largest_ring(plain) >= 4);  // 60 tokens over rings of 16 per rank
  CHECK_FALSE(offloads(plain));
  // A link whose copies hide (declared): the solver trades ranks for offloading, as ByteScale does.
  hdp.model.d2h_bandwidth = hdp.model.h2d_bandwidth = std::numeric_limits<double>::infinity();
  // The layers per rank are unknown by default: a declared link without them is refused by name.
  CHECK(hdp.model.activation.layers == 0);
  CHECK_THROWS_WITH_AS((void)train::plan_step(hdp, docs, 8),
                       doctest::Contains("offload_model.activation.layers is 0 (unknown)"), invalid_argument);
  hdp.model.activation.layers = 32;  // the backbone's layers per rank
  const auto hidden = train::plan_step(hdp, docs, 8);
  CHECK(offloads(hidden));
  CHECK(largest_ring(hidden) < largest_ring(plain));
}

template <class Schedule>
void check_stages_before_plan(int pp) {
  comm::loopback::run(2 * pp, [&](comm::loopback::communicator& c) {
    train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator,
                  train::family_placement, Schedule>
        sys(seq::cp_thd{.cp = 2, .pad = true}, {}, {pp, {}, {}}, c);
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      const auto batch = traintest::random_batch(seed, 3 + static_cast<int>(seed) * 2, 40);
      const auto plan = sys.plan(batch);
      CHECK(plan.pipeline.num_stages == sys.num_stages());
      CHECK(sys.local_stages(plan) == sys.local_stages());
    }
  });
}

TEST_CASE("train::system: local_stages() and num_stages() before any plan equal every plan's") {
  check_stages_before_plan<pipeline::one_f_one_b>(2);
  check_stages_before_plan<pipeline::one_f_one_b>(4);
  check_stages_before_plan<pipeline::interleaved_1f1b>(2);
  check_stages_before_plan<pipeline::zero_bubble>(2);
  check_stages_before_plan<pipeline::zbv>(2);
}

}  // namespace
