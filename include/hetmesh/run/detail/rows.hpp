// SPDX-License-Identifier: Apache-2.0
// hetmesh::run internals: the row exchange the executors share (reshard, token dispatch, the Ulysses
// exchange). Rows are `width` elements of any trivially copyable type; element types the communicators
// know travel as themselves, others as bytes. Buffers live in a memory policy's space
// (model/memory_policy.hpp; host vectors for the calls without one): packing and unpacking go through the
// policy's copies, and only plans, counts and displacements are host data.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../../balance/reshard.hpp"
#include "../../comm/collectives.hpp"
#include "../../core/error.hpp"
#include "../../model/host_memory.hpp"

namespace hetmesh::run::detail {

/// Exclusive prefix sums of `counts`. O(n).
[[nodiscard]] HETMESH_COMPILED std::vector<std::int64_t> prefix(std::span<const std::int64_t> counts)
#if HETMESH_BODIES
{
  std::vector<std::int64_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}
#else
    ;
#endif

/// comm::all_to_all_v over buffers of `c`'s memory space of any trivially copyable T (counts and
/// displacements in elements of T, host arrays): a comm::element travels typed, anything else as bytes
/// (the buffers are reinterpreted, never read here). Collective over `c`.
template <comm::communicator C, class T>
void all_to_all_v_any(C& c, std::span<const T> send, std::span<const std::int64_t> sc,
                      std::span<const std::int64_t> sd, std::span<T> recv, std::span<const std::int64_t> rc,
                      std::span<const std::int64_t> rd) {
  static_assert(std::is_trivially_copyable_v<T>, "rows are moved as bytes: T must be trivially copyable");
  if constexpr (comm::element<T>) {
    comm::all_to_all_v(c, send, sc, sd, recv, rc, rd);
  } else {
    constexpr auto b = static_cast<std::int64_t>(sizeof(T));
    auto scale = [](std::span<const std::int64_t> v) {
      std::vector<std::int64_t> out(v.begin(), v.end());
      for (auto& x : out) x *= b;
      return out;
    };
    const auto bsc = scale(sc), bsd = scale(sd), brc = scale(rc), brd = scale(rd);
    const std::span<const std::uint8_t> sb(reinterpret_cast<const std::uint8_t*>(send.data()),
                                           send.size_bytes());
    const std::span<std::uint8_t> rb(reinterpret_cast<std::uint8_t*>(recv.data()), recv.size_bytes());
    comm::all_to_all_v(c, sb, std::span<const std::int64_t>(bsc), std::span<const std::int64_t>(bsd), rb,
                       std::span<const std::int64_t>(brc), std::span<const std::int64_t>(brd));
  }
}

/// Moves rows by a reshard plan: every run naming this rank as sender is packed from `src` into a send
/// buffer of `mem`, one all_to_all_v, every run naming it as receiver is unpacked into `dst`; `src`, `dst`
/// live in `mem`'s space (the communicator's, checked by the caller) and every copy is one mem.copy per run.
/// `op` prefixes errors. Collective over `c` (c.size() == plan.ranks, checked by the caller). Throws
/// invalid_argument naming the op, the rank and the rows when a run falls outside a buffer (a source
/// run before the exchange, a destination run after it). O(rows * width) copied plus the exchange.
template <comm::communicator C, model::memory_policy M, class T>
void move_rows(C& c, M& mem, const balance::reshard_plan& plan, std::span<const T> src, std::span<T> dst,
               std::int64_t width, std::string_view op) {
  const auto n = static_cast<std::size_t>(plan.ranks);
  const auto me = static_cast<std::size_t>(c.rank());
  const auto w = static_cast<std::size_t>(width);
  std::vector<std::int64_t> sc(n), rc(n);
  for (std::size_t j = 0; j < n; ++j) {
    sc[j] = plan.counts[me * n + j] * width;
    rc[j] = plan.counts[j * n + me] * width;
  }
  typename M::template buffer<T> send, recv;
  send.resize(static_cast<std::size_t>(std::accumulate(sc.begin(), sc.end(), std::int64_t{0})));
  recv.resize(static_cast<std::size_t>(std::accumulate(rc.begin(), rc.end(), std::int64_t{0})));
  const std::span<T> s = send.span(), rv = recv.span();
  std::size_t at = 0;  // runs from this rank, packed in plan order
  for (const auto& r : plan.runs) {
    if (static_cast<std::size_t>(r.src) != me) continue;
    const auto b = static_cast<std::size_t>(r.src_offset) * w, len = static_cast<std::size_t>(r.rows) * w;
    if (r.src_offset < 0 || b + len > src.size())
      throw_error<invalid_argument>(
          "{}: rank {} reads rows [{}, {}) of its source buffer of {} rows; expected the buffer to hold "
          "every row the plan sends from it",
          op, me, r.src_offset, r.src_offset + r.rows, src.size() / w);
    if (len == 0) continue;
    mem.copy(s.subspan(at, len), src.subspan(b, len));
    at += len;
  }
  const auto sd = prefix(sc), rd = prefix(rc);
  all_to_all_v_any(c, std::span<const T>(s), std::span<const std::int64_t>(sc),
                   std::span<const std::int64_t>(sd), rv, std::span<const std::int64_t>(rc),
                   std::span<const std::int64_t>(rd));
  // Runs into this rank arrive in the sender's packing order: plan order restricted to dst == me.
  std::vector<std::int64_t> cursor(rd);
  for (const auto& r : plan.runs) {
    if (static_cast<std::size_t>(r.dst) != me) continue;
    const auto b = static_cast<std::size_t>(r.dst_offset) * w, len = static_cast<std::size_t>(r.rows) * w;
    if (r.dst_offset < 0 || b + len > dst.size())
      throw_error<invalid_argument>(
          "{}: rank {} writes rows [{}, {}) of its destination buffer of {} rows; expected the buffer to "
          "hold every row the plan sends to it",
          op, me, r.dst_offset, r.dst_offset + r.rows, dst.size() / w);
    if (len == 0) continue;
    auto& from = cursor[static_cast<std::size_t>(r.src)];
    mem.copy(dst.subspan(b, len), std::span<const T>(rv.subspan(static_cast<std::size_t>(from), len)));
    from += static_cast<std::int64_t>(len);
  }
}

/// move_rows over host buffers (model::host_memory), for host communicators. Same contract.
template <comm::host_communicator C, class T>
void move_rows(C& c, const balance::reshard_plan& plan, std::span<const T> src, std::span<T> dst,
               std::int64_t width, std::string_view op) {
  model::host_memory mem;
  move_rows(c, mem, plan, src, dst, width, op);
}

}  // namespace hetmesh::run::detail
