// SPDX-License-Identifier: Apache-2.0
// The GPU example's LLM backbone: the CPU example's backbone (examples/mllm_train/backbone.hpp: token
// embedding with the encoders' rows at their landings, pre-norm transformer blocks with rotary positions
// and grouped-query attention through the context's ring attention, final norm, head and per-token
// cross-entropy) with its buffers in a hetmesh memory policy's memory and its layers on math<T> kernels.
// train::system hands it device memory on a GPU (its step_context's activation slots, inputs and outputs
// are device spans) and host memory on the CPU; the stage copies the micro-batch's index arrays (tokens,
// positions, targets, landings) into that memory itself. Same tensor ids, same parameters (uploaded from
// the CPU backbone) and same math as the CPU stage: the two agree up to the order of floating-point sums.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <hetmesh/core/error.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/micro_batch.hpp>
#include <hetmesh/model/stage.hpp>

#include "mllm_train/backbone.hpp"
#include "mllm_train_gpu/math.hpp"
#include "mllm_train_gpu/tensors.hpp"

namespace mllm_gpu {

/// Backbone stages of one rank in M's memory (a hetmesh::model::backbone_stage; full backward only, so
/// the schedules that split the backward are not for it).
template <class T, hetmesh::model::memory_policy M>
class backbone {
 public:
  /// Opt-in for backbone_stage.
  using is_backbone_stage = void;
  /// Tokens meet only in the context's attention (model/token_mixing.hpp).
  static constexpr hetmesh::model::token_mixing token_mixing = hetmesh::model::through_attention;

  /// The stages `host` holds, on `k`'s backend with buffers of `mem` (same memory: a cuda math with
  /// cuda::device_memory on one stream, or host with host_memory). `k` outlives the stage.
  backbone(const mllm::backbone<T>& host, const M& mem, const math<T>& k)
      : cfg_(host.cfg), stages_(host.stages), mem_(mem), k_(&k), w_(host.store, mem, k) {}

  /// Hidden rows between stages; the last stage's output: its per-token loss terms.
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& mb,
                                         int stage) const noexcept {
    return stage == stages_ - 1 ? mb.size() : mb.size() * cfg_.width;
  }
  /// The last stage's output size.
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& mb) const noexcept {
    return output_size(mb, stages_ - 1);
  }

  /// Stage ctx.stage of micro-batch mb, as mllm::backbone::forward (the same slots' contents).
  template <class Ctx>
  void forward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> in,
               std::span<T> out) {
    const auto s = dims(mb);
    const auto slot = ctx.slots();
    ws_.reset(), idx_.reset();
    auto h = ws_.take(s.n * s.d);
    if (ctx.stage == 0) {
      embed(mb, in, h);
    } else {
      mllm::check_size(in.size(), s.n * s.d, "mllm_gpu::backbone", "stage input");
      k_->copy(h.data(), in.data(), I(h.size()));
    }
    const auto pos = idx_.upload(mb.positions, mem_);
    auto xn = ws_.take(s.n * s.d), r = ws_.take(s.n), q = ws_.take(s.n * s.hq), kk = ws_.take(s.n * s.hk),
         v = ws_.take(s.n * s.hk), a = ws_.take(s.n * s.hq), lse = ws_.take(s.n * s.heads),
         y = ws_.take(s.n * s.d), u = ws_.take(s.n * s.f), act = ws_.take(s.n * s.f);
    const auto save = [&](int id, std::span<T> x) { slot.save(id, std::span<const T>(x)); };
    for (int b = first_block(ctx.stage); b < first_block(ctx.stage + 1); ++b) {
      const int id = mllm::backbone<T>::block_id(b), sb = 20 * (b - first_block(ctx.stage));
      save(sb + 0, h);
      k_->rmsnorm_forward(h.data(), w_.p(id), xn.data(), r.data(), I(s.n), I(s.d), cfg_.norm_eps);
      save(sb + 1, r);
      save(sb + 2, xn);
      k_->matmul(xn.data(), w_.p(id + 1), q.data(), I(s.n), I(s.d), I(s.hq));
      k_->matmul(xn.data(), w_.p(id + 2), kk.data(), I(s.n), I(s.d), I(s.hk));
      k_->matmul(xn.data(), w_.p(id + 3), v.data(), I(s.n), I(s.d), I(s.hk));
      k_->rope(q.data(), pos.data(), I(s.n), I(s.heads), I(s.hd), cfg_.rope_base, 1);
      k_->rope(kk.data(), pos.data(), I(s.n), I(s.kv_heads), I(s.hd), cfg_.rope_base, 1);
      ctx.attention_forward(cfg_.attn, scale(), std::span<const T>(q), std::span<const T>(kk),
                            std::span<const T>(v), a, lse);
      for (int i = 0; auto t : {q, kk, v, a, lse}) save(sb + 3 + i++, t);
      k_->matmul(a.data(), w_.p(id + 4), y.data(), I(s.n), I(s.hq), I(s.d));
      k_->add(h.data(), y.data(), I(h.size()));
      save(sb + 8, h);
      k_->rmsnorm_forward(h.data(), w_.p(id + 5), xn.data(), r.data(), I(s.n), I(s.d), cfg_.norm_eps);
      save(sb + 9, r);
      save(sb + 10, xn);
      k_->matmul(xn.data(), w_.p(id + 6), u.data(), I(s.n), I(s.d), I(s.f));
      save(sb + 11, u);
      k_->silu_forward(u.data(), act.data(), I(u.size()));
      k_->matmul(act.data(), w_.p(id + 7), y.data(), I(s.n), I(s.f), I(s.d));
      k_->add(h.data(), y.data(), I(h.size()));
    }
    if (ctx.stage + 1 < stages_) {
      mllm::check_size(out.size(), s.n * s.d, "mllm_gpu::backbone", "stage output");
      k_->copy(out.data(), h.data(), I(h.size()));
      return;
    }
    mllm::check_size(out.size(), s.n, "mllm_gpu::backbone", "loss output");
    k_->rmsnorm_forward(h.data(), w_.p(1), xn.data(), r.data(), I(s.n), I(s.d), cfg_.norm_eps);
    auto dlogits = ws_.take(s.n * s.v);
    loss(mb, xn, out, dlogits);
    save(900, h);
    save(901, r);
    save(902, xn);
  }

  /// Input gradient and every weight gradient of stage ctx.stage (mllm::backbone's backward_input then
  /// backward_weight); releases the micro-batch's slots. Stage 0's gin: the encoder rows' gradients in
  /// landing order; the last stage ignores gout.
  template <class Ctx>
  void backward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> gout,
                std::span<T> gin) {
    const auto s = dims(mb);
    const auto slot = ctx.slots();
    ws_.reset(), idx_.reset();
    auto dh = ws_.zeros(s.n * s.d, *k_);
    auto dxn = ws_.take(s.n * s.d);
    if (ctx.stage + 1 == stages_) {
      const auto xnf = slot.load(902);
      auto lt = ws_.take(s.n), dlogits = ws_.take(s.n * s.v);
      loss(mb, xnf, lt, dlogits);
      k_->fill(dxn.data(), T(0), I(dxn.size()));
      k_->add_dy_wt(dlogits.data(), w_.p(2), dxn.data(), I(s.n), I(s.d), I(s.v));
      k_->add_xt_dy(xnf.data(), dlogits.data(), w_.g(2), I(s.n), I(s.d), I(s.v));
      const auto hf = slot.load(900), rf = slot.load(901);
      k_->rmsnorm_input_grad(hf.data(), w_.p(1), rf.data(), dxn.data(), dh.data(), I(s.n), I(s.d));
      k_->rmsnorm_gain_grad(hf.data(), rf.data(), dxn.data(), w_.g(1), I(s.n), I(s.d));
      for (int i : {900, 901, 902}) slot.release(i);
    } else {
      mllm::check_size(gout.size(), s.n * s.d, "mllm_gpu::backbone", "output gradient");
      k_->copy(dh.data(), gout.data(), I(dh.size()));
    }
    const auto pos = idx_.upload(mb.positions, mem_);
    auto act = ws_.take(s.n * s.f), dact = ws_.take(s.n * s.f), du = ws_.take(s.n * s.f),
         da = ws_.take(s.n * s.hq), dq = ws_.take(s.n * s.hq), dk = ws_.take(s.n * s.hk),
         dv = ws_.take(s.n * s.hk);
    for (int b = first_block(ctx.stage + 1) - 1; b >= first_block(ctx.stage); --b) {
      const int id = mllm::backbone<T>::block_id(b), sb = 20 * (b - first_block(ctx.stage));
      const auto ld = [&](int i) { return slot.load(sb + i).data(); };
      // MLP: dh is the gradient of the block's output (and of h1, through the residual).
      k_->fill(dact.data(), T(0), I(dact.size()));
      k_->add_dy_wt(dh.data(), w_.p(id + 7), dact.data(), I(s.n), I(s.f), I(s.d));
      k_->silu_forward(ld(11), act.data(), I(act.size()));
      k_->add_xt_dy(act.data(), dh.data(), w_.g(id + 7), I(s.n), I(s.f), I(s.d));
      k_->silu_backward(ld(11), dact.data(), du.data(), I(du.size()));
      k_->fill(dxn.data(), T(0), I(dxn.size()));
      k_->add_dy_wt(du.data(), w_.p(id + 6), dxn.data(), I(s.n), I(s.d), I(s.f));
      k_->add_xt_dy(ld(10), du.data(), w_.g(id + 6), I(s.n), I(s.d), I(s.f));
      k_->rmsnorm_gain_grad(ld(8), ld(9), dxn.data(), w_.g(id + 5), I(s.n), I(s.d));
      k_->rmsnorm_input_grad(ld(8), w_.p(id + 5), ld(9), dxn.data(), dh.data(), I(s.n), I(s.d));
      // Attention: dh is now the gradient of h1 (and of the block's input, through the residual).
      k_->fill(da.data(), T(0), I(da.size()));
      k_->add_dy_wt(dh.data(), w_.p(id + 4), da.data(), I(s.n), I(s.hq), I(s.d));
      k_->add_xt_dy(ld(6), dh.data(), w_.g(id + 4), I(s.n), I(s.hq), I(s.d));
      ctx.attention_backward(cfg_.attn, scale(), slot.load(sb + 3), slot.load(sb + 4), slot.load(sb + 5),
                             slot.load(sb + 6), slot.load(sb + 7), std::span<const T>(da), dq, dk, dv);
      k_->rope(dq.data(), pos.data(), I(s.n), I(s.heads), I(s.hd), cfg_.rope_base, -1);
      k_->rope(dk.data(), pos.data(), I(s.n), I(s.kv_heads), I(s.hd), cfg_.rope_base, -1);
      k_->fill(dxn.data(), T(0), I(dxn.size()));
      const std::span<T> grads[3] = {dq, dk, dv};
      const std::size_t widths[3] = {s.hq, s.hk, s.hk};
      for (int m = 0; m < 3; ++m) {
        k_->add_dy_wt(grads[m].data(), w_.p(id + 1 + m), dxn.data(), I(s.n), I(s.d), I(widths[m]));
        k_->add_xt_dy(ld(2), grads[m].data(), w_.g(id + 1 + m), I(s.n), I(s.d), I(widths[m]));
      }
      k_->rmsnorm_gain_grad(ld(0), ld(1), dxn.data(), w_.g(id), I(s.n), I(s.d));
      k_->rmsnorm_input_grad(ld(0), w_.p(id), ld(1), dxn.data(), dh.data(), I(s.n), I(s.d));
      for (int i = 0; i < 12; ++i) slot.release(sb + i);
    }
    if (ctx.stage != 0) {
      mllm::check_size(gin.size(), s.n * s.d, "mllm_gpu::backbone", "input gradient");
      k_->copy(gin.data(), dh.data(), I(dh.size()));
      return;
    }
    // Stage 0: the encoder rows' gradients go back to the encoders, the text rows' to the embedding.
    const auto land = landings(mb);
    mllm::check_size(gin.size(), land.size() * s.d, "mllm_gpu::backbone", "input gradient (encoder rows)");
    k_->gather_rows(dh.data(), idx_.upload(land, mem_).data(), gin.data(), I(land.size()), I(s.d));
    k_->embed_grad(idx_.upload(text_tokens(mb), mem_).data(), dh.data(), w_.g(0), I(s.n), I(s.d), I(s.v));
  }

  /// This rank's parameter tensors, in id order (M's memory).
  [[nodiscard]] std::vector<std::span<T>> parameters() { return w_.parameters(); }
  /// Their gradients, in the same order.
  [[nodiscard]] std::vector<std::span<T>> gradients() { return w_.gradients(); }
  /// (global id, value, gradient) of this rank's tensors, in id order (M's memory).
  [[nodiscard]] std::vector<mllm::tensor_ref<T>> tensors() { return w_.refs(); }

 private:
  struct dims_t {
    std::size_t n, d, v, f, hq, hk, heads, kv_heads, hd;
  };
  static std::int64_t I(std::size_t x) noexcept { return static_cast<std::int64_t>(x); }
  [[nodiscard]] dims_t dims(const hetmesh::model::micro_batch_view& mb) const noexcept {
    const auto z = [](auto x) { return static_cast<std::size_t>(x); };
    const auto& a = cfg_.attn;
    return {z(mb.size()),
            z(cfg_.width),
            z(cfg_.vocab),
            z(cfg_.mlp_hidden),
            z(a.q_heads * a.head_dim),
            z(a.kv_heads * a.head_dim),
            z(a.q_heads),
            z(a.kv_heads),
            z(a.head_dim)};
  }
  [[nodiscard]] int first_block(int stage) const noexcept { return stage * cfg_.blocks / stages_; }
  [[nodiscard]] T scale() const {
    return static_cast<T>(1.0 / std::sqrt(static_cast<double>(cfg_.attn.head_dim)));
  }

  /// Local rows the encoders' outputs land on, in landing order.
  static std::vector<std::int64_t> landings(const hetmesh::model::micro_batch_view& mb) {
    std::vector<std::int64_t> rows;
    for (const auto& l : mb.encoder_outputs)
      for (std::int64_t r = 0; r < l.item_tokens.size(); ++r) rows.push_back(l.local_offset + r);
    return rows;
  }
  /// Token ids with -1 on the rows an encoder output replaces (checked against the vocabulary).
  std::vector<std::int64_t> text_tokens(const hetmesh::model::micro_batch_view& mb) const {
    std::vector<std::int64_t> tok(mb.tokens.begin(), mb.tokens.end());
    for (const auto id : tok)
      if (id < 0 || id >= cfg_.vocab)
        hetmesh::throw_error<hetmesh::invalid_argument>(
            "mllm_gpu::backbone: token id {} outside the vocabulary of {}", id, cfg_.vocab);
    for (const auto r : landings(mb)) tok[static_cast<std::size_t>(r)] = -1;
    return tok;
  }
  /// Stage 0's rows: the token embeddings, the landing encoder rows (in landing order) in place.
  void embed(const hetmesh::model::micro_batch_view& mb, std::span<const T> in, std::span<T> h) {
    const auto land = landings(mb);
    mllm::check_size(in.size(), land.size() * static_cast<std::size_t>(cfg_.width), "mllm_gpu::backbone",
                     "stage 0 input (encoder rows)");
    k_->embed(idx_.upload(text_tokens(mb), mem_).data(), w_.p(0), h.data(), mb.size(), cfg_.width);
    k_->scatter_rows(in.data(), idx_.upload(land, mem_).data(), h.data(), I(land.size()), cfg_.width);
  }
  /// Per-token loss terms out[t] = w_t CE_t / step_targets and their logits' gradient, from the final
  /// norm's rows xn.
  void loss(const hetmesh::model::micro_batch_view& mb, std::span<const T> xn, std::span<T> out,
            std::span<T> dlogits) {
    const auto s = dims(mb);
    std::vector<std::int64_t> targets(s.n, 0);
    std::vector<T> weights(s.n);
    for (std::size_t t = 0; t < s.n; ++t) {
      weights[t] = static_cast<T>(mb.loss_weights[t]);
      if (mb.loss_weights[t] == 0.0) continue;
      if (mb.targets[t] < 0 || mb.targets[t] >= cfg_.vocab)
        hetmesh::throw_error<hetmesh::invalid_argument>(
            "mllm_gpu::backbone: target id {} of a counted token outside the vocabulary of {}", mb.targets[t],
            cfg_.vocab);
      targets[t] = mb.targets[t];
    }
    auto logits = ws_.take(s.n * s.v);
    k_->matmul(xn.data(), w_.p(2), logits.data(), I(s.n), I(s.d), I(s.v));
    const auto w = ws_.upload(std::span<const T>(weights), mem_);
    k_->cross_entropy(logits.data(), idx_.upload(targets, mem_).data(), w.data(),
                      T(1) / static_cast<T>(mb.step_targets), out.data(), dlogits.data(), I(s.n), I(s.v));
  }

  mllm::config cfg_;
  int stages_ = 1;
  M mem_;
  const math<T>* k_;
  tensor_set<T, M> w_;
  workspace<T, M> ws_;
  workspace<std::int64_t, M> idx_;
};

static_assert(hetmesh::model::check_backbone_stage<backbone<float, hetmesh::model::host_memory>, float>());

}  // namespace mllm_gpu
