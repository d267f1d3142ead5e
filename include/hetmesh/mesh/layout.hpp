// SPDX-License-Identifier: Apache-2.0
// hetmesh::mesh: the layout, a bijection between named coordinates and ranks with an explicit order.
//
//   using namespace hetmesh::literals;
//   constexpr auto m = hetmesh::mesh::make_mesh(tp(8_c), cp(2_c), dp(4));   // innermost first
//   fmt::print("{}", m);           // (tp=_8,cp=_2,dp=4):(_1,_8,_16)
//   m.group_of(19, dp);            // {3, 19, 35, 51}
//
// The order is innermost (fastest-varying) first, as in Megatron-LM's "tp-cp-ep-dp-pp": the stride of
// a dim is the product of the extents before it. Extents are C<N> (static, held in the type) or
// std::int64_t (dynamic); one class template serves both. A fully static layout computes size, strides
// and coordinate <-> rank at compile time. Extents are kept in the tuple in construction order and a
// permutation gives the mesh order, so a run-time order string does not need to re-type them.
#pragma once

#include <array>
#include <climits>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/integral.hpp"
#include "dim.hpp"
#include "view.hpp"

namespace hetmesh::mesh {

/// A mesh: dims in an explicit order over ranks 0..size()-1. `Extents` are C<N> or std::int64_t, in
/// construction order (not mesh order). Build with make_mesh / make_mesh_outermost. Positions (the
/// `std::size_t i` arguments and coordinate entries) always count in mesh order, innermost first.
template <class... Extents>
class layout {
  static_assert(((is_static_v<Extents> || std::is_same_v<Extents, std::int64_t>)&&...),
                "layout extents are hetmesh::C<N> or std::int64_t; build layouts with make_mesh");

 public:
  static constexpr std::size_t rank_count = sizeof...(Extents);  ///< number of dims
  /// A coordinate: one index per dim, in the layout's order.
  using coord_type = std::array<std::int64_t, rank_count>;

  /// Pre: distinct dims, positive extents, product <= INT_MAX, `order` a permutation (order[i] is the
  /// construction index of the dim at mesh position i). Throws invalid_argument naming the dim.
  constexpr layout(std::array<dim, rank_count> names, std::tuple<Extents...> extents,
                   std::array<std::size_t, rank_count> order)
      : names_(names), extents_(extents), order_(order) {
    std::int64_t size = 1;
    for (std::size_t i = 0; i < rank_count; ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if (names_[i] == names_[j]) duplicate_dim(names_[i]);
        if (order_[i] == order_[j]) bad_order();
      }
      if (order_[i] >= rank_count) bad_order();
      const std::int64_t e = arg_extent(i);
      if (e < 1) bad_extent(names_[i], e);
      size *= e;
      if (size > INT_MAX) too_large();
    }
  }

  /// Number of dims.
  [[nodiscard]] static constexpr std::size_t dims_count() noexcept { return rank_count; }

  /// The number of ranks: C<N> when every extent is static, std::int64_t otherwise. O(dims).
  [[nodiscard]] constexpr auto size() const noexcept {
    return std::apply([](auto... e) { return (C<1>{} * ... * e); }, extents_);
  }

  /// Name, extent and stride at mesh position i (innermost first). Pre: i < dims_count().
  [[nodiscard]] constexpr dim name(std::size_t i) const { return names_[order_[check_pos(i)]]; }
  /// Extent of the i-th dim. Pre: i < rank_count.
  [[nodiscard]] constexpr std::int64_t extent(std::size_t i) const {
    return arg_extent(order_[check_pos(i)]);
  }
  /// Stride of the i-th dim. Pre: i < rank_count.
  [[nodiscard]] constexpr std::int64_t stride(std::size_t i) const {
    std::int64_t s = 1;
    for (std::size_t j = 0; j < check_pos(i); ++j) s *= extent(j);
    return s;
  }
  /// True when the extent at position i is static (prints with '_').
  [[nodiscard]] constexpr bool static_extent(std::size_t i) const { return arg_static[order_[check_pos(i)]]; }
  /// True when the stride at position i is known from types alone (every faster extent is static).
  [[nodiscard]] constexpr bool static_stride(std::size_t i) const {
    for (std::size_t j = 0; j < check_pos(i); ++j) {
      if (!static_extent(j)) return false;
    }
    return true;
  }

  /// Whether the layout has dim `d`.
  [[nodiscard]] constexpr bool has(const dim& d) const noexcept {
    for (const dim& n : names_) {
      if (n == d) return true;
    }
    return false;
  }
  /// Mesh position of d. Throws invalid_argument naming the mesh's dims when d is absent.
  [[nodiscard]] constexpr std::size_t index_of(const dim& d) const {
    for (std::size_t i = 0; i < rank_count; ++i) {
      if (name(i) == d) return i;
    }
    missing_dim(d);
  }
  /// Extent of dim `d`. Pre: has(d); otherwise invalid_argument.
  [[nodiscard]] constexpr std::int64_t extent(const dim& d) const { return extent(index_of(d)); }
  /// Stride of dim `d`. Pre: has(d); otherwise invalid_argument.
  [[nodiscard]] constexpr std::int64_t stride(const dim& d) const { return stride(index_of(d)); }

  /// The coordinate of `rank`, in mesh order. Pre: 0 <= rank < size() (else invalid_argument).
  /// Post: rank_of(coord_of(r)) == r. Pure, constexpr; O(dims).
  [[nodiscard]] constexpr coord_type coord_of(std::int64_t rank) const {
    if (rank < 0 || rank >= value_of(size())) bad_rank(rank);
    coord_type c{};
    for (std::size_t i = 0; i < rank_count; ++i) {
      c[i] = rank % extent(i);
      rank /= extent(i);
    }
    return c;
  }
  /// The coordinate of `rank` along d.
  [[nodiscard]] constexpr std::int64_t coord_of(std::int64_t rank, const dim& d) const {
    return coord_of(rank)[index_of(d)];
  }

  /// The rank at `coord` (mesh order). Pre: 0 <= coord[i] < extent(i) (else invalid_argument).
  /// Post: coord_of(rank_of(c)) == c. Pure, constexpr; O(dims).
  [[nodiscard]] constexpr int rank_of(const coord_type& coord) const {
    std::int64_t r = 0;
    for (std::size_t i = 0; i < rank_count; ++i) {
      if (coord[i] < 0 || coord[i] >= extent(i)) bad_coord(i, coord[i]);
      r += coord[i] * stride(i);
    }
    return static_cast<int>(r);
  }

  /// The same mesh as a run-time view (for flatten, submesh and group enumeration). O(dims).
  [[nodiscard]] view to_view() const {
    std::vector<view_mode> modes;
    for (std::size_t i = 0; i < rank_count; ++i) modes.push_back({name(i), {atom{extent(i), stride(i)}}});
    return view(std::move(modes), 0);
  }

  /// The group of `rank` along `dims` (see view::group_of): ranks that differ from rank only along
  /// dims, first listed dim fastest. group_of(r, dp) gives Megatron-LM's data-parallel group of r.
  /// Throws invalid_argument for a dim the mesh lacks, a repeated dim, or a rank out of range.
  /// Pure; O(group size * dims).
  template <class... D>
  requires(std::convertible_to<const D&, dim>&&...)
      [[nodiscard]] std::vector<int> group_of(int rank, const D&... dims) const {
    const std::array<dim, sizeof...(D)> a{dim(dims)...};
    return group_of(rank, std::span<const dim>(a));
  }
  /// The group of `rank` along `dims` (std::span form of the variadic overload). O(group size).
  [[nodiscard]] std::vector<int> group_of(int rank, std::span<const dim> dims) const {
    check_dims(dims);
    if (rank < 0 || rank >= value_of(size())) bad_rank(rank);
    return to_view().group_of(rank, dims);
  }

  /// All groups along `dims`, a partition of the ranks, in Megatron-LM's order (see view::groups).
  /// Pure; O(size * dims).
  template <class... D>
  requires(std::convertible_to<const D&, dim>&&...)
      [[nodiscard]] std::vector<std::vector<int>> groups(const D&... dims) const {
    const std::array<dim, sizeof...(D)> a{dim(dims)...};
    return groups(std::span<const dim>(a));
  }
  /// Every group along `dims`, each in group order (std::span form of the variadic overload). O(world).
  [[nodiscard]] std::vector<std::vector<int>> groups(std::span<const dim> dims) const {
    check_dims(dims);
    return to_view().groups(dims);
  }

  /// `dims` merged into one dim `name` (see view::flatten); e.g. flatten("dp_cp", cp, dp).
  template <class... D>
  requires(std::convertible_to<const D&, dim>&&...) [[nodiscard]] view
      flatten(const dim& new_name, const D&... dims) const {
    return to_view().flatten(new_name, dims...);
  }

  /// The sub-mesh with some coordinates fixed (see view::submesh); e.g. submesh({{pp, 0}}).
  [[nodiscard]] view submesh(std::initializer_list<std::pair<dim, std::int64_t>> fixed) const {
    return to_view().submesh(fixed);
  }
  /// The sub-mesh with the given dims fixed at the given coordinates (std::span form). O(dims).
  [[nodiscard]] view submesh(std::span<const std::pair<dim, std::int64_t>> fixed) const {
    return to_view().submesh(fixed);
  }

  /// Throws invalid_argument unless size() == world (e.g. the launcher's world size). Returns *this.
  constexpr const layout& check_world(std::int64_t world) const {
    if (value_of(size()) != world) {
      throw_error<invalid_argument>(
          "mesh {} has {} ranks but the world has {}: expected extents whose product is {}", str(),
          value_of(size()), world, world);
    }
    return *this;
  }

  /// The dims joined by '-', innermost first, in Megatron-LM's notation ("tp-cp-dp").
  [[nodiscard]] std::string order_string() const {
    std::string s;
    for (std::size_t i = 0; i < rank_count; ++i) {
      if (i != 0) s += '-';
      s += name(i).name();
    }
    return s;
  }

  /// The printed form `(tp=_8,cp=_2,dp=4):(_1,_8,_16)`: extents then strides in mesh order; static
  /// values carry '_'.
  [[nodiscard]] std::string str() const {
    std::string e, s;
    for (std::size_t i = 0; i < rank_count; ++i) {
      if (i != 0) {
        e += ',';
        s += ',';
      }
      e += hetmesh::format("{}={}{}", name(i).name(), static_extent(i) ? "_" : "", extent(i));
      s += hetmesh::format("{}{}", static_stride(i) ? "_" : "", stride(i));
    }
    return "(" + e + "):(" + s + ")";
  }

  /// Equal when the same dims have the same extents in the same order (static or not).
  template <class... F>
  [[nodiscard]] constexpr bool operator==(const layout<F...>& other) const {
    if (rank_count != sizeof...(F)) return false;
    for (std::size_t i = 0; i < rank_count; ++i) {
      if (!(name(i) == other.name(i)) || extent(i) != other.extent(i)) return false;
    }
    return true;
  }

  /// Hashes the dims and extents in mesh order (the same value as the mesh's view would not matter:
  /// layouts hash as layouts).
  void hash_append(hasher& h) const {
    h.add_u64(rank_count);
    for (std::size_t i = 0; i < rank_count; ++i) append_all(h, name(i), extent(i));
  }

 private:
  static constexpr std::array<bool, rank_count> arg_static{is_static_v<Extents>...};

  [[nodiscard]] constexpr std::int64_t arg_extent(std::size_t k) const {
    return arg_extent_impl(k, std::index_sequence_for<Extents...>{});
  }
  template <std::size_t... I>
  [[nodiscard]] constexpr std::int64_t arg_extent_impl(std::size_t k, std::index_sequence<I...>) const {
    std::int64_t v = 0;
    (void)((k == I ? (v = value_of(std::get<I>(extents_)), true) : false) || ...);
    return v;
  }
  constexpr std::size_t check_pos(std::size_t i) const {
    if (i >= rank_count) {
      throw_error<invalid_argument>("dim position {} in mesh {}: expected a position below {}", i, str(),
                                    rank_count);
    }
    return i;
  }

  // Names absent dims in this layout's own notation before a view would.
  constexpr void check_dims(std::span<const dim> dims) const {
    for (const dim& d : dims) (void)index_of(d);
  }

  [[noreturn]] void duplicate_dim(const dim& d) const {
    throw_error<invalid_argument>("mesh has dim '{}' twice: expected distinct dims", d);
  }
  [[noreturn]] static void bad_extent(const dim& d, std::int64_t e) {
    throw_error<invalid_argument>("dim '{}' has extent {}: expected a positive extent", d, e);
  }
  [[noreturn]] static void bad_order() {
    throw_error<invalid_argument>(
        "layout order is not a permutation of its {} dims: expected each index once", rank_count);
  }
  [[noreturn]] static void too_large() {
    throw_error<invalid_argument>("mesh has more than {} ranks: expected an int rank", INT_MAX);
  }
  [[noreturn]] void missing_dim(const dim& d) const {
    std::string dims;
    for (std::size_t i = 0; i < rank_count; ++i)
      dims += hetmesh::format("{}{}", i ? ", " : "", name(i).name());
    throw_error<invalid_argument>("mesh {} has no dim '{}': expected one of {}", str(), d, dims);
  }
  [[noreturn]] void bad_rank(std::int64_t rank) const {
    throw_error<invalid_argument>("rank {} is outside mesh {}: expected 0 <= rank < {}", rank, str(),
                                  value_of(size()));
  }
  [[noreturn]] void bad_coord(std::size_t i, std::int64_t c) const {
    throw_error<invalid_argument>("coordinate {} along dim '{}' of mesh {}: expected 0 <= coordinate < {}", c,
                                  name(i), str(), extent(i));
  }

  std::array<dim, rank_count> names_;
  [[no_unique_address]] std::tuple<Extents...> extents_;
  std::array<std::size_t, rank_count> order_;
};

/// A mesh from dims listed innermost (fastest) first, as in a Megatron-LM order string:
/// make_mesh(tp(8_c), cp(2_c), dp(4)) is "tp-cp-dp". Throws invalid_argument for a repeated dim or an
/// extent < 1. constexpr; O(dims^2).
template <class... E>
[[nodiscard]] constexpr layout<E...> make_mesh(const dim_extent<E>&... dims) {
  std::array<std::size_t, sizeof...(E)> order{};
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  return layout<E...>({dims.name...}, std::tuple<E...>{dims.extent...}, order);
}

/// A mesh from dims listed outermost (slowest) first, as PyTorch's DeviceMesh takes mesh_shape and
/// mesh_dim_names (the last dim varies fastest): make_mesh_outermost(dp(4), cp(2_c), tp(8_c)) equals
/// make_mesh(tp(8_c), cp(2_c), dp(4)).
template <class... E>
[[nodiscard]] constexpr layout<E...> make_mesh_outermost(const dim_extent<E>&... dims) {
  std::array<std::size_t, sizeof...(E)> order{};
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  return layout<E...>({dims.name...}, std::tuple<E...>{dims.extent...}, order);
}

/// A mesh whose order is a Megatron-LM order string, innermost first ("tp-cp-ep-dp-pp"); the dims
/// may be passed in any order. Rules, each violation an invalid_argument naming the dim:
///  - a name in the string that is neither a passed dim nor one of tp cp ep dp pp is unknown (the
///    five may be listed without being passed: their extent is 1);
///  - a name may appear once;
///  - a passed dim of extent > 1 must be listed; one of extent 1 may be omitted (it goes outermost).
/// constexpr; O(dims * string length).
template <class... E>
[[nodiscard]] constexpr layout<E...> make_mesh(std::string_view order_string, const dim_extent<E>&... dims) {
  constexpr std::size_t n = sizeof...(E);
  const std::array<dim, n> names{dims.name...};
  const std::array<std::int64_t, n> extents{value_of(dims.extent)...};
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (names[i] == names[j]) {
        throw_error<invalid_argument>("mesh has dim '{}' twice: expected distinct dims", names[i]);
      }
    }
  }
  std::array<std::size_t, n> order{};
  std::array<bool, n> placed{};
  std::size_t next = 0;
  std::array<dim, 16> seen{};
  std::size_t seen_count = 0;
  detail::for_each_order_token(order_string, [&](const dim& d) {
    for (std::size_t j = 0; j < seen_count; ++j) {
      if (seen[j] == d) {
        throw_error<invalid_argument>("order string \"{}\" lists '{}' twice: expected each dim once",
                                      order_string, d);
      }
    }
    if (seen_count == seen.size()) {
      throw_error<invalid_argument>("order string \"{}\" lists more than {} dims: expected at most {}",
                                    order_string, seen.size(), seen.size());
    }
    seen[seen_count++] = d;
    for (std::size_t k = 0; k < n; ++k) {
      if (names[k] == d) {
        order[next++] = k;
        placed[k] = true;
        return;
      }
    }
    if (!is_llm_dim(d)) {
      std::string known;
      for (std::size_t k = 0; k < n; ++k) {
        if (!is_llm_dim(names[k])) known += hetmesh::format("{}, ", names[k].name());
      }
      throw_error<invalid_argument>(
          "unknown dim '{}' in order string \"{}\": expected one of {}tp, cp, ep, dp, pp", d, order_string,
          known);
    }
  });
  for (std::size_t k = 0; k < n; ++k) {
    if (placed[k]) continue;
    if (extents[k] != 1) {
      throw_error<invalid_argument>(
          "dim '{}' has extent {} but order string \"{}\" does not list it: expected every dim of extent > 1 "
          "in the order",
          names[k], extents[k], order_string);
    }
    order[next++] = k;
  }
  return layout<E...>(names, std::tuple<E...>{dims.extent...}, order);
}

static_assert(mesh_like<layout<C<8>, std::int64_t>>);

}  // namespace hetmesh::mesh

template <class... E>
struct fmt::formatter<hetmesh::mesh::layout<E...>> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::layout<E...>& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", m.str());
  }
};
