// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: tensors over the runtime's spans and spans over tensors, without copies. The
// runtime hands stages std::span buffers it sized from the plan; a libtorch module computes on tensors.
// as_tensor views a span as a tensor (torch's from_blob: the tensor does not own the memory), as_span
// views a contiguous tensor of T as a span, copy_to writes a tensor's values into a span. Element types
// are float and double (dtype_of).
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include <ATen/ATen.h>
#include <fmt/ranges.h>

#include "../core/error.hpp"

namespace hetmesh::libtorch {

/// The element types the libtorch component handles: float and double.
template <class T>
concept element = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// The torch scalar type of element type T: at::kFloat for float, at::kDouble for double. O(1).
template <element T>
[[nodiscard]] constexpr ::c10::ScalarType dtype_of() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return ::at::kFloat;
  else
    return ::at::kDouble;
}

/// A tensor over the memory of `s` (no copy; torch's from_blob), of shape `sizes` (default: 1-D of
/// s.size() elements) on `device` (where the memory is: CPU by default). The tensor does not own the memory:
/// the caller keeps it alive while the tensor or any view of it is used. Over a span of const elements the
/// tensor must not be written (torch has no const tensors). Does not require grad. Pre: the product of
/// `sizes` is s.size() (invalid_argument otherwise). An empty span gives an empty tensor of its own. O(1).
template <class E>
requires element<std::remove_const_t<E>>
[[nodiscard]] ::at::Tensor as_tensor(std::span<E> s, ::at::IntArrayRef sizes = {},
                                     ::at::Device device = ::at::kCPU) {
  using T = std::remove_const_t<E>;
  const auto n = static_cast<std::int64_t>(s.size());
  std::int64_t product = 1;
  for (const auto d : sizes) product *= d;
  if (!sizes.empty() && product != n)
    throw_error<invalid_argument>("libtorch::as_tensor: shape {} has {} elements; the span has {}",
                                  sizes.vec(), product, n);
  const auto options = ::at::TensorOptions().dtype(dtype_of<T>()).device(device);
  const std::vector<std::int64_t> flat{n};
  const ::at::IntArrayRef shape = sizes.empty() ? ::at::IntArrayRef(flat) : sizes;
  if (n == 0) return ::at::empty(shape, options);
  return ::at::from_blob(const_cast<T*>(s.data()), shape, options);
}

/// A span over the elements of `t` (no copy), in its memory (device memory for a CUDA tensor). E is T or
/// const T. Pre: t is defined, of dtype dtype_of<T>() and contiguous (invalid_argument naming what differs
/// otherwise). The span is valid while t's storage lives and is not resized. O(1).
template <class E>
requires element<std::remove_const_t<E>>
[[nodiscard]] std::span<E> as_span(const ::at::Tensor& t) {
  using T = std::remove_const_t<E>;
  if (!t.defined()) throw_error<invalid_argument>("libtorch::as_span: the tensor is undefined");
  if (t.scalar_type() != dtype_of<T>())
    throw_error<invalid_argument>("libtorch::as_span: the tensor has dtype {}; expected {}",
                                  std::string(::c10::toString(t.scalar_type())),
                                  std::string(::c10::toString(dtype_of<T>())));
  if (!t.is_contiguous())
    throw_error<invalid_argument>("libtorch::as_span: the tensor of shape {} is not contiguous",
                                  t.sizes().vec());
  const auto n = static_cast<std::size_t>(t.numel());
  if (n == 0) return {};
  return std::span<E>(t.data_ptr<T>(), n);
}

/// Writes the values of `src` (any shape, layout and device; converted to T) into `dst` in row-major
/// order. Pre: src.numel() == dst.size() (invalid_argument naming `what` otherwise); dst is memory of
/// `device`. Does not record autograd history. O(numel).
template <element T>
void copy_to(const ::at::Tensor& src, std::span<T> dst, const char* what = "output",
             ::at::Device device = ::at::kCPU) {
  if (!src.defined() || src.numel() != static_cast<std::int64_t>(dst.size()))
    throw_error<invalid_argument>("libtorch: the {} tensor has {} elements; its buffer has {}", what,
                                  src.defined() ? src.numel() : std::int64_t{-1}, dst.size());
  if (dst.empty()) return;
  const ::at::NoGradGuard no_grad;
  as_tensor(dst, {}, device).copy_(src.reshape({-1}));
}

}  // namespace hetmesh::libtorch
