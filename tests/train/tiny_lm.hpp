// SPDX-License-Identifier: Apache-2.0
// A small language model written as a user would write it against train::system: token embedding, one
// attention layer (q/k/v projections, grouped-query attention through the context's attention entry, an
// output projection with a residual), an output projection to the vocabulary and a per-token
// cross-entropy loss scaled by the loss weights over the step's target count. Parameters and gradients
// are spans; what forward saves for backward goes to the context's activation slots.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/hash.hpp>
#include <hetmesh/model/attention.hpp>
#include <hetmesh/model/micro_batch.hpp>
#include <hetmesh/train/context.hpp>
#include <hetmesh/train/parity.hpp>

namespace traintest {

using namespace hetmesh;

/// The initial value of element `element` of tensor `id` (of the whole tensor: a split model passes the
/// full tensor's element), a pure function of (seed, id, element) in [-0.5, 0.5): every split of a model
/// holds the same values.
template <class T>
T initial_value(std::uint64_t seed, std::int64_t id, std::int64_t element) {
  return static_cast<T>(
      static_cast<double>(
          key_hash({seed, static_cast<std::uint64_t>(id), static_cast<std::uint64_t>(element)}) >> 11) *
          0x1.0p-53 -
      0.5);
}

/// y[n][m] = x[n][k] w[k][m] (row-major).
template <class T>
void matmul(std::span<const T> x, std::span<const T> w, std::span<T> y, std::size_t n, std::size_t k,
            std::size_t m) {
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      T s = 0;
      for (std::size_t e = 0; e < k; ++e) s += x[i * k + e] * w[e * m + j];
      y[i * m + j] = s;
    }
}
/// dw[k][m] += x[n][k]^T dy[n][m].
template <class T>
void add_xt_dy(std::span<const T> x, std::span<const T> dy, std::span<T> dw, std::size_t n, std::size_t k,
               std::size_t m) {
  for (std::size_t e = 0; e < k; ++e)
    for (std::size_t j = 0; j < m; ++j) {
      T s = 0;
      for (std::size_t i = 0; i < n; ++i) s += x[i * k + e] * dy[i * m + j];
      dw[e * m + j] += s;
    }
}
/// dx[n][k] += dy[n][m] w[k][m]^T.
template <class T>
void add_dy_wt(std::span<const T> dy, std::span<const T> w, std::span<T> dx, std::size_t n, std::size_t k,
               std::size_t m) {
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t e = 0; e < k; ++e) {
      T s = 0;
      for (std::size_t j = 0; j < m; ++j) s += dy[i * m + j] * w[e * m + j];
      dx[i * k + e] += s;
    }
}

/// The model's sizes.
struct lm_shape {
  std::int64_t vocab = 13;
  std::int64_t width = 8;
  model::attention_shape attn{2, 1, 4};  // GQA: two query heads share one KV head
};

/// Buffer sizes of a micro-batch of `mb.size()` tokens under `s`: tokens, width, vocabulary, query and
/// key/value row widths, query heads.
struct lm_dims {
  std::size_t n, w, v, hq, hk, heads;
};
[[nodiscard]] inline lm_dims dims_of(const lm_shape& s, const model::micro_batch_view& mb) noexcept {
  return {static_cast<std::size_t>(mb.size()),
          static_cast<std::size_t>(s.width),
          static_cast<std::size_t>(s.vocab),
          static_cast<std::size_t>(s.attn.q_heads * s.attn.head_dim),
          static_cast<std::size_t>(s.attn.kv_heads * s.attn.head_dim),
          static_cast<std::size_t>(s.attn.q_heads)};
}

template <class T>
struct tiny_lm {
  using is_backbone_stage = void;
  /// Tokens meet only in the context's attention (model/token_mixing.hpp).
  static constexpr hetmesh::model::token_mixing token_mixing = hetmesh::model::through_attention;

  lm_shape shape;
  std::vector<T> emb, wq, wk, wv, wo, wout;        // parameters
  std::vector<T> gemb, gwq, gwk, gwv, gwo, gwout;  // gradients

  /// Parameters are pure functions of (seed, tensor, index) in [-0.5, 0.5): every rank builds the same model.
  explicit tiny_lm(lm_shape s, std::uint64_t seed) : shape(s) {
    const auto hq = static_cast<std::size_t>(s.attn.q_heads * s.attn.head_dim);
    const auto hk = static_cast<std::size_t>(s.attn.kv_heads * s.attn.head_dim);
    const auto w = static_cast<std::size_t>(s.width), v = static_cast<std::size_t>(s.vocab);
    std::uint64_t tensor = 0;
    for (auto [p, n] : {std::pair{&emb, v * w},
                        {&wq, w * hq},
                        {&wk, w * hk},
                        {&wv, w * hk},
                        {&wo, hq * w},
                        {&wout, w * v}}) {
      ++tensor;
      p->resize(n);
      for (std::size_t i = 0; i < n; ++i)
        (*p)[i] = static_cast<T>(static_cast<double>(key_hash({seed, tensor, i}) >> 11) * 0x1.0p-53 - 0.5);
    }
    for (auto [g, p] :
         {std::pair{&gemb, &emb}, {&gwq, &wq}, {&gwk, &wk}, {&gwv, &wv}, {&gwo, &wo}, {&gwout, &wout}})
      g->assign(p->size(), T(0));
  }

  /// One loss term per local token.
  [[nodiscard]] std::int64_t output_size(const model::micro_batch_view& mb) const noexcept {
    return mb.size();
  }

  /// out[t] = weight[t] * CE(logits[t], target[t]) / step_targets. Saves x, q, k, v, a, lse, h.
  template <train::attention_context<T> Ctx>
  void forward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T>, std::span<T> out) {
    const auto d = dims(mb);
    std::vector<T> x(d.n * d.w), q(d.n * d.hq), k(d.n * d.hk), v(d.n * d.hk), a(d.n * d.hq),
        lse(d.n * d.heads), h(d.n * d.w);
    for (std::size_t t = 0; t < d.n; ++t)
      for (std::size_t e = 0; e < d.w; ++e) x[t * d.w + e] = emb[token(mb, t) * d.w + e];
    matmul<T>(x, wq, q, d.n, d.w, d.hq);
    matmul<T>(x, wk, k, d.n, d.w, d.hk);
    matmul<T>(x, wv, v, d.n, d.w, d.hk);
    ctx.attention_forward(shape.attn, scale(), q, k, v, a, lse);
    matmul<T>(a, wo, h, d.n, d.hq, d.w);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += x[i];
    std::vector<T> p(d.v);
    for (std::size_t t = 0; t < d.n; ++t) {
      out[t] = 0;
      if (mb.loss_weights[t] == 0.0) continue;
      softmax(std::span<const T>(h).subspan(t * d.w, d.w), p);
      const auto target = static_cast<std::size_t>(mb.targets[t]);
      out[t] = -static_cast<T>(mb.loss_weights[t]) * std::log(p[target]) / static_cast<T>(mb.step_targets);
    }
    const auto slot = ctx.slots();
    slot.save(0, std::span<const T>(x));
    slot.save(1, std::span<const T>(q));
    slot.save(2, std::span<const T>(k));
    slot.save(3, std::span<const T>(v));
    slot.save(4, std::span<const T>(a));
    slot.save(5, std::span<const T>(lse));
    slot.save(6, std::span<const T>(h));
  }

  /// The gradient of sum(out) with respect to every parameter, added into the gradients.
  template <train::attention_context<T> Ctx>
  void backward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T>, std::span<T>) {
    const auto d = dims(mb);
    const auto slot = ctx.slots();
    const std::span<const T> x = slot.load(0), q = slot.load(1), k = slot.load(2), v = slot.load(3),
                             a = slot.load(4), lse = slot.load(5), h = slot.load(6);
    std::vector<T> dlogits(d.n * d.v, T(0)), p(d.v);
    for (std::size_t t = 0; t < d.n; ++t) {
      if (mb.loss_weights[t] == 0.0) continue;
      softmax(h.subspan(t * d.w, d.w), p);
      const T c = static_cast<T>(mb.loss_weights[t]) / static_cast<T>(mb.step_targets);
      for (std::size_t j = 0; j < d.v; ++j) dlogits[t * d.v + j] = c * p[j];
      dlogits[t * d.v + static_cast<std::size_t>(mb.targets[t])] -= c;
    }
    add_xt_dy<T>(h, dlogits, gwout, d.n, d.w, d.v);
    std::vector<T> dh(d.n * d.w, T(0));
    add_dy_wt<T>(dlogits, wout, dh, d.n, d.w, d.v);
    add_xt_dy<T>(a, dh, gwo, d.n, d.hq, d.w);
    std::vector<T> da(d.n * d.hq, T(0)), dq(d.n * d.hq), dk(d.n * d.hk), dv(d.n * d.hk);
    add_dy_wt<T>(dh, wo, da, d.n, d.hq, d.w);
    ctx.attention_backward(shape.attn, scale(), q, k, v, a, lse, da, dq, dk, dv);
    add_xt_dy<T>(x, dq, gwq, d.n, d.w, d.hq);
    add_xt_dy<T>(x, dk, gwk, d.n, d.w, d.hk);
    add_xt_dy<T>(x, dv, gwv, d.n, d.w, d.hk);
    std::vector<T> dx = dh;  // the residual
    add_dy_wt<T>(dq, wq, dx, d.n, d.w, d.hq);
    add_dy_wt<T>(dk, wk, dx, d.n, d.w, d.hk);
    add_dy_wt<T>(dv, wv, dx, d.n, d.w, d.hk);
    for (std::size_t t = 0; t < d.n; ++t)
      for (std::size_t e = 0; e < d.w; ++e) gemb[token(mb, t) * d.w + e] += dx[t * d.w + e];
    for (int i = 0; i < 7; ++i) slot.release(i);
  }

  [[nodiscard]] std::vector<std::span<T>> parameters() { return {emb, wq, wk, wv, wo, wout}; }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return {gemb, gwq, gwk, gwv, gwo, gwout}; }
  /// (id, value, gradient) of every tensor, ids 0 (embedding) to 5 (output projection): a
  /// train::parity_model, so train::check_parity compares it with a 1-rank run.
  [[nodiscard]] std::vector<train::model_tensor<T>> tensors() {
    std::vector<train::model_tensor<T>> out;
    const auto p = parameters();
    const auto g = gradients();
    for (std::size_t i = 0; i < p.size(); ++i) out.push_back({static_cast<std::int64_t>(i), p[i], g[i]});
    return out;
  }

 private:
  [[nodiscard]] lm_dims dims(const model::micro_batch_view& mb) const noexcept { return dims_of(shape, mb); }
  [[nodiscard]] T scale() const {
    return static_cast<T>(1.0 / std::sqrt(static_cast<double>(shape.attn.head_dim)));
  }
  [[nodiscard]] std::size_t token(const model::micro_batch_view& mb, std::size_t t) const {
    const auto id = mb.tokens[t];
    if (id < 0 || id >= shape.vocab)
      throw_error<invalid_argument>("tiny_lm: token id {} outside the vocabulary of {}", id, shape.vocab);
    return static_cast<std::size_t>(id);
  }
  /// p = softmax(h wout) for one token (shifted by the row's maximum).
  void softmax(std::span<const T> hrow, std::vector<T>& p) const {
    const auto w = static_cast<std::size_t>(shape.width), v = static_cast<std::size_t>(shape.vocab);
    matmul<T>(hrow, wout, p, 1, w, v);
    T m = p[0];
    for (auto z : p) m = z > m ? z : m;
    T s = 0;
    for (auto& z : p) s += (z = std::exp(z - m));
    for (auto& z : p) z /= s;
  }
};

}  // namespace traintest
