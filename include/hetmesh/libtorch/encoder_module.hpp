// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: a libtorch module as an encoder stage. The user writes a torch::nn::Module with a
// forward only, `forward(x, call)`, its sizes and its modality; libtorch::encoder<Module, T> is a
// model::encoder_stage over it, with the same graph keeping as libtorch::backbone: forward keeps the
// autograd graph per (encoder shard, micro-batch), backward runs autograd from the received output gradient
// (the gradient of the encoder rows the backbone's first stage read) into the flat gradient buffer, and
// writes the input gradient when the runtime asks for one (raw inputs: it does not). call.attention is the
// context's item attention (model::encoder_attention_context).
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "../core/error.hpp"
#include "../model/encoder_batch.hpp"
#include "../model/stage.hpp"
#include "flat_parameters.hpp"
#include "graph_slots.hpp"
#include "stage_call.hpp"
#include "tensor_view.hpp"

namespace hetmesh::libtorch {

/// A module a libtorch::encoder adapts. Requirements (m a Module, cm a const Module):
///  1. Module derives from torch::nn::Module;
///  2. `Module::modality` converts to std::string_view (model::encoder_stage requirement 2);
///  3. `cm.input_size(ev)` and `cm.output_size(ev)` return element counts (std::int64_t) for a
///     `const model::encoder_batch_view&` (requirement 3);
///  4. `cm.attention_heads()` returns (int) the heads its attention splits over, 0 when it mixes no tokens
///     across ranks (requirement 8);
///  5. `m.forward(x, call)` with the 1-D input tensor x (input_size(ev) elements, the batch's items in
///     buffer order) and a `const stage_call&` returns a tensor of output_size(ev) elements of the
///     adapter's element type; it mixes tokens of an item only through call.attention.
template <class M>
concept encoder_module = std::derived_from<M, ::torch::nn::Module> &&
    requires(M& m, const M& cm, const ::at::Tensor& x, const stage_call& call,
             const model::encoder_batch_view& ev) {
  { M::modality } -> std::convertible_to<std::string_view>;
  { cm.input_size(ev) } -> std::convertible_to<std::int64_t>;
  { cm.output_size(ev) } -> std::convertible_to<std::int64_t>;
  { cm.attention_heads() } -> std::convertible_to<int>;
  { m.forward(x, call) } -> std::convertible_to<::at::Tensor>;
};

/// Checks encoder_module<M> requirement by requirement, as check_backbone_module does.
template <class M>
consteval bool check_encoder_module() {
  static_assert(
      std::derived_from<M, ::torch::nn::Module>,
      "libtorch::encoder_module requirement 1: the module must derive from torch::nn::Module (pass the "
      "Impl type of a TORCH_MODULE)");
  static_assert(
      requires {
        { M::modality } -> std::convertible_to<std::string_view>;
      },
      "libtorch::encoder_module requirement 2: missing `static constexpr std::string_view modality = "
      "\"vision\";`");
  static_assert(
      requires(const M& cm, const model::encoder_batch_view& ev) {
        { cm.input_size(ev) } -> std::convertible_to<std::int64_t>;
        { cm.output_size(ev) } -> std::convertible_to<std::int64_t>;
      },
      "libtorch::encoder_module requirement 3: missing `std::int64_t input_size(const "
      "hetmesh::model::encoder_batch_view&) const` or `output_size` of the same form");
  static_assert(
      requires(const M& cm) {
        { cm.attention_heads() } -> std::convertible_to<int>;
      },
      "libtorch::encoder_module requirement 4: missing `int attention_heads() const` (0 when the encoder "
      "mixes "
      "no tokens across ranks)");
  static_assert(
      requires(M & m, const ::at::Tensor& x, const stage_call& call) {
        { m.forward(x, call) } -> std::convertible_to<::at::Tensor>;
      },
      "libtorch::encoder_module requirement 5: missing `torch::Tensor forward(const torch::Tensor& x, const "
      "hetmesh::libtorch::stage_call& call)`");
  return true;
}

/// A libtorch module as a model::encoder_stage of element type T (float or double). Guarantees, as
/// libtorch::backbone's 1, 2, 4 and 5, keyed by (ctx.stage: the encoder shard, ctx.micro_batch):
///  1. forward keeps the graph of its call until that slot's backward (a second forward of a kept slot
///     throws model::activation_error);
///  2. backward runs autograd from grad_out into the parameters' flat gradient buffer (added to) and, when
///     grad_in is not empty, writes the input gradient; a backward without a kept graph throws
///     model::activation_error; the slot is released;
///  3. parameters() and gradients() are spans over one flat buffer each, in module.parameters() order;
///  4. call.attention runs the context's item attention, its backward with the backward call's context.
/// An encoder does not split its backward (no schedule asks an encoder for I and W).
template <encoder_module Module, element T>
class encoder {
 public:
  /// Opt-in for model::encoder_stage.
  using is_encoder_stage = void;
  /// The adapted module type.
  using module_type = Module;
  /// Element type of activations and parameters.
  using value_type = T;
  /// The module's modality (model::encoder_stage requirement 2).
  static constexpr std::string_view modality = Module::modality;

  /// Adapts `module` (parameters of dtype T); moves its parameters into the flat buffers. Pre: module is
  /// not null (invalid_argument).
  explicit encoder(std::shared_ptr<Module> module)
      : module_(std::move(module)), binding_(std::make_unique<detail::call_binding>()) {
    if (module_ == nullptr) throw_error<invalid_argument>("libtorch::encoder: the module is null");
    flat_ = flat_parameters<T>(*module_);
    binding_->who = "libtorch::encoder";
    binding_->stages = 1;
  }
  /// Adapts the module a holder (TORCH_MODULE's type) holds.
  explicit encoder(const ::torch::nn::ModuleHolder<Module>& holder) : encoder(holder.ptr()) {}

  /// The module.
  [[nodiscard]] Module& module() noexcept { return *module_; }
  /// The module, shared.
  [[nodiscard]] const std::shared_ptr<Module>& module_ptr() const noexcept { return module_; }
  /// The flat parameter and gradient buffers.
  [[nodiscard]] flat_parameters<T>& flat() noexcept { return flat_; }

  /// The module's input_size(ev).
  [[nodiscard]] std::int64_t input_size(const model::encoder_batch_view& ev) const {
    return static_cast<std::int64_t>(std::as_const(*module_).input_size(ev));
  }
  /// The module's output_size(ev).
  [[nodiscard]] std::int64_t output_size(const model::encoder_batch_view& ev) const {
    return static_cast<std::int64_t>(std::as_const(*module_).output_size(ev));
  }
  /// The module's attention_heads().
  [[nodiscard]] int attention_heads() const {
    return static_cast<int>(std::as_const(*module_).attention_heads());
  }

  /// Guarantee 1.
  template <class Ctx>
  void forward(const Ctx& ctx, const model::encoder_batch_view& ev, std::span<const T> in, std::span<T> out) {
    const detail::binding_scope scope = bind(ctx, ev, backward_pass::none);
    const stage_call call(*binding_);
    detail::forward_pass<T>(slots_, *binding_, flat_.device(), in, out,
                            [&](const ::at::Tensor& x) { return ::at::Tensor(module_->forward(x, call)); });
  }

  /// Guarantee 2.
  template <class Ctx>
  void backward(const Ctx& ctx, const model::encoder_batch_view& ev, std::span<const T> grad_out,
                std::span<T> grad_in) {
    const detail::binding_scope scope = bind(ctx, ev, backward_pass::full);
    detail::backward_pass<T>(slots_, *binding_, flat_, grad_out, grad_in, false, false);
  }

  /// The parameters' spans over the flat value buffer (model::stage_parameters).
  [[nodiscard]] const std::vector<std::span<T>>& parameters() const noexcept { return flat_.parameters(); }
  /// The gradients' spans over the flat gradient buffer.
  [[nodiscard]] const std::vector<std::span<T>>& gradients() const noexcept { return flat_.gradients(); }

  /// Graphs kept.
  [[nodiscard]] std::size_t pending() const noexcept { return slots_.size(); }
  /// Whether the graph of (shard, micro_batch) is kept.
  [[nodiscard]] bool holds(int shard, int micro_batch) const { return slots_.contains(shard, micro_batch); }
  /// Drops every kept graph.
  void clear() noexcept { slots_.clear(); }

 private:
  template <class Ctx>
  [[nodiscard]] detail::binding_scope bind(const Ctx& ctx, const model::encoder_batch_view& ev,
                                           backward_pass pass) {
    detail::bind_encoder_context<T>(*binding_, ctx, ev);
    binding_->stage = ctx.stage;
    binding_->micro_batch = ctx.micro_batch;
    binding_->pass = pass;
    return detail::binding_scope(*binding_);
  }

  std::shared_ptr<Module> module_;
  std::unique_ptr<detail::call_binding> binding_;
  flat_parameters<T> flat_;
  detail::graph_slots slots_{"libtorch::encoder"};
};

}  // namespace hetmesh::libtorch
