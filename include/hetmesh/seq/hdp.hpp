// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: Hybrid Data Parallelism (ByteScale, arXiv 2502.21231 §2, Alg. 1). The dp x cp ranks
// form one pool of `pool` ranks. Each step, every sequence gets just the ranks its length needs:
// short ones (length <= C) are packed whole onto single ranks by best fit; a long one runs on a ring
// of D(s) ranks (any D, from the offload solver), split zigzag into 2D chunks. Rings are ordered
// lists of pool ranks on the parent communicator (no per-ring communicator).
//
// The planner is split in two so that balance/ can replace the placement:
//   hdp_shard     sequences -> work items (packed bins, rings with D and offload ratio)   [what]
//   hdp_assemble  items + placement (ring ranks and an order key per item) -> per-rank plan [where]
//   plan_hdp      hdp_shard + a naive contiguous placement + hdp_assemble (ByteScale Alg. 1)
// The plan's types are in hdp_plan.hpp, the placements in hdp_placement.hpp; this header includes both.
// Loss: each rank divides its summed token loss by `global_tokens`, and gradients are SUM-reduced
// over the pool; then the gradient equals plain data parallelism for any placement (ByteScale Eq. 1-2).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/exactly_once.hpp"
#include "../core/sort.hpp"
#include "detail/best_fit.hpp"
#include "hdp_placement.hpp"
#include "hdp_plan.hpp"
#include "offload.hpp"
#include "types.hpp"

namespace hetmesh::seq {

/// Data-aware sharding (ByteScale §2.3 and Alg. 1 lines 1-2). Sequences of length <= C are packed
/// by best-fit decreasing into bins of C; a longer one gets (D, r) from solve_offload, with D capped
/// to `pool`. Preconditions: pool >= 1, C >= 1, unique ids, lengths >= 0 (zero-length sequences are
/// dropped). Postconditions: every sequence appears in exactly one item; packs hold <= C tokens;
/// a ring of D ranks has length >= 2D. Throws capacity_error for a sequence the pool cannot hold
/// even with full offloading. Pure and independent of input order; O(n log n). Not collective.
[[nodiscard]] HETMESH_COMPILED hdp_sharding hdp_shard(std::span<const seq_desc> seqs,
                                                      const hdp_policy& policy, int pool)
#if HETMESH_BODIES
{
  if (pool < 1) throw_error<invalid_argument>("hdp_shard: pool has {} ranks; expected >= 1", pool);
  if (policy.capacity < 1)
    throw_error<invalid_argument>("hdp_shard: capacity C = {}; expected >= 1 token", policy.capacity);
  check_seq_descs(seqs, "hdp_shard");
  hdp_sharding out;
  out.policy = policy;
  out.pool = pool;
  std::vector<seq_desc> shorts, longs;
  for (const auto& s : seqs) {
    out.global_tokens += s.length;
    if (s.length == 0) continue;
    (s.length <= policy.capacity ? shorts : longs).push_back(s);
  }
  hetmesh::indirect_sort(longs.begin(), longs.end(), longer_first);
  const auto bins = detail::best_fit_decreasing(shorts, policy.capacity);
  out.items.reserve(longs.size() + bins.size());
  for (const auto& s : longs) {
    hdp_item it;
    it.offload = solve_offload(s.length, policy.capacity, policy.model, policy.offload, pool);
    it.degree = it.offload.ranks;
    if (s.length < 2 * static_cast<std::int64_t>(it.degree))
      throw_error<invalid_argument>(
          "hdp_shard: sequence {} of {} tokens cannot be split into 2*D = {} zigzag chunks; expected "
          "length >= 2*D (raise the capacity)",
          s.id, s.length, 2 * it.degree);
    it.seqs = {s};
    it.tokens = s.length;
    out.items.push_back(std::move(it));
  }
  for (const auto& bin : bins) {
    hdp_item it;
    it.packed = true;
    it.seqs.reserve(bin.size());
    it.offload.ratio_steps = policy.offload.ratio_steps;
    for (std::size_t i : bin) {
      it.seqs.push_back(shorts[i]);
      it.tokens += shorts[i].length;
    }
    it.offload.length = it.tokens;
    out.items.push_back(std::move(it));
  }
  for (std::size_t i = 0; i < out.items.size(); ++i) out.items[i].index = static_cast<std::int64_t>(i);
  return out;
}
#else
    ;
#endif

/// Builds the per-rank plan from a placement (one hdp_placement per item). Checks that each ring has
/// `degree` distinct ranks in [0, pool). Per rank, micro-batches run by (order, item). Pure; O(total
/// ring size * log). Throws invalid_argument on a malformed placement.
[[nodiscard]] HETMESH_COMPILED hdp_plan hdp_assemble(hdp_sharding sharding,
                                                     std::vector<hdp_placement> placement)
#if HETMESH_BODIES
{
  if (placement.size() != sharding.items.size())
    throw_error<invalid_argument>("hdp_assemble: {} placements for {} items; expected one per item",
                                  placement.size(), sharding.items.size());
  hdp_plan plan;
  plan.per_rank.resize(static_cast<std::size_t>(sharding.pool));
  {  // reserve exactly: one allocation per rank
    std::vector<std::size_t> count(static_cast<std::size_t>(sharding.pool), 0);
    for (const auto& pl : placement)
      for (int r : pl.ring)
        if (r >= 0 && r < sharding.pool) ++count[static_cast<std::size_t>(r)];
    for (std::size_t r = 0; r < count.size(); ++r) plan.per_rank[r].reserve(count[r]);
  }
  std::vector<int> seen(static_cast<std::size_t>(sharding.pool), -1);
  for (std::size_t i = 0; i < sharding.items.size(); ++i) {
    const auto& it = sharding.items[i];
    const auto& pl = placement[i];
    if (static_cast<int>(pl.ring.size()) != it.degree)
      throw_error<invalid_argument>("hdp_assemble: item {} has a ring of {} ranks; expected D = {}", i,
                                    pl.ring.size(), it.degree);
    for (std::size_t p = 0; p < pl.ring.size(); ++p) {
      const int r = pl.ring[p];
      if (r < 0 || r >= sharding.pool)
        throw_error<invalid_argument>("hdp_assemble: item {} names rank {}; expected a rank in [0, {})", i, r,
                                      sharding.pool);
      if (seen[static_cast<std::size_t>(r)] == static_cast<int>(i))
        throw_error<invalid_argument>("hdp_assemble: item {} names rank {} twice; expected distinct ranks", i,
                                      r);
      seen[static_cast<std::size_t>(r)] = static_cast<int>(i);
      hdp_micro_batch mb;
      mb.item = static_cast<std::int64_t>(i);
      mb.order = pl.order;
      mb.degree = it.degree;
      mb.ring_position = static_cast<int>(p);
      mb.offload_ratio = it.offload.ratio();
      if (it.packed) {
        mb.segments.reserve(it.seqs.size());
        for (const auto& s : it.seqs) {
          mb.segments.push_back({s.id, {0, s.length}});
          mb.tokens += s.length;
        }
      } else {  // hdp_ranges, without its temporary vector
        const auto& s = it.seqs.front();
        const int pos = static_cast<int>(p);
        if (it.degree == 1) {
          mb.segments.push_back({s.id, {0, s.length}});
        } else {
          mb.segments.reserve(2);
          mb.segments.push_back({s.id, hdp_chunk(s.length, it.degree, pos)});
          mb.segments.push_back({s.id, hdp_chunk(s.length, it.degree, 2 * it.degree - 1 - pos)});
        }
        for (const auto& sg : mb.segments) mb.tokens += sg.tokens.size();
      }
      plan.per_rank[static_cast<std::size_t>(r)].push_back(std::move(mb));
    }
  }
  const auto before = [](const hdp_micro_batch& a, const hdp_micro_batch& b) {
    return a.order != b.order ? a.order < b.order : a.item < b.item;
  };
  for (auto& mbs : plan.per_rank)
    if (!std::is_sorted(mbs.begin(), mbs.end(), before))
      hetmesh::indirect_sort(mbs.begin(), mbs.end(), before);
  plan.sharding = std::move(sharding);
  plan.placement = std::move(placement);
  return plan;
}
#else
    ;
#endif

/// How `plan`'s segments, over all ranks, fail to hold every token of every sequence of `seqs` exactly
/// once (exactly_once_violation's message); empty when they do. The planners check it at heavy level
/// (HETMESH_ASSERTION_LEVEL 3). Pure; O(segments log segments).
[[nodiscard]] HETMESH_COMPILED std::string hdp_exactly_once_violation(std::span<const seq_desc> seqs,
                                                                      const hdp_plan& plan);

/// HDP end to end: hdp_shard, the placement the policy names, hdp_assemble (with the default
/// `waves` placement this is ByteScale Alg. 1). Same contract as hdp_shard; the result is
/// independent of the order of `seqs`. Heavy level: checks every token is assigned exactly once.
[[nodiscard]] HETMESH_COMPILED hdp_plan plan_hdp(std::span<const seq_desc> seqs, const hdp_policy& policy,
                                                 int pool);

}  // namespace hetmesh::seq

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED std::string hdp_exactly_once_violation(std::span<const seq_desc> seqs,
                                                        const hdp_plan& plan) {
  std::vector<id_range> expected, assigned;
  expected.reserve(seqs.size());
  for (const auto& s : seqs) expected.push_back({s.id, 0, s.length});
  for (const auto& mbs : plan.per_rank)
    for (const auto& mb : mbs)
      for (const auto& sg : mb.segments) assigned.push_back({sg.seq_id, sg.tokens.begin, sg.tokens.end});
  return exactly_once_violation(std::move(expected), std::move(assigned));
}

HETMESH_COMPILED hdp_plan plan_hdp(std::span<const seq_desc> seqs, const hdp_policy& policy, int pool) {
  auto sh = hdp_shard(seqs, policy, pool);
  auto pl = policy.placement == hdp_placement_kind::least_loaded ? hdp_least_loaded_placement(sh)
                                                                 : hdp_naive_placement(sh);
  auto plan = hdp_assemble(std::move(sh), std::move(pl));
  HETMESH_ASSERT_AT(heavy, hdp_exactly_once_violation(seqs, plan).empty(), "plan_hdp: {}",
                    hdp_exactly_once_violation(seqs, plan));
  return plan;
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
