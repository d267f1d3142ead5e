// SPDX-License-Identifier: Apache-2.0
// test_libtorch_stage's system cases: the adapted stack trained by train::system on loopback ranks (DP
// with a CP ring; a 2-stage pipeline with the zero-bubble schedule, which splits backward), against the
// library's 1-rank reference through train::check_parity.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/train.hpp>

#include "libtorch/stage_support.hpp"

namespace torchtest {

/// A seeded step: `docs` documents of 2..max_len tokens, ids in [1, 11), a loss mask on some.
inline model::step_batch random_step(std::uint64_t seed, int docs, std::int64_t max_len) {
  rng g(seed);
  model::step_batch b;
  b.pad_token = 0;
  for (int i = 0; i < docs; ++i) {
    model::document d;
    d.id = 500 + 3 * i;
    const auto len = g.uniform(2, max_len);
    for (std::int64_t t = 0; t < len; ++t) d.tokens.push_back(g.uniform(1, block_shape{}.vocab - 1));
    if (g.uniform(0, 1) == 1) {
      d.loss_mask.assign(static_cast<std::size_t>(len), 1);
      d.loss_mask[0] = 0;
    }
    b.documents.push_back(std::move(d));
  }
  return b;
}

/// The adapted stack as train::check_parity builds it: the stages `local` of `stages`, four blocks.
struct torch_model {
  stack_stage stage;
  torch_model(std::uint64_t seed, int stages, std::span<const int> local, bool mutate = false)
      : stage(Stack(block_shape{}, seed, 4, stages, std::vector<int>(local.begin(), local.end())),
              {.stages = stages, .ignore_output_gradient = mutate}) {}
  stack_stage& backbone() { return stage; }
  /// (id, value, gradient) of every parameter, ids from StackImpl::ids.
  std::vector<train::model_tensor<double>> tensors() {
    std::vector<train::model_tensor<double>> out;
    const auto& ids = stage.module().ids;
    for (std::size_t i = 0; i < ids.size(); ++i)
      out.push_back({ids[i], stage.parameters()[i], stage.gradients()[i]});
    return out;
  }
};

/// One step of `sys` (built on each rank by make_sys(world)) over `ranks` loopback ranks against the 1-rank
/// reference; rank 0's verdict. `mutate`: the adapter ignores received output gradients (the mutation).
template <class MakeSys>
train::parity_result torch_parity(int ranks, std::uint64_t seed, MakeSys make_sys, bool mutate = false) {
  const auto batch = random_step(seed, 6, 14);
  std::vector<train::parity_result> results(static_cast<std::size_t>(ranks));
  comm::loopback::run(ranks, [&](comm::loopback::communicator& world) {
    auto sys = make_sys(world);
    results[static_cast<std::size_t>(world.rank())] = train::check_parity(
        sys, batch,
        [&](int stages, std::span<const int> local) { return torch_model(seed, stages, local, mutate); });
  });
  return results[0];
}

}  // namespace torchtest
