// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the library's CPU reference attention kernel, a model of model::attention_kernel for
// float and double. Exact softmax per block with a running maximum (no overflow for any score), the
// per-document causal mask of attention.hpp and grouped-query head mapping. It is the kernel tests, CPU
// runs and examples drive across rings; it favours clarity and bitwise determinism over speed
// (O(nq * nk * q_heads * head_dim) per block, no blocking or vectorisation).
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "../core/error.hpp"
#include "attention.hpp"

namespace hetmesh::model {

namespace detail {

/// Sizes of a block, checked against its spans.
struct block_dims {
  std::size_t nq = 0, nk = 0, hq = 1, hk = 1, dim = 1, group = 1;
};

template <class T>
block_dims check_block(const attention_block<T>& b, const char* who) {
  const auto& s = b.shape;
  check_attention_shape(s, who);
  if (b.mask == seq::block_mask::none)
    throw_error<invalid_argument>("{}: called with block_mask::none; expected full or causal", who);
  block_dims d;
  d.nq = b.q_doc.size();
  d.nk = b.k_doc.size();
  d.hq = static_cast<std::size_t>(s.q_heads);
  d.hk = static_cast<std::size_t>(s.kv_heads);
  d.dim = static_cast<std::size_t>(s.head_dim);
  d.group = d.hq / d.hk;
  if (b.q_pos.size() != d.nq || b.k_pos.size() != d.nk || b.q.size() != d.nq * d.hq * d.dim ||
      b.k.size() != d.nk * d.hk * d.dim || b.v.size() != b.k.size())
    throw_error<invalid_argument>(
        "{}: {} query tokens ({} positions, q of {} elements), {} key tokens ({} positions, k of {}, v of {} "
        "elements) for q_heads={}, kv_heads={}, head_dim={}; expected q = tokens*q_heads*head_dim and k, v "
        "= tokens*kv_heads*head_dim",
        who, d.nq, b.q_pos.size(), b.q.size(), d.nk, b.k_pos.size(), b.k.size(), b.v.size(), s.q_heads,
        s.kv_heads, s.head_dim);
  return d;
}

template <class T>
bool visible(const attention_block<T>& b, std::size_t i, std::size_t j) noexcept {
  return b.q_doc[i] == b.k_doc[j] && (b.mask == seq::block_mask::full || b.k_pos[j] <= b.q_pos[i]);
}

template <class T>
T dot(const T* a, const T* b, std::size_t n) noexcept {
  T s = 0;
  for (std::size_t e = 0; e < n; ++e) s += a[e] * b[e];
  return s;
}

}  // namespace detail

/// The CPU reference kernel: exact block attention for float and double (host memory). Stateless;
/// `forward` and `backward` are const and may run concurrently on distinct outputs. Deterministic: keys
/// are visited in order, so the same block gives bitwise the same results (requirement 3 of
/// attention_kernel).
struct reference_attention {
  /// Forward of one block: for each query row (token i, head h) that sees at least one key,
  /// out = softmax(scale * q k^T) v over the visible keys of KV head h / (q_heads / kv_heads), and
  /// lse = log sum exp of those scores; a row that sees no key gets lse = -infinity and out = 0.
  /// Pre: spans sized as attention_block describes (invalid_argument otherwise), out.out of nq*q_heads*
  /// head_dim and out.lse of nq*q_heads elements; mask is full or causal. Post: out overwritten.
  /// Not collective. Cost: O(nq * nk * q_heads * head_dim) time, O(nk) scratch.
  template <std::floating_point T>
  void forward(const attention_block<T>& b, attention_forward_out<T> out) const {
    const auto d = detail::check_block(b, "reference_attention::forward");
    if (out.out.size() != d.nq * d.hq * d.dim || out.lse.size() != d.nq * d.hq)
      throw_error<invalid_argument>(
          "reference_attention::forward: out of {} and lse of {} elements for {} query tokens; expected {} "
          "and {}",
          out.out.size(), out.lse.size(), d.nq, d.nq * d.hq * d.dim, d.nq * d.hq);
    constexpr T neg_inf = -std::numeric_limits<T>::infinity();
    std::vector<T> s(d.nk);
    for (std::size_t i = 0; i < d.nq; ++i)
      for (std::size_t h = 0; h < d.hq; ++h) {
        const std::size_t hk = h / d.group;
        const T* q = b.q.data() + (i * d.hq + h) * d.dim;
        T* o = out.out.data() + (i * d.hq + h) * d.dim;
        for (std::size_t e = 0; e < d.dim; ++e) o[e] = 0;
        T m = neg_inf;
        for (std::size_t j = 0; j < d.nk; ++j) {
          if (!detail::visible(b, i, j)) {
            s[j] = neg_inf;
            continue;
          }
          s[j] = b.scale * detail::dot(q, b.k.data() + (j * d.hk + hk) * d.dim, d.dim);
          if (s[j] > m) m = s[j];
        }
        if (m == neg_inf) {  // no visible key (or every score -inf): the documented empty row
          out.lse[i * d.hq + h] = neg_inf;
          continue;
        }
        T z = 0;
        for (std::size_t j = 0; j < d.nk; ++j) {
          if (s[j] == neg_inf) continue;
          const T p = std::exp(s[j] - m);
          z += p;
          const T* v = b.v.data() + (j * d.hk + hk) * d.dim;
          for (std::size_t e = 0; e < d.dim; ++e) o[e] += p * v[e];
        }
        for (std::size_t e = 0; e < d.dim; ++e) o[e] /= z;
        out.lse[i * d.hq + h] = m + std::log(z);
      }
  }

  /// Backward of one block from the merged lse and delta of its query rows: with P = exp(scale q k^T -
  /// lse) over visible keys, adds dv += P^T dout, dq += scale dS k and dk += scale dS^T q where dS =
  /// P * (dout v^T - delta). Rows with lse = -infinity contribute nothing.
  /// Pre: spans sized as attention_block and attention_backward_io describe (invalid_argument otherwise).
  /// Post: dq, dk, dv accumulated (never cleared). Not collective. Cost: O(nq * nk * q_heads *
  /// head_dim) time, no scratch.
  template <std::floating_point T>
  void backward(const attention_block<T>& b, attention_backward_io<T> io) const {
    const auto d = detail::check_block(b, "reference_attention::backward");
    if (io.dout.size() != b.q.size() || io.dq.size() != b.q.size() || io.lse.size() != d.nq * d.hq ||
        io.delta.size() != d.nq * d.hq || io.dk.size() != b.k.size() || io.dv.size() != b.k.size())
      throw_error<invalid_argument>(
          "reference_attention::backward: dout {}, dq {}, lse {}, delta {}, dk {}, dv {} elements; expected "
          "dout and dq {}, lse and delta {}, dk and dv {}",
          io.dout.size(), io.dq.size(), io.lse.size(), io.delta.size(), io.dk.size(), io.dv.size(),
          b.q.size(), d.nq * d.hq, b.k.size());
    constexpr T neg_inf = -std::numeric_limits<T>::infinity();
    for (std::size_t i = 0; i < d.nq; ++i)
      for (std::size_t h = 0; h < d.hq; ++h) {
        const T l = io.lse[i * d.hq + h];
        if (l == neg_inf) continue;
        const T dl = io.delta[i * d.hq + h];
        const std::size_t hk = h / d.group, r = (i * d.hq + h) * d.dim;
        const T* q = b.q.data() + r;
        const T* dout = io.dout.data() + r;
        T* dq = io.dq.data() + r;
        for (std::size_t j = 0; j < d.nk; ++j) {
          if (!detail::visible(b, i, j)) continue;
          const std::size_t c = (j * d.hk + hk) * d.dim;
          const T* k = b.k.data() + c;
          const T* v = b.v.data() + c;
          const T p = std::exp(b.scale * detail::dot(q, k, d.dim) - l);
          const T ds = p * (detail::dot(dout, v, d.dim) - dl);
          T* dk = io.dk.data() + c;
          T* dv = io.dv.data() + c;
          for (std::size_t e = 0; e < d.dim; ++e) {
            dv[e] += p * dout[e];
            dq[e] += b.scale * ds * k[e];
            dk[e] += b.scale * ds * q[e];
          }
        }
      }
  }
};

static_assert(attention_kernel<reference_attention, double>);
static_assert(attention_kernel<reference_attention, float>);

}  // namespace hetmesh::model
