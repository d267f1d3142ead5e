// SPDX-License-Identifier: Apache-2.0
// hetmesh: static and dynamic integers. An extent is either C<N> (known at compile time, stores
// nothing) or a plain integer. Arithmetic on two statics stays static; one implementation serves both.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

#include "error.hpp"

namespace hetmesh {

/// A compile-time integer. Prints as `_N`.
template <std::int64_t N>
struct C {
  /// The type of the dynamic counterpart (std::int64_t), as in std::integral_constant.
  using value_type = std::int64_t;
  /// N, usable in constant expressions.
  static constexpr std::int64_t value = N;
  /// Converts to the dynamic integer, so static and dynamic extents share one implementation.
  constexpr operator std::int64_t() const noexcept { return N; }  // NOLINT: implicit by design
  friend constexpr bool operator==(C, C) noexcept { return true; }
};

template <class T>
struct is_static : std::false_type {};
template <std::int64_t N>
struct is_static<C<N>> : std::true_type {};
/// True for C<N> (also through cv/ref).
template <class T>
inline constexpr bool is_static_v = is_static<std::remove_cvref_t<T>>::value;

/// An extent: C<N> or a (non-bool) integer.
template <class T>
concept integral_like = is_static_v<T> ||
    (std::integral<std::remove_cvref_t<T>> && !std::same_as<std::remove_cvref_t<T>, bool>);

/// The value of a static or dynamic integer, as std::int64_t.
template <integral_like T>
[[nodiscard]] constexpr std::int64_t value_of(T x) noexcept {
  return static_cast<std::int64_t>(x);
}

/// The product of two static integers is static: extents multiply at compile time.
template <std::int64_t A, std::int64_t B>
constexpr C<A * B> operator*(C<A>, C<B>) noexcept {
  return {};
}
/// The sum of two static integers is static.
template <std::int64_t A, std::int64_t B>
constexpr C<A + B> operator+(C<A>, C<B>) noexcept {
  return {};
}

namespace detail {
constexpr std::int64_t parse_decimal(const char* digits) {
  std::int64_t v = 0;
  for (; *digits != '\0'; ++digits) {
    if (*digits == '\'') continue;
    v = v * 10 + (*digits - '0');
  }
  return v;
}
template <char... Digits>
constexpr std::int64_t parse_literal() {
  constexpr char digits[] = {Digits..., '\0'};
  static_assert((((Digits >= '0' && Digits <= '9') || Digits == '\'') && ...),
                "_c takes a decimal integer literal");
  return parse_decimal(digits);
}
}  // namespace detail

namespace literals {
/// `8_c` is C<8>.
template <char... Digits>
constexpr auto operator""_c() noexcept {
  return C<detail::parse_literal<Digits...>()>{};
}
}  // namespace literals

}  // namespace hetmesh

template <std::int64_t N>
struct fmt::formatter<hetmesh::C<N>> : fmt::formatter<std::int64_t> {
  template <class FormatContext>
  auto format(hetmesh::C<N>, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "_{}", N);
  }
};
