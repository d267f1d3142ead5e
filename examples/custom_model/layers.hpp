// SPDX-License-Identifier: Apache-2.0
// example_custom_model's building blocks: a store of named tensors (every tensor has a global id, so a
// pipelined run's gradients compare with a 1-rank run's tensor by tensor) and three dense products over
// row-major buffers. Nothing here knows hetmesh beyond train::model_tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include <hetmesh/core/hash.hpp>
#include <hetmesh/model/attention.hpp>
#include <hetmesh/train/parity.hpp>

namespace custom {

/// The model's sizes (small, so that every layout's check runs in about a second on a CPU).
struct shape {
  std::int64_t vocab = 32;                        ///< token ids 0 (pad), 1 (video placeholder), 2..31 text
  std::int64_t width = 16;                        ///< the backbone's rows
  hetmesh::model::attention_shape attn{2, 1, 8};  ///< backbone attention: 2 query heads, 1 KV head
  int blocks = 2;                                 ///< backbone blocks (mixer + attention), over the stages
  std::int64_t patches = 4;                       ///< patches per video frame (one LLM token each)
  std::int64_t patch_dim = 6;                     ///< floats per patch
  std::int64_t max_frames = 4;                    ///< frames of the longest clip (time embeddings)
  std::int64_t enc_width = 8;                     ///< the encoder's rows
  int enc_heads = 2;                              ///< the encoder's attention heads
};

/// y[n][m] = x[n][k] w[k][m].
template <class T>
void matmul(std::span<const T> x, std::span<const T> w, std::span<T> y, std::size_t n, std::size_t k,
            std::size_t m) {
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      T s = 0;
      for (std::size_t e = 0; e < k; ++e) s += x[i * k + e] * w[e * m + j];
      y[i * m + j] = s;
    }
}
/// dw[k][m] += x[n][k]^T dy[n][m] (a weight's gradient).
template <class T>
void add_xt_dy(std::span<const T> x, std::span<const T> dy, std::span<T> dw, std::size_t n, std::size_t k,
               std::size_t m) {
  for (std::size_t e = 0; e < k; ++e)
    for (std::size_t j = 0; j < m; ++j) {
      T s = 0;
      for (std::size_t i = 0; i < n; ++i) s += x[i * k + e] * dy[i * m + j];
      dw[e * m + j] += s;
    }
}
/// dx[n][k] += dy[n][m] w[k][m]^T (an input's gradient).
template <class T>
void add_dy_wt(std::span<const T> dy, std::span<const T> w, std::span<T> dx, std::size_t n, std::size_t k,
               std::size_t m) {
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t e = 0; e < k; ++e) {
      T s = 0;
      for (std::size_t j = 0; j < m; ++j) s += dy[i * m + j] * w[e * m + j];
      dx[i * k + e] += s;
    }
}

/// Parameters and gradients by global tensor id. A parameter is a pure function of (seed, id, index), so
/// every rank, and the 1-rank reference, builds the same model whatever stages it holds.
template <class T>
struct tensor_store {
  std::map<int, std::vector<T>> param, grad;

  /// Adds tensor `id` of `n` elements, uniform in [-scale, scale) around `bias`.
  void add(int id, std::size_t n, std::uint64_t seed, double scale, double bias = 0.0) {
    auto& p = param[id];
    p.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const double u =
          static_cast<double>(hetmesh::key_hash({seed, static_cast<std::uint64_t>(id), i}) >> 11) * 0x1.0p-53;
      p[i] = static_cast<T>(bias + scale * (2 * u - 1));
    }
    grad[id].assign(n, T(0));
  }
  [[nodiscard]] std::span<const T> p(int id) const { return param.at(id); }
  [[nodiscard]] std::span<T> g(int id) { return grad.at(id); }
  [[nodiscard]] std::vector<std::span<T>> parameters() { return spans(param); }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return spans(grad); }
  /// (id, value, gradient) of every tensor, in id order: what train::check_parity compares.
  [[nodiscard]] std::vector<hetmesh::train::model_tensor<T>> tensors() {
    std::vector<hetmesh::train::model_tensor<T>> out;
    for (auto& [id, v] : param) out.push_back({id, v, grad.at(id)});
    return out;
  }

 private:
  static std::vector<std::span<T>> spans(std::map<int, std::vector<T>>& m) {
    std::vector<std::span<T>> out;
    for (auto& [id, v] : m) out.emplace_back(v);
    return out;
  }
};

}  // namespace custom
