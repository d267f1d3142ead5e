// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: a libtorch module as a backbone pipeline stage. The user writes a torch::nn::Module
// with a forward only, `forward(x, call)`, and `output_size(mb, stage)`; libtorch::backbone<Module, T> is
// a model::backbone_stage and a model::split_backward_stage over it:
//  - forward runs the module under autograd and keeps its graph per activation slot (stage, micro-batch);
//  - backward runs autograd from the received output gradient into the parameters' flat gradient buffer
//    and writes the input gradient; backward_input / backward_weight split it for the zero-bubble schedules
//    (I: the input gradient with the graph retained; W: the weight gradients);
//  - the last stage's module returns one loss per local token; the adapter weights it by
//    mb.loss_weights / mb.step_targets (model::backbone_stage requirement 4), as a hand-written stage does;
//  - parameters() and gradients() are spans over one flat buffer (libtorch::flat_parameters).
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../model/micro_batch.hpp"
#include "../model/stage.hpp"
#include "../model/token_mixing.hpp"
#include "flat_parameters.hpp"
#include "graph_slots.hpp"
#include "stage_call.hpp"
#include "tensor_view.hpp"

namespace hetmesh::libtorch {

/// A module a libtorch::backbone adapts. Requirements (m a Module, cm a const Module):
///  1. Module derives from torch::nn::Module (its parameters() are the stage's parameters);
///  2. `m.forward(x, call)` with a 1-D tensor x (the stage's input, flattened: stage 0 gets the encoder
///     rows landed in call.batch(), in mb.encoder_outputs order, [landed rows * width], possibly empty; stage
///     k > 0 what stage k - 1 returned) and a `const stage_call&`, returns a tensor (any shape) of the
///     adapter's element type: on a stage before the last, output_size(mb, stage) elements (stage k + 1's
///     input); on the last stage, one loss per local token (backbone_options::last says how the adapter
///     weights it);
///  3. `cm.output_size(mb, stage)` returns the element count (std::int64_t) of its output for a
///     `const model::micro_batch_view&` at pipeline stage `stage` (the last stage: mb.size());
///  4. forward is deterministic and mixes tokens across positions only through call.attention (a module
///     may declare `static constexpr model::token_mixing token_mixing`: the adapter declares the same;
///     model::causal_halo is not bridged).
template <class M>
concept backbone_module = std::derived_from<M, ::torch::nn::Module> &&
    requires(M& m, const M& cm, const ::at::Tensor& x, const stage_call& call,
             const model::micro_batch_view& mb, int stage) {
  { m.forward(x, call) } -> std::convertible_to<::at::Tensor>;
  { cm.output_size(mb, stage) } -> std::convertible_to<std::int64_t>;
};

/// Checks backbone_module<M> requirement by requirement: each one M misses fails a static_assert that names
/// it. Returns true (so `static_assert(libtorch::check_backbone_module<BlockImpl>())`).
template <class M>
consteval bool check_backbone_module() {
  static_assert(
      std::derived_from<M, ::torch::nn::Module>,
      "libtorch::backbone_module requirement 1: the module must derive from torch::nn::Module (pass "
      "the Impl type of a TORCH_MODULE)");
  static_assert(
      requires(M & m, const ::at::Tensor& x, const stage_call& call) {
        { m.forward(x, call) } -> std::convertible_to<::at::Tensor>;
      },
      "libtorch::backbone_module requirement 2: missing `torch::Tensor forward(const torch::Tensor& x, const "
      "hetmesh::libtorch::stage_call& call)`");
  static_assert(
      requires(const M& cm, const model::micro_batch_view& mb, int stage) {
        { cm.output_size(mb, stage) } -> std::convertible_to<std::int64_t>;
      },
      "libtorch::backbone_module requirement 3: missing `std::int64_t output_size(const "
      "hetmesh::model::micro_batch_view&, int stage) const`");
  return true;
}

/// What the module of the last pipeline stage returns.
enum class last_stage_output {
  token_losses,  ///< one unweighted loss per local token: the adapter multiplies it by
                 ///< mb.loss_weights[t] / mb.step_targets (0 where the weight is 0, whatever the loss)
  loss_terms,    ///< the loss terms as the runtime sums them (already weighted): used as they are
};

/// How a libtorch::backbone runs its module.
struct backbone_options {
  int stages = 1;  ///< pipeline stages of the whole backbone (train::system's num_stages()); the last one
                   ///< seeds its own loss
  last_stage_output last = last_stage_output::token_losses;  ///< what the last stage's module returns
  /// The mutation parity checks must catch: backward and backward_input seed autograd with ones instead of
  /// the received output gradient (a stage that drops what the next stage sent). Never set it otherwise.
  bool ignore_output_gradient = false;

  friend bool operator==(const backbone_options&, const backbone_options&) = default;
};

namespace detail {
template <class M>
struct declared_mixing {};
template <class M>
requires model::declares_token_mixing<M>
struct declared_mixing<M> {
  static_assert(M::token_mixing.how != model::token_mixing::kind::halo,
                "libtorch adapters: model::causal_halo is not bridged to modules (no halo entry in "
                "stage_call); declare model::through_attention or model::token_local");
  /// The module's declaration (model/token_mixing.hpp).
  static constexpr model::token_mixing token_mixing = M::token_mixing;
};

}  // namespace detail

/// The loss terms of the last stage from its module's per-token losses `y` (mb.size() elements, any shape):
/// y[t] * loss_weights[t] / step_targets, and exactly 0 where the weight is 0 (whatever y[t] is), as a 1-D
/// differentiable tensor of y's dtype and device: what libtorch::backbone writes under
/// last_stage_output::token_losses. A plain libtorch loop that sums these over its micro-batches has the
/// loss train::system reports. Pre: y.numel() == mb.size() (invalid_argument, prefixed by `who`). O(n).
template <element T>
[[nodiscard]] ::at::Tensor weight_token_losses(const ::at::Tensor& y, const model::micro_batch_view& mb,
                                               const char* who = "libtorch::weight_token_losses") {
  const auto n = mb.size();
  if (y.numel() != n)
    throw_error<invalid_argument>(
        "{}: the last stage's module returned {} elements; expected one loss per "
        "local token ({})",
        who, y.numel(), n);
  std::vector<T> c(static_cast<std::size_t>(n), T(0));
  for (std::size_t t = 0; t < c.size(); ++t)
    if (mb.loss_weights[t] != 0.0 && mb.step_targets > 0)
      c[t] = static_cast<T>(mb.loss_weights[t] / static_cast<double>(mb.step_targets));
  const auto w = as_tensor(std::span<const T>(c)).to(y.device(), /*non_blocking=*/false, /*copy=*/true);
  const auto flat = y.reshape({-1});
  return ::at::where(w != 0, flat * w, ::at::zeros_like(flat));
}
/// A libtorch module as a model::backbone_stage and model::split_backward_stage of element type T (float or
/// double). One adapter serves every local stage of a rank (call.stage() says which). Guarantees:
///  1. forward(ctx, mb, in, out) copies `in` into a leaf that requires grad, runs module.forward(x, call)
///     under autograd with ctx bound to call, writes the output into `out`, and keeps the graph for
///     (ctx.stage, ctx.micro_batch) until that slot's backward; a forward of a slot whose graph is kept
///     throws model::activation_error naming it, and keeps nothing;
///  2. backward(ctx, mb, grad_out, grad_in) binds ctx, runs autograd from grad_out (the last stage: from
///     ones over its weighted loss terms when grad_out is empty) into the parameters' .grad (views into the
///     flat gradient buffer, added to) and writes grad_in (zeros where the input does not reach the output;
///     nothing when grad_in is empty); then releases the slot. No graph kept: model::activation_error;
///  3. backward_input then backward_weight add the same gradients as backward: I differentiates w.r.t. the
///     input (and the inputs of collective nodes, so the ring attention's backward runs in I on every rank
///     and keeps dq, dk, dv for W) with the graph retained; W runs autograd into the parameters only, and
///     reuses the kept attention gradients (no collective in W). W walks the graph again: its cost is up to
///     a backward's, less the input gradient;
///  4. parameters() and gradients() are the flat buffers' spans (libtorch::flat_parameters), in
///     module.parameters() order;
///  5. collectives inside the graph (call.attention) run with the context of the call running autograd.
template <backbone_module Module, element T>
class backbone : public detail::declared_mixing<Module> {
 public:
  /// Opt-in for model::backbone_stage.
  using is_backbone_stage = void;
  /// The adapted module type.
  using module_type = Module;
  /// Element type of activations and parameters.
  using value_type = T;

  /// Adapts `module` (its parameters must be of dtype T: call module->to(dtype_of<T>()) first); moves its
  /// parameters into the flat buffers. Pre: module is not null, options.stages >= 1 (invalid_argument).
  explicit backbone(std::shared_ptr<Module> module, backbone_options options = {})
      : module_(std::move(module)), options_(options), binding_(std::make_unique<detail::call_binding>()) {
    if (module_ == nullptr) throw_error<invalid_argument>("libtorch::backbone: the module is null");
    if (options_.stages < 1)
      throw_error<invalid_argument>("libtorch::backbone: {} pipeline stages; expected at least 1",
                                    options_.stages);
    flat_ = flat_parameters<T>(*module_);
    binding_->who = "libtorch::backbone";
    binding_->stages = options_.stages;
  }
  /// Adapts the module a holder (TORCH_MODULE's type) holds.
  explicit backbone(const ::torch::nn::ModuleHolder<Module>& holder, backbone_options options = {})
      : backbone(holder.ptr(), options) {}

  /// The module.
  [[nodiscard]] Module& module() noexcept { return *module_; }
  /// The module, shared.
  [[nodiscard]] const std::shared_ptr<Module>& module_ptr() const noexcept { return module_; }
  /// The options.
  [[nodiscard]] const backbone_options& options() const noexcept { return options_; }
  /// The flat parameter and gradient buffers.
  [[nodiscard]] flat_parameters<T>& flat() noexcept { return flat_; }

  /// The module's output_size(mb, stage) (model::sizes_output_per_stage).
  [[nodiscard]] std::int64_t output_size(const model::micro_batch_view& mb, int stage) const {
    return static_cast<std::int64_t>(std::as_const(*module_).output_size(mb, stage));
  }
  /// The last stage's output size (model::backbone_stage requirement 2).
  [[nodiscard]] std::int64_t output_size(const model::micro_batch_view& mb) const {
    return output_size(mb, options_.stages - 1);
  }

  /// Guarantee 1. Ctx: the runtime's stage context (ctx.stage, ctx.micro_batch; attention entries when it
  /// is a model::attention_context<T>).
  template <class Ctx>
  void forward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T> in, std::span<T> out) {
    const detail::binding_scope scope = bind(ctx, mb, backward_pass::none);
    const stage_call call(*binding_);
    const bool last = call.last_stage() && options_.last == last_stage_output::token_losses;
    detail::forward_pass<T>(slots_, *binding_, flat_.device(), in, out, [&](const ::at::Tensor& x) {
      ::at::Tensor y = module_->forward(x, call);
      return last ? weight_token_losses<T>(y, mb, binding_->who) : y;
    });
  }

  /// Guarantee 2.
  template <class Ctx>
  void backward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T> grad_out,
                std::span<T> grad_in) {
    const detail::binding_scope scope = bind(ctx, mb, backward_pass::full);
    detail::backward_pass<T>(slots_, *binding_, flat_, received(grad_out), grad_in, seeds_loss(ctx.stage),
                             true);
  }

  /// Guarantee 3, the I pass: writes grad_in, keeps the graph for backward_weight.
  template <class Ctx>
  void backward_input(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const T> grad_out,
                      std::span<T> grad_in) {
    const detail::binding_scope scope = bind(ctx, mb, backward_pass::input);
    detail::backward_input_pass<T>(slots_, *binding_, flat_, received(grad_out), grad_in,
                                   seeds_loss(ctx.stage));
  }

  /// Guarantee 3, the W pass: adds the weight gradients of a slot whose backward_input ran; releases it.
  template <class Ctx>
  void backward_weight(const Ctx& ctx, const model::micro_batch_view& mb) {
    const detail::binding_scope scope = bind(ctx, mb, backward_pass::weight);
    detail::backward_weight_pass<T>(slots_, *binding_, flat_);
  }

  /// The parameters' spans over the flat value buffer (model::stage_parameters).
  [[nodiscard]] const std::vector<std::span<T>>& parameters() const noexcept { return flat_.parameters(); }
  /// The gradients' spans over the flat gradient buffer, same order and sizes.
  [[nodiscard]] const std::vector<std::span<T>>& gradients() const noexcept { return flat_.gradients(); }

  /// Graphs kept (forwards whose backward has not run).
  [[nodiscard]] std::size_t pending() const noexcept { return slots_.size(); }
  /// Whether the graph of (stage, micro_batch) is kept.
  [[nodiscard]] bool holds(int stage, int micro_batch) const { return slots_.contains(stage, micro_batch); }
  /// Drops every kept graph (after a step that failed part-way).
  void clear() noexcept { slots_.clear(); }

 private:
  [[nodiscard]] bool seeds_loss(int stage) const noexcept {
    return stage + 1 == options_.stages || options_.ignore_output_gradient;
  }
  [[nodiscard]] std::span<const T> received(std::span<const T> grad_out) const noexcept {
    return options_.ignore_output_gradient ? std::span<const T>() : grad_out;
  }

  template <class Ctx>
  [[nodiscard]] detail::binding_scope bind(const Ctx& ctx, const model::micro_batch_view& mb,
                                           backward_pass pass) {
    if (ctx.stage < 0 || ctx.stage >= options_.stages)
      throw_error<invalid_argument>("libtorch::backbone: a call for stage {}; the backbone has {} stages",
                                    ctx.stage, options_.stages);
    detail::bind_backbone_context<T>(*binding_, ctx, mb);
    binding_->stage = ctx.stage;
    binding_->micro_batch = ctx.micro_batch;
    binding_->pass = pass;
    return detail::binding_scope(*binding_);
  }

  std::shared_ptr<Module> module_;
  backbone_options options_;
  std::unique_ptr<detail::call_binding> binding_;  // stable address: the kept graphs' attention nodes hold it
  flat_parameters<T> flat_;
  detail::graph_slots slots_{"libtorch::backbone"};
};

}  // namespace hetmesh::libtorch

/// Prints a last_stage_output as `token losses` or `loss terms`.
template <>
struct fmt::formatter<hetmesh::libtorch::last_stage_output> : hetmesh::empty_spec_formatter {
  /// Writes the name.
  template <class FormatContext>
  auto format(hetmesh::libtorch::last_stage_output o, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(
        ctx.out(), "{}",
        o == hetmesh::libtorch::last_stage_output::token_losses ? "token losses" : "loss terms");
  }
};

/// Prints backbone_options as `backbone(stages=2, last=token losses)`, with `, ignores output gradients`
/// when the mutation is on.
template <>
struct fmt::formatter<hetmesh::libtorch::backbone_options> : hetmesh::empty_spec_formatter {
  /// Writes the options.
  template <class FormatContext>
  auto format(const hetmesh::libtorch::backbone_options& o, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "backbone(stages={}, last={}{})", o.stages, o.last,
                              o.ignore_output_gradient ? ", ignores output gradients" : "");
  }
};
