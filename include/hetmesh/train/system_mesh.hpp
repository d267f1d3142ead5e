// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: the mesh train::system lays its world out by, and every group it derives from it by name.
// The dims and the order are Megatron-LM's (mesh::megatron_moe_mesh: its decoder and expert RankGenerators
// over the same ranks), with the pipeline dim counting a separate encoder pool's ranks after the pp LLM
// ranks (pipeline::encoder_pool), so the system's groups are Megatron's for the same sizes and order:
//
//   tp     TENSOR_MODEL_PARALLEL_GROUP          the stage's ctx.tp: a layer's heads and columns split
//   pool   DATA_PARALLEL_GROUP_WITH_CP (dp-cp)  the ranks that share parameters: DP, CP rings, HDP, Ulysses
//   pipe   PIPELINE_MODEL_PARALLEL_GROUP        the pipeline's stages (and its encoder-pool ranks)
//   slice  the ranks of one tp coordinate (dp-cp-pp): one copy of the tp = 1 system, plan and all
//   ep     EXPERT_MODEL_PARALLEL_GROUP          the stage's ctx.ep: an MoE layer's experts
//   edp    EXPERT_DATA_PARALLEL_GROUP           the ranks holding the same experts: expert gradients
//   row    the encoder mesh's rows: every rank of one pipeline rank (tp x pool), the encoders' domain
//
// The encoders are decoupled from the LLM's mesh (MegaScale-Omni): their mesh (encoder_mesh) has the dims
// erow (tp and the pool's dims merged, tp fastest: row position = pool rank x tp + tp rank) and pp, over
// the same ranks as the decoder mesh (mesh::decoupled maps one onto the other). An encoder shard placed on
// pipeline rank p encodes over the row of p, so each encoder item is encoded once in the world, not once
// per tp coordinate (train/encoder_domain.hpp).
//
// The partition family plans over the pool (plans do not change with tp or ep); every tp rank of a pool
// position runs the same micro-batches in the same order, so a stage's collectives over ctx.tp meet. Pure:
// a function of (mesh, world size, pipeline ranks); no communicator.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../mesh/decoupled.hpp"
#include "../mesh/dim.hpp"
#include "../mesh/megatron_moe.hpp"
#include "../mesh/topology.hpp"
#include "../mesh/view.hpp"
#include "delivery.hpp"

namespace hetmesh::train {

/// The mesh of train::system's world, as values (system_options::mesh): Megatron-LM's sizes and order. The
/// pool's size (dp x cp) and dp follow from the world, pp and the encoder pool. Aggregate; `==`; printable.
struct system_mesh {
  int tp = 1;   ///< tensor-parallel ranks: ctx.tp (null when 1)
  int cp = 1;   ///< context-parallel extent inside the pool: orders the pool's ranks (cp x dp) as Megatron's
  int ep = 1;   ///< expert-parallel ranks: ctx.ep (null when 1), from Megatron's expert mesh
  int etp = 0;  ///< expert tensor-parallel ranks (0: tp)
  /// Megatron's order string, innermost first ("tp-cp-ep-dp-pp", its default).
  std::string order = std::string(mesh::megatron_order);

  friend bool operator==(const system_mesh&, const system_mesh&) = default;
  void hash_append(hasher& h) const { append_all(h, tp, cp, ep, etp, order); }
};

/// What one rank's model holds under train::system (system::split()): the pipeline's stage count, the
/// stages this rank runs, and its places in the tensor- and expert-parallel groups. A model factory that
/// takes it builds the rank's shard (train::check_parity passes {1, {0}, 0, 1, 0, 1} for its reference).
struct model_split {
  int stages = 1;          ///< pipeline stages of the whole model
  std::vector<int> local;  ///< the stages this rank runs, ascending
  int tp_rank = 0;         ///< place in ctx.tp
  int tp = 1;              ///< tensor-parallel ranks
  int ep_rank = 0;         ///< place in ctx.ep
  int ep = 1;              ///< expert-parallel ranks
  friend bool operator==(const model_split&, const model_split&) = default;
};

/// One rank's groups in train::system's mesh: for each family, the group's world ranks in communicator
/// order, the group's index in its family (the split colour) and the rank's place in it.
struct system_group {
  std::vector<int> ranks;  ///< world ranks, in the group communicator's order
  int index = 0;           ///< the group's index among its family's groups
  int position = 0;        ///< the rank's index in `ranks`

  /// Ranks in the group.
  [[nodiscard]] int size() const noexcept { return static_cast<int>(ranks.size()); }
  friend bool operator==(const system_group&, const system_group&) = default;
};

/// The groups of one rank (system_layout::groups_of).
struct system_groups {
  system_group tp;         ///< tensor parallel
  system_group pool;       ///< the pool: dp x cp at one (tp, pipeline rank)
  system_group pipe;       ///< the pipeline: pp LLM ranks, then the encoder pool's
  system_group slice;      ///< every rank of one tp coordinate: pool x pipeline ranks
  system_group ep;         ///< expert parallel (Megatron's expert mesh)
  system_group expert_dp;  ///< expert data parallel: the ranks holding the same experts (expert gradients)
  system_group row;        ///< the encoder mesh's row: every rank of this pipeline rank, by row position
  friend bool operator==(const system_groups&, const system_groups&) = default;
};

/// train::system's mesh over a world: the Megatron meshes (decoder, expert) and every group family, built
/// once. A value; pure.
class system_layout {
 public:
  /// The layout of `m` over `world` ranks with `pipeline_ranks` ranks per pipeline (pp plus a separate
  /// encoder pool's). Errors (invalid_argument naming the dimension): a size < 1, a world that is not the
  /// product tp x pool x pipeline ranks, ep x etp not dividing the pool x tp ranks, ep > 1 with a separate
  /// encoder pool (its ranks hold no experts), and what Megatron refuses (mesh::megatron_moe_mesh: the
  /// order, pp groups that differ). O(world x families).
  HETMESH_COMPILED system_layout(const system_mesh& m, int world, int pipeline_ranks, int encoder_ranks = 0);

  /// The mesh's values.
  [[nodiscard]] const system_mesh& mesh() const noexcept { return mesh_; }
  /// Megatron's meshes over the world (decoder and expert).
  [[nodiscard]] const mesh::megatron_moe_mesh& megatron() const noexcept { return mm_; }
  /// Ranks of the world.
  [[nodiscard]] int world() const noexcept { return static_cast<int>(mm_.world()); }
  /// Ranks per pool (dp x cp).
  [[nodiscard]] int pool() const noexcept { return pool_of(families_[1]); }
  /// Ranks per pipeline (pp plus the encoder pool's).
  [[nodiscard]] int pipeline_ranks() const noexcept { return pipeline_ranks_; }
  /// Tensor-parallel ranks.
  [[nodiscard]] int tp() const noexcept { return mesh_.tp; }
  /// Expert-parallel ranks.
  [[nodiscard]] int ep() const noexcept { return mesh_.ep; }

  /// The groups of world rank `rank`. Pre: 0 <= rank < world() (invalid_argument otherwise). O(world).
  [[nodiscard]] HETMESH_COMPILED system_groups groups_of(int rank) const;
  /// Every group of family `i` (0 tp, 1 pool, 2 pipe, 3 slice, 4 ep, 5 expert dp, 6 encoder row), in
  /// Megatron's order.
  [[nodiscard]] const std::vector<std::vector<int>>& family(int i) const {
    return families_[static_cast<std::size_t>(i)];
  }

  /// The dim of the encoder mesh's rows.
  static constexpr mesh::dim encoder_row_dim{"erow"};

  /// The encoders' mesh over the world (see the file comment): the decoder mesh with tp and the pool's dims
  /// (cp, dp, in the mesh's order) merged into `erow`, tp fastest, so that a rank's coordinate along erow
  /// is its pool rank x tp + its tp rank. O(dims).
  [[nodiscard]] HETMESH_COMPILED mesh::view encoder_mesh() const;
  /// The encoder mesh and the decoder (LLM) mesh over the same devices, placed on `topo` (its world must
  /// be this layout's): which encoder rows stay inside a node, which LLM dims they span. Errors:
  /// mesh::decoupled's (a topology of another size).
  [[nodiscard]] HETMESH_COMPILED mesh::decoupled encoder_placement(const mesh::topology& topo) const;

  /// Where the system's ranks sit, for train::plan_delivery: at (pipeline rank p, pool rank r), the world
  /// ranks of every tp coordinate (they read the same data), in tp rank order. O(world).
  [[nodiscard]] HETMESH_COMPILED rank_map ranks() const;

  friend bool operator==(const system_layout& a, const system_layout& b) {
    return a.mesh_ == b.mesh_ && a.mm_ == b.mm_ && a.pipeline_ranks_ == b.pipeline_ranks_;
  }

 private:
  static int pool_of(const std::vector<std::vector<int>>& f) {
    return f.empty() ? 0 : static_cast<int>(f.front().size());
  }
  [[nodiscard]] HETMESH_COMPILED system_group find(std::size_t f, int rank) const;
  HETMESH_COMPILED static mesh::megatron_moe_sizes checked(const system_mesh& m, int world,
                                                           int pipeline_ranks, int encoder_ranks);

  system_mesh mesh_;
  int pipeline_ranks_ = 1;
  mesh::megatron_moe_mesh mm_;
  std::array<std::vector<std::vector<int>>, 7> families_;
  std::array<std::vector<std::pair<int, int>>, 7> where_;  // per family, per world rank: (group, position)
};

}  // namespace hetmesh::train

/// Prints `mesh{tp=2, cp=1, ep=2, etp=2, order=tp-cp-ep-dp-pp}`.
template <>
struct fmt::formatter<hetmesh::train::system_mesh> : hetmesh::empty_spec_formatter {
  auto format(const hetmesh::train::system_mesh& m, fmt::format_context& ctx) const {
    return hetmesh::format_to(ctx.out(), "mesh{{tp={}, cp={}, ep={}, etp={}, order={}}}", m.tp, m.cp, m.ep,
                              m.etp == 0 ? m.tp : m.etp, m.order);
  }
};

#if HETMESH_BODIES

namespace hetmesh::train {

HETMESH_COMPILED system_layout::system_layout(const system_mesh& m, int world, int pipeline_ranks,
                                              int encoder_ranks)
    : mesh_(m), pipeline_ranks_(pipeline_ranks), mm_(checked(m, world, pipeline_ranks, encoder_ranks)) {
  families_[0] = mm_.decoder_groups("tp");
  families_[1] = mm_.decoder_groups("dp-cp");
  families_[2] = mm_.decoder_groups("pp");
  families_[3] = mm_.decoder_groups("cp-dp-pp");
  families_[4] = mm_.expert_groups("ep");
  families_[5] = mm_.expert_groups("dp");
  families_[6] = encoder_mesh().groups(encoder_row_dim);
  for (std::size_t f = 0; f < families_.size(); ++f) {
    where_[f].assign(static_cast<std::size_t>(world), {-1, -1});
    for (std::size_t g = 0; g < families_[f].size(); ++g)
      for (std::size_t i = 0; i < families_[f][g].size(); ++i)
        where_[f][static_cast<std::size_t>(families_[f][g][i])] = {static_cast<int>(g), static_cast<int>(i)};
  }
  for (int w = 0; w < world; ++w)  // the encoder mesh's rows, as train/encoder_domain.hpp numbers them
    HETMESH_ASSERT(where_[6][static_cast<std::size_t>(w)].second ==
                       where_[1][static_cast<std::size_t>(w)].second * m.tp +
                           where_[0][static_cast<std::size_t>(w)].second,
                   "train::system_layout: an encoder row position that is not pool rank x tp + tp rank");
}

HETMESH_COMPILED system_groups system_layout::groups_of(int rank) const {
  if (rank < 0 || rank >= world())
    throw_error<invalid_argument>("train::system_layout: rank {} of a world of {}; expected 0 <= rank < {}",
                                  rank, world(), world());
  return {find(0, rank), find(1, rank), find(2, rank), find(3, rank),
          find(4, rank), find(5, rank), find(6, rank)};
}

HETMESH_COMPILED mesh::view system_layout::encoder_mesh() const {
  std::vector<mesh::dim> merged{mesh::tp};
  const auto decoder = mm_.decoder().to_view();
  for (std::size_t i = 0; i < decoder.dims_count(); ++i)
    if (decoder.name(i) == mesh::cp || decoder.name(i) == mesh::dp) merged.push_back(decoder.name(i));
  return decoder.flatten(encoder_row_dim, std::span<const mesh::dim>(merged));
}

HETMESH_COMPILED mesh::decoupled system_layout::encoder_placement(const mesh::topology& topo) const {
  return mesh::decoupled(encoder_mesh(), mm_.decoder(), topo);
}

HETMESH_COMPILED rank_map system_layout::ranks() const {
  rank_map m{pool(), pipeline_ranks_, {}};
  m.ranks.assign(static_cast<std::size_t>(pool() * pipeline_ranks_),
                 std::vector<int>(static_cast<std::size_t>(tp()), -1));
  for (int w = 0; w < world(); ++w) {
    const auto at = [&](int f) {
      return where_[static_cast<std::size_t>(f)][static_cast<std::size_t>(w)].second;
    };
    m.ranks[static_cast<std::size_t>(at(2) * pool() + at(1))][static_cast<std::size_t>(at(0))] = w;
  }
  return m;
}

HETMESH_COMPILED system_group system_layout::find(std::size_t f, int rank) const {
  const auto [g, i] = where_[f][static_cast<std::size_t>(rank)];
  HETMESH_ASSERT(g >= 0, "train::system_layout: a rank in no group");
  return {families_[f][static_cast<std::size_t>(g)], g, i};
}

HETMESH_COMPILED mesh::megatron_moe_sizes system_layout::checked(const system_mesh& m, int world,
                                                                 int pipeline_ranks, int encoder_ranks) {
  const std::pair<const char*, int> given[] = {{"tp", m.tp}, {"cp", m.cp}, {"ep", m.ep}};
  for (const auto& [name, v] : given)
    if (v < 1) throw_error<invalid_argument>("train::system: mesh {} = {}; expected >= 1", name, v);
  if (m.etp < 0) throw_error<invalid_argument>("train::system: mesh etp = {}; expected >= 0 (0: tp)", m.etp);
  if (pipeline_ranks < 1 || world < 1 || world % (m.tp * pipeline_ranks) != 0)
    throw_error<invalid_argument>(
        "train::system: a world of {} ranks is not tp {} x pool x {} pipeline ranks; expected tp x "
        "pipeline ranks (pp plus encoder-pool ranks) dividing the world",
        world, m.tp, pipeline_ranks);
  const int pool = world / (m.tp * pipeline_ranks);
  if (pool % m.cp != 0)
    throw_error<invalid_argument>(
        "train::system: mesh cp = {} does not divide the pool of {} ranks; expected cp | world / (tp x "
        "pipeline ranks)",
        m.cp, pool);
  const int etp = m.etp == 0 ? m.tp : m.etp;
  if ((pool * m.tp) % (m.ep * etp) != 0)
    throw_error<invalid_argument>(
        "train::system: mesh ep = {} x etp = {} does not divide the {} ranks of a pipeline stage (tp {} x "
        "pool {}); expected ep x etp | tp x pool",
        m.ep, etp, pool * m.tp, m.tp, pool);
  if (m.ep > 1 && encoder_ranks > 0)
    throw_error<invalid_argument>(
        "train::system: mesh ep = {} with {} encoder-pool ranks per pipeline; expected ep = 1 with a "
        "separate encoder pool (its ranks hold no experts)",
        m.ep, encoder_ranks);
  return {
      .world = world, .tp = m.tp, .cp = m.cp, .pp = pipeline_ranks, .ep = m.ep, .etp = etp, .order = m.order};
}

}  // namespace hetmesh::train

#endif  // HETMESH_BODIES
