// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: ring attention, forward and backward, over any ordered ring of ranks of a parent
// communicator -- a CP group, or an HDP ring that is a subset of the pool -- driven by a
// seq::ring_schedule and the user's model::attention_kernel. Rings are not communicators: the KV moves
// by grouped send/recv on the parent (design.md: dynamic rings reuse one parent communicator), so one
// communicator serves every ring of every step.
//
// Forward at ring position p, step t = 0..D-1: the kernel computes the step's (q chunk, kv chunk)
// blocks against the KV that came from position steps[p][t].kv_source; seq::merge_partial folds each
// block into the running (out, lse); then (t < D-1) the KV goes to the next position while the
// previous one's arrives, as one group_p2p batch (a matched batch never deadlocks, whatever D).
// Backward: the same steps, with dK/dV accumulators travelling with the KV; after step D-1 one last
// hop sends each accumulator to the next position, which owns it (seq/ring.hpp). Token documents and
// positions follow from the schedule's chunks, so only K, V (and dK, dV) travel.
//
// Host memory only: the buffers are staged in std::vector and read by the CPU; a device path (cuda/
// buffers, NCCL streams) is later work, and a device communicator is rejected at compile time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <ranges>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../comm/collectives.hpp"
#include "../core/assert.hpp"
#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../model/attention.hpp"
#include "../seq/attention_merge.hpp"
#include "../seq/ring.hpp"

namespace hetmesh::run {

/// The local inputs of one ring position: q, k and v of the tokens this rank holds for the ring, in
/// the schedule's local order (chunk after chunk, seq::cp_chunk::local_offset), with the layouts of
/// model/attention.hpp: q [tokens][q_heads][head_dim], k and v [tokens][kv_heads][head_dim].
template <class T>
struct ring_attention_input {
  model::attention_shape shape{};  ///< heads and head size (of this rank's head slice)
  T scale = T(1);                  ///< softmax scale, usually 1/sqrt(head_dim)
  std::span<const T> q;            ///< [tokens][q_heads][head_dim]
  std::span<const T> k;            ///< [tokens][kv_heads][head_dim]
  std::span<const T> v;            ///< [tokens][kv_heads][head_dim]
};

/// Options of a ring attention call.
struct ring_attention_options {
  /// First of the four point-to-point tags a call uses (tag .. tag+3: K, V, dK, dV); 0 <= tag <=
  /// comm::max_user_tag - 3. Calls that may be in flight together on one communicator need disjoint tags.
  int tag = 0x5a00;
  /// Overlap each hop with the step's compute: the K/V exchange runs on a helper thread while the
  /// kernel computes (backward: K/V overlap, the dK/dV accumulators follow the compute). The
  /// communicator is then used from that thread while the caller's thread does not touch it, so it
  /// must allow that (loopback does; MPI needs MPI_THREAD_SERIALIZED, which mpi::environment asks for).
  /// Results are bitwise the same either way.
  bool overlap = false;

  friend constexpr bool operator==(const ring_attention_options&, const ring_attention_options&) = default;
};

/// One ring of a sequence of forward calls (ring_attention_forward_all): the ring's schedule, this
/// rank's inputs for it and where its merged out and lse go.
template <class T>
struct ring_forward_task {
  /// Element type.
  using value_type = T;
  const seq::ring_schedule* schedule = nullptr;  ///< the ring; the caller must be one of its ranks
  ring_attention_input<T> in{};                  ///< this rank's q, k, v for the ring
  std::span<T> out;                              ///< [tokens][q_heads][head_dim], written
  std::span<T> lse;                              ///< [tokens][q_heads], written
};

/// One ring of a sequence of backward calls (ring_attention_backward_all): the forward's inputs and
/// results, the output gradient, and where dq, dk, dv go.
template <class T>
struct ring_backward_task {
  /// Element type.
  using value_type = T;
  const seq::ring_schedule* schedule = nullptr;  ///< the ring; the caller must be one of its ranks
  ring_attention_input<T> in{};                  ///< this rank's q, k, v for the ring (as in forward)
  std::span<const T> out;                        ///< merged forward output
  std::span<const T> lse;                        ///< merged forward lse
  std::span<const T> dout;                       ///< gradient of the loss with respect to out
  std::span<T> dq;                               ///< [tokens][q_heads][head_dim], written
  std::span<T> dk;                               ///< [tokens][kv_heads][head_dim], written
  std::span<T> dv;                               ///< [tokens][kv_heads][head_dim], written
};

/// The ring position of `rank` (a rank of the parent communicator) in `s`, or -1 when it is not a
/// member. Pure; O(D).
[[nodiscard]] inline int ring_position(const seq::ring_schedule& s, int rank) noexcept {
  const auto it = std::find(s.ring.begin(), s.ring.end(), rank);
  return it == s.ring.end() ? -1 : static_cast<int>(it - s.ring.begin());
}

/// Tokens position p of `s` holds (the sum of its chunk sizes). Pre: 0 <= p < s.chunks.size()
/// (invalid_argument otherwise). Pure; O(chunks).
[[nodiscard]] inline std::int64_t ring_tokens(const seq::ring_schedule& s, int p) {
  if (p < 0 || static_cast<std::size_t>(p) >= s.chunks.size())
    throw_error<invalid_argument>("ring_tokens: position {} of a ring of {}; expected 0 <= position < {}", p,
                                  s.chunks.size(), s.chunks.size());
  std::int64_t n = 0;
  for (const auto& c : s.chunks.at(static_cast<std::size_t>(p))) n += c.positions.size();
  return n;
}

/// Per-token document ids and positions of one ring position, in local order: what the kernel's mask
/// reads, and what a model needs for rotary embeddings (positions within the document, TE's rule).
struct ring_token_meta {
  std::vector<std::int64_t> doc;  ///< per local token: its document (seq::cp_chunk::doc)
  std::vector<std::int64_t> pos;  ///< per local token: its position in the document

  friend bool operator==(const ring_token_meta&, const ring_token_meta&) = default;
};

/// The document and position of every token position p of `s` holds, from its chunks. Pre: 0 <= p <
/// s.chunks.size() and chunks that tile the local buffer (invalid_argument otherwise). Pure; O(tokens).
[[nodiscard]] inline ring_token_meta ring_meta(const seq::ring_schedule& s, int p) {
  ring_token_meta m;
  const auto n = static_cast<std::size_t>(ring_tokens(s, p));
  m.doc.assign(n, 0);
  m.pos.assign(n, 0);
  for (const auto& c : s.chunks.at(static_cast<std::size_t>(p)))
    for (auto t = c.positions.begin; t < c.positions.end; ++t) {
      const auto at = static_cast<std::size_t>(c.local_offset + (t - c.positions.begin));
      if (at >= n)
        throw_error<invalid_argument>(
            "ring_meta: chunk of document {} at local offset {} ends past the {} tokens of position {}; "
            "expected chunks that tile the local buffer",
            c.doc, c.local_offset, n, p);
      m.doc[at] = c.doc;
      m.pos[at] = t;
    }
  return m;
}

namespace detail {

template <class C>
inline constexpr bool host_memory = std::remove_cvref_t<C>::memory == comm::memory_space::host;

/// One ring call's context: the schedule, this rank's position, its neighbours' ranks, sizes, and the
/// document/position scratch of the block in hand (a chunk is one document's consecutive positions, so
/// a block's metadata is built per chunk, O(chunk), rather than kept for the whole ring).
template <class T>
struct ring_ctx {
  const seq::ring_schedule& s;
  const ring_attention_input<T>& in;
  int p = 0, d = 1, next = 0, prev = 0;
  std::size_t hq = 1, hk = 1, dim = 1;
  std::vector<std::size_t> ntok;                     // per position: tokens it holds
  std::vector<std::int64_t> qdoc, qpos, kdoc, kpos;  // the block in hand

  ring_ctx(const seq::ring_schedule& sched, const ring_attention_input<T>& input) : s(sched), in(input) {}

  std::size_t q_row() const noexcept { return hq * dim; }
  std::size_t kv_row() const noexcept { return hk * dim; }
  std::size_t tokens(int pos) const noexcept { return ntok[static_cast<std::size_t>(pos)]; }
};

inline void fill_meta(const seq::cp_chunk& c, std::vector<std::int64_t>& doc,
                      std::vector<std::int64_t>& pos) {
  const auto n = static_cast<std::size_t>(c.positions.size());
  doc.assign(n, c.doc);
  pos.resize(n);
  for (std::size_t i = 0; i < n; ++i) pos[i] = c.positions.begin + static_cast<std::int64_t>(i);
}

template <comm::communicator C, class T>
ring_ctx<T> make_ctx(const C& c, const seq::ring_schedule& s, const ring_attention_input<T>& in,
                     const ring_attention_options& opt, const char* who) {
  const int d = s.size();
  if (d < 1 || s.chunks.size() != s.ring.size() || s.steps.size() != s.ring.size())
    throw_error<invalid_argument>(
        "{}: a schedule of ring [{}] with {} chunk lists and {} step lists; expected one of each per "
        "position (seq::make_ring_schedule)",
        who, fmt::join(s.ring, ","), s.chunks.size(), s.steps.size());
  for (std::size_t q = 0; q < s.steps.size(); ++q)
    if (s.steps[q].size() != s.ring.size())
      throw_error<invalid_argument>("{}: position {} of ring [{}] has {} steps; expected D = {}", who, q,
                                    fmt::join(s.ring, ","), s.steps[q].size(), d);
  const int p = ring_position(s, c.rank());
  if (p < 0)
    throw_error<invalid_argument>(
        "{} on {}: rank {} is not in ring [{}]; expected only the ring's ranks to call it", who,
        comm::describe(c), c.rank(), fmt::join(s.ring, ","));
  for (int r : s.ring)
    if (r < 0 || r >= c.size())
      throw_error<invalid_argument>(
          "{} on {}: ring [{}] names rank {}; expected ranks of the parent communicator, in [0, {})", who,
          comm::describe(c), fmt::join(s.ring, ","), r, c.size());
  if (opt.tag < 0 || opt.tag > comm::max_user_tag - 3)
    throw_error<invalid_argument>("{}: tag {}; expected 0 <= tag <= {} (it uses tag .. tag+3)", who, opt.tag,
                                  comm::max_user_tag - 3);
  const auto& sh = in.shape;
  model::check_attention_shape(sh, who);
  ring_ctx<T> x(s, in);
  x.p = p;
  x.d = d;
  x.next = s.ring[static_cast<std::size_t>(s.next(p))];
  x.prev = s.ring[static_cast<std::size_t>(s.prev(p))];
  x.hq = static_cast<std::size_t>(sh.q_heads);
  x.hk = static_cast<std::size_t>(sh.kv_heads);
  x.dim = static_cast<std::size_t>(sh.head_dim);
  x.ntok.reserve(static_cast<std::size_t>(d));
  for (int q = 0; q < d; ++q) {
    const auto n = ring_tokens(s, q);
    for (const auto& ch : s.chunks[static_cast<std::size_t>(q)])
      if (ch.local_offset < 0 || ch.positions.size() < 0 || ch.local_offset + ch.positions.size() > n)
        throw_error<invalid_argument>(
            "{}: position {} of ring [{}] has a chunk of document {} at [{}, {}) of its {} tokens; expected "
            "chunks that tile the local buffer",
            who, q, fmt::join(s.ring, ","), ch.doc, ch.local_offset, ch.local_offset + ch.positions.size(),
            n);
    x.ntok.push_back(static_cast<std::size_t>(n));
  }
  const std::size_t n = x.tokens(p);
  if (in.q.size() != n * x.q_row() || in.k.size() != n * x.kv_row() || in.v.size() != n * x.kv_row())
    throw_error<invalid_argument>(
        "{}: position {} of ring [{}] holds {} tokens; q has {} elements, k {}, v {}; expected {} and {}",
        who, p, fmt::join(s.ring, ","), n, in.q.size(), in.k.size(), in.v.size(), n * x.q_row(),
        n * x.kv_row());
  return x;
}

/// Checks (collective assertion level) that the ring's neighbours hold the same schedule: one hash
/// to the next position, one from the previous. Mismatched schedules would otherwise surface as
/// mismatched message sizes, or not at all.
template <comm::communicator C, class T>
void check_neighbours(C& c, const ring_ctx<T>& x, const ring_attention_options& opt, const char* who) {
  if constexpr (assertion_enabled(assertion_level::collective)) {
    if (x.d == 1) return;
    const std::uint64_t mine = plan_hash(x.s);
    std::uint64_t theirs = 0;
    const comm::p2p_op ops[2] = {comm::send_op(std::span<const std::uint64_t>(&mine, 1), x.next, opt.tag),
                                 comm::recv_op(std::span<std::uint64_t>(&theirs, 1), x.prev, opt.tag)};
    comm::group_p2p(c, std::span<const comm::p2p_op>(ops));
    if (theirs != mine)
      throw_error<mismatch_error>(
          "{}: rank {} (the previous position) holds another schedule of ring [{}] (hash {:#x}, here "
          "{:#x}); expected every rank of the ring to pass the same seq::ring_schedule",
          who, x.prev, fmt::join(x.s.ring, ","), theirs, mine);
  } else {
    (void)c, (void)x, (void)opt, (void)who;
  }
}

/// The block of (q chunk pr.q_chunk of this position) x (kv chunk pr.kv_chunk of position `src`) over
/// the given KV; its document/position spans point into x's scratch, valid until the next call.
template <class T>
model::attention_block<T> block_of(ring_ctx<T>& x, const seq::ring_pair& pr, int src, std::span<const T> k,
                                   std::span<const T> v) {
  const auto& qc = x.s.chunks[static_cast<std::size_t>(x.p)][static_cast<std::size_t>(pr.q_chunk)];
  const auto& kc = x.s.chunks[static_cast<std::size_t>(src)][static_cast<std::size_t>(pr.kv_chunk)];
  const auto q0 = static_cast<std::size_t>(qc.local_offset),
             nq = static_cast<std::size_t>(qc.positions.size());
  const auto k0 = static_cast<std::size_t>(kc.local_offset),
             nk = static_cast<std::size_t>(kc.positions.size());
  fill_meta(qc, x.qdoc, x.qpos);
  fill_meta(kc, x.kdoc, x.kpos);
  model::attention_block<T> b;
  b.shape = x.in.shape;
  b.q = x.in.q.subspan(q0 * x.q_row(), nq * x.q_row());
  b.k = k.subspan(k0 * x.kv_row(), nk * x.kv_row());
  b.v = v.subspan(k0 * x.kv_row(), nk * x.kv_row());
  b.q_doc = x.qdoc;
  b.q_pos = x.qpos;
  b.k_doc = x.kdoc;
  b.k_pos = x.kpos;
  b.mask = pr.mask;
  b.scale = x.in.scale;
  return b;
}

template <class T>
std::string where(const comm::communicator auto& c, const ring_ctx<T>& x, const char* who, int step) {
  if (step < 0)  // before the first step: the schedule check between neighbours
    return hetmesh::format("{} on {}, ring [{}], position {}, checking the schedule with its neighbours", who,
                           comm::describe(c), fmt::join(x.s.ring, ","), x.p);
  return hetmesh::format("{} on {}, ring [{}], position {}, step {} of {}", who, comm::describe(c),
                         fmt::join(x.s.ring, ","), x.p, step, x.d);
}

template <class T>
void check_size(std::size_t got, std::size_t want, const char* what, const char* who) {
  if (got != want) throw_error<invalid_argument>("{}: {} has {} elements; expected {}", who, what, got, want);
}

/// A point-to-point batch run on a helper thread while the caller computes (ring_attention_options::
/// overlap). join() rethrows the batch's error; the destructor joins without rethrowing, so a failure of
/// the caller's compute is the error reported and the helper never outlives the buffers it uses.
class background_p2p {
 public:
  background_p2p() = default;
  background_p2p(const background_p2p&) = delete;
  background_p2p& operator=(const background_p2p&) = delete;
  ~background_p2p() {
    if (thread_.joinable()) thread_.join();
  }
  template <class C>
  void start(C& c, std::span<const comm::p2p_op> ops) {
    thread_ = std::thread([this, &c, ops] {
      try {
        comm::group_p2p(c, ops);
      } catch (...) {
        error_ = std::current_exception();
      }
    });
  }
  void join() {
    if (thread_.joinable()) thread_.join();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  std::thread thread_;
  std::exception_ptr error_;
};

template <class C, class K, class T>
void ring_forward(C& c, const seq::ring_schedule& s, K& kernel, const ring_attention_input<T>& in,
                  std::span<T> out, std::span<T> lse, const ring_attention_options& opt) {
  constexpr const char* who = "run::ring_attention_forward";
  auto x = detail::make_ctx(c, s, in, opt, who);
  const std::size_t n = x.tokens(x.p);
  detail::check_size<T>(out.size(), n * x.q_row(), "out", who);
  detail::check_size<T>(lse.size(), n * x.hq, "lse", who);
  int t = -1;
  try {
    detail::check_neighbours(c, x, opt, who);
    std::fill(out.begin(), out.end(), T(0));
    std::fill(lse.begin(), lse.end(), -std::numeric_limits<T>::infinity());
    std::vector<T> k_cur, v_cur, k_nxt, v_nxt, ob, lb;
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
        ops[2] = comm::recv_op(std::span<T>(k_nxt), x.prev, opt.tag);
        ops[3] = comm::recv_op(std::span<T>(v_nxt), x.prev, opt.tag + 1);
      }
      background_p2p bg;
      if (hop && opt.overlap) bg.start(c, std::span<const comm::p2p_op>(ops));
      for (const auto& pr : st.pairs) {
        if (pr.mask == seq::block_mask::none) continue;
        const auto b = detail::block_of(x, pr, st.kv_source, k, v);
        const auto rows = b.q_doc.size() * x.hq;
        ob.resize(rows * x.dim);
        lb.resize(rows);
        kernel.forward(b, model::attention_forward_out<T>{std::span<T>(ob), std::span<T>(lb)});
        const auto r0 =
            static_cast<std::size_t>(
                s.chunks[static_cast<std::size_t>(x.p)][static_cast<std::size_t>(pr.q_chunk)].local_offset) *
            x.hq;
        seq::merge_partial(out.subspan(r0 * x.dim, rows * x.dim), lse.subspan(r0, rows),
                           std::span<const T>(ob), std::span<const T>(lb), x.dim);
      }
      if (!hop) break;
      if (opt.overlap)
        bg.join();
      else
        comm::group_p2p(c, std::span<const comm::p2p_op>(ops));
      std::swap(k_cur, k_nxt);
      std::swap(v_cur, v_nxt);
      k = k_cur;
      v = v_cur;
    }
  } catch (error& e) {
    e.add_context(detail::where(c, x, who, t));
    throw;
  }
}

template <class C, class K, class T>
void ring_backward(C& c, const seq::ring_schedule& s, K& kernel, const ring_attention_input<T>& in,
                   std::span<const T> out, std::span<const T> lse, std::span<const T> dout, std::span<T> dq,
                   std::span<T> dk, std::span<T> dv, const ring_attention_options& opt) {
  constexpr const char* who = "run::ring_attention_backward";
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
    detail::check_neighbours(c, x, opt, who);
    std::vector<T> delta(n * x.hq);
    seq::attention_delta(out, dout, std::span<T>(delta), x.dim);
    std::fill(dq.begin(), dq.end(), T(0));
    // Accumulators of the KV in hand: a ring of one rank accumulates straight into dk, dv.
    std::vector<T> k_cur, v_cur, dk_cur, dv_cur, k_nxt, v_nxt, dk_nxt, dv_nxt;
    std::span<const T> k = in.k, v = in.v;
    std::span<T> gk = dk, gv = dv;
    if (x.d > 1) {
      dk_cur.assign(dk.size(), T(0));
      dv_cur.assign(dv.size(), T(0));
      gk = dk_cur;
      gv = dv_cur;
    } else {
      std::fill(dk.begin(), dk.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
    }
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
        ops[2] = comm::recv_op(std::span<T>(k_nxt), x.prev, opt.tag);
        ops[3] = comm::recv_op(std::span<T>(v_nxt), x.prev, opt.tag + 1);
        ops[4] = comm::send_op(std::span<const T>(gk), x.next, opt.tag + 2);
        ops[5] = comm::send_op(std::span<const T>(gv), x.next, opt.tag + 3);
        ops[6] = comm::recv_op(std::span<T>(dk_nxt), x.prev, opt.tag + 2);
        ops[7] = comm::recv_op(std::span<T>(dv_nxt), x.prev, opt.tag + 3);
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
        io.delta = std::span<const T>(delta).subspan(q0 * x.hq, nq * x.hq);
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
        k = k_cur;
        v = v_cur;
        gk = dk_cur;
        gv = dv_cur;
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

}  // namespace detail

/// Ring attention forward at the caller's position of ring `s`, on the parent communicator `c`.
/// Requires: C is a host communicator and K a model::attention_kernel<K, T> (static_assert).
/// Pre: every rank of s.ring calls it with the same schedule (checked between neighbours at the
/// `collective` assertion level), ranks of s.ring are ranks of `c`, and this rank is one of them;
/// `in` holds this position's tokens in the schedule's local order; out and lse are sized
/// [tokens][q_heads][head_dim] and [tokens][q_heads] (invalid_argument otherwise).
/// Post: out and lse hold the attention of the local queries over every key of the ring they see (per
/// document, causal), merged across blocks; rows that see no key get lse = -infinity and out = 0.
/// Collective over the ranks of s.ring only (other ranks of `c` do not take part; rings on disjoint
/// ranks may run at once). A ring of one rank only runs the kernel. Errors (hetmesh::error) carry
/// the ring, the position and the step. Deterministic for a deterministic kernel. Cost: the kernel on
/// every pair of the schedule, one merge per pair (O(rows * head_dim)), and D-1 hops each sending and
/// receiving one KV (2 * tokens * kv_heads * head_dim elements), overlapped with the step's compute when
/// opt.overlap; two KV buffers of scratch.
template <comm::communicator C, class K, class T>
void ring_attention_forward(C& c, const seq::ring_schedule& s, K& kernel, const ring_attention_input<T>& in,
                            std::span<T> out, std::span<T> lse, const ring_attention_options& opt = {}) {
  static_assert(detail::host_memory<C>,
                "run::ring_attention_forward stages buffers in host memory: pass a host communicator "
                "(loopback, mpi); the device path (NCCL, cuda/ buffers) is not implemented yet");
  static_assert(model::attention_kernel<K, T>,
                "run::ring_attention_forward: K must model model::attention_kernel<K, T>: "
                "k.forward(const attention_block<T>&, attention_forward_out<T>) and "
                "k.backward(const attention_block<T>&, attention_backward_io<T>)");
  // Only a conforming call is instantiated, so the static_asserts above are the only errors a user reads.
  if constexpr (detail::host_memory<C> && model::attention_kernel<K, T>)
    detail::ring_forward(c, s, kernel, in, out, lse, opt);
}

/// Ring attention backward at the caller's position of ring `s`, on the parent communicator `c`:
/// given the forward's inputs, its merged out and lse, and dout, writes dq, dk and dv of the local
/// tokens. The KV travels the ring again with dK/dV accumulators; after the last step each
/// accumulator makes one more hop, to its owner.
/// Requires: as ring_attention_forward. Pre: as ring_attention_forward, with out, lse from it (or an
/// equal computation) and dout, dq sized like q and dk, dv like k (invalid_argument otherwise).
/// Post: dq, dk, dv hold the gradients of sum(dout * out) with respect to the local q, k, v over the
/// whole ring (overwritten, not accumulated). Collective over the ranks of s.ring only. Errors carry
/// the ring, the position and the step. Deterministic for a deterministic kernel. Cost: the kernel's
/// backward on every pair; D-1 hops of KV plus dK/dV (4 * tokens * kv_heads * head_dim elements each
/// way) and one last hop of dK/dV; four KV-sized buffers of scratch.
template <comm::communicator C, class K, class T>
void ring_attention_backward(C& c, const seq::ring_schedule& s, K& kernel, const ring_attention_input<T>& in,
                             std::span<const T> out, std::span<const T> lse, std::span<const T> dout,
                             std::span<T> dq, std::span<T> dk, std::span<T> dv,
                             const ring_attention_options& opt = {}) {
  static_assert(detail::host_memory<C>,
                "run::ring_attention_backward stages buffers in host memory: pass a host communicator "
                "(loopback, mpi); the device path (NCCL, cuda/ buffers) is not implemented yet");
  static_assert(model::attention_kernel<K, T>,
                "run::ring_attention_backward: K must model model::attention_kernel<K, T>: "
                "k.forward(const attention_block<T>&, attention_forward_out<T>) and "
                "k.backward(const attention_block<T>&, attention_backward_io<T>)");
  if constexpr (detail::host_memory<C> && model::attention_kernel<K, T>)
    detail::ring_backward(c, s, kernel, in, out, lse, dout, dq, dk, dv, opt);
}

/// Ring attention forward over several rings in sequence: the multi-ring entry for one rank of an
/// HDP plan, which may belong to several rings of one step (a pack on its own, a ring of 2, a ring of
/// 5, ...). Runs ring_attention_forward for each task in order; a task whose ring has one rank runs
/// the kernel locally (packed whole sequences), without communication.
/// Pre: every rank lists the rings it belongs to in one global order, so that each ring's members
/// reach it together (seq::hdp_plan::per_rank is in that order: by (order key, item)); otherwise
/// the call times out naming the ring. Tasks' schedules are non-null. Post and cost: those of
/// ring_attention_forward, summed. Collective over the union of the tasks' rings, ring by ring.
template <comm::communicator C, class K, std::ranges::input_range Tasks>
void ring_attention_forward_all(C& c, const Tasks& tasks, K& kernel, const ring_attention_options& opt = {}) {
  using task = std::ranges::range_value_t<Tasks>;
  static_assert(std::is_same_v<task, ring_forward_task<typename task::value_type>>,
                "run::ring_attention_forward_all takes a range of run::ring_forward_task<T>");
  std::size_t i = 0;
  for (const auto& tk : tasks) {
    if (tk.schedule == nullptr)
      throw_error<invalid_argument>("run::ring_attention_forward_all: task {} has no schedule; expected one",
                                    i);
    try {
      ring_attention_forward(c, *tk.schedule, kernel, tk.in, tk.out, tk.lse, opt);
    } catch (error& e) {
      e.add_context(hetmesh::format("run::ring_attention_forward_all: task {}", i));
      throw;
    }
    ++i;
  }
}

/// Ring attention backward over several rings in sequence: ring_attention_backward per task, in order
/// (the multi-ring entry of HDP; rings of one rank run locally). Pre: as ring_attention_forward_all,
/// with the forward's results in each task. Post and cost: those of ring_attention_backward, summed.
/// Collective over the union of the tasks' rings, ring by ring.
template <comm::communicator C, class K, std::ranges::input_range Tasks>
void ring_attention_backward_all(C& c, const Tasks& tasks, K& kernel,
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
                              opt);
    } catch (error& e) {
      e.add_context(hetmesh::format("run::ring_attention_backward_all: task {}", i));
      throw;
    }
    ++i;
  }
}

}  // namespace hetmesh::run
