// SPDX-License-Identifier: Apache-2.0
// The 5-D parity grid on loopback ranks: every feasible combination of tp {1, 2}, pp {1, 2}, ep {1, 2},
// partition {DP, static CP, HDP, Ulysses} and ZeRO {0, 1} on 8 ranks, and tp 2 x pp 2 x cp 2 x dp 2 on 16,
// trains 5 steps of Adam whose losses equal a 1-rank run's within 1e-5; and the step-0 gradients of every
// tp x pp x ep x partition layout, gathered to full tensors, equal a 1-rank run's (train::check_parity).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <type_traits>

#include <hetmesh/comm/loopback.hpp>

#include "support/rank0.hpp"
#include "train/five_d_body.hpp"

using namespace hetmesh;
using namespace traintest;

namespace {

// The 1-rank run of the dense model (tiny_stack, tp 1).
std::vector<double> reference() {
  return testsupport::rank0_of(1, [&](comm::loopback::communicator& c) {
    return five_d_losses(c, seq::cp_thd{.cp = 1}, five_d_layout{}, 5);
  });
}

double worst(const std::vector<double>& a, const std::vector<double>& b) {
  double e = a.size() == b.size() ? 0.0 : 1.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    e = std::max(e, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return e;
}

}  // namespace

TEST_CASE("5-D: tp x pp x ep x partition x ZeRO on 8 ranks trains as a 1-rank run") {
  const auto dense = reference();
  // The MoE model's 1-rank run (five_d_losses builds moe_lm only under ep > 1).
  const auto moe = testsupport::rank0_of(1, [&](comm::loopback::communicator& c) {
    train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator> sys({.cp = 1}, c);
    moe_lm<double> m(kShape, 23, sys.split());
    train::adam<double> adam{.lr = 0.01};
    std::vector<double> losses;
    for (int s = 0; s < 5; ++s) {
      const auto batch = random_batch(900 + static_cast<std::uint64_t>(s), 8, 26);
      losses.push_back(sys.run(sys.plan(batch), batch, m, adam).loss);
    }
    return losses;
  });
  int runs = 0;
  for (int tp : {1, 2})
    for (int pp : {1, 2})
      for (int ep : {1, 2})
        for (bool zero : {false, true}) {
          const five_d_layout l{.pp = pp, .mesh = {.tp = tp, .ep = ep}, .zero = zero};
          // Ulysses over each tp rank's heads: 4 query and 2 KV heads over tp.
          const seq::ulysses uly{.degree = 2, .heads = 4 / tp, .kv_heads = 2 / tp, .head_dim = 4};
          auto run = [&](const auto& partition) {
            return testsupport::rank0_of(
                8, [&](comm::loopback::communicator& c) { return five_d_losses(c, partition, l); });
          };
          const std::vector<double> got[] = {run(seq::cp_thd{.cp = 1}),
                                             run(seq::cp_zigzag{.cp = 2, .pad = true}),
                                             run(seq::hdp<seq::no_offload>{.capacity = 12}), run(uly)};
          const auto& want = ep > 1 ? moe : dense;
          for (const auto& g : got) {
            CAPTURE(tp);
            CAPTURE(pp);
            CAPTURE(ep);
            CAPTURE(zero);
            CHECK(worst(g, want) <= 1e-5);
            ++runs;
          }
        }
  CHECK(runs == 64);
  CHECK(dense[4] < dense[0]);  // it trains
}

TEST_CASE("5-D: tp 2 x pp 2 x cp 2 x dp 2 on 16 ranks trains as a 1-rank run") {
  const auto want = reference();
  for (bool zero : {false, true}) {
    const auto got = testsupport::rank0_of(16, [&](comm::loopback::communicator& c) {
      return five_d_losses(c, seq::cp_zigzag{.cp = 2, .pad = true},
                           five_d_layout{.pp = 2, .mesh = {.tp = 2, .cp = 2}, .zero = zero});
    });
    CHECK(worst(got, want) <= 1e-5);
  }
}

TEST_CASE("5-D: step-0 gradients of every tp x pp x ep x partition layout on 8 ranks equal a 1-rank run's") {
  const auto batch = random_batch(71, 8, 26);
  int runs = 0;
  for (int tp : {1, 2})
    for (int pp : {1, 2})
      for (int ep : {1, 2}) {
        const seq::ulysses uly{.degree = 2, .heads = 4 / tp, .kv_heads = 2 / tp, .head_dim = 4};
        auto check = [&](const auto& partition) {
          using P = std::remove_cvref_t<decltype(partition)>;
          const auto r = testsupport::rank0_of(8, [&](comm::loopback::communicator& c) {
            train::system_options o;
            o.mesh = {.tp = tp, .ep = ep};
            train::system<P, model::reference_attention, comm::loopback::communicator> sys(
                partition, train::family_placement{}, train::pipeline_config<>{pp, {}, {}}, c, {}, o);
            if (ep > 1)
              return train::check_parity(
                  sys, batch, [](const train::model_split& sp) { return moe_lm<double>(kShape, 29, sp); });
            return train::check_parity(sys, batch, [](const train::model_split& sp) {
              return tiny_stack<double>(kTpShape, 29, kBlocks, sp);
            });
          });
          CAPTURE(tp);
          CAPTURE(pp);
          CAPTURE(ep);
          CAPTURE(fmt::format("{}", r));
          CHECK(r.passed);
          CHECK(r.rel_error <= 2e-5);
          ++runs;
        };
        check(seq::cp_thd{.cp = 1});
        check(seq::cp_zigzag{.cp = 2, .pad = true});
        check(seq::hdp<seq::no_offload>{.capacity = 12});
        check(uly);
      }
  CHECK(runs == 32);
}
