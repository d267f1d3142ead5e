// SPDX-License-Identifier: Apache-2.0
// A small multimodal language model split into pipeline stages, written as a user would write it against
// train::system: token embedding (stage 0, where encoder outputs replace the placeholder tokens' rows),
// `blocks` attention blocks spread evenly over the stages (q/k/v projections, grouped-query attention
// through the context's entry, output projection, residual), and an output head with a per-token
// cross-entropy loss (last stage). One object per rank holds the stages that rank runs; ctx.stage picks
// the blocks. The backward is also split into input (I) and weight (W) halves for the zero-bubble
// schedules: I saves the output gradients W needs. Every tensor has a global id, so a pipelined run's
// gradients can be compared tensor by tensor with a single-rank run's.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "train/tiny_lm.hpp"

namespace traintest {

template <class T>
struct tiny_stack {
  using is_backbone_stage = void;
  /// Tokens meet only in the context's attention (model/token_mixing.hpp).
  static constexpr hetmesh::model::token_mixing token_mixing = hetmesh::model::through_attention;

  lm_shape shape;                             ///< sizes; attn: this rank's heads (the whole model's / tp)
  int blocks = 4;                             ///< attention blocks of the whole model
  int stages = 1;                             ///< pipeline stages of the whole model
  int tp_rank = 0;                            ///< tensor parallel: this rank's heads are block tp_rank
  int tp = 1;                                 ///< tensor-parallel ranks (q, k, v by columns, o by rows)
  std::map<int, std::vector<T>> param, grad;  ///< by global tensor id, only this rank's stages'
  std::map<int, train::tensor_shard> shard;   ///< by global tensor id: which block this rank holds

  /// Tensor ids: 0 embedding, 1 head, 10 + 4 * block + {0 q, 1 k, 2 v, 3 o}. Under tp > 1 the heads split
  /// over tp (Megatron's attention: q, k, v column-parallel, o row-parallel, all-reduced over ctx.tp).
  tiny_stack(lm_shape s, std::uint64_t seed, int num_blocks, int num_stages, std::span<const int> local,
             int tp_index = 0, int tp_ranks = 1)
      : shape(s), blocks(num_blocks), stages(num_stages), tp_rank(tp_index), tp(tp_ranks) {
    const auto w = static_cast<std::int64_t>(s.width), v = static_cast<std::int64_t>(s.vocab);
    const auto hq = static_cast<std::int64_t>(s.attn.q_heads * s.attn.head_dim);
    const auto hk = static_cast<std::int64_t>(s.attn.kv_heads * s.attn.head_dim);
    if (s.attn.q_heads % tp != 0 || s.attn.kv_heads % tp != 0)
      throw_error<invalid_argument>("tiny_stack: {} query and {} kv heads over tp {}", s.attn.q_heads,
                                    s.attn.kv_heads, tp);
    shape.attn.q_heads /= tp;
    shape.attn.kv_heads /= tp;
    // A block of the full tensor the seed defines, so every split holds the same model.
    auto add = [&](int id, std::int64_t rows, std::int64_t cols, int axis) {
      const train::tensor_shard sh{axis < 0 ? 0 : rows, cols, axis < 0 ? 0 : axis, axis < 0 ? 0 : tp_rank,
                                   axis < 0 ? 1 : tp};
      const auto n = static_cast<std::size_t>(rows * cols / sh.parts);
      auto& p = param[id];
      p.resize(n);
      for (std::size_t i = 0; i < n; ++i)
        p[i] = initial_value<T>(seed, id, sh.global(static_cast<std::int64_t>(i)));
      grad[id].assign(n, T(0));
      shard[id] = sh;
    };
    for (int st : local) {
      if (st == 0) add(0, v, w, -1);
      if (st == stages - 1) add(1, w, v, -1);
      for (int b = first_block(st); b < first_block(st + 1); ++b) {
        add(10 + 4 * b, w, hq, 1);
        add(11 + 4 * b, w, hk, 1);
        add(12 + 4 * b, w, hk, 1);
        add(13 + 4 * b, hq, w, 0);
      }
    }
  }
  /// The stages and tp block train::system names for this rank (system::split()).
  tiny_stack(lm_shape s, std::uint64_t seed, int num_blocks, const train::model_split& sp)
      : tiny_stack(s, seed, num_blocks, sp.stages, sp.local, sp.tp_rank, sp.tp) {}

  /// The whole model's query heads (split over tp; train::system checks that tp divides them).
  [[nodiscard]] int attention_heads() const noexcept { return shape.attn.q_heads * tp; }

  /// Every tensor this rank holds, by global id, with its tp block.
  [[nodiscard]] std::vector<train::model_tensor<T>> tensors() {
    std::vector<train::model_tensor<T>> out;
    for (auto& [id, p] : param) out.push_back({id, std::span<T>(p), std::span<T>(grad.at(id)), shard.at(id)});
    return out;
  }

  [[nodiscard]] int first_block(int stage) const noexcept { return stage * blocks / stages; }

  /// Hidden rows between stages; the last stage's output: its per-token loss terms.
  [[nodiscard]] std::int64_t output_size(const model::micro_batch_view& mb, int stage) const noexcept {
    return stage == stages - 1 ? mb.size() : mb.size() * shape.width;
  }
  [[nodiscard]] std::int64_t output_size(const model::micro_batch_view& mb) const noexcept {
    return output_size(mb, stages - 1);
  }

  template <train::attention_context<T> Ctx>
  void forward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T> in, std::span<T> out) {
    const auto d = dims(mb);
    const auto slot = ctx.slots();
    std::vector<T> h(d.n * d.w);
    if (ctx.stage == 0) {
      embed(mb, in, h);
    } else {
      check(in.size(), d.n * d.w, "stage input");
      h.assign(in.begin(), in.end());
    }
    for (int b = first_block(ctx.stage); b < first_block(ctx.stage + 1); ++b) {
      const int base = 10 * (b - first_block(ctx.stage));
      std::vector<T> q(d.n * d.hq), k(d.n * d.hk), v(d.n * d.hk), a(d.n * d.hq), lse(d.n * d.heads),
          h2(d.n * d.w);
      matmul<T>(h, param.at(10 + 4 * b), q, d.n, d.w, d.hq);
      matmul<T>(h, param.at(11 + 4 * b), k, d.n, d.w, d.hk);
      matmul<T>(h, param.at(12 + 4 * b), v, d.n, d.w, d.hk);
      ctx.attention_forward(shape.attn, scale(), q, k, v, a, lse);
      matmul<T>(a, param.at(13 + 4 * b), h2, d.n, d.hq, d.w);
      tp_sum(ctx, h2);  // row-parallel o
      for (std::size_t i = 0; i < h2.size(); ++i) h2[i] += h[i];
      slot.save(base + 0, std::span<const T>(h));
      slot.save(base + 1, std::span<const T>(q));
      slot.save(base + 2, std::span<const T>(k));
      slot.save(base + 3, std::span<const T>(v));
      slot.save(base + 4, std::span<const T>(a));
      slot.save(base + 5, std::span<const T>(lse));
      h = std::move(h2);
    }
    if (ctx.stage + 1 < stages) {
      check(out.size(), d.n * d.w, "stage output");
      std::copy(h.begin(), h.end(), out.begin());
      return;
    }
    check(out.size(), d.n, "loss output");
    std::vector<T> p(d.v);
    for (std::size_t t = 0; t < d.n; ++t) {
      out[t] = 0;
      if (mb.loss_weights[t] == 0.0) continue;
      softmax(std::span<const T>(h).subspan(t * d.w, d.w), p);
      out[t] = -static_cast<T>(mb.loss_weights[t]) * std::log(p[static_cast<std::size_t>(mb.targets[t])]) /
               static_cast<T>(mb.step_targets);
    }
    slot.save(1000, std::span<const T>(h));
  }

  template <train::attention_context<T> Ctx>
  void backward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T> gout,
                std::span<T> gin) {
    backward_input(ctx, mb, gout, gin);
    backward_weight(ctx, mb);
  }

  /// I: the input gradient; saves (slot tensors 2000+) the output gradients W needs.
  template <train::attention_context<T> Ctx>
  void backward_input(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T> gout,
                      std::span<T> gin) {
    const auto d = dims(mb);
    const auto slot = ctx.slots();
    std::vector<T> dh(d.n * d.w, T(0));
    if (ctx.stage + 1 == stages) {
      const auto h = slot.load(1000);
      std::vector<T> dlogits(d.n * d.v, T(0)), p(d.v);
      for (std::size_t t = 0; t < d.n; ++t) {
        if (mb.loss_weights[t] == 0.0) continue;
        softmax(h.subspan(t * d.w, d.w), p);
        const T c = static_cast<T>(mb.loss_weights[t]) / static_cast<T>(mb.step_targets);
        for (std::size_t j = 0; j < d.v; ++j) dlogits[t * d.v + j] = c * p[j];
        dlogits[t * d.v + static_cast<std::size_t>(mb.targets[t])] -= c;
      }
      add_dy_wt<T>(dlogits, param.at(1), dh, d.n, d.w, d.v);
      slot.save(2000, std::span<const T>(dlogits));
    } else {
      check(gout.size(), d.n * d.w, "output gradient");
      dh.assign(gout.begin(), gout.end());
    }
    for (int b = first_block(ctx.stage + 1) - 1; b >= first_block(ctx.stage); --b) {
      const int base = 10 * (b - first_block(ctx.stage));
      const auto q = slot.load(base + 1), k = slot.load(base + 2), v = slot.load(base + 3),
                 a = slot.load(base + 4), lse = slot.load(base + 5);
      std::vector<T> da(d.n * d.hq, T(0)), dq(d.n * d.hq), dk(d.n * d.hk), dv(d.n * d.hk);
      add_dy_wt<T>(dh, param.at(13 + 4 * b), da, d.n, d.hq, d.w);
      ctx.attention_backward(shape.attn, scale(), q, k, v, a, lse, da, dq, dk, dv);
      slot.save(2001 + 4 * base, std::span<const T>(dh));
      slot.save(2002 + 4 * base, std::span<const T>(dq));
      slot.save(2003 + 4 * base, std::span<const T>(dk));
      slot.save(2004 + 4 * base, std::span<const T>(dv));
      std::vector<T> dx = dh;  // the residual
      if (!split_over_tp(ctx)) {
        add_dy_wt<T>(dq, param.at(10 + 4 * b), dx, d.n, d.w, d.hq);
        add_dy_wt<T>(dk, param.at(11 + 4 * b), dx, d.n, d.w, d.hk);
        add_dy_wt<T>(dv, param.at(12 + 4 * b), dx, d.n, d.w, d.hk);
      } else {  // the column-parallel q, k, v: this rank's heads' share of the input gradient, summed over tp
        std::vector<T> part(d.n * d.w, T(0));
        add_dy_wt<T>(dq, param.at(10 + 4 * b), part, d.n, d.w, d.hq);
        add_dy_wt<T>(dk, param.at(11 + 4 * b), part, d.n, d.w, d.hk);
        add_dy_wt<T>(dv, param.at(12 + 4 * b), part, d.n, d.w, d.hk);
        tp_sum(ctx, part);
        for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += part[i];
      }
      dh = std::move(dx);
    }
    if (ctx.stage == 0) {  // encoder rows' gradients go back to the encoders; the rest stays for W
      std::size_t at = 0;
      for (const auto& l : mb.encoder_outputs)
        for (std::int64_t r = 0; r < l.item_tokens.size(); ++r, ++at)
          for (std::size_t e = 0; e < d.w; ++e)
            gin[at * d.w + e] = dh[static_cast<std::size_t>(l.local_offset + r) * d.w + e];
      check(gin.size(), at * d.w, "input gradient");
      slot.save(2999, std::span<const T>(dh));
    } else {
      check(gin.size(), d.n * d.w, "input gradient");
      std::copy(dh.begin(), dh.end(), gin.begin());
    }
  }

  /// W: the weight gradients from what forward and I saved; releases every slot of the micro-batch.
  template <train::attention_context<T> Ctx>
  void backward_weight(const Ctx& ctx, const model::micro_batch_view& mb) {
    const auto d = dims(mb);
    const auto slot = ctx.slots();
    if (ctx.stage + 1 == stages) {
      add_xt_dy<T>(slot.load(1000), slot.load(2000), grad.at(1), d.n, d.w, d.v);
      slot.release(1000);
      slot.release(2000);
    }
    for (int b = first_block(ctx.stage); b < first_block(ctx.stage + 1); ++b) {
      const int base = 10 * (b - first_block(ctx.stage));
      const auto h = slot.load(base + 0), a = slot.load(base + 4);
      add_xt_dy<T>(a, slot.load(2001 + 4 * base), grad.at(13 + 4 * b), d.n, d.hq, d.w);
      add_xt_dy<T>(h, slot.load(2002 + 4 * base), grad.at(10 + 4 * b), d.n, d.w, d.hq);
      add_xt_dy<T>(h, slot.load(2003 + 4 * base), grad.at(11 + 4 * b), d.n, d.w, d.hk);
      add_xt_dy<T>(h, slot.load(2004 + 4 * base), grad.at(12 + 4 * b), d.n, d.w, d.hk);
      for (int i = 0; i < 6; ++i) slot.release(base + i);
      for (int i = 1; i <= 4; ++i) slot.release(2000 + i + 4 * base);
    }
    if (ctx.stage == 0) {
      const auto dx = slot.load(2999);
      auto& ge = grad.at(0);
      for (std::size_t t = 0; t < d.n; ++t) {
        if (replaced(mb, static_cast<std::int64_t>(t))) continue;
        for (std::size_t e = 0; e < d.w; ++e) ge[token(mb, t) * d.w + e] += dx[t * d.w + e];
      }
      slot.release(2999);
    }
  }

  [[nodiscard]] std::vector<std::span<T>> parameters() { return spans(param); }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return spans(grad); }

 private:
  // Whether the call's context splits the heads over a tp group (a context without ctx.tp never does).
  template <class Ctx>
  static bool split_over_tp(const Ctx& ctx) {
    if constexpr (requires { ctx.tp; })
      return ctx.tp != nullptr;
    else
      return false;
  }
  // Sums x over the context's tp group (nothing without one).
  template <class Ctx>
  static void tp_sum(const Ctx& ctx, std::vector<T>& x) {
    if constexpr (requires { ctx.tp; })
      if (ctx.tp != nullptr) comm::all_reduce(*ctx.tp, std::span<T>(x), comm::reduce_op::sum);
  }
  [[nodiscard]] lm_dims dims(const model::micro_batch_view& mb) const noexcept { return dims_of(shape, mb); }
  static std::vector<std::span<T>> spans(std::map<int, std::vector<T>>& m) {
    std::vector<std::span<T>> out;
    for (auto& [id, v] : m) out.emplace_back(v);
    return out;
  }
  static void check(std::size_t got, std::size_t expected, const char* what) {
    if (got != expected)
      throw_error<invalid_argument>("tiny_stack: {} has {} elements; expected {}", what, got, expected);
  }
  [[nodiscard]] static bool replaced(const model::micro_batch_view& mb, std::int64_t t) noexcept {
    for (const auto& l : mb.encoder_outputs)
      if (t >= l.local_offset && t < l.local_offset + l.item_tokens.size()) return true;
    return false;
  }
  /// Stage 0's rows: the token embeddings, with the landing encoder rows (in landing order) in place.
  void embed(const model::micro_batch_view& mb, std::span<const T> in, std::vector<T>& h) const {
    const auto d = dims(mb);
    const auto& emb = param.at(0);
    for (std::size_t t = 0; t < d.n; ++t)
      for (std::size_t e = 0; e < d.w; ++e) h[t * d.w + e] = emb[token(mb, t) * d.w + e];
    std::size_t at = 0;
    for (const auto& l : mb.encoder_outputs)
      for (std::int64_t r = 0; r < l.item_tokens.size(); ++r, ++at)
        for (std::size_t e = 0; e < d.w; ++e)
          h[static_cast<std::size_t>(l.local_offset + r) * d.w + e] = in[at * d.w + e];
    check(in.size(), at * d.w, "stage 0 input (encoder rows)");
  }
  [[nodiscard]] T scale() const {
    return static_cast<T>(1.0 / std::sqrt(static_cast<double>(shape.attn.head_dim)));
  }
  [[nodiscard]] std::size_t token(const model::micro_batch_view& mb, std::size_t t) const {
    const auto id = mb.tokens[t];
    if (id < 0 || id >= shape.vocab)
      throw_error<invalid_argument>("tiny_stack: token id {} outside the vocabulary of {}", id, shape.vocab);
    return static_cast<std::size_t>(id);
  }
  void softmax(std::span<const T> hrow, std::vector<T>& p) const {
    matmul<T>(hrow, param.at(1), p, 1, static_cast<std::size_t>(shape.width),
              static_cast<std::size_t>(shape.vocab));
    T m = p[0];
    for (auto z : p) m = z > m ? z : m;
    T s = 0;
    for (auto& z : p) s += (z = std::exp(z - m));
    for (auto& z : p) z /= s;
  }
};

}  // namespace traintest
