// SPDX-License-Identifier: Apache-2.0
// hetmesh::run internals of ring attention: one call's context (schedule, position, neighbours, sizes,
// the block in hand), its checks (schedule, sizes, neighbours' agreement), the kernel block of a ring
// pair, error locations, and the helper thread that overlaps a hop with compute. Generic over the call's
// memory policy: tensors are spans of its space, the blocks' document/position metadata is host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../../comm/collectives.hpp"
#include "../../core/assert.hpp"
#include "../../core/error.hpp"
#include "../../core/hash.hpp"
#include "../../core/memory_space.hpp"
#include "../../model/attention.hpp"
#include "../../model/host_memory.hpp"
#include "../../seq/ring.hpp"
#include "../ring_io.hpp"

namespace hetmesh::run {

namespace detail {

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

HETMESH_COMPILED void fill_meta(const seq::cp_chunk& c, std::vector<std::int64_t>& doc,
                                std::vector<std::int64_t>& pos)
#if HETMESH_BODIES
{
  const auto n = static_cast<std::size_t>(c.positions.size());
  doc.assign(n, c.doc);
  pos.resize(n);
  for (std::size_t i = 0; i < n; ++i) pos[i] = c.positions.begin + static_cast<std::int64_t>(i);
}
#else
    ;
#endif

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
/// mismatched message sizes, or not at all. A host communicator sends the hash as it is; a device
/// communicator takes device buffers only, so the hash goes through two one-element buffers of `mem`
/// (uploaded, exchanged, the communicator synchronised, downloaded): exact whatever T is (a 16-bit T
/// could not carry it).
template <class T, comm::communicator C, model::memory_policy M>
void check_neighbours(C& c, M& mem, const ring_ctx<T>& x, const ring_attention_options& opt,
                      const char* who) {
  if constexpr (assertion_enabled(assertion_level::collective)) {
    if (x.d == 1) return;
    const std::uint64_t mine = plan_hash(x.s);
    std::uint64_t theirs = 0;
    if constexpr (std::remove_cvref_t<C>::memory == memory_space::host) {
      (void)mem;
      const comm::p2p_op ops[2] = {comm::send_op(std::span<const std::uint64_t>(&mine, 1), x.next, opt.tag),
                                   comm::recv_op(std::span<std::uint64_t>(&theirs, 1), x.prev, opt.tag)};
      comm::group_p2p(c, std::span<const comm::p2p_op>(ops));
    } else {
      typename M::template buffer<std::uint64_t> out_buf, in_buf;
      out_buf.resize(1);
      in_buf.resize(1);
      mem.upload(out_buf.span(), std::span<const std::uint64_t>(&mine, 1));
      const comm::p2p_op ops[2] = {
          comm::send_op(std::span<const std::uint64_t>(out_buf.span()), x.next, opt.tag),
          comm::recv_op(in_buf.span(), x.prev, opt.tag)};
      comm::group_p2p(c, std::span<const comm::p2p_op>(ops));
      if constexpr (requires { c.synchronize(); }) c.synchronize();
      mem.download(std::span<std::uint64_t>(&theirs, 1), std::span<const std::uint64_t>(in_buf.span()));
    }
    if (theirs != mine)
      throw_error<mismatch_error>(
          "{}: rank {} (the previous position) holds another schedule of ring [{}] (hash {:#x}, here "
          "{:#x}); expected every rank of the ring to pass the same seq::ring_schedule",
          who, x.prev, fmt::join(x.s.ring, ","), theirs, mine);
  } else {
    (void)c, (void)mem, (void)x, (void)opt, (void)who;
  }
}

/// The block of (q chunk pr.q_chunk of this position) x (kv chunk pr.kv_chunk of position `src`) over
/// the given KV (spans of the call's memory space, as in.q); its document/position spans are host
/// memory, pointing into x's scratch, valid until the next call.
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
  if (step < 0)  // before the first step: the schedule check between neighbours, the outputs' initialisation
    return hetmesh::format(
        "{} on {}, ring [{}], position {}, before the first step (checking the schedule with "
        "its neighbours, initialising the outputs)",
        who, comm::describe(c), fmt::join(x.s.ring, ","), x.p);
  return hetmesh::format("{} on {}, ring [{}], position {}, step {} of {}", who, comm::describe(c),
                         fmt::join(x.s.ring, ","), x.p, step, x.d);
}

template <class T>
void check_size(std::size_t got, std::size_t want, const char* what, const char* who) {
  if (got != want) throw_error<invalid_argument>("{}: {} has {} elements; expected {}", who, what, got, want);
}

/// A point-to-point batch run on a helper thread while the caller computes (ring_attention_options::
/// overlap), on a host or a device communicator alike (a device one enqueues the batch from the helper
/// thread). join() rethrows the batch's error; the destructor joins without rethrowing, so a failure of
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

}  // namespace detail
}  // namespace hetmesh::run
