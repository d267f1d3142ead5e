// SPDX-License-Identifier: Apache-2.0
// seq::make_moe_dispatch_plan over random routings (seeded), ep in {1, 2, 4}: every (token, choice) is in the
// send order exactly once or dropped; the send order is grouped by destination rank, then local expert, then
// choice; per expert the group keeps min(routed, capacity); every rank computes the same capacity and kept
// counts, and what rank r sends to d is what d expects from r; "position" drops the group's latest choices of
// an expert (rank order, then token order), "probs" a rank's lowest gates, with shares within one of
// proportional whatever the ranks' order; dropless plans drop nothing and ignore the other ranks' routing.
// Also: Megatron's capacity formula, and bad input refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <vector>

#include <hetmesh/core/random.hpp>
#include <hetmesh/seq/moe_aux_loss.hpp>
#include <hetmesh/seq/moe_dispatch.hpp>

using namespace hetmesh;

namespace {

struct routing {
  std::vector<std::int64_t> experts;  // k per token, distinct within a token
  std::vector<double> gates;
};

routing random_routing(rng& r, std::int64_t tokens, std::int64_t experts, int k, bool ties) {
  routing out;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(experts));
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    // Skewed: expert 0 is picked first more often, so capacities bind.
    for (int j = 0; j < k; ++j) {
      const auto pick = r.below(3) == 0 ? 0 : r.below(static_cast<std::uint64_t>(experts) - j);
      std::swap(ids[static_cast<std::size_t>(j)], ids[static_cast<std::size_t>(j) + pick]);
      out.experts.push_back(ids[static_cast<std::size_t>(j)]);
      out.gates.push_back(ties ? static_cast<double>(r.below(3)) / 4.0 : r.unit());
    }
  }
  return out;
}

struct group_case {
  seq::moe_layout layout;
  seq::moe_capacity policy;
  std::vector<routing> ranks;
  std::vector<std::int64_t> counts;  // [ep][experts]
};

std::vector<std::int64_t> gather_counts(const seq::moe_layout& l, const std::vector<routing>& ranks) {
  std::vector<std::int64_t> all;
  for (const auto& r : ranks) {
    const auto c = seq::moe_expert_counts(l, r.experts);
    all.insert(all.end(), c.begin(), c.end());
  }
  return all;
}

std::vector<seq::moe_dispatch_plan> plans_of(const group_case& g) {
  std::vector<seq::moe_dispatch_plan> out;
  for (int r = 0; r < g.layout.ep; ++r)
    out.push_back(seq::make_moe_dispatch_plan(g.layout, g.policy, r,
                                              g.ranks[static_cast<std::size_t>(r)].experts,
                                              g.ranks[static_cast<std::size_t>(r)].gates, g.counts));
  return out;
}

void check_group(const group_case& g, const std::vector<seq::moe_dispatch_plan>& plans) {
  const auto& l = g.layout;
  const auto ne = static_cast<std::size_t>(l.experts);
  std::vector<std::int64_t> kept_total(ne, 0), routed_total(ne, 0);
  for (int r = 0; r < l.ep; ++r) {
    const auto& p = plans[static_cast<std::size_t>(r)];
    const auto& in = g.ranks[static_cast<std::size_t>(r)];
    CAPTURE(r);
    CHECK(p.capacity == plans[0].capacity);
    CHECK(p.kept == plans[0].kept);
    // Exactly once or dropped, and the send order is (destination, local expert, choice).
    std::vector<int> seen(in.experts.size(), 0);
    for (std::size_t i = 0; i < p.send_order.size(); ++i) {
      const auto c = static_cast<std::size_t>(p.send_order[i]);
      ++seen[c];
      CHECK(p.row_of_choice[c] == static_cast<std::int64_t>(i));
      if (i > 0) {
        const auto prev = static_cast<std::size_t>(p.send_order[i - 1]);
        const bool ordered =
            in.experts[prev] < in.experts[c] || (in.experts[prev] == in.experts[c] && prev < c);
        CHECK(ordered);
      }
    }
    std::int64_t dropped = 0;
    for (std::size_t c = 0; c < seen.size(); ++c) {
      CHECK(seen[c] == (p.row_of_choice[c] >= 0 ? 1 : 0));
      if (p.row_of_choice[c] < 0) ++dropped;
      ++routed_total[static_cast<std::size_t>(in.experts[c])];
      if (p.row_of_choice[c] >= 0) ++kept_total[static_cast<std::size_t>(in.experts[c])];
    }
    CHECK(dropped == static_cast<std::int64_t>(p.dropped().size()));
    if (g.policy.dropless()) CHECK(dropped == 0);
    // What r sends to d is what d expects from r; d's experts' rows add up.
    for (int d = 0; d < l.ep; ++d)
      CHECK(p.send_counts[static_cast<std::size_t>(d)] ==
            plans[static_cast<std::size_t>(d)].recv_counts[static_cast<std::size_t>(r)]);
    CHECK(std::accumulate(p.expert_counts.begin(), p.expert_counts.end(), std::int64_t{0}) ==
          p.expert_rows());
    // Probs: within the rank, every kept choice of an expert has a gate >= every dropped one's.
    if (!g.policy.dropless() && g.policy.drop == seq::moe_drop::probs)
      for (std::size_t a = 0; a < seen.size(); ++a)
        for (std::size_t b = 0; b < seen.size(); ++b)
          if (in.experts[a] == in.experts[b] && p.row_of_choice[a] >= 0 && p.row_of_choice[b] < 0)
            CHECK(in.gates[a] >= in.gates[b]);
  }
  for (std::size_t e = 0; e < ne; ++e) {
    const auto expect = g.policy.dropless() ? routed_total[e] : std::min(routed_total[e], plans[0].capacity);
    CHECK(kept_total[e] == expect);
  }
  // Position: the group's choices of each expert in rank order then choice order, the first `capacity` kept.
  if (!g.policy.dropless() && g.policy.drop == seq::moe_drop::position)
    for (std::size_t e = 0; e < ne; ++e) {
      std::int64_t order = 0;
      for (int r = 0; r < l.ep; ++r) {
        const auto& in = g.ranks[static_cast<std::size_t>(r)];
        for (std::size_t c = 0; c < in.experts.size(); ++c)
          if (static_cast<std::size_t>(in.experts[c]) == e)
            CHECK((plans[static_cast<std::size_t>(r)].row_of_choice[c] >= 0) ==
                  (order++ < plans[0].capacity));
      }
    }
}

group_case random_case(rng& r, int ep, const seq::moe_capacity& policy, bool ties) {
  group_case g;
  const std::int64_t experts = ep * (1 + static_cast<std::int64_t>(r.below(3)));
  g.layout = {experts, ep,
              1 + static_cast<int>(r.below(static_cast<std::uint64_t>(std::min<std::int64_t>(experts, 3))))};
  g.policy = policy;
  for (int q = 0; q < ep; ++q)
    g.ranks.push_back(
        random_routing(r, static_cast<std::int64_t>(r.below(25)), experts, g.layout.top_k, ties));
  g.counts = gather_counts(g.layout, g.ranks);
  return g;
}

}  // namespace

TEST_CASE("moe dispatch plan: exactly once or dropped, capacity per expert, the same drops on every rank") {
  rng r(33);
  const std::vector<seq::moe_capacity> policies{
      {},
      {.factor = 1.0},
      {.factor = 0.5},
      {.factor = 1.25, .drop = seq::moe_drop::probs},
      {.factor = 0.4, .drop = seq::moe_drop::probs, .min_capacity = 2},
  };
  int bound = 0;
  for (int trial = 0; trial < 60; ++trial)
    for (int ep : {1, 2, 4})
      for (const auto& policy : policies) {
        CAPTURE(trial);
        CAPTURE(ep);
        const auto g = random_case(r, ep, policy, trial % 3 == 0);
        const auto plans = plans_of(g);
        check_group(g, plans);
        for (const auto& p : plans) bound += p.dropped().empty() ? 0 : 1;
      }
  CHECK(bound > 100);  // capacities did bind often
}

TEST_CASE("moe dispatch plan: permuting the ranks' order") {
  rng r(34);
  for (int trial = 0; trial < 40; ++trial) {
    const int ep = 4;
    for (const seq::moe_capacity& policy :
         {seq::moe_capacity{}, seq::moe_capacity{.factor = 0.6, .drop = seq::moe_drop::probs}}) {
      const auto g = random_case(r, ep, policy, false);
      std::vector<int> perm{0, 1, 2, 3};
      for (std::size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[r.below(i)]);
      group_case h = g;
      for (int q = 0; q < ep; ++q)
        h.ranks[static_cast<std::size_t>(q)] =
            g.ranks[static_cast<std::size_t>(perm[static_cast<std::size_t>(q)])];
      h.counts = gather_counts(h.layout, h.ranks);
      const auto a = plans_of(g), b = plans_of(h);
      check_group(h, b);
      CHECK(a[0].capacity == b[0].capacity);
      const auto ne = static_cast<std::size_t>(g.layout.experts);
      for (int q = 0; q < ep; ++q) {
        const auto& pa = a[static_cast<std::size_t>(perm[static_cast<std::size_t>(q)])];
        const auto& pb = b[static_cast<std::size_t>(q)];
        if (policy.dropless()) {
          // A dropless plan's own side does not depend on the other ranks.
          CHECK(pa.send_order == pb.send_order);
          CHECK(pa.row_of_choice == pb.row_of_choice);
          CHECK(pa.send_counts == pb.send_counts);
        }
        // Probs shares are proportional to the counts: they move by at most one with the ranks' order.
        for (std::size_t e = 0; e < ne; ++e)
          CHECK(std::abs(pa.kept_of(perm[static_cast<std::size_t>(q)], static_cast<std::int64_t>(e)) -
                         pb.kept_of(q, static_cast<std::int64_t>(e))) <= 1);
      }
    }
  }
}

TEST_CASE("moe capacity: Megatron's formula, dropless, and bad input") {
  CHECK(seq::moe_capacity{}.capacity(100, 4) == -1);
  CHECK(seq::moe_capacity{.factor = 1.0}.capacity(10, 4) == 3);  // ceil(10 / 4 x 1.0)
  CHECK(seq::moe_capacity{.factor = 1.5}.capacity(8, 4) == 3);
  CHECK(seq::moe_capacity{.factor = 0.1, .min_capacity = 4}.capacity(8, 4) == 4);
  CHECK_THROWS_AS((void)seq::moe_capacity{.factor = 0.0}.capacity(8, 4), invalid_argument);
  CHECK_THROWS_AS((void)seq::moe_capacity{.factor = -1.0}.capacity(8, 4), invalid_argument);

  const seq::moe_layout l{4, 2, 2};
  const std::vector<std::int64_t> ex{0, 1, 2, 3};
  const std::vector<double> gates{0.5, 0.5, 0.6, 0.4};
  const auto mine = seq::moe_expert_counts(l, ex);
  CHECK(mine == std::vector<std::int64_t>{1, 1, 1, 1});
  std::vector<std::int64_t> counts{1, 1, 1, 1, 2, 0, 0, 0};
  const auto p = seq::make_moe_dispatch_plan(l, {}, 0, ex, {}, counts);
  CHECK(p.send_counts == std::vector<std::int64_t>{2, 2});
  CHECK(p.recv_counts == std::vector<std::int64_t>{2, 2});
  CHECK(p.expert_counts == std::vector<std::int64_t>{3, 1});
  CHECK_THROWS_AS((void)seq::moe_layout({6, 4, 2}).validate(), invalid_argument);  // 4 does not divide 6
  CHECK_THROWS_AS((void)seq::moe_layout({4, 2, 5}).validate(), invalid_argument);
  CHECK_THROWS_AS((void)seq::moe_expert_counts(l, std::vector<std::int64_t>{0, 4}), invalid_argument);
  CHECK_THROWS_AS((void)seq::moe_expert_counts(l, std::vector<std::int64_t>{0}), invalid_argument);
  CHECK_THROWS_AS((void)seq::make_moe_dispatch_plan(l, {}, 2, ex, {}, counts), invalid_argument);
  std::vector<std::int64_t> wrong{2, 1, 1, 0, 2, 0, 0, 0};
  CHECK_THROWS_AS((void)seq::make_moe_dispatch_plan(l, {}, 0, ex, {}, wrong), invalid_argument);
  CHECK_THROWS_AS((void)seq::make_moe_dispatch_plan(l, {.factor = 0.5, .drop = seq::moe_drop::probs}, 0, ex,
                                                    std::vector<double>{0.5}, counts),
                  invalid_argument);
  CHECK_THROWS_AS((void)seq::moe_kept_counts(l, {}, std::vector<std::int64_t>{1, 2}), invalid_argument);
}

TEST_CASE("moe aux loss: the shares sum to E sum f P, the gradient matches finite differences") {
  rng r(35);
  const std::int64_t experts = 4, tokens = 6;
  const int k = 2;
  std::vector<double> probs(static_cast<std::size_t>(tokens * experts));
  for (auto& p : probs) p = r.unit();
  const std::vector<std::int64_t> counts{5, 3, 2, 2};  // 12 choices of 6 tokens
  const double coeff = 0.01;
  const auto v = seq::moe_aux_loss(std::span<const double>(probs), counts, tokens, k, coeff);
  double expect = 0.0;
  for (std::int64_t e = 0; e < experts; ++e) {
    double pe = 0.0;
    for (std::int64_t t = 0; t < tokens; ++t) pe += probs[static_cast<std::size_t>(t * experts + e)];
    expect += (static_cast<double>(counts[static_cast<std::size_t>(e)]) / (k * tokens)) * (pe / tokens);
  }
  CHECK(v.loss == doctest::Approx(coeff * experts * expect).epsilon(1e-12));
  for (std::size_t i = 0; i < probs.size(); ++i) {
    auto plus = probs, minus = probs;
    plus[i] += 1e-6;
    minus[i] -= 1e-6;
    const double fd = (seq::moe_aux_loss(std::span<const double>(plus), counts, tokens, k, coeff).loss -
                       seq::moe_aux_loss(std::span<const double>(minus), counts, tokens, k, coeff).loss) /
                      2e-6;
    CHECK(fd == doctest::Approx(v.grad[i % static_cast<std::size_t>(experts)]).epsilon(1e-6));
  }
  CHECK_THROWS_AS((void)seq::moe_aux_loss(std::span<const double>(probs).first(5), counts, tokens, k, coeff),
                  invalid_argument);
}
