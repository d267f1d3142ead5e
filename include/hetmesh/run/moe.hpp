// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: mixture-of-experts dispatch and combine over the expert-parallel group, forward and
// backward. The user's router gives each token k experts and k gate weights; moe_plan all-gathers the
// per-expert counts over ep and plans (seq/moe_dispatch.hpp: capacity, drops, the send order). Dispatch
// moves each kept (token, choice) row to the rank holding its expert with one all_to_all_v, grouped there by
// local expert; the user's experts run on those rows; combine brings their outputs back by the reverse
// all_to_all_v and sums them into per-token rows weighted by the gates (a dropped choice contributes zero).
// The backward of each is the transposed exchange. A layer is:
//   plan = moe_plan(ep, layout, policy, experts, gates, mem)
//   moe_dispatch_forward(ep, plan, h, x, expert_in, mem)      -> the experts' inputs
//   (the user's experts on expert_in, plan.expert_counts rows per local expert) -> expert_out
//   moe_combine_forward(ep, plan, h, expert_out, gates, routed, y, mem)
// and backward: moe_combine_backward -> d_expert_out and d_gates; the experts' backward -> d_expert_in;
// moe_dispatch_backward -> dx (summed over the k choices of each token).
//
// Every call is collective over the ep group `ep` (c.size() == plan.layout.ep; each rank passes its own
// plan of the same step, in the same order as its other collectives) and completes when it returns. Buffers
// live in the space of a memory policy M (model/memory_policy.hpp) equal to the communicator's (checked at
// compile time); rows are packed with one M copy per row or per (source, expert) chunk. The gate arithmetic
// of combine (a scaled row add and a row dot product) runs through the policy's optional members
// `m.scale_add(dst, alpha, src)` (dst += alpha[0] src) and `m.dot(out, x, y)` (out[0] = x . y), alpha and
// out one-element spans of M's space; a host-space policy without them gets a loop on the calling thread,
// a device policy without them is a compile-time error naming them. Deterministic: every sum runs in a fixed
// order (a token's choices in choice order), so results are bitwise equal run to run for a given ep.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../config.hpp"
#include "../core/error.hpp"
#include "../model/memory_policy.hpp"
#include "../seq/moe_aux_loss.hpp"
#include "../seq/moe_dispatch.hpp"
#include "agreement.hpp"
#include "detail/memory_fit.hpp"

#if HETMESH_SEPARATE_COMPILATION
#include "../comm/loopback.hpp"
#include "../model/host_memory.hpp"
#if HETMESH_COMPILED_MPI
#include "../comm/mpi.hpp"
#endif
#endif

namespace hetmesh::run {

namespace detail {

/// dst += alpha[0] x src on M's memory (M::scale_add, or a loop for a host policy).
template <class M, class T>
void moe_scale_add(const M& mem, std::span<T> dst, std::span<const T> alpha, std::span<const T> src) {
  if constexpr (requires { mem.scale_add(dst, alpha, src); }) {
    mem.scale_add(dst, alpha, src);
  } else {
    static_assert(M::space == memory_space::host,
                  "run::moe combine on device memory needs the policy member `scale_add(std::span<T> dst, "
                  "std::span<const T> alpha, std::span<const T> src) const` (dst += alpha[0] * src)");
    mem.synchronize();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i] += alpha[0] * src[i];
  }
}

/// out[0] = x . y on M's memory (M::dot, or a loop for a host policy), summed in index order.
template <class M, class T>
void moe_dot(const M& mem, std::span<T> out, std::span<const T> x, std::span<const T> y) {
  if constexpr (requires { mem.dot(out, x, y); }) {
    mem.dot(out, x, y);
  } else {
    static_assert(M::space == memory_space::host,
                  "run::moe_combine_backward on device memory needs the policy member `dot(std::span<T> out, "
                  "std::span<const T> x, std::span<const T> y) const` (out[0] = x . y)");
    mem.synchronize();
    T s{};
    for (std::size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
    out[0] = s;
  }
}

/// `mine` of every rank in rank order (all_gather), or summed over the group (all_reduce), in host memory:
/// directly over a host communicator, through M's buffers over a device one. Collective over c.
template <comm::communicator C, model::memory_policy M>
[[nodiscard]] std::vector<std::int64_t> moe_host_collective(C& c, const M& mem,
                                                            std::span<const std::int64_t> mine, bool gather) {
  std::vector<std::int64_t> out(gather ? mine.size() * static_cast<std::size_t>(c.size()) : mine.size());
  if constexpr (M::space == memory_space::host) {
    if (gather) {
      comm::all_gather(c, mine, std::span<std::int64_t>(out));
    } else {
      std::copy(mine.begin(), mine.end(), out.begin());
      comm::all_reduce(c, std::span<std::int64_t>(out), comm::reduce_op::sum);
    }
  } else {
    typename M::template buffer<std::int64_t> a, b;
    a.resize(mine.size());
    b.resize(out.size());
    mem.upload(a.span(), mine);
    if (gather) {
      comm::all_gather(c, std::span<const std::int64_t>(a.span()), b.span());
    } else {
      mem.copy(b.span(), std::span<const std::int64_t>(a.span()));
      comm::all_reduce(c, b.span(), comm::reduce_op::sum);
    }
    if constexpr (requires { c.synchronize(); }) c.synchronize();
    mem.download(std::span<std::int64_t>(out), std::span<const std::int64_t>(b.span()));
  }
  return out;
}

template <comm::communicator C>
void check_moe_call(const C& c, const seq::moe_dispatch_plan& p, std::int64_t width, const char* who,
                    std::initializer_list<std::pair<std::size_t, std::size_t>> sizes,
                    std::initializer_list<const char*> names) {
  if (c.size() != p.layout.ep || c.rank() != p.rank || width < 1)
    throw_error<invalid_argument>(
        "{} on {}: a group of {} ranks (this rank {}), a plan for ep {} (rank {}), width {}; expected the "
        "plan's ep group and rank and width >= 1",
        who, comm::describe(c), c.size(), c.rank(), p.layout.ep, p.rank, width);
  auto name = names.begin();
  for (const auto& [got, rows] : sizes) {
    if (got != rows * static_cast<std::size_t>(width))
      throw_error<invalid_argument>("{}: {} holds {} elements; expected {} rows of {} (the plan's)", who,
                                    *name, got, rows, width);
    ++name;
  }
}

/// Moves the expert buffer between its expert-major layout [local expert][source] and the source-major
/// one the exchange uses [source][local expert], one M copy per (source, expert) chunk. O(ep experts).
template <class T, class M>
void moe_reorder(const M& mem, const seq::moe_dispatch_plan& p, std::size_t w, std::span<const T> src,
                 std::span<T> dst, bool to_expert_major) {
  const auto ep = static_cast<std::size_t>(p.layout.ep);
  const auto le = static_cast<std::size_t>(p.layout.local_experts());
  const auto first = p.layout.first_expert(p.rank);
  auto rows = [&](std::size_t s, std::size_t j) {
    return static_cast<std::size_t>(p.kept_of(static_cast<int>(s), first + static_cast<std::int64_t>(j)));
  };
  std::vector<std::size_t> by_source(ep * le), by_expert(ep * le);
  std::size_t off = 0;
  for (std::size_t s = 0; s < ep; ++s)
    for (std::size_t j = 0; j < le; ++j) by_source[s * le + j] = std::exchange(off, off + rows(s, j));
  off = 0;
  for (std::size_t j = 0; j < le; ++j)
    for (std::size_t s = 0; s < ep; ++s) by_expert[s * le + j] = std::exchange(off, off + rows(s, j));
  for (std::size_t i = 0; i < ep * le; ++i) {
    const auto n = rows(i / le, i % le) * w;
    if (n == 0) continue;
    const auto from = (to_expert_major ? by_source[i] : by_expert[i]) * w;
    const auto to = (to_expert_major ? by_expert[i] : by_source[i]) * w;
    mem.copy(dst.subspan(to, n), src.subspan(from, n));
  }
}

/// One all_to_all_v of rows: send_rows[j] rows of `send` to rank j, recv_rows[i] rows from rank i.
template <comm::communicator C, class T>
void moe_exchange(C& c, std::span<const T> send, std::span<const std::int64_t> send_rows, std::span<T> recv,
                  std::span<const std::int64_t> recv_rows, std::size_t w) {
  const auto n = send_rows.size();
  std::vector<std::int64_t> sc(n), sd(n), rc(n), rd(n);
  std::int64_t so = 0, ro = 0;
  for (std::size_t r = 0; r < n; ++r) {
    sc[r] = send_rows[r] * static_cast<std::int64_t>(w);
    rc[r] = recv_rows[r] * static_cast<std::int64_t>(w);
    sd[r] = std::exchange(so, so + sc[r]);
    rd[r] = std::exchange(ro, ro + rc[r]);
  }
  comm::all_to_all_v(c, send, std::span<const std::int64_t>(sc), std::span<const std::int64_t>(sd), recv,
                     std::span<const std::int64_t>(rc), std::span<const std::int64_t>(rd));
}

/// The expert-side rows of the send buffer `send` [send_rows][w] (choice order of the plan): exchanged
/// and laid out expert-major into `expert` [expert_rows][w].
template <comm::communicator C, class T, class M>
void moe_to_experts(C& c, const M& mem, const seq::moe_dispatch_plan& p, std::size_t w,
                    std::span<const T> send, std::span<T> expert) {
  typename M::template buffer<T> recv;
  recv.resize(expert.size());
  moe_exchange(c, send, std::span<const std::int64_t>(p.send_counts), recv.span(),
               std::span<const std::int64_t>(p.recv_counts), w);
  moe_reorder(mem, p, w, std::span<const T>(recv.span()), expert, true);
}

/// The inverse of moe_to_experts: `expert` rows back to the ranks that sent them, into `back` [send_rows][w].
template <comm::communicator C, class T, class M>
void moe_from_experts(C& c, const M& mem, const seq::moe_dispatch_plan& p, std::size_t w,
                      std::span<const T> expert, std::span<T> back) {
  typename M::template buffer<T> src;
  src.resize(expert.size());
  moe_reorder(mem, p, w, expert, src.span(), false);
  moe_exchange(c, std::span<const T>(src.span()), std::span<const std::int64_t>(p.recv_counts), back,
               std::span<const std::int64_t>(p.send_counts), w);
}

}  // namespace detail

/// The dispatch plan of this step's MoE layer on the caller, ep rank ep.rank(): all-gathers the per-expert
/// counts of `experts` (the caller's routing, top_k expert ids per token, host memory) over `ep` and calls
/// seq::make_moe_dispatch_plan with them and `gates` (host, one per choice; read only by moe_drop::probs
/// under a capacity, may be empty otherwise). Collective over the ep group (c.size() == layout.ep). Post:
/// the plans of the group agree on capacity and kept counts (checked at the collective assertion level).
/// Errors: the planner's; a group that is not the layout's (invalid_argument). Cost: one all_gather of
/// experts int64 per rank, plus the planner's O(tokens k log(tokens k)).
template <comm::communicator C, model::memory_policy M, class G>
[[nodiscard]] seq::moe_dispatch_plan moe_plan(C& ep, const seq::moe_layout& layout,
                                              const seq::moe_capacity& policy,
                                              std::span<const std::int64_t> experts, std::span<const G> gates,
                                              const M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::moe_plan needs a memory policy of the communicator's memory space");
  layout.validate();
  if (ep.size() != layout.ep)
    throw_error<invalid_argument>("run::moe_plan on {}: a group of {} ranks; expected the layout's ep {}",
                                  comm::describe(ep), ep.size(), layout.ep);
  const auto mine = seq::moe_expert_counts(layout, experts);
  const auto all = detail::moe_host_collective(ep, mem, std::span<const std::int64_t>(mine), true);
  const std::vector<double> g(gates.begin(), gates.end());
  auto plan = seq::make_moe_dispatch_plan(layout, policy, ep.rank(), experts, g, all);
  if constexpr (assertion_enabled(assertion_level::collective))
    check_plan_agreement(ep, mem, std::pair{plan.capacity, plan.kept}, "MoE kept counts");
  return plan;
}

/// Dispatch forward: copies row t of `x` [plan.tokens][width] once per kept choice of token t to the rank
/// holding its expert; writes `expert_in` [plan.expert_rows()][width], this rank's experts' rows grouped by
/// local expert (plan.expert_counts[j] rows of local expert j, by source rank, then the source's choice
/// order). Collective over ep. Errors: sizes that do not match the plan, a group that is not the plan's
/// (invalid_argument); the communicator's. Cost: one M copy per kept choice and per chunk, one all_to_all_v
/// of the kept rows.
template <comm::communicator C, class T, model::memory_policy M>
void moe_dispatch_forward(C& ep, const seq::moe_dispatch_plan& plan, std::int64_t width, std::span<const T> x,
                          std::span<T> expert_in, const M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::moe_dispatch_forward needs a memory policy of the communicator's space");
  detail::check_moe_call(ep, plan, width, "run::moe_dispatch_forward",
                         {{x.size(), static_cast<std::size_t>(plan.tokens)},
                          {expert_in.size(), static_cast<std::size_t>(plan.expert_rows())}},
                         {"x", "expert_in"});
  const auto w = static_cast<std::size_t>(width);
  const auto k = static_cast<std::size_t>(plan.layout.top_k);
  typename M::template buffer<T> send;
  send.resize(static_cast<std::size_t>(plan.send_rows()) * w);
  for (std::size_t i = 0; i < plan.send_order.size(); ++i)
    mem.copy(send.span().subspan(i * w, w),
             x.subspan(static_cast<std::size_t>(plan.send_order[i]) / k * w, w));
  detail::moe_to_experts(ep, mem, plan, w, std::span<const T>(send.span()), expert_in);
}

/// Dispatch backward: `d_expert_in` [plan.expert_rows()][width] (the loss gradient of the experts' inputs,
/// laid out as moe_dispatch_forward wrote them) goes back to the ranks that sent the rows; `dx`
/// [plan.tokens][width] = the sum over each token's kept choices, in choice order, of their gradient rows
/// (overwritten; a token with no kept choice gets zero). Collective over ep. Errors and cost: as
/// moe_dispatch_forward, plus one M add per kept choice.
template <comm::communicator C, class T, model::memory_policy M>
void moe_dispatch_backward(C& ep, const seq::moe_dispatch_plan& plan, std::int64_t width,
                           std::span<const T> d_expert_in, std::span<T> dx, const M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::moe_dispatch_backward needs a memory policy of the communicator's space");
  detail::check_moe_call(ep, plan, width, "run::moe_dispatch_backward",
                         {{d_expert_in.size(), static_cast<std::size_t>(plan.expert_rows())},
                          {dx.size(), static_cast<std::size_t>(plan.tokens)}},
                         {"d_expert_in", "dx"});
  const auto w = static_cast<std::size_t>(width);
  const auto k = static_cast<std::size_t>(plan.layout.top_k);
  typename M::template buffer<T> back;
  back.resize(static_cast<std::size_t>(plan.send_rows()) * w);
  detail::moe_from_experts(ep, mem, plan, w, d_expert_in, back.span());
  mem.fill(dx, T(0));
  for (std::size_t c = 0; c < plan.row_of_choice.size(); ++c)
    if (const auto row = plan.row_of_choice[c]; row >= 0)
      mem.add(dx.subspan(c / k * w, w),
              std::span<const T>(back.span()).subspan(static_cast<std::size_t>(row) * w, w));
}

/// Combine forward: `expert_out` [plan.expert_rows()][width] (the experts' outputs, laid out as
/// moe_dispatch_forward wrote their inputs) goes back to the ranks that sent the rows; writes `routed`
/// [plan.tokens k][width] (row c the output of choice c; zero for a dropped choice; keep it for the
/// backward) and `y` [plan.tokens][width] = sum over j, in order, of gates[t k + j] x routed[t k + j].
/// `gates` [plan.tokens k] in M's space. Collective over ep. Errors: as moe_dispatch_forward. Cost: one
/// all_to_all_v of the kept rows, one M copy per chunk and per kept choice, one scale_add per kept choice.
template <comm::communicator C, class T, model::memory_policy M>
void moe_combine_forward(C& ep, const seq::moe_dispatch_plan& plan, std::int64_t width,
                         std::span<const T> expert_out, std::span<const T> gates, std::span<T> routed,
                         std::span<T> y, const M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::moe_combine_forward needs a memory policy of the communicator's space");
  const auto choices = plan.row_of_choice.size();
  detail::check_moe_call(ep, plan, width, "run::moe_combine_forward",
                         {{expert_out.size(), static_cast<std::size_t>(plan.expert_rows())},
                          {gates.size() * static_cast<std::size_t>(width), choices},
                          {routed.size(), choices},
                          {y.size(), static_cast<std::size_t>(plan.tokens)}},
                         {"expert_out", "gates (x width)", "routed", "y"});
  const auto w = static_cast<std::size_t>(width);
  const auto k = static_cast<std::size_t>(plan.layout.top_k);
  typename M::template buffer<T> back;
  back.resize(static_cast<std::size_t>(plan.send_rows()) * w);
  detail::moe_from_experts(ep, mem, plan, w, expert_out, back.span());
  mem.fill(routed, T(0));
  mem.fill(y, T(0));
  for (std::size_t c = 0; c < choices; ++c) {
    const auto row = plan.row_of_choice[c];
    if (row < 0) continue;
    mem.copy(routed.subspan(c * w, w),
             std::span<const T>(back.span()).subspan(static_cast<std::size_t>(row) * w, w));
    detail::moe_scale_add(mem, y.subspan(c / k * w, w), gates.subspan(c, 1),
                          std::span<const T>(routed).subspan(c * w, w));
  }
}

/// Combine backward: from `dy` [plan.tokens][width] (the loss gradient of combine's output), `gates` and
/// `routed` (as moe_combine_forward took and wrote them), writes `d_gates` [plan.tokens k] (d_gates[c] =
/// dy[t] . routed[c]; zero for a dropped choice) and `d_expert_out` [plan.expert_rows()][width] (gates[c] x
/// dy[t] at the row of choice c, laid out as expert_out). Collective over ep. Errors: as
/// moe_combine_forward. Cost: one dot and one scale_add per kept choice, one all_to_all_v of the kept rows.
template <comm::communicator C, class T, model::memory_policy M>
void moe_combine_backward(C& ep, const seq::moe_dispatch_plan& plan, std::int64_t width,
                          std::span<const T> dy, std::span<const T> gates, std::span<const T> routed,
                          std::span<T> d_expert_out, std::span<T> d_gates, const M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::moe_combine_backward needs a memory policy of the communicator's space");
  const auto choices = plan.row_of_choice.size();
  detail::check_moe_call(ep, plan, width, "run::moe_combine_backward",
                         {{dy.size(), static_cast<std::size_t>(plan.tokens)},
                          {gates.size() * static_cast<std::size_t>(width), choices},
                          {routed.size(), choices},
                          {d_expert_out.size(), static_cast<std::size_t>(plan.expert_rows())},
                          {d_gates.size() * static_cast<std::size_t>(width), choices}},
                         {"dy", "gates (x width)", "routed", "d_expert_out", "d_gates (x width)"});
  const auto w = static_cast<std::size_t>(width);
  const auto k = static_cast<std::size_t>(plan.layout.top_k);
  mem.fill(d_gates, T(0));
  for (std::size_t c = 0; c < choices; ++c)
    if (plan.row_of_choice[c] >= 0)
      detail::moe_dot(mem, d_gates.subspan(c, 1), dy.subspan(c / k * w, w), routed.subspan(c * w, w));
  typename M::template buffer<T> send;
  send.resize(static_cast<std::size_t>(plan.send_rows()) * w);
  mem.fill(send.span(), T(0));
  for (std::size_t i = 0; i < plan.send_order.size(); ++i) {
    const auto c = static_cast<std::size_t>(plan.send_order[i]);
    detail::moe_scale_add(mem, send.span().subspan(i * w, w), gates.subspan(c, 1), dy.subspan(c / k * w, w));
  }
  detail::moe_to_experts(ep, mem, plan, w, std::span<const T>(send.span()), d_expert_out);
}

/// The load-balancing auxiliary loss of the caller's router over `group` (the ep group, or any group whose
/// tokens the loss should balance): sums the per-expert counts of `experts` (routing, top_k ids per token)
/// and the token counts over the group, then seq::moe_aux_loss on `probs` [tokens][layout.experts] (host
/// memory; every expert's router probability). The caller's share and its gradient (one constant per
/// expert); the shares of the group sum to coeff E sum_e f_e P_e over the group's tokens. Collective over
/// `group`. Errors: probs not one row per token (invalid_argument); moe_expert_counts'. Cost: one all_reduce
/// of experts + 1 int64, O(tokens experts).
template <comm::communicator C, model::memory_policy M, class T>
[[nodiscard]] seq::moe_aux_loss_value moe_aux_loss(C& group, const seq::moe_layout& layout,
                                                   std::span<const std::int64_t> experts,
                                                   std::span<const T> probs, double coeff, const M& mem) {
  static_assert(detail::memory_of<C, M>,
                "run::moe_aux_loss needs a memory policy of the communicator's space");
  auto counts = seq::moe_expert_counts(layout, experts);
  const auto tokens = static_cast<std::int64_t>(experts.size()) / layout.top_k;
  if (probs.size() != static_cast<std::size_t>(tokens * layout.experts))
    throw_error<invalid_argument>(
        "run::moe_aux_loss: {} probabilities for {} tokens of {} experts; expected one "
        "per token and expert",
        probs.size(), tokens, layout.experts);
  counts.push_back(tokens);
  const auto sum = detail::moe_host_collective(group, mem, std::span<const std::int64_t>(counts), false);
  return seq::moe_aux_loss(probs, std::span<const std::int64_t>(sum).first(sum.size() - 1), sum.back(),
                           layout.top_k, coeff);
}

// Compiled once (HETMESH_SEPARATE_COMPILATION): the MoE dispatch, combine and auxiliary loss over the
// loopback communicator (and MPI's with HETMESH_COMPILED_MPI) for float and double in host memory.
// HETMESH_INSTANTIATE is `extern template` in every translation unit but the one of <hetmesh/src.hpp>
// (config.hpp).
#if HETMESH_SEPARATE_COMPILATION
#define HETMESH_RUN_MOE_INSTANCE(C, T)                                                                       \
  HETMESH_INSTANTIATE void moe_dispatch_forward<C, T, model::host_memory>(                                   \
      C&, const seq::moe_dispatch_plan&, std::int64_t, std::span<const T>, std::span<T>,                     \
      const model::host_memory&);                                                                            \
  HETMESH_INSTANTIATE void moe_dispatch_backward<C, T, model::host_memory>(                                  \
      C&, const seq::moe_dispatch_plan&, std::int64_t, std::span<const T>, std::span<T>,                     \
      const model::host_memory&);                                                                            \
  HETMESH_INSTANTIATE void moe_combine_forward<C, T, model::host_memory>(                                    \
      C&, const seq::moe_dispatch_plan&, std::int64_t, std::span<const T>, std::span<const T>, std::span<T>, \
      std::span<T>, const model::host_memory&);                                                              \
  HETMESH_INSTANTIATE void moe_combine_backward<C, T, model::host_memory>(                                   \
      C&, const seq::moe_dispatch_plan&, std::int64_t, std::span<const T>, std::span<const T>,               \
      std::span<const T>, std::span<T>, std::span<T>, const model::host_memory&);                            \
  HETMESH_INSTANTIATE seq::moe_aux_loss_value moe_aux_loss<C, model::host_memory, T>(                        \
      C&, const seq::moe_layout&, std::span<const std::int64_t>, std::span<const T>, double,                 \
      const model::host_memory&);
HETMESH_RUN_MOE_INSTANCE(comm::loopback::communicator, float)
HETMESH_RUN_MOE_INSTANCE(comm::loopback::communicator, double)
#if HETMESH_COMPILED_MPI
HETMESH_RUN_MOE_INSTANCE(comm::mpi::communicator, float)
HETMESH_RUN_MOE_INSTANCE(comm::mpi::communicator, double)
#endif
#undef HETMESH_RUN_MOE_INSTANCE
#endif

}  // namespace hetmesh::run
