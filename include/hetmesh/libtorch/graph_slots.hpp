// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: the autograd graphs an adapter keeps between a micro-batch's forward and its
// backward, one per activation slot (stage, micro-batch), and the forward and backward passes the
// adapters share. A pipeline schedule runs several forwards before their backwards, so graphs are keyed
// like model::activation_key (without its tensor index); backward releases its slot. Forward finding a
// graph already kept, or backward finding none, is a bug in a schedule and throws model::activation_error
// naming the slot. The graph (and the tensors autograd saves) lives in the adapter, not in the context's
// activation store: selective offload does not move it.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/autograd.h>

#include "../core/error.hpp"
#include "../model/activation.hpp"
#include "flat_parameters.hpp"
#include "stage_call.hpp"
#include "tensor_view.hpp"

namespace hetmesh::libtorch::detail {

/// One kept graph: the leaf standing for the stage's input, the flat output autograd starts from, the
/// output gradient kept from I for W, the inputs of collective nodes (stage_call::collective_input).
struct graph_entry {
  ::at::Tensor input;
  ::at::Tensor output;
  ::at::Tensor seed;
  std::vector<::at::Tensor> anchors;
  bool input_done = false;
};

/// The graphs of one adapter, by (stage, micro-batch).
class graph_slots {
 public:
  explicit graph_slots(const char* who) noexcept : who_(who) {}

  /// Whether a graph is kept for (stage, mb).
  [[nodiscard]] bool contains(int stage, int mb) const { return map_.contains({stage, mb}); }
  /// Graphs kept.
  [[nodiscard]] std::size_t size() const noexcept { return map_.size(); }
  /// Drops every graph.
  void clear() noexcept { map_.clear(); }
  /// Throws unless (stage, mb) is free: a forward must not find a graph.
  void check_free(int stage, int mb) const {
    if (contains(stage, mb))
      throw_error<model::activation_error>(
          "{}: forward of (stage {}, micro-batch {}) found the autograd graph of an earlier forward of that "
          "slot still kept; expected each forward's backward to run before the slot's next forward",
          who_, stage, mb);
  }
  /// Keeps `e` for (stage, mb). Pre: check_free(stage, mb).
  void keep(int stage, int mb, graph_entry&& e) { map_.emplace(std::pair{stage, mb}, std::move(e)); }
  /// The graph of (stage, mb), for the pass named `what`; throws model::activation_error when none is kept.
  [[nodiscard]] graph_entry& find(int stage, int mb, const char* what) {
    const auto it = map_.find({stage, mb});
    if (it == map_.end())
      throw_error<model::activation_error>(
          "{}: {} of (stage {}, micro-batch {}) found no autograd graph; expected the slot's forward to run "
          "first (and its backward only once)",
          who_, what, stage, mb);
    return it->second;
  }
  /// Releases the graph of (stage, mb) (nothing when none is kept).
  void release(int stage, int mb) noexcept { map_.erase({stage, mb}); }

 private:
  std::map<std::pair<int, int>, graph_entry> map_;
  const char* who_;
};

/// Releases a slot when a backward pass ends, normally or by an exception (unless disarmed).
struct release_scope {
  graph_slots* slots;
  int stage, mb;
  bool armed = true;
  release_scope(graph_slots& s, int st, int m) noexcept : slots(&s), stage(st), mb(m) {}
  release_scope(const release_scope&) = delete;
  release_scope& operator=(const release_scope&) = delete;
  ~release_scope() {
    if (armed) slots->release(stage, mb);
  }
};

/// The forward both adapters run: x = a copy of `in` on `device` (a leaf that requires grad), y =
/// module_call(x) flattened, written into `out`; the graph is kept for (stage, mb). The binding must be set
/// for the call (the caller's binding_scope clears it). Throws activation_error when the slot holds a
/// graph, invalid_argument when y's dtype or size is wrong; on a throw nothing is kept.
template <element T, class F>
void forward_pass(graph_slots& slots, call_binding& b, ::at::Device device, std::span<const T> in,
                  std::span<T> out, F&& module_call) {
  slots.check_free(b.stage, b.micro_batch);
  graph_entry e;
  b.anchors = &e.anchors;
  const ::at::AutoGradMode grad_mode(true);
  e.input = as_tensor(in, {}, device).clone().requires_grad_(true);
  ::at::Tensor y = module_call(e.input);
  if (!y.defined() || y.scalar_type() != dtype_of<T>())
    throw_error<invalid_argument>(
        "{}: the module's forward at (stage {}, micro-batch {}) returned {}; expected "
        "a tensor of dtype {}",
        b.who, b.stage, b.micro_batch,
        y.defined() ? std::string(::c10::toString(y.scalar_type())) : "nothing",
        std::string(::c10::toString(dtype_of<T>())));
  y = y.reshape({-1});
  if (y.numel() != static_cast<std::int64_t>(out.size()))
    throw_error<invalid_argument>(
        "{}: the module's forward at (stage {}, micro-batch {}) returned {} elements; the stage's output "
        "buffer has {} (the module's output_size)",
        b.who, b.stage, b.micro_batch, y.numel(), out.size());
  copy_to(y.detach(), out, "output", device);
  e.output = y;
  b.anchors = nullptr;
  slots.keep(b.stage, b.micro_batch, std::move(e));
}

/// The gradient autograd starts from: `gout` (a copy when `keep`), or ones when gout is empty and the
/// stage seeds its own loss (`seeds_loss`). Throws invalid_argument on a size mismatch or a missing gradient.
template <element T>
::at::Tensor output_seed(const call_binding& b, const graph_entry& e, std::span<const T> gout,
                         bool seeds_loss, bool keep, ::at::Device device) {
  if (gout.empty() && seeds_loss) return ::at::ones_like(e.output);
  if (static_cast<std::int64_t>(gout.size()) != e.output.numel())
    throw_error<invalid_argument>(
        "{}: backward of (stage {}, micro-batch {}) got an output gradient of {} elements; the forward's "
        "output "
        "has {}",
        b.who, b.stage, b.micro_batch, gout.size(), e.output.numel());
  auto g = as_tensor(gout, {}, device);
  return keep ? g.clone() : g;
}

/// Writes the input gradient `g` (undefined: zero) into gin, unless gin is empty (raw inputs need none).
template <element T>
void write_input_gradient(const call_binding& b, const ::at::Tensor& g, std::span<T> gin,
                          std::int64_t in_size, ::at::Device device) {
  if (gin.empty()) return;
  if (static_cast<std::int64_t>(gin.size()) != in_size)
    throw_error<invalid_argument>(
        "{}: backward of (stage {}, micro-batch {}) got an input gradient buffer of {} elements; the input "
        "had {}",
        b.who, b.stage, b.micro_batch, gin.size(), in_size);
  if (g.defined())
    copy_to(g, gin, "input gradient", device);
  else
    as_tensor(gin, {}, device).zero_();
}

/// Full backward of the slot's graph: autograd from the output gradient into the trainable parameters
/// (flat.grads(), in place) and the input leaf (when gin is not empty, or `always_input`: a backbone stage
/// differentiates its input on every rank alike, as ring members must run the same nodes); writes gin;
/// releases the slot.
template <element T>
void backward_pass(graph_slots& slots, call_binding& b, flat_parameters<T>& flat, std::span<const T> gout,
                   std::span<T> gin, bool seeds_loss, bool always_input) {
  auto& e = slots.find(b.stage, b.micro_batch, "backward");
  const release_scope release(slots, b.stage, b.micro_batch);
  if (e.input_done)
    throw_error<model::activation_error>(
        "{}: backward of (stage {}, micro-batch {}) after its backward_input; "
        "expected backward_weight",
        b.who, b.stage, b.micro_batch);
  const auto seed = output_seed(b, e, gout, seeds_loss, false, flat.device());
  flat.bind_gradients();
  auto inputs = flat.trainable();
  if (always_input || !gin.empty()) inputs.push_back(e.input);  // raw encoder inputs need no gradient
  if (e.output.requires_grad()) ::torch::autograd::backward({e.output}, {seed}, false, false, inputs);
  write_input_gradient(b, e.input.grad(), gin, e.input.numel(), flat.device());
}

/// The I pass: the input gradient only (and the gradients of the collective nodes' inputs, so those nodes
/// run now and keep their results), keeping the graph and the output gradient for backward_weight.
template <element T>
void backward_input_pass(graph_slots& slots, call_binding& b, const flat_parameters<T>& flat,
                         std::span<const T> gout, std::span<T> gin, bool seeds_loss) {
  auto& e = slots.find(b.stage, b.micro_batch, "backward_input");
  release_scope release(slots, b.stage, b.micro_batch);
  if (e.input_done)
    throw_error<model::activation_error>("{}: backward_input of (stage {}, micro-batch {}) ran twice", b.who,
                                         b.stage, b.micro_batch);
  e.seed = output_seed(b, e, gout, seeds_loss, true, flat.device());
  std::vector<::at::Tensor> targets{e.input};
  for (const auto& a : e.anchors) targets.push_back(a);
  ::at::Tensor g;
  if (e.output.requires_grad())
    g = ::torch::autograd::grad({e.output}, targets, {e.seed}, true, false, true)[0];
  write_input_gradient(b, g, gin, e.input.numel(), flat.device());
  e.input_done = true;
  release.armed = false;
}

/// The W pass: the weight gradients of a slot whose I pass ran, into flat.grads(); releases the slot.
template <element T>
void backward_weight_pass(graph_slots& slots, call_binding& b, flat_parameters<T>& flat) {
  auto& e = slots.find(b.stage, b.micro_batch, "backward_weight");
  const release_scope release(slots, b.stage, b.micro_batch);
  if (!e.input_done)
    throw_error<model::activation_error>(
        "{}: backward_weight of (stage {}, micro-batch {}) before its backward_input", b.who, b.stage,
        b.micro_batch);
  flat.bind_gradients();
  const auto params = flat.trainable();
  if (e.output.requires_grad() && !params.empty())
    ::torch::autograd::backward({e.output}, {e.seed}, false, false, params);
}

}  // namespace hetmesh::libtorch::detail
