// SPDX-License-Identifier: Apache-2.0
// hetmesh::mesh: decoupled meshes. MegaScale-Omni parallelises encoders and the LLM backbone
// independently over the same devices: an encoder mesh with its own dims (e.g. esp x edp: encoder
// sequence parallel x encoder data parallel) and the LLM's 5D mesh. Both number the same devices
// 0..world-1 (rank r of either mesh is device r), so the mapping between them is by device: an encoder
// rank's LLM coordinates are those of its device, and an encoder group is node-local when its devices
// share a node. This header answers those questions and prints them.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "dim.hpp"
#include "topology.hpp"
#include "view.hpp"

namespace hetmesh::mesh {

/// A coordinate with its dim names, e.g. {tp=3,cp=1,dp=2}.
struct named_coord {
  std::vector<std::pair<dim, std::int64_t>> entries;  ///< (dim, coordinate) pairs, in mesh order

  /// The coordinate along d. Throws invalid_argument when absent.
  [[nodiscard]] std::int64_t at(const dim& d) const {
    for (const auto& [name, c] : entries) {
      if (name == d) return c;
    }
    throw_error<invalid_argument>("coordinate has no dim '{}': expected one of its {} dims", d,
                                  entries.size());
  }
  friend bool operator==(const named_coord&, const named_coord&) = default;
  void hash_append(hasher& h) const { append(h, entries); }
};

/// The coordinate of `rank` in any mesh (layout or view), with names.
template <mesh_like Mesh>
[[nodiscard]] named_coord named_coord_of(const Mesh& m, int rank) {
  const auto c = m.coord_of(rank);
  named_coord out;
  for (std::size_t i = 0; i < m.dims_count(); ++i) out.entries.emplace_back(m.name(i), c[i]);
  return out;
}

/// One group of the encoder mesh and where it sits.
struct group_placement {
  std::vector<int> ranks;     ///< encoder ranks = devices
  int nodes = 1;              ///< distinct nodes its devices occupy
  std::vector<dim> llm_dims;  ///< LLM dims along which its devices' LLM coordinates differ
  /// Whether the group fits in one node.
  [[nodiscard]] bool in_node() const noexcept { return nodes <= 1; }
  friend bool operator==(const group_placement&, const group_placement&) = default;
  void hash_append(hasher& h) const { append_all(h, ranks, nodes, llm_dims); }
};

/// An encoder mesh and an LLM mesh over the same devices, with the topology that places them.
class decoupled {
 public:
  /// Pre: both meshes and the topology have the same number of ranks (else invalid_argument naming
  /// the sizes). Takes layouts or views of layouts over 0..world-1. O(world).
  template <mesh_like Encoder, mesh_like Llm>
  decoupled(const Encoder& encoder, const Llm& llm, const topology& topo)
      : encoder_(as_view(encoder)), llm_(as_view(llm)), topo_(topo) {
    topo_.validate();
    if (encoder_.size() != topo_.world() || llm_.size() != topo_.world()) {
      throw_error<invalid_argument>(
          "decoupled meshes: encoder mesh {} has {} ranks, LLM mesh {} has {}, topology has {} devices: "
          "expected all equal",
          encoder_.str(), encoder_.size(), llm_.str(), llm_.size(), topo_.world());
    }
    for (int r = 0; r < topo_.world(); ++r) {
      if (!encoder_.contains(r) || !llm_.contains(r)) {
        throw_error<invalid_argument>(
            "decoupled meshes: device {} is missing from a mesh: expected both to cover 0..{}", r,
            topo_.world() - 1);
      }
    }
  }

  /// The encoder mesh.
  [[nodiscard]] const view& encoder() const noexcept { return encoder_; }
  /// The LLM mesh.
  [[nodiscard]] const view& llm() const noexcept { return llm_; }
  /// The cluster both meshes are placed on.
  [[nodiscard]] const topology& topo() const noexcept { return topo_; }

  /// The LLM coordinates of the device encoder rank `r` runs on. Throws for r outside the world.
  [[nodiscard]] named_coord llm_coord_of_encoder_rank(int r) const { return named_coord_of(llm_, r); }
  /// The encoder coordinates of the device LLM rank `r` runs on.
  [[nodiscard]] named_coord encoder_coord_of_llm_rank(int r) const { return named_coord_of(encoder_, r); }
  /// The LLM rank on the same device as encoder rank r (the identity, by construction), checked.
  [[nodiscard]] int llm_rank_of_encoder_rank(int r) const { return llm_.rank_of(llm_.coord_of(r)); }
  /// The encoder rank at `llm_coord`'s device: llm rank -> encoder rank (inverse of the above).
  [[nodiscard]] HETMESH_COMPILED int encoder_rank_of_llm_coord(std::span<const std::int64_t> llm_coord) const;

  /// Every encoder group along `dims`, with its node count and the LLM dims its devices vary along.
  /// Pure; O(world * dims).
  [[nodiscard]] HETMESH_COMPILED std::vector<group_placement> encoder_groups(std::span<const dim> dims) const;
  /// The groups of the encoder mesh along `dims`, each with where it lands on the cluster. O(world).
  template <class... D>
  requires(std::convertible_to<const D&, dim>&&...)
      [[nodiscard]] std::vector<group_placement> encoder_groups(const D&... dims) const {
    const std::array<dim, sizeof...(D)> a{dim(dims)...};
    return encoder_groups(std::span<const dim>(a));
  }

  /// How many encoder groups along `dims` lie inside one node.
  [[nodiscard]] HETMESH_COMPILED std::size_t encoder_groups_in_node(std::span<const dim> dims) const;

  friend bool operator==(const decoupled&, const decoupled&) = default;
  void hash_append(hasher& h) const { append_all(h, encoder_, llm_, topo_); }

 private:
  template <class M>
  static view as_view(const M& m) {
    if constexpr (std::is_same_v<M, view>) {
      return m;
    } else {
      return m.to_view();
    }
  }

  view encoder_;
  view llm_;
  topology topo_;
};

}  // namespace hetmesh::mesh

template <>
struct fmt::formatter<hetmesh::mesh::named_coord> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::named_coord& c, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out = hetmesh::format_to(ctx.out(), "{{");
    for (std::size_t i = 0; i < c.entries.size(); ++i) {
      out = hetmesh::format_to(out, "{}{}={}", i ? "," : "", c.entries[i].first, c.entries[i].second);
    }
    return hetmesh::format_to(out, "}}");
  }
};

template <>
struct fmt::formatter<hetmesh::mesh::group_placement> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::group_placement& g, FormatContext& ctx) const -> decltype(ctx.out()) {
    std::string dims;
    for (const auto& d : g.llm_dims) dims += hetmesh::format("{}{}", dims.empty() ? "" : ",", d);
    return hetmesh::format_to(ctx.out(), "{} on {} node{} (LLM dims: {})", fmt::join(g.ranks, ","), g.nodes,
                              g.nodes == 1 ? "" : "s", dims.empty() ? "none" : dims);
  }
};

/// Prints both meshes, the topology and, per encoder dim, how many of its groups are node-local.
template <>
struct fmt::formatter<hetmesh::mesh::decoupled> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::mesh::decoupled& d, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out = hetmesh::format_to(ctx.out(), "encoder {} and LLM {} on {}", d.encoder(), d.llm(), d.topo());
    for (std::size_t i = 0; i < d.encoder().dims_count(); ++i) {
      const hetmesh::mesh::dim name = d.encoder().name(i);
      const auto groups = d.encoder_groups(std::span<const hetmesh::mesh::dim>(&name, 1));
      std::size_t local = 0;
      for (const auto& g : groups) local += g.in_node() ? 1 : 0;
      out = hetmesh::format_to(out, "\n  {} groups: {} of {} inside one node", name, local, groups.size());
    }
    return out;
  }
};

#if HETMESH_BODIES

namespace hetmesh::mesh {

HETMESH_COMPILED int decoupled::encoder_rank_of_llm_coord(std::span<const std::int64_t> llm_coord) const {
  return encoder_.rank_of(encoder_.coord_of(llm_.rank_of(llm_coord)));
}

HETMESH_COMPILED std::vector<group_placement> decoupled::encoder_groups(std::span<const dim> dims) const {
  std::vector<group_placement> out;
  for (auto& g : encoder_.groups(dims)) {
    group_placement p{std::move(g), 1, {}};
    p.nodes = topo_.nodes_spanned(p.ranks);
    const auto c0 = llm_.coord_of(p.ranks.front());
    for (std::size_t i = 0; i < llm_.dims_count(); ++i) {
      for (int r : p.ranks) {
        if (llm_.coord_of(r)[i] != c0[i]) {
          p.llm_dims.push_back(llm_.name(i));
          break;
        }
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

HETMESH_COMPILED std::size_t decoupled::encoder_groups_in_node(std::span<const dim> dims) const {
  std::size_t n = 0;
  for (const auto& g : encoder_groups(dims)) n += g.in_node() ? 1 : 0;
  return n;
}

}  // namespace hetmesh::mesh

#endif  // HETMESH_BODIES
