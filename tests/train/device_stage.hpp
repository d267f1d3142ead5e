// SPDX-License-Identifier: Apache-2.0
// A host model through train::system's device path on a CPU: the runtime, over comm::emulated_device and
// model::emulated_device_memory, hands stages emulated device pointers (the CPU cannot dereference them);
// these adapters stand where a GPU model's kernels would, mapping each span to host memory before the
// host model (tiny_lm, tiny_stack, attention_encoder) computes, and mapping the spans the model hands back
// to the runtime (attention calls, saved activations, parameters and gradients) to device views. A runtime
// that read or wrote a device buffer on the CPU, or passed a host buffer where device memory belongs, fails
// these runs; a correct one gives the host run's gradients bit for bit.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <hetmesh/core/memory_space.hpp>
#include <hetmesh/model/attention.hpp>
#include <hetmesh/model/emulated_attention.hpp>
#include <hetmesh/model/encoder_batch.hpp>
#include <hetmesh/model/micro_batch.hpp>
#include <hetmesh/model/reference_attention.hpp>

namespace traintest {

template <class T>
std::span<T> host_of(std::span<T> s) {
  return hetmesh::emulated::to_host(s, "device_stage");
}
template <class T>
std::span<T> device_of(std::span<T> s) {
  return hetmesh::emulated::to_device(s);
}

/// The reference kernel behind the device path: the library's emulated adapter over the CPU reference.
using device_reference_attention = hetmesh::model::emulated_attention<>;

/// The slot handle of a device context, in host views: saves host data as device views, loads device
/// data as host views.
template <class Slot>
struct host_view_slot {
  Slot real;
  template <class T>
  void save(int tensor, std::span<const T> data) const {
    real.save(tensor, device_of(data));
  }
  [[nodiscard]] auto load(int tensor) const { return host_of(real.load(tensor)); }
  void release(int tensor) const { real.release(tensor); }
};

/// A backbone stage's device context in host views: attention calls and slots map host spans to device
/// views and back. Carries the fields host models read (stage, micro_batch).
template <class Ctx, class T>
struct host_view_context {
  const Ctx* real;
  int stage = 0;
  int micro_batch = 0;

  void attention_forward(hetmesh::model::attention_shape shape, T scale, std::span<const T> q,
                         std::span<const T> k, std::span<const T> v, std::span<T> out,
                         std::span<T> lse) const {
    real->attention_forward(shape, scale, device_of(q), device_of(k), device_of(v), device_of(out),
                            device_of(lse));
  }
  void attention_backward(hetmesh::model::attention_shape shape, T scale, std::span<const T> q,
                          std::span<const T> k, std::span<const T> v, std::span<const T> out,
                          std::span<const T> lse, std::span<const T> dout, std::span<T> dq, std::span<T> dk,
                          std::span<T> dv) const {
    real->attention_backward(shape, scale, device_of(q), device_of(k), device_of(v), device_of(out),
                             device_of(lse), device_of(dout), device_of(dq), device_of(dk), device_of(dv));
  }
  [[nodiscard]] auto slots() const { return host_view_slot<decltype(real->slots())>{real->slots()}; }
};

/// An encoder's device context in host views.
template <class Ctx, class T>
struct host_view_encoder_context {
  Ctx* real;

  void attention_forward(const hetmesh::model::encoder_batch_view& view,
                         hetmesh::model::attention_shape shape, T scale, std::span<const T> q,
                         std::span<const T> k, std::span<const T> v, std::span<T> out,
                         std::span<T> lse) const {
    real->attention_forward(view, shape, scale, device_of(q), device_of(k), device_of(v), device_of(out),
                            device_of(lse));
  }
  void attention_backward(const hetmesh::model::encoder_batch_view& view,
                          hetmesh::model::attention_shape shape, T scale, std::span<const T> q,
                          std::span<const T> k, std::span<const T> v, std::span<const T> out,
                          std::span<const T> lse, std::span<const T> dout, std::span<T> dq, std::span<T> dk,
                          std::span<T> dv) const {
    real->attention_backward(view, shape, scale, device_of(q), device_of(k), device_of(v), device_of(out),
                             device_of(lse), device_of(dout), device_of(dq), device_of(dk), device_of(dv));
  }
  [[nodiscard]] auto slots() const { return host_view_slot<decltype(real->slots())>{real->slots()}; }
};

/// Parameters or gradients of a host model as device views.
template <class R>
auto device_views(R&& spans) {
  using span_t = std::ranges::range_value_t<R>;
  std::vector<span_t> out;
  for (auto s : spans) out.push_back(device_of(span_t(s)));
  return out;
}

/// A host backbone model (all of its stages) behind the device path.
template <class Inner, class T>
struct device_stage {
  using is_backbone_stage = void;
  /// The wrapped stage's token mixing.
  static constexpr hetmesh::model::token_mixing token_mixing = Inner::token_mixing;
  Inner inner;

  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& v) const requires requires {
    inner.output_size(v);
  }
  { return inner.output_size(v); }
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::micro_batch_view& v,
                                         int stage) const requires requires {
    inner.output_size(v, stage);
  }
  { return inner.output_size(v, stage); }
  template <class Ctx>
  void forward(const Ctx& ctx, const hetmesh::model::micro_batch_view& v, std::span<const T> in,
               std::span<T> out) {
    inner.forward(host_view_context<Ctx, T>{&ctx, ctx.stage, ctx.micro_batch}, v, host_of(in), host_of(out));
  }
  template <class Ctx>
  void backward(const Ctx& ctx, const hetmesh::model::micro_batch_view& v, std::span<const T> gout,
                std::span<T> gin) {
    inner.backward(host_view_context<Ctx, T>{&ctx, ctx.stage, ctx.micro_batch}, v, host_of(gout),
                   host_of(gin));
  }
  template <class Ctx>
  void backward_input(const Ctx& ctx, const hetmesh::model::micro_batch_view& v, std::span<const T> gout,
                      std::span<T> gin) requires requires(host_view_context<Ctx, T> h) {
    inner.backward_input(h, v, gout, gin);
  }
  {
    inner.backward_input(host_view_context<Ctx, T>{&ctx, ctx.stage, ctx.micro_batch}, v, host_of(gout),
                         host_of(gin));
  }
  template <class Ctx>
  void backward_weight(const Ctx& ctx, const hetmesh::model::micro_batch_view& v) requires
      requires(host_view_context<Ctx, T> h) {
    inner.backward_weight(h, v);
  }
  { inner.backward_weight(host_view_context<Ctx, T>{&ctx, ctx.stage, ctx.micro_batch}, v); }
  [[nodiscard]] std::vector<std::span<T>> parameters() { return device_views(inner.parameters()); }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return device_views(inner.gradients()); }
};

/// A host encoder behind the device path.
template <class Inner, class T>
struct device_encoder {
  using is_encoder_stage = void;
  static constexpr auto modality = Inner::modality;
  Inner inner;

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
    host_view_encoder_context<Ctx, T> h{&ctx};
    inner.forward(h, v, host_of(in), host_of(out));
  }
  template <class Ctx>
  void backward(Ctx& ctx, const hetmesh::model::encoder_batch_view& v, std::span<const T> gout,
                std::span<T> gin) {
    host_view_encoder_context<Ctx, T> h{&ctx};
    inner.backward(h, v, host_of(gout), host_of(gin));
  }
  [[nodiscard]] std::vector<std::span<T>> parameters() { return device_views(inner.parameters()); }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return device_views(inner.gradients()); }
};

/// An encoder input callable behind the device path: writes the host callable's input into the device buffer.
template <class Input>
struct device_input {
  Input inner;
  template <class T>
  void operator()(const hetmesh::model::encoder_batch_view& v, std::span<T> out) const {
    inner(v, host_of(out));
  }
};

}  // namespace traintest
