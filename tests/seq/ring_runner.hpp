// SPDX-License-Identifier: Apache-2.0
// A reference executor of seq::ring_schedule for the numerical tests: each ring position computes
// the schedule's (q chunk, kv chunk) blocks with the naive attention of reference_attention.hpp,
// merges partial outputs with seq::merge_partial, and passes K/V (and, backward, dK/dV) around
// the ring, either in lockstep inside one thread or over a communicator with grouped send/recv.
#pragma once

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/seq/attention_merge.hpp>
#include <hetmesh/seq/ring.hpp>

#include "reference_attention.hpp"

namespace seqtest {

inline token_meta meta_of(const std::vector<hetmesh::seq::cp_chunk>& chunks) {
  token_meta m;
  for (const auto& c : chunks)
    for (auto t = c.positions.begin; t < c.positions.end; ++t) {
      m.doc.push_back(c.doc);
      m.pos.push_back(t);
    }
  return m;
}

inline std::int64_t tokens_of(const std::vector<hetmesh::seq::cp_chunk>& chunks) {
  std::int64_t n = 0;
  for (const auto& c : chunks) n += c.positions.size();
  return n;
}

/// Inputs of one ring position, in its local token order (chunk after chunk).
struct local_io {
  tensor q, k, v, dout;
};

struct ring_rank {
  const hetmesh::seq::ring_schedule* s = nullptr;
  int p = 0;
  const local_io* io = nullptr;
  token_meta qmeta;
  tensor k, v, dk, dv;  // travelling buffers
  tensor out, dq;
  std::vector<double> lse, delta;

  ring_rank(const hetmesh::seq::ring_schedule& sched, int pos, const local_io& in)
      : s(&sched), p(pos), io(&in), qmeta(meta_of(sched.chunks[static_cast<std::size_t>(pos)])) {}

  head_map hm() const { return head_map{0, io->q.heads / io->k.heads, 0}; }

  void begin_forward() {
    k = io->k;
    v = io->v;
    out = tensor(io->q.tokens, io->q.heads, io->q.dim);
    lse.assign(static_cast<std::size_t>(io->q.tokens * io->q.heads),
               -std::numeric_limits<double>::infinity());
  }
  void forward_step(int t) {
    const auto& st = s->steps[static_cast<std::size_t>(p)][static_cast<std::size_t>(t)];
    const auto& qc = s->chunks[static_cast<std::size_t>(p)];
    const auto& kc = s->chunks[static_cast<std::size_t>(st.kv_source)];
    const auto kmeta = meta_of(kc);
    const auto H = static_cast<std::size_t>(io->q.heads), D = static_cast<std::size_t>(io->q.dim);
    std::vector<double> ob, lb;
    for (const auto& pr : st.pairs) {
      const auto& a = qc[static_cast<std::size_t>(pr.q_chunk)];
      const auto& b = kc[static_cast<std::size_t>(pr.kv_chunk)];
      block_forward(io->q, qmeta, a.local_offset, a.positions.size(), k, v, kmeta, b.local_offset,
                    b.positions.size(), pr.mask == hetmesh::seq::block_mask::causal, hm(), ob, lb);
      const auto r0 = static_cast<std::size_t>(a.local_offset) * H;
      const auto rows = static_cast<std::size_t>(a.positions.size()) * H;
      hetmesh::seq::merge_partial(std::span<double>(out.v.data() + r0 * D, rows * D),
                                  std::span<double>(lse.data() + r0, rows), std::span<const double>(ob),
                                  std::span<const double>(lb), D);
    }
  }
  void begin_backward() {
    k = io->k;
    v = io->v;
    dk = tensor(k.tokens, k.heads, k.dim);
    dv = tensor(v.tokens, v.heads, v.dim);
    dq = tensor(io->q.tokens, io->q.heads, io->q.dim);
    delta.assign(lse.size(), 0.0);
    hetmesh::seq::attention_delta(std::span<const double>(out.v), std::span<const double>(io->dout.v),
                                  std::span<double>(delta), static_cast<std::size_t>(io->q.dim));
  }
  void backward_step(int t) {
    const auto& st = s->steps[static_cast<std::size_t>(p)][static_cast<std::size_t>(t)];
    const auto& qc = s->chunks[static_cast<std::size_t>(p)];
    const auto& kc = s->chunks[static_cast<std::size_t>(st.kv_source)];
    const auto kmeta = meta_of(kc);
    for (const auto& pr : st.pairs) {
      const auto& a = qc[static_cast<std::size_t>(pr.q_chunk)];
      const auto& b = kc[static_cast<std::size_t>(pr.kv_chunk)];
      block_backward(io->q, qmeta, a.local_offset, a.positions.size(), k, v, kmeta, b.local_offset,
                     b.positions.size(), pr.mask == hetmesh::seq::block_mask::causal, hm(), lse, delta,
                     io->dout, a.local_offset, dq, a.local_offset, dk, dv, b.local_offset);
    }
  }
};

/// Runs every position of a ring in one thread, step by step, moving buffers between positions.
inline std::vector<ring_rank> run_ring_lockstep(const hetmesh::seq::ring_schedule& s,
                                                const std::vector<local_io>& io) {
  const int d = s.size();
  std::vector<ring_rank> rk;
  for (int p = 0; p < d; ++p) rk.emplace_back(s, p, io[static_cast<std::size_t>(p)]);
  for (auto& r : rk) r.begin_forward();
  for (int t = 0; t < d; ++t) {
    for (auto& r : rk) r.forward_step(t);
    if (t + 1 < d) {
      std::vector<tensor> k(static_cast<std::size_t>(d)), v(static_cast<std::size_t>(d));
      for (int p = 0; p < d; ++p) {
        k[static_cast<std::size_t>(s.next(p))] = std::move(rk[static_cast<std::size_t>(p)].k);
        v[static_cast<std::size_t>(s.next(p))] = std::move(rk[static_cast<std::size_t>(p)].v);
      }
      for (int p = 0; p < d; ++p) {
        rk[static_cast<std::size_t>(p)].k = std::move(k[static_cast<std::size_t>(p)]);
        rk[static_cast<std::size_t>(p)].v = std::move(v[static_cast<std::size_t>(p)]);
      }
    }
  }
  for (auto& r : rk) r.begin_backward();
  for (int t = 0; t < d; ++t) {
    for (auto& r : rk) r.backward_step(t);
    // Backward: KV and the dKV accumulators move on after every step; after the last step only
    // the accumulators take the one extra hop home.
    std::vector<tensor> k(static_cast<std::size_t>(d)), v(static_cast<std::size_t>(d)),
        dk(static_cast<std::size_t>(d)), dv(static_cast<std::size_t>(d));
    for (int p = 0; p < d; ++p) {
      auto& r = rk[static_cast<std::size_t>(p)];
      const auto n = static_cast<std::size_t>(s.next(p));
      k[n] = std::move(r.k);
      v[n] = std::move(r.v);
      dk[n] = std::move(r.dk);
      dv[n] = std::move(r.dv);
    }
    for (int p = 0; p < d; ++p) {
      auto& r = rk[static_cast<std::size_t>(p)];
      r.k = std::move(k[static_cast<std::size_t>(p)]);
      r.v = std::move(v[static_cast<std::size_t>(p)]);
      r.dk = std::move(dk[static_cast<std::size_t>(p)]);
      r.dv = std::move(dv[static_cast<std::size_t>(p)]);
    }
  }
  return rk;
}

/// Exchanges buffers with ring neighbours: sends `out` to rank `to`, receives `in` (already sized)
/// from rank `from`, as one group of point-to-point operations (deadlock-free in any ring).
template <class Comm>
void exchange(Comm& c, std::vector<tensor*> out, int to, std::vector<tensor*> in, int from) {
  std::vector<hetmesh::comm::p2p_op> ops;
  for (std::size_t i = 0; i < out.size(); ++i)
    ops.push_back(hetmesh::comm::send_op(std::span<const double>(out[i]->v), to, static_cast<int>(i)));
  for (std::size_t i = 0; i < in.size(); ++i)
    ops.push_back(hetmesh::comm::recv_op(std::span<double>(in[i]->v), from, static_cast<int>(i)));
  hetmesh::comm::group_p2p(c, std::span<const hetmesh::comm::p2p_op>(ops));
}

/// Runs this rank's position of a ring over a communicator whose ranks are the ring's rank ids.
template <class Comm>
ring_rank run_ring_position(Comm& c, const hetmesh::seq::ring_schedule& s, int p, const local_io& io) {
  const int d = s.size();
  ring_rank r(s, p, io);
  const int to = s.ring[static_cast<std::size_t>(s.next(p))],
            from = s.ring[static_cast<std::size_t>(s.prev(p))];
  auto sized_like = [&](int src, const tensor& like) {
    return tensor(tokens_of(s.chunks[static_cast<std::size_t>(src)]), like.heads, like.dim);
  };
  r.begin_forward();
  for (int t = 0; t < d; ++t) {
    r.forward_step(t);
    const auto& st = s.steps[static_cast<std::size_t>(p)][static_cast<std::size_t>(t)];
    if (st.send_to < 0) continue;
    const int src = s.steps[static_cast<std::size_t>(p)][static_cast<std::size_t>(t + 1)].kv_source;
    tensor k2 = sized_like(src, r.k), v2 = sized_like(src, r.v);
    exchange(c, {&r.k, &r.v}, to, {&k2, &v2}, from);
    r.k = std::move(k2);
    r.v = std::move(v2);
  }
  r.begin_backward();
  for (int t = 0; t < d; ++t) {
    r.backward_step(t);
    if (d == 1) break;
    const auto& st = s.steps[static_cast<std::size_t>(p)][static_cast<std::size_t>(t)];
    if (st.send_to >= 0) {
      const int src = s.steps[static_cast<std::size_t>(p)][static_cast<std::size_t>(t + 1)].kv_source;
      tensor k2 = sized_like(src, r.k), v2 = sized_like(src, r.v), dk2 = sized_like(src, r.k),
             dv2 = sized_like(src, r.v);
      exchange(c, {&r.k, &r.v, &r.dk, &r.dv}, to, {&k2, &v2, &dk2, &dv2}, from);
      r.k = std::move(k2);
      r.v = std::move(v2);
      r.dk = std::move(dk2);
      r.dv = std::move(dv2);
    } else {  // last hop: the accumulators go home (to next, which owns them)
      tensor dk2 = sized_like(p, r.k), dv2 = sized_like(p, r.v);
      exchange(c, {&r.dk, &r.dv}, to, {&dk2, &dv2}, from);
      r.dk = std::move(dk2);
      r.dv = std::move(dv2);
    }
  }
  return r;
}

}  // namespace seqtest
