// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm: reduction operators and the host arithmetic that applies them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"

namespace hetmesh::comm {

/// How all_reduce and reduce_scatter combine the ranks' values.
/// `avg` is the sum divided by the group size; on integer types the division truncates toward zero
/// (C++ integer division), on floating types it rounds once, after the exact-order sum.
enum class reduce_op : std::uint8_t { sum, prod, min, max, avg };

/// The operation's name ("sum", "prod", "min", "max", "avg"), for messages and printing.
[[nodiscard]] constexpr const char* reduce_op_name(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::prod:
      return "prod";
    case reduce_op::min:
      return "min";
    case reduce_op::max:
      return "max";
    case reduce_op::avg:
      return "avg";
  }
  return "?";
}

namespace detail {

/// dst[i] = op(dst[i], src[i]) for i < n, where avg accumulates as sum (the division is separate, in
/// `finish_reduce`, so that every backend rounds once at the end). Loops are written per operator so
/// that the compiler vectorises each one.
template <class T>
void reduce_into(T* dst, const T* src, std::size_t n, reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(dst[i] + src[i]);
      break;
    case reduce_op::prod:
      for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(dst[i] * src[i]);
      break;
    case reduce_op::min:
      for (std::size_t i = 0; i < n; ++i) dst[i] = std::min(dst[i], src[i]);
      break;
    case reduce_op::max:
      for (std::size_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
      break;
  }
}

/// Applies the final step of `op` to a reduced buffer: divides by `group_size` for avg.
template <class T>
void finish_reduce(T* data, std::size_t n, reduce_op op, int group_size) noexcept {
  if (op != reduce_op::avg) return;
  const T d = static_cast<T>(group_size);
  for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / d);
}

}  // namespace detail
}  // namespace hetmesh::comm

template <>
struct fmt::formatter<hetmesh::comm::reduce_op> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::comm::reduce_op op, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", hetmesh::comm::reduce_op_name(op));
  }
};
