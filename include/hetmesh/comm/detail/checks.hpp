// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm internals: the local (non-communicating) argument checks every collective runs
// before it reaches a backend, so each backend sees well-formed calls and bad input fails the same
// way everywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

#include "../../config.hpp"
#include "../../core/error.hpp"
#include "../../core/numeric.hpp"
#include "../communicator.hpp"

namespace hetmesh::comm::detail {

template <communicator C>
void check_peer(const C& c, std::string_view op, int peer, std::string_view what = "peer") {
  if (peer < 0 || peer >= c.size())
    throw_error<invalid_argument>("{} on {}: {} {} is out of range; expected 0 <= {} < {}", op, describe(c),
                                  what, peer, what, c.size());
}

template <communicator C>
void check_tag(const C& c, std::string_view op, int tag) {
  if (tag < 0 || tag > max_user_tag)
    throw_error<invalid_argument>("{} on {}: tag {} is out of range; expected 0 <= tag <= {}", op,
                                  describe(c), tag, max_user_tag);
}

template <communicator C>
void check_size(const C& c, std::string_view op, std::string_view what, std::size_t got, std::size_t expected,
                std::string_view why) {
  if (got != expected)
    throw_error<invalid_argument>("{} on {}: {} holds {} elements; expected {} ({})", op, describe(c), what,
                                  got, expected, why);
}

/// True when [a, a+na) and [b, b+nb) share a byte. Pointers are compared as integers, which is what
/// a flat (host or unified device) address space means.
template <class T>
[[nodiscard]] bool overlaps(const T* a, std::size_t na, const T* b, std::size_t nb) noexcept {
  if (na == 0 || nb == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + nb * sizeof(T) && pb < pa + na * sizeof(T);
}

/// Send and receive buffers may not overlap, except that the send buffer may sit exactly at
/// `in_place` (the caller's own slot of the receive buffer, as MPI_IN_PLACE and NCCL's in-place
/// convention allow).
template <communicator C, class T>
void check_no_overlap(const C& c, std::string_view op, std::span<const T> send, std::span<T> recv,
                      const T* in_place = nullptr) {
  if (send.data() == in_place && send.data() != nullptr) return;
  if (overlaps(send.data(), send.size(), static_cast<const T*>(recv.data()), recv.size()))
    throw_error<invalid_argument>(
        "{} on {}: the send and receive buffers overlap; expected disjoint buffers{}", op, describe(c),
        in_place != nullptr ? " or the send buffer exactly at this rank's slot of the receive buffer" : "");
}

/// Checks one side of a v-collective's layout: `counts` and `displs` have one entry per rank of `g`,
/// are non-negative, and every block [displs[j], displs[j]+counts[j]) lies inside a buffer of `extent`
/// elements.
HETMESH_COMPILED void check_layout(group_view g, std::string_view op, std::string_view side,
                                   std::span<const std::int64_t> counts, std::span<const std::int64_t> displs,
                                   std::size_t extent)
#if HETMESH_BODIES
{
  const auto n = static_cast<std::size_t>(g.size);
  if (counts.size() != n || displs.size() != n)
    throw_error<invalid_argument>(
        "{} on {}: {} counts/displacements have {}/{} entries; expected one per rank ({})", op, describe(g),
        side, counts.size(), displs.size(), n);
  for (std::size_t j = 0; j < n; ++j) {
    if (counts[j] < 0 || displs[j] < 0 ||
        static_cast<std::uint64_t>(displs[j]) + static_cast<std::uint64_t>(counts[j]) > extent)
      throw_error<invalid_argument>(
          "{} on {}: {} block for rank {} is [{}, {}+{}) in a buffer of {} elements; expected non-negative "
          "counts and displacements inside the buffer",
          op, describe(g), side, j, displs[j], displs[j], counts[j], extent);
  }
}
#else
    ;
#endif

/// check_layout over `c`'s group.
template <communicator C>
void check_layout(const C& c, std::string_view op, std::string_view side,
                  std::span<const std::int64_t> counts, std::span<const std::int64_t> displs,
                  std::size_t extent) {
  check_layout(view_of(c), op, side, counts, displs, extent);
}

/// Exclusive prefix sums: the displacements of packed blocks.
[[nodiscard]] inline std::vector<std::int64_t> prefix_displs(std::span<const std::int64_t> counts) {
  auto displs = prefix_sums(counts);
  displs.pop_back();
  return displs;
}

}  // namespace hetmesh::comm::detail
