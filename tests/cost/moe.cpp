// SPDX-License-Identifier: Apache-2.0
// cost::moe_layer: the dispatch's byte matrix from a plan's kept counts, the forward and training time (the
// busiest rank's experts plus two alpha-beta all-to-all-v exchanges each way), and the even-routing term of
// T(s) a balancer adds, which equals the kept-count price of an evenly routed micro-batch.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <hetmesh/cost/moe.hpp>

using namespace hetmesh;

TEST_CASE("moe layer: expert compute plus the all-to-all bytes over the links") {
  const cost::network net{.nodes = 2,
                          .devices_per_node = 2,
                          .intra_bw_gbps = 100.0,
                          .inter_bw_gbps = 10.0,
                          .intra_latency_us = 1.0,
                          .inter_latency_us = 10.0};
  const cost::moe_layer layer{.compute = {4, 2, 1e-4, 1e-6}, .hidden = 500, .bytes_per_element = 2};
  // ep 2 on ranks 1 and 2 (across the nodes); rank 0 keeps 3, 1, 0, 2 choices of experts 0..3, rank 1 1, 1,
  // 4, 0.
  const std::vector<int> group{1, 2};
  const std::vector<std::int64_t> kept{3, 1, 0, 2, 1, 1, 4, 0};
  const auto bytes = layer.dispatch_bytes(kept, 2);
  CHECK(bytes == std::vector<double>{4000.0, 2000.0, 2000.0, 4000.0});  // 1000 B per row
  // Busiest rank: experts 2, 3 with 6 choices; router on 5 tokens; each exchange one 2000 B message each way.
  const double a2a = 0.01 + 1e-7 * 2000;
  const double work = 6 * 1e-4 + 5 * 1e-6;
  CHECK(layer.forward(net, group, kept, 5) == doctest::Approx(work + 2 * a2a));
  CHECK(layer.training(net, group, kept, 5) == doctest::Approx(3 * work + 4 * a2a));
  // One rank: nothing moves.
  const std::vector<std::int64_t> one{3, 1, 0, 2};
  CHECK(layer.forward(net, std::vector<int>{0}, one, 3) == doctest::Approx(6 * 1e-4 + 3 * 1e-6));
  // Even routing: the balancer's T(s) term equals the price of an evenly routed micro-batch of s tokens.
  const std::vector<int> four{0, 1, 2, 3};
  const std::int64_t s = 64;  // 64 tokens x 2 choices on each rank over 4 experts: 32 per expert and rank
  const std::vector<std::int64_t> even(16, 32);
  const auto term = layer.even_training(net, four);
  CHECK(term.a == 0.0);
  CHECK(term(static_cast<double>(s)) == doctest::Approx(layer.training(net, four, even, s)).epsilon(1e-4));
  CHECK(term.c > 0.0);
  CHECK(fmt::format("{}", layer).starts_with("moe_layer(moe_compute(experts=4"));
  CHECK_THROWS_AS((void)layer.dispatch_bytes(kept, 3), invalid_argument);
  CHECK_THROWS_AS((void)layer.dispatch_bytes(std::vector<std::int64_t>(5), 2), invalid_argument);
  CHECK_THROWS_AS((void)cost::moe_layer{.hidden = 0}.validate(), invalid_argument);
}
