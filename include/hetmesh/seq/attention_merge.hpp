// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: the numerics that let attention be computed block by block (ring attention, and any
// split of the keys). A block's partial output o_b (softmax over its keys only) and its row
// log-sum-exp lse_b merge exactly into the running (o, lse):
//   lse' = log(exp(lse) + exp(lse_b)),  o' = o*exp(lse - lse') + o_b*exp(lse_b - lse').
// Backward needs, per query row, the final lse and delta = rowsum(dO * O); each block then
// recomputes P = exp(S - lse) and contributes dV += P^T dO, dS = P*(dO V^T - delta),
// dQ += scale*dS K, dK += scale*dS^T Q, independently of every other block.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

#include "../core/assert.hpp"

namespace hetmesh::seq {

/// Merges a block's partial attention (out_b, lse_b) into the running (out, lse), in place. Rows
/// are `lse.size()`, each of `dim` values, row-major. A row with lse = -inf holds nothing yet; a
/// block row with lse_b = -inf (no visible key) changes nothing. Pure arithmetic, O(rows*dim);
/// exact up to rounding, and associative, so blocks may arrive in any order.
template <class T>
void merge_partial(std::span<T> out, std::span<T> lse, std::span<const T> out_b, std::span<const T> lse_b,
                   std::size_t dim) {
  HETMESH_ASSERT(lse.size() == lse_b.size() && out.size() == lse.size() * dim && out_b.size() == out.size(),
                 "merge_partial: rows {} vs {}, out {} vs {}, dim {}", lse.size(), lse_b.size(), out.size(),
                 out_b.size(), dim);
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const T b = lse_b[i];
    if (b == neg_inf) continue;
    const T a = lse[i];
    T* o = out.data() + i * dim;
    const T* ob = out_b.data() + i * dim;
    if (a == neg_inf) {
      for (std::size_t d = 0; d < dim; ++d) o[d] = ob[d];
      lse[i] = b;
      continue;
    }
    const T m = a > b ? a : b;
    const T merged = m + std::log(std::exp(a - m) + std::exp(b - m));
    const T wa = std::exp(a - merged), wb = std::exp(b - merged);
    for (std::size_t d = 0; d < dim; ++d) o[d] = o[d] * wa + ob[d] * wb;
    lse[i] = merged;
  }
}

/// delta[i] = sum_d dout[i,d] * out[i,d]: the per-row term of the softmax backward, computed once
/// from the merged output and reused by every block's backward. O(rows*dim).
template <class T>
void attention_delta(std::span<const T> out, std::span<const T> dout, std::span<T> delta, std::size_t dim) {
  HETMESH_ASSERT(out.size() == dout.size() && out.size() == delta.size() * dim,
                 "attention_delta: out {}, dout {}, rows {}, dim {}", out.size(), dout.size(), delta.size(),
                 dim);
  for (std::size_t i = 0; i < delta.size(); ++i) {
    T s = 0;
    for (std::size_t d = 0; d < dim; ++d) s += dout[i * dim + d] * out[i * dim + d];
    delta[i] = s;
  }
}

}  // namespace hetmesh::seq
