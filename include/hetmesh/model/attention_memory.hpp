// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: a memory policy that also runs attention's own arithmetic on its memory. Ring, Ulysses
// and long-short attention (run/) fold each block's partial output into the running one and compute the
// softmax-backward delta where the tensors live, so they ask their policy for these two operations; every
// other runtime piece (token dispatch, the pipeline executor, plan agreement, activation stores) needs
// only model::memory_policy. A header of its own, free of fmt (as memory_policy.hpp), so that nvcc
// translation units check cuda::device_memory against it.
#pragma once

#include <cstddef>
#include <span>

#include "memory_policy.hpp"

namespace hetmesh::model {

namespace detail {
template <class M, class T>
concept merges_attention = requires(const M& m, std::span<T> out, std::span<T> lse, std::span<const T> out_b,
                                    std::span<const T> lse_b, std::size_t dim) {
  m.merge_attention(out, lse, out_b, lse_b, dim);
};
template <class M, class T>
concept computes_attention_delta = requires(const M& m, std::span<const T> out, std::span<const T> dout,
                                            std::span<T> delta, std::size_t dim) {
  m.attention_delta(out, dout, delta, dim);
};
}  // namespace detail

/// A memory policy that can also merge attention partials and compute the softmax-backward delta on its
/// memory, for element type T (float or double). Requirements:
///  1. `memory_policy<M>`;
///  2. `m.merge_attention(out, lse, out_b, lse_b, dim)` on a const policy, with std::span<T> out and lse,
///     std::span<const T> out_b and lse_b, std::size_t dim: seq::merge_partial on spans of M::space (folds
///     block b's partial output and log-sum-exp into the running ones, rows = lse.size(), out holding rows
///     x dim elements; a block row with lse_b = -infinity, no visible key, changes nothing);
///  3. `m.attention_delta(out, dout, delta, dim)` on a const policy, with std::span<const T> out and dout,
///     std::span<T> delta: seq::attention_delta on spans of M::space (delta[r] = the dot product of row r
///     of dout and of out, rows = delta.size());
///  4. both may be asynchronous, ordered on the policy's stream like memory_policy's operations 3-5; sizes
///     that do not fit are a precondition violation.
/// Models: model::host_memory, model::emulated_device_memory (model/host_memory.hpp) and
/// cuda::device_memory (cuda/device_memory.hpp; checked in tests/cuda, since cuda/ does not include
/// model/).
template <class M, class T>
concept attention_memory =
    memory_policy<M> && detail::merges_attention<M, T> && detail::computes_attention_delta<M, T>;

/// Checks `attention_memory<M, T>` requirement by requirement: each one M misses fails a static_assert
/// that names it. Returns true (so `static_assert(check_attention_memory<M, T>())`).
template <class M, class T>
consteval bool check_attention_memory() {
  static_assert(memory_policy<M>,
                "attention_memory requirement 1: the type must be a model::memory_policy (its space, buffer "
                "type, copy, copy_2d, fill, add, upload, download and synchronize)");
  static_assert(
      detail::merges_attention<M, T>,
      "attention_memory requirement 2: missing `merge_attention(std::span<T> out, std::span<T> lse, "
      "std::span<const T> out_b, std::span<const T> lse_b, std::size_t dim) const`");
  static_assert(detail::computes_attention_delta<M, T>,
                "attention_memory requirement 3: missing `attention_delta(std::span<const T> out, "
                "std::span<const T> dout, std::span<T> delta, std::size_t dim) const`");
  return true;
}

}  // namespace hetmesh::model
