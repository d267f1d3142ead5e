// SPDX-License-Identifier: Apache-2.0
// The encoder domain's planner (train/encoder_domain.hpp, train::detail::plan_encoder_work) over random
// multimodal batches, without running a model: every landing row of every pipeline is filled exactly once,
// by the rows of its own item (the exchange and the reshard simulated in memory), senders and receivers
// agree on every count, no domain rank holds more than the policy's token cap, every Ulysses group stays
// in one shard's pool row, and the plan does not depend on the order of a slot's landings.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <hetmesh/core/random.hpp>
#include <hetmesh/train/train.hpp>

#include "train/pipeline_body.hpp"

using namespace hetmesh;
using namespace traintest;

namespace {

/// The value a rank writes for (encoder, item, row, column): what the landing must receive.
double cell(int k, std::int64_t item, std::int64_t row, std::int64_t col) {
  return static_cast<double>(k * 1000003 + item * 1009 + row * 17 + col);
}

/// One plan's properties over pool P and E shards; returns the number of split items seen.
int check_domain(const train::step_layout& plan, const seq::long_short_policy& pol) {
  const int P = plan.world, E = plan.pipeline.num_encoder_shards(), K = 2;
  const std::vector<std::int64_t> width{3, 2};  // output elements per token of encoders 0 and 1
  const auto domain = train::plan_encoder_domain(plan, E, K, pol);
  // The plan carries its encoder domain, planned under the policy it was attached with.
  CHECK(plan.encoder_sp == pol);
  CHECK(plan.encoder_domain == train::plan_encoder_domain(plan, E, plan.encoders(), pol));
  int split = 0;
  for (const auto& slot : domain)
    for (const auto& ls : slot) {
      for (const auto& a : ls.items) {
        CHECK(a.first_rank / P == (a.first_rank + a.degree - 1) / P);  // one shard's pool row
        split += a.degree > 1 ? 1 : 0;
      }
      for (auto t : ls.tokens) CHECK(t <= pol.max_tokens_per_rank);  // capacity
    }
  // Every pool rank's work (it runs every shard here: the send side of each).
  std::vector<train::detail::encoder_work> work;
  const std::vector<char> runs(static_cast<std::size_t>(E), 1);
  for (int j = 0; j < P; ++j)
    work.push_back(train::detail::plan_encoder_work(plan, domain, E, j, width, runs));
  const auto slots = static_cast<std::size_t>(std::max(plan.slots, 1));
  for (std::size_t m = 0; m < slots; ++m) {
    std::vector<std::vector<double>> stage0(static_cast<std::size_t>(P));  // shards' outputs, in shard order
    for (int e = 0; e < E; ++e) {
      // Local outputs: each rank's encoders write their pieces' rows.
      std::vector<std::vector<double>> sent(static_cast<std::size_t>(P));
      for (int j = 0; j < P; ++j) {
        const auto& w = work[static_cast<std::size_t>(j)].work[static_cast<std::size_t>(e)][m];
        const auto& ex = work[static_cast<std::size_t>(j)].exchange[static_cast<std::size_t>(e)][m];
        std::vector<double> local;
        for (std::size_t k = 0; k < w.calls.size(); ++k)
          for (const auto& p : w.calls[k].pieces)
            for (auto row = p.tokens.begin; row < p.tokens.end; ++row)
              for (std::int64_t c = 0; c < w.width[k]; ++c)
                local.push_back(cell(static_cast<int>(k), p.item, row, c));
        CHECK(static_cast<std::int64_t>(local.size()) == ex.local_size);
        for (const auto& r : ex.send) {
          sent[static_cast<std::size_t>(j)].resize(static_cast<std::size_t>(std::max<std::int64_t>(
              static_cast<std::int64_t>(sent[static_cast<std::size_t>(j)].size()), r.dst + r.n)));
          std::copy_n(local.begin() + r.src, r.n, sent[static_cast<std::size_t>(j)].begin() + r.dst);
        }
      }
      // The all-to-all-v: rank j's block for rank i, in source order on i.
      for (int i = 0; i < P; ++i) {
        std::vector<double> out;
        for (int j = 0; j < P; ++j) {
          const auto& sx = work[static_cast<std::size_t>(j)].exchange[static_cast<std::size_t>(e)][m];
          const auto& rx = work[static_cast<std::size_t>(i)].exchange[static_cast<std::size_t>(e)][m];
          if (sx.send_counts.empty()) continue;  // a slot without encoder items
          CHECK(sx.send_counts[static_cast<std::size_t>(i)] == rx.recv_counts[static_cast<std::size_t>(j)]);
          std::int64_t first = 0;
          for (int t = 0; t < i; ++t) first += sx.send_counts[static_cast<std::size_t>(t)];
          out.insert(out.end(), sent[static_cast<std::size_t>(j)].begin() + first,
                     sent[static_cast<std::size_t>(j)].begin() + first +
                         sx.send_counts[static_cast<std::size_t>(i)]);
        }
        CHECK(static_cast<std::int64_t>(out.size()) ==
              work[static_cast<std::size_t>(i)].sizes[static_cast<std::size_t>(e)][m]);
        stage0[static_cast<std::size_t>(i)].insert(stage0[static_cast<std::size_t>(i)].end(), out.begin(),
                                                   out.end());
      }
    }
    // Each pipeline's stage 0 input after the reshard holds its landings' rows, each from its own item.
    for (int i = 0; i < P; ++i) {
      const auto& w = work[static_cast<std::size_t>(i)];
      std::vector<double> landed(static_cast<std::size_t>(w.landing_size[m]), -1.0), want;
      for (const auto& r : w.reshard[m])
        std::copy_n(stage0[static_cast<std::size_t>(i)].begin() + r.src, r.n, landed.begin() + r.dst);
      if (m < plan.encoder_landings.size())
        for (const auto& l : plan.encoder_landings[m])
          if (l.pool_rank == i)
            for (auto row = l.rows.begin; row < l.rows.end; ++row)
              for (std::int64_t c = 0; c < width[static_cast<std::size_t>(l.encoder)]; ++c)
                want.push_back(cell(l.encoder, l.item, row, c));
      CHECK(landed == want);
    }
  }
  // The reshard at each pipeline's stage 0: its landings' rows, each exactly once, from the right item.
  for (int j = 0; j < P; ++j)
    for (std::size_t m = 0; m < slots; ++m) {
      const auto& w = work[static_cast<std::size_t>(j)];
      std::vector<int> covered(static_cast<std::size_t>(w.landing_size[m]), 0);
      for (const auto& r : w.reshard[m])
        for (std::int64_t t = 0; t < r.n; ++t) ++covered[static_cast<std::size_t>(r.dst + t)];
      CHECK(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));  // exactly once
      std::int64_t want = 0;
      if (m < plan.encoder_landings.size())
        for (const auto& l : plan.encoder_landings[m])
          if (l.pool_rank == j) want += l.rows.size() * width[static_cast<std::size_t>(l.encoder)];
      CHECK(w.landing_size[m] == want);
    }
  // The domain does not depend on the order of a slot's landings.
  auto shuffled = plan;
  rng g(plan_hash(plan));
  for (auto& slot : shuffled.encoder_landings)
    for (std::size_t i = slot.size(); i > 1; --i)
      std::swap(slot[i - 1], slot[static_cast<std::size_t>(g.uniform(0, static_cast<std::int64_t>(i) - 1))]);
  CHECK(train::plan_encoder_domain(shuffled, E, K, pol) == domain);
  return split;
}

}  // namespace

TEST_CASE("encoder domain: exactly-once landing rows, agreed counts, capacity, groups in a row, order-free") {
  int split = 0, plans = 0, refused = 0;
  for (std::uint64_t seed = 300; seed < 330; ++seed) {
    const auto batch =
        random_mm_batch(seed, 6 + static_cast<int>(seed % 9), 24 + static_cast<std::int64_t>(seed % 5) * 8);
    const auto docs = model::document_descs(batch);
    seq::long_short_policy pol;
    pol.max_tokens_per_rank = 6 + static_cast<std::int64_t>(seed % 4);
    pol.heads = 4;
    pol.balance_factor = seed % 2 == 0 ? 1.0 : 0.3;
    for (int P : {1, 2, 4}) {
      CAPTURE(seed);
      CAPTURE(P);
      // HDP with rings when the pool has room for them; static CP (THD) over a pool of one.
      train::step_layout plan =
          P == 1
              ? train::step_layout(train::plan_step(seq::cp_thd{.cp = 1, .pad = true}, docs, 1))
              : train::step_layout(train::plan_step(seq::hdp<seq::no_offload>{.capacity = 64 / P}, docs, P));
      try {
        if (seed % 3 == 0)
          train::attach_pipeline(plan, pipeline::one_f_one_b{}, pipeline::colocated_encoder{}, 3, &batch,
                                 pol);
        else if (seed % 3 == 1)
          train::attach_pipeline(plan, pipeline::gpipe{}, pipeline::encoder_pool{.ranks = 2}, 2, &batch, pol);
        else
          train::attach_pipeline(plan, pipeline::one_f_one_b{}, pipeline::encoder_on_first_stage{}, 2, &batch,
                                 pol);
        split += check_domain(plan, pol);
        ++plans;
      } catch (const capacity_error& e) {  // a row too small to split an item far enough: the planner says so
        CHECK((std::string(e.what()).find("needs more than") != std::string::npos ||
               std::string(e.what()).find("has room") != std::string::npos));
        ++refused;
      }
    }
  }
  // A landing prints what it is (where it lands, which item, which rows of how many).
  CHECK(fmt::format("{}", train::slot_landing{3, 1, 42, 9, {2, 5}}) ==
        "landing{rank=3, encoder=1, item=42, rows=[2,5)/9}");
  MESSAGE(plans, " plans checked, ", refused, " refused by the planner, ", split, " items split over groups");
  CHECK(plans >= 55);
  CHECK(split > 0);
}

namespace {

/// A communicator with no subgroup (as NCCL: groups only by a split of the whole communicator); its
/// operations are never reached by the test below.
struct split_only_comm {
  using is_communicator = void;
  static constexpr comm::memory_space memory = comm::memory_space::host;
  std::vector<int> members{0, 1, 2, 3};
  int me = 1;
  [[nodiscard]] int rank() const { return me; }
  [[nodiscard]] int size() const { return static_cast<int>(members.size()); }
  [[nodiscard]] std::span<const int> ranks() const { return members; }
  void group_p2p(std::span<const comm::p2p_op>) {}
};
static_assert(comm::communicator<split_only_comm> && !comm::subgroup_communicator<split_only_comm>);

}  // namespace

TEST_CASE("encoder_context over a communicator without subgroup: a split item is refused by name") {
  split_only_comm world;
  comm::group_cache<split_only_comm> groups(world);
  train::encoder_context<split_only_comm, model::reference_attention, double> ctx;
  ctx.groups = &groups;
  ctx.stage = 0;
  ctx.micro_batch = 2;
  const std::vector<model::encoder_piece> pieces{
      {.item = 7, .item_tokens = 40, .tokens = {0, 20}, .offset = 0, .degree = 2, .group_rank = 1}};
  const model::encoder_batch_view view{.encoder = 0, .rank = 1, .index = 0, .pieces = pieces, .tokens = 20};
  CHECK_THROWS_WITH_AS((void)ctx.item_group(pieces[0], view),
                       doctest::Contains("item 7 is split over 2 ranks at shard 0 slot 2"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)ctx.item_group(pieces[0], view), doctest::Contains("max_tokens_per_rank"),
                       invalid_argument);
  // A whole item has no group on any backend.
  auto whole = pieces[0];
  whole.degree = 1;
  CHECK_THROWS_WITH_AS((void)ctx.item_group(whole, view), doctest::Contains("expected a split piece"),
                       invalid_argument);
}
