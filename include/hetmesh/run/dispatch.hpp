// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: token dispatch by plan, the executor. The owner (loader) ranks hold whole sequences;
// a balance::dispatch_plan (balance/dispatch.hpp, from a context-parallel or HDP partition) says which
// rank computes which tokens and at which row. dispatch_tokens moves the token rows there with one
// all_to_all_v; gather_tokens is its inverse (outputs or gradients back to the owners, by the
// transposed plan). Rows are `width` elements of any trivially copyable type (token ids, embeddings,
// positions, labels, loss weights).
//
// Memory: both calls run over any memory through a memory policy M (model/memory_policy.hpp) whose space is
// the communicator's (checked at compile time; the calls without a policy use model::host_memory and take a
// host communicator). The buffers live in M's space; rows are packed and unpacked with one M copy per run
// of the plan, staged in M's buffers, and never read on the CPU: the plan, counts and displacements are
// host data. On the device path the row type must be one M's buffers and copies support (the
// communicator moves a comm::element typed, any other type as bytes).
#pragma once

#include <cstdint>
#include <span>

#include "../balance/dispatch.hpp"
#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../model/host_memory.hpp"
#include "detail/memory_fit.hpp"
#include "detail/rows.hpp"

namespace hetmesh::run {

namespace detail {
/// The checks dispatch_tokens and gather_tokens share: group size, width, and the two buffers against
/// the plan's row counts for this rank. `from_rows`/`to_rows` are the plan's per-rank row counts of
/// the buffer read and the buffer written.
template <comm::communicator C>
void check_dispatch_args(const C& c, const balance::dispatch_plan& plan, std::size_t from, std::size_t to,
                         std::int64_t width, const char* op, const char* from_name,
                         std::span<const std::int64_t> from_rows, const char* to_name,
                         std::span<const std::int64_t> to_rows) {
  if (c.size() != plan.ranks || width < 1)
    throw_error<invalid_argument>(
        "{} on {}: group of {} ranks, plan for {}, width {}; expected equal sizes and "
        "width >= 1",
        op, comm::describe(c), c.size(), plan.ranks, width);
  const auto me = static_cast<std::size_t>(c.rank());
  const auto w = static_cast<std::size_t>(width);
  auto check = [&](std::size_t got, std::int64_t rows, const char* name) {
    if (got < static_cast<std::size_t>(rows) * w || got % w != 0)
      throw_error<invalid_argument>(
          "{}: rank {} passed a {} buffer of {} elements; expected a whole number of rows of {} elements and "
          "at least {} rows (the plan's rows on this rank)",
          op, me, name, got, width, rows);
  };
  check(from, from_rows[me], from_name);
  check(to, to_rows[me], to_name);
}
}  // namespace detail

/// Moves token rows from the owners to the ranks the plan chose, over any memory. Collective over `c`,
/// whose group is the plan's ranks in plan order (c.size() == plan.ranks). `sources`: this rank's source
/// buffer (rows of `width` elements, its sequences at their token_source offsets; empty on a rank that owns
/// none); `targets`: this rank's target buffer; both in `mem`'s space, which must be the communicator's (a
/// compile-time error otherwise: a device communicator needs a device memory policy). Pre
/// (invalid_argument naming the op, rank and expected size): width >= 1; sources holds >=
/// plan.source_rows[rank] rows, targets >= plan.target_rows[rank]; the plan equal on every rank (checked
/// at the collective assertion level). Post: every token row is at its planned rank and row, bitwise; rows
/// no token is planned to (pads) are untouched. Deterministic. Cost: one M copy per run of the plan
/// (O(rows * width) in all) plus one all_to_all_v of the moved rows.
template <comm::communicator C, class T, model::memory_policy M>
void dispatch_tokens(C& c, const balance::dispatch_plan& plan, std::span<const T> sources,
                     std::span<T> targets, std::int64_t width, M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::dispatch_tokens needs a memory policy of the communicator's memory space: a device "
                "communicator needs a device memory policy (cuda::device_memory, "
                "model::emulated_device_memory) as the last argument");
  detail::check_dispatch_args(c, plan, sources.size(), targets.size(), width, "run::dispatch_tokens",
                              "source", plan.source_rows, "target", plan.target_rows);
  detail::assert_plan_agreement_on(c, mem, plan, "token dispatch plan");
  detail::move_rows(c, mem, plan.moves, sources, targets, width, "run::dispatch_tokens");
}

/// dispatch_tokens on host memory (model::host_memory): a host communicator (loopback, mpi), host
/// buffers. A device communicator is a compile-time error (pass a device memory policy). Same contract.
template <comm::communicator C, class T>
void dispatch_tokens(C& c, const balance::dispatch_plan& plan, std::span<const T> sources,
                     std::span<T> targets, std::int64_t width) {
  model::host_memory mem;
  dispatch_tokens(c, plan, sources, targets, width, mem);
}

/// The inverse of dispatch_tokens, over any memory: moves each planned token row of `targets` back to
/// its owner's row in `sources` (model outputs, or gradients of the dispatched inputs). Collective over
/// `c`; same preconditions with the roles of the buffers swapped, both in `mem`'s space (the
/// communicator's; a compile-time error otherwise). Post: gather_tokens(dispatch_tokens(x)) restores every
/// token row of x bitwise; rows of `sources` no sequence covers are untouched. Cost: as dispatch_tokens,
/// plus transposing the plan (O(runs log runs)).
template <comm::communicator C, class T, model::memory_policy M>
void gather_tokens(C& c, const balance::dispatch_plan& plan, std::span<const T> targets, std::span<T> sources,
                   std::int64_t width, M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::gather_tokens needs a memory policy of the communicator's memory space: a device "
                "communicator needs a device memory policy (cuda::device_memory, "
                "model::emulated_device_memory) as the last argument");
  detail::check_dispatch_args(c, plan, targets.size(), sources.size(), width, "run::gather_tokens", "target",
                              plan.target_rows, "source", plan.source_rows);
  detail::assert_plan_agreement_on(c, mem, plan, "token dispatch plan");
  detail::move_rows(c, mem, plan.moves.transposed(), targets, sources, width, "run::gather_tokens");
}

/// gather_tokens on host memory (model::host_memory): a host communicator (loopback, mpi), host buffers.
/// A device communicator is a compile-time error (pass a device memory policy). Same contract.
template <comm::communicator C, class T>
void gather_tokens(C& c, const balance::dispatch_plan& plan, std::span<const T> targets, std::span<T> sources,
                   std::int64_t width) {
  model::host_memory mem;
  gather_tokens(c, plan, targets, sources, width, mem);
}

}  // namespace hetmesh::run
