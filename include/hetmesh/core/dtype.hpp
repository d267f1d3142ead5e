// SPDX-License-Identifier: Apache-2.0
// hetmesh: element types, one enum for the whole library. Communicators speak in `dtype` values (MPI
// datatypes and NCCL data types are looked up from them, and a communicator checks that every rank of a
// collective passed the same dtype); dataset formats name their on-disk element type with it (Megatron's
// indexed datasets map their own codes to it, see data::dtype_from_megatron_code). Device types
// (`__half`, `__nv_bfloat16`) get their dtype_of in hetmesh/cuda/half.hpp, so this header needs only std.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

#include "error.hpp"
#include "format.hpp"

namespace hetmesh {

/// The element types hetmesh names. Collectives move those with a dtype_of (below); the 16-bit
/// floating types exist only on the device (NCCL), and the 16-bit integers only in dataset files.
enum class dtype : std::uint8_t {
  int8,
  uint8,
  int16,
  uint16,
  int32,
  uint32,
  int64,
  uint64,
  float16,
  bfloat16,
  float32,
  float64
};

/// Size in bytes of one element of `t`. Pure; O(1).
[[nodiscard]] constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::int8:
    case dtype::uint8:
      return 1;
    case dtype::int16:
    case dtype::uint16:
    case dtype::float16:
    case dtype::bfloat16:
      return 2;
    case dtype::int32:
    case dtype::uint32:
    case dtype::float32:
      return 4;
    case dtype::int64:
    case dtype::uint64:
    case dtype::float64:
      return 8;
  }
  return 0;
}

/// The name of `t` ("int32", "bfloat16", ...), as error messages and tools print it. Pure; O(1).
[[nodiscard]] constexpr const char* dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::int8:
      return "int8";
    case dtype::uint8:
      return "uint8";
    case dtype::int16:
      return "int16";
    case dtype::uint16:
      return "uint16";
    case dtype::int32:
      return "int32";
    case dtype::uint32:
      return "uint32";
    case dtype::int64:
      return "int64";
    case dtype::uint64:
      return "uint64";
    case dtype::float16:
      return "float16";
    case dtype::bfloat16:
      return "bfloat16";
    case dtype::float32:
      return "float32";
    case dtype::float64:
      return "float64";
  }
  return "?";
}

/// dtype_of<T>::value: the dtype of element type T, for the types collectives can move. Specialised
/// here for the standard arithmetic types (by size and signedness, so `long` and `long long` both map
/// to int64 on LP64), except bool and 16-bit integers (NCCL has none; widen to int32); the CUDA header
/// hetmesh/cuda/half.hpp adds `__half` and `__nv_bfloat16`. A type without a specialisation cannot be
/// communicated, which the `element` concept reports at compile time.
template <class T, class = void>
struct dtype_of {};

namespace detail {
template <class T>
constexpr dtype arithmetic_dtype() noexcept {
  if constexpr (std::is_floating_point_v<T>) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "hetmesh: only float and double are supported");
    return sizeof(T) == 4 ? dtype::float32 : dtype::float64;
  } else if constexpr (sizeof(T) == 1) {
    return std::is_signed_v<T> ? dtype::int8 : dtype::uint8;
  } else if constexpr (sizeof(T) == 4) {
    return std::is_signed_v<T> ? dtype::int32 : dtype::uint32;
  } else {
    static_assert(sizeof(T) == 8, "hetmesh: 16-bit integers are not supported; widen to int32");
    return std::is_signed_v<T> ? dtype::int64 : dtype::uint64;
  }
}
}  // namespace detail

/// The dtype of an arithmetic type other than bool and 16-bit types: the fixed-width type of its size and
/// signedness.
template <class T>
struct dtype_of<T, std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && sizeof(T) != 2>> {
  /// The dtype of T.
  static constexpr dtype value = detail::arithmetic_dtype<T>();
};

/// The dtype of T (cv-qualifiers ignored); ill-formed for a type with no dtype_of specialisation.
template <class T>
inline constexpr dtype dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

/// A type collectives can move: it has a dtype.
template <class T>
concept element = requires {
  dtype_of<std::remove_cv_t<T>>::value;
};

/// A type host backends can reduce: arithmetic (not bool, not 16-bit).
template <class T>
concept host_element = element<T> && std::is_arithmetic_v<std::remove_cv_t<T>>;

static_assert(element<float> && element<std::int64_t> && !element<bool> && host_element<double>);
static_assert(!element<std::int16_t> && dtype_size(dtype::uint16) == 2);

}  // namespace hetmesh

template <>
struct fmt::formatter<hetmesh::dtype> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::dtype t, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", hetmesh::dtype_name(t));
  }
};
