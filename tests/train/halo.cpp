// SPDX-License-Identifier: Apache-2.0
// The halo exchange through train::system: a model whose only token mixer is a causal convolution over
// the 3 tokens before each token (tests/train/halo_lm.hpp) matches a 1-rank run (train::check_parity)
// under data parallelism, static CP (zigzag and THD), HDP rings, Ulysses and a 2-stage pipeline with CP;
// with the exchange switched off it fails parity under every sequence split (the mutation) and passes under
// data parallelism; a stage that declares nothing is refused under CP, HDP and Ulysses, naming what to
// declare, and accepted under data parallelism; a stage asking for more halo than it declared is refused.
#include <doctest/doctest.h>

#include <atomic>
#include <string>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/train/train.hpp>

#include "support/rank0.hpp"
#include "train/halo_lm.hpp"
#include "train/train_body.hpp"

using namespace hetmesh;
using namespace traintest;

namespace {

constexpr int kLayers = 2;

template <bool Declared = true>
struct make_halo_lm {
  bool off = false;
  halo_lm<double, Declared> operator()(int stages, std::span<const int> local) const {
    halo_lm<double, Declared> m(kShape, 11, kLayers, stages, local);
    m.halo_off = off;
    return m;
  }
};

// check_parity of the convolution model under `partition` on `ranks` loopback ranks (pipeline depth pp).
template <bool Declared = true, class Partition, class Balancer = train::family_placement>
train::parity_result parity(const Partition& partition, int ranks, bool off, int pp = 1,
                            Balancer balancer = {}) {
  const auto batch = random_batch(41, 7, 30);
  return testsupport::rank0_of(ranks, [&](comm::loopback::communicator& c) {
    train::system<Partition, model::reference_attention, comm::loopback::communicator, Balancer> sys(
        partition, balancer, train::pipeline_config<>{pp, {}, {}}, c);
    return train::check_parity(sys, batch, make_halo_lm<Declared>{off});
  });
}

// The message train::system::run refuses an undeclared stage with under `partition` ("" when it runs).
template <class Partition>
std::string refusal(const Partition& partition, int ranks) {
  const auto batch = random_batch(43, 5, 24);
  std::atomic<int> refused{0};
  std::string text;
  comm::loopback::run(ranks, [&](comm::loopback::communicator& c) {
    train::system<Partition, model::reference_attention, comm::loopback::communicator> sys(partition, c);
    halo_lm<double, false> m(kShape, 11, kLayers, 1, std::vector<int>{0});
    try {
      (void)sys.run(sys.plan(batch), batch, m, [](auto&&, auto&&) {});
    } catch (const invalid_argument& e) {
      if (++refused == 1) text = e.what();
    }
  });
  CHECK((refused == 0 || refused == ranks));  // every rank, or none
  return text;
}

}  // namespace

TEST_CASE("halo: a convolution model matches a 1-rank run in every layout; without the exchange it fails") {
  const seq::ulysses ulysses{.degree = 2, .heads = 2, .kv_heads = 1, .head_dim = 4};
  for (bool off : {false, true}) {
    CAPTURE(off);
    const auto dp = parity(seq::cp_thd{.cp = 1}, 4, off);
    const auto zigzag = parity(seq::cp_zigzag{.cp = 2, .pad = true}, 4, off);
    const auto thd = parity(seq::cp_thd{.cp = 4, .pad = true}, 4, off);
    const auto hdp = parity(seq::hdp<seq::no_offload>{.capacity = 10}, 4, off);
    const auto uly = parity(ulysses, 4, off);
    const auto pipe = parity(seq::cp_zigzag{.cp = 2, .pad = true}, 4, off, 2);
    for (const auto* r : {&dp, &zigzag, &thd, &hdp, &uly, &pipe}) MESSAGE(fmt::format("{}", *r));
    CHECK(dp.passed);  // documents are whole: every halo row is local, exchange or not
    CHECK(zigzag.passed == !off);
    CHECK(thd.passed == !off);
    CHECK(hdp.passed == !off);
    CHECK(uly.passed == !off);
    CHECK(pipe.passed == !off);
    if (!off)
      for (const auto* r : {&dp, &zigzag, &thd, &hdp, &uly, &pipe}) CHECK(r->rel_error <= 1e-12);
  }
}

TEST_CASE("halo: a stage that declares no token mixing is refused under a split, accepted without one") {
  for (const auto& text : {refusal(seq::cp_zigzag{.cp = 2, .pad = true}, 2),
                           refusal(seq::hdp<seq::no_offload>{.capacity = 16}, 2),
                           refusal(seq::ulysses{.degree = 2, .heads = 2, .kv_heads = 1, .head_dim = 4}, 2)}) {
    CHECK(text.find("does not declare how it mixes tokens") != std::string::npos);
    CHECK(text.find("model::causal_halo(k)") != std::string::npos);
  }
  CHECK(refusal(seq::cp_thd{.cp = 1}, 2).empty());
  CHECK(refusal(seq::hdp<seq::no_offload>{.capacity = 64}, 1).empty());  // a pool of one rank splits nothing
  const auto dp = parity<false>(seq::cp_thd{.cp = 1}, 2, false);
  CHECK(dp.passed);
  CHECK(dp.rel_error <= 1e-12);
}

namespace {
/// Declares a halo of 2 and asks for 3.
struct over_asking : halo_lm<double> {
  using halo_lm<double>::halo_lm;
  static constexpr model::token_mixing token_mixing = model::causal_halo(2);
};
}  // namespace

TEST_CASE("halo: asking for more halo than the stage declares is refused, naming both") {
  const auto batch = random_batch(45, 4, 20);
  std::atomic<int> named{0};
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    train::system<seq::cp_zigzag, model::reference_attention, comm::loopback::communicator> sys(
        {.cp = 2, .pad = true}, c);
    over_asking m(kShape, 11, kLayers, 1, std::vector<int>{0});
    try {
      (void)sys.run(sys.plan(batch), batch, m, [](auto&&, auto&&) {});
    } catch (const std::exception& e) {
      if (std::string(e.what()).find(
              "asks for a halo of 3 tokens but declares token_mixing = causal halo of 2") !=
          std::string::npos)
        ++named;
    }
  });
  CHECK(named == 2);
}
