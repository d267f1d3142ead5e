// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm: communicators for groups, created once and cached. A group is an ordered list of
// ranks of a parent communicator (for a mesh, `mesh.group_of(rank, dims)`; with the world as parent,
// parent ranks are global ranks). The cache is keyed by that list, so it needs nothing from the mesh.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../config.hpp"
#include "../core/sort.hpp"
#include "collectives.hpp"
#include "communicator.hpp"

namespace hetmesh::comm {

/// A communicator that can create a communicator over a subset of its ranks, collectively over
/// those ranks only (loopback, mpi via MPI_Comm_create_group).
template <class C>
concept subgroup_communicator = communicator<C> && requires(const C& c, std::span<const int> members) {
  { c.subgroup(members) } -> std::same_as<C>;
};

/// Splits `c` into communicators of equal `color`, ordered by (key, rank): MPI_Comm_split's contract.
/// Collective over all of c. Uses the backend's split (MPI_Comm_split, ncclCommSplit) when it has one;
/// otherwise gathers (color, key) and calls subgroup. Pre: color >= 0.
template <communicator C>
[[nodiscard]] C split(C& c, int color, int key) {
  if (color < 0)
    throw_error<invalid_argument>(
        "split on {}: color {} is negative; expected >= 0 (every rank joins a group)", describe(c), color);
  if constexpr (requires {
                  { c.split(color, key) } -> std::same_as<C>;
                }) {
    return c.split(color, key);
  } else {
    static_assert(subgroup_communicator<C>,
                  "split needs a backend with split(color, key) or subgroup(members)");
    const std::int64_t mine[2] = {color, key};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(c.size()));
    all_gather(c, std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    std::vector<int> members;
    for (int r = 0; r < c.size(); ++r)
      if (all[2 * static_cast<std::size_t>(r)] == color) members.push_back(r);
    hetmesh::indirect_stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return all[2 * static_cast<std::size_t>(a) + 1] < all[2 * static_cast<std::size_t>(b) + 1];
    });
    return c.subgroup(std::span<const int>(members));
  }
}

namespace detail {
/// Checks that `members` is a non-empty set of distinct ranks of the group `parent`; `what` names the caller.
HETMESH_COMPILED void check_group(group_view parent, std::span<const int> members, std::string_view what)
#if HETMESH_BODIES
{
  if (members.empty())
    throw_error<invalid_argument>("{} on {}: empty group; expected at least one rank", what,
                                  describe(parent));
  std::vector<int> sorted(members.begin(), members.end());
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() < 0 || sorted.back() >= parent.size)
    throw_error<invalid_argument>("{} on {}: group [{}] has a rank outside [0, {})", what, describe(parent),
                                  fmt::join(members, ","), parent.size);
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw_error<invalid_argument>("{} on {}: group [{}] repeats a rank; expected distinct ranks", what,
                                  describe(parent), fmt::join(members, ","));
}
#else
    ;
#endif

/// check_group over the group of `parent`.
template <communicator C>
void check_group(const C& parent, std::span<const int> members, std::string_view what) {
  check_group(view_of(parent), members, what);
}
}  // namespace detail

/// Communicators for groups of one parent, each created on first use and reused afterwards.
/// Not thread-safe: one cache per rank (per thread on loopback). The parent must outlive the cache.
template <communicator C>
class group_cache {
 public:
  /// A cache over `parent`, which must outlive it. Creates no communicator yet.
  explicit group_cache(C& parent) : parent_(&parent) {}

  /// The parent communicator, for operations over the whole group.
  [[nodiscard]] C& parent() noexcept { return *parent_; }

  /// The communicator of `members` (ranks of the parent, in group order), which must contain this
  /// rank. First call: collective over the members (subgroup); later calls: a map lookup, no
  /// communication. The parent's own rank order returns the parent itself.
  C& get(std::span<const int> members) requires subgroup_communicator<C> {
    detail::check_group(*parent_, members, "group_cache::get");
    if (std::find(members.begin(), members.end(), parent_->rank()) == members.end())
      throw_error<invalid_argument>(
          "group_cache::get on {}: group [{}] does not contain this rank; expected a group "
          "this rank belongs to",
          describe(*parent_), fmt::join(members, ","));
    if (is_parent_order(members)) return *parent_;
    std::vector<int> key(members.begin(), members.end());
    auto it = groups_.find(key);
    if (it == groups_.end())
      it = groups_.emplace(std::move(key), std::make_unique<C>(parent_->subgroup(members))).first;
    return *it->second;
  }

  /// The communicator of this rank's group in `partition` (groups that cover every parent rank exactly
  /// once, e.g. `mesh.groups(dims)`). First call for a partition: collective over the whole parent
  /// (one split; this is the path for NCCL, whose ncclCommSplit involves every rank); later calls: a
  /// lookup. Every rank must pass the same partition, in the same sequence of calls.
  C& get_partition(std::span<const std::vector<int>> partition) {
    std::vector<int> owner(static_cast<std::size_t>(parent_->size()), -1);
    for (std::size_t g = 0; g < partition.size(); ++g) {
      detail::check_group(*parent_, partition[g], "group_cache::get_partition");
      for (const int r : partition[g]) {
        if (owner[static_cast<std::size_t>(r)] >= 0)
          throw_error<invalid_argument>(
              "group_cache::get_partition on {}: rank {} is in groups {} and {}; expected "
              "each rank in exactly one group",
              describe(*parent_), r, owner[static_cast<std::size_t>(r)], g);
        owner[static_cast<std::size_t>(r)] = static_cast<int>(g);
      }
    }
    for (std::size_t r = 0; r < owner.size(); ++r)
      if (owner[r] < 0)
        throw_error<invalid_argument>(
            "group_cache::get_partition on {}: rank {} is in no group; expected the groups "
            "to cover every rank",
            describe(*parent_), r);
    const int g = owner[static_cast<std::size_t>(parent_->rank())];
    const std::vector<int>& mine = partition[static_cast<std::size_t>(g)];
    std::vector<std::vector<int>> key(partition.begin(), partition.end());
    if (partitions_.contains(key) || is_parent_order(mine)) {
      partitions_.emplace(std::move(key), 0);
      return lookup(mine);
    }
    const auto pos = std::find(mine.begin(), mine.end(), parent_->rank()) - mine.begin();
    C child = comm::split(*parent_, g, static_cast<int>(pos));
    partitions_.emplace(std::move(key), 0);
    auto it = groups_.find(mine);
    if (it == groups_.end()) it = groups_.emplace(mine, std::make_unique<C>(std::move(child))).first;
    return *it->second;
  }

  /// Number of cached communicators (the parent not counted).
  [[nodiscard]] std::size_t size() const noexcept { return groups_.size(); }
  /// Whether the communicator of `members` was created already (no communicator is created).
  /// Cost: O(members x log size).
  [[nodiscard]] bool contains(std::span<const int> members) const {
    return groups_.contains(std::vector<int>(members.begin(), members.end()));
  }

 private:
  bool is_parent_order(std::span<const int> members) const {
    if (static_cast<int>(members.size()) != parent_->size()) return false;
    for (std::size_t i = 0; i < members.size(); ++i)
      if (members[i] != static_cast<int>(i)) return false;
    return true;
  }
  C& lookup(const std::vector<int>& members) {
    if (is_parent_order(members)) return *parent_;
    return *groups_.at(members);
  }

  C* parent_;
  // unique_ptr: references handed out stay valid, and C need not be default-constructible.
  std::map<std::vector<int>, std::unique_ptr<C>> groups_;
  std::map<std::vector<std::vector<int>>, int> partitions_;
};

}  // namespace hetmesh::comm
