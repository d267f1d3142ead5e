// SPDX-License-Identifier: Apache-2.0
// test_libtorch_stage's system cases: the adapted stack trained by train::system on loopback ranks (DP
// with a CP ring; a 2-stage pipeline with the zero-bubble schedule, which splits backward), against the
// library's 1-rank reference through train::check_parity.
#pragma once

#include <cstdint>
#include <span>
#include <tuple>
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

/// random_step with an item of encoder 0 on every document of >= 6 tokens: a third of its tokens from
/// token 1.
inline model::step_batch random_mm_step(std::uint64_t seed, int docs, std::int64_t max_len) {
  auto b = random_step(seed, docs, max_len);
  for (std::size_t i = 0; i < b.documents.size(); ++i) {
    auto& d = b.documents[i];
    if (d.length() >= 6) d.items.push_back({0, static_cast<std::int64_t>(i), 1, d.length() / 3});
  }
  return b;
}

/// The encoder's input: a value per (item, token, feature) in [-0.5, 0.5), in the view's buffer order.
struct item_input {
  void operator()(const model::encoder_batch_view& v, std::span<double> in) const {
    for (const auto& p : v.pieces)
      for (std::int64_t t = p.tokens.begin; t < p.tokens.end; ++t)
        for (std::int64_t f = 0; f < 8; ++f)
          in[static_cast<std::size_t>((p.offset + t - p.tokens.begin) * 8 + f)] =
              static_cast<double>(key_hash({static_cast<std::uint64_t>(p.item), static_cast<std::uint64_t>(t),
                                            static_cast<std::uint64_t>(f)}) >>
                                  11) *
                  0x1.0p-53 -
              0.5;
  }
};

/// The adapted stack and an adapted encoder (ids of the encoder's k-th tensor: -1 - 10 k).
struct torch_mm_model {
  torch_model lm;
  libtorch::encoder<EncImpl, double> vision;
  torch_mm_model(std::uint64_t seed, int stages, std::span<const int> local)
      : lm(seed, stages, local), vision(Enc(seed + 7)) {}
  stack_stage& backbone() { return lm.stage; }
  auto encoders() { return std::tie(vision); }
  std::vector<train::model_tensor<double>> tensors() {
    auto out = lm.tensors();
    for (std::size_t k = 0; k < vision.parameters().size(); ++k)
      out.push_back({-1 - 10 * static_cast<std::int64_t>(k), vision.parameters()[k], vision.gradients()[k]});
    return out;
  }
};

/// torch_parity of the multimodal model on a batch with encoder items.
template <class MakeSys>
train::parity_result torch_mm_parity(int ranks, std::uint64_t seed, MakeSys make_sys) {
  const auto batch = random_mm_step(seed, 6, 16);
  std::vector<train::parity_result> results(static_cast<std::size_t>(ranks));
  comm::loopback::run(ranks, [&](comm::loopback::communicator& world) {
    auto sys = make_sys(world);
    results[static_cast<std::size_t>(world.rank())] = train::check_parity(
        sys, batch,
        [&](int stages, std::span<const int> local) { return torch_mm_model(seed, stages, local); }, {},
        item_input{});
  });
  return results[0];
}

}  // namespace torchtest
