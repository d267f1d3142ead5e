// SPDX-License-Identifier: Apache-2.0
// example_custom_model's video encoder, a hetmesh::model::encoder_stage. A clip is frames of patches; each
// patch (patch_dim floats) becomes one row: embedded, plus a learned embedding of its frame (time), then
// one attention layer inside the clip (every patch of every frame sees every other, through the encoder
// context: whole clips on this rank, or a long clip split by long-short sequence parallelism over a group
// of ranks), then projected to the backbone's width. Those rows replace the clip's placeholder tokens in
// the backbone's stage 0.
// docs/tutorial.md quotes this file (example_custom_model.tutorial checks the quotes).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <hetmesh/core/error.hpp>
#include <hetmesh/model/encoder_batch.hpp>
#include <hetmesh/model/stage.hpp>

#include "custom_model/layers.hpp"

namespace custom {

template <class T>
struct video_encoder {
  /// Opt-in for model::encoder_stage.
  using is_encoder_stage = void;
  /// The items this encoder takes (data::loaded_item::kind, run::record_projection::encoders).
  static constexpr std::string_view modality = "video";

  shape s;
  tensor_store<T> store;  ///< ids 1000 + {0 embed, 1 bias, 2 time, 3 q, 4 k, 5 v, 6 out, 7 projection}

  /// The encoder of `sh` with parameters from `seed` (the same on every rank).
  video_encoder(const shape& sh, std::uint64_t seed) : s(sh) {
    const auto p = static_cast<std::size_t>(sh.patch_dim), e = static_cast<std::size_t>(sh.enc_width),
               d = static_cast<std::size_t>(sh.width), f = static_cast<std::size_t>(sh.max_frames);
    store.add(1000, p * e, seed, 1.0 / std::sqrt(static_cast<double>(p)));
    store.add(1001, e, seed, 0.1);
    store.add(1002, f * e, seed, 0.5);
    for (int m = 3; m <= 6; ++m) store.add(1000 + m, e * e, seed, 1.0 / std::sqrt(static_cast<double>(e)));
    store.add(1007, e * d, seed, 1.0 / std::sqrt(static_cast<double>(e)));
  }

  /// The heads its attention splits over: long-short SP splits a clip only over groups whose size divides
  /// them (model::encoder_stage requirement 8; the library has no default).
  [[nodiscard]] int attention_heads() const noexcept { return s.enc_heads; }
  /// One patch of patch_dim floats per row.
  [[nodiscard]] std::int64_t input_size(const hetmesh::model::encoder_batch_view& ev) const noexcept {
    return ev.size() * s.patch_dim;
  }
  /// One backbone row per patch.
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::encoder_batch_view& ev) const noexcept {
    return ev.size() * s.width;
  }

  template <class Ctx>
  void forward(const Ctx& ctx, const hetmesh::model::encoder_batch_view& ev, std::span<const T> in,
               std::span<T> out) {
    const auto n = static_cast<std::size_t>(ev.size()), e = enc(), p = static_cast<std::size_t>(s.patch_dim);
    check(in.size(), n * p, "input");
    check(out.size(), n * static_cast<std::size_t>(s.width), "output");
    std::vector<T> x(n * e), q(n * e), k(n * e), v(n * e), o(n * e), lse(n * heads()), y(n * e);
    matmul<T>(in, store.p(1000), x, n, p, e);
    const auto frame = frames(ev);  // which frame of its clip each row is
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t j = 0; j < e; ++j) x[t * e + j] += store.p(1001)[j] + store.p(1002)[frame[t] * e + j];
    matmul<T>(x, store.p(1003), q, n, e, e);
    matmul<T>(x, store.p(1004), k, n, e, e);
    matmul<T>(x, store.p(1005), v, n, e, e);
    // Attention inside each clip, wherever its patches are: the context runs the split ones over their group.
    ctx.attention_forward(ev, attn(), scale(), std::span<const T>(q), std::span<const T>(k),
                          std::span<const T>(v), std::span<T>(o), std::span<T>(lse));
    matmul<T>(o, store.p(1006), y, n, e, e);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += x[i];
    matmul<T>(y, store.p(1007), out, n, e, static_cast<std::size_t>(s.width));
    const auto slot = ctx.slots();  // what backward needs, in the context's activation slots
    int id = 0;
    for (const auto* saved : {&x, &q, &k, &v, &o, &lse, &y}) slot.save(id++, std::span<const T>(*saved));
    slot.save(id, in);
  }

  template <class Ctx>
  void backward(const Ctx& ctx, const hetmesh::model::encoder_batch_view& ev, std::span<const T> gout,
                std::span<T> gin) {
    const auto n = static_cast<std::size_t>(ev.size()), e = enc(), p = static_cast<std::size_t>(s.patch_dim);
    const auto d = static_cast<std::size_t>(s.width);
    check(gout.size(), n * d, "output gradient");
    const auto slot = ctx.slots();
    const auto x = slot.load(0), q = slot.load(1), k = slot.load(2), v = slot.load(3), o = slot.load(4),
               lse = slot.load(5), y = slot.load(6), in = slot.load(7);
    std::vector<T> dy(n * e, T(0)), d_o(n * e, T(0)), dq(n * e), dk(n * e), dv(n * e);
    add_xt_dy<T>(y, gout, store.g(1007), n, e, d);
    add_dy_wt<T>(gout, store.p(1007), dy, n, e, d);
    add_xt_dy<T>(o, dy, store.g(1006), n, e, e);
    add_dy_wt<T>(dy, store.p(1006), d_o, n, e, e);
    ctx.attention_backward(ev, attn(), scale(), q, k, v, o, lse, std::span<const T>(d_o), std::span<T>(dq),
                           std::span<T>(dk), std::span<T>(dv));
    std::vector<T> dx = dy;  // the residual
    const std::vector<T>* grads[3] = {&dq, &dk, &dv};
    for (int m = 0; m < 3; ++m) {
      add_xt_dy<T>(x, *grads[m], store.g(1003 + m), n, e, e);
      add_dy_wt<T>(*grads[m], store.p(1003 + m), dx, n, e, e);
    }
    add_xt_dy<T>(in, dx, store.g(1000), n, p, e);
    const auto frame = frames(ev);
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t j = 0; j < e; ++j) {
        store.g(1001)[j] += dx[t * e + j];
        store.g(1002)[frame[t] * e + j] += dx[t * e + j];
      }
    if (!gin.empty()) {  // raw patches need no gradient; the runtime passes none
      check(gin.size(), n * p, "input gradient");
      std::fill(gin.begin(), gin.end(), T(0));
      add_dy_wt<T>(dx, store.p(1000), gin, n, p, e);
    }
    for (int i = 0; i < 8; ++i) slot.release(i);
  }

  [[nodiscard]] std::vector<std::span<T>> parameters() { return store.parameters(); }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return store.gradients(); }
  /// (global id, value, gradient) of every tensor.
  [[nodiscard]] std::vector<hetmesh::train::model_tensor<T>> tensors() { return store.tensors(); }

 private:
  [[nodiscard]] std::size_t enc() const noexcept { return static_cast<std::size_t>(s.enc_width); }
  [[nodiscard]] std::size_t heads() const noexcept { return static_cast<std::size_t>(s.enc_heads); }
  [[nodiscard]] hetmesh::model::attention_shape attn() const noexcept {
    return {s.enc_heads, s.enc_heads, static_cast<int>(s.enc_width / s.enc_heads)};
  }
  [[nodiscard]] T scale() const noexcept {
    return T(1) / static_cast<T>(std::sqrt(static_cast<double>(s.enc_width / s.enc_heads)));
  }
  /// The frame of every row of the view: a piece holds tokens [begin, end) of its clip, and token t of a
  /// clip is patch t % patches of frame t / patches.
  [[nodiscard]] std::vector<std::size_t> frames(const hetmesh::model::encoder_batch_view& ev) const {
    std::vector<std::size_t> f(static_cast<std::size_t>(ev.size()));
    for (const auto& piece : ev.pieces)
      for (std::int64_t t = piece.tokens.begin; t < piece.tokens.end; ++t) {
        const std::int64_t frame = t / s.patches;
        if (frame >= s.max_frames)
          hetmesh::throw_error<hetmesh::invalid_argument>(
              "video_encoder: clip {} has frame {}; expected at most {} frames", piece.item, frame,
              s.max_frames);
        f[static_cast<std::size_t>(piece.offset + t - piece.tokens.begin)] = static_cast<std::size_t>(frame);
      }
    return f;
  }
  static void check(std::size_t got, std::size_t expected, const char* what) {
    if (got != expected)
      hetmesh::throw_error<hetmesh::invalid_argument>("video_encoder: {} has {} elements; expected {}", what,
                                                      got, expected);
  }
};

static_assert(hetmesh::model::check_encoder_stage<video_encoder<float>, float>());

}  // namespace custom
