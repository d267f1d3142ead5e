// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm internals for the MPI backend: the cross-rank signature check of a collective
// (options::verify). Each rank writes what it passed (the operation, dtype, count, root, reduce_op and up
// to two per-rank count arrays) into one fixed-width row; after an all-gather of the rows every rank
// compares them the same way and raises the same mismatch_error. Plain data: no MPI call here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "../../core/error.hpp"
#include "../dtype.hpp"
#include "../reduce_op.hpp"

namespace hetmesh::comm::mpi::detail {

/// Entries of one rank's signature row in a group of n ranks: five fields, then two arrays of n counts.
[[nodiscard]] constexpr std::size_t signature_width(std::size_t n) noexcept { return 5 + 2 * n; }

/// This rank's signature row: (op_code, dtype, count, root, reduce_op, a..., b...), each array padded
/// with zeros to n entries. Pre: a.size(), b.size() <= n. O(n).
[[nodiscard]] inline std::vector<std::int64_t> make_signature(std::int64_t op_code, dtype t,
                                                              std::int64_t count, int root, reduce_op r,
                                                              std::span<const std::int64_t> a,
                                                              std::span<const std::int64_t> b,
                                                              std::size_t n) {
  std::vector<std::int64_t> mine(signature_width(n), 0);
  mine[0] = op_code, mine[1] = static_cast<std::int64_t>(t), mine[2] = count, mine[3] = root;
  mine[4] = static_cast<std::int64_t>(r);
  std::copy(a.begin(), a.end(), mine.begin() + 5);
  std::copy(b.begin(), b.end(), mine.begin() + 5 + static_cast<std::ptrdiff_t>(n));
  return mine;
}

/// Compares the gathered rows `all` (rank-major, signature_width(n) each) of collective `op` over n ranks:
/// the five fields must agree with rank 0's (but the count of the -v collectives, whose counts are per
/// rank); all_gather_v's recv_counts must agree on every rank and match each sender's count; all_to_all_v's
/// send_counts[j] on rank i must equal recv_counts[i] on rank j. Throws mismatch_error, its message
/// starting with where(), on the first disagreement. O(n^2).
template <class Where>
void check_signatures(std::span<const std::int64_t> all, std::size_t n, std::string_view name,
                      Where&& where) {
  const std::size_t w = signature_width(n);
  auto at = [&](std::size_t rank, std::size_t i) { return all[rank * w + i]; };
  static constexpr const char* fields[] = {"collective", "dtype", "count", "root", "reduce_op"};
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t f = 0; f < 5; ++f) {
      if (f == 2 && (name == "all_gather_v" || name == "all_to_all_v")) continue;  // per-rank counts, below
      if (at(j, f) != at(0, f))
        throw_error<mismatch_error>(
            "{}: rank {} passed {} {} while rank 0 passed {}; expected every rank to call the "
            "same collective with the same {}",
            where(), j, fields[f], at(j, f), at(0, f), fields[f]);
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (name == "all_gather_v" && (at(j, 5 + i) != at(0, 5 + i) || at(j, 5 + i) != at(i, 2)))
        throw_error<mismatch_error>(
            "{}: rank {} expects {} elements from rank {}, which sends {}; expected recv_counts "
            "equal on every rank and matching the send counts",
            where(), j, at(j, 5 + i), i, at(i, 2));
      if (name == "all_to_all_v" && at(j, 5 + i) != at(i, 5 + n + j))
        throw_error<mismatch_error>(
            "{}: rank {} sends {} elements to rank {}, which expects {}; expected send_counts[j] "
            "on rank i to equal recv_counts[i] on rank j",
            where(), j, at(j, 5 + i), i, at(i, 5 + n + j));
    }
  }
}

}  // namespace hetmesh::comm::mpi::detail
