// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: the joint encoder-LLM pipeline (MegaScale-Omni) and its two baselines, as policy
// types (the `encoder_placement` concept); the type is the choice, its members the parameters.
//
//   colocated_encoder       the encoder runs on every LLM rank (shard r on rank r, 1/pp of each
//                           micro-batch's encoder work each); its forward and backward are inserted into
//                           the LLM schedule's bubbles on demand: a shard encodes micro-batch m when stage 0
//                           is about to need it (urgent) or, while idle, up to `lookahead` micro-batches
//                           ahead of stage 0; it back-propagates m once stage 0's backward of m arrives.
//   encoder_on_first_stage  Megatron-LM's way: stage 0's rank encodes m right before F(0, m) and
//                           back-propagates it right after stage 0's backward of m.
//   encoder_pool            a separate pool of `ranks` encoder ranks (after the LLM ranks) shares the work.
//
// The dependencies every policy keeps (and the verifier checks): every shard's EF of m finishes before
// stage 0's F of m starts; every shard's EB of m starts after stage 0's B (or I) of m.
// Insertion points are found by running the event engine of simulate.hpp with the given costs, so the
// plan is a pure, deterministic function of (LLM schedule, policy, costs).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "action.hpp"
#include "lower.hpp"
#include "simulate.hpp"
#include "verify.hpp"

namespace hetmesh::pipeline {

struct encoder_work;

/// MegaScale-Omni's joint pipeline: encoder colocated on every LLM rank, work inserted into bubbles.
struct colocated_encoder {
  /// The placement's name (schedules made with it are named `<llm>+encoder-colocated`).
  static constexpr std::string_view name = "colocated";
  int lookahead = 2;  ///< how many micro-batches beyond stage 0's next forward a shard may encode early
  /// Encoder-only ranks per pipeline: none (the shards run on LLM ranks).
  [[nodiscard]] constexpr int encoder_ranks() const noexcept { return 0; }
  /// `llm` (compute only, verified, no encoder) with the encoder's actions placed (see add_encoder).
  [[nodiscard]] schedule place(const schedule& llm, const cost_model& costs, const encoder_work& work) const;
  friend constexpr bool operator==(const colocated_encoder&, const colocated_encoder&) = default;
  void hash_append(hasher& h) const { append_all(h, std::string_view("colocated"), lookahead); }
};

/// Baseline: the encoder is part of pipeline stage 0 (Megatron-LM).
struct encoder_on_first_stage {
  /// The placement's name.
  static constexpr std::string_view name = "first-stage";
  /// Encoder-only ranks per pipeline: none (the shards run on LLM ranks).
  [[nodiscard]] constexpr int encoder_ranks() const noexcept { return 0; }
  /// `llm` (compute only, verified, no encoder) with the encoder's actions placed (see add_encoder).
  [[nodiscard]] schedule place(const schedule& llm, const cost_model& costs, const encoder_work& work) const;
  friend constexpr bool operator==(const encoder_on_first_stage&, const encoder_on_first_stage&) = default;
  void hash_append(hasher& h) const { append(h, std::string_view("first-stage")); }
};

/// Baseline: a separate pool of encoder ranks.
struct encoder_pool {
  /// The placement's name.
  static constexpr std::string_view name = "pool";
  int ranks = 1;       ///< encoder ranks, placed after the LLM ranks
  int lookahead = -1;  ///< micro-batches the pool may run ahead of stage 0; -1 = unbounded
  /// Encoder-only ranks per pipeline, after its LLM ranks: `ranks` (-1 when ranks < 1: not a valid pool).
  [[nodiscard]] constexpr int encoder_ranks() const noexcept { return ranks >= 1 ? ranks : -1; }
  /// `llm` (compute only, verified, no encoder) with `ranks` encoder ranks appended and the encoder's actions
  /// placed on them (see add_encoder).
  [[nodiscard]] schedule place(const schedule& llm, const cost_model& costs, const encoder_work& work) const;
  friend constexpr bool operator==(const encoder_pool&, const encoder_pool&) = default;
  void hash_append(hasher& h) const { append_all(h, std::string_view("pool"), ranks, lookahead); }
};

/// An encoder placement family: where encoder work runs relative to the LLM pipeline. Requirements on
/// `P` (a value `p`):
///   1. `P` is a regular aggregate (`std::regular`): default-constructible, copyable, `p == p`;
///   2. `P::name` is a constant convertible to `std::string_view`;
///   3. `p.hash_append(h)` feeds every parameter to a `hasher`;
///   4. `P` prints through fmt;
///   5. `p.encoder_ranks()` (int): encoder-only ranks it adds per pipeline after the LLM ranks (0: the shards
///      run on LLM ranks; negative: invalid parameters, refused where a system is built);
///   6. `p.place(llm, costs, work)` returns `llm` (a compute-only LLM schedule that passes verify()) with
///      encoder shards (schedule::encoder_shard_to_rank) and their EF/EB actions, keeping the dependencies
///      add_encoder documents (every shard's EF of m before stage 0's F of m; its EB of m after stage 0's B
///      or I of m); add_encoder checks the result is deadlock free.
/// A user's placement is any such type: add_encoder and train::system call only these members.
template <class P>
concept encoder_placement = std::regular<P> && std::convertible_to<decltype(P::name), std::string_view> &&
    requires(const P& p, hasher& h, const schedule& s, const cost_model& c, const encoder_work& w) {
  p.hash_append(h);
  { p.encoder_ranks() } -> std::convertible_to<int>;
  { p.place(s, c, w) } -> std::same_as<schedule>;
} && fmt::is_formattable<P>::value;

/// The encoder work of each micro-batch, whole (before splitting over shards).
struct encoder_work {
  std::function<double(int mb)> forward{};   ///< seconds of encoder forward for micro-batch mb
  std::function<double(int mb)> backward{};  ///< seconds of encoder backward
  std::function<double(int mb)>
      transfer{};  ///< seconds to move mb's encoder output (or its gradient); empty = 0
  std::function<std::int64_t(int mb)> memory{};  ///< activation bytes the encoder keeps for mb; empty = 1
};

/// The cost model of a schedule with `shards` encoder shards: LLM actions priced by `llm`, each shard's
/// EF/EB of mb priced at 1/shards of the micro-batch's work (its transfer and memory likewise).
[[nodiscard]] HETMESH_COMPILED cost_model with_encoder(const cost_model& llm, const encoder_work& w,
                                                       int shards)
#if HETMESH_BODIES
{
  const double share = shards > 0 ? 1.0 / shards : 1.0;
  cost_model c;
  c.compute = [llm, w, share](const action& a) {
    if (a.type == action_type::encoder_forward) return w.forward ? w.forward(a.microbatch) * share : 0.0;
    if (a.type == action_type::encoder_backward) return w.backward ? w.backward(a.microbatch) * share : 0.0;
    return llm.compute(a);
  };
  c.transfer = [llm, w, share](const action& a) {
    if (a.type == action_type::encoder_forward) return w.transfer ? w.transfer(a.microbatch) * share : 0.0;
    double t = llm.transfer ? llm.transfer(a) : 0.0;
    // Stage 0's backward also returns embedding gradients to the shards; the stage transfer covers
    // the LLM's own gradient, the encoder share is added for the embedding part.
    if (a.stage == 0 && (a.type == action_type::backward || a.type == action_type::backward_input) &&
        w.transfer)
      t = std::max(t, w.transfer(a.microbatch) * share);
    return t;
  };
  c.memory = [llm, w, share](const action& a) -> std::int64_t {
    if (a.type == action_type::encoder_forward)
      return w.memory ? static_cast<std::int64_t>(static_cast<double>(w.memory(a.microbatch)) * share) : 1;
    return llm.memory ? llm.memory(a) : 1;
  };
  return c;
}
#else
    ;
#endif

namespace detail {

HETMESH_COMPILED void check_llm(const schedule& s, std::string_view who)
#if HETMESH_BODIES
{
  if (s.num_encoder_shards() != 0)
    throw_error<invalid_argument>(
        "pipeline {}: the input schedule already has {} encoder shards; expected an LLM-only "
        "schedule",
        who, s.num_encoder_shards());
}
#else
    ;
#endif

}  // namespace detail

namespace detail {
/// `s` (an LLM schedule whose encoder shards are set) with its shards' EF/EB placed by the event engine:
/// a shard encodes micro-batch m when stage 0 is about to need it (`urgent`) or, while idle, up to
/// `lookahead` micro-batches ahead of stage 0 (-1: unbounded).
[[nodiscard]] HETMESH_COMPILED schedule place_in_bubbles(schedule s, const cost_model& costs,
                                                         const encoder_work& work, int lookahead,
                                                         bool urgent);
}  // namespace detail

#if HETMESH_BODIES
namespace detail {
/// The dynamic source of the colocated and pool policies (see the file comment).
struct encoder_source {
  const schedule& llm;  // LLM lists (compute only)
  int shards;
  int lookahead;     // < 0: unbounded
  bool urgent_rule;  // colocated: a shard serves stage 0's next micro-batch before its own LLM work
  std::vector<int> shard_of_rank;  // -1: none
  std::vector<std::size_t> pc;
  std::vector<int> next_ef, next_eb;
  std::vector<int> f0_order;  // micro-batches in the order stage 0 forwards them
  std::size_t f0_next = 0;
  std::vector<std::vector<action>> out;

  encoder_source(const schedule& s, int nshards, int look, bool urgent)
      : llm(s),
        shards(nshards),
        lookahead(look),
        urgent_rule(urgent),
        shard_of_rank(s.ranks.size(), -1),
        pc(s.ranks.size(), 0),
        next_ef(static_cast<std::size_t>(nshards), 0),
        next_eb(static_cast<std::size_t>(nshards), 0),
        out(s.ranks.size()) {
    for (int e = 0; e < nshards; ++e)
      shard_of_rank[static_cast<std::size_t>(s.encoder_shard_to_rank[static_cast<std::size_t>(e)])] = e;
    for (const auto& a : s.ranks[static_cast<std::size_t>(s.rank_of_stage(0))])
      for (const action& p : parts(a))
        if (p.type == action_type::forward && p.stage == 0) f0_order.push_back(p.microbatch);
  }
  [[nodiscard]] int need_mb() const {
    return f0_next < f0_order.size() ? f0_order[f0_next] : llm.num_microbatches;
  }
  template <class Engine>
  std::optional<action> pick(const Engine& eng, int r) const {
    const auto& row = llm.ranks[static_cast<std::size_t>(r)];
    const auto i = pc[static_cast<std::size_t>(r)];
    const int e = shard_of_rank[static_cast<std::size_t>(r)];
    const int M = llm.num_microbatches;
    std::optional<action> ef, eb;
    if (e >= 0) {
      const int f = next_ef[static_cast<std::size_t>(e)], b = next_eb[static_cast<std::size_t>(e)];
      if (f < M) ef = action{e, action_type::encoder_forward, f};
      if (b < f && eng.ready(action{e, action_type::encoder_backward, b}))
        eb = action{e, action_type::encoder_backward, b};
    }
    if (ef && urgent_rule && ef->microbatch <= need_mb()) return ef;
    if (i < row.size() && eng.ready(row[i])) return row[i];
    if (eb) return eb;
    if (ef && (lookahead < 0 || ef->microbatch <= need_mb() + lookahead)) return ef;
    return std::nullopt;
  }
  template <class Engine>
  void started(Engine& eng, int r, const action& a) {
    out[static_cast<std::size_t>(r)].push_back(a);
    if (a.type == action_type::encoder_forward) {
      ++next_ef[static_cast<std::size_t>(a.stage)];
    } else if (a.type == action_type::encoder_backward) {
      ++next_eb[static_cast<std::size_t>(a.stage)];
    } else {
      ++pc[static_cast<std::size_t>(r)];
      const action f = parts(a).part[0];  // an OVERLAP_F_B's forward half
      if (f.type == action_type::forward && f.stage == 0) {
        ++f0_next;
        eng.wake_all();  // stage 0 moved on: shards may now encode further ahead
      }
    }
  }
  [[nodiscard]] bool finished(int r) const {
    const int e = shard_of_rank[static_cast<std::size_t>(r)];
    const bool llm_done = pc[static_cast<std::size_t>(r)] >= llm.ranks[static_cast<std::size_t>(r)].size();
    if (e < 0) return llm_done;
    return llm_done && next_eb[static_cast<std::size_t>(e)] == llm.num_microbatches;
  }
};

/// `s` (an LLM schedule whose encoder shards are set) with its shards' EF/EB placed by the event engine:
/// a shard encodes micro-batch m when stage 0 is about to need it (`urgent`) or, while idle, up to
/// `lookahead` micro-batches ahead of stage 0 (-1: unbounded).
[[nodiscard]] HETMESH_COMPILED schedule place_in_bubbles(schedule s, const cost_model& costs,
                                                         const encoder_work& work, int lookahead,
                                                         bool urgent) {
  const cost_model c = with_encoder(costs, work, s.num_encoder_shards());
  encoder_source src(s, s.num_encoder_shards(), lookahead, urgent);
  engine<encoder_source> eng(s, c, src, false);
  (void)eng.run();
  s.ranks = std::move(src.out);
  return s;
}
}  // namespace detail

HETMESH_COMPILED schedule encoder_on_first_stage::place(const schedule& llm, const cost_model&,
                                                        const encoder_work&) const {
  schedule s = llm;
  s.name = llm.name + "+encoder-first-stage";
  const int r0 = s.rank_of_stage(0);
  s.encoder_shard_to_rank = {r0};
  std::vector<action> row;
  for (const auto& a : s.ranks[static_cast<std::size_t>(r0)]) {
    const auto ps = parts(a);  // an OVERLAP_F_B: EF before it, EB after it, as for its halves
    for (const action& p : ps)
      if (p.stage == 0 && p.type == action_type::forward)
        row.push_back({0, action_type::encoder_forward, p.microbatch});
    row.push_back(a);
    for (const action& p : ps)
      if (p.stage == 0 && (p.type == action_type::backward || p.type == action_type::backward_input))
        row.push_back({0, action_type::encoder_backward, p.microbatch});
  }
  s.ranks[static_cast<std::size_t>(r0)] = std::move(row);
  return s;
}

HETMESH_COMPILED schedule colocated_encoder::place(const schedule& llm, const cost_model& costs,
                                                   const encoder_work& work) const {
  if (lookahead < 0)
    throw_error<invalid_argument>("pipeline add_encoder: colocated lookahead={}; expected >= 0", lookahead);
  const int p = llm.total_ranks();
  schedule s = llm;
  s.name = llm.name + "+encoder-colocated";
  s.encoder_shard_to_rank.resize(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) s.encoder_shard_to_rank[static_cast<std::size_t>(r)] = r;
  return detail::place_in_bubbles(std::move(s), costs, work, lookahead, true);
}

HETMESH_COMPILED schedule encoder_pool::place(const schedule& llm, const cost_model& costs,
                                              const encoder_work& work) const {
  if (ranks < 1)
    throw_error<invalid_argument>("pipeline add_encoder: encoder pool of {} ranks; expected at least one",
                                  ranks);
  const int p = llm.total_ranks();
  schedule s = llm;
  s.name = llm.name + "+encoder-pool";
  for (int e = 0; e < ranks; ++e) {
    s.encoder_shard_to_rank.push_back(p + e);
    s.ranks.emplace_back();
  }
  return detail::place_in_bubbles(std::move(s), costs, work, lookahead, false);
}

#endif  // HETMESH_BODIES

/// Adds the encoder to an LLM-only schedule under `policy` (an encoder_placement: its `place`), placing
/// EF/EB with `costs` (LLM costs) and `work` (whole-micro-batch encoder costs). Returns a compute-only
/// schedule with encoder shards (lower it with add_send_recv for execution); simulate it with
/// `with_encoder(costs, work, shards)`. Preconditions: `llm` has no encoder shards and passes verify();
/// the placement's own (pool ranks >= 1; lookahead >= 0 for colocated). Throws invalid_argument naming the
/// broken one. Pure; deterministic; O(actions log actions) for the library's placements.
template <class Placement>
[[nodiscard]] schedule add_encoder(const schedule& llm_in, const Placement& policy, const cost_model& costs,
                                   const encoder_work& work) {
  static_assert(encoder_placement<Placement>,
                "not a pipeline::encoder_placement: expected colocated_encoder (the joint pipeline), "
                "encoder_on_first_stage, encoder_pool, or a type with `encoder_ranks()` and "
                "`place(llm, costs, work)` (pipeline/joint.hpp)");
  detail::check_llm(llm_in, "add_encoder");
  schedule s = policy.place(strip_comm(llm_in), costs, work);
  assert_deadlock_free(s, "pipeline::add_encoder");
  return s;
}

}  // namespace hetmesh::pipeline

template <>
struct fmt::formatter<hetmesh::pipeline::colocated_encoder> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::colocated_encoder& c, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "colocated(lookahead={})", c.lookahead);
  }
};
template <>
struct fmt::formatter<hetmesh::pipeline::encoder_on_first_stage> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::encoder_on_first_stage&, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "first-stage");
  }
};
template <>
struct fmt::formatter<hetmesh::pipeline::encoder_pool> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::encoder_pool& q, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "pool(ranks={}, lookahead={})", q.ranks, q.lookahead);
  }
};

static_assert(hetmesh::pipeline::encoder_placement<hetmesh::pipeline::colocated_encoder>);
static_assert(hetmesh::pipeline::encoder_placement<hetmesh::pipeline::encoder_on_first_stage>);
static_assert(hetmesh::pipeline::encoder_placement<hetmesh::pipeline::encoder_pool>);
