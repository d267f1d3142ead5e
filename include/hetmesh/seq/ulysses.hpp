// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: Ulysses sequence parallelism (DeepSpeed-Ulysses). Around attention, an all-to-all
// swaps sequence sharding (each of d ranks holds its own tokens, all heads) for head sharding (each
// rank holds every token of the group, H/d query heads). With GQA (Hkv < H key/value heads), KV
// heads are split when d divides Hkv, or each replicated to d/Hkv ranks when Hkv divides d, so that
// every rank holds exactly the KV heads its query heads read.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"

namespace hetmesh::seq {

/// Policy value of Ulysses: group size and the model's head counts.
struct ulysses_policy {
  int degree = 1;    ///< Ulysses ranks (heads are split over them)
  int heads = 1;     ///< query heads H
  int kv_heads = 1;  ///< key/value heads Hkv (== H without GQA)
  int head_dim = 1;  ///< dimension of one head

  friend constexpr bool operator==(const ulysses_policy&, const ulysses_policy&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The all-to-all plan. Element counts are per tensor (q; k and v each have the kv counts).
/// Send layout on rank r: for each peer p in order, its local tokens x (heads of p) x head_dim,
/// token-major within a peer block. Receive layout: for each source p, p's tokens x (my heads).
struct ulysses_plan {
  ulysses_policy policy{};           ///< the policy it was made with
  std::vector<std::int64_t> tokens;  ///< per rank: tokens it holds before the all-to-all
  std::int64_t total_tokens = 0;     ///< tokens of the batch
  int heads_per_rank = 1;            ///< H / d
  int kv_heads_per_rank = 1;         ///< Hkv / d, or 1 when KV heads are replicated
  int kv_replication = 1;            ///< ranks sharing one KV head (d / Hkv when Hkv < d)
  std::vector<int> q_head_begin;     ///< per rank: first query head it owns after the swap
  std::vector<int> kv_head_begin;    ///< per rank: first KV head it owns after the swap
  ///@{
  /// counts[r][p]: elements rank r sends to p for q (resp. kv); recv counts are the transpose.
  std::vector<std::vector<std::int64_t>> q_send_counts, kv_send_counts;
  ///@}

  friend bool operator==(const ulysses_plan&, const ulysses_plan&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Checks the head counts against the degree; throws invalid_argument naming the mismatch.
HETMESH_COMPILED void check_ulysses_heads(const ulysses_policy& p);

/// Plans the all-to-all for ranks holding `tokens[r]` tokens each (uneven counts allowed; use
/// all_to_all_v). Preconditions: tokens.size() == degree, counts >= 0; heads as in
/// check_ulysses_heads. Pure; O(d^2).
[[nodiscard]] HETMESH_COMPILED ulysses_plan plan_ulysses(std::span<const std::int64_t> tokens,
                                                         const ulysses_policy& p);

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::ulysses_policy> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::ulysses_policy& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "ulysses_policy{{d={}, heads={}, kv_heads={}, head_dim={}}}",
                              p.degree, p.heads, p.kv_heads, p.head_dim);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::ulysses_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::ulysses_plan& u, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(),
                              "ulysses_plan{{{}, tokens={}, heads/rank={}, kv/rank={}, kv_repl={}}}",
                              u.policy, u.tokens, u.heads_per_rank, u.kv_heads_per_rank, u.kv_replication);
  }
};

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED void ulysses_policy::hash_append(hasher& h) const {
  append_all(h, degree, heads, kv_heads, head_dim);
}

HETMESH_COMPILED void ulysses_plan::hash_append(hasher& h) const {
  append_all(h, policy, tokens, total_tokens, heads_per_rank, kv_heads_per_rank, kv_replication, q_head_begin,
             kv_head_begin, q_send_counts, kv_send_counts);
}

HETMESH_COMPILED void check_ulysses_heads(const ulysses_policy& p) {
  if (p.degree < 1 || p.heads < 1 || p.kv_heads < 1 || p.head_dim < 1)
    throw_error<invalid_argument>("ulysses: degree {}, heads {}, kv_heads {}, head_dim {}; expected all >= 1",
                                  p.degree, p.heads, p.kv_heads, p.head_dim);
  if (p.heads % p.degree != 0)
    throw_error<invalid_argument>(
        "ulysses: {} query heads do not divide over degree {}; expected degree | heads", p.heads, p.degree);
  if (p.heads % p.kv_heads != 0)
    throw_error<invalid_argument>(
        "ulysses: {} query heads are not a multiple of {} kv heads (GQA groups must be equal)", p.heads,
        p.kv_heads);
  if (p.kv_heads % p.degree != 0 && p.degree % p.kv_heads != 0)
    throw_error<invalid_argument>(
        "ulysses: {} kv heads can neither be split over degree {} nor replicated to it; expected degree | "
        "kv_heads "
        "or kv_heads | degree",
        p.kv_heads, p.degree);
}

HETMESH_COMPILED ulysses_plan plan_ulysses(std::span<const std::int64_t> tokens, const ulysses_policy& p) {
  check_ulysses_heads(p);
  if (static_cast<int>(tokens.size()) != p.degree)
    throw_error<invalid_argument>("plan_ulysses: {} token counts for degree {}; expected one per rank",
                                  tokens.size(), p.degree);
  ulysses_plan u;
  u.policy = p;
  u.tokens.assign(tokens.begin(), tokens.end());
  for (auto t : tokens) {
    if (t < 0) throw_error<invalid_argument>("plan_ulysses: negative token count {}", t);
    u.total_tokens += t;
  }
  const int d = p.degree;
  u.heads_per_rank = p.heads / d;
  if (p.kv_heads % d == 0) {
    u.kv_heads_per_rank = p.kv_heads / d;
    u.kv_replication = 1;
  } else {
    u.kv_heads_per_rank = 1;
    u.kv_replication = d / p.kv_heads;
  }
  const int group = p.heads / p.kv_heads;  // query heads per KV head
  for (int r = 0; r < d; ++r) {
    u.q_head_begin.push_back(r * u.heads_per_rank);
    u.kv_head_begin.push_back(u.kv_replication == 1 ? r * u.kv_heads_per_rank
                                                    : (r * u.heads_per_rank) / group);
  }
  u.q_send_counts.assign(static_cast<std::size_t>(d), std::vector<std::int64_t>(static_cast<std::size_t>(d)));
  u.kv_send_counts = u.q_send_counts;
  for (int r = 0; r < d; ++r)
    for (int q = 0; q < d; ++q) {
      const auto t = u.tokens[static_cast<std::size_t>(r)];
      u.q_send_counts[static_cast<std::size_t>(r)][static_cast<std::size_t>(q)] =
          t * u.heads_per_rank * p.head_dim;
      u.kv_send_counts[static_cast<std::size_t>(r)][static_cast<std::size_t>(q)] =
          t * u.kv_heads_per_rank * p.head_dim;
    }
  return u;
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
