// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: the Ulysses all-to-all exchange (DeepSpeed-Ulysses), the executor of a
// seq::ulysses_plan (seq/ulysses.hpp). Around attention, each of the d ranks of the group swaps
//   sequence sharding  [its tokens][all heads][head_dim]
//   head sharding      [every token of the group][its heads][head_dim]
// with one all_to_all_v per tensor, and swaps back after it. Tokens of the head-sharded layout are
// the ranks' tokens in rank order (rank 0's first), so when rank r holds the r-th consecutive slice
// of a stream, the head-sharded tensor is that stream in order.
//
// Query-shaped tensors (q, the attention output, dq, dout) have `heads` heads, each owned by exactly
// one rank after the swap. Key/value-shaped tensors (k, v, dk, dv) have `kv_heads`; with GQA and
// kv_heads < d every KV head is replicated to the d / kv_heads ranks whose query heads read it, as the
// plan says. Going back, a replicated head arrives once per replica: values are identical (take the
// first), gradients are partial sums (add them, in rank order, so the result is deterministic).
//
// Memory: every exchange runs over any memory, through a memory policy M (model/memory_policy.hpp) whose
// space is the communicator's (M::space == C::memory, checked at compile time). Tensors live in M's
// space; the exchange packs heads with M's strided copies (copy_2d), stages in M's buffers, adds
// replicas with M's add, and never reads or writes a tensor on the CPU: only the plan, the counts and
// the displacements (host arrays, as for every backend) are host data. The calls without a policy use
// model::host_memory, so they take a host communicator (loopback, mpi); a device communicator (NCCL,
// comm::emulated_device) needs a device policy (cuda::device_memory, model::emulated_device_memory).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../model/host_memory.hpp"
#include "../seq/ulysses.hpp"
#include "detail/memory_fit.hpp"
#include "detail/rows.hpp"

namespace hetmesh::run {

/// Which head count a tensor has: query-shaped (heads) or key/value-shaped (kv_heads).
enum class ulysses_part : std::uint8_t {
  query,     ///< q, attention output, dq, dout: `heads` heads, one owner each
  key_value  ///< k, v, dk, dv: `kv_heads` heads, replicated to several ranks when kv_heads < degree
};

/// How ulysses_to_sequence combines the copies of a replicated KV head (query heads have one copy).
enum class ulysses_combine : std::uint8_t {
  first,  ///< keep the copy of the lowest rank (values: the copies are equal)
  sum     ///< add the copies in rank order (gradients: each copy holds one rank's partial sum)
};

/// Elements of one tensor of `part` on `rank` in sequence sharding: tokens[rank] x heads x head_dim.
/// Pure; O(1).
[[nodiscard]] HETMESH_COMPILED std::int64_t ulysses_sequence_size(const seq::ulysses_plan& plan,
                                                                  ulysses_part part, int rank)
#if HETMESH_BODIES
{
  const auto& p = plan.policy;
  return plan.tokens.at(static_cast<std::size_t>(rank)) *
         (part == ulysses_part::query ? p.heads : p.kv_heads) * p.head_dim;
}
#else
    ;
#endif

/// Elements of one tensor of `part` on any rank in head sharding: total_tokens x heads per rank x
/// head_dim. Pure; O(1).
[[nodiscard]] HETMESH_COMPILED std::int64_t ulysses_head_size(const seq::ulysses_plan& plan,
                                                              ulysses_part part)
#if HETMESH_BODIES
{
  return plan.total_tokens * (part == ulysses_part::query ? plan.heads_per_rank : plan.kv_heads_per_rank) *
         plan.policy.head_dim;
}
#else
    ;
#endif

namespace detail {
/// The plan's view of one part: heads in the sequence layout, heads per rank, first head of each rank.
struct ulysses_shape {
  std::int64_t heads = 0;      // heads of the tensor in the sequence layout
  std::int64_t per = 0;        // heads per rank in the head layout
  std::span<const int> begin;  // per rank: its first head
  std::int64_t dim = 0;        // head_dim
};

HETMESH_COMPILED ulysses_shape ulysses_shape_of(const seq::ulysses_plan& plan, ulysses_part part)
#if HETMESH_BODIES
{
  const bool q = part == ulysses_part::query;
  return {q ? plan.policy.heads : plan.policy.kv_heads, q ? plan.heads_per_rank : plan.kv_heads_per_rank,
          q ? std::span<const int>(plan.q_head_begin) : std::span<const int>(plan.kv_head_begin),
          plan.policy.head_dim};
}
#else
    ;
#endif

template <comm::communicator C>
void check_ulysses_args(const C& c, const seq::ulysses_plan& plan, ulysses_part part, std::size_t seq_size,
                        std::size_t head_size, const char* op) {
  if (c.size() != plan.policy.degree || plan.tokens.size() != static_cast<std::size_t>(c.size()))
    throw_error<invalid_argument>("{} on {}: a group of {} ranks for {}; expected the plan's degree", op,
                                  comm::describe(c), c.size(), plan.policy);
  const char* what = part == ulysses_part::query ? "query-shaped" : "key/value-shaped";
  const auto want_seq = ulysses_sequence_size(plan, part, c.rank());
  const auto want_head = ulysses_head_size(plan, part);
  if (seq_size != static_cast<std::size_t>(want_seq))
    throw_error<invalid_argument>(
        "{}: rank {} passed a sequence-sharded {} tensor of {} elements; expected {} ({} tokens x {} heads x "
        "{})",
        op, c.rank(), what, seq_size, want_seq, plan.tokens[static_cast<std::size_t>(c.rank())],
        ulysses_shape_of(plan, part).heads, plan.policy.head_dim);
  if (head_size != static_cast<std::size_t>(want_head))
    throw_error<invalid_argument>(
        "{}: rank {} passed a head-sharded {} tensor of {} elements; expected {} ({} tokens x {} heads x {})",
        op, c.rank(), what, head_size, want_head, plan.total_tokens, ulysses_shape_of(plan, part).per,
        plan.policy.head_dim);
}

}  // namespace detail

/// Sequence sharding to head sharding for one tensor, over any memory. Collective over `c`, the plan's
/// group in rank order (c.size() == plan.policy.degree); every rank passes the same plan (checked at the
/// collective assertion level) and the same part. `seq_local`: this rank's [tokens[rank]][H][head_dim]
/// (H = heads or kv_heads by `part`); `head_local`: receives [total_tokens][per][head_dim], the heads
/// [begin[rank], begin[rank] + per) of every token of the group, sources in rank order. Both live in
/// `mem`'s space, which must be the communicator's (a compile-time error otherwise: a device
/// communicator needs a device memory policy). Pre: sizes as stated (invalid_argument naming the op,
/// rank and expected shape). Post: bitwise copies; a replicated KV head lands on each of its ranks.
/// Deterministic. Work, all through `mem`: one send buffer of tokens x per x head_dim x degree and one
/// strided copy (copy_2d) per destination rank, then one all_to_all_v. May be asynchronous as `mem`'s
/// operations and `c`'s collectives are (ordered on their shared stream).
template <comm::communicator C, class T, model::memory_policy M>
void ulysses_to_heads(C& c, const seq::ulysses_plan& plan, ulysses_part part, std::span<const T> seq_local,
                      std::span<T> head_local, M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::ulysses_to_heads needs a memory policy of the communicator's memory space: a device "
                "communicator needs a device memory policy (cuda::device_memory, "
                "model::emulated_device_memory) as the last argument");
  detail::check_ulysses_args(c, plan, part, seq_local.size(), head_local.size(), "run::ulysses_to_heads");
  detail::assert_plan_agreement_on(c, mem, plan, "ulysses plan");
  const auto sh = detail::ulysses_shape_of(plan, part);
  const auto d = static_cast<std::size_t>(c.size());
  const auto mine = static_cast<std::size_t>(plan.tokens[static_cast<std::size_t>(c.rank())]);
  const auto block = static_cast<std::size_t>(sh.per * sh.dim),
             row = static_cast<std::size_t>(sh.heads * sh.dim);
  const std::size_t chunk = mine * block;  // elements this rank sends to each rank
  typename M::template buffer<T> send;
  send.resize(chunk * d);
  const std::span<T> s = send.span();
  std::vector<std::int64_t> sc(d), rc(d);
  for (std::size_t p = 0; p < d; ++p) {
    sc[p] = static_cast<std::int64_t>(chunk);
    rc[p] = plan.tokens[p] * static_cast<std::int64_t>(block);
    if (chunk > 0)  // [mine][begin[p], begin[p] + per) heads, rows `row` apart, packed to [mine][per]
      mem.copy_2d(s.subspan(p * chunk, chunk), block,
                  seq_local.subspan(static_cast<std::size_t>(sh.begin[p] * sh.dim)), row, block, mine);
  }
  const auto sd = detail::prefix(sc), rd = detail::prefix(rc);
  detail::all_to_all_v_any(c, std::span<const T>(s), std::span<const std::int64_t>(sc),
                           std::span<const std::int64_t>(sd), head_local, std::span<const std::int64_t>(rc),
                           std::span<const std::int64_t>(rd));
}

/// ulysses_to_heads on host memory (model::host_memory): for a host communicator (loopback, mpi) and
/// host vectors of any trivially copyable T. A device communicator is a compile-time error (pass a device
/// memory policy). Same contract.
template <comm::communicator C, class T>
void ulysses_to_heads(C& c, const seq::ulysses_plan& plan, ulysses_part part, std::span<const T> seq_local,
                      std::span<T> head_local) {
  model::host_memory mem;
  ulysses_to_heads(c, plan, part, seq_local, head_local, mem);
}

/// Head sharding back to sequence sharding for one tensor, over any memory: the inverse of
/// ulysses_to_heads (the attention output and dq with part query; dk, dv with part key_value and combine
/// sum). Collective over `c`, same preconditions with the buffers' roles swapped; both tensors live in
/// `mem`'s space, which must be the communicator's (compile-time error otherwise). Post: every head of
/// every token of `seq_local` is written: from its one owner, or for a replicated KV head from the lowest
/// rank holding it (first) or the sum of all its copies in rank order (sum; T must support +=, else
/// invalid_argument). ulysses_to_sequence(ulysses_to_heads(x), first) == x bitwise; equal bitwise on any
/// memory. Deterministic. Work, all through `mem`: one all_to_all_v into a receive buffer of tokens x per
/// x head_dim x degree, one add per extra replica (sum), one copy_2d per distinct head group.
template <comm::communicator C, class T, model::memory_policy M>
void ulysses_to_sequence(C& c, const seq::ulysses_plan& plan, ulysses_part part,
                         std::span<const T> head_local, std::span<T> seq_local, M& mem,
                         ulysses_combine combine = ulysses_combine::first) {
  static_assert(detail::memory_of<C, M>,
                "run::ulysses_to_sequence needs a memory policy of the communicator's memory space: a device "
                "communicator needs a device memory policy (cuda::device_memory, "
                "model::emulated_device_memory) as the last argument");
  detail::check_ulysses_args(c, plan, part, seq_local.size(), head_local.size(), "run::ulysses_to_sequence");
  constexpr bool addable = requires(T & a, const T& b) { a += b; };
  if (!addable && combine == ulysses_combine::sum)
    throw_error<invalid_argument>(
        "run::ulysses_to_sequence: combine sum needs an element type with +=; expected combine first");
  detail::assert_plan_agreement_on(c, mem, plan, "ulysses plan");
  const auto sh = detail::ulysses_shape_of(plan, part);
  const auto d = static_cast<std::size_t>(c.size());
  const auto mine = static_cast<std::size_t>(plan.tokens[static_cast<std::size_t>(c.rank())]);
  const auto block = static_cast<std::size_t>(sh.per * sh.dim),
             row = static_cast<std::size_t>(sh.heads * sh.dim);
  const std::size_t chunk = mine * block;  // elements this rank receives from each rank
  std::vector<std::int64_t> sc(d), rc(d);
  for (std::size_t p = 0; p < d; ++p) {
    sc[p] = plan.tokens[p] * static_cast<std::int64_t>(block);
    rc[p] = static_cast<std::int64_t>(chunk);
  }
  typename M::template buffer<T> recv;
  recv.resize(chunk * d);
  const std::span<T> r = recv.span();
  const auto sd = detail::prefix(sc), rd = detail::prefix(rc);
  detail::all_to_all_v_any(c, head_local, std::span<const std::int64_t>(sc),
                           std::span<const std::int64_t>(sd), r, std::span<const std::int64_t>(rc),
                           std::span<const std::int64_t>(rd));
  if (chunk == 0) return;
  // Per head, the first rank whose copy arrived; the later copies of a replicated head are added into
  // that first copy in rank order (sum) or dropped (first). Heads of one rank are replicated together or
  // not at all, so a rank's chunk is either a first copy or a replica of one whole earlier chunk.
  std::vector<int> first_of(static_cast<std::size_t>(sh.heads), -1);
  std::vector<std::size_t> firsts;
  for (std::size_t p = 0; p < d; ++p) {
    const auto h0 = static_cast<std::size_t>(sh.begin[p]);
    if (first_of[h0] < 0) {
      for (std::int64_t k = 0; k < sh.per; ++k)
        first_of[h0 + static_cast<std::size_t>(k)] = static_cast<int>(p);
      firsts.push_back(p);
    } else if (combine == ulysses_combine::sum) {
      if constexpr (addable)
        mem.add(r.subspan(static_cast<std::size_t>(first_of[h0]) * chunk, chunk),
                std::span<const T>(r.subspan(p * chunk, chunk)));
    }
  }
  for (const std::size_t p : firsts)  // [mine][per] back to heads [begin[p], begin[p] + per) of each row
    mem.copy_2d(seq_local.subspan(static_cast<std::size_t>(sh.begin[p] * sh.dim)), row,
                std::span<const T>(r.subspan(p * chunk, chunk)), block, block, mine);
}

/// ulysses_to_sequence on host memory (model::host_memory): for a host communicator (loopback, mpi) and
/// host vectors of any trivially copyable T. A device communicator is a compile-time error (pass a device
/// memory policy). Same contract.
template <comm::communicator C, class T>
void ulysses_to_sequence(C& c, const seq::ulysses_plan& plan, ulysses_part part,
                         std::span<const T> head_local, std::span<T> seq_local,
                         ulysses_combine combine = ulysses_combine::first) {
  model::host_memory mem;
  ulysses_to_sequence(c, plan, part, head_local, seq_local, mem, combine);
}

/// The three inputs of attention in head sharding (ulysses_qkv_to_heads), in host vectors.
template <class T>
struct ulysses_qkv {
  std::vector<T> q;  ///< [total_tokens][heads_per_rank][head_dim]
  std::vector<T> k;  ///< [total_tokens][kv_heads_per_rank][head_dim]
  std::vector<T> v;  ///< [total_tokens][kv_heads_per_rank][head_dim]
};

/// q, k, v (or their gradients) in buffers of memory policy M: what ulysses_qkv_to_heads and
/// ulysses_grads_to_sequence return when given a policy. Same layouts as ulysses_qkv.
template <class T, model::memory_policy M>
struct ulysses_qkv_buffers {
  typename M::template buffer<T> q;  ///< [tokens][q_heads][head_dim] (of the layout returned)
  typename M::template buffer<T> k;  ///< [tokens][kv_heads][head_dim]
  typename M::template buffer<T> v;  ///< [tokens][kv_heads][head_dim]
};

/// q, k and v of this rank (sequence sharding, in `mem`'s space) to head sharding: three
/// ulysses_to_heads. Collective over `c`; same contract; returns freshly sized buffers of `mem`.
/// Cost: three all_to_all_v.
template <comm::communicator C, class T, model::memory_policy M>
[[nodiscard]] ulysses_qkv_buffers<T, M> ulysses_qkv_to_heads(C& c, const seq::ulysses_plan& plan,
                                                             std::span<const T> q, std::span<const T> k,
                                                             std::span<const T> v, M& mem) {
  ulysses_qkv_buffers<T, M> out;
  out.q.resize(static_cast<std::size_t>(ulysses_head_size(plan, ulysses_part::query)));
  out.k.resize(static_cast<std::size_t>(ulysses_head_size(plan, ulysses_part::key_value)));
  out.v.resize(out.k.size());
  ulysses_to_heads(c, plan, ulysses_part::query, q, out.q.span(), mem);
  ulysses_to_heads(c, plan, ulysses_part::key_value, k, out.k.span(), mem);
  ulysses_to_heads(c, plan, ulysses_part::key_value, v, out.v.span(), mem);
  return out;
}

/// ulysses_qkv_to_heads on host memory: host communicator, host vectors. Same contract.
template <comm::communicator C, class T>
[[nodiscard]] ulysses_qkv<T> ulysses_qkv_to_heads(C& c, const seq::ulysses_plan& plan, std::span<const T> q,
                                                  std::span<const T> k, std::span<const T> v) {
  model::host_memory mem;
  ulysses_qkv<T> out;
  out.q.resize(static_cast<std::size_t>(ulysses_head_size(plan, ulysses_part::query)));
  out.k.resize(static_cast<std::size_t>(ulysses_head_size(plan, ulysses_part::key_value)));
  out.v.resize(out.k.size());
  ulysses_to_heads(c, plan, ulysses_part::query, q, std::span<T>(out.q), mem);
  ulysses_to_heads(c, plan, ulysses_part::key_value, k, std::span<T>(out.k), mem);
  ulysses_to_heads(c, plan, ulysses_part::key_value, v, std::span<T>(out.v), mem);
  return out;
}

/// Gradients dq, dk, dv of attention (head sharding, in `mem`'s space) back to this rank's tokens
/// (sequence sharding): dq as a query-shaped tensor, dk and dv summed over the replicas of each KV head.
/// Collective over `c`; returns buffers of `mem` sized [tokens[rank]][heads or kv_heads][head_dim].
/// Cost: three all_to_all_v.
template <comm::communicator C, class T, model::memory_policy M>
[[nodiscard]] ulysses_qkv_buffers<T, M> ulysses_grads_to_sequence(C& c, const seq::ulysses_plan& plan,
                                                                  std::span<const T> dq,
                                                                  std::span<const T> dk,
                                                                  std::span<const T> dv, M& mem) {
  ulysses_qkv_buffers<T, M> out;
  out.q.resize(static_cast<std::size_t>(ulysses_sequence_size(plan, ulysses_part::query, c.rank())));
  out.k.resize(static_cast<std::size_t>(ulysses_sequence_size(plan, ulysses_part::key_value, c.rank())));
  out.v.resize(out.k.size());
  ulysses_to_sequence(c, plan, ulysses_part::query, dq, out.q.span(), mem);
  ulysses_to_sequence(c, plan, ulysses_part::key_value, dk, out.k.span(), mem, ulysses_combine::sum);
  ulysses_to_sequence(c, plan, ulysses_part::key_value, dv, out.v.span(), mem, ulysses_combine::sum);
  return out;
}

/// ulysses_grads_to_sequence on host memory: host communicator, host vectors. Same contract.
template <comm::communicator C, class T>
[[nodiscard]] ulysses_qkv<T> ulysses_grads_to_sequence(C& c, const seq::ulysses_plan& plan,
                                                       std::span<const T> dq, std::span<const T> dk,
                                                       std::span<const T> dv) {
  model::host_memory mem;
  ulysses_qkv<T> out;
  out.q.resize(static_cast<std::size_t>(ulysses_sequence_size(plan, ulysses_part::query, c.rank())));
  out.k.resize(static_cast<std::size_t>(ulysses_sequence_size(plan, ulysses_part::key_value, c.rank())));
  out.v.resize(out.k.size());
  ulysses_to_sequence(c, plan, ulysses_part::query, dq, std::span<T>(out.q), mem);
  ulysses_to_sequence(c, plan, ulysses_part::key_value, dk, std::span<T>(out.k), mem, ulysses_combine::sum);
  ulysses_to_sequence(c, plan, ulysses_part::key_value, dv, std::span<T>(out.v), mem, ulysses_combine::sum);
  return out;
}

}  // namespace hetmesh::run
