// SPDX-License-Identifier: Apache-2.0
// Why a plan did what it did (issue 34, item 1): an HDP document above capacity gets a ring of the ranks its
// length needs with the default options, or, where the declared host link lets copies hide, an offload;
// either way the plan records why (train::plan_reason), prints it, hashes it, and the step's stats, report
// and report JSON carry it. Long-short SP records why it split an encoder item (memory or balance), and a
// 20-token item under the default options is neither split nor given a reason.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/train/report_json.hpp>
#include <hetmesh/train/train.hpp>

#include "train/pipeline_body.hpp"

using namespace hetmesh;

namespace plan_reasons_test {

using traintest::kBlocks;
using traintest::kShape;

// A token-local encoder that declares two attention heads: its items split only over groups of 2.
template <class Modality>
struct two_head_encoder : model::scale_encoder<double, Modality> {
  using model::scale_encoder<double, Modality>::scale_encoder;
  [[nodiscard]] static constexpr int attention_heads() noexcept { return 2; }
};

// Four short documents and one of 60 tokens (id 1000, above a capacity of 16).
model::step_batch long_doc_batch() {
  auto b = traintest::random_batch(5, 5, 12);
  b.documents[0].tokens.resize(60, 3);
  b.documents[0].loss_mask.clear();
  return b;
}

// A batch of `docs` documents of `length` tokens whose item (encoder 0, `item` tokens) starts at token 1.
model::step_batch items_batch(int docs, std::int64_t length, std::int64_t item) {
  auto b = traintest::random_batch(9, docs, length);
  for (std::size_t i = 0; i < b.documents.size(); ++i) {
    auto& d = b.documents[i];
    d.tokens.resize(static_cast<std::size_t>(length), 3);
    d.loss_mask.clear();
    d.items = {{0, static_cast<std::int64_t>(i), 1, item}};
  }
  return b;
}

template <class Offload = seq::selective_offload>
using hdp_sys = train::system<seq::hdp<Offload>, model::reference_attention, comm::loopback::communicator>;

// One step of tiny_stack under `family` (default options otherwise) on 8 loopback ranks: the plan and the
// gathered report's JSON, from rank 0.
template <class Offload>
std::pair<train::step_plan<train::hdp_part>, nlohmann::json> hdp_step(const seq::hdp<Offload>& family) {
  std::pair<train::step_plan<train::hdp_part>, nlohmann::json> out;
  comm::loopback::run(8, [&](comm::loopback::communicator& c) {
    hdp_sys<Offload> sys(family, c);
    const auto batch = long_doc_batch();
    const auto plan = sys.plan(batch);
    traintest::tiny_stack<double> lm(kShape, 3, kBlocks, sys.num_stages(), sys.local_stages());
    const auto st = sys.run(plan, batch, lm, train::sgd<double>{0.0});
    const auto report = train::gather_report(c, st);
    if (c.rank() == 0) out = {plan, train::to_json(report)};
  });
  return out;
}

int largest_ring(const train::step_layout& plan) {
  int d = 0;
  for (const auto& r : plan.rings) d = std::max(d, r.size());
  return d;
}

TEST_CASE("train::plan_reason: HDP with the default options forms a ring above capacity and says why") {
  const auto [plan, js] = hdp_step(seq::hdp<>{.capacity = 16});
  CHECK(largest_ring(plan) == 4);     // 60 tokens over ranks of 16: a ring of 4
  REQUIRE(plan.reasons.size() == 1);  // the short documents needed no decision
  const auto& r = plan.reasons[0];
  CHECK(r.kind == train::reason_kind::ring);
  CHECK(r.cause == train::reason_cause::link_unknown);
  CHECK(r.id == 1000);
  CHECK(r.tokens == 60);
  CHECK(r.limit == 16);
  CHECK(r.ranks == 4);
  CHECK(r.ranks_without_offload == 4);
  CHECK(r.ratio == 0.0);
  const auto printed = fmt::format("{}", plan);
  CHECK(printed.find("reasons=1: [document 1000 (60 tokens > capacity 16): a ring of 4 ranks, nothing "
                     "offloaded: the host link's bandwidth is unknown") != std::string::npos);
  // The step's report and its JSON carry it.
  CHECK(js.at("reason_count").get<std::int64_t>() == 1);
  REQUIRE(js.at("reasons").size() == 1);
  CHECK(js.at("reasons")[0].at("kind") == "ring");
  CHECK(js.at("reasons")[0].at("cause") == "link_unknown");
  CHECK(js.at("reasons")[0].at("ranks").get<int>() == 4);
  CHECK(js.at("reasons")[0].at("why").get<std::string>() == fmt::format("{}", r));
}

TEST_CASE("train::plan_reason: a declared fast host link offloads, and the plan, stats and JSON say why") {
  seq::hdp<> fast{.capacity = 16};
  fast.model.d2h_bandwidth = fast.model.h2d_bandwidth = std::numeric_limits<double>::infinity();
  fast.model.activation.layers = 32;  // a declared link needs the layers per rank
  const auto [plan, js] = hdp_step(fast);
  REQUIRE(plan.reasons.size() == 1);
  const auto& r = plan.reasons[0];
  CHECK(r.kind == train::reason_kind::offload);
  CHECK(r.cause == train::reason_cause::copies_hide);
  CHECK(r.ranks == 1);  // 60 tokens fit one rank once 79% of 30 of 32 layers' activations are offloaded
  CHECK(r.ranks_without_offload == 4);
  CHECK(r.ratio == doctest::Approx(0.79));
  CHECK(r.ratio_max == 1.0);
  CHECK(fmt::format("{}", plan).find("offloaded r=0.79, a ring of 1 instead of 4 ranks: the copies hide") !=
        std::string::npos);
  CHECK(js.at("reason_count").get<std::int64_t>() == 1);
  const auto& j = js.at("reasons")[0];
  CHECK(j.at("kind") == "offload");
  CHECK(j.at("cause") == "copies_hide");
  CHECK(j.at("ranks_without_offload").get<int>() == 4);
  CHECK(j.at("ratio").get<double>() == doctest::Approx(0.79));
  CHECK(j.at("why").get<std::string>().find("the copies hide under compute") != std::string::npos);
}

TEST_CASE("train::plan_reason: why a ring offloads nothing (family, link, compute time, no rank saved)") {
  const std::vector<seq::seq_desc> docs{{1, 60}, {2, 10}, {3, 12}};
  auto cause = [&](const auto& family) {
    const auto plan = train::plan_step(family, docs, 8);
    REQUIRE(plan.reasons.size() == 1);
    CHECK(plan.reasons[0].kind == train::reason_kind::ring);
    CHECK(plan.reasons[0].ranks == 4);
    return plan.reasons[0].cause;
  };
  seq::hdp<seq::no_offload> off{.capacity = 16};
  off.model.d2h_bandwidth = off.model.h2d_bandwidth = std::numeric_limits<double>::infinity();
  off.model.activation.layers = 32;  // a declared link needs the layers per rank
  CHECK(cause(off) == train::reason_cause::offload_off);
  seq::hdp<> link{.capacity = 16};
  CHECK(cause(link) == train::reason_cause::link_unknown);
  link.model.d2h_bandwidth = link.model.h2d_bandwidth = 1e9;  // a finite link, but T(s) = 0: nothing hides
  link.model.activation.layers = 32;                          // a declared link needs the layers per rank
  CHECK(cause(link) == train::reason_cause::untimed_compute);
  link.model.d2h_bandwidth = link.model.h2d_bandwidth = 1.0;  // r_max = T(s) B / Act(s) = 0.001
  link.model.activation.layers = 32;                          // a declared link needs the layers per rank
  link.model.layer = {0.0, 1e-3, 0.0};
  CHECK(cause(link) == train::reason_cause::saves_no_rank);
  // Documents within capacity need no decision.
  const std::vector<seq::seq_desc> shorts{{1, 16}, {2, 10}};
  CHECK(train::plan_step(seq::hdp<>{.capacity = 16}, shorts, 8).reasons.empty());
}

TEST_CASE("train::plan_reason: long-short SP records why it split an item; a 20-token item stays whole") {
  comm::loopback::run(8, [](comm::loopback::communicator& c) {
    using sys_t = train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator>;
    two_head_encoder<model::vision_modality> vision(kShape.width, 0.9);
    // Memory: items of 16 tokens above max_tokens_per_rank 10 split over 2 ranks (the encoder's 2 heads).
    train::system_options o;
    o.encoder_sp.max_tokens_per_rank = 10;
    sys_t small(seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{}, {}, c, {}, o);
    const auto batch = items_batch(2, 20, 16);
    const auto plan = small.plan(batch, vision);
    REQUIRE(plan.reasons.size() == 2);
    for (const auto& r : plan.reasons) {
      CHECK(r.kind == train::reason_kind::split);
      CHECK(r.cause == train::reason_cause::over_memory);
      CHECK(r.encoder == 0);
      CHECK(r.tokens == 16);
      CHECK(r.ranks == 2);
      CHECK(r.limit == 10);
    }
    CHECK(fmt::format("{}", plan.reasons[0]).find("split over 2 ranks: above max_tokens_per_rank 10") !=
          std::string::npos);
    traintest::tiny_stack<double> lm(kShape, 3, kBlocks, small.num_stages(), small.local_stages());
    const auto st = small.run(plan, batch, lm, train::sgd<double>{0.0},
                              train::bind_encoder(vision, traintest::item_features<double>{kShape.width, 0}));
    CHECK(st.reason_count == 2);
    CHECK(st.reasons == plan.reasons);
    // Balance: one 20-token item costs more than the mean per rank; with min_split_tokens 0 it splits.
    auto lone = items_batch(1, 24, 20);
    for (int d = 0; d < 7; ++d) {
      auto doc = traintest::random_batch(100 + static_cast<std::uint64_t>(d), 1, 20).documents[0];
      doc.id = 5000 + d;
      lone.documents.push_back(std::move(doc));
    }
    train::system_options b;
    b.encoder_sp.min_split_tokens = 0;
    sys_t balance(seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{}, {}, c, {}, b);
    const auto split = balance.plan(lone, vision);
    REQUIRE(split.reasons.size() == 1);
    CHECK(split.reasons[0].cause == train::reason_cause::over_balance);
    CHECK(split.reasons[0].cost > split.reasons[0].cost_limit);
    CHECK(split.reasons[0].min_split == 0);
    CHECK(fmt::format("{}", split.reasons[0]).find("above the balance limit") != std::string::npos);
    // The default options: the same 20-token item is whole, and nothing is recorded.
    sys_t defaults(seq::cp_thd{.cp = 1, .pad = true}, c);
    const auto whole = defaults.plan(lone, vision);
    CHECK(whole.reasons.empty());
    CHECK(fmt::format("{}", whole).find("reasons") == std::string::npos);
  });
}

TEST_CASE("train::plan_reason: the plan's hash covers its reasons") {
  const std::vector<seq::seq_desc> docs{{1, 60}, {2, 10}, {3, 12}};
  const auto plan = train::plan_step(seq::hdp<>{.capacity = 16}, docs, 8);
  REQUIRE(plan.reasons.size() == 1);
  CHECK(train::plan_step(seq::hdp<>{.capacity = 16}, docs, 8).hash() == plan.hash());
  auto other = plan;
  other.reasons[0].cause = train::reason_cause::saves_no_rank;
  CHECK(other.hash() != plan.hash());
  other = plan;
  other.reasons[0].ratio_max = 0.5;
  CHECK(other.hash() != plan.hash());
  other = plan;
  other.reasons.clear();
  CHECK(other.hash() != plan.hash());
  // Offloading instead of a ring changes the reasons, and with them the hash.
  seq::hdp<> fast{.capacity = 16};
  fast.model.d2h_bandwidth = fast.model.h2d_bandwidth = std::numeric_limits<double>::infinity();
  fast.model.activation.layers = 32;  // a declared link needs the layers per rank
  CHECK(train::plan_step(fast, docs, 8).reasons != plan.reasons);
}

}  // namespace plan_reasons_test
