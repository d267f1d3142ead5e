// SPDX-License-Identifier: Apache-2.0
// The layers of the mllm_train example, as a user of hetmesh writes them: row-major [rows][cols] buffers,
// plain loops, each forward with a hand-written backward (linear maps, RMSNorm, SiLU, rotary position
// embedding), and a seeded, id-addressed parameter store. Nothing here knows about meshes or schedules:
// model.hpp composes these into the stages train::system runs.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/hash.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/attention.hpp>

namespace mllm {

/// The model's sizes (run-time values; a config file or the command line fills them).
struct config {
  std::int64_t vocab = 64;                        ///< vocabulary (token ids in [0, vocab))
  std::int64_t width = 32;                        ///< LLM width D
  hetmesh::model::attention_shape attn{4, 2, 8};  ///< q heads, kv heads (GQA), head_dim (even: RoPE)
  std::int64_t mlp_hidden = 64;                   ///< LLM MLP hidden width
  int blocks = 4;                                 ///< transformer blocks of the whole backbone
  std::int64_t patch = 12;                        ///< vision: features per patch (one patch per output token)
  std::int64_t frame = 10;                        ///< audio: features per frame (one frame per output token)
  std::int64_t enc_width = 24;                    ///< encoders' width d_enc
  std::int64_t enc_hidden = 48;                   ///< encoders' MLP hidden width
  int enc_layers = 2;                             ///< layers per encoder
  int enc_heads = 4;                              ///< encoders' attention heads (inside each item)
  double rope_base = 10000.0;                     ///< RoPE frequency base
  double norm_eps = 1e-6;                         ///< RMSNorm epsilon
  /// Experts of the MoE MLP that replaces the last block's dense MLP (0: no MoE layer; moe_mlp.hpp).
  std::int64_t moe_experts = 0;
  int moe_top_k = 2;             ///< experts per token of the MoE layer
  std::int64_t moe_hidden = 32;  ///< each expert's MLP hidden width

  friend bool operator==(const config&, const config&) = default;
};

/// Throws hetmesh::invalid_argument unless `c` is a usable model shape. O(1).
inline void check_config(const config& c) {
  hetmesh::model::check_attention_shape(c.attn, "mllm::config");
  if (c.vocab < 1 || c.width < 1 || c.mlp_hidden < 1 || c.blocks < 1 || c.patch < 1 || c.frame < 1 ||
      c.enc_width < 1 || c.enc_hidden < 1 || c.enc_layers < 0 || c.attn.head_dim % 2 != 0 ||
      c.enc_heads < 1 || c.enc_width % c.enc_heads != 0 || c.moe_experts < 0 ||
      (c.moe_experts > 0 && (c.moe_top_k < 1 || c.moe_top_k > c.moe_experts || c.moe_hidden < 1)))
    hetmesh::throw_error<hetmesh::invalid_argument>(
        "mllm::config: vocab {}, width {}, mlp_hidden {}, blocks {}, patch {}, frame {}, enc_width {}, "
        "enc_hidden {}, enc_layers {}, enc_heads {}, head_dim {}, moe_experts {}, moe_top_k {}, moe_hidden "
        "{}; expected positive sizes, enc_heads dividing enc_width, an even head_dim and (with experts) "
        "1 <= moe_top_k <= moe_experts",
        c.vocab, c.width, c.mlp_hidden, c.blocks, c.patch, c.frame, c.enc_width, c.enc_hidden, c.enc_layers,
        c.enc_heads, c.attn.head_dim, c.moe_experts, c.moe_top_k, c.moe_hidden);
}

/// y[n][m] = x[n][k] w[k][m]. O(nkm).
template <class T>
void matmul(std::span<const T> x, std::span<const T> w, std::span<T> y, std::size_t n, std::size_t k,
            std::size_t m) {
  for (std::size_t i = 0; i < n; ++i) {
    T* yr = y.data() + i * m;
    for (std::size_t j = 0; j < m; ++j) yr[j] = T(0);
    for (std::size_t e = 0; e < k; ++e) {
      const T a = x[i * k + e];
      const T* wr = w.data() + e * m;
      for (std::size_t j = 0; j < m; ++j) yr[j] += a * wr[j];
    }
  }
}
/// dw[k][m] += x[n][k]^T dy[n][m]. O(nkm).
template <class T>
void add_xt_dy(std::span<const T> x, std::span<const T> dy, std::span<T> dw, std::size_t n, std::size_t k,
               std::size_t m) {
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t e = 0; e < k; ++e) {
      const T a = x[i * k + e];
      T* dr = dw.data() + e * m;
      const T* gr = dy.data() + i * m;
      for (std::size_t j = 0; j < m; ++j) dr[j] += a * gr[j];
    }
}
/// dx[n][k] += dy[n][m] w[k][m]^T. O(nkm).
template <class T>
void add_dy_wt(std::span<const T> dy, std::span<const T> w, std::span<T> dx, std::size_t n, std::size_t k,
               std::size_t m) {
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t e = 0; e < k; ++e) {
      const T* wr = w.data() + e * m;
      const T* gr = dy.data() + i * m;
      T s = 0;
      for (std::size_t j = 0; j < m; ++j) s += gr[j] * wr[j];
      dx[i * k + e] += s;
    }
}

/// RMSNorm over rows of `w` features: y = x * rstd * g with rstd = 1 / sqrt(mean(x^2) + eps); writes
/// rstd per row (what the backward needs besides x and g). O(nw).
template <class T>
void rmsnorm_forward(std::span<const T> x, std::span<const T> g, std::span<T> y, std::span<T> rstd,
                     std::size_t n, std::size_t w, double eps) {
  for (std::size_t i = 0; i < n; ++i) {
    T s = 0;
    for (std::size_t e = 0; e < w; ++e) s += x[i * w + e] * x[i * w + e];
    const T r = T(1) / std::sqrt(s / static_cast<T>(w) + static_cast<T>(eps));
    rstd[i] = r;
    for (std::size_t e = 0; e < w; ++e) y[i * w + e] = x[i * w + e] * r * g[e];
  }
}
/// Input gradient of rmsnorm_forward: dx += rstd * (g dy - xhat * mean(g dy xhat)), xhat = x rstd. O(nw).
template <class T>
void rmsnorm_input_grad(std::span<const T> x, std::span<const T> g, std::span<const T> rstd,
                        std::span<const T> dy, std::span<T> dx, std::size_t n, std::size_t w) {
  for (std::size_t i = 0; i < n; ++i) {
    const T r = rstd[i];
    T dot = 0;
    for (std::size_t e = 0; e < w; ++e) dot += g[e] * dy[i * w + e] * x[i * w + e] * r;
    dot /= static_cast<T>(w);
    for (std::size_t e = 0; e < w; ++e) dx[i * w + e] += r * (g[e] * dy[i * w + e] - x[i * w + e] * r * dot);
  }
}
/// Gain gradient of rmsnorm_forward: dg[e] += sum_i dy[i][e] x[i][e] rstd[i]. O(nw).
template <class T>
void rmsnorm_gain_grad(std::span<const T> x, std::span<const T> rstd, std::span<const T> dy, std::span<T> dg,
                       std::size_t n, std::size_t w) {
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t e = 0; e < w; ++e) dg[e] += dy[i * w + e] * x[i * w + e] * rstd[i];
}

/// SiLU, y = u sigmoid(u), elementwise. O(size).
template <class T>
void silu_forward(std::span<const T> u, std::span<T> y) {
  for (std::size_t i = 0; i < u.size(); ++i) y[i] = u[i] / (T(1) + std::exp(-u[i]));
}
/// du = dy * silu'(u) = dy * s (1 + u (1 - s)), s = sigmoid(u) (overwrites du). O(size).
template <class T>
void silu_backward(std::span<const T> u, std::span<const T> dy, std::span<T> du) {
  for (std::size_t i = 0; i < u.size(); ++i) {
    const T s = T(1) / (T(1) + std::exp(-u[i]));
    du[i] = dy[i] * s * (T(1) + u[i] * (T(1) - s));
  }
}

/// Rotary position embedding in place on x [n][heads][head_dim]: the pair (2i, 2i+1) of each head of token
/// t turns by angle pos[t] * base^(-2i / head_dim); `sign` = -1 turns back (the transpose, which is the
/// backward of a rotation). Positions are per document, so a document's rotation does not depend on where
/// context parallelism put its tokens. O(n heads head_dim).
template <class T>
void rope(std::span<T> x, std::span<const std::int64_t> pos, std::size_t n, std::size_t heads,
          std::size_t head_dim, double base, int sign) {
  std::vector<double> freq(head_dim / 2);
  for (std::size_t i = 0; i < freq.size(); ++i)
    freq[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t i = 0; i < freq.size(); ++i) {
      const double ang = static_cast<double>(pos[t]) * freq[i];
      const T c = static_cast<T>(std::cos(ang)), s = static_cast<T>(sign) * static_cast<T>(std::sin(ang));
      for (std::size_t h = 0; h < heads; ++h) {
        T* p = x.data() + (t * heads + h) * head_dim + 2 * i;
        const T a = p[0], b = p[1];
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
      }
    }
}

/// Parameters and gradients keyed by a global tensor id, so that a model split over pipeline stages (each
/// rank holding some ids) and a whole model agree id by id. Values are pure functions of (seed, id, index):
/// uniform in [-scale, scale), plus `offset` (norm gains start near 1).
template <class T>
struct tensor_store {
  std::map<int, std::vector<T>> param, grad;  ///< by global tensor id

  /// Adds tensor `id` of `n` elements. Pre: id not present (invalid_argument). O(n).
  void add(int id, std::size_t n, std::uint64_t seed, double scale, double offset = 0.0) {
    add_block(id, n, seed, scale, offset, [](std::size_t i) { return i; });
  }
  /// Adds `n` elements of tensor `id` that a tensor-parallel layer holds: element i is element global(i)
  /// of the whole tensor (the same value whichever rank holds it). Pre: id not present. O(n).
  template <class Global>
  void add_block(int id, std::size_t n, std::uint64_t seed, double scale, double offset, Global global) {
    if (param.count(id) != 0)
      hetmesh::throw_error<hetmesh::invalid_argument>("mllm::tensor_store: tensor id {} added twice", id);
    auto& p = param[id];
    p.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto g = static_cast<std::uint64_t>(global(i));
      const double u =
          static_cast<double>(hetmesh::key_hash({seed, static_cast<std::uint64_t>(id), g}) >> 11) * 0x1.0p-53;
      p[i] = static_cast<T>(offset + scale * (2.0 * u - 1.0));
    }
    grad[id].assign(n, T(0));
  }
  /// The parameter tensor `id` (std::out_of_range when absent).
  [[nodiscard]] std::span<const T> p(int id) const { return param.at(id); }
  /// The gradient tensor `id` (std::out_of_range when absent).
  [[nodiscard]] std::span<T> g(int id) { return grad.at(id); }
  /// Every parameter tensor, in id order.
  [[nodiscard]] std::vector<std::span<T>> parameters() { return spans(param); }
  /// Every gradient tensor, in the same order as parameters().
  [[nodiscard]] std::vector<std::span<T>> gradients() { return spans(grad); }

 private:
  static std::vector<std::span<T>> spans(std::map<int, std::vector<T>>& m) {
    std::vector<std::span<T>> out;
    out.reserve(m.size());
    for (auto& [id, v] : m) out.emplace_back(v);
    return out;
  }
};

/// One tensor as a trainer sees it for checkpoints and comparisons: its global id, value and gradient.
template <class T>
struct tensor_ref {
  int id = 0;          ///< global tensor id (unique over the backbone and every encoder)
  std::span<T> value;  ///< the parameter
  std::span<T> grad;   ///< its gradient
};

/// The (id, value, gradient) list of a store, in id order (stable across runs and ranks).
template <class T>
[[nodiscard]] std::vector<tensor_ref<T>> tensor_refs(tensor_store<T>& s) {
  std::vector<tensor_ref<T>> out;
  out.reserve(s.param.size());
  for (auto& [id, v] : s.param) out.push_back({id, std::span<T>(v), std::span<T>(s.grad.at(id))});
  return out;
}

/// Throws hetmesh::invalid_argument unless a buffer has the elements the model expects. O(1).
inline void check_size(std::size_t got, std::size_t expected, const char* who, const char* what) {
  if (got != expected)
    hetmesh::throw_error<hetmesh::invalid_argument>("{}: {} has {} elements; expected {}", who, what, got,
                                                    expected);
}

}  // namespace mllm
