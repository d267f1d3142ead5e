// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: delivery follows the step plan. From a step plan (train::system::plan) and the step's
// encoder items, the exact trainer ranks each part of each sample needs (data::route_plan):
//  - text: every rank that builds a micro-batch over the document: the members of its ring (HDP: the
//    ranks holding its whole pack or its ring's chunks; static CP and Ulysses: the ranks of the dp group
//    whose piece holds it), at every pipeline rank of their pipelines (each stage's micro-batch view
//    carries the tokens and targets; a separate encoder pool's ranks build them to size their work), and
//    their tensor-parallel peers;
//  - each encoder item: the ranks that encode a piece of it in the step's encoder domain
//    (train/encoder_domain.hpp: long-short SP over shard e's row, the tp x pool ranks of its pipeline rank;
//    the shards sit on stage 0's rank under pipeline::encoder_on_first_stage, on every pipeline rank in
//    the joint pipeline, pipeline::colocated_encoder, on the encoder-pool ranks under
//    pipeline::encoder_pool): one rank per piece, not its tensor-parallel peers.
// No part goes twice to one rank. Pure; equal on every rank for equal inputs.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../data/routes.hpp"
#include "../mesh/dim.hpp"
#include "../mesh/view.hpp"
#include "../model/encoder_batch.hpp"
#include "../model/micro_batch.hpp"
#include "../seq/long_short.hpp"
#include "build.hpp"
#include "encoder_domain.hpp"
#include "step_plan.hpp"

namespace hetmesh::train {

/// Where train::system's ranks sit among the trainers: per (pipeline rank p, pool rank r), at index
/// p * pool + r, the world ranks that stand for it (one, or its tensor-parallel peers in tp rank order:
/// the encoder domain's row position r x tp + t is the t-th).
struct rank_map {
  int pool = 1;  ///< ranks of the data-parallel pool (dp x cp)
  /// Pipeline ranks per pipeline: its depth, then its encoder-pool ranks (pipeline::encoder_pool).
  int pp = 1;
  std::vector<std::vector<int>> ranks;  ///< [p * pool + r]: its world ranks

  /// The world ranks of pool rank `r` at pipeline rank `p`. Pre: in range.
  [[nodiscard]] const std::vector<int>& at(int p, int r) const {
    return ranks[static_cast<std::size_t>(p * pool + r)];
  }
  /// Trainer ranks in all.
  [[nodiscard]] int trainers() const noexcept {
    std::size_t n = 0;
    for (const auto& v : ranks) n += v.size();
    return static_cast<int>(n);
  }
  friend bool operator==(const rank_map&, const rank_map&) = default;
};

/// train::system's own numbering: world rank p * pool + r, no tensor parallelism; `pp` counts every
/// pipeline rank (the depth plus a separate encoder pool's ranks). Throws invalid_argument unless pool,
/// pp >= 1.
[[nodiscard]] HETMESH_COMPILED rank_map system_ranks(int pool, int pp)
#if HETMESH_BODIES
{
  if (pool < 1 || pp < 1)
    throw_error<invalid_argument>("train::system_ranks: pool {} x pp {}; expected both >= 1", pool, pp);
  rank_map m{pool, pp, {}};
  for (int w = 0; w < pool * pp; ++w) m.ranks.push_back({w});
  return m;
}
#else
    ;
#endif

/// The rank map of a trainers' mesh of any order (a mesh::layout's view, a searched order from
/// data::mesh_of_order): the pool is cp, ep and dp flattened (cp fastest, so static CP's groups are cp
/// consecutive pool ranks), the pipeline rank is the pp coordinate, and every other dim (tp, user dims)
/// names peers that share their data. Throws invalid_argument for a view not over ranks 0..size-1.
/// O(world x dims).
[[nodiscard]] HETMESH_COMPILED rank_map mesh_ranks(const mesh::view& m)
#if HETMESH_BODIES
{
  if (m.offset() != 0)
    throw_error<invalid_argument>("train::mesh_ranks: mesh {} starts at rank {}; expected ranks 0..{}",
                                  m.str(), m.offset(), m.size() - 1);
  const auto ext = [&](const mesh::dim& d) { return m.has(d) ? static_cast<int>(m.extent(d)) : 1; };
  const auto coord = [&](const std::vector<std::int64_t>& c, const mesh::dim& d) {
    return m.has(d) ? static_cast<int>(c[m.index_of(d)]) : 0;
  };
  const int cp = ext(mesh::cp), ep = ext(mesh::ep), dp = ext(mesh::dp), pp = ext(mesh::pp);
  rank_map out{cp * ep * dp, pp, {}};
  out.ranks.resize(static_cast<std::size_t>(out.pool * pp));
  for (int w = 0; w < static_cast<int>(m.size()); ++w) {
    const auto c = m.coord_of(w);
    const int r = coord(c, mesh::cp) + cp * (coord(c, mesh::ep) + ep * coord(c, mesh::dp));
    out.ranks[static_cast<std::size_t>(coord(c, mesh::pp) * out.pool + r)].push_back(w);
  }
  return out;
}
#else
    ;
#endif

/// mesh_ranks of a mesh::layout (any order). O(world x dims).
template <class M>
requires requires(const M& m) {
  { m.to_view() } -> std::same_as<mesh::view>;
}
[[nodiscard]] rank_map mesh_ranks(const M& m) { return mesh_ranks(m.to_view()); }

/// The delivery plan of `plan`: per document (sample) of the step, in stream order, the trainer ranks
/// that need its text and each of its encoder items (see the file comment). `items[i]` are the encoder
/// items of plan.documents[i] (model::encoder_item: encoder, id, position, tokens); the items' pieces come
/// from the plan's encoder domain (step_layout::encoder_domain, planned under its encoder_sp); `where` maps
/// the system's ranks to trainer ranks (system_ranks, or mesh_ranks of the trainers' mesh). Document ids
/// are the samples' stable ids (seq::make_sample_id), so a data-plane host knows its parts.
/// Errors (invalid_argument): items.size() != documents; a map for another pool or depth; items in a plan
/// without encoder shards (a plan made without the batch). Pure; O(step tokens + parts x ranks).
[[nodiscard]] HETMESH_COMPILED data::route_plan plan_delivery(
    const step_layout& plan, std::span<const std::vector<model::encoder_item>> items, const rank_map& where)
#if HETMESH_BODIES
{
  if (items.size() != plan.documents.size())
    throw_error<invalid_argument>("train::plan_delivery: items for {} documents; expected the plan's {}",
                                  items.size(), plan.documents.size());
  // Pipeline ranks per pipeline: the LLM's pp, then a separate encoder pool's ranks (which build the
  // micro-batches of their pool rank to size its encoder work, so they read its documents too).
  const int depth = std::max(plan.pp, plan.pipeline.total_ranks());
  if (where.pool != plan.world || where.pp != depth ||
      where.ranks.size() != static_cast<std::size_t>(plan.world * depth))
    throw_error<invalid_argument>(
        "train::plan_delivery: a rank map for pool {} x {} pipeline ranks; expected the plan's pool {} x {} "
        "(pp plus encoder-pool ranks)",
        where.pool, where.pp, plan.world, depth);
  for (std::size_t i = 0; i < where.ranks.size(); ++i)
    if (static_cast<int>(where.ranks[i].size()) != plan.tp)
      throw_error<invalid_argument>(
          "train::plan_delivery: a rank map with {} ranks at pipeline rank {} pool rank {}; expected the "
          "plan's tp = {} (the ranks that run a pool rank's micro-batches: plan with the system's tp)",
          where.ranks[i].size(), static_cast<int>(i) / plan.world, static_cast<int>(i) % plan.world, plan.tp);
  // Parts: per document its text, then its items; (document index, item) -> part.
  std::vector<std::size_t> first(plan.documents.size() + 1, 0);
  std::map<std::int64_t, std::size_t> doc_index;
  std::map<std::pair<int, std::int64_t>, std::size_t> item_part;
  data::route_plan out{where.trainers(), {}};
  for (std::size_t i = 0; i < plan.documents.size(); ++i) {
    first[i] = out.parts.size();
    doc_index[plan.documents[i].id] = i;
    out.parts.push_back({plan.documents[i].id, data::text_part, {}});
    for (std::size_t k = 0; k < items[i].size(); ++k) {
      item_part[{items[i][k].encoder, items[i][k].id}] = out.parts.size();
      out.parts.push_back({plan.documents[i].id, static_cast<int>(k), {}});
    }
  }
  auto send = [&](std::size_t part, int p, int r) {
    const auto& w = where.at(p, r);
    out.parts[part].ranks.insert(out.parts[part].ranks.end(), w.begin(), w.end());
  };
  for (int r = 0; r < plan.world; ++r)
    for (auto id : documents_of(plan, r))
      for (int p = 0; p < depth; ++p) send(first[doc_index.at(id)], p, r);

  const int E = plan.pipeline.num_encoder_shards();
  if (!item_part.empty()) {
    if (E == 0)
      throw_error<invalid_argument>(
          "train::plan_delivery: the step has encoder items but the plan has no encoder shards; expected a "
          "plan made from the batch (train::system::plan(batch))");
    if (plan.encoder_landings.empty())
      throw_error<invalid_argument>(
          "train::plan_delivery: the step has encoder items but the plan has no encoder landings; expected a "
          "plan made from the batch (train::system::plan(batch))");
    // The plan's encoder domain: the piece at domain rank d is read by the rank at d's row position on its
    // shard's pipeline rank (domain_place_of).
    for (const auto& slot : plan.encoder_domain)
      for (std::size_t k = 0; k < slot.size(); ++k)
        for (const auto& a : slot[k].items)
          for_each_piece(a, [&](int d, seq::token_range) {
            const auto at = domain_place_of(plan, d);
            const auto& peers = where.at(
                plan.pipeline.encoder_shard_to_rank[static_cast<std::size_t>(at.shard)], at.pool_rank);
            out.parts[item_part.at({static_cast<int>(k), a.item.id})].ranks.push_back(
                peers[static_cast<std::size_t>(at.tp_rank)]);
          });
  }
  for (auto& p : out.parts) {
    std::sort(p.ranks.begin(), p.ranks.end());
    p.ranks.erase(std::unique(p.ranks.begin(), p.ranks.end()), p.ranks.end());
  }
  return out;
}
#else
    ;
#endif

/// plan_delivery with the items of `batch`, the batch the plan was made from (its bytes are not read).
[[nodiscard]] HETMESH_COMPILED data::route_plan plan_delivery(const step_layout& plan,
                                                              const model::step_batch& batch,
                                                              const rank_map& where)
#if HETMESH_BODIES
{
  std::vector<std::vector<model::encoder_item>> items;
  for (const auto& d : batch.documents) items.push_back(d.items);
  return plan_delivery(plan, items, where);
}
#else
    ;
#endif

}  // namespace hetmesh::train
