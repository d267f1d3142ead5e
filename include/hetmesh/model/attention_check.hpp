// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the requirement-by-requirement check of attention_kernel (attention.hpp), so that a
// family that drives the user's kernel across rings (ring attention over CP or HDP rings) fails at compile
// time with a message naming what the kernel lacks.
#pragma once

#include "attention.hpp"

namespace hetmesh::model {

namespace detail {
template <class K, class T>
concept attention_forward = requires(K& k, const attention_block<T>& b, attention_forward_out<T> o) {
  k.forward(b, o);
};
template <class K, class T>
concept attention_backward = requires(K& k, const attention_block<T>& b, attention_backward_io<T> g) {
  k.backward(b, g);
};
}  // namespace detail

/// Checks attention_kernel<K, T> requirement by requirement: each one K misses fails a static_assert that
/// names it. Returns true (so `static_assert(check_attention_kernel<K, T>())`).
template <class K, class T>
consteval bool check_attention_kernel() {
  static_assert(detail::attention_forward<K, T>,
                "attention_kernel requirement 1: missing `forward(const attention_block<T>&, "
                "attention_forward_out<T>)` (block output and row log-sum-exp)");
  static_assert(detail::attention_backward<K, T>,
                "attention_kernel requirement 2: missing `backward(const attention_block<T>&, "
                "attention_backward_io<T>)` (adds dq, dk, dv; ring attention's backward needs it)");
  return true;
}

namespace detail {
/// The shape of a conforming kernel, for the static_assert below (it computes nothing).
template <class T>
struct attention_kernel_archetype {
  void forward(const attention_block<T>&, attention_forward_out<T>) {}
  void backward(const attention_block<T>&, attention_backward_io<T>) {}
};
}  // namespace detail

static_assert(attention_kernel<detail::attention_kernel_archetype<float>, float>);
static_assert(check_attention_kernel<detail::attention_kernel_archetype<double>, double>());

}  // namespace hetmesh::model
