// SPDX-License-Identifier: Apache-2.0
// The example's LLM backbone (a hetmesh::model::split_backward_stage model): token embedding where the
// encoders' rows replace the placeholder tokens (stage 0), `blocks` pre-norm transformer blocks spread
// evenly over the pipeline stages (RMSNorm; q/k/v projections with rotary embedding at the per-document
// positions; causal grouped-query attention through the context's ring attention; output projection and
// residual; RMSNorm, SiLU MLP and residual), and a final RMSNorm, head and per-token cross-entropy (last
// stage). One object per rank holds the stages that rank runs; ctx.stage picks the blocks. The backward
// splits into I (input gradients; saves the gradients W needs) and W (weight gradients; releases every
// slot of the micro-batch), for the zero-bubble schedules.
//
// Tensor parallelism (train::model_split::tp > 1; ctx.tp), as Megatron-LM splits a transformer: each
// block's query and key/value heads over tp (q, k, v column-parallel, the output projection row-parallel,
// its output all-reduced: run::reduce_from_tp_forward), the MLP's hidden columns (up column-, down
// row-parallel), and the vocabulary: a vocabulary-parallel embedding and a column-parallel head whose
// logits' shards feed the vocabulary-parallel cross-entropy (run/tp_vocab.hpp). Norm gains and the MoE
// router are replicated; their gradients are whole on every tp rank. With config::moe_experts > 0 the last
// block's MLP is a mixture of experts over ctx.ep (moe_mlp.hpp); its experts are the stage's expert
// parameters. Without tp the stage runs the same code with local arithmetic in place of the collectives.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <map>
#include <optional>
#include <utility>

#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/micro_batch.hpp>
#include <hetmesh/model/stage.hpp>
#include <hetmesh/run/tp_regions.hpp>
#include <hetmesh/run/tp_vocab.hpp>
#include <hetmesh/train/context.hpp>
#include <hetmesh/train/parity.hpp>

#include "mllm_train/layers.hpp"
#include "mllm_train/moe_mlp.hpp"

namespace mllm {

/// Backbone stages of one rank. Tensor ids (global): 0 embedding [vocab][D], 1 final norm gain [D], 2 head
/// [D][vocab], and per block b: 100 + 16b + {0 attention norm gain [D], 1 wq [D][hq], 2 wk [D][hk], 3 wv
/// [D][hk], 4 wo [hq][D], 5 MLP norm gain [D], 6 MLP up [D][hidden], 7 MLP down [hidden][D]}
/// (hq = q_heads * head_dim, hk = kv_heads * head_dim). Models split_backward_stage for a
/// train::step_context (its forward needs an attention context, which needs a communicator: the
/// static_assert is in tests/mllm/model.cpp).
template <class T>
struct backbone {
  /// Opt-in for backbone_stage.
  using is_backbone_stage = void;
  /// Tokens meet only in the context's attention (model/token_mixing.hpp).
  static constexpr hetmesh::model::token_mixing token_mixing = hetmesh::model::through_attention;

  config cfg;
  int stages = 1;   ///< pipeline stages of the whole backbone
  int tp_rank = 0;  ///< this rank's place in ctx.tp: its block of every split tensor
  int tp = 1;       ///< tensor-parallel ranks
  tensor_store<T> store;
  std::map<int, hetmesh::train::tensor_shard> shards;  ///< by tensor id: the block this rank holds
  std::optional<moe_mlp<T>> moe;                       ///< the MoE MLP, when this rank holds its block

  /// The stages `sp.local` of a backbone split into `sp.stages` stages, holding this rank's tensor-parallel
  /// blocks (sp.tp_rank of sp.tp) and experts (sp.ep_rank of sp.ep), with parameters from `seed`: a tensor
  /// has the same values whichever rank or split holds it. Throws invalid_argument on a bad config or
  /// stage, or a tp or ep that does not divide what it splits (naming it). O(parameters).
  backbone(const config& c, std::uint64_t seed, const hetmesh::train::model_split& sp);
  /// The stages `local` of a backbone split into `num_stages` stages, without tensor or expert parallelism.
  backbone(const config& c, std::uint64_t seed, int num_stages, std::span<const int> local)
      : backbone(c, seed, hetmesh::train::model_split{num_stages, {local.begin(), local.end()}, 0, 1, 0, 1}) {
  }
  /// The whole backbone as one stage (single-rank runs, references).
  backbone(const config& c, std::uint64_t seed) : backbone(c, seed, 1, std::vector<int>{0}) {}

  /// Throws invalid_argument, naming the flag, unless tp divides the query and key/value heads, the
  /// vocabulary and the MLP widths, and ep divides the experts. O(1).
  static void check_split(const config& c, int tp, int ep);
  /// Whether block b's MLP is the mixture of experts (the last block, when the config has experts).
  [[nodiscard]] bool is_moe(int b) const noexcept { return cfg.moe_experts > 0 && b == cfg.blocks - 1; }

  /// First block of stage `stage` (blocks spread evenly; stage == stages gives the block count).
  [[nodiscard]] int first_block(int stage) const noexcept { return stage * cfg.blocks / stages; }
  /// First tensor id of block b.
  [[nodiscard]] static constexpr int block_id(int b) noexcept { return 100 + 16 * b; }

  /// Hidden rows between stages; the last stage's output: its per-token loss terms.
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& mb,
                                         int stage) const noexcept {
    return stage == stages - 1 ? mb.size() : mb.size() * cfg.width;
  }
  /// The last stage's output size.
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& mb) const noexcept {
    return output_size(mb, stages - 1);
  }

  /// Stage ctx.stage of micro-batch mb. Stage 0's input: the landings' encoder rows in
  /// mb.encoder_outputs order; other stages': the previous stage's [tokens][D]. Output: [tokens][D], or on
  /// the last stage out[t] = loss_weights[t] * CE(logits[t], targets[t]) / step_targets. Saves in ctx's
  /// slots what I and W need. Collective over the micro-batch's ring (attention), ctx.tp and ctx.ep, in
  /// schedule order. Throws invalid_argument on mis-sized buffers or token ids outside the vocabulary.
  template <hetmesh::train::attention_context<T> Ctx>
  void forward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> in,
               std::span<T> out);

  /// Full backward: backward_input, then backward_weight.
  template <hetmesh::train::attention_context<T> Ctx>
  void backward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> gout,
                std::span<T> gin) {
    backward_input(ctx, mb, gout, gin);
    backward_weight(ctx, mb);
  }

  /// I: writes the input gradient (stage 0: the encoder rows' gradients, in landing order; the last stage
  /// ignores gout) and saves (slots 1000+) the output gradients W needs. Collective over the ring
  /// (attention backward), ctx.tp and ctx.ep, in schedule order.
  template <hetmesh::train::attention_context<T> Ctx>
  void backward_input(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> gout,
                      std::span<T> gin);

  /// W: adds the weight gradients from what forward and I saved; releases every slot of the micro-batch.
  /// Local (no communication).
  template <hetmesh::train::attention_context<T> Ctx>
  void backward_weight(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb);

  /// This rank's dense parameter tensors (every tensor but the experts'), in id order: train::system
  /// reduces their gradients over the pool.
  [[nodiscard]] std::vector<std::span<T>> parameters() { return spans(store.param, false); }
  /// Their gradients, in the same order.
  [[nodiscard]] std::vector<std::span<T>> gradients() { return spans(store.grad, false); }
  /// This rank's experts' parameter tensors, in id order: train::system reduces their gradients over the
  /// ranks holding the same experts (Megatron's expert data-parallel group), not the pool.
  [[nodiscard]] std::vector<std::span<T>> expert_parameters() { return spans(store.param, true); }
  /// Their gradients, in the same order.
  [[nodiscard]] std::vector<std::span<T>> expert_gradients() { return spans(store.grad, true); }
  /// (global id, value, gradient) of this rank's tensors, in id order: what a trainer checkpoints by.
  [[nodiscard]] std::vector<tensor_ref<T>> tensors() { return tensor_refs(store); }
  /// The block of tensor `id` this rank holds (the whole tensor unless tp splits it).
  [[nodiscard]] hetmesh::train::tensor_shard shard_of(int id) const {
    const auto it = shards.find(id);
    return it == shards.end() ? hetmesh::train::tensor_shard{} : it->second;
  }

 private:
  struct dims_t {
    std::size_t n, d, v, f, hq, hk, heads, kv_heads, hd;
  };
  static std::vector<std::span<T>> spans(std::map<int, std::vector<T>>& m, bool experts) {
    std::vector<std::span<T>> out;
    for (auto& [id, v] : m)
      if ((id >= moe_mlp<T>::first_expert_id) == experts) out.emplace_back(v);
    return out;
  }
  /// This rank's sizes: the vocabulary columns, MLP columns and heads it holds (the whole / tp).
  [[nodiscard]] dims_t dims(const hetmesh::model::micro_batch_view& mb) const noexcept {
    const auto z = [this](auto x, bool split = true) { return static_cast<std::size_t>(split ? x / tp : x); };
    return {z(mb.size(), false),
            z(cfg.width, false),
            z(cfg.vocab),
            z(cfg.mlp_hidden),
            z(cfg.attn.q_heads * cfg.attn.head_dim),
            z(cfg.attn.kv_heads * cfg.attn.head_dim),
            z(cfg.attn.q_heads),
            z(cfg.attn.kv_heads),
            z(cfg.attn.head_dim, false)};
  }
  /// The attention shape of this rank's heads.
  [[nodiscard]] hetmesh::model::attention_shape local_attention() const noexcept {
    return {cfg.attn.q_heads / tp, cfg.attn.kv_heads / tp, cfg.attn.head_dim};
  }
  [[nodiscard]] T scale() const {
    return static_cast<T>(1.0 / std::sqrt(static_cast<double>(cfg.attn.head_dim)));
  }
  [[nodiscard]] static bool replaced(const hetmesh::model::micro_batch_view& mb, std::int64_t t) noexcept {
    for (const auto& l : mb.encoder_outputs)
      if (t >= l.local_offset && t < l.local_offset + l.item_tokens.size()) return true;
    return false;
  }
  [[nodiscard]] std::size_t token(const hetmesh::model::micro_batch_view& mb, std::size_t t) const {
    const auto id = mb.tokens[t];
    if (id < 0 || id >= cfg.vocab)
      hetmesh::throw_error<hetmesh::invalid_argument>(
          "mllm::backbone: token id {} outside the vocabulary of {}", id, cfg.vocab);
    return static_cast<std::size_t>(id);
  }
  [[nodiscard]] std::size_t target(const hetmesh::model::micro_batch_view& mb, std::size_t t) const {
    const auto id = mb.targets[t];
    if (id < 0 || id >= cfg.vocab)
      hetmesh::throw_error<hetmesh::invalid_argument>(
          "mllm::backbone: target id {} of a counted token outside the vocabulary of {}", id, cfg.vocab);
    return static_cast<std::size_t>(id);
  }
  /// Stage 0's rows: the token embeddings (vocabulary-parallel under tp: each rank's rows, summed over
  /// ctx.tp), with the landing encoder rows (in landing order) in place.
  template <class Ctx>
  void embed(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> in,
             std::vector<T>& h) const {
    const auto s = dims(mb);
    const auto emb = store.p(0);
    if (ctx.tp != nullptr)
      hetmesh::run::vocab_parallel_embedding_forward(*ctx.tp, cfg.vocab, cfg.width, false, mb.tokens, emb,
                                                     std::span<T>(h), mem_);
    else
      for (std::size_t t = 0; t < s.n; ++t)
        for (std::size_t e = 0; e < s.d; ++e) h[t * s.d + e] = emb[token(mb, t) * s.d + e];
    std::size_t rows = 0;
    for (const auto& l : mb.encoder_outputs) rows += static_cast<std::size_t>(l.item_tokens.size());
    check_size(in.size(), rows * s.d, "mllm::backbone", "stage 0 input (encoder rows)");
    std::size_t at = 0;
    for (const auto& l : mb.encoder_outputs)
      for (std::int64_t row = 0; row < l.item_tokens.size(); ++row, ++at)
        for (std::size_t e = 0; e < s.d; ++e)
          h[static_cast<std::size_t>(l.local_offset + row) * s.d + e] = in[at * s.d + e];
  }
  /// The embedding's gradient from stage 0's input gradient dx (the encoder rows' go to the encoders).
  template <class Ctx>
  void embedding_grad(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> dx) {
    const auto s = dims(mb);
    if (ctx.tp != nullptr) {  // each rank adds the rows of the tokens its vocabulary shard holds
      std::vector<T> rows(dx.begin(), dx.end());
      for (std::size_t t = 0; t < s.n; ++t)
        if (replaced(mb, static_cast<std::int64_t>(t)))
          std::fill_n(rows.begin() + static_cast<std::ptrdiff_t>(t * s.d), s.d, T(0));
      hetmesh::run::vocab_parallel_embedding_backward(*ctx.tp, cfg.vocab, cfg.width, false, mb.tokens,
                                                      std::span<const T>(rows), store.g(0), mem_);
      return;
    }
    auto ge = store.g(0);
    for (std::size_t t = 0; t < s.n; ++t) {
      if (replaced(mb, static_cast<std::int64_t>(t))) continue;
      const auto tok = token(mb, t);
      for (std::size_t e = 0; e < s.d; ++e) ge[tok * s.d + e] += dx[t * s.d + e];
    }
  }
  /// dlogits [n][V / tp] = the loss's gradient with respect to this rank's logits.
  template <class Ctx>
  void loss_backward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::vector<T>& dlogits) {
    const auto s = dims(mb);
    const auto slot = ctx.slots();
    if (s.n == 0) return;  // an empty slot: no loss terms
    if (ctx.tp != nullptr) {
      const auto it = losses_.find({ctx.stage, ctx.micro_batch});
      hetmesh::run::vocab_parallel_cross_entropy_backward(*ctx.tp, cfg.vocab, slot.load(903), it->second,
                                                          std::span<T>(dlogits));
      losses_.erase(it);
      slot.release(903);
      return;
    }
    const auto xnf = slot.load(902);
    std::vector<T> p(s.v);
    for (std::size_t t = 0; t < s.n; ++t) {
      if (mb.loss_weights[t] == 0.0) continue;
      const auto tg = target(mb, t);
      softmax(xnf.subspan(t * s.d, s.d), p, tg);
      const T c = static_cast<T>(mb.loss_weights[t]) / static_cast<T>(mb.step_targets);
      for (std::size_t j = 0; j < s.v; ++j) dlogits[t * s.v + j] = c * p[j];
      dlogits[t * s.v + tg] -= c;
    }
  }
  /// p = softmax(xn_row head); returns log p[target]. O(D vocab).
  T softmax(std::span<const T> xn_row, std::vector<T>& p, std::size_t tg) const {
    matmul<T>(xn_row, store.p(2), p, 1, static_cast<std::size_t>(cfg.width),
              static_cast<std::size_t>(cfg.vocab));
    T m = p[0];
    for (auto z : p) m = z > m ? z : m;
    const T logit = p[tg];
    T sum = 0;
    for (auto& z : p) sum += (z = std::exp(z - m));
    for (auto& z : p) z /= sum;
    const T log_target = logit - m - std::log(sum);
    return log_target;
  }

  hetmesh::model::host_memory mem_{};
  /// Per (stage, micro-batch) under tp: what the vocabulary-parallel cross-entropy keeps for its backward.
  std::map<std::pair<int, int>, hetmesh::run::vocab_cross_entropy_state<T, hetmesh::model::host_memory>>
      losses_;
};

template <class T>
backbone<T>::backbone(const config& c, std::uint64_t seed, const hetmesh::train::model_split& sp)
    : cfg(c), stages(sp.stages), tp_rank(sp.tp_rank), tp(sp.tp) {
  check_config(c);
  check_split(c, sp.tp, sp.ep);
  const auto d = static_cast<std::int64_t>(c.width), v = static_cast<std::int64_t>(c.vocab),
             f = static_cast<std::int64_t>(c.mlp_hidden);
  const auto hq = static_cast<std::int64_t>(c.attn.q_heads * c.attn.head_dim),
             hk = static_cast<std::int64_t>(c.attn.kv_heads * c.attn.head_dim);
  auto inv = [](std::int64_t fan_in) { return 1.0 / std::sqrt(static_cast<double>(fan_in)); };
  // Tensor `id`, rows x cols, whole (axis -1) or this rank's tp block along `axis`.
  auto add = [&](int id, std::int64_t rows, std::int64_t cols, int axis, double scale, double offset = 0.0) {
    const hetmesh::train::tensor_shard sh = axis < 0 || tp == 1
                                                ? hetmesh::train::tensor_shard{}
                                                : hetmesh::train::tensor_shard{rows, cols, axis, tp_rank, tp};
    store.add_block(
        id, static_cast<std::size_t>(rows * cols / sh.parts), seed, scale, offset,
        [&](std::size_t i) { return static_cast<std::size_t>(sh.global(static_cast<std::int64_t>(i))); });
    shards[id] = sh;
  };
  for (int st : sp.local) {
    if (st < 0 || st >= stages)
      hetmesh::throw_error<hetmesh::invalid_argument>("mllm::backbone: stage {} of {}", st, stages);
    if (st == 0) add(0, v, d, 0, 1.0);  // vocabulary-parallel rows
    if (st == stages - 1) {
      add(1, d, 1, -1, 0.1, 1.0);
      add(2, d, v, 1, inv(d));  // vocabulary-parallel columns
    }
    for (int b = first_block(st); b < first_block(st + 1); ++b) {
      const int id = block_id(b);
      add(id + 0, d, 1, -1, 0.1, 1.0);
      add(id + 1, d, hq, 1, inv(d));
      add(id + 2, d, hk, 1, inv(d));
      add(id + 3, d, hk, 1, inv(d));
      add(id + 4, hq, d, 0, inv(hq));
      add(id + 5, d, 1, -1, 0.1, 1.0);
      if (is_moe(b)) {
        moe.emplace(c, id + 6, sp.tp_rank, sp.tp, sp.ep_rank, sp.ep);
        moe->add_tensors(store, seed);
        const auto mh = static_cast<std::int64_t>(c.moe_hidden);
        const auto [first, count] = moe->local_experts();
        for (auto e = first; e < first + count && tp > 1; ++e) {
          shards[moe_mlp<T>::expert_id(e)] = {d, mh, 1, tp_rank, tp};
          shards[moe_mlp<T>::expert_id(e) + 1] = {mh, d, 0, tp_rank, tp};
        }
        continue;
      }
      add(id + 6, d, f, 1, inv(d));
      add(id + 7, f, d, 0, inv(f));
    }
  }
}

template <class T>
void backbone<T>::check_split(const config& c, int tp, int ep) {
  const std::pair<const char*, std::int64_t> by_tp[] = {{"query heads", c.attn.q_heads},
                                                        {"key/value heads", c.attn.kv_heads},
                                                        {"vocabulary", c.vocab},
                                                        {"MLP hidden width", c.mlp_hidden},
                                                        {"expert hidden width", c.moe_hidden}};
  for (const auto& [what, n] : by_tp)
    if (tp < 1 || n % tp != 0)
      hetmesh::throw_error<hetmesh::invalid_argument>("--tp {} does not divide the model's {} {}", tp, n,
                                                      what);
  if (ep < 1 || (c.moe_experts > 0 ? c.moe_experts : 1) % ep != 0)
    hetmesh::throw_error<hetmesh::invalid_argument>(
        "--ep {} does not divide the model's {} experts{}", ep, c.moe_experts,
        c.moe_experts == 0 ? " (no MoE layer: expected --ep 1)" : "");
}

template <class T>
template <hetmesh::train::attention_context<T> Ctx>
void backbone<T>::forward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> in,
                          std::span<T> out) {
  const auto s = dims(mb);
  const auto slot = ctx.slots();
  std::vector<T> h(s.n * s.d);
  if (ctx.stage == 0) {
    embed(ctx, mb, in, h);
  } else {
    check_size(in.size(), s.n * s.d, "mllm::backbone", "stage input");
    std::copy(in.begin(), in.end(), h.begin());
  }
  std::vector<T> xn(s.n * s.d), r(s.n), q(s.n * s.hq), k(s.n * s.hk), v(s.n * s.hk), a(s.n * s.hq),
      lse(s.n * s.heads), y(s.n * s.d), u(s.n * s.f), act(s.n * s.f);
  for (int b = first_block(ctx.stage); b < first_block(ctx.stage + 1); ++b) {
    const int id = block_id(b), sb = 20 * (b - first_block(ctx.stage));
    slot.save(sb + 0, std::span<const T>(h));
    rmsnorm_forward<T>(h, store.p(id), xn, r, s.n, s.d, cfg.norm_eps);
    slot.save(sb + 1, std::span<const T>(r));
    slot.save(sb + 2, std::span<const T>(xn));
    matmul<T>(xn, store.p(id + 1), q, s.n, s.d, s.hq);  // column-parallel: this rank's heads
    matmul<T>(xn, store.p(id + 2), k, s.n, s.d, s.hk);
    matmul<T>(xn, store.p(id + 3), v, s.n, s.d, s.hk);
    rope<T>(q, mb.positions, s.n, s.heads, s.hd, cfg.rope_base, 1);
    rope<T>(k, mb.positions, s.n, s.kv_heads, s.hd, cfg.rope_base, 1);
    ctx.attention_forward(local_attention(), scale(), q, k, v, a, lse);
    for (int i = 0; auto* t : {&q, &k, &v, &a, &lse}) slot.save(sb + 3 + i++, std::span<const T>(*t));
    matmul<T>(a, store.p(id + 4), y, s.n, s.hq, s.d);  // row-parallel: partial sums over tp
    if (ctx.tp != nullptr) hetmesh::run::reduce_from_tp_forward(*ctx.tp, std::span<T>(y));
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += y[i];
    slot.save(sb + 8, std::span<const T>(h));
    rmsnorm_forward<T>(h, store.p(id + 5), xn, r, s.n, s.d, cfg.norm_eps);
    slot.save(sb + 9, std::span<const T>(r));
    slot.save(sb + 10, std::span<const T>(xn));
    if (is_moe(b)) {
      moe->forward(ctx, store, xn, y);
    } else {
      matmul<T>(xn, store.p(id + 6), u, s.n, s.d, s.f);
      slot.save(sb + 11, std::span<const T>(u));
      silu_forward<T>(u, act);
      matmul<T>(act, store.p(id + 7), y, s.n, s.f, s.d);
      if (ctx.tp != nullptr) hetmesh::run::reduce_from_tp_forward(*ctx.tp, std::span<T>(y));
    }
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += y[i];
  }
  if (ctx.stage + 1 < stages) {
    check_size(out.size(), s.n * s.d, "mllm::backbone", "stage output");
    std::copy(h.begin(), h.end(), out.begin());
    return;
  }
  check_size(out.size(), s.n, "mllm::backbone", "loss output");
  rmsnorm_forward<T>(h, store.p(1), xn, r, s.n, s.d, cfg.norm_eps);
  slot.save(900, std::span<const T>(h));
  slot.save(901, std::span<const T>(r));
  slot.save(902, std::span<const T>(xn));
  if (s.n == 0) return;     // an empty slot (called under ep > 1 so that the experts' exchanges meet)
  if (ctx.tp != nullptr) {  // the head's vocabulary columns, then the vocabulary-parallel cross-entropy
    std::vector<T> logits(s.n * s.v);
    matmul<T>(xn, store.p(2), logits, s.n, s.d, s.v);
    auto& st = losses_[{ctx.stage, ctx.micro_batch}];
    hetmesh::run::vocab_parallel_cross_entropy_forward(*ctx.tp, cfg.vocab, std::span<const T>(logits),
                                                       mb.targets, mb.loss_weights, mb.step_targets, out, st,
                                                       mem_);
    slot.save(903, std::span<const T>(logits));
    return;
  }
  std::vector<T> p(s.v);
  for (std::size_t t = 0; t < s.n; ++t) {
    out[t] = T(0);
    if (mb.loss_weights[t] == 0.0) continue;
    const T lp = softmax(std::span<const T>(xn).subspan(t * s.d, s.d), p, target(mb, t));
    out[t] = -static_cast<T>(mb.loss_weights[t]) * lp / static_cast<T>(mb.step_targets);
  }
}

template <class T>
template <hetmesh::train::attention_context<T> Ctx>
void backbone<T>::backward_input(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb,
                                 std::span<const T> gout, std::span<T> gin) {
  const auto s = dims(mb);
  const auto slot = ctx.slots();
  std::vector<T> dh(s.n * s.d, T(0));
  if (ctx.stage + 1 == stages) {
    std::vector<T> dlogits(s.n * s.v, T(0)), dxn(s.n * s.d, T(0));
    loss_backward(ctx, mb, dlogits);
    add_dy_wt<T>(dlogits, store.p(2), dxn, s.n, s.d, s.v);
    if (ctx.tp != nullptr) hetmesh::run::copy_to_tp_backward(*ctx.tp, std::span<T>(dxn));
    rmsnorm_input_grad<T>(slot.load(900), store.p(1), slot.load(901), dxn, dh, s.n, s.d);
    slot.save(1900, std::span<const T>(dlogits));
    slot.save(1901, std::span<const T>(dxn));
  } else {
    check_size(gout.size(), s.n * s.d, "mllm::backbone", "output gradient");
    std::copy(gout.begin(), gout.end(), dh.begin());
  }
  std::vector<T> dact(s.n * s.f), du(s.n * s.f), dxn(s.n * s.d), da(s.n * s.hq), dq(s.n * s.hq),
      dk(s.n * s.hk), dv(s.n * s.hk);
  for (int b = first_block(ctx.stage + 1) - 1; b >= first_block(ctx.stage); --b) {
    const int id = block_id(b), sb = 20 * (b - first_block(ctx.stage)), ib = 1000 + sb;
    // MLP: dh is the gradient of the block's output (and of h1, through the residual).
    std::fill(dxn.begin(), dxn.end(), T(0));
    if (is_moe(b)) {
      moe->backward_input(ctx, store, dh, dxn);
    } else {
      slot.save(ib + 0, std::span<const T>(dh));
      std::fill(dact.begin(), dact.end(), T(0));
      add_dy_wt<T>(dh, store.p(id + 7), dact, s.n, s.f, s.d);
      silu_backward<T>(slot.load(sb + 11), dact, du);
      slot.save(ib + 1, std::span<const T>(du));
      add_dy_wt<T>(du, store.p(id + 6), dxn, s.n, s.d, s.f);
      if (ctx.tp != nullptr) hetmesh::run::copy_to_tp_backward(*ctx.tp, std::span<T>(dxn));
    }
    slot.save(ib + 2, std::span<const T>(dxn));
    rmsnorm_input_grad<T>(slot.load(sb + 8), store.p(id + 5), slot.load(sb + 9), dxn, dh, s.n, s.d);
    // Attention: dh is now the gradient of h1 (and of the block's input, through the residual).
    slot.save(ib + 3, std::span<const T>(dh));
    std::fill(da.begin(), da.end(), T(0));
    add_dy_wt<T>(dh, store.p(id + 4), da, s.n, s.hq, s.d);
    ctx.attention_backward(local_attention(), scale(), slot.load(sb + 3), slot.load(sb + 4),
                           slot.load(sb + 5), slot.load(sb + 6), slot.load(sb + 7), da, dq, dk, dv);
    rope<T>(dq, mb.positions, s.n, s.heads, s.hd, cfg.rope_base, -1);
    rope<T>(dk, mb.positions, s.n, s.kv_heads, s.hd, cfg.rope_base, -1);
    slot.save(ib + 4, std::span<const T>(dq));
    slot.save(ib + 5, std::span<const T>(dk));
    slot.save(ib + 6, std::span<const T>(dv));
    std::fill(dxn.begin(), dxn.end(), T(0));
    add_dy_wt<T>(dq, store.p(id + 1), dxn, s.n, s.d, s.hq);
    add_dy_wt<T>(dk, store.p(id + 2), dxn, s.n, s.d, s.hk);
    add_dy_wt<T>(dv, store.p(id + 3), dxn, s.n, s.d, s.hk);
    if (ctx.tp != nullptr) hetmesh::run::copy_to_tp_backward(*ctx.tp, std::span<T>(dxn));
    slot.save(ib + 7, std::span<const T>(dxn));
    rmsnorm_input_grad<T>(slot.load(sb + 0), store.p(id), slot.load(sb + 1), dxn, dh, s.n, s.d);
  }
  if (ctx.stage == 0) {  // encoder rows' gradients go back to the encoders; the rest stays for W
    std::size_t rows = 0;
    for (const auto& l : mb.encoder_outputs) rows += static_cast<std::size_t>(l.item_tokens.size());
    check_size(gin.size(), rows * s.d, "mllm::backbone", "input gradient (encoder rows)");
    std::size_t at = 0;
    for (const auto& l : mb.encoder_outputs)
      for (std::int64_t row = 0; row < l.item_tokens.size(); ++row, ++at)
        for (std::size_t e = 0; e < s.d; ++e)
          gin[at * s.d + e] = dh[static_cast<std::size_t>(l.local_offset + row) * s.d + e];
    slot.save(2999, std::span<const T>(dh));
  } else {
    check_size(gin.size(), s.n * s.d, "mllm::backbone", "input gradient");
    std::copy(dh.begin(), dh.end(), gin.begin());
  }
}

template <class T>
template <hetmesh::train::attention_context<T> Ctx>
void backbone<T>::backward_weight(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb) {
  const auto s = dims(mb);
  const auto slot = ctx.slots();
  if (ctx.stage + 1 == stages) {
    add_xt_dy<T>(slot.load(902), slot.load(1900), store.g(2), s.n, s.d, s.v);
    rmsnorm_gain_grad<T>(slot.load(900), slot.load(901), slot.load(1901), store.g(1), s.n, s.d);
    for (int i : {900, 901, 902, 1900, 1901}) slot.release(i);
  }
  std::vector<T> act(s.n * s.f);
  for (int b = first_block(ctx.stage); b < first_block(ctx.stage + 1); ++b) {
    const int id = block_id(b), sb = 20 * (b - first_block(ctx.stage)), ib = 1000 + sb;
    if (is_moe(b)) {
      moe->backward_weight(ctx, store);
    } else {
      silu_forward<T>(slot.load(sb + 11), act);
      add_xt_dy<T>(act, slot.load(ib + 0), store.g(id + 7), s.n, s.f, s.d);
      add_xt_dy<T>(slot.load(sb + 10), slot.load(ib + 1), store.g(id + 6), s.n, s.d, s.f);
      for (int i : {sb + 11, ib + 0, ib + 1}) slot.release(i);
    }
    rmsnorm_gain_grad<T>(slot.load(sb + 8), slot.load(sb + 9), slot.load(ib + 2), store.g(id + 5), s.n, s.d);
    add_xt_dy<T>(slot.load(sb + 6), slot.load(ib + 3), store.g(id + 4), s.n, s.hq, s.d);
    add_xt_dy<T>(slot.load(sb + 2), slot.load(ib + 4), store.g(id + 1), s.n, s.d, s.hq);
    add_xt_dy<T>(slot.load(sb + 2), slot.load(ib + 5), store.g(id + 2), s.n, s.d, s.hk);
    add_xt_dy<T>(slot.load(sb + 2), slot.load(ib + 6), store.g(id + 3), s.n, s.d, s.hk);
    rmsnorm_gain_grad<T>(slot.load(sb + 0), slot.load(sb + 1), slot.load(ib + 7), store.g(id), s.n, s.d);
    for (int i = 0; i < 11; ++i) slot.release(sb + i);
    for (int i = 2; i < 8; ++i) slot.release(ib + i);
  }
  if (ctx.stage == 0) {
    embedding_grad(ctx, mb, slot.load(2999));
    slot.release(2999);
  }
}

}  // namespace mllm
