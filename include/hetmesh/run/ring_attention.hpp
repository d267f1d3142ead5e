// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: ring attention, forward and backward, over any ordered ring of ranks of a parent
// communicator -- a CP group, or an HDP ring that is a subset of the pool -- driven by a
// seq::ring_schedule and the user's model::attention_kernel. Rings are not communicators: the KV moves
// by grouped send/recv on the parent (docs/comm.md: dynamic rings reuse one parent communicator), so one
// communicator serves every ring of every step.
//
// Forward at ring position p, step t = 0..D-1: the kernel computes the step's (q chunk, kv chunk)
// blocks against the KV that came from position steps[p][t].kv_source; the memory policy's
// merge_attention (seq::merge_partial) folds each block into the running (out, lse); then (t < D-1) the KV
// goes to the next position while the previous one's arrives, as one group_p2p batch (a matched batch never
// deadlocks, whatever D). Backward: the same steps, with dK/dV accumulators travelling with the KV; after
// step D-1 one last hop sends each accumulator to the next position, which owns it (seq/ring.hpp). Token
// documents and positions follow from the schedule's chunks, so only K, V (and dK, dV) travel.
//
// Any memory: the calls are generic over a model::attention_memory M (a model::memory_policy that also
// merges attention partials) whose space is the communicator's.
// Scratch (the KV in flight, dK/dV accumulators, a block's partial output) is M's buffers; the fills,
// merges (M::merge_attention) and delta (M::attention_delta) run through M; the CPU never reads or
// writes a tensor. The kernel receives tensors of M's space and host metadata (model/attention.hpp).
// Host communicators (loopback, mpi) may omit the policy (model::host_memory); a device communicator
// (NCCL, comm::emulated_device) needs a device policy (cuda::device_memory,
// model::emulated_device_memory), checked at compile time. On a device path the kernel, M's operations
// and the communicator's batches are stream-ordered on the stream M and C share: nothing here waits on
// the stream (but the collective-level schedule check, which downloads the neighbour's hash), and
// scratch is resized and released while queued work may still use it, so a device policy's buffers
// must free in stream order (or synchronously, as cudaFree does). With opt.overlap, a hop's batch is
// enqueued from a helper thread while the caller's thread enqueues the step's compute.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <limits>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../core/memory_space.hpp"
#include "../model/attention.hpp"
#include "../model/attention_memory.hpp"
#include "../model/host_memory.hpp"
#include "../seq/ring.hpp"
#include "detail/ring_context.hpp"
#include "ring_io.hpp"

namespace hetmesh::run {

namespace detail {

template <class C, class M, class K, class T>
void ring_forward(C& c, M& mem, const seq::ring_schedule& s, K& kernel, const ring_attention_input<T>& in,
                  std::span<T> out, std::span<T> lse, const ring_attention_options& opt) {
  using buffer = typename M::template buffer<T>;
  constexpr const char* who = "run::ring_attention_forward";
  auto x = detail::make_ctx(c, s, in, opt, who);
  const std::size_t n = x.tokens(x.p);
  detail::check_size<T>(out.size(), n * x.q_row(), "out", who);
  detail::check_size<T>(lse.size(), n * x.hq, "lse", who);
  int t = -1;
  try {
    detail::check_neighbours(c, mem, x, opt, who);
    mem.fill(out, T(0));
    mem.fill(lse, -std::numeric_limits<T>::infinity());
    buffer k_cur, v_cur, k_nxt, v_nxt, ob, lb;
    std::span<const T> k = in.k, v = in.v;  // step 0 reads the caller's own KV, no copy
    for (t = 0; t < x.d; ++t) {
      const auto& st = s.steps[static_cast<std::size_t>(x.p)][static_cast<std::size_t>(t)];
      const bool hop = t + 1 < x.d;
      comm::p2p_op ops[4];
      if (hop) {  // the KV in hand goes on; the previous position's arrives into the spare buffers
        const int src = s.steps[static_cast<std::size_t>(x.p)][static_cast<std::size_t>(t + 1)].kv_source;
        const std::size_t m = x.tokens(src) * x.kv_row();
        k_nxt.resize(m);
        v_nxt.resize(m);
        ops[0] = comm::send_op(k, x.next, opt.tag);
        ops[1] = comm::send_op(v, x.next, opt.tag + 1);
        ops[2] = comm::recv_op(k_nxt.span(), x.prev, opt.tag);
        ops[3] = comm::recv_op(v_nxt.span(), x.prev, opt.tag + 1);
      }
      background_p2p bg;
      if (hop && opt.overlap) bg.start(c, std::span<const comm::p2p_op>(ops));
      for (const auto& pr : st.pairs) {
        if (pr.mask == seq::block_mask::none) continue;
        const auto b = detail::block_of(x, pr, st.kv_source, k, v);
        const auto rows = b.q_doc.size() * x.hq;
        ob.resize(rows * x.dim);
        lb.resize(rows);
        kernel.forward(b, model::attention_forward_out<T>{ob.span(), lb.span()});
        const auto r0 =
            static_cast<std::size_t>(
                s.chunks[static_cast<std::size_t>(x.p)][static_cast<std::size_t>(pr.q_chunk)].local_offset) *
            x.hq;
        mem.merge_attention(out.subspan(r0 * x.dim, rows * x.dim), lse.subspan(r0, rows),
                            std::span<const T>(ob.span()), std::span<const T>(lb.span()), x.dim);
      }
      if (!hop) break;
      if (opt.overlap)
        bg.join();
      else
        comm::group_p2p(c, std::span<const comm::p2p_op>(ops));
      std::swap(k_cur, k_nxt);
      std::swap(v_cur, v_nxt);
      k = k_cur.span();
      v = v_cur.span();
    }
  } catch (error& e) {
    e.add_context(detail::where(c, x, who, t));
    throw;
  }
}

template <class C, class M, class K, class T>
void ring_backward(C& c, M& mem, const seq::ring_schedule& s, K& kernel, const ring_attention_input<T>& in,
                   std::span<const T> out, std::span<const T> lse, std::span<const T> dout, std::span<T> dq,
                   std::span<T> dk, std::span<T> dv, const ring_attention_options& opt) {
  constexpr const char* who = "run::ring_attention_backward";
  using buffer = typename M::template buffer<T>;
  auto x = detail::make_ctx(c, s, in, opt, who);
  const std::size_t n = x.tokens(x.p);
  detail::check_size<T>(out.size(), n * x.q_row(), "out", who);
  detail::check_size<T>(dout.size(), n * x.q_row(), "dout", who);
  detail::check_size<T>(dq.size(), n * x.q_row(), "dq", who);
  detail::check_size<T>(lse.size(), n * x.hq, "lse", who);
  detail::check_size<T>(dk.size(), n * x.kv_row(), "dk", who);
  detail::check_size<T>(dv.size(), n * x.kv_row(), "dv", who);
  int t = -1;
  try {
    detail::check_neighbours(c, mem, x, opt, who);
    buffer delta;
    delta.resize(n * x.hq);
    mem.attention_delta(out, dout, delta.span(), x.dim);
    mem.fill(dq, T(0));
    // Accumulators of the KV in hand: a ring of one rank accumulates straight into dk, dv.
    buffer k_cur, v_cur, dk_cur, dv_cur, k_nxt, v_nxt, dk_nxt, dv_nxt;
    std::span<const T> k = in.k, v = in.v;
    std::span<T> gk = dk, gv = dv;
    if (x.d > 1) {
      dk_cur.resize(dk.size());
      dv_cur.resize(dv.size());
      gk = dk_cur.span();
      gv = dv_cur.span();
    }
    mem.fill(gk, T(0));
    mem.fill(gv, T(0));
    for (t = 0; t < x.d; ++t) {
      const auto& st = s.steps[static_cast<std::size_t>(x.p)][static_cast<std::size_t>(t)];
      const bool hop = t + 1 < x.d;
      comm::p2p_op ops[8];  // K, V out; K, V in; then dK, dV out and in
      if (hop) {
        const int src = s.steps[static_cast<std::size_t>(x.p)][static_cast<std::size_t>(t + 1)].kv_source;
        const std::size_t m = x.tokens(src) * x.kv_row();
        k_nxt.resize(m);
        v_nxt.resize(m);
        dk_nxt.resize(m);
        dv_nxt.resize(m);
        ops[0] = comm::send_op(k, x.next, opt.tag);
        ops[1] = comm::send_op(v, x.next, opt.tag + 1);
        ops[2] = comm::recv_op(k_nxt.span(), x.prev, opt.tag);
        ops[3] = comm::recv_op(v_nxt.span(), x.prev, opt.tag + 1);
        ops[4] = comm::send_op(std::span<const T>(gk), x.next, opt.tag + 2);
        ops[5] = comm::send_op(std::span<const T>(gv), x.next, opt.tag + 3);
        ops[6] = comm::recv_op(dk_nxt.span(), x.prev, opt.tag + 2);
        ops[7] = comm::recv_op(dv_nxt.span(), x.prev, opt.tag + 3);
      }
      // Overlap: K and V are only read by the compute, so they may leave now; the accumulators follow it.
      background_p2p bg;
      if (hop && opt.overlap) bg.start(c, std::span<const comm::p2p_op>(ops, 4));
      for (const auto& pr : st.pairs) {
        if (pr.mask == seq::block_mask::none) continue;
        const auto b = detail::block_of(x, pr, st.kv_source, k, v);
        const auto& qc = s.chunks[static_cast<std::size_t>(x.p)][static_cast<std::size_t>(pr.q_chunk)];
        const auto& kc =
            s.chunks[static_cast<std::size_t>(st.kv_source)][static_cast<std::size_t>(pr.kv_chunk)];
        const auto q0 = static_cast<std::size_t>(qc.local_offset), nq = b.q_doc.size();
        const auto k0 = static_cast<std::size_t>(kc.local_offset), nk = b.k_doc.size();
        model::attention_backward_io<T> io;
        io.dout = dout.subspan(q0 * x.q_row(), nq * x.q_row());
        io.lse = lse.subspan(q0 * x.hq, nq * x.hq);
        io.delta = std::span<const T>(delta.span()).subspan(q0 * x.hq, nq * x.hq);
        io.dq = dq.subspan(q0 * x.q_row(), nq * x.q_row());
        io.dk = gk.subspan(k0 * x.kv_row(), nk * x.kv_row());
        io.dv = gv.subspan(k0 * x.kv_row(), nk * x.kv_row());
        kernel.backward(b, io);
      }
      if (x.d == 1) break;
      if (hop) {  // KV and its accumulators move on together
        if (opt.overlap) {
          bg.join();
          comm::group_p2p(c, std::span<const comm::p2p_op>(ops + 4, 4));
        } else {
          comm::group_p2p(c, std::span<const comm::p2p_op>(ops));
        }
        std::swap(k_cur, k_nxt);
        std::swap(v_cur, v_nxt);
        std::swap(dk_cur, dk_nxt);
        std::swap(dv_cur, dv_nxt);
        k = k_cur.span();
        v = v_cur.span();
        gk = dk_cur.span();
        gv = dv_cur.span();
      } else {  // last hop: the accumulators in hand belong to the next position; ours arrive in place
        const comm::p2p_op last[4] = {comm::send_op(std::span<const T>(gk), x.next, opt.tag + 2),
                                      comm::send_op(std::span<const T>(gv), x.next, opt.tag + 3),
                                      comm::recv_op(dk, x.prev, opt.tag + 2),
                                      comm::recv_op(dv, x.prev, opt.tag + 3)};
        comm::group_p2p(c, std::span<const comm::p2p_op>(last));
      }
    }
  } catch (error& e) {
    e.add_context(detail::where(c, x, who, t));
    throw;
  }
}

/// Whether memory policy M fits communicator C: M's buffers live where C's operations take them.
template <class C, class M>
inline constexpr bool memory_fits = M::space == std::remove_cvref_t<C>::memory;

}  // namespace detail

/// Ring attention forward at the caller's position of ring `s`, on the parent communicator `c`, with
/// scratch and arithmetic through memory policy `mem`.
/// Requires: M::space == C::memory (a device communicator needs a device memory policy, a host one
/// model::host_memory), M a model::attention_memory<M, T> (it merges the blocks) and K a
/// model::attention_kernel<K, T> (static_asserts).
/// Pre: every rank of s.ring calls it with the same schedule (checked between neighbours at the
/// `collective` assertion level), ranks of s.ring are ranks of `c`, and this rank is one of them;
/// `in` holds this position's tokens in the schedule's local order; in.q, in.k, in.v, out and lse are
/// memory of M's space (a device policy refuses or faults on host memory), out and lse sized
/// [tokens][q_heads][head_dim] and [tokens][q_heads] (invalid_argument otherwise). A device M and C
/// share one stream (model::memory_policy), which the kernel also enqueues on.
/// Post: out and lse hold the attention of the local queries over every key of the ring they see (per
/// document, causal), merged across blocks; rows that see no key get lse = -infinity and out = 0. On a
/// device path the results are ordered on the shared stream (complete once it is synchronised); the CPU
/// has read or written no tensor. Collective over the ranks of s.ring only (other ranks of `c` do not
/// take part; rings on disjoint ranks may run at once). A ring of one rank only runs the kernel and the
/// merges. Errors (hetmesh::error) carry the ring, the position and the step. Deterministic for a
/// deterministic kernel and policy: a device path over an emulated device equals the host path bit for
/// bit. Cost: the kernel on every pair of the schedule, one merge per pair (O(rows * head_dim)), and D-1
/// hops each sending and receiving one KV (2 * tokens * kv_heads * head_dim elements), overlapped with
/// the step's compute when opt.overlap; two KV buffers and one block's output of scratch, from `mem`.
template <comm::communicator C, class K, class T, model::memory_policy M>
void ring_attention_forward(C& c, const seq::ring_schedule& s, K& kernel, const ring_attention_input<T>& in,
                            std::span<T> out, std::span<T> lse, M& mem,
                            const ring_attention_options& opt = {}) {
  static_assert(detail::memory_fits<C, M>,
                "run::ring_attention_forward: the memory policy's space must be the communicator's memory: a "
                "device communicator needs a device memory policy (cuda::device_memory, "
                "model::emulated_device_memory), a host communicator model::host_memory");
  static_assert(model::attention_memory<M, T>,
                "run::ring_attention_forward: the memory policy must model model::attention_memory<M, T>: "
                "merge_attention and attention_delta on its memory (model/attention_memory.hpp)");
  static_assert(model::attention_kernel<K, T>,
                "run::ring_attention_forward: K must model model::attention_kernel<K, T>: "
                "k.forward(const attention_block<T>&, attention_forward_out<T>) and "
                "k.backward(const attention_block<T>&, attention_backward_io<T>)");
  // Only a conforming call is instantiated, so the static_asserts above are the only errors a user reads.
  if constexpr (detail::memory_fits<C, M> && model::attention_memory<M, T> && model::attention_kernel<K, T>)
    detail::ring_forward(c, mem, s, kernel, in, out, lse, opt);
}

/// Ring attention forward on a host communicator, in host memory (model::host_memory): as the overload
/// with a memory policy. Requires: C is a host communicator (static_assert: a device communicator needs
/// a device memory policy, passed as `mem`).
template <comm::communicator C, class K, class T>
void ring_attention_forward(C& c, const seq::ring_schedule& s, K& kernel, const ring_attention_input<T>& in,
                            std::span<T> out, std::span<T> lse, const ring_attention_options& opt = {}) {
  static_assert(
      comm::host_communicator<C>,
      "run::ring_attention_forward: a device communicator needs a device memory policy: call "
      "ring_attention_forward(c, s, kernel, in, out, lse, mem, opt) with mem a model::memory_policy "
      "of memory_space::device (cuda::device_memory; model::emulated_device_memory over "
      "comm::emulated_device)");
  if constexpr (comm::host_communicator<C>) {
    model::host_memory mem;
    ring_attention_forward(c, s, kernel, in, out, lse, mem, opt);
  }
}

/// Ring attention backward at the caller's position of ring `s`, on the parent communicator `c`, with
/// scratch and arithmetic through memory policy `mem`: given the forward's inputs, its merged out and
/// lse, and dout, writes dq, dk and dv of the local tokens. The KV travels the ring again with dK/dV
/// accumulators; after the last step each accumulator makes one more hop, to its owner.
/// Requires: as ring_attention_forward. Pre: as ring_attention_forward, with out, lse from it (or an
/// equal computation) and dout, dq sized like q and dk, dv like k (invalid_argument otherwise), every
/// tensor memory of M's space.
/// Post: dq, dk, dv hold the gradients of sum(dout * out) with respect to the local q, k, v over the
/// whole ring (overwritten, not accumulated; on a device path ordered on the shared stream). Collective
/// over the ranks of s.ring only. Errors carry the ring, the position and the step. Deterministic for a
/// deterministic kernel and policy. Cost: the kernel's backward on every pair; one delta
/// (M::attention_delta); D-1 hops of KV plus dK/dV (4 * tokens * kv_heads * head_dim elements each way)
/// and one last hop of dK/dV; four KV-sized buffers and the delta of scratch, from `mem`.
template <comm::communicator C, class K, class T, model::memory_policy M>
void ring_attention_backward(C& c, const seq::ring_schedule& s, K& kernel, const ring_attention_input<T>& in,
                             std::span<const T> out, std::span<const T> lse, std::span<const T> dout,
                             std::span<T> dq, std::span<T> dk, std::span<T> dv, M& mem,
                             const ring_attention_options& opt = {}) {
  static_assert(
      detail::memory_fits<C, M>,
      "run::ring_attention_backward: the memory policy's space must be the communicator's memory: a "
      "device communicator needs a device memory policy (cuda::device_memory, "
      "model::emulated_device_memory), a host communicator model::host_memory");
  static_assert(model::attention_memory<M, T>,
                "run::ring_attention_backward: the memory policy must model model::attention_memory<M, T>: "
                "merge_attention and attention_delta on its memory (model/attention_memory.hpp)");
  static_assert(model::attention_kernel<K, T>,
                "run::ring_attention_backward: K must model model::attention_kernel<K, T>: "
                "k.forward(const attention_block<T>&, attention_forward_out<T>) and "
                "k.backward(const attention_block<T>&, attention_backward_io<T>)");
  if constexpr (detail::memory_fits<C, M> && model::attention_memory<M, T> && model::attention_kernel<K, T>)
    detail::ring_backward(c, mem, s, kernel, in, out, lse, dout, dq, dk, dv, opt);
}

/// Ring attention backward on a host communicator, in host memory (model::host_memory): as the
/// overload with a memory policy. Requires: C is a host communicator (static_assert: a device
/// communicator needs a device memory policy, passed as `mem`).
template <comm::communicator C, class K, class T>
void ring_attention_backward(C& c, const seq::ring_schedule& s, K& kernel, const ring_attention_input<T>& in,
                             std::span<const T> out, std::span<const T> lse, std::span<const T> dout,
                             std::span<T> dq, std::span<T> dk, std::span<T> dv,
                             const ring_attention_options& opt = {}) {
  static_assert(comm::host_communicator<C>,
                "run::ring_attention_backward: a device communicator needs a device memory policy: call "
                "ring_attention_backward(c, s, kernel, in, out, lse, dout, dq, dk, dv, mem, opt) with mem a "
                "model::memory_policy of memory_space::device (cuda::device_memory; "
                "model::emulated_device_memory over comm::emulated_device)");
  if constexpr (comm::host_communicator<C>) {
    model::host_memory mem;
    ring_attention_backward(c, s, kernel, in, out, lse, dout, dq, dk, dv, mem, opt);
  }
}

/// Ring attention forward over several rings in sequence, with memory policy `mem`: the multi-ring
/// entry for one rank of an HDP plan, which may belong to several rings of one step (a pack on its own,
/// a ring of 2, a ring of 5, ...). Runs ring_attention_forward for each task in order; a task whose
/// ring has one rank runs the kernel locally (packed whole sequences), without communication.
/// Requires: as ring_attention_forward; Tasks a range of ring_forward_task<T> (static_assert).
/// Pre: every rank lists the rings it belongs to in one global order, so that each ring's members
/// reach it together (seq::hdp_plan::per_rank is in that order: by (order key, item)); otherwise
/// the call times out naming the ring. Tasks' schedules are non-null; their tensors are memory of M's
/// space. Post and cost: those of ring_attention_forward, summed. Collective over the union of the
/// tasks' rings, ring by ring.
template <comm::communicator C, class K, std::ranges::input_range Tasks, model::memory_policy M>
void ring_attention_forward_all(C& c, const Tasks& tasks, K& kernel, M& mem,
                                const ring_attention_options& opt = {}) {
  using task = std::ranges::range_value_t<Tasks>;
  static_assert(std::is_same_v<task, ring_forward_task<typename task::value_type>>,
                "run::ring_attention_forward_all takes a range of run::ring_forward_task<T>");
  std::size_t i = 0;
  for (const auto& tk : tasks) {
    if (tk.schedule == nullptr)
      throw_error<invalid_argument>("run::ring_attention_forward_all: task {} has no schedule; expected one",
                                    i);
    try {
      ring_attention_forward(c, *tk.schedule, kernel, tk.in, tk.out, tk.lse, mem, opt);
    } catch (error& e) {
      e.add_context(hetmesh::format("run::ring_attention_forward_all: task {}", i));
      throw;
    }
    ++i;
  }
}

/// The multi-ring forward on a host communicator, in host memory (model::host_memory): as the overload
/// with a memory policy. Requires: C is a host communicator (static_assert).
template <comm::communicator C, class K, std::ranges::input_range Tasks>
void ring_attention_forward_all(C& c, const Tasks& tasks, K& kernel, const ring_attention_options& opt = {}) {
  static_assert(comm::host_communicator<C>,
                "run::ring_attention_forward_all: a device communicator needs a device memory policy: call "
                "ring_attention_forward_all(c, tasks, kernel, mem, opt) with mem a model::memory_policy of "
                "memory_space::device (cuda::device_memory; model::emulated_device_memory over "
                "comm::emulated_device)");
  if constexpr (comm::host_communicator<C>) {
    model::host_memory mem;
    ring_attention_forward_all(c, tasks, kernel, mem, opt);
  }
}

/// Ring attention backward over several rings in sequence, with memory policy `mem`:
/// ring_attention_backward per task, in order (the multi-ring entry of HDP; rings of one rank run
/// locally). Requires: as ring_attention_backward; Tasks a range of ring_backward_task<T>
/// (static_assert). Pre: as ring_attention_forward_all, with the forward's results in each task.
/// Post and cost: those of ring_attention_backward, summed. Collective over the union of the tasks'
/// rings, ring by ring.
template <comm::communicator C, class K, std::ranges::input_range Tasks, model::memory_policy M>
void ring_attention_backward_all(C& c, const Tasks& tasks, K& kernel, M& mem,
                                 const ring_attention_options& opt = {}) {
  using task = std::ranges::range_value_t<Tasks>;
  static_assert(std::is_same_v<task, ring_backward_task<typename task::value_type>>,
                "run::ring_attention_backward_all takes a range of run::ring_backward_task<T>");
  std::size_t i = 0;
  for (const auto& tk : tasks) {
    if (tk.schedule == nullptr)
      throw_error<invalid_argument>("run::ring_attention_backward_all: task {} has no schedule; expected one",
                                    i);
    try {
      ring_attention_backward(c, *tk.schedule, kernel, tk.in, tk.out, tk.lse, tk.dout, tk.dq, tk.dk, tk.dv,
                              mem, opt);
    } catch (error& e) {
      e.add_context(hetmesh::format("run::ring_attention_backward_all: task {}", i));
      throw;
    }
    ++i;
  }
}

/// The multi-ring backward on a host communicator, in host memory (model::host_memory): as the overload
/// with a memory policy. Requires: C is a host communicator (static_assert).
template <comm::communicator C, class K, std::ranges::input_range Tasks>
void ring_attention_backward_all(C& c, const Tasks& tasks, K& kernel,
                                 const ring_attention_options& opt = {}) {
  static_assert(comm::host_communicator<C>,
                "run::ring_attention_backward_all: a device communicator needs a device memory policy: call "
                "ring_attention_backward_all(c, tasks, kernel, mem, opt) with mem a model::memory_policy of "
                "memory_space::device (cuda::device_memory; model::emulated_device_memory over "
                "comm::emulated_device)");
  if constexpr (comm::host_communicator<C>) {
    model::host_memory mem;
    ring_attention_backward_all(c, tasks, kernel, mem, opt);
  }
}

}  // namespace hetmesh::run

// Compiled once (HETMESH_SEPARATE_COMPILATION): ring attention over the loopback communicator with the
// reference kernel, float and double, in host memory. HETMESH_INSTANTIATE (config.hpp) is `extern template`
// in every translation unit but <hetmesh/src.hpp>'s, which defines them; other combinations are
// instantiated where they are used.
#if HETMESH_SEPARATE_COMPILATION
#include "../comm/loopback.hpp"
#include "../model/reference_attention.hpp"

namespace hetmesh::run {
#define HETMESH_RUN_RING_INSTANCE(C, K, T)                                                                   \
  HETMESH_INSTANTIATE void ring_attention_forward<C, K, T, model::host_memory>(                              \
      C&, const seq::ring_schedule&, K&, const ring_attention_input<T>&, std::span<T>, std::span<T>,         \
      model::host_memory&, const ring_attention_options&);                                                   \
  HETMESH_INSTANTIATE void ring_attention_backward<C, K, T, model::host_memory>(                             \
      C&, const seq::ring_schedule&, K&, const ring_attention_input<T>&, std::span<const T>,                 \
      std::span<const T>, std::span<const T>, std::span<T>, std::span<T>, std::span<T>, model::host_memory&, \
      const ring_attention_options&);
HETMESH_RUN_RING_INSTANCE(comm::loopback::communicator, model::reference_attention, float)
HETMESH_RUN_RING_INSTANCE(comm::loopback::communicator, model::reference_attention, double)
#undef HETMESH_RUN_RING_INSTANCE
}  // namespace hetmesh::run
#endif
