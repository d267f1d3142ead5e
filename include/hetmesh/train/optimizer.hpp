// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: optimizer hooks train::system::run calls after the gradient reduction, as
// `o(parameters, gradients)` (ranges of spans, same order and sizes), once for the backbone stage and once
// per encoder. sgd is stateless; adam keeps its moments per parameter span (keyed by the span's storage,
// which a model keeps in place across steps) and exposes them so a trainer can checkpoint and restore them.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <ranges>
#include <span>
#include <vector>

#include "../config.hpp"
#include "../core/error.hpp"

namespace hetmesh::train {

/// A plain SGD optimizer hook: p -= lr * g for every parameter. Deterministic; O(parameters).
template <class T>
struct sgd {
  /// The element type of the parameters.
  using value_type = T;
  T lr = T(0.01);  ///< learning rate

  /// Updates every parameter span in place from its gradient span (same order and sizes).
  template <class Params, class Grads>
  void operator()(Params&& params, Grads&& grads) const {
    auto g = std::ranges::begin(grads);
    for (auto p : params) {
      std::span<T> ps(p);
      std::span<T> gs(*g);
      for (std::size_t i = 0; i < ps.size(); ++i) ps[i] -= lr * gs[i];
      ++g;
    }
  }
};

/// Adam's state of one parameter tensor: its first and second moments and its update count.
template <class T>
struct adam_moments {
  std::vector<T> m;    ///< first moment
  std::vector<T> v;    ///< second moment
  std::int64_t t = 0;  ///< updates so far
};

/// Adam (Kingma and Ba), with optional decoupled weight decay (AdamW). Moments are kept per parameter
/// span, keyed by its data pointer: the model's tensors must stay in place between steps. Deterministic;
/// O(parameters) per call.
template <class T>
struct adam {
  /// The element type of the parameters.
  using value_type = T;
  T lr = T(1e-3);                               ///< learning rate
  T beta1 = T(0.9);                             ///< first-moment decay
  T beta2 = T(0.999);                           ///< second-moment decay
  T eps = T(1e-8);                              ///< denominator guard
  T weight_decay = T(0);                        ///< decoupled weight decay (AdamW); 0 = Adam
  std::map<const T*, adam_moments<T>> state{};  ///< per parameter span (by data pointer)

  /// Updates every parameter span in place from its gradient span (same order and sizes). Errors: a
  /// gradient span of another size than its parameter's (invalid_argument).
  template <class Params, class Grads>
  void operator()(Params&& params, Grads&& grads) {
    auto g = std::ranges::begin(grads);
    for (auto p : params) {
      step(std::span<T>(p), std::span<const T>(std::span<T>(*g)));
      ++g;
    }
  }

  /// Updates parameters `ps` in place from gradient `gs` (one tensor; operator() calls it for each). Errors:
  /// sizes that differ (invalid_argument).
  void step(std::span<T> ps, std::span<const T> gs);

  /// Bytes of the moments held (both moments of every tensor stepped so far).
  [[nodiscard]] std::int64_t state_bytes() const noexcept {
    std::int64_t n = 0;
    for (const auto& [p, s] : state) n += static_cast<std::int64_t>((s.m.size() + s.v.size()) * sizeof(T));
    return n;
  }

  /// The moments of the tensor stored at `p` (created zero on first use; resized if its size changed).
  adam_moments<T>& moments(std::span<const T> p);
};

template <class T>
void adam<T>::step(std::span<T> ps, std::span<const T> gs) {
  if (gs.size() != ps.size())
    throw_error<invalid_argument>("train::adam: a gradient of {} elements for {} parameters; expected equal",
                                  gs.size(), ps.size());
  auto& s = moments(ps);
  ++s.t;
  const T c1 = T(1) - static_cast<T>(std::pow(static_cast<double>(beta1), static_cast<double>(s.t)));
  const T c2 = T(1) - static_cast<T>(std::pow(static_cast<double>(beta2), static_cast<double>(s.t)));
  for (std::size_t i = 0; i < ps.size(); ++i) {
    s.m[i] = beta1 * s.m[i] + (T(1) - beta1) * gs[i];
    s.v[i] = beta2 * s.v[i] + (T(1) - beta2) * gs[i] * gs[i];
    const T mh = s.m[i] / c1, vh = s.v[i] / c2;
    ps[i] -= lr * (mh / (std::sqrt(vh) + eps) + weight_decay * ps[i]);
  }
}

template <class T>
adam_moments<T>& adam<T>::moments(std::span<const T> p) {
  auto& s = state[p.data()];
  if (s.m.size() != p.size()) {
    s.m.assign(p.size(), T(0));
    s.v.assign(p.size(), T(0));
    s.t = 0;
  }
  return s;
}

// Compiled once (HETMESH_SEPARATE_COMPILATION): Adam's update of float and double tensors.
// HETMESH_INSTANTIATE is `extern template` in every translation unit but the one of <hetmesh/src.hpp>
// (config.hpp).
#if HETMESH_SEPARATE_COMPILATION
HETMESH_INSTANTIATE struct adam<float>;
HETMESH_INSTANTIATE struct adam<double>;
#endif

}  // namespace hetmesh::train
