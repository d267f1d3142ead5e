// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: ring attention schedules over any ordered list of ranks (a CP group, or an HDP ring
// on the parent communicator). Each ring position holds query chunks and the key/value chunks of the
// same tokens. Forward, step t = 0..D-1: position p computes its queries against the KV that came
// from position (p - t) mod D, then (for t < D-1) sends that KV to p+1 and receives from p-1.
// Backward: the same steps; the KV travels with a dK/dV accumulator, and after step D-1 one last
// hop sends each accumulator to p+1, its owner. Which (q chunk, kv chunk) pairs compute, and under
// which mask, follows from chunk positions: full when every key precedes every query of the same
// document, causal (element mask) when they overlap, none otherwise. That one rule covers zigzag,
// THD and HDP layouts.
#pragma once

#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "cp.hpp"
#include "hdp.hpp"

namespace hetmesh::seq {

/// How much of a (query chunk, KV chunk) block causal attention computes: none, all of it (full), or
/// its lower triangle (causal).
enum class block_mask { none, full, causal };

/// One block product of a step: query chunk and KV chunk (indices into the owners' chunk lists),
/// the mask, and the (query, key) pairs it computes.
struct ring_pair {
  int q_chunk = 0;                     ///< query chunk
  int kv_chunk = 0;                    ///< KV chunk
  block_mask mask = block_mask::none;  ///< which part of the block is computed
  std::int64_t work = 0;               ///< work units of the pair

  friend constexpr bool operator==(const ring_pair&, const ring_pair&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// One step at one ring position. Positions are indices into ring_schedule::ring.
struct ring_step {
  int kv_source = 0;             ///< position whose KV (and, backward, dKV accumulator) is used this step
  int send_to = -1;              ///< position receiving this KV after the step; -1 on the last step
  int recv_from = -1;            ///< position this step's successor KV comes from; -1 on the last step
  std::vector<ring_pair> pairs;  ///< only pairs with mask != none
  std::int64_t work = 0;         ///< work units of the step

  friend bool operator==(const ring_step&, const ring_step&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The schedule of a whole ring.
struct ring_schedule {
  std::vector<int> ring;                      ///< ordered ranks (any ranks of the parent communicator)
  std::vector<std::vector<cp_chunk>> chunks;  ///< per position: chunks in local buffer order
  std::vector<std::vector<ring_step>> steps;  ///< per position: D steps
  std::vector<std::int64_t> work;             ///< per position: total causal pairs computed

  /// Ranks in the ring.
  [[nodiscard]] int size() const noexcept { return static_cast<int>(ring.size()); }
  /// The position after p, which p sends its KV to (ring[next(p)] is that rank).
  [[nodiscard]] int next(int p) const noexcept { return (p + 1) % size(); }
  /// The position before p, which p receives KV from.
  [[nodiscard]] int prev(int p) const noexcept { return (p + size() - 1) % size(); }
  friend bool operator==(const ring_schedule&, const ring_schedule&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Pairs (i, j), i in q, j in k, with j <= i: the area of a causal block. O(1).
[[nodiscard]] constexpr std::int64_t causal_pairs(token_range q, token_range k) noexcept {
  std::int64_t total = 0;
  // Rows with k.begin <= i < k.end see i - k.begin + 1 keys: an arithmetic series.
  const std::int64_t a = q.begin > k.begin ? q.begin : k.begin;
  const std::int64_t b = q.end < k.end ? q.end : k.end;
  if (b > a) total += (b - a) * (a - k.begin + 1 + b - k.begin) / 2;
  // Rows at or past k.end see the whole KV range.
  const std::int64_t c = q.begin > k.end ? q.begin : k.end;
  if (q.end > c) total += (q.end - c) * k.size();
  return total;
}

/// The mask of a (query chunk, KV chunk) block under a per-document causal mask.
[[nodiscard]] constexpr block_mask classify(const cp_chunk& q, const cp_chunk& kv) noexcept {
  if (q.doc != kv.doc || q.positions.size() == 0 || kv.positions.size() == 0) return block_mask::none;
  if (kv.positions.begin > q.positions.end - 1) return block_mask::none;
  if (kv.positions.end - 1 <= q.positions.begin) return block_mask::full;
  return block_mask::causal;
}

/// Builds the schedule of a ring. Preconditions: ring non-empty with distinct ranks; chunks has one
/// list per position. Postconditions: over its D steps, every position meets every KV chunk of the
/// ring exactly once, and the union of its pairs covers exactly the causal pairs of its queries.
/// Pure; O(D^2 * chunks^2) (chunks are few per position: 2 per document).
[[nodiscard]] HETMESH_COMPILED ring_schedule make_ring_schedule(std::vector<int> ring,
                                                                std::vector<std::vector<cp_chunk>> chunks)
#if HETMESH_BODIES
{
  if (ring.empty()) throw_error<invalid_argument>("make_ring_schedule: empty ring; expected >= 1 rank");
  if (chunks.size() != ring.size())
    throw_error<invalid_argument>(
        "make_ring_schedule: {} chunk lists for a ring of {}; expected one per position", chunks.size(),
        ring.size());
  {
    auto sorted = ring;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 1; i < sorted.size(); ++i)
      if (sorted[i] == sorted[i - 1])
        throw_error<invalid_argument>(
            "make_ring_schedule: rank {} appears twice in ring {}; expected distinct ranks", sorted[i], ring);
  }
  ring_schedule s;
  const int d = static_cast<int>(ring.size());
  s.ring = std::move(ring);
  s.chunks = std::move(chunks);
  s.steps.resize(static_cast<std::size_t>(d));
  s.work.assign(static_cast<std::size_t>(d), 0);
  for (int p = 0; p < d; ++p) {
    for (int t = 0; t < d; ++t) {
      ring_step st;
      st.kv_source = ((p - t) % d + d) % d;
      if (t < d - 1) {
        st.send_to = (p + 1) % d;
        st.recv_from = (p + d - 1) % d;
      }
      const auto& qs = s.chunks[static_cast<std::size_t>(p)];
      const auto& ks = s.chunks[static_cast<std::size_t>(st.kv_source)];
      for (std::size_t qi = 0; qi < qs.size(); ++qi)
        for (std::size_t ki = 0; ki < ks.size(); ++ki) {
          const auto m = classify(qs[qi], ks[ki]);
          if (m == block_mask::none) continue;
          const std::int64_t w = m == block_mask::full ? qs[qi].positions.size() * ks[ki].positions.size()
                                                       : causal_pairs(qs[qi].positions, ks[ki].positions);
          st.pairs.push_back({static_cast<int>(qi), static_cast<int>(ki), m, w});
          st.work += w;
        }
      s.work[static_cast<std::size_t>(p)] += st.work;
      s.steps[static_cast<std::size_t>(p)].push_back(std::move(st));
    }
  }
  return s;
}
#else
    ;
#endif

/// The ring of a CP partition over `ranks` (position r = partition rank r). Pure.
[[nodiscard]] HETMESH_COMPILED ring_schedule ring_for(const cp_partition& part, std::vector<int> ranks)
#if HETMESH_BODIES
{
  if (ranks.size() != part.ranks.size())
    throw_error<invalid_argument>("ring_for: {} ranks for a partition of cp = {}; expected one per CP rank",
                                  ranks.size(), part.ranks.size());
  std::vector<std::vector<cp_chunk>> chunks;
  for (const auto& sh : part.ranks) chunks.push_back(sh.chunks);
  return make_ring_schedule(std::move(ranks), std::move(chunks));
}
#else
    ;
#endif

/// The ring of one HDP item (its placement's ranks; chunk doc = the sequence id; chunk ordinal =
/// zigzag index). For a pack (D = 1) the single position holds every member whole. Pure.
[[nodiscard]] HETMESH_COMPILED ring_schedule ring_for(const hdp_plan& plan, std::int64_t item)
#if HETMESH_BODIES
{
  const auto& it = plan.sharding.items.at(static_cast<std::size_t>(item));
  const auto& ring = plan.placement.at(static_cast<std::size_t>(item)).ring;
  std::vector<std::vector<cp_chunk>> chunks(ring.size());
  for (std::size_t p = 0; p < ring.size(); ++p) {
    std::int64_t off = 0;
    if (it.packed) {
      for (const auto& s : it.seqs) {
        chunks[p].push_back({s.id, 0, {0, s.length}, off});
        off += s.length;
      }
    } else {
      const auto& s = it.seqs.front();
      const int pos = static_cast<int>(p);
      const int ks[2] = {pos, 2 * it.degree - 1 - pos};
      for (int k : ks) {
        const auto rg = hdp_chunk(s.length, it.degree, k);
        chunks[p].push_back({s.id, k, rg, off});
        off += rg.size();
      }
    }
  }
  return make_ring_schedule(ring, std::move(chunks));
}
#else
    ;
#endif

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::block_mask> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::seq::block_mask m, FormatContext& ctx) const -> decltype(ctx.out()) {
    using hetmesh::seq::block_mask;
    return hetmesh::format_to(ctx.out(), "{}",
                              m == block_mask::none   ? "none"
                              : m == block_mask::full ? "full"
                                                      : "causal");
  }
};
template <>
struct fmt::formatter<hetmesh::seq::ring_pair> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::ring_pair& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "q{}xkv{}:{}", p.q_chunk, p.kv_chunk, p.mask);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::ring_step> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::ring_step& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "step{{kv from {}, send {}, recv {}, {}}}", s.kv_source, s.send_to,
                              s.recv_from, s.pairs);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::ring_schedule> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::ring_schedule& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "ring_schedule{{ring={}, work={}}}", s.ring, s.work);
  }
};

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED void ring_pair::hash_append(hasher& h) const {
  append_all(h, q_chunk, kv_chunk, mask, work);
}

HETMESH_COMPILED void ring_step::hash_append(hasher& h) const {
  append_all(h, kv_source, send_to, recv_from, pairs, work);
}

HETMESH_COMPILED void ring_schedule::hash_append(hasher& h) const {
  append_all(h, ring, chunks, steps, work);
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
