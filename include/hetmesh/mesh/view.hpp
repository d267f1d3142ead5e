// SPDX-License-Identifier: Apache-2.0
// hetmesh::mesh: views. A view is a run-time mesh over a subset of ranks: a list of named modes, each
// made of one or more (extent, stride) atoms (first atom fastest), plus an offset. It is what flatten
// and submesh return, because their results are no longer plain order-derived layouts: flattening
// dims that are not adjacent gives a mode with several strides, and fixing coordinates gives an offset.
// Every group computation of the library lives here, so static and dynamic meshes share it.
#pragma once

#include <algorithm>
#include <array>
#include <climits>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "dim.hpp"

namespace hetmesh::mesh {

/// One affine piece of a mode: coordinate digit c in [0, extent) adds c * stride to the rank.
struct atom {
  std::int64_t extent = 1;  ///< extent of the atom
  std::int64_t stride = 1;  ///< stride of the atom
  friend bool operator==(const atom&, const atom&) = default;
  void hash_append(hasher& h) const { append_all(h, extent, stride); }
};

/// A named mode of a view. Its extent is the product of its atoms' extents; a coordinate along it is
/// decomposed over the atoms first-atom-fastest.
struct view_mode {
  dim name;                 ///< the dim
  std::vector<atom> atoms;  ///< its atoms, fastest first

  /// The dim's extent: the product of its atoms' extents.
  [[nodiscard]] std::int64_t extent() const noexcept {
    std::int64_t e = 1;
    for (const atom& a : atoms) e *= a.extent;
    return e;
  }
  /// The rank offset of coordinate c along this mode. Pre: 0 <= c < extent().
  [[nodiscard]] std::int64_t contribution(std::int64_t c) const noexcept {
    std::int64_t r = 0;
    for (const atom& a : atoms) {
      r += (c % a.extent) * a.stride;
      c /= a.extent;
    }
    return r;
  }
  friend bool operator==(const view_mode&, const view_mode&) = default;
  void hash_append(hasher& h) const { append_all(h, name, atoms); }
};

namespace detail {

/// The ranks base + sum_k c_k * stride_k for all digits, first atom fastest (colexicographic, the
/// order Megatron-LM's generate_masked_orthogonal_rank_groups uses). Cost: O(n * atoms).
HETMESH_COMPILED std::vector<int> enumerate_atoms(std::span<const atom> atoms, std::int64_t base)
#if HETMESH_BODIES
{
  std::int64_t n = 1;
  for (const atom& a : atoms) n *= a.extent;
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t rest = i, r = base;
    for (const atom& a : atoms) {
      r += (rest % a.extent) * a.stride;
      rest /= a.extent;
    }
    out.push_back(static_cast<int>(r));
  }
  return out;
}
#else
    ;
#endif

HETMESH_COMPILED std::string join_dims(const std::vector<view_mode>& modes)
#if HETMESH_BODIES
{
  std::string s;
  for (const view_mode& m : modes) {
    if (!s.empty()) s += ", ";
    s += m.name.name();
  }
  return s;
}
#else
    ;
#endif

}  // namespace detail

/// A run-time mesh over some ranks (see the file comment). Values: copyable, comparable, hashable,
/// printable as `(tp=8,dp_cp=(2,4)):(1,(8,32))+16` (a mode of several atoms prints its atoms; a
/// non-zero offset prints after '+').
class view {
 public:
  view() = default;

  /// Pre: distinct non-empty names; every atom extent >= 1; the atoms of all modes are those of a
  /// sub-layout of a compact layout (true for every view the library builds), so that rank ->
  /// coordinate can be inverted greedily. Throws invalid_argument on duplicate names or extents < 1.
  HETMESH_COMPILED view(std::vector<view_mode> modes, std::int64_t offset);

  /// Number of ranks. O(1).
  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  /// Number of dims.
  [[nodiscard]] std::size_t dims_count() const noexcept { return modes_.size(); }
  /// The dims with their atoms.
  [[nodiscard]] const std::vector<view_mode>& modes() const noexcept { return modes_; }
  /// Rank offset of coordinate 0 (non-zero in sub-meshes).
  [[nodiscard]] std::int64_t offset() const noexcept { return offset_; }
  /// Name of the i-th dim. Pre: i < dims_count().
  [[nodiscard]] dim name(std::size_t i) const { return mode(i).name; }
  /// Extent of the i-th dim. Pre: i < dims_count().
  [[nodiscard]] std::int64_t extent(std::size_t i) const { return mode(i).extent(); }
  /// Extent of dim `d`. Pre: has(d); otherwise invalid_argument.
  [[nodiscard]] std::int64_t extent(const dim& d) const { return modes_[index_of(d)].extent(); }
  /// Whether the view has dim `d`.
  [[nodiscard]] bool has(const dim& d) const noexcept {
    return std::any_of(modes_.begin(), modes_.end(), [&](const view_mode& m) { return m.name == d; });
  }
  /// Position of d. Throws invalid_argument naming the mesh's dims when it has no dim d.
  [[nodiscard]] HETMESH_COMPILED std::size_t index_of(const dim& d) const;

  /// True when `rank` belongs to this view. O(atoms).
  [[nodiscard]] bool contains(int rank) const noexcept {
    std::vector<std::int64_t> c;
    return decompose(rank, c);
  }

  /// The coordinate of `rank`, one entry per mode. Throws invalid_argument when the view lacks rank.
  [[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> coord_of(int rank) const;
  /// Coordinate of `rank` along dim `d`. Pre: has(d), rank in range.
  [[nodiscard]] std::int64_t coord_of(int rank, const dim& d) const { return coord_of(rank)[index_of(d)]; }

  /// The rank at `coord`. Throws invalid_argument on a wrong number of entries or an entry out of range.
  [[nodiscard]] HETMESH_COMPILED int rank_of(std::span<const std::int64_t> coord) const;
  /// The rank at `coord` (one index per dim, in order). Pre: in range; otherwise invalid_argument.
  [[nodiscard]] HETMESH_COMPILED int rank_of(std::initializer_list<std::int64_t> coord) const;

  /// Every rank of the view, first mode fastest. O(size).
  [[nodiscard]] std::vector<int> ranks() const { return detail::enumerate_atoms(all_atoms(), offset_); }

  /// The group of `rank` along `dims`: the ranks that share rank's coordinates on every other dim,
  /// ordered with the first listed dim fastest (within a flattened dim, its first atom fastest).
  /// Listing dims in mesh order gives Megatron-LM's order for the same group. Pre: rank in the view,
  /// dims distinct and present (else invalid_argument). Pure; O(group size * dims).
  [[nodiscard]] HETMESH_COMPILED std::vector<int> group_of(int rank, std::span<const dim> dims) const;
  /// The group of `rank` along `dims`: the ranks that differ from it only in those coordinates, in group
  /// order. Pure. O(group size).
  template <class... D>
  requires(std::convertible_to<const D&, dim>&&...)
      [[nodiscard]] std::vector<int> group_of(int rank, const D&... dims) const {
    const std::array<dim, sizeof...(D)> a{dim(dims)...};
    return group_of(rank, std::span<const dim>(a));
  }

  /// All groups along `dims`: they partition the view; each is ordered as in group_of; groups are
  /// listed with the remaining dims varying first-mode-fastest (Megatron-LM's order). Pure;
  /// O(size * dims).
  [[nodiscard]] HETMESH_COMPILED std::vector<std::vector<int>> groups(std::span<const dim> dims) const;
  /// Every group along `dims`, each in group order. Pure. O(world).
  template <class... D>
  requires(std::convertible_to<const D&, dim>&&...)
      [[nodiscard]] std::vector<std::vector<int>> groups(const D&... dims) const {
    const std::array<dim, sizeof...(D)> a{dim(dims)...};
    return groups(std::span<const dim>(a));
  }

  /// Merges `dims` into one dim `name` (e.g. dp and cp into the HDP pool "dp_cp"): its coordinate runs
  /// over the merged dims first-listed-fastest, and it takes the place of the innermost merged dim.
  /// Ranks are unchanged: group_of(r, name) == group_of(r, dims...). Throws invalid_argument when a
  /// dim is absent or repeated, or `name` clashes with a dim that remains. O(dims).
  [[nodiscard]] HETMESH_COMPILED view flatten(const dim& name, std::span<const dim> dims) const;
  /// A view with `dims` merged into one dim `name` (the first listed varies fastest). Pre: distinct dims of
  /// this view.
  template <class... D>
  requires(std::convertible_to<const D&, dim>&&...) [[nodiscard]] view
      flatten(const dim& name, const D&... dims) const {
    const std::array<dim, sizeof...(D)> a{dim(dims)...};
    return flatten(name, std::span<const dim>(a));
  }

  /// The sub-mesh where each listed dim is fixed at the given coordinate (e.g. {{pp, 0}}: the first
  /// pipeline stage). Its dims are the rest, in order. Throws invalid_argument for an absent or
  /// repeated dim or a coordinate out of range. O(dims).
  [[nodiscard]] HETMESH_COMPILED view submesh(std::span<const std::pair<dim, std::int64_t>> fixed) const;
  /// The sub-mesh with the given dims fixed at the given coordinates. Pre: dims of this view, coordinates in
  /// range.
  [[nodiscard]] HETMESH_COMPILED view
  submesh(std::initializer_list<std::pair<dim, std::int64_t>> fixed) const;

  /// The dims joined by '-', innermost first ("tp-cp-dp").
  [[nodiscard]] HETMESH_COMPILED std::string order_string() const;

  /// The printed form: `(tp=8,dp_cp=(2,4)):(1,(8,32))+16`. O(dims).
  [[nodiscard]] HETMESH_COMPILED std::string str() const;

  friend bool operator==(const view& a, const view& b) {
    return a.modes_ == b.modes_ && a.offset_ == b.offset_;
  }
  void hash_append(hasher& h) const { append_all(h, modes_, offset_); }

 private:
  struct slot {
    std::size_t mode, index;
  };
  [[nodiscard]] const atom& atom_at(const slot& s) const { return modes_[s.mode].atoms[s.index]; }

  [[nodiscard]] const view_mode& mode(std::size_t i) const {
    if (i >= modes_.size()) {
      throw_error<invalid_argument>("dim position {} in mesh {}: expected a position below {}", i, str(),
                                    modes_.size());
    }
    return modes_[i];
  }

  [[nodiscard]] HETMESH_COMPILED std::vector<atom> all_atoms() const;

  // Positions of `dims`, in the order given; throws for an absent or repeated dim.
  [[nodiscard]] HETMESH_COMPILED std::vector<std::size_t> pick(std::span<const dim> dims) const;

  // Greedy inverse, largest stride first: exact because each stride exceeds the span of all smaller
  // atoms (the view is a sub-layout of a compact layout).
  HETMESH_COMPILED bool decompose(int rank, std::vector<std::int64_t>& coord) const;

  std::vector<view_mode> modes_;
  std::int64_t offset_ = 0;
  std::int64_t size_ = 1;
  std::vector<slot> sorted_;
};

/// A mesh: anything that maps named coordinates to ranks. Requirements, for `const M& m`:
///  1. m.size() is the number of ranks (integral or C<N>); m.dims_count() the number of dims;
///  2. m.name(i) and m.extent(i) give dim i's name and extent, for i < dims_count(), innermost first;
///  3. m.coord_of(rank) gives an indexable coordinate with dims_count() entries, m.rank_of(coord)
///     its inverse, for the ranks of the mesh;
///  4. m.group_of(rank, dims) and m.groups(dims), for a std::span<const dim>, give the ranks of a
///     group as std::vector<int> and all groups as std::vector<std::vector<int>>;
///  5. m.str() is its printed form.
/// Models: view and every layout<...>.
template <class M>
concept mesh_like = requires(const M& m, int rank, std::span<const dim> dims) {
  { m.dims_count() } -> std::convertible_to<std::size_t>;
  m.size();
  { m.name(std::size_t{0}) } -> std::convertible_to<dim>;
  { m.extent(std::size_t{0}) } -> std::convertible_to<std::int64_t>;
  m.rank_of(m.coord_of(rank));
  { m.group_of(rank, dims) } -> std::same_as<std::vector<int>>;
  { m.groups(dims) } -> std::same_as<std::vector<std::vector<int>>>;
  { m.str() } -> std::convertible_to<std::string>;
};
static_assert(mesh_like<view>);

}  // namespace hetmesh::mesh

template <>
struct fmt::formatter<hetmesh::mesh::atom> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::atom& a, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}:{}", a.extent, a.stride);
  }
};

template <>
struct fmt::formatter<hetmesh::mesh::view_mode> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::view_mode& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out = hetmesh::format_to(ctx.out(), "{}=", m.name);
    if (m.atoms.size() == 1) return hetmesh::format_to(out, "{}:{}", m.atoms[0].extent, m.atoms[0].stride);
    return hetmesh::format_to(out, "{}", m.atoms);
  }
};

template <>
struct fmt::formatter<hetmesh::mesh::view> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::view& v, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", v.str());
  }
};

#include "detail/view_impl.hpp"  // the members' bodies (HETMESH_BODIES)
