// SPDX-License-Identifier: Apache-2.0
// The GPU example's optimizer: train::adam's update (the same formula, hyper-parameters and per-tensor
// step count) with the moments in a memory policy's memory and the update as one math<T> kernel per
// tensor, as train::system's optimizer hook: o(parameters, gradients) once per step after the gradient
// reduction, for the backbone stages and then for each encoder.
#pragma once

#include <cstdint>
#include <map>
#include <span>

#include <hetmesh/core/error.hpp>
#include <hetmesh/model/memory_policy.hpp>

#include "mllm_train_gpu/math.hpp"

namespace mllm_gpu {

/// Adam(W) over parameters in M's memory (an optimizer hook of train::system). Moments are kept per
/// parameter tensor, keyed by its data pointer (the model's tensors stay in place between steps).
template <class T, hetmesh::model::memory_policy M>
class adam {
 public:
  T lr = T(1e-3);         ///< learning rate
  T beta1 = T(0.9);       ///< first-moment decay
  T beta2 = T(0.999);     ///< second-moment decay
  T eps = T(1e-8);        ///< denominator guard
  T weight_decay = T(0);  ///< decoupled weight decay (AdamW)

  /// Adam on `k`'s backend (moments in buffers of M, which must be `k`'s memory); `k` outlives it.
  adam(T learning_rate, const math<T>& k) : lr(learning_rate), k_(&k) {}

  /// Updates every parameter tensor in place from its gradient (same order and sizes; invalid_argument
  /// otherwise). One kernel per tensor.
  template <class Params, class Grads>
  void operator()(Params&& params, Grads&& grads) {
    auto g = std::ranges::begin(grads);
    for (auto p : params) {
      std::span<T> ps(p), gs(*g);
      ++g;
      if (gs.size() != ps.size())
        hetmesh::throw_error<hetmesh::invalid_argument>(
            "mllm_gpu::adam: a gradient of {} elements for {} parameters; expected equal", gs.size(),
            ps.size());
      auto& s = state_[ps.data()];
      if (s.m.size() != ps.size()) {
        s.m.resize(ps.size()), s.v.resize(ps.size()), s.t = 0;
        k_->fill(s.m.span().data(), T(0), static_cast<std::int64_t>(ps.size()));
        k_->fill(s.v.span().data(), T(0), static_cast<std::int64_t>(ps.size()));
      }
      ++s.t;
      k_->adam(ps.data(), gs.data(), s.m.span().data(), s.v.span().data(),
               static_cast<std::int64_t>(ps.size()), lr, beta1, beta2, eps, weight_decay, s.t);
    }
  }

 private:
  struct moments {
    typename M::template buffer<T> m, v;
    std::int64_t t = 0;
  };
  const math<T>* k_;
  std::map<const T*, moments> state_;
};

}  // namespace mllm_gpu
