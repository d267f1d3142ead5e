// SPDX-License-Identifier: Apache-2.0
// example_torch_train's modules as the libtorch adapters call them: forward(input, call) with the call's
// micro-batch (or encoder batch) view, pipeline stage and attention (libtorch::stage_call). The backbone
// module holds the blocks of this rank's pipeline stages (registered under their names in the whole model,
// so the gradients compare by name); stage 0 embeds the tokens and puts the encoders' rows where they land;
// the last stage returns each token's cross-entropy (the adapter weights it). The
// encoder module holds one encoder. Both are the model of model.hpp, whose attention is the call's.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include <hetmesh/libtorch/backbone_module.hpp>
#include <hetmesh/libtorch/encoder_module.hpp>
#include <hetmesh/libtorch/stage_call.hpp>
#include <hetmesh/model/attention.hpp>
#include <hetmesh/model/encoder_batch.hpp>
#include <hetmesh/model/micro_batch.hpp>
#include <hetmesh/model/stage.hpp>
#include <hetmesh/model/token_mixing.hpp>

#include "torch_train/model.hpp"

namespace torch_train {

/// A span of int64 as a tensor (copied: the views' memory belongs to the runtime).
inline torch::Tensor int64_tensor(std::span<const std::int64_t> v) {
  return torch::tensor(std::vector<std::int64_t>(v.begin(), v.end()), torch::kInt64);
}

/// This rank's pipeline stages of the backbone.
struct backbone_stages_impl : torch::nn::Module {
  /// Tokens meet only in attention (call.attention): train::system may split a sequence over ranks.
  static constexpr hetmesh::model::token_mixing token_mixing = hetmesh::model::through_attention;

  /// The stages `local` of a `stages`-stage pipeline over `whole`'s layers (shared with it).
  backbone_stages_impl(llm whole, int stages, std::span<const int> local) : net(whole), stages_(stages) {
    for (int st : local) {
      if (st == 0) register_module("embed", net->embed);
      for (int b = net->first_block(st, stages); b < net->first_block(st + 1, stages); ++b)
        register_module("block" + std::to_string(b), net->blocks[static_cast<std::size_t>(b)]);
      if (st == stages - 1) {
        register_module("norm", net->norm);
        register_module("head", net->head);
      }
    }
  }

  /// Rows of `width` between stages; one loss term per token from the last.
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& mb, int stage) const {
    return stage == stages_ - 1 ? mb.size() : mb.size() * net->sh.width;
  }

  /// Stage call.stage() of the micro-batch call.batch(): `in` is the previous stage's rows, or on stage 0
  /// the encoders' rows in mb.encoder_outputs order.
  torch::Tensor forward(const torch::Tensor& in, const hetmesh::libtorch::stage_call& call) {
    const auto& mb = call.batch();
    const auto& s = net->sh;
    torch::Tensor x = call.first_stage() ? embed(mb, in) : in.reshape({mb.size(), s.width});
    const hetmesh::model::attention_shape shape{static_cast<int>(s.q_heads), static_cast<int>(s.kv_heads),
                                                static_cast<int>(s.head_dim)};
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    const attend_fn attend = [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
      return call.attention(q, k, v, shape, scale);
    };
    x = net->run_blocks(call.stage(), call.stages(), x, int64_tensor(mb.positions), attend);
    if (!call.last_stage()) return x;
    // One cross-entropy per token (the adapter weights them by mb.loss_weights / mb.step_targets); a token
    // without a target (hetmesh::model::ignore_target) reads target 0, weighted 0.
    const auto targets = int64_tensor(mb.targets);
    return net->token_losses(x, targets, (targets >= 0).to(x.scalar_type()));
  }

  llm net;  ///< the whole backbone (this rank runs, and registers, only its stages' layers)

 private:
  /// The tokens' embeddings, the landed encoder rows in their places.
  torch::Tensor embed(const hetmesh::model::micro_batch_view& mb, const torch::Tensor& in) {
    auto x = net->embed(int64_tensor(mb.tokens));
    std::vector<std::int64_t> rows;
    for (const auto& landing : mb.encoder_outputs)
      for (std::int64_t r = 0; r < landing.item_tokens.size(); ++r) rows.push_back(landing.local_offset + r);
    if (rows.empty()) return x;
    return x.index_copy(0, torch::tensor(rows, torch::kInt64), in.reshape({-1, net->sh.width}));
  }
  int stages_;
};
TORCH_MODULE_IMPL(backbone_stages, backbone_stages_impl);
static_assert(hetmesh::libtorch::check_backbone_module<backbone_stages_impl>());

/// One encoder as the encoder adapter calls it: feature rows [n][in] of the call's items to LLM rows.
/// Modality: a tag with a `name` (hetmesh::model::vision_modality, audio_modality).
template <class Modality>
struct encoder_stage : torch::nn::Module {
  /// The items it encodes (data::loaded_item::kind).
  static constexpr std::string_view modality = Modality::name;

  /// `net` (shared), reading `in` floats per token.
  encoder_stage(encoder_net whole, const shape& s, std::int64_t in) : net(whole), sh(s), in_dim(in) {
    register_module("embed", net->embed);
    register_module("layer", net->body);
    register_module("proj", net->proj);
  }
  /// `in_dim` per token in, `width` per token out.
  [[nodiscard]] std::int64_t input_size(const hetmesh::model::encoder_batch_view& ev) const {
    return ev.size() * in_dim;
  }
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::encoder_batch_view& ev) const {
    return ev.size() * sh.width;
  }
  /// The encoder's heads: long-short SP splits an item only over groups dividing them.
  [[nodiscard]] int attention_heads() const { return static_cast<int>(sh.enc_heads); }

  /// The rows of the call's items; attention inside each item through the call.
  torch::Tensor forward(const torch::Tensor& in, const hetmesh::libtorch::stage_call& call) {
    const auto heads = static_cast<int>(sh.enc_heads);
    const hetmesh::model::attention_shape shape{heads, heads, static_cast<int>(sh.enc_width / heads)};
    const double scale = 1.0 / std::sqrt(static_cast<double>(sh.enc_width / heads));
    const attend_fn attend = [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
      return call.attention(q, k, v, shape, scale);
    };
    return net->forward(in.reshape({call.tokens(), in_dim}), attend);
  }

  encoder_net net;  ///< the encoder
  shape sh;
  std::int64_t in_dim;  ///< floats per token in
};

static_assert(hetmesh::libtorch::check_encoder_module<encoder_stage<hetmesh::model::vision_modality>>());

}  // namespace torch_train
