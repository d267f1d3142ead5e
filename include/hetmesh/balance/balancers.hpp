// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: the balancer families as policy types (the type is the choice, its members the
// parameters) and the `balancer` concept they model. Each spreads one global batch over the HDP pool
// and returns the per-rank plan (strategy_plan.hpp):
//   bytescale          ByteScale: data-aware sharding + Alg. 2 balance scheduler (bytescale.hpp)
//   gap_filling_hdp    this project's planner: rings first, then short sequences fill the gaps the rings
//                      leave, LPT on modelled time, locality groups when group_size is set (planner.hpp)
//   token_count        HDP work items balanced by token count (LPT on tokens)
//   random_placement   baseline: HDP work items on random ranks
//   static_dp_cp       baseline: a fixed dp x cp mesh, Megatron-style packing (strategies.hpp explains)
// Grouped reordering (MegaScale-Omni) balances loaders on the data side (reorder.hpp), not here.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../seq/types.hpp"
#include "bytescale.hpp"
#include "planner.hpp"
#include "strategy_plan.hpp"

namespace hetmesh::balance {

/// A balancer family: a policy type that turns one global batch into a per-rank plan. Requirements on
/// `B` (a value `b`, sequences `seqs`, a `strategy_config` `cfg`):
///   1. `B` is a regular aggregate: default-constructible, copyable, `b == b` (`std::regular`);
///   2. `B::name` is a constant convertible to `std::string_view`: the name results and the tools use;
///   3. `b.plan(seqs, cfg)` returns a `strategy_plan` in which every non-empty sequence is in exactly
///      one item; it is pure and deterministic (the same on every rank that computes it);
///   4. `b.hash_append(h)` feeds every parameter to a `hasher`;
///   5. `B` prints through fmt.
template <class B>
concept balancer = std::regular<B> && std::convertible_to<decltype(B::name), std::string_view> &&
    requires(const B& b, std::span<const seq::seq_desc> seqs, const strategy_config& cfg, hasher& h) {
  { b.plan(seqs, cfg) } -> std::same_as<strategy_plan>;
  b.hash_append(h);
} && fmt::is_formattable<B>::value;

/// ByteScale's balance scheduler (Alg. 2) over ByteScale's data-aware sharding. It balances over dp
/// ranks, or over pp stages when cfg.model.pp_stages > 1 (ByteScale's two modes).
struct bytescale {
  /// The name results and the tools use.
  static constexpr std::string_view name = "bytescale_hdp";
  double delta = 0.05;  ///< slack relative to the busiest rank's time
  int buckets = 0;      ///< length buckets; 0: min(16, items)

  /// plan_bytescale on cfg's pool, as work items priced by cfg.model. Pre: cfg.ranks >= 1 (else
  /// invalid_argument); valid sequences. Pure; deterministic. O(n log n). Not collective.
  [[nodiscard]] HETMESH_COMPILED strategy_plan plan(std::span<const seq::seq_desc> seqs,
                                                    const strategy_config& cfg) const;
  /// The scheduler's policy under cost model `m`: these parameters, in pp mode when m.pp_stages > 1.
  [[nodiscard]] HETMESH_COMPILED bytescale_policy policy(const step_model& m) const noexcept;
  /// The HDP plan of `seqs` over `pool` ranks: plan_bytescale(seqs, hdp, pool, m, policy(m)). What
  /// train's HDP family calls to place its items (train/families.hpp). Same contract and errors.
  [[nodiscard]] HETMESH_COMPILED seq::hdp_plan place_hdp(std::span<const seq::seq_desc> seqs,
                                                         const seq::hdp_policy& hdp, int pool,
                                                         const step_model& m) const;
  friend constexpr bool operator==(const bytescale&, const bytescale&) = default;
  /// Hashes the family and its parameters.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// This project's planner (plan_gap_filling_hdp): rings of long sequences first, short sequences packed
/// into the gaps they leave, by modelled time; with `group_size` > 0, sequences stay in their loader's
/// group of ranks (the loader of sample i is rank i % cfg.ranks).
struct gap_filling_hdp {
  /// The name results and the tools use.
  static constexpr std::string_view name = "gap_filling_hdp";
  int group_size = 0;        ///< ranks per locality group; 0: the whole pool
  bool local_search = true;  ///< the improvement pass over ring layouts (gap_filling_policy)

  /// plan_gap_filling_hdp on cfg's pool, as work items priced by cfg.model. Same contract and errors
  /// as plan_gap_filling_hdp (group_size must divide cfg.ranks). Pure; deterministic. Not collective.
  [[nodiscard]] HETMESH_COMPILED strategy_plan plan(std::span<const seq::seq_desc> seqs,
                                                    const strategy_config& cfg) const;
  /// The HDP plan of `seqs` over `pool` ranks: plan_gap_filling_hdp with these parameters, the loader of
  /// sequence i being rank i % pool. What train's HDP family calls to place its items
  /// (train/families.hpp). Same contract and errors as plan_gap_filling_hdp.
  [[nodiscard]] HETMESH_COMPILED seq::hdp_plan place_hdp(std::span<const seq::seq_desc> seqs,
                                                         const seq::hdp_policy& hdp, int pool,
                                                         const step_model& m) const;
  friend constexpr bool operator==(const gap_filling_hdp&, const gap_filling_hdp&) = default;
  /// Hashes the family and its parameters (local_search only when off: default hashes unchanged).
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// HDP work items (seq::hdp_shard) placed by token count: each item on the ranks with the fewest tokens
/// so far (LPT on tokens, blind to quadratic attention cost).
struct token_count {
  /// The name results and the tools use.
  static constexpr std::string_view name = "token_count";

  /// The token-count plan. Pre: cfg.ranks >= 1 (else invalid_argument). Pure. O(n log n).
  [[nodiscard]] HETMESH_COMPILED strategy_plan plan(std::span<const seq::seq_desc> seqs,
                                                    const strategy_config& cfg) const;
  friend constexpr bool operator==(const token_count&, const token_count&) = default;
  /// Hashes the family.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Baseline: HDP work items on uniformly random ranks (a fresh random subset per item).
struct random_placement {
  /// The name results and the tools use.
  static constexpr std::string_view name = "random";
  std::uint64_t seed = 1;  ///< seed of the placement

  /// The random plan. Pre: cfg.ranks >= 1 (else invalid_argument). Pure: deterministic for a seed.
  [[nodiscard]] HETMESH_COMPILED strategy_plan plan(std::span<const seq::seq_desc> seqs,
                                                    const strategy_config& cfg) const;
  friend constexpr bool operator==(const random_placement&, const random_placement&) = default;
  /// Hashes the family and its seed.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Baseline: a fixed dp x cp mesh with cp = ceil(context / C); sequences packed Megatron-style (arrival
/// order, next-fit) into rows of cp x C tokens, rows dealt round-robin to the dp groups.
struct static_dp_cp {
  /// The name results and the tools use.
  static constexpr std::string_view name = "static_dp_cp";
  std::int64_t context = 0;  ///< the context length; 0: the longest sequence of the batch

  /// The static plan. Pre: cfg.ranks >= 1 (else invalid_argument). Throws capacity_error when cp
  /// exceeds the pool. Pure. O(n).
  [[nodiscard]] HETMESH_COMPILED strategy_plan plan(std::span<const seq::seq_desc> seqs,
                                                    const strategy_config& cfg) const;
  friend constexpr bool operator==(const static_dp_cp&, const static_dp_cp&) = default;
  /// Hashes the family and its context length.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::bytescale> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::bytescale& b, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "bytescale(delta={}, buckets={})", b.delta, b.buckets);
  }
};
template <>
struct fmt::formatter<hetmesh::balance::gap_filling_hdp> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::gap_filling_hdp& b, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "gap_filling_hdp(group_size={}{})", b.group_size,
                              b.local_search ? "" : ", local_search=false");
  }
};
template <>
struct fmt::formatter<hetmesh::balance::token_count> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::token_count&, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "token_count");
  }
};
template <>
struct fmt::formatter<hetmesh::balance::random_placement> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::random_placement& b, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "random_placement(seed={})", b.seed);
  }
};
template <>
struct fmt::formatter<hetmesh::balance::static_dp_cp> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::static_dp_cp& b, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "static_dp_cp(context={})", b.context);
  }
};

#if HETMESH_BODIES
// The library's own families, checked against their concepts where the bodies are compiled (header-only
// translation units and the compiled part; a translation unit of a separately compiled program skips them).
static_assert(hetmesh::balance::balancer<hetmesh::balance::bytescale>);
static_assert(hetmesh::balance::balancer<hetmesh::balance::gap_filling_hdp>);
static_assert(hetmesh::balance::balancer<hetmesh::balance::token_count>);
static_assert(hetmesh::balance::balancer<hetmesh::balance::random_placement>);
static_assert(hetmesh::balance::balancer<hetmesh::balance::static_dp_cp>);

namespace hetmesh::balance {

HETMESH_COMPILED strategy_plan bytescale::plan(std::span<const seq::seq_desc> seqs,
                                               const strategy_config& cfg) const {
  detail::check_ranks(cfg, name);
  return detail::hdp_plan_items(place_hdp(seqs, cfg.hdp, cfg.ranks, cfg.model), cfg.model);
}

HETMESH_COMPILED bytescale_policy bytescale::policy(const step_model& m) const noexcept {
  return {.delta = delta,
          .mode = m.pp_stages > 1 ? hdp_balance_mode::pp : hdp_balance_mode::dp,
          .buckets = buckets};
}

HETMESH_COMPILED seq::hdp_plan bytescale::place_hdp(std::span<const seq::seq_desc> seqs,
                                                    const seq::hdp_policy& hdp, int pool,
                                                    const step_model& m) const {
  return plan_bytescale(seqs, hdp, pool, m, policy(m));
}

HETMESH_COMPILED void bytescale::hash_append(hasher& h) const { append_all(h, name, delta, buckets); }

HETMESH_COMPILED strategy_plan gap_filling_hdp::plan(std::span<const seq::seq_desc> seqs,
                                                     const strategy_config& cfg) const {
  detail::check_ranks(cfg, name);
  return detail::hdp_plan_items(place_hdp(seqs, cfg.hdp, cfg.ranks, cfg.model), cfg.model);
}

HETMESH_COMPILED seq::hdp_plan gap_filling_hdp::place_hdp(std::span<const seq::seq_desc> seqs,
                                                          const seq::hdp_policy& hdp, int pool,
                                                          const step_model& m) const {
  std::vector<int> owner(seqs.size());
  for (std::size_t i = 0; i < owner.size(); ++i)
    owner[i] = static_cast<int>(i % static_cast<std::size_t>(pool > 0 ? pool : 1));
  return plan_gap_filling_hdp(seqs, hdp, pool, m, gap_filling_policy{group_size, local_search}, owner);
}

HETMESH_COMPILED void gap_filling_hdp::hash_append(hasher& h) const {
  append_all(h, name, group_size);
  if (!local_search) append(h, local_search);
}

HETMESH_COMPILED strategy_plan token_count::plan(std::span<const seq::seq_desc> seqs,
                                                 const strategy_config& cfg) const {
  detail::check_ranks(cfg, name);
  return detail::token_count_plan(seqs, cfg);
}

HETMESH_COMPILED void token_count::hash_append(hasher& h) const { append(h, name); }

HETMESH_COMPILED strategy_plan random_placement::plan(std::span<const seq::seq_desc> seqs,
                                                      const strategy_config& cfg) const {
  detail::check_ranks(cfg, name);
  return detail::random_plan(seqs, cfg, seed);
}

HETMESH_COMPILED void random_placement::hash_append(hasher& h) const { append_all(h, name, seed); }

HETMESH_COMPILED strategy_plan static_dp_cp::plan(std::span<const seq::seq_desc> seqs,
                                                  const strategy_config& cfg) const {
  detail::check_ranks(cfg, name);
  return detail::static_dp_cp_plan(seqs, cfg, context);
}

HETMESH_COMPILED void static_dp_cp::hash_append(hasher& h) const { append_all(h, name, context); }

}  // namespace hetmesh::balance
#endif  // HETMESH_BODIES
