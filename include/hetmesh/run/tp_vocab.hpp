// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: the vocabulary-parallel embedding and cross-entropy, forward and backward, over the tp
// group's communicator (as Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy). The
// vocabulary of V entries is split over tp in contiguous ranges: rank j holds entries [j V/tp, (j+1) V/tp)
// (run::vocab_shard_of): the embedding table's rows [v0, v1) as a [V/tp][hidden] buffer, and the logits'
// columns [v0, v1) as [tokens][V/tp]. V must be divisible by tp (pad the vocabulary, as Megatron does).
//
// Token ids and targets are host arrays (as plans are); activations, tables and logits live in the memory of
// the communicator and the memory policy M. The embedding moves rows through M only. The cross-entropy's
// local arithmetic (row maxima, sums of exponentials, softmax gradients) runs through a kernel
// (run::tp_vocab_kernel; run::host_vocab_kernel on the host); its per-token results ([tokens] values) go
// through the host, where the losses are formed.
//
// Contract of the functions: collective over the tp group where they communicate (each says), every member
// passing the same tokens or targets; deterministic (rank-ordered reductions; per-token sums in index order);
// bad shapes, buffer sizes or ids raise invalid_argument naming the function and the mismatch before
// anything is communicated.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "../config.hpp"
#include "../core/format.hpp"
#include "tp_regions.hpp"

#if HETMESH_SEPARATE_COMPILATION
#include "../comm/loopback.hpp"
#include "../model/host_memory.hpp"
#if HETMESH_COMPILED_MPI
#include "../comm/mpi.hpp"
#endif
#endif

namespace hetmesh::run {

/// The vocabulary entries [begin, end) that one tp rank holds.
struct vocab_shard {
  std::int64_t begin = 0;  ///< first entry held
  std::int64_t end = 0;    ///< one past the last entry held

  /// Entries held.
  [[nodiscard]] std::int64_t size() const noexcept { return end - begin; }
  /// Whether entry `v` is held here.
  [[nodiscard]] bool holds(std::int64_t v) const noexcept { return v >= begin && v < end; }
  friend bool operator==(const vocab_shard&, const vocab_shard&) = default;
};

/// The entries tp rank `rank` of `tp` holds of a vocabulary of `vocab`: [rank V/tp, (rank+1) V/tp).
/// Pre: vocab divisible by tp, 0 <= rank < tp (invalid_argument otherwise). O(1).
[[nodiscard]] HETMESH_COMPILED vocab_shard vocab_shard_of(std::int64_t vocab, int tp, int rank)
#if HETMESH_BODIES
{
  if (tp < 1 || rank < 0 || rank >= tp)
    throw_error<invalid_argument>("run::vocab_shard_of: rank {} of tp {}; expected 0 <= rank < tp", rank, tp);
  detail::check_tp_divides("vocab_shard_of", "the vocabulary size", vocab, tp);
  const std::int64_t n = vocab / tp;
  return {rank * n, (rank + 1) * n};
}
#else
    ;
#endif

/// Vocabulary-parallel embedding forward: row t of the output = row tokens[t] of the table, summed over the
/// tp group (the rank holding that entry contributes it, the others zeros). `table` is this rank's shard
/// [V/tp][hidden]. `y` is [tokens][hidden] (all-reduced), or this rank's [tokens / tp][hidden] under
/// sequence parallelism (reduce-scattered, entering a sequence-parallel region). `tokens` (host) is equal on
/// every tp rank. Pre: 0 <= tokens[t] < vocab; vocab (and under sequence parallelism the token count)
/// divisible by tp. Collective over tp. Cost: one copy per token held here; one all-reduce (reduce-scatter)
/// of tokens x hidden.
template <comm::communicator C, class T, model::memory_policy M>
void vocab_parallel_embedding_forward(C& c, std::int64_t vocab, std::int64_t hidden, bool sequence_parallel,
                                      std::span<const std::int64_t> tokens, std::span<const T> table,
                                      std::span<T> y, const M& mem) {
  constexpr const char* who = "vocab_parallel_embedding_forward";
  const auto shard = vocab_shard_of(vocab, c.size(), c.rank());
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (sequence_parallel) detail::check_tp_divides(who, "the number of tokens", n, c.size());
  detail::check_tp_buffer(who, "table", table.size(), shard.size() * hidden, "vocab / tp x hidden");
  detail::check_tp_buffer(who, "y", y.size(), (sequence_parallel ? n / c.size() : n) * hidden,
                          sequence_parallel ? "tokens / tp x hidden" : "tokens x hidden");
  for (std::size_t t = 0; t < tokens.size(); ++t)
    if (tokens[t] < 0 || tokens[t] >= vocab)
      throw_error<invalid_argument>("run::{}: token {} is {}, outside the vocabulary [0, {})", who, t,
                                    tokens[t], vocab);
  typename M::template buffer<T> full_buf;
  std::span<T> full = y;
  if (sequence_parallel) {
    full_buf.resize(static_cast<std::size_t>(n * hidden));
    full = full_buf.span();
  }
  const auto h = static_cast<std::size_t>(hidden);
  mem.fill(full, T(0));
  for (std::size_t t = 0; t < tokens.size(); ++t)
    if (shard.holds(tokens[t]))
      mem.copy(full.subspan(t * h, h),
               table.subspan(static_cast<std::size_t>(tokens[t] - shard.begin) * h, h));
  if (sequence_parallel)
    reduce_scatter_to_sp_forward(c, std::span<const T>(full), y, n, hidden, mem);
  else
    reduce_from_tp_forward(c, y);
}

/// Vocabulary-parallel embedding backward: adds row t of the output gradient into row tokens[t] - v0 of
/// `dtable` [V/tp][hidden] for every token this rank holds, in token order (deterministic). `dy` is shaped as
/// the forward's y (this rank's tokens under sequence parallelism, all-gathered first; equal on every tp
/// rank otherwise). Collective over tp under sequence parallelism, local otherwise. Cost: one add per token
/// held here; under sequence parallelism one all-gather of tokens x hidden.
template <comm::communicator C, class T, model::memory_policy M>
void vocab_parallel_embedding_backward(C& c, std::int64_t vocab, std::int64_t hidden, bool sequence_parallel,
                                       std::span<const std::int64_t> tokens, std::span<const T> dy,
                                       std::span<T> dtable, const M& mem) {
  constexpr const char* who = "vocab_parallel_embedding_backward";
  const auto shard = vocab_shard_of(vocab, c.size(), c.rank());
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (sequence_parallel) detail::check_tp_divides(who, "the number of tokens", n, c.size());
  detail::check_tp_buffer(who, "dtable", dtable.size(), shard.size() * hidden, "vocab / tp x hidden");
  detail::check_tp_buffer(who, "dy", dy.size(), (sequence_parallel ? n / c.size() : n) * hidden,
                          sequence_parallel ? "tokens / tp x hidden" : "tokens x hidden");
  typename M::template buffer<T> full_buf;
  std::span<const T> full = dy;
  if (sequence_parallel) {
    full_buf.resize(static_cast<std::size_t>(n * hidden));
    reduce_scatter_to_sp_backward(c, dy, full_buf.span(), n, hidden, mem);
    full = full_buf.span();
  }
  const auto h = static_cast<std::size_t>(hidden);
  for (std::size_t t = 0; t < tokens.size(); ++t)
    if (shard.holds(tokens[t]))
      mem.add(dtable.subspan(static_cast<std::size_t>(tokens[t] - shard.begin) * h, h),
              full.subspan(t * h, h));
}

/// The local arithmetic of the vocabulary-parallel cross-entropy, over logits [rows][cols] (a rank's shard,
/// row-major) and per-row vectors, all in the memory the logits live in. Requirements, for element type T:
///  1. `k.row_max(logits, rows, cols, max)`: max[r] = the largest of row r;
///  2. `k.row_sum_exp(logits, rows, cols, max, sum)`: sum[r] = sum over j of exp(logits[r][j] - max[r]);
///  3. `k.pick(logits, rows, cols, target, out)`: out[r] = logits[r][target[r]] when 0 <= target[r] < cols,
///     else 0 (target: std::int64_t per row);
///  4. `k.softmax_grad(logits, rows, cols, lse, target, scale, dlogits)`: dlogits[r][j] = scale[r] *
///     (exp(logits[r][j] - lse[r]) - (j == target[r] ? 1 : 0)).
/// Extents are std::int64_t; inputs std::span<const ...>, outputs std::span<...>. Models: host_vocab_kernel.
template <class K, class T>
concept tp_vocab_kernel = requires(K& k, std::int64_t n, std::span<const T> a, std::span<T> o,
                                   std::span<const std::int64_t> t) {
  k.row_max(a, n, n, o);
  k.row_sum_exp(a, n, n, a, o);
  k.pick(a, n, n, t, o);
  k.softmax_grad(a, n, n, a, t, a, o);
};

/// tp_vocab_kernel on the host, sums in index order. Cost: O(rows x cols) each.
struct host_vocab_kernel {
  /// Requirement 1.
  template <class T>
  void row_max(std::span<const T> l, std::int64_t rows, std::int64_t cols, std::span<T> max) const {
    const auto m = static_cast<std::size_t>(cols);
    for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
      T x = l[r * m];
      for (std::size_t j = 1; j < m; ++j) x = l[r * m + j] > x ? l[r * m + j] : x;
      max[r] = x;
    }
  }
  /// Requirement 2.
  template <class T>
  void row_sum_exp(std::span<const T> l, std::int64_t rows, std::int64_t cols, std::span<const T> max,
                   std::span<T> sum) const {
    const auto m = static_cast<std::size_t>(cols);
    for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
      T s = 0;
      for (std::size_t j = 0; j < m; ++j) s += std::exp(l[r * m + j] - max[r]);
      sum[r] = s;
    }
  }
  /// Requirement 3.
  template <class T>
  void pick(std::span<const T> l, std::int64_t rows, std::int64_t cols, std::span<const std::int64_t> target,
            std::span<T> out) const {
    for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r)
      out[r] = target[r] >= 0 && target[r] < cols
                   ? l[r * static_cast<std::size_t>(cols) + static_cast<std::size_t>(target[r])]
                   : T(0);
  }
  /// Requirement 4.
  template <class T>
  void softmax_grad(std::span<const T> l, std::int64_t rows, std::int64_t cols, std::span<const T> lse,
                    std::span<const std::int64_t> target, std::span<const T> scale, std::span<T> d) const {
    const auto m = static_cast<std::size_t>(cols);
    for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r)
      for (std::size_t j = 0; j < m; ++j)
        d[r * m + j] = scale[r] * (std::exp(l[r * m + j] - lse[r]) -
                                   (static_cast<std::int64_t>(j) == target[r] ? T(1) : T(0)));
  }
};

static_assert(tp_vocab_kernel<host_vocab_kernel, float> && tp_vocab_kernel<host_vocab_kernel, double>);

/// What the cross-entropy's forward keeps for its backward, in the memory of M: per token, the log of the
/// sum of exponentials over the whole vocabulary, the target's column in this rank's shard (-1 when another
/// rank holds it) and the loss weight over step_targets (0 for tokens that do not count).
template <class T, model::memory_policy M>
struct vocab_cross_entropy_state {
  std::int64_t tokens = 0;                                 ///< rows of the logits
  typename M::template buffer<T> lse;                      ///< [tokens]: log sum exp over the vocabulary
  typename M::template buffer<std::int64_t> local_target;  ///< [tokens]: target - v0, or -1
  typename M::template buffer<T> scale;                    ///< [tokens]: weight / step_targets
};

/// Vocabulary-parallel cross-entropy forward. `logits` is this rank's [tokens][V/tp] columns; `targets`
/// and `weights` (host, [tokens], equal on every tp rank) are the next tokens and their loss weights.
/// Writes `loss` (host, [tokens]): loss[t] = weights[t] * (log sum_v exp(logits[t][v]) - logits[t][target])
/// / step_targets, the per-token loss of the library's models (0 where weights[t] == 0, whose target is not
/// read), equal on every tp rank; fills `state` for the backward. Pre: vocab divisible by tp; 0 <= targets[t]
/// < vocab where weights[t] != 0; step_targets >= 1. Collective over tp: three all-reduces of [tokens]
/// (max, sum of exponentials, target logit). Cost: three passes over the shard through the kernel.
template <comm::communicator C, class T, model::memory_policy M, tp_vocab_kernel<T> K = host_vocab_kernel>
void vocab_parallel_cross_entropy_forward(C& c, std::int64_t vocab, std::span<const T> logits,
                                          std::span<const std::int64_t> targets,
                                          std::span<const double> weights, std::int64_t step_targets,
                                          std::span<T> loss, vocab_cross_entropy_state<T, M>& state,
                                          const M& mem, K&& kernel = {}) {
  constexpr const char* who = "vocab_parallel_cross_entropy_forward";
  const auto shard = vocab_shard_of(vocab, c.size(), c.rank());
  const auto n = static_cast<std::int64_t>(targets.size());
  const auto un = targets.size();
  detail::check_tp_buffer(who, "logits", logits.size(), n * shard.size(), "tokens x vocab / tp");
  detail::check_tp_buffer(who, "weights", weights.size(), n, "one per target");
  detail::check_tp_buffer(who, "loss", loss.size(), n, "one per target");
  if (step_targets < 1)
    throw_error<invalid_argument>("run::{}: step_targets is {}; expected >= 1", who, step_targets);
  std::vector<std::int64_t> local(un, -1);
  std::vector<T> scale(un, T(0));
  for (std::size_t t = 0; t < un; ++t) {
    if (weights[t] == 0.0) continue;
    if (targets[t] < 0 || targets[t] >= vocab)
      throw_error<invalid_argument>("run::{}: target {} is {}, outside the vocabulary [0, {})", who, t,
                                    targets[t], vocab);
    if (shard.holds(targets[t])) local[t] = targets[t] - shard.begin;
    scale[t] = static_cast<T>(weights[t] / static_cast<double>(step_targets));
  }
  state.tokens = n;
  state.lse.resize(un);
  state.local_target.resize(un);
  state.scale.resize(un);
  mem.upload(state.local_target.span(), std::span<const std::int64_t>(local));
  mem.upload(state.scale.span(), std::span<const T>(scale));
  typename M::template buffer<T> mx, se, tl;
  mx.resize(un);
  se.resize(un);
  tl.resize(un);
  kernel.row_max(logits, n, shard.size(), mx.span());
  comm::all_reduce(c, mx.span(), comm::reduce_op::max);
  kernel.row_sum_exp(logits, n, shard.size(), std::span<const T>(mx.span()), se.span());
  comm::all_reduce(c, se.span(), comm::reduce_op::sum);
  kernel.pick(logits, n, shard.size(), std::span<const std::int64_t>(state.local_target.span()), tl.span());
  comm::all_reduce(c, tl.span(), comm::reduce_op::sum);
  std::vector<T> hmx(un), hse(un), htl(un);
  mem.download(std::span<T>(hmx), std::span<const T>(mx.span()));
  mem.download(std::span<T>(hse), std::span<const T>(se.span()));
  mem.download(std::span<T>(htl), std::span<const T>(tl.span()));
  for (std::size_t t = 0; t < un; ++t) {
    hmx[t] += std::log(hse[t]);  // now the log-sum-exp
    loss[t] = weights[t] == 0.0 ? T(0) : scale[t] * (hmx[t] - htl[t]);
  }
  mem.upload(state.lse.span(), std::span<const T>(hmx));
}

/// Vocabulary-parallel cross-entropy backward: `dlogits` [tokens][V/tp] = the gradient of sum_t loss[t]
/// with respect to this rank's logits: scale[t] * (softmax over the whole vocabulary - one-hot of the
/// target), restricted to the shard. `logits` and `state` as the forward left them. Local: no
/// communication. Cost: one pass over the shard through the kernel.
template <comm::communicator C, class T, model::memory_policy M, tp_vocab_kernel<T> K = host_vocab_kernel>
void vocab_parallel_cross_entropy_backward(const C& c, std::int64_t vocab, std::span<const T> logits,
                                           const vocab_cross_entropy_state<T, M>& state, std::span<T> dlogits,
                                           K&& kernel = {}) {
  constexpr const char* who = "vocab_parallel_cross_entropy_backward";
  const auto shard = vocab_shard_of(vocab, c.size(), c.rank());
  detail::check_tp_buffer(who, "state", state.lse.size(), state.tokens, "the forward's tokens");
  detail::check_tp_buffer(who, "logits", logits.size(), state.tokens * shard.size(), "tokens x vocab / tp");
  detail::check_tp_buffer(who, "dlogits", dlogits.size(), state.tokens * shard.size(), "tokens x vocab / tp");
  kernel.softmax_grad(logits, state.tokens, shard.size(), std::span<const T>(state.lse.span()),
                      std::span<const std::int64_t>(state.local_target.span()),
                      std::span<const T>(state.scale.span()), dlogits);
}

// Compiled once (HETMESH_SEPARATE_COMPILATION): the vocabulary-parallel embedding and cross-entropy over the
// loopback communicator (and MPI's with HETMESH_COMPILED_MPI) for float and double in host memory with the
// host kernel. HETMESH_INSTANTIATE is `extern template` in every translation unit but the one of
// <hetmesh/src.hpp> (config.hpp).
#if HETMESH_SEPARATE_COMPILATION
#define HETMESH_RUN_VOCAB_INSTANCE(C, T)                                                                     \
  HETMESH_INSTANTIATE void vocab_parallel_embedding_forward<C, T, model::host_memory>(                       \
      C&, std::int64_t, std::int64_t, bool, std::span<const std::int64_t>, std::span<const T>, std::span<T>, \
      const model::host_memory&);                                                                            \
  HETMESH_INSTANTIATE void vocab_parallel_embedding_backward<C, T, model::host_memory>(                      \
      C&, std::int64_t, std::int64_t, bool, std::span<const std::int64_t>, std::span<const T>, std::span<T>, \
      const model::host_memory&);                                                                            \
  HETMESH_INSTANTIATE void                                                                                   \
  vocab_parallel_cross_entropy_forward<C, T, model::host_memory, host_vocab_kernel>(                         \
      C&, std::int64_t, std::span<const T>, std::span<const std::int64_t>, std::span<const double>,          \
      std::int64_t, std::span<T>, vocab_cross_entropy_state<T, model::host_memory>&,                         \
      const model::host_memory&, host_vocab_kernel&&);                                                       \
  HETMESH_INSTANTIATE void                                                                                   \
  vocab_parallel_cross_entropy_backward<C, T, model::host_memory, host_vocab_kernel>(                        \
      const C&, std::int64_t, std::span<const T>, const vocab_cross_entropy_state<T, model::host_memory>&,   \
      std::span<T>, host_vocab_kernel&&);
HETMESH_RUN_VOCAB_INSTANCE(comm::loopback::communicator, float)
HETMESH_RUN_VOCAB_INSTANCE(comm::loopback::communicator, double)
#if HETMESH_COMPILED_MPI
HETMESH_RUN_VOCAB_INSTANCE(comm::mpi::communicator, float)
HETMESH_RUN_VOCAB_INSTANCE(comm::mpi::communicator, double)
#endif
#undef HETMESH_RUN_VOCAB_INSTANCE
#endif

}  // namespace hetmesh::run

/// Prints "vocab_shard[4, 8)".
template <>
struct fmt::formatter<hetmesh::run::vocab_shard> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::run::vocab_shard& v, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "vocab_shard[{}, {})", v.begin, v.end);
  }
};
