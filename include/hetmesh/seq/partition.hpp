// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: the partition families as policy types, and the `partition_family` concept they model.
// The type is the choice of algorithm; its members are the run-time parameters (degree, capacity,
// padding), which depend on the cluster and the data.
//   LLM:      cp_zigzag (Megatron-LM, one sequence), cp_thd (TransformerEngine, packed documents),
//             cp_contiguous (baseline), ulysses (heads all-to-all), hdp<Offload> (ByteScale's HDP
//             with selective_offload or no_offload)
//   encoder:  long_short_policy (MegaScale-Omni's long-short SP, long_short.hpp)
// Each family's `plan(...)` calls the planner of its own header; inputs differ by family (one length,
// a packed stream, per-rank token counts, sequence descriptors), so the concept fixes the plan's type,
// not the call.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "cp.hpp"
#include "hdp.hpp"
#include "long_short.hpp"
#include "offload.hpp"
#include "types.hpp"
#include "ulysses.hpp"

namespace hetmesh::seq {

/// A sequence-partition family. Requirements on `P` (a value `p`):
///   1. `P` is a regular aggregate: default-constructible, copyable, `p == p` (`std::regular`);
///   2. `P::name` is a constant convertible to `std::string_view`;
///   3. `P::role` is a constant `partition_role`: whether it splits the LLM's sequences or an encoder's
///      items;
///   4. `P::ring_attention` is a constant `bool`: true when a sequence's attention runs over a ring of
///      ranks, so the user's attention kernel is driven across ranks (block by block with merges);
///   5. `P::plan_type` names what its `plan(...)` returns, a hashable plan (`hash_append`);
///   6. `p.hash_append(h)` feeds every parameter to a `hasher`, and `P` prints through fmt.
template <class P>
concept partition_family = std::regular<P> && std::convertible_to<decltype(P::name), std::string_view> &&
                           std::same_as<std::remove_cv_t<decltype(P::role)>, partition_role> &&
                           std::same_as < std::remove_cv_t<decltype(P::ring_attention)>,
bool > &&requires(const P& p, const typename P::plan_type& plan, hasher& h) {
  p.hash_append(h);
  plan.hash_append(h);
}
&&fmt::is_formattable<P>::value;

/// A partition family for the LLM backbone's sequences (role llm).
template <class P>
concept llm_partition = partition_family<P> &&(P::role == partition_role::llm);

/// A partition family for an encoder's items (role encoder).
template <class P>
concept encoder_partition = partition_family<P> &&(P::role == partition_role::encoder);

/// True when partition family `P` can run with a user's attention (`HasAttentionKernel`: the model
/// supplies a block attention kernel with forward and backward, model::attention_kernel). A ring
/// partition drives that kernel across the ring's ranks, so it requires one.
template <class P, bool HasAttentionKernel>
concept partition_accepts = partition_family<P> &&(!P::ring_attention || HasAttentionKernel);

/// Compile-time check of partition_accepts with a message; returns true for use in a static_assert.
template <class P, bool HasAttentionKernel>
consteval bool check_partition_accepts() {
  static_assert(
      partition_family<P>,
      "not a sequence partition family: expected a policy type with `name`, `role`, "
      "`ring_attention`, `plan_type`, `hash_append`, ==, and a formatter (see seq::partition_family)");
  static_assert(
      !P::ring_attention || HasAttentionKernel,
      "this partition runs attention over a ring of ranks: the model must supply an attention kernel "
      "(model::attention_kernel: block forward to (out, lse) and its backward)");
  return true;
}

/// Static context parallelism, Megatron-LM's zigzag of one sequence: rank r holds chunks r and
/// 2cp-1-r of 2cp.
struct cp_zigzag {
  /// The family's name.
  static constexpr std::string_view name = "cp-zigzag";
  /// Splits the LLM's sequences.
  static constexpr partition_role role = partition_role::llm;
  /// Attention runs over the cp ring.
  static constexpr bool ring_attention = true;
  /// What plan() returns.
  using plan_type = cp_partition;
  int cp = 1;        ///< context-parallel ranks
  bool pad = false;  ///< pad the sequence at its end to a multiple of 2 cp

  /// partition_zigzag(length, cp, pad). Same contract and errors.
  [[nodiscard]] HETMESH_COMPILED cp_partition plan(std::int64_t length) const;
  friend constexpr bool operator==(const cp_zigzag&, const cp_zigzag&) = default;
  /// Hashes the family and its parameters.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Static context parallelism, TransformerEngine's THD split: each document of a packed stream in 2cp
/// chunks, rank r holding chunks r and 2cp-1-r of every document.
struct cp_thd {
  /// The family's name.
  static constexpr std::string_view name = "cp-thd";
  /// Splits the LLM's sequences.
  static constexpr partition_role role = partition_role::llm;
  /// Attention runs over the cp ring.
  static constexpr bool ring_attention = true;
  /// What plan() returns.
  using plan_type = cp_partition;
  int cp = 1;        ///< context-parallel ranks
  bool pad = false;  ///< pad each document at its end to a multiple of 2 cp

  /// partition_thd(lengths, cp, pad). Same contract and errors.
  [[nodiscard]] HETMESH_COMPILED cp_partition plan(std::span<const std::int64_t> lengths) const;
  friend constexpr bool operator==(const cp_thd&, const cp_thd&) = default;
  /// Hashes the family and its parameters.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Baseline context parallelism: the packed stream cut into cp near-equal contiguous pieces (causal
/// work grows with the rank).
struct cp_contiguous {
  /// The family's name.
  static constexpr std::string_view name = "cp-contiguous";
  /// Splits the LLM's sequences.
  static constexpr partition_role role = partition_role::llm;
  /// Attention runs over the cp ring.
  static constexpr bool ring_attention = true;
  /// What plan() returns.
  using plan_type = cp_partition;
  int cp = 1;  ///< context-parallel ranks

  /// partition_contiguous(lengths, cp). Same contract and errors.
  [[nodiscard]] HETMESH_COMPILED cp_partition plan(std::span<const std::int64_t> lengths) const;
  friend constexpr bool operator==(const cp_contiguous&, const cp_contiguous&) = default;
  /// Hashes the family and its parameter.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// Ulysses (DeepSpeed): tokens split over `degree` ranks, swapped by all-to-all for heads before
/// attention, so each rank attends over whole sequences for its share of the heads.
struct ulysses {
  /// The family's name.
  static constexpr std::string_view name = "ulysses";
  /// Splits the LLM's sequences.
  static constexpr partition_role role = partition_role::llm;
  /// Attention is local after the all-to-all: no ring.
  static constexpr bool ring_attention = false;
  /// What plan() returns.
  using plan_type = ulysses_plan;
  int degree = 1;    ///< Ulysses ranks (heads are split over them)
  int heads = 1;     ///< query heads H
  int kv_heads = 1;  ///< key/value heads Hkv (== H without GQA)
  int head_dim = 1;  ///< dimension of one head

  /// The same parameters as the planner's value type.
  [[nodiscard]] constexpr ulysses_policy policy() const noexcept {
    return {degree, heads, kv_heads, head_dim};
  }
  /// plan_ulysses(tokens, policy()): `tokens` holds one token count per rank. Same contract and errors.
  [[nodiscard]] HETMESH_COMPILED ulysses_plan plan(std::span<const std::int64_t> tokens) const;
  friend constexpr bool operator==(const ulysses&, const ulysses&) = default;
  /// Hashes the family and its parameters.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// HDP offload family: no activation offloading (rings are as wide as memory demands).
struct no_offload {
  /// The family's name.
  static constexpr std::string_view name = "no-offload";
  /// The solver policy: disabled.
  [[nodiscard]] constexpr offload_policy policy() const noexcept { return {.enabled = false}; }
  friend constexpr bool operator==(const no_offload&, const no_offload&) = default;
  /// Hashes the family.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// HDP offload family: ByteScale's selective offloading; a long sequence's ring shrinks by offloading
/// a share of its activations (solve_offload), ratios on a grid of `ratio_steps`.
struct selective_offload {
  /// The family's name.
  static constexpr std::string_view name = "selective-offload";
  int ratio_steps = 100;  ///< ratios are multiples of 1 / ratio_steps

  /// The solver policy: enabled on this grid.
  [[nodiscard]] constexpr offload_policy policy() const noexcept {
    return {.enabled = true, .ratio_steps = ratio_steps};
  }
  friend constexpr bool operator==(const selective_offload&, const selective_offload&) = default;
  /// Hashes the family and its grid.
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// An HDP offload family: no_offload or selective_offload. Requirements on `O` (a value `o`):
///   1. `std::regular<O>`; 2. `O::name` converts to `std::string_view`;
///   3. `o.policy()` returns the `offload_policy` the solver runs with; 4. `o.hash_append(h)`.
template <class O>
concept offload_family = std::regular<O> && std::convertible_to<decltype(O::name), std::string_view> &&
    requires(const O& o, hasher& h) {
  { o.policy() } -> std::same_as<offload_policy>;
  o.hash_append(h);
};

/// ByteScale's Hybrid Data Parallelism: DP and CP ranks form one pool; short sequences are packed whole
/// on one rank, each long one gets a ring of just the ranks its length needs (fewer with
/// `Offload` = selective_offload).
template <offload_family Offload = selective_offload>
struct hdp {
  /// The family's name.
  static constexpr std::string_view name = "hdp";
  /// Splits the LLM's sequences.
  static constexpr partition_role role = partition_role::llm;
  /// Long sequences run attention over their ring.
  static constexpr bool ring_attention = true;
  /// What plan() returns.
  using plan_type = hdp_plan;
  std::int64_t capacity = 8192;  ///< C: activation tokens one rank holds per micro-batch
  Offload offload{};             ///< the offload family and its parameters
  offload_model model{};         ///< offload solver and item costs
  hdp_placement_kind placement = hdp_placement_kind::waves;  ///< how rings are placed on the pool

  /// The same parameters as the planner's value type.
  [[nodiscard]] hdp_policy policy() const {
    return {.capacity = capacity, .offload = offload.policy(), .model = model, .placement = placement};
  }
  /// plan_hdp(seqs, policy(), pool). Same contract and errors.
  [[nodiscard]] hdp_plan plan(std::span<const seq_desc> seqs, int pool) const {
    return plan_hdp(seqs, policy(), pool);
  }
  friend bool operator==(const hdp&, const hdp&) = default;
  /// Hashes the family and its parameters.
  void hash_append(hasher& h) const { append_all(h, name, capacity, offload, model, placement); }
};

/// Whether static CP splits a document over ranks (cp > 1): what train::system asks of a family before a
/// stage that does not declare its token mixing runs under it (train/sequence_split.hpp).
[[nodiscard]] constexpr bool may_split_sequences(const cp_zigzag& f, int) noexcept { return f.cp > 1; }
/// Whether static CP (THD) splits a document over ranks (cp > 1).
[[nodiscard]] constexpr bool may_split_sequences(const cp_thd& f, int) noexcept { return f.cp > 1; }
/// Whether contiguous CP splits a document over ranks (cp > 1).
[[nodiscard]] constexpr bool may_split_sequences(const cp_contiguous& f, int) noexcept { return f.cp > 1; }
/// Whether Ulysses splits a group's stream over ranks (degree > 1).
[[nodiscard]] constexpr bool may_split_sequences(const ulysses& f, int) noexcept { return f.degree > 1; }
/// Whether HDP may form a ring over ranks: in any pool of more than one rank.
template <class Offload>
[[nodiscard]] constexpr bool may_split_sequences(const hdp<Offload>&, int pool) noexcept {
  return pool > 1;
}

}  // namespace hetmesh::seq

template <>
struct fmt::formatter<hetmesh::seq::cp_zigzag> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::cp_zigzag& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "cp_zigzag{{cp={}, pad={}}}", p.cp, p.pad);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::cp_thd> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::cp_thd& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "cp_thd{{cp={}, pad={}}}", p.cp, p.pad);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::cp_contiguous> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::cp_contiguous& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "cp_contiguous{{cp={}}}", p.cp);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::ulysses> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::ulysses& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "ulysses{{degree={}, heads={}, kv_heads={}, head_dim={}}}", p.degree,
                              p.heads, p.kv_heads, p.head_dim);
  }
};
template <>
struct fmt::formatter<hetmesh::seq::no_offload> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::no_offload&, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "no_offload");
  }
};
template <>
struct fmt::formatter<hetmesh::seq::selective_offload> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::selective_offload& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "selective_offload{{ratio_steps={}}}", p.ratio_steps);
  }
};
/// Prints `hdp<offload>{C=..., placement=...}`.
template <class Offload>
struct fmt::formatter<hetmesh::seq::hdp<Offload>> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::seq::hdp<Offload>& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "hdp<{}>{{C={}, {}, placement={}}}", p.offload, p.capacity, p.model,
                              p.placement);
  }
};

#if HETMESH_BODIES
// The library's own families, checked against their concepts where the bodies are compiled (header-only
// translation units and the compiled part; a translation unit of a separately compiled program skips them).
static_assert(hetmesh::seq::llm_partition<hetmesh::seq::cp_zigzag>);
static_assert(hetmesh::seq::llm_partition<hetmesh::seq::cp_thd>);
static_assert(hetmesh::seq::llm_partition<hetmesh::seq::cp_contiguous>);
static_assert(hetmesh::seq::llm_partition<hetmesh::seq::ulysses>);
static_assert(hetmesh::seq::llm_partition<hetmesh::seq::hdp<hetmesh::seq::selective_offload>>);
static_assert(hetmesh::seq::llm_partition<hetmesh::seq::hdp<hetmesh::seq::no_offload>>);
static_assert(hetmesh::seq::encoder_partition<hetmesh::seq::long_short_policy>);
static_assert(hetmesh::seq::offload_family<hetmesh::seq::no_offload>);
static_assert(hetmesh::seq::offload_family<hetmesh::seq::selective_offload>);

namespace hetmesh::seq {

HETMESH_COMPILED cp_partition cp_zigzag::plan(std::int64_t length) const {
  return partition_zigzag(length, cp, pad);
}

HETMESH_COMPILED void cp_zigzag::hash_append(hasher& h) const { append_all(h, name, cp, pad); }

HETMESH_COMPILED cp_partition cp_thd::plan(std::span<const std::int64_t> lengths) const {
  return partition_thd(lengths, cp, pad);
}

HETMESH_COMPILED void cp_thd::hash_append(hasher& h) const { append_all(h, name, cp, pad); }

HETMESH_COMPILED cp_partition cp_contiguous::plan(std::span<const std::int64_t> lengths) const {
  return partition_contiguous(lengths, cp);
}

HETMESH_COMPILED void cp_contiguous::hash_append(hasher& h) const { append_all(h, name, cp); }

HETMESH_COMPILED ulysses_plan ulysses::plan(std::span<const std::int64_t> tokens) const {
  return plan_ulysses(tokens, policy());
}

HETMESH_COMPILED void ulysses::hash_append(hasher& h) const {
  append_all(h, name, degree, heads, kv_heads, head_dim);
}

HETMESH_COMPILED void no_offload::hash_append(hasher& h) const { append(h, name); }

HETMESH_COMPILED void selective_offload::hash_append(hasher& h) const { append_all(h, name, ratio_steps); }

}  // namespace hetmesh::seq
#endif  // HETMESH_BODIES
