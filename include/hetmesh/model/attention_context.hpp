// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the attention entries of the contexts the runtime hands a user's stages. A backbone
// stage computes q, k, v for its local tokens and asks its context for the attention over every key its
// queries see across the sequence's ring (attention_context); an encoder asks for attention inside every
// item of its call's batch, whole items locally and split items over their groups
// (encoder_attention_context). The stage never sees rings, schedules, groups or the kernel, so a model
// written against these concepts runs under any partition family. The models are train::step_context
// (train/context.hpp) and train::encoder_context (train/encoder_context.hpp), bound by train::system to
// run/'s ring, Ulysses and long-short attention; they live in train/ so that model/ stays free of run/.
#pragma once

#include <concepts>
#include <span>

#include "attention.hpp"
#include "encoder_batch.hpp"

namespace hetmesh::model {

namespace detail {
template <class Ctx, class T>
concept ring_attention_forward_entry = requires(const Ctx& ctx, attention_shape s, T scale,
                                                std::span<const T> c, std::span<T> m) {
  ctx.attention_forward(s, scale, c, c, c, m, m);
};
template <class Ctx, class T>
concept ring_attention_backward_entry = requires(const Ctx& ctx, attention_shape s, T scale,
                                                 std::span<const T> c, std::span<T> m) {
  ctx.attention_backward(s, scale, c, c, c, c, c, c, m, m, m);
};
template <class Ctx, class T>
concept item_attention_forward_entry = requires(const Ctx& ctx, const encoder_batch_view& v,
                                                attention_shape s, T scale, std::span<const T> c,
                                                std::span<T> m) {
  ctx.attention_forward(v, s, scale, c, c, c, m, m);
};
template <class Ctx, class T>
concept item_attention_backward_entry = requires(const Ctx& ctx, const encoder_batch_view& v,
                                                 attention_shape s, T scale, std::span<const T> c,
                                                 std::span<T> m) {
  ctx.attention_backward(v, s, scale, c, c, c, c, c, c, m, m, m);
};
template <class Ctx>
concept has_slots = requires(const Ctx& ctx) {
  ctx.slots();
};
}  // namespace detail

/// A backbone stage's context whose stage can call attention, for element type T. Requirements:
///  1. `ctx.attention_forward(shape, scale, q, k, v, out, lse)` on a const context, with
///     model::attention_shape, T, three std::span<const T> (q [tokens][q_heads][head_dim], k and v
///     [tokens][kv_heads][head_dim], the micro-batch's local tokens in its order) and two std::span<T>
///     (out [tokens][q_heads][head_dim], lse [tokens][q_heads]): causal per-document attention of the
///     local queries over every key of the micro-batch's ring; collective over the ring's ranks, which
///     call it the same number of times in the same order;
///  2. `ctx.attention_backward(shape, scale, q, k, v, out, lse, dout, dq, dk, dv)`, with
///     model::attention_shape, T, six std::span<const T> and three std::span<T>: overwrites dq, dk, dv of
///     the local tokens (including the other ring members' contributions); collective as 1;
///  3. `ctx.slots()`: the call's activation slots (model::stage_context's), where the stage saves what its
///     backward reads.
/// Spans are memory of the run's memory policy (device memory on a device path). train::step_context
/// is the model (static_assert in train/context.hpp); a user's stage may constrain its forward on this
/// concept.
template <class Ctx, class T>
concept attention_context = detail::ring_attention_forward_entry<Ctx, T> &&
    detail::ring_attention_backward_entry<Ctx, T> && detail::has_slots<Ctx>;

/// An encoder's context whose encoder can call attention inside the items of its call's batch, for
/// element type T. Requirements:
///  1. `ctx.attention_forward(view, shape, scale, q, k, v, out, lse)` on a const context, with
///     `const encoder_batch_view&` (the call's batch), model::attention_shape, T, three std::span<const T>
///     (q [tokens][q_heads][head_dim], k and v [tokens][kv_heads][head_dim], the batch's tokens in buffer
///     order) and two std::span<T> (out, lse as attention_context's): full attention inside every item
///     (each token sees every token of its item); collective over the groups of the batch's split
///     pieces, in their order;
///  2. `ctx.attention_backward(view, shape, scale, q, k, v, out, lse, dout, dq, dk, dv)`, with the view,
///     model::attention_shape, T, six std::span<const T> and three std::span<T>: overwrites dq, dk, dv of
///     the call's tokens; collective as 1;
///  3. `ctx.slots()`: the call's activation slots.
/// Optional: `ctx.item_group(piece, view)`, the communicator of the group a split piece runs over (for an
/// encoder's own collectives over its item); train::encoder_context has it, the runtime never calls it.
/// train::encoder_context is the model (static_assert in tests/train/system.cpp: its communicator type must
/// be a real comm::communicator, and train/ does not include a backend).
template <class Ctx, class T>
concept encoder_attention_context = detail::item_attention_forward_entry<Ctx, T> &&
    detail::item_attention_backward_entry<Ctx, T> && detail::has_slots<Ctx>;

/// Checks `attention_context<Ctx, T>` requirement by requirement: each one Ctx misses fails a
/// static_assert that names it. Returns true (so `static_assert(check_attention_context<Ctx, T>())`).
template <class Ctx, class T>
consteval bool check_attention_context() {
  static_assert(detail::ring_attention_forward_entry<Ctx, T>,
                "attention_context requirement 1: missing `attention_forward(attention_shape, T scale, "
                "std::span<const T> q, k, v, std::span<T> out, lse) const`");
  static_assert(detail::ring_attention_backward_entry<Ctx, T>,
                "attention_context requirement 2: missing `attention_backward(attention_shape, T scale, "
                "std::span<const T> q, k, v, out, lse, dout, std::span<T> dq, dk, dv) const`");
  static_assert(detail::has_slots<Ctx>, "attention_context requirement 3: missing `slots() const`");
  return true;
}

/// Checks `encoder_attention_context<Ctx, T>` requirement by requirement, as check_attention_context.
template <class Ctx, class T>
consteval bool check_encoder_attention_context() {
  static_assert(detail::item_attention_forward_entry<Ctx, T>,
                "encoder_attention_context requirement 1: missing `attention_forward(const "
                "encoder_batch_view&, attention_shape, T scale, std::span<const T> q, k, v, std::span<T> "
                "out, lse) const`");
  static_assert(detail::item_attention_backward_entry<Ctx, T>,
                "encoder_attention_context requirement 2: missing `attention_backward(const "
                "encoder_batch_view&, attention_shape, T scale, std::span<const T> q, k, v, out, lse, dout, "
                "std::span<T> dq, dk, dv) const`");
  static_assert(detail::has_slots<Ctx>, "encoder_attention_context requirement 3: missing `slots() const`");
  return true;
}

}  // namespace hetmesh::model
