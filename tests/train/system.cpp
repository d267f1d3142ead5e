// SPDX-License-Identifier: Apache-2.0
// train::system on loopback ranks: gradient parity with a single-rank run (static CP zigzag and THD, HDP
// rings), the exactly-once property of the step plans over random batches, plan purity and hashing,
// and the model's conformance to the stage concepts.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/train/train.hpp>

#include "support/rank0.hpp"
#include "train/cases.hpp"

using namespace hetmesh;
using namespace traintest;

namespace {

using lctx = train::step_context<comm::loopback::communicator, model::reference_attention, double>;
static_assert(model::check_backbone_stage<tiny_lm<double>, double, lctx>());
static_assert(model::backbone_stage<
              tiny_lm<float>, float,
              train::step_context<comm::loopback::communicator, model::reference_attention, float>>);
static_assert(train::attention_context<lctx, double>);
// The concepts live in model/ (train::attention_context names the same one); the library's contexts over
// a real backend model them, for both element types and on emulated device memory.
static_assert(model::attention_context<lctx, double>);
static_assert(model::check_attention_context<
              train::step_context<comm::loopback::communicator, model::reference_attention, float>, float>());
static_assert(
    model::encoder_attention_context<
        train::encoder_context<comm::loopback::communicator, model::reference_attention, double>, double>);
static_assert(model::check_encoder_attention_context<
              train::encoder_context<comm::loopback::communicator, model::reference_attention, float,
                                     model::emulated_device_memory>,
              float>());
// The test model needs attention: against a context without the entry it is no backbone stage.
static_assert(!model::backbone_stage<tiny_lm<double>, double>);

/// Every rank's micro-batches of the step plan of `p` placed by `bal` together hold each stream token and
/// counting target once.
template <class Partition, class Balancer = train::family_placement>
void check_exactly_once(const Partition& p, const model::step_batch& b, int world, const Balancer& bal = {}) {
  const auto plan = train::plan_step(p, model::document_descs(b), world, bal);
  CHECK(plan == train::plan_step(p, model::document_descs(b), world, bal));  // pure
  CHECK(plan.hash() == train::plan_step(p, model::document_descs(b), world, bal).hash());
  const auto s = model::summarize_step(b);
  std::vector<model::micro_batch> all;
  double weights = 0;
  for (int r = 0; r < world; ++r)
    for (auto& mb : train::build_micro_batches(plan, b, s, r)) {
      for (auto w : mb.loss_weights) weights += w;
      CHECK(mb.step_targets == s.targets);
      all.push_back(std::move(mb));
    }
  const auto violation = model::micro_batch_exactly_once_violation(b, all);
  CHECK_MESSAGE(violation.empty(), p.name, " placed by ", Balancer::name, ": ", violation);
  CHECK(static_cast<std::int64_t>(weights) == s.targets);
}

}  // namespace

TEST_CASE("train::system: one step's gradients equal a single-rank run's (loopback, 8 ranks)") {
  parity_cases([](auto body) { return testsupport::rank0_of(8, body); });
}

TEST_CASE("train::system: every token of a step counts in the loss exactly once (random batches)") {
  for (std::uint64_t seed = 100; seed < 130; ++seed) {
    const auto b =
        random_batch(seed, 1 + static_cast<int>(seed % 17), 1 + static_cast<std::int64_t>(seed % 5) * 23);
    for (int cp : {1, 2, 4, 8}) {
      check_exactly_once(seq::cp_zigzag{.cp = cp, .pad = true}, b, 8);
      check_exactly_once(seq::cp_thd{.cp = cp, .pad = true}, b, 8);
      if (cp <= 2)
        check_exactly_once(seq::ulysses{.degree = cp, .heads = 2, .kv_heads = 1, .head_dim = 4}, b, 8);
    }
    check_exactly_once(test_hdp(), b, 8);
    check_exactly_once(test_hdp(seq::hdp_placement_kind::least_loaded), b, 8);
    check_exactly_once(test_hdp(), b, 8, balance::bytescale{});
    check_exactly_once(test_hdp(), b, 8, balance::gap_filling_hdp{});
  }
}

TEST_CASE("train: plans reject bad input with a clear error") {
  const auto b = random_batch(3, 5, 20);
  CHECK_THROWS_AS((void)train::plan_step(seq::cp_thd{.cp = 3, .pad = true}, model::document_descs(b), 8),
                  invalid_argument);
  CHECK_THROWS_AS((void)train::plan_step(seq::cp_zigzag{.cp = 2, .pad = true}, {}, 8), invalid_argument);
  const auto plan = train::plan_step(seq::cp_thd{.cp = 2, .pad = true}, model::document_descs(b), 8);
  const auto other = random_batch(4, 5, 20);
  CHECK_THROWS_AS((void)train::build_micro_batches(plan, other, model::summarize_step(other), 0),
                  invalid_argument);
  CHECK(fmt::format("{}", plan).find("static_cp") != std::string::npos);
  // share_of over the step's metadata: the plan's batch, not another.
  CHECK_THROWS_AS((void)train::share_of(plan, other, data::delivered_share{}), invalid_argument);
  const auto none = train::share_of(plan, b, data::delivered_share{});
  CHECK(none.batch.documents.empty());
  CHECK(none.step_targets == model::summarize_step(b).targets);  // the step's count, its loss masks included
}

TEST_CASE("train: share_of carries loss masks (9 bytes per token) and counts them in the step's targets") {
  auto b = random_batch(21, 6, 30);
  rng g(5);
  for (std::size_t i = 0; i < b.documents.size(); i += 2) {  // every other document masked at random
    auto& d = b.documents[i];
    d.loss_mask.resize(d.tokens.size());
    for (auto& m : d.loss_mask) m = static_cast<std::uint8_t>(g.uniform(0, 1));
  }
  const auto plan = train::plan_step(seq::cp_thd{.cp = 2, .pad = true}, model::document_descs(b), 4);
  data::delivered_share got;
  for (const auto& d : b.documents) {  // every document arrives, masked or not
    const auto bytes = train::text_part_bytes(d);
    CHECK(bytes.size() == d.tokens.size() * (d.loss_mask.empty() ? 8 : 9));
    got.parts.push_back({d.id, data::text_part, static_cast<std::int64_t>(got.bytes.size()),
                         static_cast<std::int64_t>(bytes.size())});
    got.bytes.insert(got.bytes.end(), bytes.begin(), bytes.end());
  }
  const auto share = train::share_of(plan, b, got);
  CHECK(share.batch.documents == b.documents);  // tokens, items and loss masks
  CHECK(share.step_targets == model::summarize_step(b).targets);
  std::int64_t unmasked = 0;
  for (const auto& d : b.documents) unmasked += train::document_targets(d.length(), d.items);
  CHECK(share.step_targets < unmasked);  // the masks removed targets, and the count saw it
  got.parts[0].size -= 1;                // neither 8 nor 9 bytes per token
  CHECK_THROWS_WITH_AS((void)train::share_of(plan, b, got), doctest::Contains("or x 9 with a loss mask"),
                       invalid_argument);
}

TEST_CASE("train::system: sgd updates the parameters from the reduced gradients") {
  const auto b = random_batch(9, 6, 30);
  comm::loopback::run(4, [&](comm::loopback::communicator& c) {
    train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator> sys(
        {.cp = 2, .pad = true}, c);
    tiny_lm<double> lm(kShape, 5);
    const auto before = lm.wout;
    const auto st = sys.run(sys.plan(b), b, lm, train::sgd<double>{0.5});
    CHECK(st.loss > 0);
    for (std::size_t i = 0; i < before.size(); ++i) CHECK(lm.wout[i] == before[i] - 0.5 * lm.gwout[i]);
  });
}

TEST_CASE("train::system: ranks holding different plans fail together (collective assertion level)") {
  static_assert(assertion_enabled(assertion_level::collective), "test_train builds at the collective level");
  const auto b = random_batch(11, 9, 30);
  std::atomic<int> mismatches{0}, free_differs{0};
  comm::loopback::run(8, [&](comm::loopback::communicator& c) {
    train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator> sys(
        {.cp = 2, .pad = true}, c);
    auto plan = sys.plan(b);
    // The system's plan is the free function of its policies, callable without a communicator.
    const auto docs = model::document_descs(b);
    if (!(plan == train::plan_system_step(seq::cp_thd{.cp = 2, .pad = true}, train::family_placement{},
                                          train::pipeline_config<>{}, balance::step_model{}, 8, docs, &b)))
      ++free_differs;
    if (c.rank() == 3)
      plan = train::plan_step(seq::cp_thd{.cp = 4, .pad = true}, model::document_descs(b), 8);
    tiny_lm<double> lm(kShape, 1);
    try {
      (void)sys.run(plan, b, lm, train::sgd<double>{});
    } catch (const mismatch_error& e) {
      if (std::string(e.what()).find("train step plan") != std::string::npos) ++mismatches;
    }
  });
  CHECK(mismatches == 8);
  CHECK(free_differs == 0);
}

TEST_CASE("train::system: overlapping ring communication with compute gives bitwise the same gradients") {
  const auto b = random_batch(12, 12, 60);
  std::vector<double> plain, overlapped;
  for (bool overlap : {false, true})
    comm::loopback::run(8, [&](comm::loopback::communicator& c) {
      const train::system_options opt{.attention = {.overlap = overlap}};
      train::system<seq::hdp<seq::no_offload>, model::reference_attention, comm::loopback::communicator> sys(
          test_hdp(), c, {}, opt);
      step_result<double> r;
      tiny_lm<double> lm(kShape, 2);
      (void)sys.run(sys.plan(b), b, lm, recording_optimizer<double>{&r});
      if (c.rank() == 0) (overlap ? overlapped : plain) = r.grads;
    });
  CHECK(!plain.empty());
  CHECK(plain == overlapped);
}

TEST_CASE("train::system: a step over each rank's delivered share equals the step over the whole batch") {
  // Delivery by plan (train/delivery.hpp): each rank holds only the documents its micro-batches read; the
  // step's gradients, loss and counts are bitwise those of the whole-batch run.
  const auto batch = random_batch(71, 12, 40);
  auto one = [&](const auto& partition) {
    std::vector<std::string> failures(8);
    comm::loopback::run(8, [&](comm::loopback::communicator& c) {
      using P = std::decay_t<decltype(partition)>;
      train::system<P, model::reference_attention, comm::loopback::communicator> sys(partition, c);
      const auto plan = sys.plan(batch);
      step_result<double> whole, shared;
      tiny_lm<double> a(kShape, 5), b(kShape, 5);
      whole.stats = sys.run(plan, batch, a, recording_optimizer<double>{&whole});
      train::rank_share share;
      share.step_targets = model::summarize_step(batch).targets;
      const auto mine = train::documents_of(plan, c.rank());
      for (const auto& d : batch.documents)
        if (std::find(mine.begin(), mine.end(), d.id) != mine.end()) share.batch.documents.push_back(d);
      shared.stats = sys.run(plan, share, b, recording_optimizer<double>{&shared});
      std::string& f = failures[static_cast<std::size_t>(c.rank())];
      if (share.batch.documents.size() >= batch.documents.size()) f += "the share is the whole batch; ";
      if (shared.grads != whole.grads) f += "gradients differ; ";
      if (shared.stats.loss != whole.stats.loss || shared.stats.targets != whole.stats.targets ||
          shared.stats.tokens != whole.stats.tokens)
        f += fmt::format("stats {} vs {}; ", shared.stats, whole.stats);
      // A share without the documents of rank `bad` (the last rank that reads any) is refused there, and
      // the others fail with it at once (collectively, not after a timeout), naming it.
      int bad = -1;
      for (int r = 0; r < c.size(); ++r)
        if (!train::documents_of(plan, r).empty()) bad = r;
      const std::string named = fmt::format("rank {} (global {})", bad, bad);
      train::rank_share none;
      none.step_targets = share.step_targets;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        (void)sys.run(plan, c.rank() == bad ? none : share, b, recording_optimizer<double>{&shared});
        f += "a share without a rank's documents ran; ";
      } catch (const invalid_argument& e) {
        const std::string w = e.what();
        if (c.rank() != bad && w.find(named) == std::string::npos) f += "not named: " + w + "; ";
        if (c.rank() == bad && w.find("failed before it") != std::string::npos) f += "its own error lost; ";
      }
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) f += "waited for a timeout; ";
    });
    for (const auto& f : failures) CHECK(f == "");
  };
  one(test_hdp());
  one(seq::cp_zigzag{.cp = 2, .pad = true});
}
