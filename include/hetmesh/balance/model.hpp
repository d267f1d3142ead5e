// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: the step model every balancer optimises and every benchmark reports. A step is a
// set of tasks; a task runs on one rank (a packed micro-batch) or on a ring of ranks (a long sequence
// split zigzag, or a packed row under static context parallelism), all members together. Each rank
// runs its tasks in increasing global order; a ring starts when its last member is free. The step
// ends when the last rank finishes. All of this is *modelled* time from cost/ models, never measured.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "../core/sort.hpp"
#include "../cost/comm.hpp"
#include "../cost/compute.hpp"
#include "../cost/fixed.hpp"
#include "../cost/moe.hpp"

namespace hetmesh::balance {

/// Prices tasks: a thin composition of cost/ models, no formula of its own. Backbone compute (`llm`;
/// `llm.layers` is the whole model here, `pp_stages` the pipeline it is cut into), ring communication
/// over the cluster `net` (mesh::topology: its devices_per_node and links), and the size of the K and
/// V a ring passes per token per layer (`kv_bytes_per_token`; 2 x 8 KV heads x 128 dims x 2 bytes =
/// 4096 for a GQA 7B-class model).
struct step_model {
  /// backbone compute; layers = the whole model
  cost::llm_compute llm{cost::bytescale_fig6a_layer(), 32, 3.0};
  cost::network net{};                 ///< the cluster: devices per node, links
  double kv_bytes_per_token = 4096.0;  ///< K and V bytes a ring passes per token and layer
  int pp_stages = 1;                   ///< pipeline stages the model is cut into
  /// Per-rank training time (forward and backward, model units) a ring of D > 1 ranks adds per layer
  /// and per ring step on top of its compute and its KV hops: the fixed work of one step of the ring
  /// (a block kernel call, posting and matching its exchange) that `net` does not price. A ring micro-
  /// batch pays layers x D x this. 0 by default (the GPU models); calibrated where it shows, e.g. CPU
  /// ranks on loopback (bench/train).
  double ring_step_overhead = 0.0;

  /// One rank running one packed row of `docs`. O(docs).
  [[nodiscard]] HETMESH_COMPILED cost::fixed pack_time(std::span<const std::int64_t> docs) const;
  /// Per-rank time of a ring of `degree` ranks over one causal sequence of s tokens (zigzag shards):
  /// per layer max(shard compute, (D-1) KV hops), the hop over the inter-node link when the ring
  /// spans nodes. O(1).
  [[nodiscard]] HETMESH_COMPILED cost::fixed ring_time(std::int64_t s, int degree, bool spans_nodes) const;
  /// Per-rank time of a packed row of `docs` split over a ring of `degree` ranks (THD zigzag per
  /// document: each rank holds 1/D of every document's mask area and tokens): per layer
  /// cost::ring_step_time of llm.shard_layer and the shard's K and V. O(docs).
  [[nodiscard]] HETMESH_COMPILED cost::fixed ring_row_time(std::span<const std::int64_t> docs, int degree,
                                                           bool spans_nodes) const;
  /// Whether a ring of `degree` ranks must span nodes (more ranks than a node has).
  [[nodiscard]] bool spans_nodes(int degree) const noexcept { return degree > net.devices_per_node; }
  /// Whether `ring` spans more than one node of `net`.
  [[nodiscard]] bool spans_nodes(std::span<const int> ring) const noexcept { return net.crosses_nodes(ring); }

  /// The model with `moe_layers` of its llm.layers layers running the MoE MLP `moe` over the expert group
  /// `group` (ranks of net, in ep order) in place of a dense MLP of `dense_mlp_per_token` forward time per
  /// token: each layer's T(s) gains (moe_layers / layers) x (moe.even_training(net, group) / llm.train_factor
  /// - the dense MLP's term), so a balancer pricing micro-batches (pack_time, ring_time) sees the experts'
  /// work and their all-to-alls. Errors: moe_layers outside [0, llm.layers], an invalid layer
  /// (invalid_argument). O(group^2).
  [[nodiscard]] HETMESH_COMPILED step_model with_moe(const cost::moe_layer& moe, std::int64_t moe_layers,
                                                     std::span<const int> group,
                                                     double dense_mlp_per_token = 0.0) const;

  friend bool operator==(const step_model&, const step_model&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// One task of a step: its ranks (one, or a ring), its global order key and its modelled duration.
struct task {
  std::vector<int> ranks;  ///< one rank, or a ring
  std::int64_t order = 0;  ///< global order key: ranks run tasks by it
  cost::fixed duration{};  ///< modelled duration
  friend bool operator==(const task&, const task&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// The simulated step: when each rank finishes, how long it computed, and the step time.
struct timeline {
  cost::fixed step{};                  ///< modelled step time (the last finish)
  std::vector<cost::fixed> busy;       ///< per rank: sum of its task durations
  std::vector<cost::fixed> finish;     ///< per rank: when its last task ends (waits included)
  std::vector<std::int64_t> tasks_on;  ///< per rank: number of tasks (micro-batches)

  /// max busy / mean busy (1 = perfect balance; 0 when there is no work).
  [[nodiscard]] HETMESH_COMPILED double imbalance() const noexcept;
};

/// Runs `tasks` on `ranks` ranks: tasks start in (order, position in `tasks`) order; a task starts when
/// all its ranks are free. With `pp_stages` > 1 every rank is a pipeline: a task occupies it for
/// duration / pp (one stage's share, the stages overlapping in steady state) and each pipeline adds a
/// fill-and-drain bubble of (pp - 1) / pp times its longest task (the 1F1B estimate).
/// Pre: ranks >= 1, every task's ranks distinct and in [0, ranks). Post: step = max finish. Pure;
/// O(T log T + sum of ring sizes). Not collective.
[[nodiscard]] HETMESH_COMPILED timeline simulate(int ranks, std::span<const task> tasks, int pp_stages = 1);

}  // namespace hetmesh::balance

template <>
struct fmt::formatter<hetmesh::balance::step_model> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::step_model& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "step_model({}, {}, kv_bytes_per_token={}, pp={})", m.llm, m.net,
                              m.kv_bytes_per_token, m.pp_stages);
  }
};

template <>
struct fmt::formatter<hetmesh::balance::task> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::task& t, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "task(order={}, ranks={}, duration={})", t.order, t.ranks,
                              t.duration);
  }
};

template <>
struct fmt::formatter<hetmesh::balance::timeline> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::balance::timeline& t, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "timeline(step={} modelled, ranks={}, imbalance={:.4f})", t.step,
                              t.busy.size(), t.imbalance());
  }
};

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED cost::fixed step_model::pack_time(std::span<const std::int64_t> docs) const {
  return llm.packed_row_fixed(docs);
}

HETMESH_COMPILED cost::fixed step_model::ring_time(std::int64_t s, int degree, bool spans_nodes) const {
  return ring_row_time(std::span<const std::int64_t>(&s, 1), degree, spans_nodes);
}

HETMESH_COMPILED cost::fixed step_model::ring_row_time(std::span<const std::int64_t> docs, int degree,
                                                       bool spans_nodes) const {
  if (degree < 1)
    throw_error<invalid_argument>("balance::step_model: ring of {} ranks; expected >= 1", degree);
  if (degree == 1) return pack_time(docs);
  double tokens = 0.0;
  for (auto l : docs) tokens += static_cast<double>(l);
  const double d = static_cast<double>(degree);
  const double per_layer =
      cost::ring_step_time(spans_nodes ? net.inter() : net.intra(), degree, llm.shard_layer(docs, degree),
                           kv_bytes_per_token * tokens / d);
  return cost::fixed::from_units(llm.scale() * per_layer +
                                 static_cast<double>(llm.layers) * d * ring_step_overhead);
}

HETMESH_COMPILED step_model step_model::with_moe(const cost::moe_layer& moe, std::int64_t moe_layers,
                                                 std::span<const int> group,
                                                 double dense_mlp_per_token) const {
  if (moe_layers < 0 || moe_layers > llm.layers)
    throw_error<invalid_argument>(
        "balance::step_model::with_moe: {} MoE layers of {}; expected 0 <= n <= layers", moe_layers,
        llm.layers);
  const auto t = moe.even_training(net, group);
  const double f = static_cast<double>(moe_layers) / static_cast<double>(llm.layers);
  step_model m = *this;
  m.llm.layer.a += f * t.a / llm.train_factor;
  m.llm.layer.b += f * (t.b / llm.train_factor - dense_mlp_per_token);
  m.llm.layer.c += f * t.c / llm.train_factor;
  return m;
}

HETMESH_COMPILED void step_model::hash_append(hasher& h) const {
  append_all(h, llm, net, kv_bytes_per_token, pp_stages);
  if (ring_step_overhead != 0.0) append(h, ring_step_overhead);  // hashes of models without it unchanged
}

HETMESH_COMPILED void task::hash_append(hasher& h) const { append_all(h, ranks, order, duration); }

HETMESH_COMPILED double timeline::imbalance() const noexcept {
  if (busy.empty()) return 0.0;
  double sum = 0.0;
  double mx = 0.0;
  for (auto b : busy) {
    sum += b.units();
    mx = std::max(mx, b.units());
  }
  return sum > 0.0 ? mx * static_cast<double>(busy.size()) / sum : 0.0;
}

HETMESH_COMPILED timeline simulate(int ranks, std::span<const task> tasks, int pp_stages) {
  if (ranks < 1) throw_error<invalid_argument>("balance::simulate: {} ranks; expected >= 1", ranks);
  if (pp_stages < 1)
    throw_error<invalid_argument>("balance::simulate: pp_stages = {}; expected >= 1", pp_stages);
  std::vector<std::size_t> idx(tasks.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  hetmesh::indirect_stable_sort(
      idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return tasks[a].order < tasks[b].order; });
  timeline t;
  const auto n = static_cast<std::size_t>(ranks);
  t.busy.assign(n, cost::fixed{});
  t.finish.assign(n, cost::fixed{});
  t.tasks_on.assign(n, 0);
  std::vector<cost::fixed> longest(n, cost::fixed{});
  for (std::size_t i : idx) {
    const auto& k = tasks[i];
    if (k.ranks.empty())
      throw_error<invalid_argument>("balance::simulate: task {} has no ranks; expected >= 1", i);
    cost::fixed start{};
    for (int r : k.ranks) {
      if (r < 0 || r >= ranks)
        throw_error<invalid_argument>("balance::simulate: task {} names rank {}; expected [0, {})", i, r,
                                      ranks);
      start = std::max(start, t.finish[static_cast<std::size_t>(r)]);
    }
    const cost::fixed share = cost::fixed::from_ticks(k.duration.ticks / pp_stages);
    for (int r : k.ranks) {
      const auto u = static_cast<std::size_t>(r);
      t.finish[u] = start + share;
      t.busy[u] += share;
      t.tasks_on[u] += 1;
      longest[u] = std::max(longest[u], k.duration);
    }
  }
  for (std::size_t r = 0; r < n; ++r) {
    if (pp_stages > 1 && t.tasks_on[r] > 0) {
      const auto bubble = cost::fixed::from_ticks(longest[r].ticks * (pp_stages - 1) / pp_stages);
      t.finish[r] += bubble;
      t.busy[r] += bubble;
    }
    t.step = std::max(t.step, t.finish[r]);
  }
  return t;
}

}  // namespace hetmesh::balance
#endif  // HETMESH_BODIES
