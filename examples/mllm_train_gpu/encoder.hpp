// SPDX-License-Identifier: Apache-2.0
// The GPU example's encoders: the CPU example's transformer encoder (examples/mllm_train/encoder.hpp:
// input embedding and bias, residual layers of attention inside each item through the context and a SiLU
// MLP, a projection to the LLM width) with buffers in a hetmesh memory policy's memory and layers on
// math<T> kernels. Same tensor ids and parameters (uploaded from the CPU encoder) and the same math; the
// input callable (uploaded_input) copies the data plane's host features into the encoder's input buffer.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <hetmesh/model/encoder_batch.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/stage.hpp>

#include "mllm_train/encoder.hpp"
#include "mllm_train_gpu/math.hpp"
#include "mllm_train_gpu/tensors.hpp"

namespace mllm_gpu {

/// An encoder of modality `Modality` in M's memory (a hetmesh::model::encoder_stage).
template <class T, hetmesh::model::memory_policy M, class Modality>
class encoder {
 public:
  /// Opt-in for encoder_stage.
  using is_encoder_stage = void;
  /// The modality's name.
  static constexpr std::string_view modality = Modality::name;
  /// Its attention heads (the host encoder's: cfg.enc_heads).
  [[nodiscard]] int attention_heads() const noexcept { return static_cast<int>(cfg_.enc_heads); }

  /// The layers of `host` on `k`'s backend with buffers of `mem`; `k` outlives the encoder.
  encoder(const mllm::encoder<T, Modality>& host, const M& mem, const math<T>& k)
      : cfg_(host.cfg), in_width_(host.in_width), base_(host.tensor_base), k_(&k), w_(host.store, mem, k) {}

  /// ev.size() tokens of the input width.
  [[nodiscard]] std::int64_t input_size(const hetmesh::model::encoder_batch_view& ev) const noexcept {
    return ev.size() * in_width_;
  }
  /// ev.size() rows of the LLM width.
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::encoder_batch_view& ev) const noexcept {
    return ev.size() * cfg_.width;
  }

  /// out = encode(in), as mllm::encoder_layers::forward (the same slots).
  template <class Ctx>
  void forward(const Ctx& ctx, const hetmesh::model::encoder_batch_view& ev, std::span<const T> in,
               std::span<T> out) {
    const auto s = dims(ev);
    mllm::check_size(in.size(), s.n * s.i, "mllm_gpu::encoder", "input");
    mllm::check_size(out.size(), s.n * s.d, "mllm_gpu::encoder", "output");
    const auto slot = ctx.slots();
    const auto save = [&](int id, std::span<const T> x) { slot.save(id, x); };
    ws_.reset();
    save(0, in);
    auto x = ws_.take(s.n * s.e), xn = ws_.take(s.n * s.e), rstd = ws_.take(s.n), u = ws_.take(s.n * s.h),
         a = ws_.take(s.n * s.h), y = ws_.take(s.n * s.e), q = ws_.take(s.n * s.e), kk = ws_.take(s.n * s.e),
         v = ws_.take(s.n * s.e), o = ws_.take(s.n * s.e), lse = ws_.take(s.n * heads());
    k_->matmul(in.data(), w_.p(base_ + 0), x.data(), I(s.n), I(s.i), I(s.e));
    k_->add_bias(x.data(), w_.p(base_ + 1), I(s.n), I(s.e));
    for (int l = 0; l < cfg_.enc_layers; ++l) {
      const int at = base_ + 100 + 5 * l;  // attention inside items
      k_->rmsnorm_forward(x.data(), w_.p(at), xn.data(), rstd.data(), I(s.n), I(s.e), cfg_.norm_eps);
      k_->matmul(xn.data(), w_.p(at + 1), q.data(), I(s.n), I(s.e), I(s.e));
      k_->matmul(xn.data(), w_.p(at + 2), kk.data(), I(s.n), I(s.e), I(s.e));
      k_->matmul(xn.data(), w_.p(at + 3), v.data(), I(s.n), I(s.e), I(s.e));
      ctx.attention_forward(ev, shape(), scale(), std::span<const T>(q), std::span<const T>(kk),
                            std::span<const T>(v), o, lse);
      k_->matmul(o.data(), w_.p(at + 4), y.data(), I(s.n), I(s.e), I(s.e));
      int t = 200 + 8 * l;
      for (const auto saved : {x, rstd, q, kk, v, o, lse}) save(t++, saved);
      k_->add(x.data(), y.data(), I(x.size()));
      const int id = base_ + 10 + 3 * l;  // the MLP
      k_->rmsnorm_forward(x.data(), w_.p(id), xn.data(), rstd.data(), I(s.n), I(s.e), cfg_.norm_eps);
      k_->matmul(xn.data(), w_.p(id + 1), u.data(), I(s.n), I(s.e), I(s.h));
      k_->silu_forward(u.data(), a.data(), I(u.size()));
      k_->matmul(a.data(), w_.p(id + 2), y.data(), I(s.n), I(s.h), I(s.e));
      save(10 + 4 * l, x);
      save(11 + 4 * l, rstd);
      save(12 + 4 * l, u);
      k_->add(x.data(), y.data(), I(x.size()));
    }
    save(99, x);
    k_->matmul(x.data(), w_.p(base_ + 99), out.data(), I(s.n), I(s.e), I(s.d));
  }

  /// Every weight gradient for output gradient `gout`, and the input gradient into `gin` unless it is
  /// empty; releases every slot forward saved (mllm::encoder_layers::backward).
  template <class Ctx>
  void backward(const Ctx& ctx, const hetmesh::model::encoder_batch_view& ev, std::span<const T> gout,
                std::span<T> gin) {
    const auto s = dims(ev);
    mllm::check_size(gout.size(), s.n * s.d, "mllm_gpu::encoder", "output gradient");
    const auto slot = ctx.slots();
    ws_.reset();
    auto dx = ws_.zeros(s.n * s.e, *k_), xn = ws_.take(s.n * s.e), a = ws_.take(s.n * s.h),
         da = ws_.take(s.n * s.h), du = ws_.take(s.n * s.h), dxn = ws_.take(s.n * s.e),
         scratch = ws_.take(s.n), d_o = ws_.take(s.n * s.e), dq = ws_.take(s.n * s.e),
         dk = ws_.take(s.n * s.e), dv = ws_.take(s.n * s.e);
    k_->add_xt_dy(slot.load(99).data(), gout.data(), w_.g(base_ + 99), I(s.n), I(s.e), I(s.d));
    k_->add_dy_wt(gout.data(), w_.p(base_ + 99), dx.data(), I(s.n), I(s.e), I(s.d));
    slot.release(99);
    for (int l = cfg_.enc_layers - 1; l >= 0; --l) {
      const int id = base_ + 10 + 3 * l;
      const T* x = slot.load(10 + 4 * l).data();
      const T* rstd = slot.load(11 + 4 * l).data();
      const T* u = slot.load(12 + 4 * l).data();
      k_->rmsnorm_forward(x, w_.p(id), xn.data(), scratch.data(), I(s.n), I(s.e), cfg_.norm_eps);  // xn again
      k_->silu_forward(u, a.data(), I(a.size()));
      k_->add_xt_dy(a.data(), dx.data(), w_.g(id + 2), I(s.n), I(s.h), I(s.e));
      k_->fill(da.data(), T(0), I(da.size()));
      k_->add_dy_wt(dx.data(), w_.p(id + 2), da.data(), I(s.n), I(s.h), I(s.e));
      k_->silu_backward(u, da.data(), du.data(), I(du.size()));
      k_->add_xt_dy(xn.data(), du.data(), w_.g(id + 1), I(s.n), I(s.e), I(s.h));
      k_->fill(dxn.data(), T(0), I(dxn.size()));
      k_->add_dy_wt(du.data(), w_.p(id + 1), dxn.data(), I(s.n), I(s.e), I(s.h));
      k_->rmsnorm_gain_grad(x, rstd, dxn.data(), w_.g(id), I(s.n), I(s.e));
      k_->rmsnorm_input_grad(x, w_.p(id), rstd, dxn.data(), dx.data(), I(s.n), I(s.e));
      for (int j = 0; j < 3; ++j) slot.release(10 + 4 * l + j);
      // The attention sublayer: dx is the gradient of its output (and residual).
      const int at = base_ + 100 + 5 * l, t = 200 + 8 * l;
      const auto xa = slot.load(t), ra = slot.load(t + 1), oa = slot.load(t + 5);
      k_->rmsnorm_forward(xa.data(), w_.p(at), xn.data(), scratch.data(), I(s.n), I(s.e), cfg_.norm_eps);
      k_->add_xt_dy(oa.data(), dx.data(), w_.g(at + 4), I(s.n), I(s.e), I(s.e));
      k_->fill(d_o.data(), T(0), I(d_o.size()));
      k_->add_dy_wt(dx.data(), w_.p(at + 4), d_o.data(), I(s.n), I(s.e), I(s.e));
      ctx.attention_backward(ev, shape(), scale(), slot.load(t + 2), slot.load(t + 3), slot.load(t + 4), oa,
                             slot.load(t + 6), std::span<const T>(d_o), dq, dk, dv);
      k_->fill(dxn.data(), T(0), I(dxn.size()));
      const std::span<T> grads[3] = {dq, dk, dv};
      for (int m = 0; m < 3; ++m) {
        k_->add_xt_dy(xn.data(), grads[m].data(), w_.g(at + 1 + m), I(s.n), I(s.e), I(s.e));
        k_->add_dy_wt(grads[m].data(), w_.p(at + 1 + m), dxn.data(), I(s.n), I(s.e), I(s.e));
      }
      k_->rmsnorm_gain_grad(xa.data(), ra.data(), dxn.data(), w_.g(at), I(s.n), I(s.e));
      k_->rmsnorm_input_grad(xa.data(), w_.p(at), ra.data(), dxn.data(), dx.data(), I(s.n), I(s.e));
      for (int j = 0; j < 7; ++j) slot.release(t + j);
    }
    const auto in = slot.load(0);
    k_->add_xt_dy(in.data(), dx.data(), w_.g(base_ + 0), I(s.n), I(s.i), I(s.e));
    k_->add_column_sums(dx.data(), w_.g(base_ + 1), I(s.n), I(s.e));
    if (!gin.empty()) {
      mllm::check_size(gin.size(), s.n * s.i, "mllm_gpu::encoder", "input gradient");
      k_->fill(gin.data(), T(0), I(gin.size()));
      k_->add_dy_wt(dx.data(), w_.p(base_ + 0), gin.data(), I(s.n), I(s.i), I(s.e));
    }
    slot.release(0);
  }

  /// Parameter tensors, in id order (M's memory).
  [[nodiscard]] std::vector<std::span<T>> parameters() { return w_.parameters(); }
  /// Their gradients, in the same order.
  [[nodiscard]] std::vector<std::span<T>> gradients() { return w_.gradients(); }
  /// (global id, value, gradient) of every tensor, in id order (M's memory).
  [[nodiscard]] std::vector<mllm::tensor_ref<T>> tensors() { return w_.refs(); }

 private:
  struct dims_t {
    std::size_t n, i, e, h, d;
  };
  static std::int64_t I(std::size_t x) noexcept { return static_cast<std::int64_t>(x); }
  [[nodiscard]] dims_t dims(const hetmesh::model::encoder_batch_view& ev) const noexcept {
    const auto z = [](auto x) { return static_cast<std::size_t>(x); };
    return {z(ev.size()), z(in_width_), z(cfg_.enc_width), z(cfg_.enc_hidden), z(cfg_.width)};
  }
  [[nodiscard]] std::size_t heads() const noexcept { return static_cast<std::size_t>(cfg_.enc_heads); }
  [[nodiscard]] hetmesh::model::attention_shape shape() const noexcept {
    return {cfg_.enc_heads, cfg_.enc_heads, static_cast<int>(cfg_.enc_width / cfg_.enc_heads)};
  }
  [[nodiscard]] T scale() const noexcept {
    return T(1) / static_cast<T>(std::sqrt(static_cast<double>(cfg_.enc_width / cfg_.enc_heads)));
  }

  mllm::config cfg_;
  std::int64_t in_width_ = 1;
  int base_ = 0;
  const math<T>* k_;
  tensor_set<T, M> w_;
  workspace<T, M> ws_;
};

/// An encoder's input callable over M's memory: `host` (a callable writing the view's input into host
/// memory, e.g. mllm::step_source::input) into a host vector, then uploaded into the encoder's buffer.
template <class Host, hetmesh::model::memory_policy M>
struct uploaded_input {
  Host host;  ///< writes input_size(view) elements of host memory
  M mem;      ///< the encoder's memory

  template <class T>
  void operator()(const hetmesh::model::encoder_batch_view& v, std::span<T> out) const {
    std::vector<T> h(out.size());
    host(v, std::span<T>(h));
    mem.upload(out, std::span<const T>(h));
  }
};

static_assert(hetmesh::model::check_encoder_stage<
              encoder<float, hetmesh::model::host_memory, hetmesh::model::vision_modality>, float>());

}  // namespace mllm_gpu
