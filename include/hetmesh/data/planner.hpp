// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: the data planner. A pure function of (configuration, state at the step, metadata)
// that returns the step's global batch, each data-parallel rank's share and micro-batches (balanced
// through hetmesh::balance), and the state of the next step. The state is tiny (per source: epoch,
// position, carry), so it is also the checkpoint; the state at step k is itself a pure function of
// (configuration, k, source sizes) and can be replayed (state_at).
//
// Quotas: q_s = w_s(step) * B + carry_s in fixed point (weights sum to exactly weight_one); n_s =
// floor(q_s), the B - sum(n_s) slots left go to the largest remainders (ties: lower source index);
// carry_s = q_s - n_s. Since sum(carry) stays 0 and |carry_s| < one sample, the realised count of every
// source is within one sample of the schedule's integral at every step.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "../balance/partition.hpp"
#include "../balance/solvers.hpp"
#include "../config.hpp"
#include "../core/assert.hpp"
#include "../core/checked.hpp"
#include "../core/error.hpp"
#include "../core/exactly_once.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "mixture.hpp"
#include "sample.hpp"

namespace hetmesh::data {

/// Where one source's stream stands: epoch, next position in the epoch's permutation, and the quota
/// carry in 1/weight_one samples.
struct source_cursor {
  std::int64_t epoch = 0;     ///< epoch of the source
  std::int64_t position = 0;  ///< next position in the epoch's permutation
  std::int64_t carry = 0;     ///< quota carry, in 1/weight_one samples
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const source_cursor&, const source_cursor&) = default;
};

/// The planner's whole state before `step`.
struct planner_state {
  std::int64_t step = 0;                 ///< the step planned next
  std::vector<source_cursor> cursors{};  ///< one cursor per source
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const planner_state&, const planner_state&) = default;
};

/// Checks a planner state read from outside (a checkpoint, a restore) against `cfg`: one cursor per source,
/// step >= 0, and per source epoch >= 0 (and < max_epochs when that is set), position >= 0 and |carry| <
/// weight_one (the planner keeps every carry under one sample). Throws data_error naming `where`, the
/// field, its value and the expected range. Positions are bounded by the source sizes, which only the
/// sources know: see validate_positions. Pure; O(sources).
HETMESH_COMPILED void validate_state(const mixture_config& cfg, const planner_state& st,
                                     std::string_view where);

/// Checks every cursor's position against its source's size: 0 <= position <= sizes[s] (position ==
/// size means the epoch is used up and the next draw starts the next one). Throws data_error naming
/// `where`, the source, the value and the range. Pure; O(sources).
HETMESH_COMPILED void validate_positions(const mixture_config& cfg, const planner_state& st,
                                         std::span<const std::int64_t> sizes, std::string_view where);

/// The state before step 0.
[[nodiscard]] HETMESH_COMPILED planner_state initial_state(const mixture_config& cfg);

/// What the planner needs to know about the sources, and no more: how many samples each has, and for
/// (source, epoch, position) the sample index and its lengths. Source loaders implement it; a test can
/// implement it from a table.
/// Requirements: 1. m.source_size(s) -> int64 (>= 0); 2. m.lookup(s, epoch, position) -> (index, meta),
/// a pure function of its arguments.
template <class M>
concept metadata_source = requires(M& m, int s, std::int64_t e, std::int64_t p) {
  { m.source_size(s) } -> std::convertible_to<std::int64_t>;
  { m.lookup(s, e, p) } -> std::convertible_to<std::pair<std::int64_t, seq::sample_meta>>;
};

/// A metadata source that also answers for a run of positions at once -- the planner's batch lookup: one
/// call per run of a source (a step draws each source's samples as at most a few runs of consecutive
/// positions), not one per sample. Requirement: m.lookup_run(s, epoch, position, index, meta) sets
/// index[k] and meta[k] (overwritten in place, item_tokens' capacity reused) to what lookup(s, epoch,
/// position + k) returns, for k in [0, index.size()); index.size() == meta.size(). plan_step uses it when
/// it is there and gives the same plan either way.
template <class M>
concept batch_metadata_source = metadata_source<M> &&
    requires(M& m, int s, std::int64_t e, std::int64_t p, std::span<std::int64_t> index,
             std::span<seq::sample_meta> meta) {
  {m.lookup_run(s, e, p, index, meta)};
};

/// One sample of a step plan: where it comes from, its lengths and cost, and where it goes.
struct planned_sample {
  sample_ref ref{};         ///< which sample
  seq::sample_meta meta{};  ///< its metadata; meta.id = ref.id()
  std::int64_t cost = 0;    ///< its price (mixture_config::cost)
  int dp_rank = 0;          ///< data-parallel rank it goes to
  int micro_batch = 0;      ///< micro-batch on that rank
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const planned_sample&, const planned_sample&) = default;
};

/// The plan of one step: samples ordered by (source, epoch, position); per-source counts; the cost load
/// of every data-parallel rank.
struct batch_plan {
  std::int64_t step = 0;                  ///< the step
  std::vector<planned_sample> samples{};  ///< the samples, in canonical order
  std::vector<std::int64_t> quotas{};     ///< samples drawn per source
  std::vector<std::int64_t> rank_cost{};  ///< per dp rank, summed price
  /// Indices into `samples` of rank r's micro-batch m, in sample order.
  [[nodiscard]] HETMESH_COMPILED std::vector<int> micro_batch(int r, int m) const;
  HETMESH_COMPILED void hash_append(hasher& h) const;
  friend bool operator==(const batch_plan&, const batch_plan&) = default;
};

/// Per-source sample counts of the step `st.step`, and the carries after it. Pure; O(sources log sources).
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> step_quotas(const mixture_config& cfg,
                                                                     const std::vector<std::int64_t>& weights,
                                                                     std::vector<source_cursor>& cursors);

namespace detail {
/// Advances one cursor by `count` positions, calling f(epoch, first position, n) once per run of n
/// consecutive positions of one epoch (at most count / size + 2 runs); wraps epochs.
template <class F>
void draw_runs(const source_spec& spec, int s, std::int64_t size, std::int64_t count, source_cursor& c,
               F&& f) {
  if (c.position < 0 || c.position > size || c.epoch < 0)
    throw_error<data_error>(
        "source {} '{}': cursor at epoch {}, position {}; expected epoch >= 0 and position "
        "in [0, {}] (the source's size)",
        s, spec.name, c.epoch, c.position, size);
  if (count > 0 && size == 0)
    throw_error<data_error>(
        "source {} '{}' has no samples (after its token filter) but weight > 0 at this step", s, spec.name);
  while (count > 0) {
    if (c.position >= size) {
      if (spec.max_epochs > 0 && c.epoch + 1 >= spec.max_epochs)
        throw_error<data_error>(
            "source {} '{}' ran dry: all {} samples of its {} epoch(s) are used and the mixture asks for "
            "more; "
            "expected a larger max_epochs or a lower weight",
            s, spec.name, size, spec.max_epochs);
      ++c.epoch;
      c.position = 0;
    }
    const std::int64_t n = std::min(count, size - c.position);
    f(c.epoch, c.position, n);
    c.position += n;
    count -= n;
  }
}
/// Advances one cursor by `count` positions, calling f(epoch, position) for each; wraps epochs.
template <class F>
void draw(const source_spec& spec, int s, std::int64_t size, std::int64_t count, source_cursor& c, F&& f) {
  draw_runs(spec, s, size, count, c, [&](std::int64_t e, std::int64_t p, std::int64_t n) {
    for (std::int64_t k = 0; k < n; ++k) f(e, p + k);
  });
}
/// The price of `m` under `cost` (a s^2 + b s + c per text and per item) in checked arithmetic: an
/// overflow_error naming the sample instead of a wrapped (negative) price.
[[nodiscard]] HETMESH_COMPILED std::int64_t checked_price(const sample_cost& cost, const seq::sample_meta& m,
                                                          int source, std::int64_t position);

}  // namespace detail

/// Replays quotas and cursors to the state before `step` without touching metadata. Pure; O(step x sources).
[[nodiscard]] HETMESH_COMPILED planner_state state_at(const mixture_config& cfg, std::int64_t step,
                                                      std::span<const std::int64_t> sizes);

/// The result of planning a step: its plan and the state before the next step.
struct planned_step {
  batch_plan plan{};     ///< the plan of the step
  planner_state next{};  ///< the state after it
};

namespace detail {

/// plan_step's draw: each source's quota of samples at this step, in source order, with their metadata and
/// prices; advances out.next's cursors. One lookup_run per run of positions for a batch metadata source.
template <class M>
void draw_step_samples(const mixture_config& cfg, planned_step& out, M& metadata) {
  auto& samples = out.plan.samples;
  samples.reserve(static_cast<std::size_t>(cfg.global_batch));
  [[maybe_unused]] std::vector<std::int64_t> run_index;     // the batch lookup's buffers, reused by every run
  [[maybe_unused]] std::vector<seq::sample_meta> run_meta;  // (no allocation per sample for text)
  for (std::size_t s = 0; s < cfg.sources.size(); ++s) {
    const int si = static_cast<int>(s);
    if (out.plan.quotas[s] == 0) continue;
    if constexpr (batch_metadata_source<M>) {
      detail::draw_runs(cfg.sources[s], si, metadata.source_size(si), out.plan.quotas[s], out.next.cursors[s],
                        [&](std::int64_t e, std::int64_t p, std::int64_t n) {
                          const auto un = static_cast<std::size_t>(n);
                          run_index.resize(un);
                          run_meta.resize(un);
                          metadata.lookup_run(si, e, p, std::span<std::int64_t>(run_index),
                                              std::span<seq::sample_meta>(run_meta));
                          // Ids of consecutive positions of one epoch are consecutive: checking the run's
                          // first and last id checks them all.
                          const std::int64_t id0 = seq::make_sample_id(si, e, p);
                          (void)seq::make_sample_id(si, e, p + n - 1);
                          for (std::size_t k = 0; k < un; ++k) {
                            const std::int64_t pk = p + static_cast<std::int64_t>(k);
                            auto& meta = run_meta[k];
                            meta.id = id0 + static_cast<std::int64_t>(k);
                            const auto cost = detail::checked_price(cfg.cost, meta, si, pk);
                            samples.push_back({{si, e, pk, run_index[k]}, std::move(meta), cost, 0, 0});
                          }
                        });
    } else {
      detail::draw(cfg.sources[s], si, metadata.source_size(si), out.plan.quotas[s], out.next.cursors[s],
                   [&](std::int64_t e, std::int64_t p) {
                     auto [index, meta] = metadata.lookup(si, e, p);
                     meta.id = seq::make_sample_id(si, e, p);
                     const auto cost = detail::checked_price(cfg.cost, meta, si, p);
                     samples.push_back({{si, e, p, index}, std::move(meta), cost, 0, 0});
                   });
    }
  }
}

/// plan_step's heavy check: global_batch samples, no (source, epoch, position) drawn twice, each sample in
/// the member list of exactly one rank and in one (dp_rank, micro_batch) in range. O(B log B).
HETMESH_COMPILED void check_step_exactly_once(const mixture_config& cfg,
                                              const std::vector<planned_sample>& samples,
                                              const std::vector<int>& members, int dp, std::int64_t step);

}  // namespace detail

/// Plans step `st.step`: draws the global batch, then balances it on the samples' prices (cfg.cost) with
/// the balance room's partitioner `split` (balance::lpt_partition by default; karmarkar_karp_partition,
/// or round_robin_partition as the unbalanced baseline), first over the data-parallel ranks, then over
/// the micro-batches of each rank. Pre: validate(cfg); st.cursors.size() == sources. Post: exactly
/// global_batch samples; each (source, epoch, position) drawn once in the whole run; every sample in
/// exactly one (dp_rank, micro_batch). Not collective: every rank (or one coordinator) computes the same
/// plan from the same inputs and the same partitioner; deterministic (plan_hash equal everywhere). Cost
/// O(B log B + sources log sources) plus B metadata lookups: one lookup_run per run of consecutive
/// positions when M is a batch_metadata_source, otherwise one lookup per sample (the same plan either
/// way). Throws data_error when a source runs dry, capacity_error when a micro-batch exceeds
/// max_tokens_per_micro_batch.
template <class Split = balance::lpt_partition, metadata_source M>
[[nodiscard]] planned_step plan_step(const mixture_config& cfg, const planner_state& st, M& metadata,
                                     [[maybe_unused]] const Split& split = {}) {
  static_assert(balance::partitioner<Split>,
                "data::plan_step: Split is not a balance::partitioner (needs name, split(costs, bins) -> "
                "balance::assignment, hash_append, a formatter): use balance::lpt_partition, "
                "karmarkar_karp_partition or round_robin_partition");
  if (st.cursors.size() != cfg.sources.size())
    throw_error<invalid_argument>("plan_step: state has {} cursors for {} sources; expected one per source",
                                  st.cursors.size(), cfg.sources.size());
  validate_state(cfg, st, "plan_step: state");
  planned_step out{{st.step, {}, {}, {}}, st};
  out.next.step = st.step + 1;
  out.plan.quotas = step_quotas(cfg, weights_at(cfg, st.step), out.next.cursors);
  auto& samples = out.plan.samples;
  detail::draw_step_samples(cfg, out, metadata);
  // Data-parallel shares, then micro-batches inside each share; both balanced on the integer costs.
  const int dp = cfg.layout.dp_size();
  const std::size_t n = samples.size();
  std::vector<std::int64_t> costs(n);
  for (std::size_t i = 0; i < n; ++i) costs[i] = samples[i].cost;
  // Rank and micro-batch loads are partial sums of non-negative prices: the total bounds them all.
  (void)checked_sum(costs, hetmesh::format("step {}: the summed price of the batch", st.step));
  balance::assignment ranks;
  // LPT: one sort of the whole batch serves the ranks and, restricted to each rank, its micro-batches
  // (a sub-list of a (-cost, index)-sorted list is sorted the same way: identical to sorting each share).
  constexpr bool lpt = std::same_as<Split, balance::lpt_partition>;
  std::vector<int> order;
  if constexpr (lpt) {
    order = balance::decreasing_order(costs);
    ranks = balance::list_schedule(costs, order, dp);
  } else {
    ranks = split.split(costs, dp);
  }
  out.plan.rank_cost = ranks.load;
  // Every rank's members in one flat array, rank by rank, increasing sample index inside a rank (a
  // counting sort: what assignment::members() gives, without a vector per rank): rank r's are
  // members[begin[r], begin[r + 1]); local[i] is sample i's position among its rank's members.
  const auto udp = static_cast<std::size_t>(dp);
  std::vector<int> begin(udp + 1, 0), members(n), local(n);
  for (std::size_t i = 0; i < n; ++i) ++begin[static_cast<std::size_t>(ranks.bin_of[i]) + 1];
  for (std::size_t r = 0; r < udp; ++r) begin[r + 1] += begin[r];
  std::vector<int> fill(begin.begin(), begin.end() - 1);
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = static_cast<std::size_t>(ranks.bin_of[i]);
    local[i] = fill[r] - begin[r];
    members[static_cast<std::size_t>(fill[r]++)] = static_cast<int>(i);
  }
  // Under LPT, each rank's members in the batch's decreasing order (as local positions), same layout.
  std::vector<int> rank_order;
  if constexpr (lpt) {
    rank_order.resize(n);
    std::copy(begin.begin(), begin.end() - 1, fill.begin());
    for (int i : order) {
      const auto r = static_cast<std::size_t>(ranks.bin_of[static_cast<std::size_t>(i)]);
      rank_order[static_cast<std::size_t>(fill[r]++)] = local[static_cast<std::size_t>(i)];
    }
  }
  std::vector<std::int64_t> c(n);  // costs in the members' layout
  for (std::size_t j = 0; j < n; ++j) c[j] = costs[static_cast<std::size_t>(members[j])];
  std::vector<std::int64_t> mb_tokens(static_cast<std::size_t>(cfg.micro_batches));
  for (int r = 0; r < dp; ++r) {
    const auto b = static_cast<std::size_t>(begin[static_cast<std::size_t>(r)]);
    const auto cnt = static_cast<std::size_t>(begin[static_cast<std::size_t>(r) + 1]) - b;
    const std::span<const std::int64_t> cr(c.data() + b, cnt);
    balance::assignment mbs;
    if constexpr (lpt)
      mbs = balance::list_schedule(cr, std::span<const int>(rank_order.data() + b, cnt), cfg.micro_batches);
    else
      mbs = split.split(cr, cfg.micro_batches);
    std::fill(mb_tokens.begin(), mb_tokens.end(), 0);
    for (std::size_t k = 0; k < cnt; ++k) {
      auto& smp = samples[static_cast<std::size_t>(members[b + k])];
      smp.dp_rank = r;
      smp.micro_batch = mbs.bin_of[k];
      auto& mt = mb_tokens[static_cast<std::size_t>(smp.micro_batch)];
      mt = checked_add(mt, smp.meta.tokens, "micro-batch token count");
    }
    for (int m = 0; m < cfg.micro_batches; ++m)
      if (cfg.max_tokens_per_micro_batch > 0 &&
          mb_tokens[static_cast<std::size_t>(m)] > cfg.max_tokens_per_micro_batch)
        throw_error<capacity_error>(
            "step {}: rank {} micro-batch {} holds {} tokens; expected at most max_tokens_per_micro_batch = "
            "{} "
            "(raise micro_batches or the capacity)",
            st.step, r, m, mb_tokens[static_cast<std::size_t>(m)], cfg.max_tokens_per_micro_batch);
  }
  if constexpr (assertion_enabled(assertion_level::heavy))
    detail::check_step_exactly_once(cfg, samples, members, dp, st.step);
  return out;
}

/// Who receives a data-parallel index's batch: the loading rank (coordinate 0 along every dim but the data
/// dims, see trainer_mesh) gets it from the data plane; every other rank with the same data-parallel
/// index -- its tensor and context peers, and those of every pipeline stage (the last needs the labels,
/// colocated encoder shards run on every stage) -- receives it by broadcast from the loading rank. The
/// groups of all indices partition the trainers, so no rank receives a batch twice. Pure.
struct delivery_group {
  int dp = 0;                ///< the data-parallel index
  int loader = 0;            ///< global rank that receives the data from the loaders
  std::vector<int> ranks{};  ///< the broadcast group, loader first, ascending otherwise
  friend bool operator==(const delivery_group&, const delivery_group&) = default;
};

/// The delivery group of data-parallel index `dp` in mesh `m`. Throws invalid_argument for dp out of
/// range. Pure. O(ranks of the group).
[[nodiscard]] HETMESH_COMPILED delivery_group delivery_of(const trainer_mesh& m, int dp);

/// Every delivery group, one per data-parallel index. Their rank sets partition the trainers.
[[nodiscard]] HETMESH_COMPILED std::vector<delivery_group> delivery_plan(const trainer_mesh& m);

}  // namespace hetmesh::data

template <>
struct fmt::formatter<hetmesh::data::planner_state> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::planner_state& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out = hetmesh::format_to(ctx.out(), "planner_state(step={}", s.step);
    for (std::size_t i = 0; i < s.cursors.size(); ++i)
      out = hetmesh::format_to(out, ", s{}: e{} p{} c{}", i, s.cursors[i].epoch, s.cursors[i].position,
                               s.cursors[i].carry);
    return hetmesh::format_to(out, ")");
  }
};
template <>
struct fmt::formatter<hetmesh::data::batch_plan> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::batch_plan& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "batch_plan(step={}, {} samples, quotas={}, rank_cost={})", p.step,
                              p.samples.size(), p.quotas, p.rank_cost);
  }
};
template <>
struct fmt::formatter<hetmesh::data::delivery_group> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::data::delivery_group& g, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "delivery(dp={}, loader={}, ranks={})", g.dp, g.loader, g.ranks);
  }
};

#if HETMESH_BODIES
#include "detail/planner_impl.hpp"
#endif
