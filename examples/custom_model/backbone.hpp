// SPDX-License-Identifier: Apache-2.0
// example_custom_model's backbone, a hetmesh::model::backbone_stage that is not a transformer: stage 0
// embeds the tokens (the video encoder's rows replace the clips' placeholder tokens), then `blocks` blocks,
// each a causal depthwise convolution over the kHalo tokens before each token (x + tanh(sum_j c_j * x[t-j]),
// a local token mixer) and an attention sublayer (x + attn(x) Wo), spread over the pipeline stages; the
// last stage's head gives a per-token cross-entropy. The convolution reads earlier tokens of the same
// document through the context's halo exchange (ctx.halo, ctx.halo_forward, ctx.halo_backward): under a
// sequence split (CP pieces, HDP rings, Ulysses slices) those tokens may sit on another rank. The stage
// declares it (model::causal_halo(kHalo)), which is what lets train::system run it under a split.
// `halo_off` is the mutation the parity check must catch: the halo rows stay zero.
// docs/tutorial.md quotes this file (example_custom_model.tutorial checks the quotes).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <hetmesh/core/error.hpp>
#include <hetmesh/model/micro_batch.hpp>
#include <hetmesh/model/stage.hpp>
#include <hetmesh/model/token_mixing.hpp>
#include <hetmesh/seq/halo.hpp>

#include "custom_model/layers.hpp"

namespace custom {

/// Tokens before each token the convolution reads.
inline constexpr int kHalo = 3;

template <class T>
struct conv_backbone {
  /// Opt-in for model::backbone_stage.
  using is_backbone_stage = void;
  /// How the stage mixes tokens: the convolution reads the kHalo tokens before each token (ctx.halo), and
  /// its attention goes through ctx.attention_forward. A stage of attention only would declare
  /// model::through_attention; an MLP, model::token_local.
  static constexpr hetmesh::model::token_mixing token_mixing = hetmesh::model::causal_halo(kHalo);

  shape s;
  int stages = 1;         ///< pipeline stages of the whole model
  bool halo_off = false;  ///< the mutation: skip the halo exchange (halo rows stay zero)
  tensor_store<T> store;  ///< ids 0 embedding, 1 head, 10 + 8l + {0 taps, 1 q, 2 k, 3 v, 4 out} of block l

  /// The stages `local` of a `num_stages`-stage backbone (sys.local_stages() of sys.num_stages(), known
  /// before any plan), parameters from `seed`: only the tensors of those stages.
  conv_backbone(const shape& sh, std::uint64_t seed, int num_stages, std::span<const int> local)
      : s(sh), stages(num_stages) {
    const auto w = static_cast<std::size_t>(sh.width), v = static_cast<std::size_t>(sh.vocab);
    const auto hq = static_cast<std::size_t>(sh.attn.q_heads * sh.attn.head_dim);
    const auto hk = static_cast<std::size_t>(sh.attn.kv_heads * sh.attn.head_dim);
    const double sw = 1.0 / std::sqrt(static_cast<double>(w));
    for (int st : local) {
      if (st == 0) store.add(0, v * w, seed, 0.5);
      if (st == stages - 1) store.add(1, w * v, seed, sw);
      for (int l = first_block(st); l < first_block(st + 1); ++l) {
        store.add(10 + 8 * l, (kHalo + 1) * w, seed, 0.5);
        store.add(11 + 8 * l, w * hq, seed, sw);
        store.add(12 + 8 * l, w * hk, seed, sw);
        store.add(13 + 8 * l, w * hk, seed, sw);
        store.add(14 + 8 * l, hq * w, seed, 1.0 / std::sqrt(static_cast<double>(hq)));
      }
    }
  }

  /// The first block of pipeline stage `stage` (blocks spread evenly over the stages).
  [[nodiscard]] int first_block(int stage) const noexcept { return stage * s.blocks / stages; }

  /// Rows of `width` between stages; the last stage's output is one loss term per token.
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& mb,
                                         int stage) const noexcept {
    return stage == stages - 1 ? mb.size() : mb.size() * s.width;
  }
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& mb) const noexcept {
    return output_size(mb, stages - 1);
  }

  template <class Ctx>
  void forward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> in,
               std::span<T> out) {
    const auto n = static_cast<std::size_t>(mb.size()), w = static_cast<std::size_t>(s.width);
    std::vector<T> x(n * w);
    if (ctx.stage == 0)
      embed(mb, in, x);
    else
      x.assign(in.begin(), in.end());
    for (int l = first_block(ctx.stage); l < first_block(ctx.stage + 1); ++l) {
      const int base = 16 * (l - first_block(ctx.stage));
      conv_forward(ctx, mb, l, base, x);
      attention_forward(ctx, mb, l, base, x);
    }
    if (ctx.stage + 1 < stages) {
      check(out.size(), n * w, "stage output");
      std::copy(x.begin(), x.end(), out.begin());
      return;
    }
    check(out.size(), n, "loss output");
    std::vector<T> p(static_cast<std::size_t>(s.vocab));
    for (std::size_t t = 0; t < n; ++t) {
      out[t] = 0;
      if (mb.loss_weights[t] == 0.0) continue;
      softmax(std::span<const T>(x).subspan(t * w, w), p);
      out[t] = -static_cast<T>(mb.loss_weights[t]) * std::log(p[static_cast<std::size_t>(mb.targets[t])]) /
               static_cast<T>(mb.step_targets);
    }
    ctx.slots().save(999, std::span<const T>(x));
  }

  template <class Ctx>
  void backward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> gout,
                std::span<T> gin) {
    const auto n = static_cast<std::size_t>(mb.size()), w = static_cast<std::size_t>(s.width),
               v = static_cast<std::size_t>(s.vocab);
    const auto slot = ctx.slots();
    std::vector<T> dx(n * w, T(0));
    if (ctx.stage + 1 == stages) {  // the head and the loss
      const auto h = slot.load(999);
      std::vector<T> dlogits(n * v, T(0)), p(v);
      for (std::size_t t = 0; t < n; ++t) {
        if (mb.loss_weights[t] == 0.0) continue;
        softmax(h.subspan(t * w, w), p);
        const T c = static_cast<T>(mb.loss_weights[t]) / static_cast<T>(mb.step_targets);
        for (std::size_t j = 0; j < v; ++j) dlogits[t * v + j] = c * p[j];
        dlogits[t * v + static_cast<std::size_t>(mb.targets[t])] -= c;
      }
      add_xt_dy<T>(h, dlogits, store.g(1), n, w, v);
      add_dy_wt<T>(dlogits, store.p(1), dx, n, w, v);
      slot.release(999);
    } else {
      check(gout.size(), n * w, "output gradient");
      dx.assign(gout.begin(), gout.end());
    }
    for (int l = first_block(ctx.stage + 1) - 1; l >= first_block(ctx.stage); --l) {
      const int base = 16 * (l - first_block(ctx.stage));
      attention_backward(ctx, mb, l, base, dx);
      conv_backward(ctx, mb, l, base, dx);
    }
    if (ctx.stage == 0)
      embed_backward(mb, dx, gin);
    else
      std::copy(dx.begin(), dx.end(), gin.begin());
  }

  [[nodiscard]] std::vector<std::span<T>> parameters() { return store.parameters(); }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return store.gradients(); }
  /// (global id, value, gradient) of every tensor this rank holds.
  [[nodiscard]] std::vector<hetmesh::train::model_tensor<T>> tensors() { return store.tensors(); }

 private:
  /// x += tanh(z), z[t] = sum_{j=0..kHalo} c_j * x[t - j] over the earlier tokens of t's document: a local
  /// row, a row the halo exchange brought from the rank holding it, or zero before the document's start.
  template <class Ctx>
  void conv_forward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, int l, int base,
                    std::vector<T>& x) {
    const auto n = static_cast<std::size_t>(mb.size()), w = static_cast<std::size_t>(s.width);
    const hetmesh::seq::halo_plan plan = ctx.halo(kHalo);  // where each token's earlier tokens are
    std::vector<T> halo(static_cast<std::size_t>(plan.halo_rows) * w, T(0)), z(n * w, T(0));
    if (!halo_off) ctx.halo_forward(plan, s.width, std::span<const T>(x), std::span<T>(halo));
    const auto c = store.p(10 + 8 * l);
    for (std::size_t t = 0; t < n; ++t)
      for (int j = 0; j <= kHalo; ++j)
        if (const T* row = source(plan, x.data(), halo.data(), t, j))
          for (std::size_t e = 0; e < w; ++e) z[t * w + e] += c[static_cast<std::size_t>(j) * w + e] * row[e];
    const auto slot = ctx.slots();
    slot.save(base + 0, std::span<const T>(x));
    slot.save(base + 1, std::span<const T>(halo));
    slot.save(base + 2, std::span<const T>(z));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += std::tanh(z[i]);
  }

  /// Backward of conv_forward: dx holds the gradient of its output and becomes that of its input. The
  /// gradients of the halo rows go back to the ranks that hold those tokens (ctx.halo_backward).
  template <class Ctx>
  void conv_backward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, int l, int base,
                     std::vector<T>& dx) {
    const auto n = static_cast<std::size_t>(mb.size()), w = static_cast<std::size_t>(s.width);
    const auto slot = ctx.slots();
    const auto x = slot.load(base + 0), halo = slot.load(base + 1), z = slot.load(base + 2);
    const auto plan = ctx.halo(kHalo);
    std::vector<T> dz(n * w), dhalo(halo.size(), T(0)), din = dx;  // din: the residual's share
    for (std::size_t i = 0; i < dz.size(); ++i) dz[i] = dx[i] * (T(1) - std::tanh(z[i]) * std::tanh(z[i]));
    const auto c = store.p(10 + 8 * l);
    const auto gc = store.g(10 + 8 * l);
    using where = hetmesh::seq::halo_source::kind;
    for (std::size_t t = 0; t < n; ++t)
      for (int j = 0; j <= kHalo; ++j) {
        const auto src = j == 0 ? hetmesh::seq::halo_source{where::local, static_cast<std::int64_t>(t)}
                                : plan.source(static_cast<std::int64_t>(t), j);
        if (src.where == where::zero) continue;
        const auto at = static_cast<std::size_t>(src.index) * w;
        const bool local = src.where == where::local;
        const T* row = (local ? x.data() : halo.data()) + at;
        T* drow = (local ? din.data() : dhalo.data()) + at;
        for (std::size_t e = 0; e < w; ++e) {
          gc[static_cast<std::size_t>(j) * w + e] += dz[t * w + e] * row[e];
          drow[e] += dz[t * w + e] * c[static_cast<std::size_t>(j) * w + e];
        }
      }
    if (!halo_off) ctx.halo_backward(plan, s.width, std::span<const T>(dhalo), std::span<T>(din));
    dx = std::move(din);
    for (int i = 0; i < 3; ++i) slot.release(base + i);
  }

  /// The row tap j of local token t reads (tap 0: the token itself), or null for a zero (before its
  /// document's start): plan.source(t, j) says where the token j positions earlier is.
  [[nodiscard]] const T* source(const hetmesh::seq::halo_plan& plan, const T* x, const T* halo, std::size_t t,
                                int j) const {
    const auto w = static_cast<std::size_t>(s.width);
    if (j == 0) return x + t * w;
    const auto src = plan.source(static_cast<std::int64_t>(t), j);
    using where = hetmesh::seq::halo_source::kind;
    if (src.where == where::zero) return nullptr;
    return (src.where == where::local ? x : halo) + static_cast<std::size_t>(src.index) * w;
  }

  /// x += attn(x Wq, x Wk, x Wv) Wo: causal attention over the document, through the context (ring
  /// attention over a CP or HDP ring, Ulysses over its group). Saves x, q, k, v, a, lse at base + 3..8.
  template <class Ctx>
  void attention_forward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, int l, int base,
                         std::vector<T>& x) {
    const auto d = dims(mb);
    std::vector<T> q(d.n * d.hq), k(d.n * d.hk), v(d.n * d.hk), a(d.n * d.hq), lse(d.n * d.heads),
        y(d.n * d.w);
    matmul<T>(x, store.p(11 + 8 * l), q, d.n, d.w, d.hq);
    matmul<T>(x, store.p(12 + 8 * l), k, d.n, d.w, d.hk);
    matmul<T>(x, store.p(13 + 8 * l), v, d.n, d.w, d.hk);
    ctx.attention_forward(s.attn, scale(), std::span<const T>(q), std::span<const T>(k),
                          std::span<const T>(v), std::span<T>(a), std::span<T>(lse));
    matmul<T>(a, store.p(14 + 8 * l), y, d.n, d.hq, d.w);
    const auto slot = ctx.slots();
    int id = base + 3;
    for (const auto* saved : {&x, &q, &k, &v, &a, &lse}) slot.save(id++, std::span<const T>(*saved));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }

  template <class Ctx>
  void attention_backward(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, int l, int base,
                          std::vector<T>& dx) {
    const auto d = dims(mb);
    const auto slot = ctx.slots();
    const auto x = slot.load(base + 3), q = slot.load(base + 4), k = slot.load(base + 5),
               v = slot.load(base + 6), a = slot.load(base + 7), lse = slot.load(base + 8);
    std::vector<T> da(d.n * d.hq, T(0)), dq(d.n * d.hq), dk(d.n * d.hk), dv(d.n * d.hk);
    add_xt_dy<T>(a, dx, store.g(14 + 8 * l), d.n, d.hq, d.w);
    add_dy_wt<T>(dx, store.p(14 + 8 * l), da, d.n, d.hq, d.w);
    ctx.attention_backward(s.attn, scale(), q, k, v, a, lse, std::span<const T>(da), std::span<T>(dq),
                           std::span<T>(dk), std::span<T>(dv));
    add_xt_dy<T>(x, dq, store.g(11 + 8 * l), d.n, d.w, d.hq);
    add_xt_dy<T>(x, dk, store.g(12 + 8 * l), d.n, d.w, d.hk);
    add_xt_dy<T>(x, dv, store.g(13 + 8 * l), d.n, d.w, d.hk);
    add_dy_wt<T>(dq, store.p(11 + 8 * l), dx, d.n, d.w, d.hq);  // dx keeps the residual's share
    add_dy_wt<T>(dk, store.p(12 + 8 * l), dx, d.n, d.w, d.hk);
    add_dy_wt<T>(dv, store.p(13 + 8 * l), dx, d.n, d.w, d.hk);
    for (int i = 3; i <= 8; ++i) slot.release(base + i);
  }

  /// Stage 0's rows: each token's embedding, except where an encoder's rows land (mb.encoder_outputs, in
  /// the order of `in`): there the video encoder's rows replace the placeholder tokens.
  void embed(const hetmesh::model::micro_batch_view& mb, std::span<const T> in, std::vector<T>& x) const {
    const auto w = static_cast<std::size_t>(s.width);
    for (std::size_t t = 0; t < static_cast<std::size_t>(mb.size()); ++t)
      std::copy_n(store.p(0).begin() + static_cast<std::ptrdiff_t>(token(mb, t) * w), w, x.begin() + t * w);
    std::size_t at = 0;
    for (const auto& landing : mb.encoder_outputs)
      for (std::int64_t r = 0; r < landing.item_tokens.size(); ++r, ++at)
        std::copy_n(in.begin() + static_cast<std::ptrdiff_t>(at * w), w,
                    x.begin() + static_cast<std::ptrdiff_t>(landing.local_offset + r) * w);
    check(in.size(), at * w, "stage 0 input (encoder rows)");
  }
  /// Backward of embed: the landed rows' gradients go back to the encoder (gin, in landing order), the
  /// others into the embedding's gradient.
  void embed_backward(const hetmesh::model::micro_batch_view& mb, const std::vector<T>& dx,
                      std::span<T> gin) {
    const auto w = static_cast<std::size_t>(s.width);
    std::vector<char> landed(static_cast<std::size_t>(mb.size()), 0);
    std::size_t at = 0;
    for (const auto& landing : mb.encoder_outputs)
      for (std::int64_t r = 0; r < landing.item_tokens.size(); ++r, ++at) {
        const auto t = static_cast<std::size_t>(landing.local_offset + r);
        landed[t] = 1;
        std::copy_n(dx.begin() + static_cast<std::ptrdiff_t>(t * w), w,
                    gin.begin() + static_cast<std::ptrdiff_t>(at * w));
      }
    check(gin.size(), at * w, "stage 0 input gradient");
    auto ge = store.g(0);
    for (std::size_t t = 0; t < landed.size(); ++t)
      if (landed[t] == 0)
        for (std::size_t e = 0; e < w; ++e) ge[token(mb, t) * w + e] += dx[t * w + e];
  }

  struct dims_t {
    std::size_t n, w, hq, hk, heads;
  };
  [[nodiscard]] dims_t dims(const hetmesh::model::micro_batch_view& mb) const noexcept {
    return {static_cast<std::size_t>(mb.size()), static_cast<std::size_t>(s.width),
            static_cast<std::size_t>(s.attn.q_heads * s.attn.head_dim),
            static_cast<std::size_t>(s.attn.kv_heads * s.attn.head_dim),
            static_cast<std::size_t>(s.attn.q_heads)};
  }
  [[nodiscard]] T scale() const {
    return T(1) / static_cast<T>(std::sqrt(static_cast<double>(s.attn.head_dim)));
  }
  [[nodiscard]] std::size_t token(const hetmesh::model::micro_batch_view& mb, std::size_t t) const {
    const auto id = mb.tokens[t];
    if (id < 0 || id >= s.vocab)
      hetmesh::throw_error<hetmesh::invalid_argument>(
          "conv_backbone: token id {} outside the vocabulary of {}", id, s.vocab);
    return static_cast<std::size_t>(id);
  }
  /// p = softmax(h Wout) for one token.
  void softmax(std::span<const T> h, std::vector<T>& p) const {
    matmul<T>(h, store.p(1), p, 1, static_cast<std::size_t>(s.width), static_cast<std::size_t>(s.vocab));
    const T m = *std::max_element(p.begin(), p.end());
    T sum = 0;
    for (auto& z : p) sum += (z = std::exp(z - m));
    for (auto& z : p) z /= sum;
  }
  static void check(std::size_t got, std::size_t expected, const char* what) {
    if (got != expected)
      hetmesh::throw_error<hetmesh::invalid_argument>("conv_backbone: {} has {} elements; expected {}", what,
                                                      got, expected);
  }
};

static_assert(hetmesh::model::check_backbone_stage<conv_backbone<float>, float>());

}  // namespace custom
