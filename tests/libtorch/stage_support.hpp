// SPDX-License-Identifier: Apache-2.0
// Support of test_libtorch_stage: a small torch::nn block (embedding on the first stage, a residual
// linear + gelu, grouped-query attention through the call or through plain torch ops, a head and a
// per-token cross-entropy on the last stage), a context whose attention runs the reference kernel over
// the whole micro-batch (a ring of one), and a seeded micro-batch.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <torch/torch.h>

#include <hetmesh/core/random.hpp>
#include <hetmesh/libtorch/libtorch.hpp>
#include <hetmesh/model/context.hpp>
#include <hetmesh/model/micro_batch.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/seq/attention_merge.hpp>

namespace torchtest {

using namespace hetmesh;

/// The block's sizes.
struct block_shape {
  std::int64_t vocab = 11;
  std::int64_t width = 8;
  model::attention_shape attn{2, 1, 4};
};

/// Causal per-document attention with plain torch ops (the reference the bridge must match): q [n][hq][d],
/// k, v [n][hk][d]; token i sees token j when they share a document and pos j <= pos i.
inline at::Tensor plain_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const model::micro_batch_view& mb, const model::attention_shape& s,
                                  double scale) {
  const auto n = mb.size();
  const auto rep = s.q_heads / s.kv_heads;
  const auto kk = k.repeat_interleave(rep, 1), vv = v.repeat_interleave(rep, 1);
  const auto opts = at::TensorOptions().dtype(at::kLong);
  const auto doc = at::tensor(std::vector<std::int64_t>(mb.doc_ids.begin(), mb.doc_ids.end()), opts);
  const auto pos = at::tensor(std::vector<std::int64_t>(mb.positions.begin(), mb.positions.end()), opts);
  const auto visible = doc.view({n, 1}).eq(doc.view({1, n})) & pos.view({1, n}).le(pos.view({n, 1}));
  auto scores = at::einsum("ihd,jhd->hij", {q, kk}) * scale;
  scores = scores.masked_fill(visible.logical_not().unsqueeze(0), -std::numeric_limits<double>::infinity());
  return at::einsum("hij,jhd->ihd", {at::softmax(scores, -1), vv});
}

/// The test block. Stage 0 embeds the tokens (its input, the landed encoder rows, is empty); later stages
/// read the previous stage's [n][width] rows; the last stage returns the per-token cross-entropy.
struct BlockImpl : torch::nn::Module {
  static constexpr model::token_mixing token_mixing = model::through_attention;

  block_shape shape;
  int stages = 1;
  bool plain = false;  ///< attention through plain torch ops instead of the call (the reference)
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear w1{nullptr}, wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr}, head{nullptr};

  BlockImpl(block_shape s, int num_stages, std::uint64_t seed) : shape(s), stages(num_stages) {
    const auto hq = s.attn.q_heads * s.attn.head_dim, hk = s.attn.kv_heads * s.attn.head_dim;
    emb = register_module("emb", torch::nn::Embedding(s.vocab, s.width));
    w1 = register_module("w1", torch::nn::Linear(s.width, s.width));
    wq = register_module("wq", torch::nn::Linear(torch::nn::LinearOptions(s.width, hq).bias(false)));
    wk = register_module("wk", torch::nn::Linear(torch::nn::LinearOptions(s.width, hk).bias(false)));
    wv = register_module("wv", torch::nn::Linear(torch::nn::LinearOptions(s.width, hk).bias(false)));
    wo = register_module("wo", torch::nn::Linear(hq, s.width));
    head = register_module("head", torch::nn::Linear(s.width, s.vocab));
    to(at::kDouble);
    const torch::NoGradGuard no_grad;
    std::uint64_t i = 0;
    for (auto& p : parameters()) {  // seeded values in [-0.5, 0.5)
      rng g(seed * 131 + ++i);
      auto flat = p.view({-1});
      for (std::int64_t e = 0; e < flat.numel(); ++e)
        flat[e] = static_cast<double>(g.uniform(0, 1 << 20)) / double(1 << 20) - 0.5;
    }
  }

  at::Tensor forward(const at::Tensor& x, const libtorch::stage_call& call) {
    const auto& mb = call.batch();
    const auto n = mb.size();
    const auto& a = shape.attn;
    at::Tensor h;
    if (call.first_stage()) {
      const auto ids = at::tensor(std::vector<std::int64_t>(mb.tokens.begin(), mb.tokens.end()),
                                  at::TensorOptions().dtype(at::kLong));
      h = emb(ids) + x.sum() * 0;  // the (empty) input joins the graph
    } else {
      h = x.view({n, shape.width});
    }
    h = h + torch::gelu(w1(h));
    const auto q = wq(h).view({n, a.q_heads, a.head_dim});
    const auto k = wk(h).view({n, a.kv_heads, a.head_dim});
    const auto v = wv(h).view({n, a.kv_heads, a.head_dim});
    const double scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
    const auto att = plain ? plain_attention(q, k, v, mb, a, scale) : call.attention(q, k, v, a, scale);
    h = h + wo(att.reshape({n, a.q_heads * a.head_dim}));
    if (!call.last_stage()) return h;
    const auto logp = at::log_softmax(head(h), -1);
    auto tg = at::tensor(std::vector<std::int64_t>(mb.targets.begin(), mb.targets.end()),
                         at::TensorOptions().dtype(at::kLong))
                  .clamp_min(0);
    return -logp.gather(1, tg.view({n, 1})).view({n});
  }

  [[nodiscard]] std::int64_t output_size(const model::micro_batch_view& mb, int stage) const {
    return stage + 1 == stages ? mb.size() : mb.size() * shape.width;
  }
};
TORCH_MODULE(Block);

static_assert(libtorch::backbone_module<BlockImpl>);
static_assert(model::check_split_backward_stage<libtorch::backbone<BlockImpl, double>, double>());
static_assert(model::sizes_output_per_stage<libtorch::backbone<BlockImpl, double>>);
static_assert(model::declares_token_mixing<libtorch::backbone<BlockImpl, double>>);

/// A context of one rank: attention over the whole micro-batch with the reference kernel (a ring of one),
/// counting its calls.
template <class T>
struct local_context : model::stage_context<model::communicator_archetype, model::host_activation_store<T>> {
  const model::micro_batch_view* mb = nullptr;
  int* forwards = nullptr;
  int* backwards = nullptr;

  [[nodiscard]] model::attention_block<T> block(const model::attention_shape& s, T scale,
                                                std::span<const T> q, std::span<const T> k,
                                                std::span<const T> v) const {
    return {s,    q, k, v, mb->doc_ids, mb->positions, mb->doc_ids, mb->positions, seq::block_mask::causal,
            scale};
  }
  void attention_forward(const model::attention_shape& s, T scale, std::span<const T> q, std::span<const T> k,
                         std::span<const T> v, std::span<T> out, std::span<T> lse) const {
    if (forwards != nullptr) ++*forwards;
    model::reference_attention{}.forward(block(s, scale, q, k, v), {out, lse});
  }
  void attention_backward(const model::attention_shape& s, T scale, std::span<const T> q,
                          std::span<const T> k, std::span<const T> v, std::span<const T> out,
                          std::span<const T> lse, std::span<const T> dout, std::span<T> dq, std::span<T> dk,
                          std::span<T> dv) const {
    if (backwards != nullptr) ++*backwards;
    std::vector<T> delta(lse.size());
    seq::attention_delta<T>(out, dout, delta, static_cast<std::size_t>(s.head_dim));
    for (auto g : {dq, dk, dv}) std::fill(g.begin(), g.end(), T(0));
    model::reference_attention{}.backward(block(s, scale, q, k, v), {dout, lse, delta, dq, dk, dv});
  }
};
static_assert(model::check_attention_context<local_context<double>, double>());

/// A seeded micro-batch of two documents (lengths 3 and 4), some targets not counting; step_targets
/// counts twice the local targets (as if another rank held as many).
inline model::micro_batch make_batch(std::uint64_t seed, std::int64_t vocab, int index = 0) {
  rng g(seed);
  model::micro_batch mb;
  mb.index = index;
  const std::int64_t lens[] = {3, 4};
  std::int64_t doc = 0;
  for (const auto len : lens) {
    for (std::int64_t p = 0; p < len; ++p) {
      mb.tokens.push_back(static_cast<std::int64_t>(g.uniform(1, vocab - 1)));
      mb.positions.push_back(p);
      mb.doc_ids.push_back(100 + doc);
      mb.stream_index.push_back(static_cast<std::int64_t>(mb.tokens.size()) - 1);
      const bool counts = p + 1 < len && g.uniform(0, 3) != 0;
      mb.targets.push_back(counts ? static_cast<std::int64_t>(g.uniform(0, vocab - 1))
                                  : model::ignore_target);
      mb.loss_weights.push_back(counts ? 1.0 : 0.0);
    }
    ++doc;
  }
  std::int64_t targets = 0;
  for (const double w : mb.loss_weights) targets += static_cast<std::int64_t>(w);
  mb.step_tokens = static_cast<std::int64_t>(mb.tokens.size()) * 2;
  mb.step_targets = targets * 2;
  return mb;
}

/// `n` seeded values in [-1, 1).
inline std::vector<double> seeded(std::uint64_t seed, std::size_t n) {
  rng g(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = static_cast<double>(g.uniform(0, 1 << 20)) / double(1 << 19) - 1.0;
  return v;
}

}  // namespace torchtest
