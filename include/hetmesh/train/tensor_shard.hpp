// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: which block of a full tensor a rank holds when a layer splits it over tensor- or
// expert-parallel ranks. check_parity compares such blocks with its 1-rank reference, and a checkpoint
// saves and reshards them by the full tensor's element indices.
#pragma once

#include <cstdint>

namespace hetmesh::train {

/// Which part of a full tensor a rank holds when a layer splits it over tensor (or expert) parallel ranks:
/// the full tensor is rows x cols (row-major), cut into `parts` equal blocks along `axis` (0: by rows, as a
/// row-parallel weight or a vocabulary shard; 1: by columns, as a column-parallel weight), and this is
/// block `part`. The default (rows = 0) is a whole tensor.
struct tensor_shard {
  std::int64_t rows = 0;  ///< the full tensor's rows (0: the tensor is whole)
  std::int64_t cols = 1;  ///< its columns
  int axis = 0;           ///< 0: split by rows; 1: by columns
  int part = 0;           ///< this block's index
  int parts = 1;          ///< blocks

  /// Elements of the full tensor.
  [[nodiscard]] constexpr std::int64_t full_size() const noexcept { return rows * cols; }
  /// The full tensor's element of this block's element `i` (row-major both). Pre: the block is valid.
  [[nodiscard]] constexpr std::int64_t global(std::int64_t i) const noexcept {
    if (rows == 0) return i;
    if (axis == 0) return (part * (rows / parts)) * cols + i;
    const auto lc = cols / parts;
    return (i / lc) * cols + part * lc + i % lc;
  }
  friend constexpr bool operator==(const tensor_shard&, const tensor_shard&) = default;
};

}  // namespace hetmesh::train
