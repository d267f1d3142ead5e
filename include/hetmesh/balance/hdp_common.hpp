// SPDX-License-Identifier: Apache-2.0
// hetmesh::balance: what every HDP balancer shares: the modelled per-rank time of an HDP work item,
// the tasks of a plan (for the step simulator), and the deadlock check of a plan's execution order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../seq/hdp.hpp"
#include "model.hpp"

namespace hetmesh::balance {

/// Modelled per-rank time of an HDP item on `ring` (a pack: one rank; a long sequence: its ring).
/// With an empty ring the node span is estimated from the degree (a ring larger than a node spans
/// nodes). O(documents).
[[nodiscard]] inline cost::fixed hdp_item_time(const seq::hdp_item& it, const step_model& m,
                                               std::span<const int> ring = {}) {
  if (it.packed) {
    std::vector<std::int64_t> docs;
    docs.reserve(it.seqs.size());
    for (const auto& s : it.seqs) docs.push_back(s.length);
    return m.pack_time(docs);
  }
  const bool spans = ring.empty() ? m.spans_nodes(it.degree) : m.spans_nodes(ring);
  return m.ring_time(it.seqs.front().length, it.degree, spans);
}

/// The tasks of an HDP plan: one per item, on its ring, at its order key, priced by `m`. O(items).
[[nodiscard]] HETMESH_COMPILED std::vector<task> tasks_of(const seq::hdp_plan& plan, const step_model& m);

/// Checks that executing `plan` cannot deadlock: every rank runs its micro-batches in its listed order,
/// a ring micro-batch blocks until all ring members reach it. Replays the step and throws
/// hetmesh::error naming the stuck ranks and their next items if some ring can never start; also
/// checks that every item appears on exactly its ring's ranks, once each.
/// Pre: a plan from seq::hdp_assemble. Pure; O(total micro-batches). Not collective.
HETMESH_COMPILED void verify_deadlock_free(const seq::hdp_plan& plan);

namespace detail {

/// Least-loaded rank selection over a pool: a sorted set of (finish time, rank).
class load_set {
 public:
  explicit load_set(int ranks) : finish_(static_cast<std::size_t>(ranks)) {
    for (int r = 0; r < ranks; ++r) set_.emplace(cost::fixed{}, r);
  }
  /// Ranks already busy until `finish` (ticks), rank r until finish[r].
  explicit load_set(std::span<const std::int64_t> finish) : finish_(finish.size()) {
    for (std::size_t r = 0; r < finish.size(); ++r) {
      finish_[r] = cost::fixed::from_ticks(finish[r]);
      set_.emplace(finish_[r], static_cast<int>(r));
    }
  }
  [[nodiscard]] cost::fixed finish(int r) const { return finish_[static_cast<std::size_t>(r)]; }
  [[nodiscard]] cost::fixed max() const { return set_.rbegin()->first; }
  /// The k least-loaded ranks (ties: lowest rank), skipping those `skip` marks.
  [[nodiscard]] HETMESH_COMPILED std::vector<int> least(int k, const std::vector<char>* skip = nullptr) const;
  /// Ranks whose finish is below `threshold`, least loaded first.
  [[nodiscard]] HETMESH_COMPILED std::vector<int> below(cost::fixed threshold) const;
  [[nodiscard]] std::vector<int> all() const { return below(cost::fixed::max()); }
  /// Runs a task of `duration` on `ring`: it starts when the last member is free. Returns the start.
  HETMESH_COMPILED cost::fixed run(std::span<const int> ring, cost::fixed duration);

 private:
  std::vector<cost::fixed> finish_;
  std::set<std::pair<cost::fixed, int>> set_;
};

}  // namespace detail

}  // namespace hetmesh::balance

#if HETMESH_BODIES

namespace hetmesh::balance {

HETMESH_COMPILED std::vector<task> tasks_of(const seq::hdp_plan& plan, const step_model& m) {
  std::vector<task> out;
  out.reserve(plan.sharding.items.size());
  for (std::size_t i = 0; i < plan.sharding.items.size(); ++i) {
    const auto& pl = plan.placement[i];
    out.push_back(task{pl.ring, pl.order, hdp_item_time(plan.sharding.items[i], m, pl.ring)});
  }
  // The simulator breaks order ties by position; the plan breaks them by item index: same thing here.
  return out;
}

HETMESH_COMPILED void verify_deadlock_free(const seq::hdp_plan& plan) {
  const std::size_t n = plan.per_rank.size();
  const std::size_t items = plan.sharding.items.size();
  std::vector<int> members_seen(items, 0);
  for (std::size_t r = 0; r < n; ++r)
    for (const auto& mb : plan.per_rank[r]) {
      const auto i = static_cast<std::size_t>(mb.item);
      if (mb.item < 0 || i >= items)
        throw_error<invalid_argument>(
            "verify_deadlock_free: rank {} lists item {}; "
            "expected an item in [0, {})",
            r, mb.item, items);
      const auto& ring = plan.placement[i].ring;
      if (mb.ring_position < 0 || static_cast<std::size_t>(mb.ring_position) >= ring.size() ||
          ring[static_cast<std::size_t>(mb.ring_position)] != static_cast<int>(r))
        throw_error<invalid_argument>(
            "verify_deadlock_free: rank {} runs item {} at ring position {}, but the ring "
            "is {}; expected the rank at that position",
            r, mb.item, mb.ring_position, ring);
      ++members_seen[i];
    }
  for (std::size_t i = 0; i < items; ++i)
    if (members_seen[i] != static_cast<int>(plan.placement[i].ring.size()))
      throw_error<invalid_argument>(
          "verify_deadlock_free: item {} is listed by {} ranks; expected its ring of {}", i, members_seen[i],
          plan.placement[i].ring.size());
  // Replay: an item runs when it is at the head of every member's list.
  std::vector<std::size_t> head(n, 0);
  std::vector<int> arrived(items, 0);
  std::vector<std::size_t> ready;
  auto arrive = [&](std::size_t r) {
    if (head[r] >= plan.per_rank[r].size()) return;
    const auto i = static_cast<std::size_t>(plan.per_rank[r][head[r]].item);
    if (++arrived[i] == static_cast<int>(plan.placement[i].ring.size())) ready.push_back(i);
  };
  for (std::size_t r = 0; r < n; ++r) arrive(r);
  std::size_t done = 0;
  while (!ready.empty()) {
    const std::size_t i = ready.back();
    ready.pop_back();
    ++done;
    for (int r : plan.placement[i].ring) {
      ++head[static_cast<std::size_t>(r)];
      arrive(static_cast<std::size_t>(r));
    }
  }
  if (done != items) {
    std::vector<std::string> stuck;
    for (std::size_t r = 0; r < n && stuck.size() < 8; ++r)
      if (head[r] < plan.per_rank[r].size())
        stuck.push_back(hetmesh::format("rank {} waits in item {}", r, plan.per_rank[r][head[r]].item));
    throw_error<error>(
        "verify_deadlock_free: the plan deadlocks after {} of {} items ({}); expected every ring's "
        "members to run shared rings in the same relative order",
        done, items, fmt::join(stuck, "; "));
  }
}

}  // namespace hetmesh::balance

namespace hetmesh::balance::detail {

HETMESH_COMPILED std::vector<int> load_set::least(int k, const std::vector<char>* skip) const {
  std::vector<int> out;
  for (auto it = set_.begin(); it != set_.end() && static_cast<int>(out.size()) < k; ++it)
    if (skip == nullptr || !(*skip)[static_cast<std::size_t>(it->second)]) out.push_back(it->second);
  return out;
}

HETMESH_COMPILED std::vector<int> load_set::below(cost::fixed threshold) const {
  std::vector<int> out;
  for (auto it = set_.begin(); it != set_.end() && it->first < threshold; ++it) out.push_back(it->second);
  return out;
}

HETMESH_COMPILED cost::fixed load_set::run(std::span<const int> ring, cost::fixed duration) {
  cost::fixed start{};
  for (int r : ring) start = std::max(start, finish(r));
  for (int r : ring) {
    set_.erase({finish(r), r});
    finish_[static_cast<std::size_t>(r)] = start + duration;
    set_.emplace(start + duration, r);
  }
  return start;
}

}  // namespace hetmesh::balance::detail
#endif  // HETMESH_BODIES
