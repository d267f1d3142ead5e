// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: attention under Ulysses (DeepSpeed-Ulysses), forward and backward, with the user's
// attention kernel. Each rank of the group holds a contiguous slice of a packed stream of documents
// (rank r the r-th slice); q, k, v go to head sharding (run/ulysses.hpp: every token of the group, this
// rank's heads), the kernel runs one block over the whole stream under the per-document mask (causal;
// full for encoder items), and the output (and lse) come back to sequence sharding. The backward swaps q, k,
// v, out, dout and lse the same way, runs the kernel's backward, and returns dq and dk, dv (summed over
// replicated KV heads).
//
// Memory: every call runs over any memory through a memory policy M (model/memory_policy.hpp) of the group's
// memory space (checked at compile time; the calls without a policy use model::host_memory and take a
// host communicator). The tensors (q, k, v, out, lse, dout and the gradients), the head-sharded scratch
// and every tensor handed to the kernel (model::attention_block's q, k, v; the forward's out and lse; the
// backward's dout, lse, delta, dq, dk, dv) live in M's space; the per-token metadata (documents and
// positions of the stream, the block's q_doc, q_pos, k_doc, k_pos) stays host memory. The runtime zeroes
// the gradients and computes delta through M (fill, attention_delta) and never touches a tensor on the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../comm/communicator.hpp"
#include "../core/error.hpp"
#include "../model/attention.hpp"
#include "../model/attention_memory.hpp"
#include "../model/host_memory.hpp"
#include "../seq/attention_merge.hpp"
#include "../seq/ulysses.hpp"
#include "ulysses.hpp"

namespace hetmesh::run {

/// The inputs of a Ulysses attention call on one rank: its slice of q, k, v (sequence sharding; in the
/// memory policy's space) and the document id and position of every token of the group's stream, in rank
/// order (host memory).
template <class T>
struct ulysses_attention_input {
  model::attention_shape shape{};                  ///< heads and head size (the plan's)
  T scale = T(1);                                  ///< softmax scale
  std::span<const T> q;                            ///< this rank's queries: [n][heads][head_dim]
  std::span<const T> k;                            ///< this rank's keys: [n][kv_heads][head_dim]
  std::span<const T> v;                            ///< this rank's values: [n][kv_heads][head_dim]
  std::span<const std::int64_t> stream_doc;        ///< [total_tokens] document of each token of the group
  std::span<const std::int64_t> stream_pos;        ///< [total_tokens] its position in the document
  seq::block_mask mask = seq::block_mask::causal;  ///< causal (an LLM) or full (an encoder's items)
};

namespace detail {

/// The plan with head_dim 1: moves per-head scalars (lse) with the query tensors' layout.
HETMESH_COMPILED seq::ulysses_plan scalar_plan(seq::ulysses_plan p)
#if HETMESH_BODIES
{
  for (auto& row : p.q_send_counts)
    for (auto& n : row) n /= p.policy.head_dim;
  for (auto& row : p.kv_send_counts)
    for (auto& n : row) n /= p.policy.head_dim;
  p.policy.head_dim = 1;
  return p;
}
#else
    ;
#endif

template <class T>
void check_ulysses_attention(const seq::ulysses_plan& plan, const ulysses_attention_input<T>& in, int rank,
                             const char* who) {
  const auto& p = plan.policy;
  if (in.shape.q_heads != p.heads || in.shape.kv_heads != p.kv_heads || in.shape.head_dim != p.head_dim)
    throw_error<invalid_argument>(
        "{}: attention shape q_heads={}, kv_heads={}, head_dim={}; expected the Ulysses plan's {}, {}, {}",
        who, in.shape.q_heads, in.shape.kv_heads, in.shape.head_dim, p.heads, p.kv_heads, p.head_dim);
  const auto total = static_cast<std::size_t>(plan.total_tokens);
  if (in.stream_doc.size() != total || in.stream_pos.size() != total)
    throw_error<invalid_argument>(
        "{}: stream documents and positions of {} and {} tokens; expected the group's {} tokens", who,
        in.stream_doc.size(), in.stream_pos.size(), total);
  const auto n = static_cast<std::size_t>(plan.tokens.at(static_cast<std::size_t>(rank)));
  if (in.q.size() != n * static_cast<std::size_t>(p.heads * p.head_dim) ||
      in.k.size() != n * static_cast<std::size_t>(p.kv_heads * p.head_dim) || in.v.size() != in.k.size())
    throw_error<invalid_argument>("{}: q, k, v of {}, {}, {} elements; expected {} tokens of rank {}", who,
                                  in.q.size(), in.k.size(), in.v.size(), n, rank);
}

/// The kernel's block over the whole stream for this rank's heads: q, k, v head-sharded (the memory
/// policy's space), documents and positions of the stream (host).
template <class T>
model::attention_block<T> head_block(const seq::ulysses_plan& plan, const ulysses_attention_input<T>& in,
                                     std::span<const T> q, std::span<const T> k, std::span<const T> v) {
  model::attention_block<T> b;
  b.shape = {plan.heads_per_rank, plan.kv_heads_per_rank, plan.policy.head_dim};
  b.q = q;
  b.k = k;
  b.v = v;
  b.q_doc = b.k_doc = in.stream_doc;
  b.q_pos = b.k_pos = in.stream_pos;
  b.mask = in.mask;
  b.scale = in.scale;
  return b;
}

}  // namespace detail

/// Attention forward under Ulysses over `group` (its ranks in stream order; c.size() == the plan's degree),
/// over any memory: `in`'s q, k, v and `out`, `lse` live in `mem`'s space, which must be the group's (a
/// compile-time error otherwise: a device communicator needs a device memory policy). Writes this rank's
/// out [n][heads][head_dim] and lse [n][heads]. The kernel gets one block (q, k, v in `mem`'s space,
/// documents and positions on the host) and writes out, lse buffers of `mem`. Collective over the group.
/// Errors: shapes or sizes that disagree with the plan (invalid_argument); the exchange's and the
/// kernel's. Results are equal bitwise on any memory for the same kernel arithmetic. Cost: 3 all-to-alls
/// in, 2 out, one kernel block over the whole stream for this rank's heads.
template <comm::communicator C, class Kernel, class T, model::memory_policy M>
void ulysses_attention_forward(C& group, const seq::ulysses_plan& plan, Kernel& kernel,
                               const ulysses_attention_input<T>& in, std::span<T> out, std::span<T> lse,
                               M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::ulysses_attention_forward needs a memory policy of the communicator's memory space: a "
                "device communicator needs a device memory policy (cuda::device_memory, "
                "model::emulated_device_memory) as the last argument");
  constexpr const char* who = "run::ulysses_attention_forward";
  detail::check_ulysses_attention(plan, in, group.rank(), who);
  auto h = ulysses_qkv_to_heads(group, plan, in.q, in.k, in.v, mem);
  const auto b = detail::head_block(plan, in, std::span<const T>(h.q.span()), std::span<const T>(h.k.span()),
                                    std::span<const T>(h.v.span()));
  typename M::template buffer<T> out_h, lse_h;
  out_h.resize(h.q.size());
  lse_h.resize(h.q.size() / static_cast<std::size_t>(plan.policy.head_dim));
  kernel.forward(b, model::attention_forward_out<T>{out_h.span(), lse_h.span()});
  ulysses_to_sequence(group, plan, ulysses_part::query, std::span<const T>(out_h.span()), out, mem);
  ulysses_to_sequence(group, detail::scalar_plan(plan), ulysses_part::query, std::span<const T>(lse_h.span()),
                      lse, mem);
}

/// ulysses_attention_forward on host memory (model::host_memory): a host communicator, host tensors.
/// A device communicator is a compile-time error (pass a device memory policy). Same contract.
template <comm::communicator C, class Kernel, class T>
void ulysses_attention_forward(C& group, const seq::ulysses_plan& plan, Kernel& kernel,
                               const ulysses_attention_input<T>& in, std::span<T> out, std::span<T> lse) {
  model::host_memory mem;
  ulysses_attention_forward(group, plan, kernel, in, out, lse, mem);
}

/// Attention backward under Ulysses, over any memory (every tensor in `mem`'s space, the group's; a
/// compile-time error otherwise): from this rank's out, lse (of the forward) and dout, writes
/// (overwrites) dq, dk, dv of its tokens (dk, dv summed over the ranks that shared a replicated KV head,
/// in rank order). The kernel's dq, dk, dv are buffers of `mem` zeroed by mem.fill, its delta comes from
/// mem.attention_delta. Requires: M a model::attention_memory<M, T> (static_assert). Collective over the
/// group. Errors as ulysses_attention_forward. Cost: 6 all-to-alls in, 3 out, one kernel backward block.
template <comm::communicator C, class Kernel, class T, model::memory_policy M>
void ulysses_attention_backward(C& group, const seq::ulysses_plan& plan, Kernel& kernel,
                                const ulysses_attention_input<T>& in, std::span<const T> out,
                                std::span<const T> lse, std::span<const T> dout, std::span<T> dq,
                                std::span<T> dk, std::span<T> dv, M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::ulysses_attention_backward needs a memory policy of the communicator's memory space: a "
                "device communicator needs a device memory policy (cuda::device_memory, "
                "model::emulated_device_memory) as the last argument");
  static_assert(
      model::attention_memory<M, T>,
      "run::ulysses_attention_backward: the memory policy must model model::attention_memory<M, T>: "
      "attention_delta on its memory (model/attention_memory.hpp)");
  constexpr const char* who = "run::ulysses_attention_backward";
  detail::check_ulysses_attention(plan, in, group.rank(), who);
  if (out.size() != in.q.size() || dout.size() != in.q.size() || dq.size() != in.q.size() ||
      dk.size() != in.k.size() || dv.size() != in.k.size() ||
      lse.size() * static_cast<std::size_t>(plan.policy.head_dim) != in.q.size())
    throw_error<invalid_argument>(
        "{}: out {}, lse {}, dout {}, dq {}, dk {}, dv {} elements; expected q's {} (lse: per head) and k's "
        "{}",
        who, out.size(), lse.size(), dout.size(), dq.size(), dk.size(), dv.size(), in.q.size(), in.k.size());
  auto h = ulysses_qkv_to_heads(group, plan, in.q, in.k, in.v, mem);
  const auto b = detail::head_block(plan, in, std::span<const T>(h.q.span()), std::span<const T>(h.k.span()),
                                    std::span<const T>(h.v.span()));
  const auto n_h = h.q.size();
  const auto rows = n_h / static_cast<std::size_t>(plan.policy.head_dim);
  typename M::template buffer<T> out_h, dout_h, lse_h, delta, dq_h, dk_h, dv_h;
  out_h.resize(n_h);
  dout_h.resize(n_h);
  lse_h.resize(rows);
  delta.resize(rows);
  ulysses_to_heads(group, plan, ulysses_part::query, out, out_h.span(), mem);
  ulysses_to_heads(group, plan, ulysses_part::query, dout, dout_h.span(), mem);
  ulysses_to_heads(group, detail::scalar_plan(plan), ulysses_part::query, lse, lse_h.span(), mem);
  mem.attention_delta(std::span<const T>(out_h.span()), std::span<const T>(dout_h.span()), delta.span(),
                      static_cast<std::size_t>(plan.policy.head_dim));
  dq_h.resize(n_h);
  dk_h.resize(h.k.size());
  dv_h.resize(h.v.size());
  mem.fill(dq_h.span(), T(0));
  mem.fill(dk_h.span(), T(0));
  mem.fill(dv_h.span(), T(0));
  kernel.backward(b, model::attention_backward_io<T>{dout_h.span(), lse_h.span(), delta.span(), dq_h.span(),
                                                     dk_h.span(), dv_h.span()});
  ulysses_to_sequence(group, plan, ulysses_part::query, std::span<const T>(dq_h.span()), dq, mem);
  ulysses_to_sequence(group, plan, ulysses_part::key_value, std::span<const T>(dk_h.span()), dk, mem,
                      ulysses_combine::sum);
  ulysses_to_sequence(group, plan, ulysses_part::key_value, std::span<const T>(dv_h.span()), dv, mem,
                      ulysses_combine::sum);
}

/// ulysses_attention_backward on host memory (model::host_memory): a host communicator, host tensors.
/// A device communicator is a compile-time error (pass a device memory policy). Same contract.
template <comm::communicator C, class Kernel, class T>
void ulysses_attention_backward(C& group, const seq::ulysses_plan& plan, Kernel& kernel,
                                const ulysses_attention_input<T>& in, std::span<const T> out,
                                std::span<const T> lse, std::span<const T> dout, std::span<T> dq,
                                std::span<T> dk, std::span<T> dv) {
  model::host_memory mem;
  ulysses_attention_backward(group, plan, kernel, in, out, lse, dout, dq, dk, dv, mem);
}

}  // namespace hetmesh::run

// Compiled once (HETMESH_SEPARATE_COMPILATION): Ulysses attention over the loopback communicator with the
// reference kernel, float and double, in host memory. HETMESH_INSTANTIATE (config.hpp) is `extern template`
// in every translation unit but <hetmesh/src.hpp>'s, which defines them; other combinations are
// instantiated where they are used.
#if HETMESH_SEPARATE_COMPILATION
#include "../comm/loopback.hpp"
#include "../model/reference_attention.hpp"

namespace hetmesh::run {
#define HETMESH_RUN_ULYSSES_INSTANCE(C, K, T)                                                          \
  HETMESH_INSTANTIATE void ulysses_attention_forward<C, K, T, model::host_memory>(                     \
      C&, const seq::ulysses_plan&, K&, const ulysses_attention_input<T>&, std::span<T>, std::span<T>, \
      model::host_memory&);                                                                            \
  HETMESH_INSTANTIATE void ulysses_attention_backward<C, K, T, model::host_memory>(                    \
      C&, const seq::ulysses_plan&, K&, const ulysses_attention_input<T>&, std::span<const T>,         \
      std::span<const T>, std::span<const T>, std::span<T>, std::span<T>, std::span<T>,                \
      model::host_memory&);
HETMESH_RUN_ULYSSES_INSTANCE(comm::loopback::communicator, model::reference_attention, float)
HETMESH_RUN_ULYSSES_INSTANCE(comm::loopback::communicator, model::reference_attention, double)
#undef HETMESH_RUN_ULYSSES_INSTANCE
}  // namespace hetmesh::run
#endif
