// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: attention inside encoder items under long-short sequence parallelism (MegaScale-Omni), with
// the user's attention kernel. An encoder rank's batch (model::encoder_batch_view) holds whole items and
// pieces of long items, each piece on one rank of its item's Ulysses group. Every token attends to every
// token of its own item (block_mask::full: an image's or a clip's patches see each other, no causality).
// A whole item runs one kernel block on this rank; a piece runs Ulysses over its group (run/ulysses_
// attention.hpp: heads swapped by all-to-all, the kernel over the whole item for this rank's heads).
// Pieces run in the batch's order, which is the long-short plan's (long items first, by (-length, id)) on
// every rank, so the groups' collectives meet in one order on all their members.
//
// Memory: the calls run over any memory through a memory policy M (model/memory_policy.hpp) of the groups'
// memory space (checked at compile time; the calls without a policy use model::host_memory and take host
// communicators). q, k, v, out, lse, dout, dq, dk, dv and every tensor handed to the kernel live in M's
// space; the items' documents and positions (model::attention_block's q_doc, q_pos, k_doc, k_pos) and the
// batch view are host memory. Zeroing the gradients and delta go through M (fill, attention_delta); the
// runtime never touches a tensor on the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../model/attention.hpp"
#include "../model/attention_memory.hpp"
#include "../model/encoder_batch.hpp"
#include "../model/host_memory.hpp"
#include "../seq/attention_merge.hpp"
#include "../seq/ulysses.hpp"
#include "ulysses_attention.hpp"

namespace hetmesh::run {

/// The inputs of a long-short attention call: this rank's q, k, v for every token of its encoder batch,
/// in the batch's buffer order (piece after piece), in the memory policy's space.
template <class T>
struct long_short_attention_input {
  model::attention_shape shape{};  ///< heads and head size
  T scale = T(1);                  ///< softmax scale
  std::span<const T> q;            ///< [tokens][q_heads][head_dim]
  std::span<const T> k;            ///< [tokens][kv_heads][head_dim]
  std::span<const T> v;            ///< [tokens][kv_heads][head_dim]
};

namespace detail {

/// Tokens of group rank t of an item of `length` tokens split over `degree` ranks (seq::plan_long_short's
/// contiguous split).
inline std::int64_t piece_tokens(std::int64_t length, int degree, int t) {
  return (t + 1) * length / degree - t * length / degree;
}

/// The documents and positions of a whole item's n tokens (one document: the item).
struct item_stream {
  std::vector<std::int64_t> doc, pos;
};
HETMESH_COMPILED item_stream whole_item(std::int64_t item, std::size_t n)
#if HETMESH_BODIES
{
  item_stream s{std::vector<std::int64_t>(n, item), std::vector<std::int64_t>(n)};
  for (std::size_t i = 0; i < n; ++i) s.pos[i] = static_cast<std::int64_t>(i);
  return s;
}
#else
    ;
#endif

/// The piece's Ulysses plan (its group's pieces in group order) and its tokens' documents and positions
/// (the whole item: one document). Errors: a piece that is not the plan's split (invalid_argument).
struct piece_stream {
  seq::ulysses_plan plan;
  std::vector<std::int64_t> doc, pos;
};

HETMESH_COMPILED piece_stream make_piece_stream(const model::encoder_piece& p,
                                                const model::attention_shape& s, const char* who)
#if HETMESH_BODIES
{
  if (p.degree < 1 || p.group_rank < 0 || p.group_rank >= p.degree ||
      p.tokens.begin != p.group_rank * p.item_tokens / p.degree ||
      p.tokens.size() != piece_tokens(p.item_tokens, p.degree, p.group_rank))
    throw_error<invalid_argument>(
        "{}: item {} piece {} of {} tokens at group rank {} of {}; expected the contiguous split of "
        "seq::plan_long_short",
        who, p.item, p.tokens, p.item_tokens, p.group_rank, p.degree);
  std::vector<std::int64_t> sizes;
  for (int t = 0; t < p.degree; ++t) sizes.push_back(piece_tokens(p.item_tokens, p.degree, t));
  piece_stream out{seq::plan_ulysses(sizes, {p.degree, s.q_heads, s.kv_heads, s.head_dim}), {}, {}};
  auto whole = whole_item(p.item, static_cast<std::size_t>(p.item_tokens));
  out.doc = std::move(whole.doc);
  out.pos = std::move(whole.pos);
  return out;
}
#else
    ;
#endif

template <class T>
void check_long_short(const model::encoder_batch_view& v, const long_short_attention_input<T>& in,
                      std::size_t outs, std::size_t lses, const char* who) {
  model::check_attention_shape(in.shape, who);
  const auto n = static_cast<std::size_t>(v.tokens);
  const auto qw = static_cast<std::size_t>(in.shape.q_heads * in.shape.head_dim);
  const auto kw = static_cast<std::size_t>(in.shape.kv_heads * in.shape.head_dim);
  if (in.q.size() != n * qw || in.k.size() != n * kw || in.v.size() != n * kw || outs != n * qw ||
      lses != n * static_cast<std::size_t>(in.shape.q_heads))
    throw_error<invalid_argument>(
        "{}: q {}, k {}, v {}, out {}, lse {} elements for {} tokens; expected [tokens][q_heads][head_dim] "
        "for q and out, [tokens][kv_heads][head_dim] for k and v, [tokens][q_heads] for lse",
        who, in.q.size(), in.k.size(), in.v.size(), outs, lses, n);
}

/// Calls f(piece, q, k, v slices, token offset, tokens) for each piece of the view, in order.
template <class T, class F>
void for_each_piece_slice(const model::encoder_batch_view& v, const long_short_attention_input<T>& in,
                          F&& f) {
  const auto qw = static_cast<std::size_t>(in.shape.q_heads * in.shape.head_dim);
  const auto kw = static_cast<std::size_t>(in.shape.kv_heads * in.shape.head_dim);
  for (const auto& p : v.pieces) {
    const auto at = static_cast<std::size_t>(p.offset), n = static_cast<std::size_t>(p.tokens.size());
    f(p, in.q.subspan(at * qw, n * qw), in.k.subspan(at * kw, n * kw), in.v.subspan(at * kw, n * kw), at, n);
  }
}

/// A whole item's block: every token of the item against every other (full mask). q, k, v in the memory
/// policy's space; documents and positions host.
template <class T>
model::attention_block<T> item_block(const long_short_attention_input<T>& in, std::span<const T> q,
                                     std::span<const T> k, std::span<const T> v,
                                     const std::vector<std::int64_t>& doc,
                                     const std::vector<std::int64_t>& pos) {
  model::attention_block<T> b;
  b.shape = in.shape;
  b.q = q, b.k = k, b.v = v;
  b.q_doc = b.k_doc = doc;
  b.q_pos = b.k_pos = pos;
  b.mask = seq::block_mask::full;
  b.scale = in.scale;
  return b;
}

/// The communicator type `group_of` returns for a piece.
template <class GroupOf>
using group_type = std::remove_cvref_t<std::invoke_result_t<GroupOf&, const model::encoder_piece&>>;

}  // namespace detail

/// Attention within each item of encoder batch `v` (full mask), this rank's share, over any memory: `in`'s
/// q, k, v and out [tokens][q_heads][head_dim], lse [tokens][q_heads] for its tokens live in `mem`'s
/// space, which must be the groups' (a compile-time error otherwise: device communicators need a device
/// memory policy). A split piece runs Ulysses over `group_of(piece)` (its item's group, ranks in group
/// order; collective over it; run::ulysses_attention_forward with `mem`); a whole item only runs the
/// kernel, on slices of the caller's tensors. Errors: sizes that disagree with the view and shape, a piece
/// that is not plan_long_short's split, heads the group's degree does not divide (invalid_argument); the
/// kernel's and the exchange's. Results are equal bitwise on any memory for the same kernel arithmetic.
/// Cost: per whole item one block of its tokens squared; per piece Ulysses' five all-to-alls and one block.
template <class GroupOf, class Kernel, class T, model::memory_policy M>
void long_short_attention_forward(GroupOf&& group_of, const model::encoder_batch_view& v, Kernel& kernel,
                                  const long_short_attention_input<T>& in, std::span<T> out, std::span<T> lse,
                                  M& mem) {
  static_assert(detail::memory_of<detail::group_type<GroupOf>, M>,
                "run::long_short_attention_forward needs a memory policy of the communicator's memory space "
                "(the groups'): a device communicator needs a device memory policy (cuda::device_memory, "
                "model::emulated_device_memory) as the last argument");
  constexpr const char* who = "run::long_short_attention_forward";
  detail::check_long_short(v, in, out.size(), lse.size(), who);
  const auto qw = static_cast<std::size_t>(in.shape.q_heads * in.shape.head_dim);
  const auto hw = static_cast<std::size_t>(in.shape.q_heads);
  detail::for_each_piece_slice(
      v, in, [&](const model::encoder_piece& p, auto q, auto k, auto vv, std::size_t at, std::size_t n) {
        auto o = out.subspan(at * qw, n * qw);
        auto l = lse.subspan(at * hw, n * hw);
        if (p.degree == 1) {
          const auto s = detail::whole_item(p.item, n);
          kernel.forward(detail::item_block(in, q, k, vv, s.doc, s.pos),
                         model::attention_forward_out<T>{o, l});
          return;
        }
        const auto s = detail::make_piece_stream(p, in.shape, who);
        ulysses_attention_forward(
            group_of(p), s.plan, kernel,
            ulysses_attention_input<T>{in.shape, in.scale, q, k, vv, s.doc, s.pos, seq::block_mask::full}, o,
            l, mem);
      });
}

/// long_short_attention_forward on host memory (model::host_memory): host communicators, host tensors.
/// Device communicators are a compile-time error (pass a device memory policy). Same contract.
template <class GroupOf, class Kernel, class T>
void long_short_attention_forward(GroupOf&& group_of, const model::encoder_batch_view& v, Kernel& kernel,
                                  const long_short_attention_input<T>& in, std::span<T> out,
                                  std::span<T> lse) {
  model::host_memory mem;
  long_short_attention_forward(std::forward<GroupOf>(group_of), v, kernel, in, out, lse, mem);
}

/// Backward of long_short_attention_forward, over any memory (every tensor in `mem`'s space, the groups';
/// a compile-time error otherwise): from its inputs, out, lse and dout, writes (overwrites) dq, dk, dv of
/// this rank's tokens (a piece's include the other group members' queries' contributions). A whole item's
/// gradients are zeroed by mem.fill and its delta comes from mem.attention_delta before the kernel's
/// backward. Requires: M a model::attention_memory<M, T> (static_assert). Collective over each piece's
/// group, in the forward's order. Errors as the forward.
template <class GroupOf, class Kernel, class T, model::memory_policy M>
void long_short_attention_backward(GroupOf&& group_of, const model::encoder_batch_view& v, Kernel& kernel,
                                   const long_short_attention_input<T>& in, std::span<const T> out,
                                   std::span<const T> lse, std::span<const T> dout, std::span<T> dq,
                                   std::span<T> dk, std::span<T> dv, M& mem) {
  static_assert(detail::memory_of<detail::group_type<GroupOf>, M>,
                "run::long_short_attention_backward needs a memory policy of the communicator's memory space "
                "(the groups'): a device communicator needs a device memory policy (cuda::device_memory, "
                "model::emulated_device_memory) as the last argument");
  static_assert(model::attention_memory<M, T>,
                "run::long_short_attention_backward: the memory policy must model model::attention_memory<M, "
                "T>: attention_delta on its memory (model/attention_memory.hpp)");
  constexpr const char* who = "run::long_short_attention_backward";
  detail::check_long_short(v, in, out.size(), lse.size(), who);
  if (dout.size() != out.size() || dq.size() != in.q.size() || dk.size() != in.k.size() ||
      dv.size() != in.v.size())
    throw_error<invalid_argument>(
        "{}: dout {}, dq {}, dk {}, dv {} elements; expected out's {}, q's {}, k's {}", who, dout.size(),
        dq.size(), dk.size(), dv.size(), out.size(), in.q.size(), in.k.size());
  const auto qw = static_cast<std::size_t>(in.shape.q_heads * in.shape.head_dim);
  const auto kw = static_cast<std::size_t>(in.shape.kv_heads * in.shape.head_dim);
  const auto hw = static_cast<std::size_t>(in.shape.q_heads);
  typename M::template buffer<T> delta;  // a whole item's, reused across items
  detail::for_each_piece_slice(
      v, in, [&](const model::encoder_piece& p, auto q, auto k, auto vv, std::size_t at, std::size_t n) {
        const auto o = out.subspan(at * qw, n * qw);
        const auto l = lse.subspan(at * hw, n * hw);
        const auto d = dout.subspan(at * qw, n * qw);
        auto gq = dq.subspan(at * qw, n * qw);
        auto gk = dk.subspan(at * kw, n * kw);
        auto gv = dv.subspan(at * kw, n * kw);
        if (p.degree == 1) {
          const auto s = detail::whole_item(p.item, n);
          delta.resize(n * hw);
          const std::span<T> dl = delta.span();
          mem.attention_delta(o, d, dl, static_cast<std::size_t>(in.shape.head_dim));
          mem.fill(gq, T(0));
          mem.fill(gk, T(0));
          mem.fill(gv, T(0));
          kernel.backward(detail::item_block(in, q, k, vv, s.doc, s.pos),
                          model::attention_backward_io<T>{d, l, std::span<const T>(dl), gq, gk, gv});
          return;
        }
        const auto s = detail::make_piece_stream(p, in.shape, who);
        ulysses_attention_backward(
            group_of(p), s.plan, kernel,
            ulysses_attention_input<T>{in.shape, in.scale, q, k, vv, s.doc, s.pos, seq::block_mask::full}, o,
            l, d, gq, gk, gv, mem);
      });
}

/// long_short_attention_backward on host memory (model::host_memory): host communicators, host tensors.
/// Device communicators are a compile-time error (pass a device memory policy). Same contract.
template <class GroupOf, class Kernel, class T>
void long_short_attention_backward(GroupOf&& group_of, const model::encoder_batch_view& v, Kernel& kernel,
                                   const long_short_attention_input<T>& in, std::span<const T> out,
                                   std::span<const T> lse, std::span<const T> dout, std::span<T> dq,
                                   std::span<T> dk, std::span<T> dv) {
  model::host_memory mem;
  long_short_attention_backward(std::forward<GroupOf>(group_of), v, kernel, in, out, lse, dout, dq, dk, dv,
                                mem);
}

}  // namespace hetmesh::run
