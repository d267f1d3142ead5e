// SPDX-License-Identifier: Apache-2.0
// hetmesh::mesh: dimension names. A dim is a short name held by value (no pointers), so meshes built
// from literals can live in constexpr variables and be compared across ranks. The five LLM dims are
// constants (`tp cp ep dp pp`); any other name ("esp", "edp" for an encoder mesh) is a dim too.
// `tp(8_c)` pairs a dim with an extent (static C<N> or a dynamic integer).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/integral.hpp"

namespace hetmesh::mesh {

/// Longest dim name, in characters. Names are stored inline so that a dim is a literal type.
inline constexpr std::size_t max_dim_name = 15;

template <class E>
struct dim_extent;

/// The name of a mesh dimension: 1..15 characters from [a-z0-9_]. Why not '-': order strings use '-'
/// as the separator ("tp-cp-ep-dp-pp").
class dim {
 public:
  /// An empty dim, so that arrays of dims can be default-constructed; never a valid mesh dim.
  constexpr dim() = default;

  /// Pre: `name` is 1..15 characters from [a-z0-9_]; otherwise throws invalid_argument (at compile
  /// time: the expression is not a constant). Cost: O(length).
  constexpr dim(std::string_view name) {  // NOLINT: implicit so "esp" can be passed where a dim is expected
    if (name.empty() || name.size() > max_dim_name) bad_name(name);
    for (char c : name) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
      if (!ok) bad_name(name);
    }
    for (std::size_t i = 0; i < name.size(); ++i) text_[i] = name[i];
    size_ = static_cast<std::uint8_t>(name.size());
  }
  /// Same as the string_view constructor, so that "tp" converts to a dim where one is expected.
  constexpr dim(const char* name) : dim(std::string_view(name)) {}  // NOLINT: implicit by design
  /// Same as the string_view constructor.
  dim(const std::string& name) : dim(std::string_view(name)) {}  // NOLINT: implicit by design

  /// The name, e.g. "tp".
  [[nodiscard]] constexpr std::string_view name() const noexcept { return {text_.data(), size_}; }
  /// Whether this is the empty (default-constructed) dim.
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }

  /// Pairs this dim with an extent: `tp(8_c)` (static) or `dp(4)` (dynamic).
  template <integral_like E>
  [[nodiscard]] constexpr auto operator()(E extent) const noexcept;

  friend constexpr bool operator==(const dim& a, const dim& b) noexcept { return a.name() == b.name(); }
  /// Orders dims by name, so that sets and maps of dims are deterministic.
  friend constexpr bool operator<(const dim& a, const dim& b) noexcept { return a.name() < b.name(); }

  void hash_append(hasher& h) const { append(h, name()); }

 private:
  [[noreturn]] static void bad_name(std::string_view name) {
    throw_error<invalid_argument>(
        "bad mesh dim name '{}': expected 1 to {} characters from [a-z0-9_] (e.g. \"tp\", \"esp\")", name,
        max_dim_name);
  }

  std::array<char, max_dim_name + 1> text_{};
  std::uint8_t size_ = 0;
};

/// A dim with its extent. E is C<N> (static) or std::int64_t (dynamic).
template <class E>
struct dim_extent {
  dim name;                        ///< the dim
  [[no_unique_address]] E extent;  ///< its extent, static C<N> or dynamic
};

template <integral_like E>
constexpr auto dim::operator()(E extent) const noexcept {
  if constexpr (is_static_v<E>) {
    return dim_extent<std::remove_cvref_t<E>>{*this, {}};
  } else {
    return dim_extent<std::int64_t>{*this, static_cast<std::int64_t>(extent)};
  }
}

/// The five LLM dims, named as in Megatron-LM.
inline constexpr dim tp{"tp"};  ///< tensor parallel
inline constexpr dim cp{"cp"};  ///< context parallel
inline constexpr dim ep{"ep"};  ///< expert parallel
inline constexpr dim dp{"dp"};  ///< data parallel
inline constexpr dim pp{"pp"};  ///< pipeline parallel

/// Megatron-LM's default order, innermost (fastest-varying) first.
inline constexpr std::string_view megatron_order = "tp-cp-ep-dp-pp";

/// True for tp, cp, ep, dp, pp: the dims an order string may name without the mesh having them
/// (Megatron's order strings always list all five; absent ones have extent 1).
[[nodiscard]] constexpr bool is_llm_dim(const dim& d) noexcept {
  return d == tp || d == cp || d == ep || d == dp || d == pp;
}

namespace detail {

/// Splits "tp-cp-dp" into dims. Pre: non-empty tokens, valid names. Throws invalid_argument naming the
/// offending token. Calls `f(dim)` per token, in order.
template <class F>
constexpr void for_each_order_token(std::string_view order, F&& f) {
  if (order.empty())
    throw_error<invalid_argument>("empty order string: expected dims joined by '-', e.g. \"{}\"",
                                  megatron_order);
  std::size_t start = 0;
  while (true) {
    const std::size_t end = order.find('-', start);
    const std::string_view token = order.substr(start, end == std::string_view::npos ? end : end - start);
    if (token.empty()) {
      throw_error<invalid_argument>(
          "order string \"{}\" has an empty dim name: expected dims joined by '-', e.g. \"{}\"", order,
          megatron_order);
    }
    f(dim(token));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
}

}  // namespace detail

}  // namespace hetmesh::mesh

template <>
struct fmt::formatter<hetmesh::mesh::dim> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::dim& d, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", d.name());
  }
};

template <class E>
struct fmt::formatter<hetmesh::mesh::dim_extent<E>> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::dim_extent<E>& d, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}={}", d.name, d.extent);
  }
};
