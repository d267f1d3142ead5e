// SPDX-License-Identifier: Apache-2.0
// example_torch_train's model, written with torch::nn modules and a forward only (autograd gives the
// backward): a vision and an audio encoder (a linear embedding of the item's feature rows, one pre-norm
// transformer layer with attention inside the item, a projection to the LLM width) and a causal
// transformer backbone (token embedding where the encoders' rows replace the placeholder tokens, pre-norm
// blocks with rotary positions and grouped-query attention, a final norm and head). Nothing here knows
// hetmesh: attention is a callable the caller supplies (the plain loop's local attention, or the
// adapter's call.attention that runs over the step's rings and groups), and so are the token positions.
// Every parameter is a pure function of (seed, its name in the full model), so every rank, whatever
// stages it holds, and the plain loop build the same model.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <hetmesh/core/hash.hpp>
#include <hetmesh/core/random.hpp>

namespace torch_train {

/// The model's sizes (small: a step runs in well under a second on a CPU).
struct shape {
  std::int64_t vocab = 64;       ///< token ids (the data's vocabulary)
  std::int64_t width = 32;       ///< LLM width
  std::int64_t q_heads = 4;      ///< query heads
  std::int64_t kv_heads = 2;     ///< key/value heads (grouped-query attention)
  std::int64_t head_dim = 8;     ///< elements per head (even: rotary positions)
  std::int64_t mlp_hidden = 64;  ///< LLM MLP hidden width
  int blocks = 4;                ///< transformer blocks, spread evenly over the pipeline stages
  std::int64_t image_dim = 16;   ///< floats per image token (the data's)
  std::int64_t audio_dim = 16;   ///< floats per audio frame (the data's)
  std::int64_t enc_width = 24;   ///< encoders' width
  std::int64_t enc_heads = 4;    ///< encoders' attention heads
  std::int64_t enc_hidden = 48;  ///< encoders' MLP hidden width
  double rope_base = 10000.0;    ///< rotary frequency base
};

/// Attention of q [n][heads][dim] over k, v [n][kv_heads][dim]: returns [n][heads][dim]. The caller decides
/// which keys each query sees (causal per document in the backbone, the whole item in an encoder).
using attend_fn =
    std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v)>;

/// x [n][heads][dim] rotated by the angles of `positions` (n int64 values): rotary position embedding.
inline torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& positions, double base) {
  const auto half = x.size(2) / 2;
  const auto freq = torch::pow(base, -torch::arange(half, x.options()) / static_cast<double>(half));
  const auto angle = positions.to(x.dtype()).unsqueeze(1) * freq.unsqueeze(0);  // [n][half]
  const auto c = angle.cos().unsqueeze(1), s = angle.sin().unsqueeze(1);
  const auto a = x.narrow(2, 0, half), b = x.narrow(2, half, half);
  return torch::cat({a * c - b * s, a * s + b * c}, 2);
}

/// A pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x)) (SiLU). With `positions`
/// defined, q and k get rotary positions.
struct layer_impl : torch::nn::Module {
  layer_impl(std::int64_t width, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
             std::int64_t hidden)
      : heads_(heads), kv_heads_(kv_heads), dim_(head_dim) {
    const auto linear = [&](const char* name, std::int64_t in, std::int64_t out) {
      return register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
    };
    norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    q = linear("q", width, heads * head_dim);
    k = linear("k", width, kv_heads * head_dim);
    v = linear("v", width, kv_heads * head_dim);
    o = linear("o", heads * head_dim, width);
    norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    up = linear("up", width, hidden);
    down = linear("down", hidden, width);
  }

  /// The layer over x [n][width]; `positions` (n int64) or undefined for none.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& positions, double rope_base,
                        const attend_fn& attend) {
    const auto n = x.size(0);
    const auto h = norm1(x);
    auto qh = q(h).view({n, heads_, dim_}), kh = k(h).view({n, kv_heads_, dim_});
    const auto vh = v(h).view({n, kv_heads_, dim_});
    if (positions.defined()) {
      qh = rotary(qh, positions, rope_base);
      kh = rotary(kh, positions, rope_base);
    }
    const auto y = x + o(attend(qh, kh, vh).reshape({n, heads_ * dim_}));
    return y + down(torch::silu(up(norm2(y))));
  }

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr}, up{nullptr}, down{nullptr};

 private:
  std::int64_t heads_, kv_heads_, dim_;
};
TORCH_MODULE_IMPL(layer, layer_impl);

/// An encoder: feature rows [n][in] of the items of a batch to LLM rows [n][width]. One layer of
/// attention inside each item (the caller's attend knows the items).
struct encoder_net_impl : torch::nn::Module {
  encoder_net_impl(const shape& s, std::int64_t in) {
    embed = register_module("embed", torch::nn::Linear(in, s.enc_width));
    body = register_module(
        "layer", layer(s.enc_width, s.enc_heads, s.enc_heads, s.enc_width / s.enc_heads, s.enc_hidden));
    proj = register_module("proj",
                           torch::nn::Linear(torch::nn::LinearOptions(s.enc_width, s.width).bias(false)));
  }
  /// The rows of x [n][in].
  torch::Tensor forward(const torch::Tensor& x, const attend_fn& attend) {
    return proj(body(embed(x), torch::Tensor(), 0.0, attend));
  }
  torch::nn::Linear embed{nullptr}, proj{nullptr};
  layer body{nullptr};
};
TORCH_MODULE_IMPL(encoder_net, encoder_net_impl);

/// The causal transformer backbone, whole: embedding, `blocks` layers, final norm and head. A pipeline
/// stage runs a range of it (backbone_part).
struct llm_impl : torch::nn::Module {
  explicit llm_impl(const shape& s) : sh(s) {
    embed = register_module("embed", torch::nn::Embedding(s.vocab, s.width));
    for (int b = 0; b < s.blocks; ++b)
      blocks.push_back(register_module("block" + std::to_string(b),
                                       layer(s.width, s.q_heads, s.kv_heads, s.head_dim, s.mlp_hidden)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(s.width, s.vocab).bias(false)));
  }
  /// The first block of pipeline stage `stage` of `stages`.
  [[nodiscard]] int first_block(int stage, int stages) const { return stage * sh.blocks / stages; }
  /// Blocks [first_block(stage), first_block(stage + 1)) over x [n][width] at `positions`.
  torch::Tensor run_blocks(int stage, int stages, torch::Tensor x, const torch::Tensor& positions,
                           const attend_fn& attend) {
    for (int b = first_block(stage, stages); b < first_block(stage + 1, stages); ++b)
      x = blocks[static_cast<std::size_t>(b)](x, positions, sh.rope_base, attend);
    return x;
  }
  /// Per-token cross-entropy of the head's logits of x [n][width] against `targets` (n int64; those with
  /// weight 0 may hold anything), times `weights` (n).
  torch::Tensor token_losses(const torch::Tensor& x, const torch::Tensor& targets,
                             const torch::Tensor& weights) {
    const auto logp = torch::log_softmax(head(norm(x)), 1);
    const auto safe = torch::where(weights > 0, targets, torch::zeros_like(targets));
    return -logp.gather(1, safe.unsqueeze(1)).squeeze(1) * weights;
  }

  shape sh;
  torch::nn::Embedding embed{nullptr};
  std::vector<layer> blocks;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE_IMPL(llm, llm_impl);

/// The whole model: the backbone and both encoders, in encoder-index order (vision 0, audio 1).
struct multimodal_impl : torch::nn::Module {
  explicit multimodal_impl(const shape& s) {
    backbone = register_module("llm", llm(s));
    vision = register_module("vision", encoder_net(s, s.image_dim));
    audio = register_module("audio", encoder_net(s, s.audio_dim));
  }
  llm backbone{nullptr};
  encoder_net vision{nullptr}, audio{nullptr};
};
TORCH_MODULE_IMPL(multimodal, multimodal_impl);

/// Sets every parameter of `m` from `seed` and its name: norm gains 1, biases and norm shifts uniform in
/// [-0.1, 0.1], the token embedding in [-0.5, 0.5], linear weights [out][in] in [-1/sqrt(in), 1/sqrt(in)].
/// Pure in (seed, names: call it on the whole model), so the plain loop and every rank agree. The model moves
/// to `dtype`.
inline void init_parameters(torch::nn::Module& m, std::uint64_t seed, torch::Dtype dtype) {
  m.to(dtype);
  torch::NoGradGuard no_grad;
  for (auto& p : m.named_parameters()) {
    const std::string& name = p.key();
    hetmesh::hasher h;
    h.add_u64(seed);
    h.add_bytes(reinterpret_cast<const unsigned char*>(name.data()), name.size());
    hetmesh::rng g(h.digest());
    auto& t = p.value();
    const bool norm = name.find("norm") != std::string::npos;
    const bool bias = name.ends_with(".bias");
    double scale = 0.5, center = 0.0;
    if (norm && !bias) {
      scale = 0.0;
      center = 1.0;
    } else if (bias) {
      scale = 0.1;
    } else if (name != "llm.embed.weight") {  // a linear map's weight [out][in]
      scale = 1.0 / std::sqrt(static_cast<double>(t.size(-1)));
    }
    std::vector<double> v(static_cast<std::size_t>(t.numel()));
    for (auto& x : v) x = center + scale * (2.0 * g.unit() - 1.0);
    t.copy_(torch::from_blob(v.data(), t.sizes(), torch::kFloat64).to(dtype));
  }
}

}  // namespace torch_train
