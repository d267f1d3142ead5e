// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: the causal halo exchange, forward and backward, over a group's communicator. The plan
// (seq/halo.hpp) says which local rows every member sends to which and which halo rows it fills; forward
// copies rows of x [tokens][width] into the halo buffer [halo_rows][width] of the members that read them,
// backward returns the halo's gradient rows to the members that own them and adds them into their dx. One
// batch of point-to-point operations per call (comm::group_p2p) with one tag: a call is collective over the
// group's members (each calls it for the same micro-batch, in the same order as the others' calls), and
// completes when it returns. Buffers go through a memory policy M (model/memory_policy.hpp) of the
// communicator's memory space, so the exchange runs on device memory the same way.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../model/memory_policy.hpp"
#include "../seq/halo.hpp"

namespace hetmesh::run {

/// The tag of halo exchanges (ring attention's default is 0x5a00..0x5a03; calls never overlap in flight).
inline constexpr int halo_tag = 0x5b00;

namespace detail {

HETMESH_COMPILED void check_halo_sizes(const char* who, const seq::halo_plan& p, std::span<const int> ranks,
                                       std::int64_t width, std::size_t x, std::size_t halo)
#if HETMESH_BODIES
{
  if (ranks.size() != p.send.size() || width < 1 || x != static_cast<std::size_t>(p.tokens * width) ||
      halo != static_cast<std::size_t>(p.halo_rows * width))
    throw_error<invalid_argument>(
        "run::{}: {} member ranks, width {}, {} local and {} halo elements; expected {} ranks (one per "
        "member "
        "of the plan), width >= 1, {} x width local and {} x width halo elements",
        who, ranks.size(), width, x, halo, p.send.size(), p.tokens, p.halo_rows);
}
#else
    ;
#endif

// Packs rows `rows` of `src` [..][width] into `dst` [rows.size()][width], one copy per row.
template <class T, class M>
void pack_rows(const M& mem, std::span<const std::int64_t> rows, std::int64_t width, std::span<const T> src,
               std::span<T> dst) {
  const auto w = static_cast<std::size_t>(width);
  for (std::size_t i = 0; i < rows.size(); ++i)
    mem.copy(dst.subspan(i * w, w), src.subspan(static_cast<std::size_t>(rows[i]) * w, w));
}

// One batch of the exchange: to member m the rows `out[m]` of `src`, from member m `in[m].size()` rows;
// returns what came, per member ([in[m].size()][width]). The two directions of halo_forward and
// halo_backward are this with the lists swapped.
template <comm::communicator C, class T, class M>
std::vector<typename M::template buffer<T>> exchange_rows(C& c, std::span<const int> ranks,
                                                          const std::vector<std::vector<std::int64_t>>& out,
                                                          const std::vector<std::vector<std::int64_t>>& in,
                                                          std::int64_t width, std::span<const T> src,
                                                          const M& mem, int tag) {
  const auto n = ranks.size();
  const auto w = static_cast<std::size_t>(width);
  std::vector<typename M::template buffer<T>> sent(n), got(n);
  std::vector<comm::p2p_op> ops;
  for (std::size_t m = 0; m < n; ++m) {
    if (const auto rows = out[m].size(); rows > 0) {
      sent[m].resize(rows * w);
      pack_rows(mem, std::span<const std::int64_t>(out[m]), width, src, sent[m].span());
      ops.push_back(comm::send_op(std::span<const T>(sent[m].span()), ranks[m], tag));
    }
    if (const auto rows = in[m].size(); rows > 0) {
      got[m].resize(rows * w);
      ops.push_back(comm::recv_op(got[m].span(), ranks[m], tag));
    }
  }
  comm::group_p2p(c, std::span<const comm::p2p_op>(ops));
  return got;
}

}  // namespace detail

/// Forward of the halo exchange of plan `p` (the caller is member p.me): fills `halo` [p.halo_rows][width]
/// with the rows the plan names from the other members' x, and sends the caller's rows of `x`
/// [p.tokens][width] that the others read. `ranks[m]` is member m's rank in `c`. Collective over the group's
/// members (those with rows to exchange take part; the others return at once). Errors: sizes that do not
/// match the plan (invalid_argument); the communicator's. Cost: one p2p batch, one copy per row exchanged.
template <comm::communicator C, class T, model::memory_policy M>
void halo_forward(C& c, std::span<const int> ranks, const seq::halo_plan& p, std::int64_t width,
                  std::span<const T> x, std::span<T> halo, const M& mem, int tag = halo_tag) {
  detail::check_halo_sizes("halo_forward", p, ranks, width, x.size(), halo.size());
  if (p.local_only()) return;
  const auto w = static_cast<std::size_t>(width);
  const auto got = detail::exchange_rows(c, ranks, p.send, p.recv, width, x, mem, tag);
  for (std::size_t m = 0; m < got.size(); ++m)
    for (std::size_t i = 0; i < p.recv[m].size(); ++i)
      mem.copy(halo.subspan(static_cast<std::size_t>(p.recv[m][i]) * w, w),
               std::span<const T>(got[m].span()).subspan(i * w, w));
}

/// Backward of halo_forward: returns `dhalo` [p.halo_rows][width] (the loss gradient with respect to the
/// halo rows) to the members that own those rows, and adds the gradients the others return for the caller's
/// rows into `dx` [p.tokens][width] (in member order, then row order: deterministic). Rows the caller reads
/// from itself (halo_source::kind::local) are the caller's to add. Collective as halo_forward. Errors and
/// cost: as halo_forward.
template <comm::communicator C, class T, model::memory_policy M>
void halo_backward(C& c, std::span<const int> ranks, const seq::halo_plan& p, std::int64_t width,
                   std::span<const T> dhalo, std::span<T> dx, const M& mem, int tag = halo_tag) {
  detail::check_halo_sizes("halo_backward", p, ranks, width, dx.size(), dhalo.size());
  if (p.local_only()) return;
  const auto w = static_cast<std::size_t>(width);
  const auto got = detail::exchange_rows(c, ranks, p.recv, p.send, width, dhalo, mem, tag + 1);
  for (std::size_t m = 0; m < got.size(); ++m)
    for (std::size_t i = 0; i < p.send[m].size(); ++i)
      mem.add(dx.subspan(static_cast<std::size_t>(p.send[m][i]) * w, w),
              std::span<const T>(got[m].span()).subspan(i * w, w));
}

}  // namespace hetmesh::run
