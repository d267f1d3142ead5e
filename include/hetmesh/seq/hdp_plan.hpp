// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: the data of Hybrid Data Parallelism (hdp.hpp): the policy, the work items hdp_shard makes
// (packs of short sequences, rings of D ranks for long ones), where each item runs (its ring and order
// key), and the per-rank plan hdp_assemble builds from them, with the zigzag chunk math its micro-batches
// use. All of it prints and hashes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "offload.hpp"
#include "types.hpp"

namespace hetmesh::seq {

/// How plan_hdp places items on ranks (balance/ offers ByteScale's Alg. 2 on top of hdp_assemble).
enum class hdp_placement_kind {
  waves,         ///< ByteScale Alg. 1's naive step: contiguous ranges, first fit into waves of the pool
  least_loaded,  ///< greedy by modelled cost: each item on the D least-loaded ranks (multi-rank LPT)
};

/// Policy value of HDP. `capacity` is C, the tokens of activations one rank holds per micro-batch.
struct hdp_policy {
  std::int64_t capacity = 8192;              ///< C: activation tokens one rank holds per micro-batch
  offload_policy offload{.enabled = false};  ///< selective offloading of activations (off by default)
  offload_model model{};  ///< offload solver and item costs; Act(s) proportional to s by default
  hdp_placement_kind placement = hdp_placement_kind::waves;  ///< how rings are placed on the pool

  friend bool operator==(const hdp_policy&, const hdp_policy&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// One unit of work: either a pack of whole short sequences on one rank (degree 1, `packed`), or
/// one long sequence on a ring of `degree` ranks with an offload ratio.
struct hdp_item {
  std::int64_t index = 0;      ///< position in hdp_sharding::items
  bool packed = false;         ///< a pack of whole short sequences on one rank
  int degree = 1;              ///< D: ranks of the ring (1 for packs)
  offload_choice offload{};    ///< ratio and solver bounds (ratio 0 for packs)
  std::vector<seq_desc> seqs;  ///< packed: members in pack order; ring: exactly one
  std::int64_t tokens = 0;     ///< sum of member lengths

  friend bool operator==(const hdp_item&, const hdp_item&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Output of hdp_shard: items in canonical order (rings by (-length, id), then packs in best-fit
/// creation order), and the global token count for loss normalisation.
struct hdp_sharding {
  hdp_policy policy{};             ///< the policy it was made with
  int pool = 0;                    ///< ranks of the HDP pool
  std::vector<hdp_item> items;     ///< canonical order: rings, then packs
  std::int64_t global_tokens = 0;  ///< tokens of the batch, for loss normalisation

  friend bool operator==(const hdp_sharding&, const hdp_sharding&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Zigzag chunk k of 2D for a sequence of length s: [floor(k*s/2D), floor((k+1)*s/2D)). Chunks differ
/// by at most one token, so any s >= 2D splits over any D without padding.
[[nodiscard]] constexpr token_range hdp_chunk(std::int64_t s, int degree, int k) noexcept {
  const std::int64_t n = 2 * static_cast<std::int64_t>(degree);
  return {k * s / n, (k + 1) * s / n};
}

/// The two zigzag ranges the rank at ring position p holds: chunks p and 2D-1-p (one range when D==1).
[[nodiscard]] HETMESH_COMPILED std::vector<token_range> hdp_ranges(std::int64_t s, int degree, int position);

/// Where an item runs: its ring (ordered pool ranks, size = degree) and an order key. Each rank runs
/// its items by (order, item index); because that order is global, every ring's members reach it
/// together and the step cannot deadlock.
struct hdp_placement {
  std::vector<int> ring;   ///< ordered pool ranks, size = degree
  std::int64_t order = 0;  ///< global order key

  friend bool operator==(const hdp_placement&, const hdp_placement&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// One micro-batch on one rank: the item, this rank's place in the item's ring (the ring itself is
/// hdp_plan::ring(mb), stored once per item rather than once per member), the token ranges it holds
/// (per sequence, local order = order of `segments`), and its offload ratio.
struct hdp_micro_batch {
  std::int64_t item = 0;              ///< index in hdp_sharding::items
  std::int64_t order = 0;             ///< the item's order key
  int degree = 1;                     ///< ring size D (1 for a pack)
  int ring_position = 0;              ///< index of this rank in the item's ring
  std::vector<seq_segment> segments;  ///< packs: whole sequences; rings: chunks p and 2D-1-p
  double offload_ratio = 0.0;         ///< share of activations offloaded
  std::int64_t tokens = 0;            ///< tokens this rank holds

  friend bool operator==(const hdp_micro_batch&, const hdp_micro_batch&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The per-step HDP plan: equal on every rank that computes it.
struct hdp_plan {
  hdp_sharding sharding;                               ///< the items of the step
  std::vector<hdp_placement> placement;                ///< per item
  std::vector<std::vector<hdp_micro_batch>> per_rank;  ///< per pool rank, in execution order

  /// Divide each rank's summed token loss by this (then SUM-reduce gradients over the pool).
  [[nodiscard]] std::int64_t global_tokens() const noexcept { return sharding.global_tokens; }
  /// The ordered pool ranks of a micro-batch's ring; ring(mb)[mb.ring_position] is its own rank.
  [[nodiscard]] HETMESH_COMPILED const std::vector<int>& ring(const hdp_micro_batch& mb) const;
  /// Ring neighbours of a micro-batch (send KV to next, receive from prev), as pool ranks.
  [[nodiscard]] HETMESH_COMPILED int next_rank(const hdp_micro_batch& mb) const;
  /// The pool rank this micro-batch receives KV from (its ring predecessor).
  [[nodiscard]] HETMESH_COMPILED int prev_rank(const hdp_micro_batch& mb) const;
  friend bool operator==(const hdp_plan&, const hdp_plan&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::hdp_placement_kind> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::seq::hdp_placement_kind k, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}",
                              k == hetmesh::seq::hdp_placement_kind::waves ? "waves" : "least_loaded");
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_policy& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(
        ctx.out(), "hdp_policy{{C={}, {}, {}, placement={}}}", p.capacity, p.offload, p.model,
        p.placement == hetmesh::seq::hdp_placement_kind::waves ? "waves" : "least_loaded");
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_item> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_item& it, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "item{}{{{} D={} r={:.2f} tokens={} seqs={}}}", it.index,
                              it.packed ? "pack" : "ring", it.degree, it.offload.ratio(), it.tokens,
                              it.seqs.size());
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_sharding> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_sharding& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "hdp_sharding{{pool={}, items={}, global_tokens={}}}", s.pool,
                              s.items.size(), s.global_tokens);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_placement> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_placement& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "at{{order={}, ring={}}}", p.order, p.ring);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_micro_batch> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_micro_batch& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "mb{{item={}, order={}, pos={}/{}, r={:.2f}, {}}}", m.item, m.order,
                              m.ring_position, m.degree, m.offload_ratio, m.segments);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::hdp_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    std::size_t mbs = 0, most = 0;
    for (const auto& r : p.per_rank) {
      mbs += r.size();
      most = std::max(most, r.size());
    }
    return hetmesh::format_to(ctx.out(), "hdp_plan{{{}, micro_batches={}, max_per_rank={}}}", p.sharding, mbs,
                              most);
  }
};

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED void hdp_policy::hash_append(hasher& h) const {
  append_all(h, capacity, offload, model, placement);
}

HETMESH_COMPILED void hdp_item::hash_append(hasher& h) const {
  append_all(h, index, packed, degree, offload, seqs, tokens);
}

HETMESH_COMPILED void hdp_sharding::hash_append(hasher& h) const {
  append_all(h, policy, pool, items, global_tokens);
}

HETMESH_COMPILED std::vector<token_range> hdp_ranges(std::int64_t s, int degree, int position) {
  if (degree == 1) return {{0, s}};
  return {hdp_chunk(s, degree, position), hdp_chunk(s, degree, 2 * degree - 1 - position)};
}

HETMESH_COMPILED void hdp_placement::hash_append(hasher& h) const { append_all(h, ring, order); }

HETMESH_COMPILED void hdp_micro_batch::hash_append(hasher& h) const {
  append_all(h, item, order, degree, ring_position, segments, offload_ratio, tokens);
}

HETMESH_COMPILED const std::vector<int>& hdp_plan::ring(const hdp_micro_batch& mb) const {
  return placement[static_cast<std::size_t>(mb.item)].ring;
}

HETMESH_COMPILED int hdp_plan::next_rank(const hdp_micro_batch& mb) const {
  const auto& r = ring(mb);
  return r[static_cast<std::size_t>((mb.ring_position + 1) % mb.degree)];
}

HETMESH_COMPILED int hdp_plan::prev_rank(const hdp_micro_batch& mb) const {
  const auto& r = ring(mb);
  return r[static_cast<std::size_t>((mb.ring_position + mb.degree - 1) % mb.degree)];
}

HETMESH_COMPILED void hdp_plan::hash_append(hasher& h) const { append_all(h, sharding, placement, per_rank); }

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
