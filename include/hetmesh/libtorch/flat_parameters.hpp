// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: a module's parameters and gradients in one flat buffer each. The runtime reduces and
// updates a stage's parameters and gradients as ranges of spans (model::stage_parameters); a libtorch
// module keeps them in its own tensors. flat_parameters moves every parameter's data into one flat
// parameter tensor and gives every parameter a .grad that is a view into one flat gradient tensor, so the
// spans the runtime sees are the module's own memory: an update through a span is an update of the module,
// and autograd accumulates into the flat gradient buffer in place (AccumulateGrad adds into a defined
// .grad when it does not build a graph of the backward).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "../core/error.hpp"
#include "tensor_view.hpp"

namespace hetmesh::libtorch {

/// The parameters of a module (or any list of parameter tensors) moved into one flat value tensor and one
/// flat gradient tensor of element type T. After construction:
///  - tensors()[i] is the i-th parameter (the same tensor object the module holds), whose data is the
///    elements [offset(i), offset(i) + numel) of values(), and whose .grad is the same range of grads();
///  - parameters()[i] and gradients()[i] are spans over those ranges (model::stage_parameters), in the
///    order of the list (`module.parameters()` order: registration order, recursively);
///  - the values are the parameters' values before the move; the gradients are zero, or the parameter's
///    .grad when it had one.
/// Copies share the flat tensors. Not thread-safe (one per stage, one stage per rank).
template <element T>
class flat_parameters {
 public:
  /// Element type.
  using value_type = T;

  /// No parameters.
  flat_parameters() = default;

  /// Moves `params` into the flat buffers. Pre: every tensor is defined, of dtype dtype_of<T>() and on one
  /// device (invalid_argument naming the parameter otherwise). Duplicates (one tensor listed twice) are
  /// moved once. O(total elements).
  explicit flat_parameters(std::vector<::at::Tensor> params) : tensors_(std::move(params)) {
    dedupe();
    ::at::Device device = ::at::kCPU;
    std::int64_t total = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto& p = tensors_[i];
      if (!p.defined())
        throw_error<invalid_argument>("libtorch::flat_parameters: parameter {} is undefined", i);
      if (p.scalar_type() != dtype_of<T>())
        throw_error<invalid_argument>("libtorch::flat_parameters: parameter {} has dtype {}; expected {}", i,
                                      std::string(::c10::toString(p.scalar_type())),
                                      std::string(::c10::toString(dtype_of<T>())));
      if (i == 0) device = p.device();
      if (p.device() != device)
        throw_error<invalid_argument>("libtorch::flat_parameters: parameter {} is on {}; parameter 0 on {}",
                                      i, p.device().str(), device.str());
      offsets_.push_back(total);
      total += p.numel();
    }
    offsets_.push_back(total);
    const auto options = ::at::TensorOptions().dtype(dtype_of<T>()).device(device);
    values_ = ::at::empty({total}, options);
    grads_ = ::at::zeros({total}, options);
    const ::at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      auto& p = tensors_[i];
      auto v = view(values_, i);
      v.copy_(p.detach());
      auto g = view(grads_, i);
      if (p.grad().defined()) g.copy_(p.grad());
      p.set_data(v);
      p.mutable_grad() = g;
    }
    device_ = device;
    make_spans();
  }

  /// Moves the parameters of `module` (`module.parameters()`, recursively) into the flat buffers, as the
  /// list constructor.
  explicit flat_parameters(::torch::nn::Module& module) : flat_parameters(module.parameters()) {}

  /// One span per parameter over its values (model::stage_parameters requirement 1). O(1).
  [[nodiscard]] const std::vector<std::span<T>>& parameters() const noexcept { return param_spans_; }
  /// One span per parameter over its gradient, same order and sizes (requirement 2). O(1).
  [[nodiscard]] const std::vector<std::span<T>>& gradients() const noexcept { return grad_spans_; }
  /// The flat value tensor (1-D): every parameter's data is a view into it.
  [[nodiscard]] const ::at::Tensor& values() const noexcept { return values_; }
  /// The flat gradient tensor (1-D): every parameter's .grad is a view into it.
  [[nodiscard]] const ::at::Tensor& grads() const noexcept { return grads_; }
  /// The parameter tensors, in order (the module's own tensor objects).
  [[nodiscard]] const std::vector<::at::Tensor>& tensors() const noexcept { return tensors_; }
  /// Number of parameters.
  [[nodiscard]] std::size_t count() const noexcept { return tensors_.size(); }
  /// Total elements over every parameter.
  [[nodiscard]] std::int64_t size() const noexcept { return offsets_.empty() ? 0 : offsets_.back(); }
  /// First element of parameter i in the flat buffers. Pre: i < count().
  [[nodiscard]] std::int64_t offset(std::size_t i) const noexcept { return offsets_[i]; }
  /// The device the flat buffers live on.
  [[nodiscard]] ::at::Device device() const noexcept { return device_; }

  /// The parameters that require grad (what a backward accumulates into), in order.
  [[nodiscard]] std::vector<::at::Tensor> trainable() const {
    std::vector<::at::Tensor> out;
    for (const auto& p : tensors_)
      if (p.requires_grad()) out.push_back(p);
    return out;
  }

  /// Makes every parameter's .grad the view into grads() again, where something replaced it (a
  /// `zero_grad(true)` left it undefined: the view keeps its values, the runtime zeroes it; an optimizer or
  /// autograd gave it a tensor of its own: its values are copied into the view first). The adapters call it
  /// before each backward. O(parameters), plus the copies.
  void bind_gradients() {
    const ::at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      auto& p = tensors_[i];
      auto& g = p.mutable_grad();
      auto v = view(grads_, i);
      if (g.defined() && g.data_ptr() == v.data_ptr() && g.sizes() == v.sizes()) continue;
      if (g.defined()) v.copy_(g);
      g = v;
    }
  }

 private:
  [[nodiscard]] ::at::Tensor view(const ::at::Tensor& flat, std::size_t i) const {
    return flat.narrow(0, offsets_[i], offsets_[i + 1] - offsets_[i]).view(tensors_[i].sizes());
  }
  void dedupe() {
    std::vector<::at::Tensor> unique;
    for (auto& p : tensors_) {
      bool seen = false;
      for (const auto& q : unique) seen = seen || q.is_same(p);
      if (!seen) unique.push_back(p);
    }
    tensors_ = std::move(unique);
  }
  void make_spans() {
    param_spans_.clear();
    grad_spans_.clear();
    auto* v = size() > 0 ? values_.data_ptr<T>() : nullptr;
    auto* g = size() > 0 ? grads_.data_ptr<T>() : nullptr;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto n = static_cast<std::size_t>(offsets_[i + 1] - offsets_[i]);
      const auto at = static_cast<std::size_t>(offsets_[i]);
      param_spans_.push_back(n == 0 ? std::span<T>() : std::span<T>(v + at, n));
      grad_spans_.push_back(n == 0 ? std::span<T>() : std::span<T>(g + at, n));
    }
  }

  std::vector<::at::Tensor> tensors_;
  std::vector<std::int64_t> offsets_;
  ::at::Tensor values_;
  ::at::Tensor grads_;
  ::at::Device device_ = ::at::kCPU;
  std::vector<std::span<T>> param_spans_;
  std::vector<std::span<T>> grad_spans_;
};

}  // namespace hetmesh::libtorch
