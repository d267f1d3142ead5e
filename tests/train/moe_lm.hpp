// SPDX-License-Identifier: Apache-2.0
// A small mixture-of-experts language model written against train::system's expert parallelism:
// embedding (stage 0), one MoE block per pipeline stage (a softmax router, top-2 of kExperts experts, each
// expert tanh(x W_e), gates the router's probabilities, dropless; residual), and an output head with
// per-token cross-entropy (last stage). Under ep > 1 (ctx.ep set) rank r holds experts [r E/ep, (r+1) E/ep)
// and the block runs through run::moe_plan / dispatch / combine; with ep = 1 it computes the same sums
// directly (the 1-rank reference). The experts' weights are expert parameters (expert_parameters(),
// reduced by train::system over the ranks holding the same experts), the rest dense.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/token_mixing.hpp>
#include <hetmesh/run/moe.hpp>
#include <hetmesh/train/parity.hpp>

#include "train/tiny_lm.hpp"

namespace traintest {

/// MoE blocks of the whole model, experts per block, and experts per token.
inline constexpr int kMoeBlocks = 2;
inline constexpr int kExperts = 4;
inline constexpr int kTopK = 2;

template <class T>
struct moe_lm {
  using is_backbone_stage = void;
  /// The router and experts are token-local; tokens meet only where a stage adds attention (none here).
  static constexpr hetmesh::model::token_mixing token_mixing = hetmesh::model::token_local;

  lm_shape shape;
  int stages = 1;                               ///< pipeline stages (one MoE block each)
  int ep_rank = 0, ep = 1;                      ///< this rank's experts: [ep_rank E/ep, (ep_rank+1) E/ep)
  std::map<int, std::vector<T>> param, grad;    ///< dense tensors by id: 0 embedding, 1 head, 10 + l router
  std::map<int, std::vector<T>> xparam, xgrad;  ///< expert tensors by id 20 + l: [local experts][w][w]

  moe_lm(lm_shape s, std::uint64_t seed, const train::model_split& sp)
      : shape(s), stages(sp.stages), ep_rank(sp.ep_rank), ep(sp.ep) {
    const auto w = static_cast<std::int64_t>(s.width), v = static_cast<std::int64_t>(s.vocab);
    auto init = [&](std::map<int, std::vector<T>>& p, std::map<int, std::vector<T>>& g, int id,
                    const train::tensor_shard& sh, std::int64_t n) {
      auto& x = p[id];
      x.resize(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i)
        x[static_cast<std::size_t>(i)] = initial_value<T>(seed, id, sh.global(i));
      g[id].assign(static_cast<std::size_t>(n), T(0));
    };
    for (int st : sp.local) {
      if (st == 0) init(param, grad, 0, {}, v * w);
      if (st == stages - 1) init(param, grad, 1, {}, w * v);
      for (int b = first_block(st); b < first_block(st + 1); ++b) {
        init(param, grad, 10 + b, {}, w * kExperts);
        init(xparam, xgrad, 20 + b, expert_shard(), kExperts / ep * w * w);
      }
    }
  }

  /// Experts per MoE block (split over ep; train::system checks that ep divides them).
  [[nodiscard]] int experts() const noexcept { return kExperts; }

  /// The first MoE block of pipeline stage `stage` (blocks spread evenly over the stages).
  [[nodiscard]] int first_block(int stage) const noexcept { return stage * kMoeBlocks / stages; }

  [[nodiscard]] train::tensor_shard expert_shard() const {
    return {kExperts, shape.width * shape.width, 0, ep_rank, ep};
  }
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
        for (std::size_t e = 0; e < w; ++e) x[t * w + e] = param[0][row(mb, t) * w + e];
    else
      x.assign(in.begin(), in.end());
    const auto slot = ctx.slots();
    for (int blk = first_block(ctx.stage); blk < first_block(ctx.stage + 1); ++blk)
      block_forward(ctx, slot, 10 * (blk - first_block(ctx.stage)), blk, x);
    if (ctx.stage + 1 < stages) {
      std::copy(x.begin(), x.end(), out.begin());
      return;
    }
    slot.save(1000, std::span<const T>(x));
    for (std::size_t t = 0; t < n; ++t) {
      out[t] = 0;
      if (mb.loss_weights[t] == 0.0) continue;
      const auto p = head(std::span<const T>(x).subspan(t * w, w));
      out[t] = -static_cast<T>(mb.loss_weights[t]) * std::log(p[static_cast<std::size_t>(mb.targets[t])]) /
               static_cast<T>(mb.step_targets);
    }
  }

  template <class Ctx>
  void backward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T> gout,
                std::span<T> gin) {
    const auto n = static_cast<std::size_t>(mb.size()), w = static_cast<std::size_t>(shape.width),
               v = static_cast<std::size_t>(shape.vocab);
    const auto slot = ctx.slots();
    std::vector<T> dh(n * w, T(0));
    if (ctx.stage + 1 == stages) {
      const std::span<const T> h = slot.load(1000);
      for (std::size_t t = 0; t < n; ++t) {
        if (mb.loss_weights[t] == 0.0) continue;
        auto p = head(h.subspan(t * w, w));
        p[static_cast<std::size_t>(mb.targets[t])] -= T(1);
        const T c = static_cast<T>(mb.loss_weights[t]) / static_cast<T>(mb.step_targets);
        for (std::size_t e = 0; e < w; ++e)
          for (std::size_t j = 0; j < v; ++j) {
            grad[1][e * v + j] += h[t * w + e] * c * p[j];
            dh[t * w + e] += c * p[j] * param[1][e * v + j];
          }
      }
      slot.release(1000);
    } else {
      dh.assign(gout.begin(), gout.end());
    }
    for (int blk = first_block(ctx.stage + 1) - 1; blk >= first_block(ctx.stage); --blk)
      dh = block_backward(ctx, slot, 10 * (blk - first_block(ctx.stage)), blk, dh);
    if (ctx.stage == 0)
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t e = 0; e < w; ++e) grad[0][row(mb, t) * w + e] += dh[t * w + e];
    else
      std::copy(dh.begin(), dh.end(), gin.begin());
  }

 private:
  // Block `blk`'s forward on x (in place: x + moe(x)); saves its tensors at slots base .. base + 4.
  template <class Ctx, class Slot>
  void block_forward(const Ctx& ctx, const Slot& slot, int base, int blk, std::vector<T>& x) {
    const auto w = static_cast<std::size_t>(shape.width), n = x.size() / w;
    const auto r = route(x, param[10 + blk]);
    std::vector<T> routed(n * kTopK * w), y(n * w, T(0));
    if (ctx.ep == nullptr) {
      for (std::size_t c = 0; c < n * kTopK; ++c)
        expert(xparam[20 + blk], static_cast<std::size_t>(r.chosen[c]), &x[c / kTopK * w], &routed[c * w]);
      for (std::size_t c = 0; c < n * kTopK; ++c)
        for (std::size_t e = 0; e < w; ++e) y[c / kTopK * w + e] += r.gates[c] * routed[c * w + e];
    } else {
      const auto plan = moe_plan(*ctx.ep, r);
      std::vector<T> xin(static_cast<std::size_t>(plan.expert_rows()) * w), xout(xin.size());
      run::moe_dispatch_forward(*ctx.ep, plan, shape.width, std::span<const T>(x), std::span<T>(xin), mem);
      std::size_t at = 0;
      for (std::size_t j = 0; j < plan.expert_counts.size(); ++j)
        for (std::int64_t i = 0; i < plan.expert_counts[j]; ++i, ++at)
          expert(xparam[20 + blk], j, &xin[at * w], &xout[at * w]);
      run::moe_combine_forward(*ctx.ep, plan, shape.width, std::span<const T>(xout),
                               std::span<const T>(r.gates), std::span<T>(routed), std::span<T>(y), mem);
      slot.save(base + 3, std::span<const T>(xin));
      slot.save(base + 4, std::span<const T>(xout));
    }
    slot.save(base + 0, std::span<const T>(x));
    slot.save(base + 1, std::span<const T>(r.probs));
    slot.save(base + 2, std::span<const T>(routed));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }

  // Block `blk`'s backward: from dh (the gradient of x + moe(x)) to the gradient of x; adds its weights'.
  template <class Ctx, class Slot>
  std::vector<T> block_backward(const Ctx& ctx, const Slot& slot, int base, int blk,
                                const std::vector<T>& dh) {
    const auto w = static_cast<std::size_t>(shape.width), n = dh.size() / w;
    const std::span<const T> x = slot.load(base + 0), probs = slot.load(base + 1),
                             routed = slot.load(base + 2);
    const auto r = route(std::vector<T>(x.begin(), x.end()), param[10 + blk]);
    auto& W = xparam[20 + blk];
    auto& dW = xgrad[20 + blk];
    std::vector<T> dx = dh, dgates(n * kTopK, T(0));
    if (ctx.ep == nullptr) {
      for (std::size_t c = 0; c < n * kTopK; ++c) {
        const auto t = c / kTopK;
        std::vector<T> dz(w);
        for (std::size_t e = 0; e < w; ++e) {
          dgates[c] += dh[t * w + e] * routed[c * w + e];
          dz[e] = r.gates[c] * dh[t * w + e] * (T(1) - routed[c * w + e] * routed[c * w + e]);
        }
        expert_backward(W, dW, static_cast<std::size_t>(r.chosen[c]), &x[t * w], dz.data(), &dx[t * w]);
      }
    } else {
      const auto plan = moe_plan(*ctx.ep, r);
      const std::span<const T> xin = slot.load(base + 3), xout = slot.load(base + 4);
      std::vector<T> dout(xin.size()), din(xin.size(), T(0)), dmoe(n * w);
      run::moe_combine_backward(*ctx.ep, plan, shape.width, std::span<const T>(dh),
                                std::span<const T>(r.gates), routed, std::span<T>(dout), std::span<T>(dgates),
                                mem);
      std::size_t at = 0;
      for (std::size_t j = 0; j < plan.expert_counts.size(); ++j)
        for (std::int64_t i = 0; i < plan.expert_counts[j]; ++i, ++at) {
          std::vector<T> dz(w);
          for (std::size_t e = 0; e < w; ++e)
            dz[e] = dout[at * w + e] * (T(1) - xout[at * w + e] * xout[at * w + e]);
          expert_backward(W, dW, j, &xin[at * w], dz.data(), &din[at * w]);
        }
      run::moe_dispatch_backward(*ctx.ep, plan, shape.width, std::span<const T>(din), std::span<T>(dmoe),
                                 mem);
      for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dmoe[i];
      slot.release(base + 3);
      slot.release(base + 4);
    }
    // The router: d gates -> d probs (chosen experts) -> softmax -> d logits -> the router and x.
    auto& wr = param[10 + blk];
    auto& dwr = grad[10 + blk];
    for (std::size_t t = 0; t < n; ++t) {
      std::vector<T> dp(kExperts, T(0)), dl(kExperts);
      for (std::size_t j = 0; j < kTopK; ++j)
        dp[static_cast<std::size_t>(r.chosen[t * kTopK + j])] += dgates[t * kTopK + j];
      T s = 0;
      for (std::size_t e = 0; e < kExperts; ++e) s += probs[t * kExperts + e] * dp[e];
      for (std::size_t e = 0; e < kExperts; ++e) dl[e] = probs[t * kExperts + e] * (dp[e] - s);
      for (std::size_t i = 0; i < w; ++i)
        for (std::size_t e = 0; e < kExperts; ++e) {
          dwr[i * kExperts + e] += x[t * w + i] * dl[e];
          dx[t * w + i] += dl[e] * wr[i * kExperts + e];
        }
    }
    for (int i = 0; i < 3; ++i) slot.release(base + i);
    return dx;
  }

 public:
  [[nodiscard]] std::vector<std::span<T>> parameters() { return spans(param); }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return spans(grad); }
  [[nodiscard]] std::vector<std::span<T>> expert_parameters() { return spans(xparam); }
  [[nodiscard]] std::vector<std::span<T>> expert_gradients() { return spans(xgrad); }
  /// Every tensor by id; the experts' as this rank's block of [E][w * w].
  [[nodiscard]] std::vector<train::model_tensor<T>> tensors() {
    std::vector<train::model_tensor<T>> out;
    for (auto& [id, p] : param) out.push_back({id, p, grad[id]});
    for (auto& [id, p] : xparam) out.push_back({id, p, xgrad[id], expert_shard()});
    return out;
  }

 private:
  struct routing {
    std::vector<T> probs;              // [n][E]
    std::vector<std::int64_t> chosen;  // [n][k]: the k most probable experts, ties to the lower id
    std::vector<T> gates;              // [n][k]: their probabilities
  };
  routing route(const std::vector<T>& x, const std::vector<T>& wr) const {
    const auto w = static_cast<std::size_t>(shape.width), n = x.size() / w;
    routing r{std::vector<T>(n * kExperts), std::vector<std::int64_t>(n * kTopK), std::vector<T>(n * kTopK)};
    for (std::size_t t = 0; t < n; ++t) {
      T m = -1e300, s = 0;
      for (std::size_t e = 0; e < kExperts; ++e) {
        T z = 0;
        for (std::size_t i = 0; i < w; ++i) z += x[t * w + i] * wr[i * kExperts + e];
        r.probs[t * kExperts + e] = z;
        m = std::max(m, z);
      }
      for (std::size_t e = 0; e < kExperts; ++e)
        s += r.probs[t * kExperts + e] = std::exp(r.probs[t * kExperts + e] - m);
      for (std::size_t e = 0; e < kExperts; ++e) r.probs[t * kExperts + e] /= s;
      std::vector<std::int64_t> order(kExperts);
      for (std::size_t e = 0; e < kExperts; ++e) order[e] = static_cast<std::int64_t>(e);
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
        return r.probs[t * kExperts + static_cast<std::size_t>(a)] >
               r.probs[t * kExperts + static_cast<std::size_t>(b)];
      });
      for (std::size_t j = 0; j < kTopK; ++j) {
        r.chosen[t * kTopK + j] = order[j];
        r.gates[t * kTopK + j] = r.probs[t * kExperts + static_cast<std::size_t>(order[j])];
      }
    }
    return r;
  }
  template <class Comm>
  seq::moe_dispatch_plan moe_plan(Comm& c, const routing& r) const {
    return run::moe_plan(c, seq::moe_layout{.experts = kExperts, .ep = ep, .top_k = kTopK},
                         seq::moe_capacity{}, std::span<const std::int64_t>(r.chosen),
                         std::span<const T>(r.gates), mem);
  }
  // out[w] = tanh(x W_e) for local expert `e` (whole model: e is the global expert when ep = 1).
  void expert(const std::vector<T>& W, std::size_t e, const T* x, T* out) const {
    const auto w = static_cast<std::size_t>(shape.width);
    for (std::size_t j = 0; j < w; ++j) {
      T z = 0;
      for (std::size_t i = 0; i < w; ++i) z += x[i] * W[e * w * w + i * w + j];
      out[j] = std::tanh(z);
    }
  }
  // dW_e += x^T dz; dx += dz W_e^T.
  void expert_backward(const std::vector<T>& W, std::vector<T>& dW, std::size_t e, const T* x, const T* dz,
                       T* dx) const {
    const auto w = static_cast<std::size_t>(shape.width);
    for (std::size_t i = 0; i < w; ++i)
      for (std::size_t j = 0; j < w; ++j) {
        dW[e * w * w + i * w + j] += x[i] * dz[j];
        dx[i] += dz[j] * W[e * w * w + i * w + j];
      }
  }
  std::vector<T> head(std::span<const T> h) {
    const auto w = static_cast<std::size_t>(shape.width), v = static_cast<std::size_t>(shape.vocab);
    std::vector<T> p(v);
    T m = -1e300, s = 0;
    for (std::size_t j = 0; j < v; ++j) {
      T z = 0;
      for (std::size_t e = 0; e < w; ++e) z += h[e] * param[1][e * v + j];
      p[j] = z;
      m = std::max(m, z);
    }
    for (auto& z : p) s += z = std::exp(z - m);
    for (auto& z : p) z /= s;
    return p;
  }
  static std::vector<std::span<T>> spans(std::map<int, std::vector<T>>& m) {
    std::vector<std::span<T>> out;
    for (auto& [id, x] : m) out.emplace_back(x);
    return out;
  }
  static std::size_t row(const model::micro_batch_view& mb, std::size_t t) {
    return static_cast<std::size_t>(mb.tokens[t]);
  }
  model::host_memory mem{};
};

}  // namespace traintest
