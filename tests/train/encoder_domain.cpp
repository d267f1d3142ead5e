// SPDX-License-Identifier: Apache-2.0
// The encoder domain's planner (train/encoder_domain.hpp, train::detail::plan_encoder_work) over random
// multimodal batches, without running a model: every landing row of every pipeline is filled exactly once,
// by the rows of its own item (the exchange and the reshard simulated in memory), senders and receivers
// agree on every count, each row is encoded once in a shard's row (tp x pool ranks) and its gradient comes
// back once per pool rank that reads it, no domain rank holds more than the policy's token cap, every
// Ulysses group stays in one shard's row, and the plan does not depend on the order of a slot's landings.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
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

/// One plan's properties over E shards, each over a row of R = tp x pool ranks; returns the number of
/// split items seen.
int check_domain(const train::step_layout& plan, const seq::long_short_policy& pol) {
  const int P = plan.world, R = plan.encoder_row(), tp = plan.tp, E = plan.pipeline.num_encoder_shards(),
            K = 2;
  REQUIRE(R == tp * P);
  const std::vector<std::int64_t> width{3, 2};  // output elements per token of encoders 0 and 1
  const auto domain = train::plan_encoder_domain(plan, E, K, pol);
  // The plan carries its encoder domain, planned under the policy it was attached with.
  CHECK(plan.encoder_sp == pol);
  CHECK(plan.encoder_domain == train::plan_encoder_domain(plan, E, plan.encoders(), pol));
  int split = 0;
  for (const auto& slot : domain)
    for (const auto& ls : slot) {
      CHECK((ls.ranks == 0 || ls.ranks == E * R));  // the domain: every shard's whole row
      for (const auto& a : ls.items) {
        CHECK(a.first_rank / R == (a.first_rank + a.degree - 1) / R);  // one shard's row
        split += a.degree > 1 ? 1 : 0;
      }
      for (auto t : ls.tokens) CHECK(t <= pol.max_tokens_per_rank);  // capacity
    }
  // Every row position's work (it runs every shard here: the send side of each).
  std::vector<train::detail::encoder_work> work;
  const std::vector<char> runs(static_cast<std::size_t>(E), 1);
  for (int q = 0; q < R; ++q)
    work.push_back(train::detail::plan_encoder_work(plan, domain, E, q, width, runs));
  auto at = [](auto& v, auto i) -> auto& { return v[static_cast<std::size_t>(i)]; };
  const auto slots = static_cast<std::size_t>(std::max(plan.slots, 1));
  for (std::size_t m = 0; m < slots; ++m) {
    std::vector<std::vector<double>> stage0(static_cast<std::size_t>(R));  // shards' outputs, in shard order
    for (int e = 0; e < E; ++e) {
      // Local outputs: each rank's encoders write their pieces' rows; each row is encoded once in the row.
      std::vector<std::vector<double>> sent(static_cast<std::size_t>(R)), local(static_cast<std::size_t>(R));
      std::map<std::tuple<int, std::int64_t, std::int64_t>, int> encoded;  // (encoder, item, row) -> times
      for (int j = 0; j < R; ++j) {
        const auto& w = at(at(work, j).work, e)[m];
        const auto& ex = at(at(work, j).exchange, e)[m];
        for (std::size_t k = 0; k < w.calls.size(); ++k)
          for (const auto& p : w.calls[k].pieces)
            for (auto row = p.tokens.begin; row < p.tokens.end; ++row) {
              ++encoded[{static_cast<int>(k), p.item, row}];
              for (std::int64_t c = 0; c < w.width[k]; ++c)
                at(local, j).push_back(cell(static_cast<int>(k), p.item, row, c));
            }
        CHECK(static_cast<std::int64_t>(at(local, j).size()) == ex.local_size);
        for (const auto& r : ex.send) {
          at(sent, j).resize(static_cast<std::size_t>(
              std::max<std::int64_t>(static_cast<std::int64_t>(at(sent, j).size()), r.dst + r.n)));
          std::copy_n(at(local, j).begin() + r.src, r.n, at(sent, j).begin() + r.dst);
        }
      }
      for (const auto& [key, times] : encoded) CHECK(times == 1);
      // The all-to-all-v: position j's block for position i, in source order on i.
      std::vector<std::vector<double>> got(static_cast<std::size_t>(R));
      for (int i = 0; i < R; ++i) {
        for (int j = 0; j < R; ++j) {
          const auto& sx = at(at(work, j).exchange, e)[m];
          const auto& rx = at(at(work, i).exchange, e)[m];
          if (sx.send_counts.empty()) continue;  // a slot without encoder items
          CHECK(at(sx.send_counts, i) == at(rx.recv_counts, j));
          CHECK(at(sx.returns, i) == at(rx.returns, j));  // the way back agrees on both ends
          CHECK(static_cast<bool>(at(sx.returns, i)) == (i % tp == j % tp));
          std::int64_t first = 0;
          for (int t = 0; t < i; ++t) first += at(sx.send_counts, t);
          at(got, i).insert(at(got, i).end(), at(sent, j).begin() + first,
                            at(sent, j).begin() + first + at(sx.send_counts, i));
        }
        CHECK(static_cast<std::int64_t>(at(got, i).size()) == at(at(work, i).sizes, e)[m]);
        at(stage0, i).insert(at(stage0, i).end(), at(got, i).begin(), at(got, i).end());
      }
      // The way back: each receiver returns what it got (as its gradient) to the senders with its tp rank
      // only; a sender's local rows then hold each landing's value once per pool rank that reads them.
      for (int j = 0; j < R; ++j) {
        const auto& sx = at(at(work, j).exchange, e)[m];
        if (sx.send_counts.empty()) continue;
        std::vector<double> back(static_cast<std::size_t>(sx.send_size()), 0.0),
            grad(at(local, j).size(), 0.0);
        std::int64_t first = 0;
        for (int i = 0; i < R; ++i) {
          if (at(sx.returns, i)) {
            std::int64_t from = 0;  // where j's block starts in i's received buffer
            const auto& rx = at(at(work, i).exchange, e)[m];
            for (int t = 0; t < j; ++t) from += at(rx.recv_counts, t);
            std::copy_n(at(got, i).begin() + from, at(sx.send_counts, i), back.begin() + first);
          }
          first += at(sx.send_counts, i);
        }
        sx.unpack_add(std::span<const double>(back), std::span<double>(grad));
        std::vector<double> want(at(local, j).size(), 0.0);
        for (const auto& r : sx.send)
          for (std::int64_t t = 0; t < r.n; ++t)
            at(want, r.src + t) += at(local, j)[static_cast<std::size_t>(r.src + t)];
        for (auto& v : want) v /= tp;  // sent to every tp rank of a pool rank, returned by one
        CHECK(grad == want);
      }
    }
    // Each position's stage 0 input after the reshard holds its pool rank's landings' rows, each from its
    // own item (every tp rank of a pool rank the same).
    for (int i = 0; i < R; ++i) {
      const auto& w = at(work, i);
      std::vector<double> landed(static_cast<std::size_t>(w.landing_size[m]), -1.0), want;
      for (const auto& r : w.reshard[m])
        std::copy_n(at(stage0, i).begin() + r.src, r.n, landed.begin() + r.dst);
      if (m < plan.encoder_landings.size())
        for (const auto& l : plan.encoder_landings[m])
          if (l.pool_rank == i / tp)
            for (auto row = l.rows.begin; row < l.rows.end; ++row)
              for (std::int64_t c = 0; c < at(width, l.encoder); ++c)
                want.push_back(cell(l.encoder, l.item, row, c));
      CHECK(landed == want);
    }
  }
  // The reshard at each position's stage 0: its landings' rows, each exactly once, from the right item.
  for (int j = 0; j < R; ++j)
    for (std::size_t m = 0; m < slots; ++m) {
      const auto& w = at(work, j);
      std::vector<int> covered(static_cast<std::size_t>(w.landing_size[m]), 0);
      for (const auto& r : w.reshard[m])
        for (std::int64_t t = 0; t < r.n; ++t) ++at(covered, r.dst + t);
      CHECK(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));  // exactly once
      std::int64_t want = 0;
      if (m < plan.encoder_landings.size())
        for (const auto& l : plan.encoder_landings[m])
          if (l.pool_rank == j / tp) want += l.rows.size() * at(width, l.encoder);
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
    for (auto [P, tp] : {std::pair{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}}) {
      CAPTURE(seed);
      CAPTURE(P);
      CAPTURE(tp);
      // HDP with rings when the pool has room for them; static CP (THD) over a pool of one.
      train::step_layout plan =
          P == 1
              ? train::step_layout(train::plan_step(seq::cp_thd{.cp = 1, .pad = true}, docs, 1))
              : train::step_layout(train::plan_step(seq::hdp<seq::no_offload>{.capacity = 64 / P}, docs, P));
      try {
        if (seed % 3 == 0)
          train::attach_pipeline(plan, pipeline::one_f_one_b{}, pipeline::colocated_encoder{}, 3, &batch, pol,
                                 {}, tp);
        else if (seed % 3 == 1)
          train::attach_pipeline(plan, pipeline::gpipe{}, pipeline::encoder_pool{.ranks = 2}, 2, &batch, pol,
                                 {}, tp);
        else
          train::attach_pipeline(plan, pipeline::one_f_one_b{}, pipeline::encoder_on_first_stage{}, 2, &batch,
                                 pol, {}, tp);
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
  CHECK(plans >= 90);
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
