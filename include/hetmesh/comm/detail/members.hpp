// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm internals: what every backend communicator reports about its group (requirements 2
// and 3 of the communicator concept), held once for the mpi and nccl backends.
#pragma once

#include <span>
#include <utility>
#include <vector>

namespace hetmesh::comm::detail {

/// This rank's position in the group and the group's global ranks, in group order. A backend
/// communicator derives from it; it is move-only, as a communicator owns a backend handle.
class group_members {
 public:
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(ranks_.size()); }
  [[nodiscard]] std::span<const int> ranks() const noexcept { return ranks_; }

 protected:
  group_members() = default;
  group_members(int rank, std::vector<int> ranks) : rank_(rank), ranks_(std::move(ranks)) {}
  group_members(group_members&&) noexcept = default;
  group_members& operator=(group_members&&) noexcept = default;
  group_members(const group_members&) = delete;
  group_members& operator=(const group_members&) = delete;
  ~group_members() = default;

  int rank_ = 0;
  std::vector<int> ranks_;  ///< global rank of each group member; ranks_[rank_] is this rank's
};

}  // namespace hetmesh::comm::detail
