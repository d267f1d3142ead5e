// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: the trainers' mesh as the data plane sees it. The data plane takes the same mesh the
// rest of the library uses (any mesh::layout of any order, a mesh::view, the LLM side of a
// mesh::decoupled, or an order string and shape from the layout search) and derives from it the one
// thing it needs: which ranks share a data-parallel index.
//
// Data dims: `dp` and `ep`. Expert parallelism is a split of data parallelism (Megatron-LM): ranks that
// differ only in their ep coordinate run different samples through the dense layers, so they load
// different data. The data-parallel index of a rank is its coordinate along ep and dp flattened, ep
// fastest; dp_size() = extent(ep) x extent(dp) (an absent dim has extent 1). Every other dim (tp, cp,
// pp, encoder or user dims) shares the data of its data-parallel index.
#pragma once

#include <algorithm>
#include <array>
#include <climits>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../mesh/decoupled.hpp"
#include "../mesh/dim.hpp"
#include "../mesh/layout.hpp"
#include "../mesh/view.hpp"

namespace hetmesh::data {

/// The name of the flattened data-parallel dim (ep and dp merged, ep fastest).
inline constexpr mesh::dim data_dim{"data"};

/// A mesh from a Megatron-LM order string, innermost first, and the extent of each dim (e.g. a
/// mesh::layout_choice's best().order and shape). Dims of the five LLM dims (tp cp ep dp pp) that the
/// shape lacks have extent 1; a shape dim of extent > 1 must be in the order; one of extent 1 may be
/// omitted. Throws invalid_argument naming the dim otherwise (unknown, repeated, extent < 1). O(dims^2).
[[nodiscard]] HETMESH_COMPILED mesh::view mesh_of_order(
    std::string_view order, std::span<const std::pair<mesh::dim, std::int64_t>> shape);
/// A mesh from an order string and extents (see the span overload).
[[nodiscard]] HETMESH_COMPILED mesh::view mesh_of_order(
    std::string_view order, std::initializer_list<std::pair<mesh::dim, std::int64_t>> shape);

/// The trainers' mesh, with the data-parallel index of every rank (see the file comment). A value:
/// copyable, comparable, hashable, printable. Default: one rank. Dims of extent 1 are dropped (they
/// number no rank), so two spellings of one mesh compare equal.
class trainer_mesh {
 public:
  /// One rank, one data-parallel index.
  trainer_mesh() : trainer_mesh(mesh::view()) {}

  /// From any mesh over ranks 0..size-1: a mesh::layout of any order (implicitly, so a config can say
  /// `.layout = mesh::make_mesh("tp-dp-cp-pp", ...)`), or a mesh::view. Throws invalid_argument for a
  /// view that does not cover 0..size-1 (a sub-mesh). O(world).
  template <mesh::mesh_like M>
  requires(std::same_as<M, mesh::view> ||
           requires(const M& m) {
             { m.to_view() } -> std::same_as<mesh::view>;
           }) trainer_mesh(const M& m)  // NOLINT(google-explicit-constructor): a mesh is a trainer mesh
      : mesh_(without_unit_dims(to_view(m))) {
    if (mesh_.offset() != 0)
      throw_error<invalid_argument>("data plane: mesh {} starts at rank {}; expected a mesh over ranks 0..{}",
                                    mesh_.str(), mesh_.offset(), mesh_.size() - 1);
    std::vector<mesh::dim> data;
    for (const mesh::dim& d : {mesh::ep, mesh::dp})
      if (mesh_.has(d)) data.push_back(d);
    if (data.empty()) {
      dp_size_ = 1;
      dp_of_.assign(static_cast<std::size_t>(mesh_.size()), 0);
      groups_ = {mesh_.ranks()};
    } else {
      const mesh::view flat = mesh_.flatten(data_dim, std::span<const mesh::dim>(data));
      dp_size_ = static_cast<int>(flat.extent(data_dim));
      std::vector<mesh::dim> others;
      for (std::size_t i = 0; i < flat.dims_count(); ++i)
        if (flat.name(i) != data_dim) others.push_back(flat.name(i));
      dp_of_.assign(static_cast<std::size_t>(mesh_.size()), 0);
      groups_.assign(static_cast<std::size_t>(dp_size_), {});
      const auto di = flat.index_of(data_dim);
      for (int r = 0; r < static_cast<int>(mesh_.size()); ++r) {
        const auto d = flat.coord_of(r)[di];
        dp_of_[static_cast<std::size_t>(r)] = static_cast<int>(d);
        groups_[static_cast<std::size_t>(d)].push_back(r);
      }
    }
  }
  /// The LLM mesh of decoupled encoder and LLM meshes: data goes to the devices by their LLM coordinates
  /// (each encoder rank shares its device with one LLM rank).
  trainer_mesh(const mesh::decoupled& d) : trainer_mesh(d.llm()) {}  // NOLINT(google-explicit-constructor)

  /// The mesh.
  [[nodiscard]] const mesh::view& mesh() const noexcept { return mesh_; }
  /// Number of trainer ranks.
  [[nodiscard]] int world() const noexcept { return static_cast<int>(mesh_.size()); }
  /// Number of data-parallel indices: extent(ep) x extent(dp).
  [[nodiscard]] int dp_size() const noexcept { return dp_size_; }
  /// The data-parallel index of `rank`. Throws invalid_argument for a rank outside the mesh. O(1).
  [[nodiscard]] HETMESH_COMPILED int dp_of(int rank) const;
  /// Every rank of data-parallel index `d`, ascending; the first (coordinate 0 along every other dim) is
  /// the one that receives the data from the data plane. Throws invalid_argument for d out of range. O(1).
  [[nodiscard]] HETMESH_COMPILED const std::vector<int>& ranks_of(int d) const;
  /// The printed form: the mesh's.
  [[nodiscard]] HETMESH_COMPILED std::string str() const;

  friend bool operator==(const trainer_mesh& a, const trainer_mesh& b) { return a.mesh_ == b.mesh_; }
  HETMESH_COMPILED void hash_append(hasher& h) const;

 private:
  template <class M>
  static mesh::view to_view(const M& m) {
    if constexpr (std::is_same_v<M, mesh::view>)
      return m;
    else
      return m.to_view();
  }
  // Dims of extent 1 do not change a rank's number: dropping them makes make_mesh(tp(2), dp(4)) and the
  // same mesh spelt with all five Megatron-LM dims one value.
  HETMESH_COMPILED static mesh::view without_unit_dims(const mesh::view& v);
  HETMESH_COMPILED void check_rank(int rank) const;

  mesh::view mesh_;
  int dp_size_ = 1;
  std::vector<int> dp_of_;                // per rank, its data-parallel index
  std::vector<std::vector<int>> groups_;  // per data-parallel index, its ranks ascending
};

}  // namespace hetmesh::data

template <>
struct fmt::formatter<hetmesh::data::trainer_mesh> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::trainer_mesh& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", m.str());
  }
};

#if HETMESH_BODIES

namespace hetmesh::data {

HETMESH_COMPILED mesh::view mesh_of_order(std::string_view order,
                                          std::span<const std::pair<mesh::dim, std::int64_t>> shape) {
  std::vector<mesh::view_mode> modes;
  std::int64_t stride = 1;
  std::vector<mesh::dim> names;
  for (std::size_t start = 0;;) {
    const std::size_t end = order.find('-', start);
    const auto token = order.substr(start, end == std::string_view::npos ? end : end - start);
    if (token.empty() || token.size() > mesh::max_dim_name)
      throw_error<invalid_argument>(
          "order \"{}\" has a dim name \"{}\"; expected dims joined by '-', e.g. \"{}\"", order, token,
          mesh::megatron_order);
    names.emplace_back(token);
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  for (const mesh::dim& d : names) {
    for (const auto& m : modes)
      if (m.name == d)
        throw_error<invalid_argument>("order \"{}\" names dim '{}' twice; expected each dim once", order, d);
    std::int64_t extent = -1;
    for (const auto& [name, e] : shape)
      if (name == d) extent = e;
    if (extent < 0) {
      if (!mesh::is_llm_dim(d))
        throw_error<invalid_argument>(
            "order \"{}\" names dim '{}' that the shape lacks; expected one of "
            "tp cp ep dp pp or a dim of the shape",
            order, d);
      extent = 1;
    }
    if (extent < 1 || extent > INT_MAX)
      throw_error<invalid_argument>("dim '{}' has extent {}; expected 1 <= extent <= {}", d, extent, INT_MAX);
    modes.push_back({d, {mesh::atom{extent, stride}}});
    stride *= extent;
    if (stride > INT_MAX) throw_error<invalid_argument>("mesh \"{}\" has more than {} ranks", order, INT_MAX);
  }
  for (const auto& entry : shape) {
    const auto& [name, e] = entry;  // clang 14 cannot capture a structured binding: the lambda reads entry
    const bool listed = std::any_of(modes.begin(), modes.end(),
                                    [&](const mesh::view_mode& m) { return m.name == entry.first; });
    if (!listed && e != 1)
      throw_error<invalid_argument>("dim '{}' of extent {} is missing from order \"{}\"; expected it listed",
                                    name, e, order);
  }
  return mesh::view(std::move(modes), 0);
}

HETMESH_COMPILED mesh::view mesh_of_order(std::string_view order,
                                          std::initializer_list<std::pair<mesh::dim, std::int64_t>> shape) {
  return mesh_of_order(order,
                       std::span<const std::pair<mesh::dim, std::int64_t>>(shape.begin(), shape.size()));
}

HETMESH_COMPILED int trainer_mesh::dp_of(int rank) const {
  check_rank(rank);
  return dp_of_[static_cast<std::size_t>(rank)];
}

HETMESH_COMPILED const std::vector<int>& trainer_mesh::ranks_of(int d) const {
  if (d < 0 || d >= dp_size_)
    throw_error<invalid_argument>("data plane: data-parallel index {} of mesh {}; expected 0 <= index < {}",
                                  d, mesh_.str(), dp_size_);
  return groups_[static_cast<std::size_t>(d)];
}

HETMESH_COMPILED std::string trainer_mesh::str() const { return mesh_.str(); }

HETMESH_COMPILED void trainer_mesh::hash_append(hasher& h) const { append(h, mesh_); }

HETMESH_COMPILED mesh::view trainer_mesh::without_unit_dims(const mesh::view& v) {
  std::vector<mesh::view_mode> modes;
  for (const auto& m : v.modes())
    if (m.extent() > 1) modes.push_back(m);
  return mesh::view(std::move(modes), v.offset());
}

HETMESH_COMPILED void trainer_mesh::check_rank(int rank) const {
  if (rank < 0 || rank >= world())
    throw_error<invalid_argument>("data plane: rank {} is not a trainer of mesh {}; expected 0 <= rank < {}",
                                  rank, mesh_.str(), world());
}

}  // namespace hetmesh::data
#endif  // HETMESH_BODIES
