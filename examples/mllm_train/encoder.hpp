// SPDX-License-Identifier: Apache-2.0
// The example's encoders (hetmesh::model::encoder_stage models): a transformer encoder of a modality's
// features. Vision reads one patch of `patch` features per output token, audio one frame of `frame`
// features; both embed it to d_enc, run `enc_layers` residual layers (RMSNorm, attention inside the item
// over `enc_heads` heads; RMSNorm, an MLP with SiLU) and project to the LLM width. Attention goes through the
// context (train::encoder_context): whole items on this rank, a long item split into pieces by long-short
// sequence parallelism by Ulysses over its group, so the item encodes exactly as it would whole.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <hetmesh/model/encoder_batch.hpp>
#include <hetmesh/model/stage.hpp>

#include "mllm_train/layers.hpp"

namespace mllm {

/// The layers of an encoder (encoder<T, Modality> below), one type for every modality so that their
/// code compiles once. Tensor ids (global, beside the backbone's): tensor_base + {0 input embedding
/// [in][d_enc], 1 its bias [d_enc], 10 + 3l + {0 norm gain [d_enc], 1 MLP up [d_enc][hidden], 2 MLP down
/// [hidden][d_enc]} and 100 + 5l + {0 attention norm gain [d_enc], 1 q, 2 k, 3 v, 4 output [d_enc][d_enc]}
/// for layer l, 99 projection [d_enc][D]}.
template <class T>
struct encoder_layers {
  config cfg;
  std::int64_t in_width = 1;  ///< features per input token: cfg.patch (vision) or cfg.frame (others)
  int tensor_base = 0;        ///< the first tensor id of this encoder
  tensor_store<T> store;

  /// The layers of `c` for `in_width` features per token, tensor ids from `tensor_base`, parameters from
  /// `seed` (equal on every rank). Throws invalid_argument on a bad config. O(parameters).
  encoder_layers(const config& c, std::uint64_t seed, int tensor_base_, std::int64_t in_width_);

  /// ev.size() tokens of in_width features.
  [[nodiscard]] std::int64_t input_size(const hetmesh::model::encoder_batch_view& ev) const noexcept {
    return ev.size() * in_width;
  }
  /// ev.size() rows of the LLM width.
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::encoder_batch_view& ev) const noexcept {
    return ev.size() * cfg.width;
  }

  /// out = encode(in), attention inside items through ctx.attention_forward (collective over a split
  /// item's group). Saves (slots 0, 200 + 8l + {0..6}, 10 + 4l + {0, 1, 2}, 99) the input, each layer's
  /// attention input, RMS scale, q, k, v, output and lse, its MLP input, RMS scale and pre-activation, and
  /// the last hidden rows. Throws invalid_argument on mis-sized buffers. O(tokens * (in + layers * (hidden
  /// + d_enc) + D) * d_enc + layers * item tokens^2 * d_enc).
  template <class Ctx>
  void forward(const Ctx& ctx, const hetmesh::model::encoder_batch_view& ev, std::span<const T> in,
               std::span<T> out);

  /// Adds every weight gradient for output gradient `gout`; writes the input gradient into `gin` unless it
  /// is empty (raw features need none). Releases every slot forward saved. O(as forward).
  template <class Ctx>
  void backward(const Ctx& ctx, const hetmesh::model::encoder_batch_view& ev, std::span<const T> gout,
                std::span<T> gin);

  /// Parameter tensors, in id order.
  [[nodiscard]] std::vector<std::span<T>> parameters() { return store.parameters(); }
  /// Their gradients, in the same order.
  [[nodiscard]] std::vector<std::span<T>> gradients() { return store.gradients(); }
  /// (global id, value, gradient) of every tensor, in id order: what a trainer checkpoints by.
  [[nodiscard]] std::vector<tensor_ref<T>> tensors() { return tensor_refs(store); }

 private:
  [[nodiscard]] int heads() const noexcept { return cfg.enc_heads; }
  [[nodiscard]] hetmesh::model::attention_shape shape() const noexcept {
    return {cfg.enc_heads, cfg.enc_heads, static_cast<int>(cfg.enc_width / cfg.enc_heads)};
  }
  [[nodiscard]] T scale() const noexcept {
    return T(1) / static_cast<T>(std::sqrt(static_cast<double>(cfg.enc_width / cfg.enc_heads)));
  }
  /// The attention sublayer of layer l backward: dx holds the gradient of its output (and residual) and
  /// gets the gradient of its input added; its weights' gradients are added; its slots are released.
  template <class Ctx>
  void attention_backward(const Ctx& ctx, const hetmesh::model::encoder_batch_view& ev, int l,
                          std::vector<T>& dx) {
    const auto s = dims(ev);
    const int at = tensor_base + 100 + 5 * l, t = 200 + 8 * l;
    const auto slot = ctx.slots();
    const auto x = slot.load(t), rstd = slot.load(t + 1), q = slot.load(t + 2), k = slot.load(t + 3),
               v = slot.load(t + 4), o = slot.load(t + 5), lse = slot.load(t + 6);
    std::vector<T> xn(s.n * s.e), scratch(s.n), d_o(s.n * s.e, T(0)), dq(s.n * s.e), dk(s.n * s.e),
        dv(s.n * s.e), dxn(s.n * s.e, T(0));
    rmsnorm_forward<T>(x, store.p(at), xn, scratch, s.n, s.e, cfg.norm_eps);  // xn again
    add_xt_dy<T>(o, dx, store.g(at + 4), s.n, s.e, s.e);
    add_dy_wt<T>(dx, store.p(at + 4), d_o, s.n, s.e, s.e);
    ctx.attention_backward(ev, shape(), scale(), q, k, v, o, lse, std::span<const T>(d_o), std::span<T>(dq),
                           std::span<T>(dk), std::span<T>(dv));
    const std::vector<T>* grads[3] = {&dq, &dk, &dv};
    for (int m = 0; m < 3; ++m) {
      add_xt_dy<T>(xn, *grads[m], store.g(at + 1 + m), s.n, s.e, s.e);
      add_dy_wt<T>(*grads[m], store.p(at + 1 + m), dxn, s.n, s.e, s.e);
    }
    rmsnorm_gain_grad<T>(x, rstd, dxn, store.g(at), s.n, s.e);
    rmsnorm_input_grad<T>(x, store.p(at), rstd, dxn, dx, s.n, s.e);  // adds onto the residual's
    for (int j = 0; j < 7; ++j) slot.release(t + j);
  }
  struct dims_t {
    std::size_t n, i, e, h, d;
  };
  [[nodiscard]] dims_t dims(const hetmesh::model::encoder_batch_view& ev) const noexcept {
    return {static_cast<std::size_t>(ev.size()), static_cast<std::size_t>(in_width),
            static_cast<std::size_t>(cfg.enc_width), static_cast<std::size_t>(cfg.enc_hidden),
            static_cast<std::size_t>(cfg.width)};
  }
};

template <class T>
encoder_layers<T>::encoder_layers(const config& c, std::uint64_t seed, int tensor_base_,
                                  std::int64_t in_width_)
    : cfg(c), in_width(in_width_), tensor_base(tensor_base_) {
  check_config(c);
  const auto i = static_cast<std::size_t>(in_width), e = static_cast<std::size_t>(c.enc_width),
             h = static_cast<std::size_t>(c.enc_hidden), d = static_cast<std::size_t>(c.width);
  store.add(tensor_base + 0, i * e, seed, 1.0 / std::sqrt(static_cast<double>(i)));
  store.add(tensor_base + 1, e, seed, 0.1);
  for (int l = 0; l < c.enc_layers; ++l) {
    store.add(tensor_base + 100 + 5 * l, e, seed, 0.1, 1.0);
    for (int m = 1; m <= 4; ++m)
      store.add(tensor_base + 100 + 5 * l + m, e * e, seed, 1.0 / std::sqrt(static_cast<double>(e)));
    store.add(tensor_base + 10 + 3 * l, e, seed, 0.1, 1.0);
    store.add(tensor_base + 11 + 3 * l, e * h, seed, 1.0 / std::sqrt(static_cast<double>(e)));
    store.add(tensor_base + 12 + 3 * l, h * e, seed, 1.0 / std::sqrt(static_cast<double>(h)));
  }
  store.add(tensor_base + 99, e * d, seed, 1.0 / std::sqrt(static_cast<double>(e)));
}

template <class T>
template <class Ctx>
void encoder_layers<T>::forward(const Ctx& ctx, const hetmesh::model::encoder_batch_view& ev,
                                std::span<const T> in, std::span<T> out) {
  const auto s = dims(ev);
  check_size(in.size(), s.n * s.i, "mllm::encoder", "input");
  check_size(out.size(), s.n * s.d, "mllm::encoder", "output");
  const auto slot = ctx.slots();
  slot.save(0, in);
  std::vector<T> x(s.n * s.e), xn(s.n * s.e), rstd(s.n), u(s.n * s.h), a(s.n * s.h), y(s.n * s.e);
  matmul<T>(in, store.p(tensor_base + 0), x, s.n, s.i, s.e);
  const auto b = store.p(tensor_base + 1);
  for (std::size_t t = 0; t < s.n; ++t)
    for (std::size_t j = 0; j < s.e; ++j) x[t * s.e + j] += b[j];
  std::vector<T> q(s.n * s.e), k(s.n * s.e), v(s.n * s.e), o(s.n * s.e), lse(s.n * heads());
  for (int l = 0; l < cfg.enc_layers; ++l) {
    const int at = tensor_base + 100 + 5 * l;  // attention inside items
    rmsnorm_forward<T>(x, store.p(at), xn, rstd, s.n, s.e, cfg.norm_eps);
    matmul<T>(xn, store.p(at + 1), q, s.n, s.e, s.e);
    matmul<T>(xn, store.p(at + 2), k, s.n, s.e, s.e);
    matmul<T>(xn, store.p(at + 3), v, s.n, s.e, s.e);
    ctx.attention_forward(ev, shape(), scale(), std::span<const T>(q), std::span<const T>(k),
                          std::span<const T>(v), std::span<T>(o), std::span<T>(lse));
    matmul<T>(o, store.p(at + 4), y, s.n, s.e, s.e);
    int t = 200 + 8 * l;
    for (const auto* saved : {&x, &rstd, &q, &k, &v, &o, &lse}) slot.save(t++, std::span<const T>(*saved));
    for (std::size_t j = 0; j < x.size(); ++j) x[j] += y[j];
    const int id = tensor_base + 10 + 3 * l;  // the MLP
    rmsnorm_forward<T>(x, store.p(id), xn, rstd, s.n, s.e, cfg.norm_eps);
    matmul<T>(xn, store.p(id + 1), u, s.n, s.e, s.h);
    silu_forward<T>(u, a);
    matmul<T>(a, store.p(id + 2), y, s.n, s.h, s.e);
    slot.save(10 + 4 * l, std::span<const T>(x));
    slot.save(11 + 4 * l, std::span<const T>(rstd));
    slot.save(12 + 4 * l, std::span<const T>(u));
    for (std::size_t k = 0; k < x.size(); ++k) x[k] += y[k];
  }
  slot.save(99, std::span<const T>(x));
  matmul<T>(x, store.p(tensor_base + 99), out, s.n, s.e, s.d);
}

template <class T>
template <class Ctx>
void encoder_layers<T>::backward(const Ctx& ctx, const hetmesh::model::encoder_batch_view& ev,
                                 std::span<const T> gout, std::span<T> gin) {
  const auto s = dims(ev);
  check_size(gout.size(), s.n * s.d, "mllm::encoder", "output gradient");
  const auto slot = ctx.slots();
  std::vector<T> dx(s.n * s.e, T(0)), xn(s.n * s.e), a(s.n * s.h), da(s.n * s.h, T(0)), du(s.n * s.h),
      dxn(s.n * s.e), scratch(s.n);
  add_xt_dy<T>(slot.load(99), gout, store.g(tensor_base + 99), s.n, s.e, s.d);
  add_dy_wt<T>(gout, store.p(tensor_base + 99), dx, s.n, s.e, s.d);
  slot.release(99);
  for (int l = cfg.enc_layers - 1; l >= 0; --l) {
    const int id = tensor_base + 10 + 3 * l;
    const auto x = slot.load(10 + 4 * l), rstd = slot.load(11 + 4 * l), u = slot.load(12 + 4 * l);
    rmsnorm_forward<T>(x, store.p(id), xn, scratch, s.n, s.e, cfg.norm_eps);  // xn again
    silu_forward<T>(u, a);
    add_xt_dy<T>(a, dx, store.g(id + 2), s.n, s.h, s.e);  // dx: the gradient of the layer's output
    std::fill(da.begin(), da.end(), T(0));
    add_dy_wt<T>(dx, store.p(id + 2), da, s.n, s.h, s.e);
    silu_backward<T>(u, da, du);
    add_xt_dy<T>(xn, du, store.g(id + 1), s.n, s.e, s.h);
    std::fill(dxn.begin(), dxn.end(), T(0));
    add_dy_wt<T>(du, store.p(id + 1), dxn, s.n, s.e, s.h);
    rmsnorm_gain_grad<T>(x, rstd, dxn, store.g(id), s.n, s.e);
    rmsnorm_input_grad<T>(x, store.p(id), rstd, dxn, dx, s.n, s.e);  // adds onto the residual's
    for (int k = 0; k < 3; ++k) slot.release(10 + 4 * l + k);
    attention_backward(ctx, ev, l, dx);
  }
  const auto in = slot.load(0);
  add_xt_dy<T>(in, dx, store.g(tensor_base + 0), s.n, s.i, s.e);
  auto db = store.g(tensor_base + 1);
  for (std::size_t t = 0; t < s.n; ++t)
    for (std::size_t j = 0; j < s.e; ++j) db[j] += dx[t * s.e + j];
  if (!gin.empty()) {
    check_size(gin.size(), s.n * s.i, "mllm::encoder", "input gradient");
    std::fill(gin.begin(), gin.end(), T(0));
    add_dy_wt<T>(dx, store.p(tensor_base + 0), gin, s.n, s.i, s.e);
  }
  slot.release(0);
}

/// An encoder for modality `Modality` (a tag with a `name`: hetmesh::model::vision_modality,
/// audio_modality): encoder_layers with tensor ids from 10000 for vision, 20000 for audio, 30000 for any
/// other modality (one more encoder), reading cfg.patch features per token for vision, cfg.frame for others.
template <class T, class Modality>
struct encoder : encoder_layers<T> {
  /// Opt-in for encoder_stage.
  using is_encoder_stage = void;
  /// The modality's name ("vision", "audio").
  static constexpr std::string_view modality = Modality::name;
  /// Its attention heads (cfg.enc_heads): long-short SP's groups divide them.
  [[nodiscard]] int attention_heads() const noexcept { return static_cast<int>(this->cfg.enc_heads); }
  /// The encoder of `c` with parameters from `seed` (equal on every rank).
  encoder(const config& c, std::uint64_t seed)
      : encoder_layers<T>(c, seed,
                          modality == std::string_view("vision")  ? 10000
                          : modality == std::string_view("audio") ? 20000
                                                                  : 30000,
                          modality == std::string_view("vision") ? c.patch : c.frame) {}
};

/// The example's vision encoder: patches of cfg.patch features.
template <class T>
using vision_encoder = encoder<T, hetmesh::model::vision_modality>;
/// The example's audio encoder: frames of cfg.frame features.
template <class T>
using audio_encoder = encoder<T, hetmesh::model::audio_modality>;

static_assert(hetmesh::model::check_encoder_stage<vision_encoder<float>, float>());
static_assert(hetmesh::model::check_encoder_stage<audio_encoder<double>, double>());

}  // namespace mllm
