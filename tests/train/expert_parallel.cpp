// SPDX-License-Identifier: Apache-2.0
// Expert parallelism through train::system (system_options::mesh.ep): a mixture-of-experts model
// (tests/train/moe_lm.hpp: 4 experts, top 2, dropless) whose experts are spread over ctx.ep matches a 1-rank
// run of the whole model (train::check_parity) on 8 loopback ranks under ep 2 with pp 1 and 2 and every
// partition family, and with tp 2 beside ep 2; its expert weights are reduced over the ranks holding the
// same experts (their sum over the pool would mix experts), and the ranks of a slot without a micro-batch
// still meet their group's all-to-alls.
#include <doctest/doctest.h>

#include <string>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/train/train.hpp>

#include "support/rank0.hpp"
#include "train/moe_lm.hpp"
#include "train/train_body.hpp"

using namespace hetmesh;
using namespace traintest;

namespace {

template <class Partition>
train::parity_result ep_parity(const Partition& partition, int pp, train::system_mesh mesh) {
  const auto batch = random_batch(51, 9, 26);
  return testsupport::rank0_of(8, [&](comm::loopback::communicator& c) {
    train::system_options o;
    o.mesh = mesh;
    train::system<Partition, model::reference_attention, comm::loopback::communicator> sys(
        partition, train::family_placement{}, train::pipeline_config<>{pp, {}, {}}, c, {}, o);
    return train::check_parity(sys, batch,
                               [](const train::model_split& sp) { return moe_lm<double>(kShape, 17, sp); });
  });
}

}  // namespace

TEST_CASE(
    "expert parallel: ep 2 under every partition family and pp {1, 2}, and tp 2 beside it, match a 1-rank "
    "run") {
  const seq::ulysses ulysses{.degree = 2, .heads = 2, .kv_heads = 1, .head_dim = 4};
  for (int pp : {1, 2}) {
    CAPTURE(pp);
    const train::system_mesh ep2{.ep = 2};
    const train::parity_result runs[] = {
        ep_parity(seq::cp_thd{.cp = 1}, pp, ep2), ep_parity(seq::cp_zigzag{.cp = 2, .pad = true}, pp, ep2),
        ep_parity(seq::hdp<seq::no_offload>{.capacity = 12}, pp, ep2), ep_parity(ulysses, pp, ep2),
        ep_parity(seq::cp_thd{.cp = 1}, pp, {.tp = 2, .ep = 2})};
    for (const auto& r : runs) {
      MESSAGE(fmt::format("{}", r));
      CHECK(r.passed);
      CHECK(r.rel_error <= 1e-10);
      CHECK(r.targets == r.reference_targets);
      CHECK(r.tokens == r.reference_tokens);
    }
  }
}

TEST_CASE("expert parallel: expert gradients summed over the pool (not the expert's ranks) fail parity") {
  // The same model with its experts declared dense: the system sums their gradients over the whole pool,
  // adding different experts' gradients together.
  struct dense_experts : moe_lm<double> {
    using moe_lm<double>::moe_lm;
    std::vector<std::span<double>> parameters() {
      auto p = moe_lm<double>::parameters();
      for (auto s : moe_lm<double>::expert_parameters()) p.push_back(s);
      return p;
    }
    std::vector<std::span<double>> gradients() {
      auto g = moe_lm<double>::gradients();
      for (auto s : moe_lm<double>::expert_gradients()) g.push_back(s);
      return g;
    }
    void expert_parameters() = delete;
    void expert_gradients() = delete;
  };
  static_assert(!train::has_expert_parameters<dense_experts>);
  const auto batch = random_batch(52, 8, 24);
  const auto r = testsupport::rank0_of(4, [&](comm::loopback::communicator& c) {
    train::system_options o;
    o.mesh = {.ep = 2};
    train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator> sys(
        {.cp = 1}, train::family_placement{}, train::pipeline_config<>{}, c, {}, o);
    return train::check_parity(sys, batch,
                               [](const train::model_split& sp) { return dense_experts(kShape, 17, sp); });
  });
  MESSAGE(fmt::format("{}", r));
  CHECK(!r.passed);
  CHECK(r.tensor >= 20);  // an expert tensor (ids 20 and 21)
}
