// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: the dispatch plan of a mixture-of-experts layer under expert parallelism. Every token of a
// rank is routed (by the user's router) to k experts with k gate weights; experts are laid out over the ep
// group as Megatron-LM lays them out (ep rank r holds experts [r E/ep, (r+1) E/ep)). The plan says which
// (token, choice) pairs go to which rank, in which order they sit in the send buffer (grouped by
// destination rank, then by its local expert, then by token), and which choices a capacity policy drops.
// Capacity is per expert over the whole ep group, so the planner takes every rank's per-expert counts (the
// runtime all-gathers them, run/moe.hpp): every rank computes the same kept counts and so the same drops,
// and knows what it will receive without a second exchange. Pure: no communication.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/checked.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"

namespace hetmesh::seq {

/// Which routed choices an expert over capacity drops first (Megatron-LM's `moe_token_drop_policy`).
enum class moe_drop : std::uint8_t {
  position,  ///< later tokens first: the ep group's tokens in rank order, then token order ("position")
  probs,     ///< lowest gate weight first, within each rank's share of the capacity ("probs")
};

/// The capacity policy of an MoE layer, a value. Without a factor the layer is dropless: every choice is
/// dispatched. With one, every expert takes at most capacity(N) choices of the ep group, N the group's
/// routed choices (tokens x k), as Megatron-LM's get_capacity: ceil(N / experts x factor), at least
/// min_capacity.
struct moe_capacity {
  std::optional<double> factor;        ///< capacity factor (> 0); none: dropless
  moe_drop drop = moe_drop::position;  ///< what an expert over capacity drops first
  std::int64_t min_capacity = 0;       ///< lower bound of the capacity (>= 0)

  /// Whether no choice is ever dropped. O(1).
  [[nodiscard]] bool dropless() const noexcept { return !factor.has_value(); }
  /// Throws invalid_argument unless the factor (when given) is finite and > 0 and min_capacity >= 0.
  HETMESH_COMPILED void validate() const;
  /// The capacity of every expert for `choices` routed choices over `experts` experts; -1 when dropless.
  /// Pre: choices >= 0, experts >= 1. Deterministic (the same double arithmetic on every rank). O(1).
  [[nodiscard]] HETMESH_COMPILED std::int64_t capacity(std::int64_t choices, std::int64_t experts) const;

  friend bool operator==(const moe_capacity&, const moe_capacity&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Experts over the ep group: `experts` experts, `ep` ranks each holding experts/ep consecutive ones
/// (Megatron-LM's layout), every token routed to `top_k` of them.
struct moe_layout {
  std::int64_t experts = 1;  ///< experts of the layer (a multiple of ep)
  int ep = 1;                ///< ranks of the expert-parallel group
  int top_k = 1;             ///< experts per token (1 <= top_k <= experts)

  /// Throws invalid_argument (naming the values) unless ep >= 1, ep divides experts, 1 <= top_k <= experts.
  HETMESH_COMPILED void validate() const;
  /// Experts each ep rank holds. O(1).
  [[nodiscard]] std::int64_t local_experts() const noexcept { return experts / ep; }
  /// The ep rank holding expert e. O(1).
  [[nodiscard]] int owner(std::int64_t e) const noexcept { return static_cast<int>(e / local_experts()); }
  /// The first expert ep rank r holds. O(1).
  [[nodiscard]] std::int64_t first_expert(int r) const noexcept { return r * local_experts(); }

  friend constexpr bool operator==(const moe_layout&, const moe_layout&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The dispatch of one ep rank (make_moe_dispatch_plan). A *choice* is token t's j-th routed expert, id
/// c = t k + j. The send buffer holds one row per kept choice, grouped by destination rank, then local
/// expert, then choice id; the expert buffer after dispatch holds one row per choice this rank's experts
/// receive, grouped by local expert, then source rank, then the source's choice order.
struct moe_dispatch_plan {
  moe_layout layout{};                      ///< the experts over the ep group
  moe_capacity policy{};                    ///< the capacity policy the plan applied
  int rank = 0;                             ///< the caller's ep rank
  std::int64_t tokens = 0;                  ///< the caller's tokens
  std::int64_t capacity = -1;               ///< choices per expert over the group (-1: dropless)
  std::vector<std::int64_t> kept;           ///< [ep][experts]: choices rank r keeps for expert e (all ranks)
  std::vector<std::int64_t> send_order;     ///< choice ids in send-buffer order
  std::vector<std::int64_t> row_of_choice;  ///< [tokens k]: the choice's send-buffer row; -1: dropped
  std::vector<std::int64_t> send_counts;    ///< [ep]: rows sent to each rank
  std::vector<std::int64_t> recv_counts;    ///< [ep]: rows received from each rank
  std::vector<std::int64_t> expert_counts;  ///< [local experts]: rows of each local expert after dispatch

  /// Rows of the send buffer (kept choices of the caller). O(1).
  [[nodiscard]] std::int64_t send_rows() const noexcept {
    return static_cast<std::int64_t>(send_order.size());
  }
  /// Rows of the expert buffer (choices the caller's experts receive). O(ep).
  [[nodiscard]] std::int64_t expert_rows() const noexcept {
    std::int64_t n = 0;
    for (auto v : recv_counts) n += v;
    return n;
  }
  /// Choices rank r keeps for expert e. O(1).
  [[nodiscard]] HETMESH_COMPILED std::int64_t kept_of(int r, std::int64_t e) const;
  /// The caller's dropped choice ids, ascending. O(tokens k).
  [[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> dropped() const;

  friend bool operator==(const moe_dispatch_plan&, const moe_dispatch_plan&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Routed choices per expert of one rank: result[e] = the number of entries of `experts` (token-major,
/// k per token) equal to e. Errors: an id outside [0, layout.experts), or a size not a multiple of top_k
/// (invalid_argument naming the choice). Pure; O(tokens k + experts).
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> moe_expert_counts(
    const moe_layout& layout, std::span<const std::int64_t> experts)
#if HETMESH_BODIES
{
  layout.validate();
  if (experts.size() % static_cast<std::size_t>(layout.top_k) != 0)
    throw_error<invalid_argument>(
        "seq::moe_expert_counts: {} routed choices; expected a multiple of top_k {}", experts.size(),
        layout.top_k);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(layout.experts), 0);
  for (std::size_t c = 0; c < experts.size(); ++c) {
    if (experts[c] < 0 || experts[c] >= layout.experts)
      throw_error<invalid_argument>(
          "seq::moe_expert_counts: choice {} (token {}, choice {}) names expert {}; expected 0 <= expert < "
          "{}",
          c, c / static_cast<std::size_t>(layout.top_k), c % static_cast<std::size_t>(layout.top_k),
          experts[c], layout.experts);
    ++counts[static_cast<std::size_t>(experts[c])];
  }
  return counts;
}
#else
    ;
#endif

/// The capacity and the kept counts of every rank: from `counts` [ep][experts] (every rank's
/// moe_expert_counts, in rank order), kept[r][e] <= counts[r][e] with sum over r of kept[r][e] =
/// min(counts over r, capacity). Position: the group's choices of e in rank order, the first `capacity`
/// kept (Megatron's "position" policy over the concatenated batch). Probs: each rank's share proportional
/// to its count (largest remainder, ties to the lower rank), its lowest gates dropped within it
/// (make_moe_dispatch_plan). Dropless: kept = counts. Returns {capacity (-1 dropless), kept}. Errors:
/// counts of the wrong size or negative (invalid_argument). Pure, equal on every rank; O(ep experts log ep).
[[nodiscard]] HETMESH_COMPILED std::pair<std::int64_t, std::vector<std::int64_t>> moe_kept_counts(
    const moe_layout& layout, const moe_capacity& policy, std::span<const std::int64_t> counts)
#if HETMESH_BODIES
{
  layout.validate();
  const auto ep = static_cast<std::size_t>(layout.ep);
  const auto ne = static_cast<std::size_t>(layout.experts);
  if (counts.size() != ep * ne)
    throw_error<invalid_argument>("seq::moe_kept_counts: {} counts; expected ep x experts = {} x {}",
                                  counts.size(), ep, ne);
  for (std::size_t i = 0; i < counts.size(); ++i)
    if (counts[i] < 0)
      throw_error<invalid_argument>(
          "seq::moe_kept_counts: rank {} routes {} choices to expert {}; expected >= 0", i / ne, counts[i],
          i % ne);
  const std::int64_t total = checked_sum(counts, "seq::moe_kept_counts: the group's routed choices");
  const std::int64_t cap = policy.capacity(total, layout.experts);
  std::vector<std::int64_t> kept(counts.begin(), counts.end());
  if (cap < 0) return {cap, kept};
  for (std::size_t e = 0; e < ne; ++e) {
    std::int64_t sum = 0;
    for (std::size_t r = 0; r < ep; ++r) sum += counts[r * ne + e];
    if (sum <= cap) continue;
    if (policy.drop == moe_drop::position) {
      std::int64_t left = cap;
      for (std::size_t r = 0; r < ep; ++r) {
        kept[r * ne + e] = std::min(left, counts[r * ne + e]);
        left -= kept[r * ne + e];
      }
      continue;
    }
    // Largest remainder: floor(cap c_r / sum) each, one more to the largest remainders (lower rank first).
    std::vector<std::pair<std::int64_t, std::size_t>> rest;
    std::int64_t given = 0;
    for (std::size_t r = 0; r < ep; ++r) {
      const auto num = checked_mul(cap, counts[r * ne + e], "seq::moe_kept_counts: capacity x count");
      kept[r * ne + e] = num / sum;
      given += kept[r * ne + e];
      rest.emplace_back(-(num % sum), r);
    }
    std::sort(rest.begin(), rest.end());
    for (std::size_t i = 0; given < cap; ++i, ++given) ++kept[rest[i].second * ne + e];
  }
  return {cap, kept};
}
#else
    ;
#endif

/// The dispatch plan of ep rank `rank` (see moe_dispatch_plan): `experts` its routing, k expert ids per token
/// (token-major); `gates` its k gate weights per token (read only by moe_drop::probs under a capacity; may
/// be empty otherwise); `counts` every rank's moe_expert_counts [ep][experts] in rank order (all-gathered).
/// Post: every choice is in send_order exactly once or dropped; per expert, the group keeps at most the
/// capacity; kept, capacity, and what rank r sends to rank d (= what d receives from r) agree on every
/// rank; dropless plans drop nothing and do not depend on the other ranks' routing. Probs drops a rank's
/// lowest gates first (ties: the later choice). Errors (invalid_argument naming the value): a bad layout or
/// policy, rank outside [0, ep), an expert id out of range, counts whose row `rank` is not this routing's,
/// gates of the wrong size or not finite when read. Pure; O(tokens k log(tokens k) + ep experts).
[[nodiscard]] HETMESH_COMPILED moe_dispatch_plan make_moe_dispatch_plan(const moe_layout& layout,
                                                                        const moe_capacity& policy, int rank,
                                                                        std::span<const std::int64_t> experts,
                                                                        std::span<const double> gates,
                                                                        std::span<const std::int64_t> counts)
#if HETMESH_BODIES
{
  const auto mine = moe_expert_counts(layout, experts);
  if (rank < 0 || rank >= layout.ep)
    throw_error<invalid_argument>(
        "seq::make_moe_dispatch_plan: rank {} of an ep group of {}; expected 0 <= rank < {}", rank, layout.ep,
        layout.ep);
  const auto ne = static_cast<std::size_t>(layout.experts);
  const auto k = static_cast<std::size_t>(layout.top_k);
  auto [cap, kept] = moe_kept_counts(layout, policy, counts);
  for (std::size_t e = 0; e < ne; ++e)
    if (counts[static_cast<std::size_t>(rank) * ne + e] != mine[e])
      throw_error<invalid_argument>(
          "seq::make_moe_dispatch_plan: counts say rank {} routes {} choices to expert {}, its routing {}; "
          "expected the all-gathered moe_expert_counts of every rank",
          rank, counts[static_cast<std::size_t>(rank) * ne + e], e, mine[e]);
  const bool by_probs = cap >= 0 && policy.drop == moe_drop::probs;
  if (by_probs) {
    if (gates.size() != experts.size())
      throw_error<invalid_argument>(
          "seq::make_moe_dispatch_plan: {} gates for {} routed choices; expected one per choice (drop policy "
          "probs)",
          gates.size(), experts.size());
    for (std::size_t c = 0; c < gates.size(); ++c)
      if (!std::isfinite(gates[c]))
        throw_error<invalid_argument>("seq::make_moe_dispatch_plan: gate {} of choice {} is not finite",
                                      gates[c], c);
  }
  moe_dispatch_plan p;
  p.layout = layout;
  p.policy = policy;
  p.rank = rank;
  p.tokens = static_cast<std::int64_t>(experts.size() / k);
  p.capacity = cap;
  // The caller's choices bucketed by expert, in choice order (a counting sort).
  std::vector<std::size_t> start(ne + 1, 0);
  for (std::size_t e = 0; e < ne; ++e) start[e + 1] = start[e] + static_cast<std::size_t>(mine[e]);
  std::vector<std::int64_t> by_expert(experts.size());
  {
    auto fill = start;
    for (std::size_t c = 0; c < experts.size(); ++c)
      by_expert[fill[static_cast<std::size_t>(experts[c])]++] = static_cast<std::int64_t>(c);
  }
  p.row_of_choice.assign(experts.size(), -1);
  for (std::size_t e = 0; e < ne; ++e) {
    const auto first = by_expert.begin() + static_cast<std::ptrdiff_t>(start[e]);
    const auto last = by_expert.begin() + static_cast<std::ptrdiff_t>(start[e + 1]);
    const auto keep = kept[static_cast<std::size_t>(rank) * ne + e];
    if (by_probs && keep < last - first) {  // the `keep` highest gates, ties to the earlier choice
      std::stable_sort(first, last, [&](std::int64_t a, std::int64_t b) {
        return gates[static_cast<std::size_t>(a)] > gates[static_cast<std::size_t>(b)];
      });
      std::sort(first, first + keep);
    }
    for (auto it = first; it != first + keep; ++it) {
      p.row_of_choice[static_cast<std::size_t>(*it)] = p.send_rows();
      p.send_order.push_back(*it);
    }
  }
  const auto le = static_cast<std::size_t>(layout.local_experts());
  p.send_counts.assign(static_cast<std::size_t>(layout.ep), 0);
  p.recv_counts.assign(static_cast<std::size_t>(layout.ep), 0);
  p.expert_counts.assign(le, 0);
  for (std::size_t r = 0; r < static_cast<std::size_t>(layout.ep); ++r)
    for (std::size_t j = 0; j < le; ++j) {
      p.send_counts[r] += kept[static_cast<std::size_t>(rank) * ne + r * le + j];
      const auto in = kept[r * ne + static_cast<std::size_t>(rank) * le + j];
      p.recv_counts[r] += in;
      p.expert_counts[j] += in;
    }
  p.kept = std::move(kept);
  return p;
}
#else
    ;
#endif

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::moe_dispatch_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::moe_dispatch_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(
        ctx.out(),
        "moe_dispatch_plan(rank {} of ep {}, {} experts, top {}, {} tokens, capacity {}, "
        "send {}, recv {}, dropped {})",
        p.rank, p.layout.ep, p.layout.experts, p.layout.top_k, p.tokens, p.capacity, p.send_counts,
        p.recv_counts, p.dropped().size());
  }
};

#if HETMESH_BODIES

namespace hetmesh::seq {

HETMESH_COMPILED void moe_capacity::validate() const {
  if ((factor && !(std::isfinite(*factor) && *factor > 0.0)) || min_capacity < 0)
    throw_error<invalid_argument>(
        "seq::moe_capacity: factor {}, min_capacity {}; expected a finite factor > 0 (or none: dropless) "
        "and min_capacity >= 0",
        factor ? *factor : 0.0, min_capacity);
}

HETMESH_COMPILED std::int64_t moe_capacity::capacity(std::int64_t choices, std::int64_t experts) const {
  validate();
  if (!factor) return -1;
  const double c = std::ceil(static_cast<double>(choices) / static_cast<double>(experts) * *factor);
  if (!(c < 9.0e18))
    throw_error<invalid_argument>("seq::moe_capacity: a capacity of {} choices; expected one within int64",
                                  c);
  return std::max(static_cast<std::int64_t>(c), min_capacity);
}

HETMESH_COMPILED void moe_capacity::hash_append(hasher& h) const {
  append_all(h, factor, drop, min_capacity);
}

HETMESH_COMPILED void moe_layout::validate() const {
  if (ep < 1 || experts < 1 || experts % ep != 0 || top_k < 1 || top_k > experts)
    throw_error<invalid_argument>(
        "seq::moe_layout: {} experts, ep {}, top_k {}; expected ep >= 1 dividing the experts and 1 <= "
        "top_k "
        "<= experts",
        experts, ep, top_k);
}

HETMESH_COMPILED void moe_layout::hash_append(hasher& h) const { append_all(h, experts, ep, top_k); }

HETMESH_COMPILED std::int64_t moe_dispatch_plan::kept_of(int r, std::int64_t e) const {
  return kept[static_cast<std::size_t>(r * layout.experts + e)];
}

HETMESH_COMPILED std::vector<std::int64_t> moe_dispatch_plan::dropped() const {
  std::vector<std::int64_t> out;
  for (std::size_t c = 0; c < row_of_choice.size(); ++c)
    if (row_of_choice[c] < 0) out.push_back(static_cast<std::int64_t>(c));
  return out;
}

HETMESH_COMPILED void moe_dispatch_plan::hash_append(hasher& h) const {
  append_all(h, layout, policy, rank, tokens, capacity, kept, send_order, row_of_choice, send_counts,
             recv_counts, expert_counts);
}

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
