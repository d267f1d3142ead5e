// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: what a module's forward receives besides its input, and the autograd bridge to the
// contexts' attention. A libtorch module is not a template over the runtime's context types, so the
// adapters (libtorch::backbone, libtorch::encoder) hand it a stage_call: the call's micro-batch view (or
// encoder batch view), its pipeline stage and micro-batch, and erased attention entries. call.attention(q,
// k, v, shape, scale) is an autograd function whose forward calls the context's attention_forward
// (model::attention_context: ring attention over the micro-batch's ring; model::encoder_attention_context:
// attention inside each item) and whose backward calls its attention_backward with the context of the
// call that runs autograd: the adapter binds the backward call's context before it runs autograd, so the
// ring collectives run in the schedule's order, on the rank's own thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <typeinfo>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>

#include "../core/error.hpp"
#include "../model/attention.hpp"
#include "../model/attention_context.hpp"
#include "../model/encoder_batch.hpp"
#include "../model/micro_batch.hpp"
#include "tensor_view.hpp"

namespace hetmesh::libtorch {

/// Which pass of a backward is running: a whole backward, the input-gradient pass (I) of a split backward,
/// or its weight-gradient pass (W).
enum class backward_pass {
  none,    ///< no backward: a forward, or no call
  full,    ///< backward: input and weight gradients at once
  input,   ///< backward_input (I): autograd nodes with collectives keep their results for W
  weight,  ///< backward_weight (W): such nodes reuse what they kept in I
};

/// A local attention: (q, k, v, shape, scale) -> {out, lse}, computed by differentiable torch ops (no
/// context, no collective). A standalone_call hands it to the module's call.attention, so that a module runs
/// unchanged in a plain libtorch loop (a reference run, an evaluation) outside train::system.
using local_attention = std::function<std::pair<::at::Tensor, ::at::Tensor>(
    const ::at::Tensor&, const ::at::Tensor&, const ::at::Tensor&, const model::attention_shape&, double)>;

namespace detail {

struct call_binding;

/// Erased attention forward: (binding, shape, scale, q, k, v, out, lse).
using attention_forward_fn = void (*)(const call_binding&, const model::attention_shape&, double,
                                      const ::at::Tensor&, const ::at::Tensor&, const ::at::Tensor&,
                                      const ::at::Tensor&, const ::at::Tensor&);
/// Erased attention backward: (binding, shape, scale, q, k, v, out, lse, dout, dq, dk, dv).
using attention_backward_fn = void (*)(const call_binding&, const model::attention_shape&, double,
                                       const ::at::Tensor&, const ::at::Tensor&, const ::at::Tensor&,
                                       const ::at::Tensor&, const ::at::Tensor&, const ::at::Tensor&,
                                       const ::at::Tensor&, const ::at::Tensor&, const ::at::Tensor&);

/// The current call of an adapter: set by the adapter for the duration of one forward or backward, read by
/// stage_call and by the attention nodes of the graphs it keeps (which hold its address).
struct call_binding {
  const void* context = nullptr;                             // the current call's context (null: no call)
  const std::type_info* context_type = nullptr;              // its type
  const model::micro_batch_view* batch = nullptr;            // backbone calls
  const model::encoder_batch_view* encoder_batch = nullptr;  // encoder calls
  int stage = 0;
  int micro_batch = 0;
  int stages = 1;
  backward_pass pass = backward_pass::none;
  ::c10::ScalarType dtype = ::at::kDouble;
  attention_forward_fn forward = nullptr;
  attention_backward_fn backward = nullptr;
  std::vector<::at::Tensor>* anchors = nullptr;  // the forward's graph entry: inputs of collective nodes
  const local_attention* local = nullptr;        // a standalone call's attention (then no context)
  const char* who = "libtorch";
};

template <class Ctx, class T>
void ring_forward(const call_binding& b, const model::attention_shape& s, double scale, const ::at::Tensor& q,
                  const ::at::Tensor& k, const ::at::Tensor& v, const ::at::Tensor& out,
                  const ::at::Tensor& lse) {
  static_cast<const Ctx*>(b.context)->attention_forward(s, static_cast<T>(scale), as_span<const T>(q),
                                                        as_span<const T>(k), as_span<const T>(v),
                                                        as_span<T>(out), as_span<T>(lse));
}
template <class Ctx, class T>
void ring_backward(const call_binding& b, const model::attention_shape& s, double scale,
                   const ::at::Tensor& q, const ::at::Tensor& k, const ::at::Tensor& v,
                   const ::at::Tensor& out, const ::at::Tensor& lse, const ::at::Tensor& dout,
                   const ::at::Tensor& dq, const ::at::Tensor& dk, const ::at::Tensor& dv) {
  static_cast<const Ctx*>(b.context)->attention_backward(
      s, static_cast<T>(scale), as_span<const T>(q), as_span<const T>(k), as_span<const T>(v),
      as_span<const T>(out), as_span<const T>(lse), as_span<const T>(dout), as_span<T>(dq), as_span<T>(dk),
      as_span<T>(dv));
}
template <class Ctx, class T>
void item_forward(const call_binding& b, const model::attention_shape& s, double scale, const ::at::Tensor& q,
                  const ::at::Tensor& k, const ::at::Tensor& v, const ::at::Tensor& out,
                  const ::at::Tensor& lse) {
  static_cast<const Ctx*>(b.context)->attention_forward(
      *b.encoder_batch, s, static_cast<T>(scale), as_span<const T>(q), as_span<const T>(k),
      as_span<const T>(v), as_span<T>(out), as_span<T>(lse));
}
template <class Ctx, class T>
void item_backward(const call_binding& b, const model::attention_shape& s, double scale,
                   const ::at::Tensor& q, const ::at::Tensor& k, const ::at::Tensor& v,
                   const ::at::Tensor& out, const ::at::Tensor& lse, const ::at::Tensor& dout,
                   const ::at::Tensor& dq, const ::at::Tensor& dk, const ::at::Tensor& dv) {
  static_cast<const Ctx*>(b.context)->attention_backward(
      *b.encoder_batch, s, static_cast<T>(scale), as_span<const T>(q), as_span<const T>(k),
      as_span<const T>(v), as_span<const T>(out), as_span<const T>(lse), as_span<const T>(dout),
      as_span<T>(dq), as_span<T>(dk), as_span<T>(dv));
}

/// Binds `ctx` (a backbone call's context) to `b` for element type T: its attention entries when Ctx is
/// a model::attention_context<T>, none otherwise (call.attention then throws).
template <class T, class Ctx>
void bind_backbone_context(call_binding& b, const Ctx& ctx, const model::micro_batch_view& mb) {
  b.context = &ctx;
  b.context_type = &typeid(Ctx);
  b.batch = &mb;
  b.encoder_batch = nullptr;
  b.dtype = dtype_of<T>();
  if constexpr (model::attention_context<Ctx, T>) {
    b.forward = &ring_forward<Ctx, T>;
    b.backward = &ring_backward<Ctx, T>;
  } else {
    b.forward = nullptr;
    b.backward = nullptr;
  }
}

/// Binds `ctx` (an encoder call's context) to `b` for element type T, as bind_backbone_context, with the
/// item attention of model::encoder_attention_context<T>.
template <class T, class Ctx>
void bind_encoder_context(call_binding& b, const Ctx& ctx, const model::encoder_batch_view& ev) {
  b.context = &ctx;
  b.context_type = &typeid(Ctx);
  b.batch = nullptr;
  b.encoder_batch = &ev;
  b.dtype = dtype_of<T>();
  if constexpr (model::encoder_attention_context<Ctx, T>) {
    b.forward = &item_forward<Ctx, T>;
    b.backward = &item_backward<Ctx, T>;
  } else {
    b.forward = nullptr;
    b.backward = nullptr;
  }
}

/// Clears the binding when a call ends (also by an exception), so that a graph used outside a call fails
/// loudly instead of reaching a dead context.
struct binding_scope {
  call_binding* b;
  explicit binding_scope(call_binding& binding) noexcept : b(&binding) {}
  binding_scope(const binding_scope&) = delete;
  binding_scope& operator=(const binding_scope&) = delete;
  ~binding_scope() {
    b->context = nullptr;
    b->context_type = nullptr;
    b->batch = nullptr;
    b->encoder_batch = nullptr;
    b->forward = nullptr;
    b->backward = nullptr;
    b->anchors = nullptr;
    b->pass = backward_pass::none;
  }
};

/// The autograd function of stage_call::attention: forward calls the bound context's attention_forward and
/// saves q, k, v, out, lse; backward calls the attention_backward of the context bound when it runs. In the
/// I pass of a split backward it keeps dq, dk, dv, and the W pass reuses them, so the collective runs once.
struct attention_function : ::torch::autograd::Function<attention_function> {
  /// Returns {out, lse}; lse is not differentiable.
  static ::torch::autograd::variable_list forward(::torch::autograd::AutogradContext* actx, ::at::Tensor q,
                                                  ::at::Tensor k, ::at::Tensor v, call_binding* b,
                                                  model::attention_shape shape, double scale) {
    const auto n = q.size(0);
    auto out = ::at::empty(q.sizes(), q.options());
    auto lse = ::at::empty({n, shape.q_heads}, q.options());
    b->forward(*b, shape, scale, q, k, v, out, lse);
    actx->save_for_backward({q, k, v, out, lse});
    actx->mark_non_differentiable({lse});
    actx->saved_data["binding"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(b));
    actx->saved_data["q_heads"] = static_cast<std::int64_t>(shape.q_heads);
    actx->saved_data["kv_heads"] = static_cast<std::int64_t>(shape.kv_heads);
    actx->saved_data["head_dim"] = static_cast<std::int64_t>(shape.head_dim);
    actx->saved_data["scale"] = scale;
    return {out, lse};
  }

  /// dq, dk, dv from the bound context's attention_backward (or from what the I pass kept).
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* actx,
                                                   ::torch::autograd::variable_list grads) {
    auto* b =
        reinterpret_cast<call_binding*>(static_cast<std::intptr_t>(actx->saved_data["binding"].toInt()));
    auto& data = actx->saved_data;
    if (const auto it = data.find("dq"); it != data.end()) {
      ::torch::autograd::variable_list kept{data["dq"].toTensor(), data["dk"].toTensor(),
                                            data["dv"].toTensor()};
      data.erase("dq");
      data.erase("dk");
      data.erase("dv");
      return {kept[0], kept[1], kept[2], {}, {}, {}};
    }
    if (b->backward == nullptr)
      throw_error<invalid_argument>(
          "{}: an attention node's backward ran outside the adapter's backward (no context bound); expected "
          "autograd to run only through the adapter's backward, backward_input or backward_weight",
          b->who);
    const auto saved = actx->get_saved_variables();
    const model::attention_shape shape{static_cast<int>(data["q_heads"].toInt()),
                                       static_cast<int>(data["kv_heads"].toInt()),
                                       static_cast<int>(data["head_dim"].toInt())};
    const auto dout = grads[0].defined() ? grads[0].contiguous() : ::at::zeros_like(saved[3]);
    auto dq = ::at::empty_like(saved[0]), dk = ::at::empty_like(saved[1]), dv = ::at::empty_like(saved[2]);
    b->backward(*b, shape, data["scale"].toDouble(), saved[0], saved[1], saved[2], saved[3], saved[4], dout,
                dq, dk, dv);
    if (b->pass == backward_pass::input) {
      data["dq"] = dq;
      data["dk"] = dk;
      data["dv"] = dv;
    }
    return {dq, dk, dv, {}, {}, {}};
  }
};

}  // namespace detail

/// What a module's forward receives besides its input: the call's batch view, its pipeline stage (encoder:
/// shard) and micro-batch, and the attention entry of the call's context. A stage_call refers to its
/// adapter's current-call state: it is valid while the adapter lives, and its accessors answer for the call
/// that is running (the forward's, or the backward's while autograd runs). Cheap to copy.
class stage_call {
 public:
  /// A call over the adapter's binding (the adapters make these).
  explicit stage_call(detail::call_binding& b) noexcept : b_(&b) {}

  /// Pipeline stage (encoder: encoder shard) of the call, 0-based over the whole pipeline.
  [[nodiscard]] int stage() const noexcept { return b_->stage; }
  /// Micro-batch index of the call.
  [[nodiscard]] int micro_batch() const noexcept { return b_->micro_batch; }
  /// Pipeline stages of the whole backbone (the adapter's backbone_options::stages; 1 for an encoder).
  [[nodiscard]] int stages() const noexcept { return b_->stages; }
  /// Whether the call is for the backbone's first pipeline stage (its input: the encoder rows landed in the
  /// micro-batch, in mb.encoder_outputs order).
  [[nodiscard]] bool first_stage() const noexcept { return b_->stage == 0; }
  /// Whether the call is for the backbone's last pipeline stage (its output: loss terms).
  [[nodiscard]] bool last_stage() const noexcept { return b_->stage + 1 == b_->stages; }
  /// Whether the call is an encoder's.
  [[nodiscard]] bool is_encoder() const noexcept { return b_->encoder_batch != nullptr; }
  /// Which backward pass is running (backward_pass::none during a forward).
  [[nodiscard]] backward_pass pass() const noexcept { return b_->pass; }

  /// The backbone call's micro-batch view. Pre: a backbone call is running (invalid_argument otherwise).
  [[nodiscard]] const model::micro_batch_view& batch() const {
    if (b_->batch == nullptr)
      throw_error<invalid_argument>("{}: stage_call::batch() outside a backbone call", b_->who);
    return *b_->batch;
  }
  /// The encoder call's batch view. Pre: an encoder call is running (invalid_argument otherwise).
  [[nodiscard]] const model::encoder_batch_view& encoder_batch() const {
    if (b_->encoder_batch == nullptr)
      throw_error<invalid_argument>("{}: stage_call::encoder_batch() outside an encoder call", b_->who);
    return *b_->encoder_batch;
  }
  /// Local tokens of the call: the micro-batch's size() (backbone) or the batch's tokens (encoder).
  [[nodiscard]] std::int64_t tokens() const { return is_encoder() ? encoder_batch().size() : batch().size(); }

  /// The running call's context when its type is Ctx (the runtime's context: ctx.tp, ctx.ep, ctx.ring, ...),
  /// else null. During autograd in a backward it is the backward call's context.
  template <class Ctx>
  [[nodiscard]] const Ctx* context() const noexcept {
    if (b_->context == nullptr || b_->context_type == nullptr || *b_->context_type != typeid(Ctx))
      return nullptr;
    return static_cast<const Ctx*>(b_->context);
  }

  /// Attention of the call's local queries, differentiable: backbone calls get causal per-document
  /// attention over every key of the micro-batch's ring (the context's attention_forward, collective over
  /// the ring); encoder calls, full attention inside each item. q is [tokens][q_heads][head_dim] and k, v
  /// [tokens][kv_heads][head_dim] (any shape of those element counts, any layout: made contiguous), of the
  /// adapter's element type. Returns {out, lse}: out of q's shape, lse [tokens][q_heads] (natural log, not
  /// differentiable). Backward runs the context's attention_backward (collective as the forward) with the
  /// context of the backward call. Pre: a call is running whose context has attention entries, and sizes
  /// and dtype fit (invalid_argument naming what differs otherwise).
  [[nodiscard]] std::pair<::at::Tensor, ::at::Tensor> attention_with_lse(const ::at::Tensor& q,
                                                                         const ::at::Tensor& k,
                                                                         const ::at::Tensor& v,
                                                                         const model::attention_shape& shape,
                                                                         double scale) const {
    check_sizes(q, k, v, shape);
    if (b_->local != nullptr && *b_->local) return (*b_->local)(q, k, v, shape, scale);
    check_context(q, k, v);
    const auto qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
    if (b_->anchors != nullptr) {  // the I pass of a split backward differentiates w.r.t. it
      for (const auto* t : {&qc, &kc, &vc})
        if (t->requires_grad()) {
          b_->anchors->push_back(*t);
          break;
        }
    }
    auto r = detail::attention_function::apply(qc, kc, vc, b_, shape, scale);
    return {r[0], r[1]};
  }

  /// attention_with_lse's output only.
  [[nodiscard]] ::at::Tensor attention(const ::at::Tensor& q, const ::at::Tensor& k, const ::at::Tensor& v,
                                       const model::attention_shape& shape, double scale) const {
    return attention_with_lse(q, k, v, shape, scale).first;
  }

  /// Registers `t`, the input of an autograd node whose backward runs a collective (as the attention
  /// node's does): the I pass of a split backward differentiates with respect to it, so the node runs in I on
  /// every rank (and should keep its results for W while pass() is backward_pass::input, as the attention
  /// node does). Only during a forward; t must require grad (otherwise nothing is registered).
  void collective_input(const ::at::Tensor& t) const {
    if (b_->anchors != nullptr && t.requires_grad()) b_->anchors->push_back(t);
  }

 private:
  void check_context(const ::at::Tensor& q, const ::at::Tensor& k, const ::at::Tensor& v) const {
    if (b_->local != nullptr)
      throw_error<invalid_argument>("{}: call.attention on a standalone_call made without a local attention",
                                    b_->who);
    if (b_->context == nullptr)
      throw_error<invalid_argument>("{}: stage_call::attention outside a forward call", b_->who);
    if (b_->forward == nullptr)
      throw_error<invalid_argument>(
          "{}: the call's context has no attention entry; expected a model::attention_context (backbone) or "
          "model::encoder_attention_context (encoder) of the adapter's element type",
          b_->who);
    for (const auto* t : {&q, &k, &v})
      if (t->scalar_type() != b_->dtype)
        throw_error<invalid_argument>("{}: attention input of dtype {}; the adapter's element type is {}",
                                      b_->who, std::string(::c10::toString(t->scalar_type())),
                                      std::string(::c10::toString(b_->dtype)));
  }
  void check_sizes(const ::at::Tensor& q, const ::at::Tensor& k, const ::at::Tensor& v,
                   const model::attention_shape& shape) const {
    model::check_attention_shape(shape, "libtorch::stage_call::attention");
    const auto n = tokens();
    const auto qn = n * shape.q_heads * shape.head_dim, kn = n * shape.kv_heads * shape.head_dim;
    if (q.numel() != qn || k.numel() != kn || v.numel() != kn)
      throw_error<invalid_argument>(
          "{}: attention over {} tokens with {} query heads, {} KV heads of {}: q, k, v have {}, {}, {} "
          "elements; expected {}, {}, {}",
          b_->who, n, shape.q_heads, shape.kv_heads, shape.head_dim, q.numel(), k.numel(), v.numel(), qn, kn,
          kn);
    if (q.dim() == 0 || q.size(0) != n)
      throw_error<invalid_argument>("{}: q's first dimension must be the call's {} tokens", b_->who, n);
  }

  detail::call_binding* b_;
};

/// A stage_call outside the adapters and train::system: what a module's forward needs to run in a plain
/// libtorch loop (the single-process reference of a parity check, an evaluation). Its call's attention is
/// `attention` (differentiable torch ops, e.g. over the whole micro-batch); without one, call.attention
/// throws. Holds the views by pointer (they outlive it); not copyable (its calls point into it).
class standalone_call {
 public:
  /// A backbone call for stage `stage` of `stages` over `mb`.
  standalone_call(const model::micro_batch_view& mb, int stage, int stages, local_attention attention = {})
      : attention_(std::move(attention)) {
    b_.batch = &mb;
    b_.stage = stage;
    b_.stages = stages;
    b_.local = &attention_;
    b_.who = "libtorch::standalone_call";
  }
  /// An encoder call over `ev`.
  explicit standalone_call(const model::encoder_batch_view& ev, local_attention attention = {})
      : attention_(std::move(attention)) {
    b_.encoder_batch = &ev;
    b_.micro_batch = ev.index;
    b_.local = &attention_;
    b_.who = "libtorch::standalone_call";
  }
  standalone_call(const standalone_call&) = delete;
  standalone_call& operator=(const standalone_call&) = delete;

  /// The call to pass to the module's forward.
  [[nodiscard]] stage_call call() noexcept { return stage_call(b_); }

 private:
  local_attention attention_;
  detail::call_binding b_;
};

}  // namespace hetmesh::libtorch
