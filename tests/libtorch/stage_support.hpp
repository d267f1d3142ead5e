// SPDX-License-Identifier: Apache-2.0
// Support of test_libtorch_stage: a small torch::nn block (embedding on the first stage, a residual
// linear + gelu, grouped-query attention through the call or through plain torch ops, a head and a
// per-token cross-entropy on the last stage), a context whose attention runs the reference kernel over
// the whole micro-batch (a ring of one), and a seeded micro-batch.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <hetmesh/core/hash.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/libtorch/libtorch.hpp>
#include <hetmesh/model/context.hpp>
#include <hetmesh/model/encoder_batch.hpp>
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

/// Attention with plain torch ops (the reference the bridge must match): q [n][hq][d], k, v [n][hk][d];
/// token i sees token j when doc[i] == doc[j] and (not causal, or pos[j] <= pos[i]). Returns {out, lse}.
inline std::pair<at::Tensor, at::Tensor> plain_attention(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v,
                                                         std::span<const std::int64_t> doc_ids,
                                                         std::span<const std::int64_t> positions, bool causal,
                                                         const model::attention_shape& s, double scale) {
  const auto n = static_cast<std::int64_t>(doc_ids.size());
  const auto rep = s.q_heads / s.kv_heads;
  const auto kk = k.repeat_interleave(rep, 1), vv = v.repeat_interleave(rep, 1);
  const auto opts = at::TensorOptions().dtype(at::kLong);
  const auto doc = at::tensor(std::vector<std::int64_t>(doc_ids.begin(), doc_ids.end()), opts);
  const auto pos = at::tensor(std::vector<std::int64_t>(positions.begin(), positions.end()), opts);
  auto visible = doc.view({n, 1}).eq(doc.view({1, n}));
  if (causal) visible = visible & pos.view({1, n}).le(pos.view({n, 1}));
  auto scores =
      at::einsum("ihd,jhd->hij", {q.view({n, s.q_heads, s.head_dim}), kk.view({n, s.q_heads, s.head_dim})}) *
      scale;
  scores = scores.masked_fill(visible.logical_not().unsqueeze(0), -std::numeric_limits<double>::infinity());
  auto out = at::einsum("hij,jhd->ihd", {at::softmax(scores, -1), vv.view({n, s.q_heads, s.head_dim})});
  return {out.reshape(q.sizes()), at::logsumexp(scores, -1).t().contiguous()};
}

/// The plain reference's attention over a micro-batch: causal per document, plain torch ops.
inline libtorch::local_attention plain_attention_of(const model::micro_batch_view& mb) {
  return [&mb](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const model::attention_shape& s,
               double scale) { return plain_attention(q, k, v, mb.doc_ids, mb.positions, true, s, scale); };
}

/// Per token of an encoder batch: its piece (as a document id) and its index (as a position).
inline std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> item_tokens(
    const model::encoder_batch_view& ev) {
  std::vector<std::int64_t> doc(static_cast<std::size_t>(ev.size())), pos(doc.size());
  for (std::size_t p = 0; p < ev.pieces.size(); ++p)
    for (std::int64_t t = 0; t < ev.pieces[p].tokens.size(); ++t) {
      const auto at = static_cast<std::size_t>(ev.pieces[p].offset + t);
      doc[at] = static_cast<std::int64_t>(p);
      pos[at] = t;
    }
  return {doc, pos};
}

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

/// The test model: `blocks` blocks spread evenly over `stages` pipeline stages, holding only the stages
/// `local`. Stage 0 embeds the tokens, the encoder rows landed in the micro-batch (its input) replacing their
/// placeholder tokens' embeddings; later stages read
/// the previous stage's [n][width] rows; each block is h += gelu(h W1 + b1), then h += attn(h Wq, h Wk,
/// h Wv) Wo; the last stage returns the per-token cross-entropy of its head. Every parameter's values are a
/// pure function of (seed, tensor id, element), so every split holds the same model. Tensor ids: 0
/// embedding, 1 head, 10 + 10 l + j for block l's j-th tensor; ids() lists them in parameters() order.
struct StackImpl : torch::nn::Module {
  static constexpr model::token_mixing token_mixing = model::through_attention;

  block_shape shape;
  int blocks = 1;
  int stages = 1;
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear head{nullptr};
  std::map<int, std::vector<torch::nn::Linear>> layers;  ///< by block: w1, wq, wk, wv, wo
  std::vector<std::int64_t> ids;

  StackImpl(block_shape s, std::uint64_t seed, int num_blocks, int num_stages, std::vector<int> local,
            at::ScalarType dtype = at::kDouble)
      : shape(s), blocks(num_blocks), stages(num_stages) {
    const auto hq = s.attn.q_heads * s.attn.head_dim, hk = s.attn.kv_heads * s.attn.head_dim;
    auto lin = [](std::int64_t i, std::int64_t o, bool bias) {
      return torch::nn::Linear(torch::nn::LinearOptions(i, o).bias(bias));
    };
    for (const int st : local) {
      if (st == 0)
        add_tensors(0, (emb = register_module("emb", torch::nn::Embedding(s.vocab, s.width))).ptr());
      for (int l = first_block(st); l < first_block(st + 1); ++l) {
        auto& ls = layers[l];
        ls = {lin(s.width, s.width, true), lin(s.width, hq, false), lin(s.width, hk, false),
              lin(s.width, hk, false), lin(hq, s.width, true)};
        for (std::size_t j = 0; j < ls.size(); ++j)
          add_tensors(10 + 10 * l + 2 * static_cast<int>(j),
                      register_module(fmt::format("b{}_{}", l, j), ls[j]));
      }
      if (st + 1 == stages)
        add_tensors(1, (head = register_module("head", lin(s.width, s.vocab, true))).ptr());
    }
    to(dtype);
    const torch::NoGradGuard no_grad;
    const auto params = parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto flat = params[i].view({-1});
      std::vector<double> v(static_cast<std::size_t>(flat.numel()));
      for (std::size_t e = 0; e < v.size(); ++e)
        v[e] =
            static_cast<double>(key_hash({seed, static_cast<std::uint64_t>(ids[i]), e}) >> 11) * 0x1.0p-53 -
            0.5;
      flat.copy_(at::tensor(v));
    }
  }

  bool saw_context = false;  ///< whether a forward found its call's context as a local_context<double>

  [[nodiscard]] int first_block(int stage) const noexcept { return stage * blocks / stages; }

  at::Tensor forward(const at::Tensor& x, const libtorch::stage_call& call) {
    const auto& mb = call.batch();
    const auto n = mb.size();
    const auto& a = shape.attn;
    saw_context = call.context<local_context<double>>() != nullptr;
    at::Tensor h;
    if (call.first_stage()) {
      const auto tok = at::tensor(std::vector<std::int64_t>(mb.tokens.begin(), mb.tokens.end()),
                                  at::TensorOptions().dtype(at::kLong));
      h = emb(tok);
      std::vector<std::int64_t> rows;  // the encoder rows replace their placeholder tokens' embeddings
      for (const auto& l : mb.encoder_outputs)
        for (std::int64_t r = 0; r < l.item_tokens.size(); ++r) rows.push_back(l.local_offset + r);
      const auto nr = static_cast<std::int64_t>(rows.size());
      h = nr > 0 ? h.index_copy(0, at::tensor(rows, at::TensorOptions().dtype(at::kLong)),
                                x.view({nr, shape.width}))
                 : h + x.sum() * 0;  // the (empty) input joins the graph
    } else {
      h = x.view({n, shape.width});
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
    for (int l = first_block(call.stage()); l < first_block(call.stage() + 1); ++l) {
      auto& ls = layers.at(l);
      h = h + torch::gelu(ls[0](h));
      const auto q = ls[1](h).view({n, a.q_heads, a.head_dim});
      const auto k = ls[2](h).view({n, a.kv_heads, a.head_dim});
      const auto v = ls[3](h).view({n, a.kv_heads, a.head_dim});
      const auto att = call.attention(q, k, v, a, scale);
      h = h + ls[4](att.reshape({n, a.q_heads * a.head_dim}));
    }
    if (!call.last_stage()) return h;
    const auto logp = at::log_softmax(head(h), -1);
    const auto tg = at::tensor(std::vector<std::int64_t>(mb.targets.begin(), mb.targets.end()),
                               at::TensorOptions().dtype(at::kLong))
                        .clamp_min(0);
    return -logp.gather(1, tg.view({n, 1})).view({n});
  }

  [[nodiscard]] std::int64_t output_size(const model::micro_batch_view& mb, int stage) const {
    return stage + 1 == stages ? mb.size() : mb.size() * shape.width;
  }

 private:
  /// Records the ids of a registered submodule's parameters (weight id, bias id + 1), in order.
  void add_tensors(int id, const std::shared_ptr<torch::nn::Module>& m) {
    std::int64_t k = 0;
    for (const auto& p : m->parameters()) {
      (void)p;
      ids.push_back(id + k++);
    }
  }
};
TORCH_MODULE(Stack);

/// All stages of a `stages`-stage stack of one block per stage, on one rank.
inline Stack make_stack(std::uint64_t seed, int stages, int blocks = 0, at::ScalarType dtype = at::kDouble) {
  std::vector<int> all(static_cast<std::size_t>(stages));
  for (int i = 0; i < stages; ++i) all[static_cast<std::size_t>(i)] = i;
  return Stack(block_shape{}, seed, blocks > 0 ? blocks : stages, stages, all, dtype);
}

/// A stage adapter over a stack.
using stack_stage = libtorch::backbone<StackImpl, double>;

static_assert(libtorch::check_backbone_module<StackImpl>());
static_assert(model::check_split_backward_stage<libtorch::backbone<StackImpl, float>, float>());
static_assert(model::check_split_backward_stage<stack_stage, double>());
static_assert(model::sizes_output_per_stage<stack_stage>);
static_assert(model::declares_token_mixing<stack_stage>);

/// A context of one encoder rank: full attention inside each piece with the reference kernel.
template <class T>
struct local_encoder_context
    : model::stage_context<model::communicator_archetype, model::host_activation_store<T>> {
  int* backwards = nullptr;

  void attention_forward(const model::encoder_batch_view& ev, const model::attention_shape& s, T scale,
                         std::span<const T> q, std::span<const T> k, std::span<const T> v, std::span<T> out,
                         std::span<T> lse) const {
    const auto [doc, pos] = item_tokens(ev);
    model::reference_attention{}.forward(
        model::attention_block<T>{s, q, k, v, doc, pos, doc, pos, seq::block_mask::full, scale}, {out, lse});
  }
  void attention_backward(const model::encoder_batch_view& ev, const model::attention_shape& s, T scale,
                          std::span<const T> q, std::span<const T> k, std::span<const T> v,
                          std::span<const T> out, std::span<const T> lse, std::span<const T> dout,
                          std::span<T> dq, std::span<T> dk, std::span<T> dv) const {
    if (backwards != nullptr) ++*backwards;
    const auto [doc, pos] = item_tokens(ev);
    std::vector<T> delta(lse.size());
    seq::attention_delta<T>(out, dout, delta, static_cast<std::size_t>(s.head_dim));
    for (auto g : {dq, dk, dv}) std::fill(g.begin(), g.end(), T(0));
    model::reference_attention{}.backward(
        model::attention_block<T>{s, q, k, v, doc, pos, doc, pos, seq::block_mask::full, scale},
        {dout, lse, delta, dq, dk, dv});
  }
};
static_assert(model::check_encoder_attention_context<local_encoder_context<double>, double>());

/// A test encoder: h = x + gelu(x W1 + b1), then h + attn(h Wq, h Wk, h Wv) Wo inside each item.
/// (Its attention_heads: 2; the plain reference passes full attention per item to a standalone_call.)
struct EncImpl : torch::nn::Module {
  static constexpr std::string_view modality = "vision";
  std::int64_t width = 8;
  model::attention_shape attn{2, 2, 4};
  std::vector<torch::nn::Linear> ls;

  explicit EncImpl(std::uint64_t seed) {
    const auto h = attn.q_heads * attn.head_dim;
    const std::pair<std::int64_t, std::int64_t> dims[] = {
        {width, width}, {width, h}, {width, h}, {width, h}, {h, width}};
    for (std::size_t j = 0; j < 5; ++j)
      ls.push_back(register_module(fmt::format("l{}", j), torch::nn::Linear(dims[j].first, dims[j].second)));
    to(at::kDouble);
    const torch::NoGradGuard no_grad;
    std::uint64_t id = 0;
    for (auto& p : parameters()) {
      auto flat = p.view({-1});
      std::vector<double> v(static_cast<std::size_t>(flat.numel()));
      for (std::size_t e = 0; e < v.size(); ++e)
        v[e] = static_cast<double>(key_hash({seed, ++id, e}) >> 11) * 0x1.0p-53 - 0.5;
      flat.copy_(at::tensor(v));
    }
  }
  [[nodiscard]] std::int64_t input_size(const model::encoder_batch_view& ev) const {
    return ev.size() * width;
  }
  [[nodiscard]] std::int64_t output_size(const model::encoder_batch_view& ev) const {
    return ev.size() * width;
  }
  [[nodiscard]] int attention_heads() const { return attn.q_heads; }

  at::Tensor forward(const at::Tensor& x, const libtorch::stage_call& call) {
    const auto& ev = call.encoder_batch();
    const auto n = ev.size();
    auto h = x.view({n, width});
    h = h + torch::gelu(ls[0](h));
    const auto q = ls[1](h).view({n, attn.q_heads, attn.head_dim});
    const auto k = ls[2](h).view({n, attn.kv_heads, attn.head_dim});
    const auto v = ls[3](h).view({n, attn.kv_heads, attn.head_dim});
    const double scale = 1.0 / std::sqrt(static_cast<double>(attn.head_dim));
    const auto att = call.attention(q, k, v, attn, scale);
    return h + ls[4](att.reshape({n, attn.q_heads * attn.head_dim}));
  }
};
TORCH_MODULE(Enc);

static_assert(libtorch::check_encoder_module<EncImpl>());
static_assert(model::check_encoder_stage<libtorch::encoder<EncImpl, double>, double>());
static_assert(model::check_encoder_stage<libtorch::encoder<EncImpl, float>, float>());

/// An encoder batch of two items (3 and 2 tokens).
inline model::encoder_batch make_encoder_batch() {
  model::encoder_batch b;
  b.pieces.push_back({.item = 4, .item_tokens = 3, .tokens = {0, 3}, .offset = 0});
  b.pieces.push_back({.item = 9, .item_tokens = 2, .tokens = {0, 2}, .offset = 3});
  b.tokens = 5;
  return b;
}

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
