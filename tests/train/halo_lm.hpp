// SPDX-License-Identifier: Apache-2.0
// A small language model whose only token mixer is a causal depthwise convolution, written against
// train::system's halo exchange: embedding (stage 0), `layers` convolution blocks x + tanh(sum_j c_j *
// x[t-j]) over the K tokens before each token (read through ctx.halo: the earlier tokens of the same
// document, whichever rank holds them, zeros before its start) spread over the pipeline stages, and an output
// head with per-token cross-entropy (last stage). `Declared` = false drops the token_mixing declaration (what
// train::system must refuse under a sequence split); `halo_off` leaves the halo rows at zero instead of
// exchanging them (the mutation a parity check must catch under a split).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <type_traits>
#include <vector>

#include <hetmesh/model/token_mixing.hpp>

#include "train/tiny_lm.hpp"

namespace traintest {

/// The halo the convolution reads: 3 tokens before each token.
inline constexpr int kConvHalo = 3;

/// Declares the convolution's halo.
struct declares_conv_halo {
  /// Reads the kConvHalo tokens before each token through ctx.halo.
  static constexpr hetmesh::model::token_mixing token_mixing = hetmesh::model::causal_halo(kConvHalo);
};
/// Declares nothing (a stage a user forgot to declare).
struct declares_nothing {};

template <class T, bool Declared = true>
struct halo_lm : std::conditional_t<Declared, declares_conv_halo, declares_nothing> {
  using is_backbone_stage = void;

  lm_shape shape;
  int layers = 2;                             ///< convolution blocks of the whole model
  int stages = 1;                             ///< pipeline stages of the whole model
  bool halo_off = false;                      ///< the mutation: never exchange halo rows
  std::map<int, std::vector<T>> param, grad;  ///< by global tensor id, this rank's stages' only

  /// Tensor ids: 0 embedding, 1 head, 10 + layer: the layer's taps [K + 1][width].
  halo_lm(lm_shape s, std::uint64_t seed, int num_layers, int num_stages, std::span<const int> local)
      : shape(s), layers(num_layers), stages(num_stages) {
    const auto w = static_cast<std::size_t>(s.width), v = static_cast<std::size_t>(s.vocab);
    auto add = [&](int id, std::size_t n) {
      auto& p = param[id];
      p.resize(n);
      for (std::size_t i = 0; i < n; ++i) p[i] = initial_value<T>(seed, id, static_cast<std::int64_t>(i));
      grad[id].assign(n, T(0));
    };
    for (int st : local) {
      if (st == 0) add(0, v * w);
      if (st == stages - 1) add(1, w * v);
      for (int l = first_layer(st); l < first_layer(st + 1); ++l) add(10 + l, (kConvHalo + 1) * w);
    }
  }

  [[nodiscard]] int first_layer(int stage) const noexcept { return stage * layers / stages; }

  /// Rows of width per token, or one loss term per token on the last stage.
  [[nodiscard]] std::int64_t output_size(const model::micro_batch_view& mb, int stage) const noexcept {
    return stage == stages - 1 ? mb.size() : mb.size() * shape.width;
  }
  [[nodiscard]] std::int64_t output_size(const model::micro_batch_view& mb) const noexcept {
    return output_size(mb, stages - 1);
  }

  template <class Ctx>
  void forward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T> in, std::span<T> out) {
    const auto n = static_cast<std::size_t>(mb.size()), w = static_cast<std::size_t>(shape.width);
    std::vector<T> x(n * w);
    if (ctx.stage == 0)
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t e = 0; e < w; ++e) x[t * w + e] = param[0][token(mb, t) * w + e];
    else
      x.assign(in.begin(), in.end());
    const auto slot = ctx.slots();
    int s = 0;
    for (int l = first_layer(ctx.stage); l < first_layer(ctx.stage + 1); ++l) {
      const auto plan = plan_of(ctx, mb);
      std::vector<T> halo(static_cast<std::size_t>(plan.halo_rows) * w, T(0)), z(n * w, T(0));
      if (Declared && !halo_off)
        ctx.halo_forward(plan, shape.width, std::span<const T>(x), std::span<T>(halo));
      const auto& c = param[10 + l];
      for (std::size_t t = 0; t < n; ++t)
        for (int j = 0; j <= kConvHalo; ++j)
          if (const T* row = source(plan, x, halo, t, j))
            for (std::size_t e = 0; e < w; ++e)
              z[t * w + e] += c[static_cast<std::size_t>(j) * w + e] * row[e];
      slot.save(s++, std::span<const T>(x));
      slot.save(s++, std::span<const T>(halo));
      slot.save(s++, std::span<const T>(z));
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += std::tanh(z[i]);
    }
    if (ctx.stage != stages - 1) {
      std::copy(x.begin(), x.end(), out.begin());
      return;
    }
    slot.save(s, std::span<const T>(x));
    const auto v = static_cast<std::size_t>(shape.vocab);
    std::vector<T> logits(v), p(v);
    for (std::size_t t = 0; t < n; ++t) {
      out[t] = 0;
      if (mb.loss_weights[t] == 0.0) continue;
      head(std::span<const T>(x).subspan(t * w, w), logits);
      softmax_of(logits, p);
      out[t] = -static_cast<T>(mb.loss_weights[t]) * std::log(p[static_cast<std::size_t>(mb.targets[t])]) /
               static_cast<T>(mb.step_targets);
    }
  }

  template <class Ctx>
  void backward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T> gout,
                std::span<T> gin) {
    const auto n = static_cast<std::size_t>(mb.size()), w = static_cast<std::size_t>(shape.width);
    const auto slot = ctx.slots();
    const int first = first_layer(ctx.stage), last = first_layer(ctx.stage + 1);
    std::vector<T> dx(n * w, T(0));
    if (ctx.stage == stages - 1) {
      const std::span<const T> h = slot.load(3 * (last - first));
      const auto v = static_cast<std::size_t>(shape.vocab);
      std::vector<T> logits(v), p(v);
      auto& wout = param[1];
      auto& gw = grad[1];
      for (std::size_t t = 0; t < n; ++t) {
        if (mb.loss_weights[t] == 0.0) continue;
        head(h.subspan(t * w, w), logits);
        softmax_of(logits, p);
        const T c = static_cast<T>(mb.loss_weights[t]) / static_cast<T>(mb.step_targets);
        p[static_cast<std::size_t>(mb.targets[t])] -= T(1);
        for (std::size_t e = 0; e < w; ++e)
          for (std::size_t j = 0; j < v; ++j) {
            gw[e * v + j] += h[t * w + e] * c * p[j];
            dx[t * w + e] += c * p[j] * wout[e * v + j];
          }
      }
      slot.release(3 * (last - first));
    } else {
      dx.assign(gout.begin(), gout.end());
    }
    for (int l = last - 1; l >= first; --l) {
      const int s = 3 * (l - first);
      const std::span<const T> x = slot.load(s), halo = slot.load(s + 1), z = slot.load(s + 2);
      const auto plan = plan_of(ctx, mb);
      std::vector<T> dz(n * w), dhalo(halo.size(), T(0));
      std::vector<T> dxin = dx;  // the residual
      for (std::size_t i = 0; i < dz.size(); ++i) {
        const T th = std::tanh(z[i]);
        dz[i] = dx[i] * (T(1) - th * th);
      }
      const auto& c = param[10 + l];
      auto& gc = grad[10 + l];
      for (std::size_t t = 0; t < n; ++t)
        for (int j = 0; j <= kConvHalo; ++j) {
          const auto src = j == 0
                               ? seq::halo_source{seq::halo_source::kind::local, static_cast<std::int64_t>(t)}
                               : plan.source(static_cast<std::int64_t>(t), j);
          if (src.where == seq::halo_source::kind::zero) continue;
          const T* row = src.where == seq::halo_source::kind::local
                             ? &x[static_cast<std::size_t>(src.index) * w]
                             : &halo[static_cast<std::size_t>(src.index) * w];
          T* drow = src.where == seq::halo_source::kind::local
                        ? &dxin[static_cast<std::size_t>(src.index) * w]
                        : &dhalo[static_cast<std::size_t>(src.index) * w];
          for (std::size_t e = 0; e < w; ++e) {
            gc[static_cast<std::size_t>(j) * w + e] += dz[t * w + e] * row[e];
            drow[e] += dz[t * w + e] * c[static_cast<std::size_t>(j) * w + e];
          }
        }
      if (Declared && !halo_off)
        ctx.halo_backward(plan, shape.width, std::span<const T>(dhalo), std::span<T>(dxin));
      dx = std::move(dxin);
      for (int i = 0; i < 3; ++i) slot.release(s + i);
    }
    if (ctx.stage == 0) {
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t e = 0; e < w; ++e) grad[0][token(mb, t) * w + e] += dx[t * w + e];
    } else {
      std::copy(dx.begin(), dx.end(), gin.begin());
    }
  }

  [[nodiscard]] std::vector<std::span<T>> parameters() {
    std::vector<std::span<T>> out;
    for (auto& [id, p] : param) out.emplace_back(p);
    return out;
  }
  [[nodiscard]] std::vector<std::span<T>> gradients() {
    std::vector<std::span<T>> out;
    for (auto& [id, g] : grad) out.emplace_back(g);
    return out;
  }
  /// Every tensor this rank holds, by global id.
  [[nodiscard]] std::vector<train::model_tensor<T>> tensors() {
    std::vector<train::model_tensor<T>> out;
    for (auto& [id, p] : param) out.push_back({id, p, grad[id]});
    return out;
  }

 private:
  // The halo plan: the context's when the stage declares its halo; undeclared, what a user would write
  // without the library (the micro-batch's own tokens only: right only when documents are whole).
  template <class Ctx>
  [[nodiscard]] seq::halo_plan plan_of(const Ctx& ctx, const model::micro_batch_view& mb) const {
    if constexpr (Declared) {
      return ctx.halo(kConvHalo);
    } else {
      (void)ctx;
      const std::vector<std::vector<seq::position_run>> local{seq::runs_of(mb.doc_ids, mb.positions)};
      return seq::make_halo_plan(local, 0, kConvHalo);
    }
  }
  // The row the convolution's tap j reads for local token t (tap 0: the token itself), null for zeros.
  static const T* source(const seq::halo_plan& plan, const std::vector<T>& x, const std::vector<T>& halo,
                         std::size_t t, int j) {
    const auto w = x.size() / static_cast<std::size_t>(std::max<std::int64_t>(plan.tokens, 1));
    if (j == 0) return &x[t * w];
    const auto s = plan.source(static_cast<std::int64_t>(t), j);
    if (s.where == seq::halo_source::kind::zero) return nullptr;
    return s.where == seq::halo_source::kind::local ? &x[static_cast<std::size_t>(s.index) * w]
                                                    : &halo[static_cast<std::size_t>(s.index) * w];
  }
  void head(std::span<const T> h, std::vector<T>& logits) {
    const auto w = static_cast<std::size_t>(shape.width), v = static_cast<std::size_t>(shape.vocab);
    for (std::size_t j = 0; j < v; ++j) {
      T s = 0;
      for (std::size_t e = 0; e < w; ++e) s += h[e] * param[1][e * v + j];
      logits[j] = s;
    }
  }
  static void softmax_of(const std::vector<T>& logits, std::vector<T>& p) {
    T m = logits[0], sum = 0;
    for (T l : logits) m = std::max(m, l);
    for (std::size_t j = 0; j < logits.size(); ++j) sum += p[j] = std::exp(logits[j] - m);
    for (T& x : p) x /= sum;
  }
  static std::size_t token(const model::micro_batch_view& mb, std::size_t t) {
    return static_cast<std::size_t>(mb.tokens[t]);
  }
};

}  // namespace traintest
