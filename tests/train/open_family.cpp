// SPDX-License-Identifier: Apache-2.0
// Proof that train::system's families are open: a partition family, two balancers and an encoder placement
// defined here, outside include/, train through train::system with gradient parity against a 1-rank run,
// with no edit under include/. And the plan hash covers the encoder domain: ranks that differ only in their
// long-short policy (system_options::encoder_sp) are caught before they communicate.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/pipeline/joint.hpp>
#include <hetmesh/seq/cp.hpp>
#include <hetmesh/train/train.hpp>

#include "support/rank0.hpp"
#include "train/pipeline_cases.hpp"

namespace userland {

using namespace hetmesh;

/// A partition family: every document zigzagged over a ring of `degree` ranks; document k (in the
/// balancer's order) starts at pool rank (k * degree) mod pool, so rings wrap around the pool and overlap
/// the ones before them (no fixed groups, unlike static CP).
struct fixed_rings {
  int degree = 2;
  friend bool operator==(const fixed_rings&, const fixed_rings&) = default;
  void hash_append(hasher& h) const { append_all(h, std::string_view("fixed-rings"), degree); }
};

/// Its typed plan part: ring attention over the plan's rings, and the order the balancer gave.
struct fixed_rings_part {
  using attention = train::attention_over_rings;
  std::vector<std::int64_t> order;  // documents (indices) in ring order
  friend bool operator==(const fixed_rings_part&, const fixed_rings_part&) = default;
  void hash_append(hasher& h) const { append_all(h, order); }
};

/// What fixed_rings asks of a balancer: the order documents take their rings in.
template <class B>
concept ring_orderer = requires(const B& b, std::span<const seq::seq_desc> docs) {
  { b.ring_order(docs) } -> std::convertible_to<std::vector<std::int64_t>>;
};

/// fixed_rings' planner, found by argument-dependent lookup.
template <ring_orderer B>
train::step_plan<fixed_rings_part> plan_partition(const fixed_rings& f, const train::partition_request& r,
                                                  const B& balancer) {
  if (f.degree < 1 || f.degree > r.pool)
    throw_error<invalid_argument>("fixed_rings: degree {} over a pool of {}; expected 1 <= degree <= pool",
                                  f.degree, r.pool);
  train::step_plan<fixed_rings_part> p;
  static_cast<train::step_layout&>(p) = train::start_layout(r.documents, r.pool, "fixed_rings");
  p.partition.order = balancer.ring_order(r.documents);
  for (std::size_t k = 0; k < p.partition.order.size(); ++k) {
    const auto doc = p.partition.order[k];
    std::vector<int> ranks(static_cast<std::size_t>(f.degree));
    for (int j = 0; j < f.degree; ++j)
      ranks[static_cast<std::size_t>(j)] = static_cast<int>((static_cast<int>(k) * f.degree + j) % r.pool);
    const std::vector<std::int64_t> index{doc};
    train::add_partition_ring(
        p, ranks, index,
        seq::partition_zigzag(r.documents[static_cast<std::size_t>(doc)].length, f.degree, true),
        static_cast<std::int64_t>(k));
  }
  train::align_slots(p);
  return p;
}

/// A balancer for fixed_rings: longest document first (ties: stream order).
struct longest_first {
  friend bool operator==(const longest_first&, const longest_first&) = default;
  void hash_append(hasher& h) const { append(h, std::string_view("longest-first")); }
  std::vector<std::int64_t> ring_order(std::span<const seq::seq_desc> docs) const {
    std::vector<std::int64_t> o(docs.size());
    std::iota(o.begin(), o.end(), std::int64_t{0});
    std::stable_sort(o.begin(), o.end(), [&](std::int64_t a, std::int64_t b) {
      return docs[static_cast<std::size_t>(a)].length > docs[static_cast<std::size_t>(b)].length;
    });
    return o;
  }
};

/// A balancer for the library's static CP families: documents dealt to groups in turn.
struct round_robin_groups {
  friend bool operator==(const round_robin_groups&, const round_robin_groups&) = default;
  void hash_append(hasher& h) const { append(h, std::string_view("round-robin")); }
  std::vector<std::vector<std::int64_t>> place_groups(std::span<const seq::seq_desc> docs, int groups) const {
    std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(groups));
    for (std::size_t i = 0; i < docs.size(); ++i)
      out[i % static_cast<std::size_t>(groups)].push_back(static_cast<std::int64_t>(i));
    return out;
  }
};

/// An encoder placement: the encoder on stage 0's rank, forward right before stage 0's forward of the
/// micro-batch, every backward deferred to the end of the rank's list (after all of its LLM work).
struct encoder_deferred_backward {
  static constexpr std::string_view name = "deferred-backward";
  friend constexpr bool operator==(const encoder_deferred_backward&,
                                   const encoder_deferred_backward&) = default;
  void hash_append(hasher& h) const { append(h, name); }
  [[nodiscard]] int encoder_ranks() const noexcept { return 0; }
  [[nodiscard]] pipeline::schedule place(const pipeline::schedule& llm, const pipeline::cost_model&,
                                         const pipeline::encoder_work&) const {
    auto s = llm;
    s.name = llm.name + "+encoder-deferred";
    const int r0 = s.rank_of_stage(0);
    s.encoder_shard_to_rank = {r0};
    std::vector<pipeline::action> row, backwards;
    for (const auto& a : s.ranks[static_cast<std::size_t>(r0)]) {
      for (const auto& part : pipeline::parts(a)) {
        if (part.stage == 0 && part.type == pipeline::action_type::forward)
          row.push_back({0, pipeline::action_type::encoder_forward, part.microbatch});
        if (part.stage == 0 && (part.type == pipeline::action_type::backward ||
                                part.type == pipeline::action_type::backward_input))
          backwards.push_back({0, pipeline::action_type::encoder_backward, part.microbatch});
      }
      row.push_back(a);
    }
    row.insert(row.end(), backwards.begin(), backwards.end());
    s.ranks[static_cast<std::size_t>(r0)] = std::move(row);
    return s;
  }
};

}  // namespace userland

template <>
struct fmt::formatter<userland::encoder_deferred_backward> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const userland::encoder_deferred_backward&, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "deferred-backward");
  }
};

namespace {

using namespace hetmesh;
using traintest::check_mm;
using traintest::mm_parity_body;

static_assert(train::partition_family<userland::fixed_rings, userland::longest_first>);
static_assert(!train::partition_family<userland::fixed_rings, train::family_placement>);  // needs ring_order
static_assert(train::partition_family<seq::cp_thd, userland::round_robin_groups>);
static_assert(pipeline::encoder_placement<userland::encoder_deferred_backward>);

}  // namespace

TEST_CASE("train::system: a family, balancers and an encoder placement of the user's train with parity") {
  using userland::encoder_deferred_backward;
  for (std::uint64_t seed : {41u, 42u}) {
    // The user's family and balancer, pp = 2 (pool 4), 1F1B, the user's placement.
    check_mm(testsupport::rank0_of(
                 8,
                 [&](auto& w) {
                   return mm_parity_body<double>(
                       w, userland::fixed_rings{.degree = 3}, userland::longest_first{},
                       train::pipeline_config<pipeline::one_f_one_b, encoder_deferred_backward>{2, {}, {}},
                       seed, 10, 30);
                 }),
             1e-10, "user fixed-rings(3) longest-first pp2 1f1b deferred-backward");
    // The user's family on the joint pipeline, pp = 1 over 8 ranks, zero-bubble (split backward).
    check_mm(testsupport::rank0_of(
                 8,
                 [&](auto& w) {
                   return mm_parity_body<double>(
                       w, userland::fixed_rings{.degree = 2}, userland::longest_first{},
                       train::pipeline_config<pipeline::zero_bubble, pipeline::colocated_encoder>{2, {}, {}},
                       seed, 12, 40);
                 }),
             1e-10, "user fixed-rings(2) pp2 zero-bubble joint");
    // The library's THD family placed by the user's balancer, with the user's placement.
    check_mm(testsupport::rank0_of(
                 8,
                 [&](auto& w) {
                   return mm_parity_body<double>(
                       w, seq::cp_thd{.cp = 2, .pad = true}, userland::round_robin_groups{},
                       train::pipeline_config<pipeline::one_f_one_b, encoder_deferred_backward>{2, {}, {}},
                       seed, 10, 30);
                 }),
             1e-10, "thd cp2 round-robin pp2 deferred-backward");
  }
}

TEST_CASE("train: the user's family's plan is a plan like the library's: exactly once, overlapping rings") {
  for (std::uint64_t seed = 500; seed < 520; ++seed) {
    const auto batch = traintest::random_batch(seed, 3 + static_cast<int>(seed % 7), 40);
    const auto docs = model::document_descs(batch);
    const auto plan =
        train::plan_step(userland::fixed_rings{.degree = 3}, docs, 4, userland::longest_first{});
    // Every token of the step in exactly one micro-batch; a rank's slots increase along its list.
    std::vector<std::vector<int>> seen(docs.size());
    for (std::size_t d = 0; d < docs.size(); ++d) seen[d].assign(static_cast<std::size_t>(docs[d].length), 0);
    for (const auto& list : plan.per_rank) {
      int last = -1;
      for (const auto& pm : list) {
        CHECK(pm.slot > last);
        last = pm.slot;
        for (const auto& run : pm.runs)
          for (auto p = run.positions.begin; p < run.positions.end; ++p)
            if (p < docs[static_cast<std::size_t>(run.doc)].length)
              ++seen[static_cast<std::size_t>(run.doc)][static_cast<std::size_t>(p)];
      }
    }
    for (const auto& d : seen) CHECK(std::all_of(d.begin(), d.end(), [](int n) { return n == 1; }));
    // Determinism: the same plan again, and the family's part is in the hash.
    auto again = train::plan_step(userland::fixed_rings{.degree = 3}, docs, 4, userland::longest_first{});
    CHECK(again == plan);
    CHECK(again.hash() == plan.hash());
    again.partition.order.push_back(0);
    CHECK(again.hash() != plan.hash());
  }
  CHECK_THROWS_WITH_AS(
      (void)train::plan_step(userland::fixed_rings{.degree = 5}, std::vector<seq::seq_desc>{{1, 10}}, 4,
                             userland::longest_first{}),
      doctest::Contains("degree 5 over a pool of 4"), invalid_argument);
}

TEST_CASE(
    "train::system: ranks that differ only in their encoder split (encoder_sp) are caught by the plan "
    "check") {
  const auto batch = traintest::random_mm_batch(77, 8, 40);
  int caught = 0;
  std::mutex m;
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    train::system_options o;
    o.encoder_sp.max_tokens_per_rank = c.rank() == 0 ? 64 : 65;
    o.encoder_sp.heads = 4;
    using sys_t = train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator>;
    sys_t sys(seq::cp_thd{.cp = 2, .pad = true}, c, {}, o);
    const auto plan = sys.plan(batch);
    traintest::tiny_stack<double> lm(traintest::kShape, 5, traintest::kBlocks, plan.pipeline.num_stages,
                                     sys.local_stages(plan));
    model::scale_encoder<double, model::vision_modality> vision(traintest::kShape.width, 0.9);
    model::scale_encoder<double, model::audio_modality> audio(traintest::kShape.width, 1.1);
    int calls = 0;
    try {
      (void)sys.run(plan, batch, lm, traintest::mm_optimizer<double>{&calls},
                    train::bind_encoder(vision, traintest::item_features<double>{traintest::kShape.width, 0}),
                    train::bind_encoder(audio, traintest::item_features<double>{traintest::kShape.width, 1}));
    } catch (const mismatch_error&) {
      std::lock_guard<std::mutex> lock(m);
      ++caught;
    }
  });
  CHECK(caught == 2);
}
