// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: the communication regions of tensor parallelism, forward and backward, over the tp group's
// communicator (model::stage_context::tp). Each region is a pair of maps, one the adjoint of the other, that
// a tensor-parallel layer puts around its local GEMMs (as Megatron-LM's tensor_parallel mappings):
//
//   region                 forward                          backward
//   copy_to_tp             identity                         all-reduce (sum) of the input gradient
//   reduce_from_tp         all-reduce (sum)                 identity
//   gather_from_tp         all-gather along the last dim    split along the last dim
//   scatter_to_tp          split along the last dim         all-gather along the last dim
//   gather_from_sp         all-gather along the tokens      reduce-scatter along the tokens
//   reduce_scatter_to_sp   reduce-scatter along the tokens  all-gather along the tokens
//   scatter_to_sp          split along the tokens           all-gather along the tokens
//
// The identity halves have no function: the caller uses the buffer as it is.
//
// Layout. Every buffer is row-major [rows][columns]: rows are tokens, columns features. Along the last
// dimension, tp rank j holds columns [j * cols / tp, (j + 1) * cols / tp) of every row, as a [rows][cols /
// tp] buffer of its own. Along the tokens (sequence parallelism), tp rank j holds rows [j * rows / tp, (j +
// 1) * rows / tp), all columns, as a [rows / tp][cols] buffer. `rows` and `cols` are always the full
// (unsplit) extents; the one that is split must be divisible by tp.
//
// Contract of every function here: collective over the tp group (every member calls the same region with
// the same rows and cols, in the same order as its other collectives on `c`), except the split halves,
// which are local; complete (host) or enqueued on the communicator's stream (device) when they return.
// Deterministic: the reductions are the communicator's (rank-ordered on every backend hetmesh ships), so
// every rank gets bitwise the same result and repeated calls repeat it. Bad sizes raise invalid_argument
// naming the function, the buffer and what was expected, before anything is communicated. Buffers live in
// the memory space of `c` and of the memory policy `M`; scratch space is allocated through `M`.
#pragma once

#include <cstdint>
#include <span>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../model/memory_policy.hpp"

namespace hetmesh::run {

namespace detail {

/// Throws invalid_argument unless `extent` is non-negative and divisible by `tp`.
HETMESH_COMPILED void check_tp_divides(const char* who, const char* what, std::int64_t extent, int tp)
#if HETMESH_BODIES
{
  if (extent < 0 || extent % tp != 0)
    throw_error<invalid_argument>("run::{}: {} is {}, not divisible by the tensor-parallel size {}", who,
                                  what, extent, tp);
}
#else
    ;
#endif

/// Throws invalid_argument unless buffer `what` holds `expected` elements (`formula` says why).
HETMESH_COMPILED void check_tp_buffer(const char* who, const char* what, std::size_t size,
                                      std::int64_t expected, const char* formula)
#if HETMESH_BODIES
{
  if (expected < 0 || size != static_cast<std::size_t>(expected))
    throw_error<invalid_argument>("run::{}: {} holds {} elements; expected {} ({})", who, what, size,
                                  expected, formula);
}
#else
    ;
#endif

/// full [rows][cols] from every rank's [rows][cols / tp] block of columns (rank order).
template <comm::communicator C, class T, model::memory_policy M>
void gather_columns(C& c, std::span<const T> part, std::span<T> full, std::int64_t rows, std::int64_t cols,
                    const M& mem, const char* who) {
  const int tp = c.size();
  check_tp_divides(who, "the number of columns", cols, tp);
  const std::int64_t cl = cols / tp;
  check_tp_buffer(who, "the local (split) buffer", part.size(), rows * cl, "rows x cols / tp");
  check_tp_buffer(who, "the full buffer", full.size(), rows * cols, "rows x cols");
  if (tp == 1) return mem.copy(full, part);
  typename M::template buffer<T> blocks;  // [tp][rows][cl], rank-major as all_gather leaves it
  blocks.resize(full.size());
  comm::all_gather(c, part, blocks.span());
  const auto w = static_cast<std::size_t>(cl), n = static_cast<std::size_t>(rows);
  const std::span<const T> b = blocks.span();
  for (std::size_t j = 0; j < static_cast<std::size_t>(tp); ++j)
    mem.copy_2d(full.subspan(j * w), static_cast<std::size_t>(cols), b.subspan(j * n * w), w, w, n);
}

/// part [rows][cols / tp] = this rank's block of columns of full [rows][cols]. Local.
template <comm::communicator C, class T, model::memory_policy M>
void split_columns(const C& c, std::span<const T> full, std::span<T> part, std::int64_t rows,
                   std::int64_t cols, const M& mem, const char* who) {
  const int tp = c.size();
  check_tp_divides(who, "the number of columns", cols, tp);
  const std::int64_t cl = cols / tp;
  check_tp_buffer(who, "the full buffer", full.size(), rows * cols, "rows x cols");
  check_tp_buffer(who, "the local (split) buffer", part.size(), rows * cl, "rows x cols / tp");
  const auto w = static_cast<std::size_t>(cl);
  mem.copy_2d(part, w, full.subspan(static_cast<std::size_t>(c.rank()) * w), static_cast<std::size_t>(cols),
              w, static_cast<std::size_t>(rows));
}

/// Checks the buffers of a token-dimension region: `part` [rows / tp][cols], `full` [rows][cols].
template <comm::communicator C>
void check_token_split(const C& c, std::size_t part, std::size_t full, std::int64_t rows, std::int64_t cols,
                       const char* who) {
  check_tp_divides(who, "the number of tokens (rows)", rows, c.size());
  check_tp_buffer(who, "the local (sequence-split) buffer", part, rows / c.size() * cols, "rows / tp x cols");
  check_tp_buffer(who, "the full buffer", full, rows * cols, "rows x cols");
}

}  // namespace detail

/// Backward of copy_to_tp (whose forward is the identity: every tp rank reads the same input): `grad`
/// [rows][cols] = the sum over the tp group of every rank's input gradient, in place. Use it on the input
/// gradient of a column-parallel layer without sequence parallelism. Cost: one all-reduce of the buffer.
template <comm::communicator C, class T>
void copy_to_tp_backward(C& c, std::span<T> grad) {
  comm::all_reduce(c, grad, comm::reduce_op::sum);
}

/// Forward of reduce_from_tp (whose backward is the identity): `y` = the sum over the tp group of every
/// rank's partial `y`, in place. Use it on the output of a row-parallel layer without sequence parallelism.
/// Cost: one all-reduce of the buffer.
template <comm::communicator C, class T>
void reduce_from_tp_forward(C& c, std::span<T> y) {
  comm::all_reduce(c, y, comm::reduce_op::sum);
}

/// Forward of gather_from_tp: `full` [rows][cols] from every rank's `part` [rows][cols / tp] (rank j's block
/// is columns [j cols/tp, (j+1) cols/tp)). Pre: cols divisible by tp. Cost: one all-gather of rows x cols
/// elements, then tp strided copies; scratch of rows x cols elements.
template <comm::communicator C, class T, model::memory_policy M>
void gather_from_tp_forward(C& c, std::span<const T> part, std::span<T> full, std::int64_t rows,
                            std::int64_t cols, const M& mem) {
  detail::gather_columns(c, part, full, rows, cols, mem, "gather_from_tp_forward");
}

/// Backward of gather_from_tp: `dpart` [rows][cols / tp] = this rank's columns of `dfull` [rows][cols]
/// (the output gradient, equal on every tp rank). Local: no communication. Cost: one strided copy.
template <comm::communicator C, class T, model::memory_policy M>
void gather_from_tp_backward(const C& c, std::span<const T> dfull, std::span<T> dpart, std::int64_t rows,
                             std::int64_t cols, const M& mem) {
  detail::split_columns(c, dfull, dpart, rows, cols, mem, "gather_from_tp_backward");
}

/// Forward of scatter_to_tp: `part` [rows][cols / tp] = this rank's columns of `full` [rows][cols] (equal on
/// every tp rank). Local. Cost: one strided copy.
template <comm::communicator C, class T, model::memory_policy M>
void scatter_to_tp_forward(const C& c, std::span<const T> full, std::span<T> part, std::int64_t rows,
                           std::int64_t cols, const M& mem) {
  detail::split_columns(c, full, part, rows, cols, mem, "scatter_to_tp_forward");
}

/// Backward of scatter_to_tp: `dfull` [rows][cols] from every rank's `dpart` [rows][cols / tp]. Cost: as
/// gather_from_tp_forward.
template <comm::communicator C, class T, model::memory_policy M>
void scatter_to_tp_backward(C& c, std::span<const T> dpart, std::span<T> dfull, std::int64_t rows,
                            std::int64_t cols, const M& mem) {
  detail::gather_columns(c, dpart, dfull, rows, cols, mem, "scatter_to_tp_backward");
}

/// Forward of gather_from_sp (sequence parallelism, before a column-parallel layer): `full` [rows][cols] =
/// every rank's `part` [rows / tp][cols], rank j's tokens at rows [j rows/tp, (j+1) rows/tp). Pre: rows
/// divisible by tp. Cost: one all-gather of rows x cols elements, no scratch.
template <comm::communicator C, class T, model::memory_policy M>
void gather_from_sp_forward(C& c, std::span<const T> part, std::span<T> full, std::int64_t rows,
                            std::int64_t cols, const M& mem) {
  detail::check_token_split(c, part.size(), full.size(), rows, cols, "gather_from_sp_forward");
  if (c.size() == 1) return mem.copy(full, part);
  comm::all_gather(c, part, full);
}

/// Backward of gather_from_sp: `dpart` [rows / tp][cols] = the sum over the tp group of rows
/// [rank rows/tp, (rank+1) rows/tp) of every rank's `dfull` [rows][cols] (each rank's gradient of its own
/// copy of the gathered tokens). Cost: one reduce-scatter of rows x cols elements.
template <comm::communicator C, class T, model::memory_policy M>
void gather_from_sp_backward(C& c, std::span<const T> dfull, std::span<T> dpart, std::int64_t rows,
                             std::int64_t cols, const M& mem) {
  detail::check_token_split(c, dpart.size(), dfull.size(), rows, cols, "gather_from_sp_backward");
  if (c.size() == 1) return mem.copy(dpart, dfull);
  comm::reduce_scatter(c, dfull, dpart, comm::reduce_op::sum);
}

/// Forward of reduce_scatter_to_sp (sequence parallelism, after a row-parallel layer): `part`
/// [rows / tp][cols] = this rank's tokens of the sum over the tp group of every rank's partial `full`
/// [rows][cols]. Cost: one reduce-scatter of rows x cols elements.
template <comm::communicator C, class T, model::memory_policy M>
void reduce_scatter_to_sp_forward(C& c, std::span<const T> full, std::span<T> part, std::int64_t rows,
                                  std::int64_t cols, const M& mem) {
  detail::check_token_split(c, part.size(), full.size(), rows, cols, "reduce_scatter_to_sp_forward");
  if (c.size() == 1) return mem.copy(part, full);
  comm::reduce_scatter(c, full, part, comm::reduce_op::sum);
}

/// Backward of reduce_scatter_to_sp: `dfull` [rows][cols] = every rank's `dpart` [rows / tp][cols] gathered
/// (rank order). Cost: one all-gather of rows x cols elements.
template <comm::communicator C, class T, model::memory_policy M>
void reduce_scatter_to_sp_backward(C& c, std::span<const T> dpart, std::span<T> dfull, std::int64_t rows,
                                   std::int64_t cols, const M& mem) {
  detail::check_token_split(c, dpart.size(), dfull.size(), rows, cols, "reduce_scatter_to_sp_backward");
  if (c.size() == 1) return mem.copy(dfull, dpart);
  comm::all_gather(c, dpart, dfull);
}

/// Forward of scatter_to_sp: `part` [rows / tp][cols] = this rank's tokens of `full` [rows][cols] (equal on
/// every tp rank; e.g. an embedding output entering a sequence-parallel region). Local. Cost: one copy.
template <comm::communicator C, class T, model::memory_policy M>
void scatter_to_sp_forward(const C& c, std::span<const T> full, std::span<T> part, std::int64_t rows,
                           std::int64_t cols, const M& mem) {
  detail::check_token_split(c, part.size(), full.size(), rows, cols, "scatter_to_sp_forward");
  mem.copy(part, full.subspan(static_cast<std::size_t>(c.rank()) * part.size(), part.size()));
}

/// Backward of scatter_to_sp: `dfull` [rows][cols] = every rank's `dpart` [rows / tp][cols] gathered. Cost:
/// one all-gather of rows x cols elements.
template <comm::communicator C, class T, model::memory_policy M>
void scatter_to_sp_backward(C& c, std::span<const T> dpart, std::span<T> dfull, std::int64_t rows,
                            std::int64_t cols, const M& mem) {
  detail::check_token_split(c, dpart.size(), dfull.size(), rows, cols, "scatter_to_sp_backward");
  if (c.size() == 1) return mem.copy(dfull, dpart);
  comm::all_gather(c, dpart, dfull);
}

}  // namespace hetmesh::run
