// SPDX-License-Identifier: Apache-2.0
// A host model behind train::system's device path on a real GPU: the runtime hands stages device memory;
// these adapters stage what the host model reads to the host and what it writes back to the device
// (cuda::device_memory's upload and download), as a CPU reference of a GPU model would. Gradients live on
// the device (the runtime zeroes and reduces them there); each call adds the host model's increments to
// them. Used by tests/cuda/train.cpp to compare a one-rank NCCL step with the host run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include <hetmesh/cuda/device_memory.hpp>
#include <hetmesh/model/attention.hpp>
#include <hetmesh/model/encoder_batch.hpp>
#include <hetmesh/model/micro_batch.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/model/token_mixing.hpp>

namespace cudatest {

/// Host <-> device copies for one call; the buffers live until the stager is cleared.
template <class T>
struct stager {
  hetmesh::cuda::device_memory mem;
  std::deque<std::vector<T>> host;
  std::deque<hetmesh::cuda::device_memory::buffer<T>> dev;

  std::span<T> to_host(std::span<const T> d) {
    auto& h = host.emplace_back(d.size());
    mem.download(std::span<T>(h), d);
    return h;
  }
  std::span<T> to_device(std::span<const T> h) {
    auto s = scratch(h.size());
    mem.upload(s, h);
    return s;
  }
  std::span<T> scratch(std::size_t n) {
    auto& b = dev.emplace_back();
    b.resize(n);
    return b.span();
  }
  void back(std::span<T> d, std::span<const T> h) { mem.upload(d, h); }
  void clear() {
    mem.synchronize();
    host.clear();
    dev.clear();
  }
};

/// The slot handle of a device context in host views.
template <class Slot, class T>
struct staged_slot {
  Slot real;
  stager<T>* st;
  void save(int tensor, std::span<const T> data) const {
    real.save(tensor, std::span<const T>(st->to_device(data)));
  }
  [[nodiscard]] std::span<const T> load(int tensor) const { return st->to_host(real.load(tensor)); }
  void release(int tensor) const { real.release(tensor); }
};

/// A backbone stage's device context in host views (attention staged through the device).
template <class Ctx, class T>
struct staged_context {
  const Ctx* real;
  stager<T>* st;
  int stage = 0;
  int micro_batch = 0;

  void attention_forward(hetmesh::model::attention_shape shape, T scale, std::span<const T> q,
                         std::span<const T> k, std::span<const T> v, std::span<T> out,
                         std::span<T> lse) const {
    auto dout = st->scratch(out.size()), dlse = st->scratch(lse.size());
    real->attention_forward(shape, scale, st->to_device(q), st->to_device(k), st->to_device(v), dout, dlse);
    st->mem.download(out, std::span<const T>(dout));
    st->mem.download(lse, std::span<const T>(dlse));
  }
  void attention_backward(hetmesh::model::attention_shape shape, T scale, std::span<const T> q,
                          std::span<const T> k, std::span<const T> v, std::span<const T> out,
                          std::span<const T> lse, std::span<const T> dout, std::span<T> dq, std::span<T> dk,
                          std::span<T> dv) const {
    auto gq = st->scratch(dq.size()), gk = st->scratch(dk.size()), gv = st->scratch(dv.size());
    real->attention_backward(shape, scale, st->to_device(q), st->to_device(k), st->to_device(v),
                             st->to_device(out), st->to_device(lse), st->to_device(dout), gq, gk, gv);
    st->mem.download(dq, std::span<const T>(gq));
    st->mem.download(dk, std::span<const T>(gk));
    st->mem.download(dv, std::span<const T>(gv));
  }
  [[nodiscard]] auto slots() const { return staged_slot<decltype(real->slots()), T>{real->slots(), st}; }
};

/// Device mirrors of a host model's parameters and gradients.
template <class T>
struct device_tensors {
  std::vector<hetmesh::cuda::device_memory::buffer<T>> param, grad;

  template <class Inner>
  void mirror(Inner& inner, const hetmesh::cuda::device_memory& mem) {
    for (auto p : inner.parameters()) {
      param.emplace_back().resize(p.size());
      mem.upload(param.back().span(), std::span<const T>(p));
      grad.emplace_back().resize(p.size());
      mem.fill(grad.back().span(), T(0));
    }
    mem.synchronize();
  }
  /// Device gradients += the host model's, which are then zeroed (each call's increment moves once).
  template <class Inner>
  void add_increments(Inner& inner, stager<T>& st) {
    std::size_t i = 0;
    for (auto g : inner.gradients()) {
      st.mem.add(grad[i++].span(), std::span<const T>(st.to_device(std::span<const T>(g))));
      std::fill(g.begin(), g.end(), T(0));
    }
  }
  std::vector<std::span<T>> params() {
    std::vector<std::span<T>> out;
    for (auto& b : param) out.push_back(b.span());
    return out;
  }
  std::vector<std::span<T>> grads() {
    std::vector<std::span<T>> out;
    for (auto& b : grad) out.push_back(b.span());
    return out;
  }
};

/// A host backbone model behind the device path.
template <class Inner, class T>
struct staged_stage {
  using is_backbone_stage = void;
  /// The wrapped stage's token mixing.
  static constexpr hetmesh::model::token_mixing token_mixing = Inner::token_mixing;
  Inner inner;
  stager<T> st{};
  device_tensors<T> dev{};

  explicit staged_stage(Inner in) : inner(std::move(in)) { dev.mirror(inner, st.mem); }

  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& v, int stage) const {
    return inner.output_size(v, stage);
  }
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& v) const {
    return inner.output_size(v);
  }
  template <class Ctx>
  void forward(const Ctx& ctx, const hetmesh::model::micro_batch_view& v, std::span<const T> in,
               std::span<T> out) {
    std::vector<T> h(out.size());
    inner.forward(staged_context<Ctx, T>{&ctx, &st, ctx.stage, ctx.micro_batch}, v,
                  std::span<const T>(st.to_host(in)), std::span<T>(h));
    st.back(out, std::span<const T>(h));
    st.clear();
  }
  template <class Ctx>
  void backward(const Ctx& ctx, const hetmesh::model::micro_batch_view& v, std::span<const T> gout,
                std::span<T> gin) {
    std::vector<T> h(gin.size());
    inner.backward(staged_context<Ctx, T>{&ctx, &st, ctx.stage, ctx.micro_batch}, v,
                   std::span<const T>(st.to_host(gout)), std::span<T>(h));
    st.back(gin, std::span<const T>(h));
    dev.add_increments(inner, st);
    st.clear();
  }
  [[nodiscard]] std::vector<std::span<T>> parameters() { return dev.params(); }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return dev.grads(); }
};

/// An encoder's device context in host views (slots only: the test's encoders attend to nothing).
template <class Ctx, class T>
struct staged_encoder_context {
  Ctx* real;
  stager<T>* st;
  [[nodiscard]] auto slots() const { return staged_slot<decltype(real->slots()), T>{real->slots(), st}; }
};

/// A host encoder behind the device path.
template <class Inner, class T>
struct staged_encoder {
  using is_encoder_stage = void;
  static constexpr auto modality = Inner::modality;
  Inner inner;
  stager<T> st{};
  device_tensors<T> dev{};

  explicit staged_encoder(Inner in) : inner(std::move(in)) { dev.mirror(inner, st.mem); }

  [[nodiscard]] int attention_heads() const { return inner.attention_heads(); }
  [[nodiscard]] std::int64_t input_size(const hetmesh::model::encoder_batch_view& v) const {
    return inner.input_size(v);
  }
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::encoder_batch_view& v) const {
    return inner.output_size(v);
  }
  template <class Ctx>
  void forward(Ctx& ctx, const hetmesh::model::encoder_batch_view& v, std::span<const T> in,
               std::span<T> out) {
    std::vector<T> h(out.size());
    inner.forward(staged_encoder_context<Ctx, T>{&ctx, &st}, v, std::span<const T>(st.to_host(in)),
                  std::span<T>(h));
    st.back(out, std::span<const T>(h));
    st.clear();
  }
  template <class Ctx>
  void backward(Ctx& ctx, const hetmesh::model::encoder_batch_view& v, std::span<const T> gout,
                std::span<T> gin) {
    std::vector<T> h(gin.size());
    inner.backward(staged_encoder_context<Ctx, T>{&ctx, &st}, v, std::span<const T>(st.to_host(gout)),
                   std::span<T>(h));
    if (!gin.empty()) st.back(gin, std::span<const T>(h));
    dev.add_increments(inner, st);
    st.clear();
  }
  [[nodiscard]] std::vector<std::span<T>> parameters() { return dev.params(); }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return dev.grads(); }
};

/// An encoder input callable behind the device path: the host input, uploaded.
template <class Input>
struct staged_input {
  Input inner;
  template <class T>
  void operator()(const hetmesh::model::encoder_batch_view& v, std::span<T> out) const {
    std::vector<T> h(out.size());
    inner(v, std::span<T>(h));
    hetmesh::cuda::device_memory{}.upload(out, std::span<const T>(h));
  }
};

/// The CPU reference kernel behind the device path: tensors downloaded, computed, results uploaded.
struct staged_reference_attention {
  hetmesh::model::reference_attention inner;
  template <class T>
  void forward(const hetmesh::model::attention_block<T>& b,
               hetmesh::model::attention_forward_out<T> o) const {
    stager<T> st;
    auto h = b;
    h.q = st.to_host(b.q), h.k = st.to_host(b.k), h.v = st.to_host(b.v);
    std::vector<T> out(o.out.size()), lse(o.lse.size());
    inner.forward(h, hetmesh::model::attention_forward_out<T>{out, lse});
    st.back(o.out, std::span<const T>(out));
    st.back(o.lse, std::span<const T>(lse));
  }
  template <class T>
  void backward(const hetmesh::model::attention_block<T>& b,
                hetmesh::model::attention_backward_io<T> io) const {
    stager<T> st;
    auto h = b;
    h.q = st.to_host(b.q), h.k = st.to_host(b.k), h.v = st.to_host(b.v);
    const auto dq = st.to_host(io.dq), dk = st.to_host(io.dk), dv = st.to_host(io.dv);  // accumulated into
    inner.backward(h, hetmesh::model::attention_backward_io<T>{st.to_host(io.dout), st.to_host(io.lse),
                                                               st.to_host(io.delta), dq, dk, dv});
    st.back(io.dq, std::span<const T>(dq));
    st.back(io.dk, std::span<const T>(dk));
    st.back(io.dv, std::span<const T>(dv));
  }
};

}  // namespace cudatest
