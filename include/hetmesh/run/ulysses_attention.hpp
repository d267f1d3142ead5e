// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: attention under Ulysses (DeepSpeed-Ulysses), forward and backward, with the user's
// attention kernel. Each rank of the group holds a contiguous slice of a packed stream of documents
// (rank r the r-th slice); q, k, v go to head sharding (run/ulysses.hpp: every token of the group, this
// rank's heads), the kernel runs one block over the whole stream under the per-document mask (causal;
// full for encoder items), and the output (and lse) come back to sequence sharding. The backward swaps q, k,
// v, out, dout and lse the same way, runs the kernel's backward, and returns dq and dk, dv (summed over
// replicated KV heads).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../comm/communicator.hpp"
#include "../core/error.hpp"
#include "../model/attention.hpp"
#include "../seq/attention_merge.hpp"
#include "../seq/ulysses.hpp"
#include "ulysses.hpp"

namespace hetmesh::run {

/// The inputs of a Ulysses attention call on one rank: its slice of q, k, v (sequence sharding) and the
/// document id and position of every token of the group's stream, in rank order.
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
inline seq::ulysses_plan scalar_plan(seq::ulysses_plan p) {
  for (auto& row : p.q_send_counts)
    for (auto& n : row) n /= p.policy.head_dim;
  for (auto& row : p.kv_send_counts)
    for (auto& n : row) n /= p.policy.head_dim;
  p.policy.head_dim = 1;
  return p;
}

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

template <class T>
model::attention_block<T> head_block(const seq::ulysses_plan& plan, const ulysses_attention_input<T>& in,
                                     const ulysses_qkv<T>& h) {
  model::attention_block<T> b;
  b.shape = {plan.heads_per_rank, plan.kv_heads_per_rank, plan.policy.head_dim};
  b.q = h.q;
  b.k = h.k;
  b.v = h.v;
  b.q_doc = b.k_doc = in.stream_doc;
  b.q_pos = b.k_pos = in.stream_pos;
  b.mask = in.mask;
  b.scale = in.scale;
  return b;
}

}  // namespace detail

/// Attention forward under Ulysses over `group` (its ranks in stream order; c.size() == the plan's degree).
/// Writes this rank's out [n][heads][head_dim] and lse [n][heads]. Collective over the group. Errors:
/// shapes or sizes that disagree with the plan (invalid_argument); the exchange's and the kernel's.
/// Cost: 3 all-to-alls in, 2 out, one kernel block over the whole stream for this rank's heads.
template <comm::communicator C, class Kernel, class T>
void ulysses_attention_forward(C& group, const seq::ulysses_plan& plan, Kernel& kernel,
                               const ulysses_attention_input<T>& in, std::span<T> out, std::span<T> lse) {
  constexpr const char* who = "run::ulysses_attention_forward";
  detail::check_ulysses_attention(plan, in, group.rank(), who);
  const auto h = ulysses_qkv_to_heads(group, plan, in.q, in.k, in.v);
  const auto b = detail::head_block(plan, in, h);
  std::vector<T> out_h(h.q.size()), lse_h(h.q.size() / static_cast<std::size_t>(plan.policy.head_dim));
  kernel.forward(b, model::attention_forward_out<T>{out_h, lse_h});
  ulysses_to_sequence(group, plan, ulysses_part::query, std::span<const T>(out_h), out);
  ulysses_to_sequence(group, detail::scalar_plan(plan), ulysses_part::query, std::span<const T>(lse_h), lse);
}

/// Attention backward under Ulysses: from this rank's out, lse (of the forward) and dout, writes dq, dk, dv
/// of its tokens (dk, dv summed over the ranks that shared a replicated KV head). Collective over the
/// group. Errors as ulysses_attention_forward. Cost: 6 all-to-alls in, 3 out, one kernel backward block.
template <comm::communicator C, class Kernel, class T>
void ulysses_attention_backward(C& group, const seq::ulysses_plan& plan, Kernel& kernel,
                                const ulysses_attention_input<T>& in, std::span<const T> out,
                                std::span<const T> lse, std::span<const T> dout, std::span<T> dq,
                                std::span<T> dk, std::span<T> dv) {
  constexpr const char* who = "run::ulysses_attention_backward";
  detail::check_ulysses_attention(plan, in, group.rank(), who);
  if (out.size() != in.q.size() || dout.size() != in.q.size() || dq.size() != in.q.size() ||
      dk.size() != in.k.size() || dv.size() != in.k.size() ||
      lse.size() * static_cast<std::size_t>(plan.policy.head_dim) != in.q.size())
    throw_error<invalid_argument>(
        "{}: out {}, lse {}, dout {}, dq {}, dk {}, dv {} elements; expected q's {} (lse: per head) and k's "
        "{}",
        who, out.size(), lse.size(), dout.size(), dq.size(), dk.size(), dv.size(), in.q.size(), in.k.size());
  const auto h = ulysses_qkv_to_heads(group, plan, in.q, in.k, in.v);
  const auto b = detail::head_block(plan, in, h);
  const auto n_h = h.q.size();
  const auto rows = n_h / static_cast<std::size_t>(plan.policy.head_dim);
  std::vector<T> out_h(n_h), dout_h(n_h), lse_h(rows), delta(rows);
  ulysses_to_heads(group, plan, ulysses_part::query, out, std::span<T>(out_h));
  ulysses_to_heads(group, plan, ulysses_part::query, dout, std::span<T>(dout_h));
  ulysses_to_heads(group, detail::scalar_plan(plan), ulysses_part::query, lse, std::span<T>(lse_h));
  seq::attention_delta(std::span<const T>(out_h), std::span<const T>(dout_h), std::span<T>(delta),
                       static_cast<std::size_t>(plan.policy.head_dim));
  std::vector<T> dq_h(n_h, T(0)), dk_h(h.k.size(), T(0)), dv_h(h.v.size(), T(0));
  kernel.backward(b, model::attention_backward_io<T>{dout_h, lse_h, delta, dq_h, dk_h, dv_h});
  const auto g = ulysses_grads_to_sequence(group, plan, std::span<const T>(dq_h), std::span<const T>(dk_h),
                                           std::span<const T>(dv_h));
  std::copy(g.q.begin(), g.q.end(), dq.begin());
  std::copy(g.k.begin(), g.k.end(), dk.begin());
  std::copy(g.v.begin(), g.v.end(), dv.begin());
}

}  // namespace hetmesh::run
