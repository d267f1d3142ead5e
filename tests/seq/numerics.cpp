// SPDX-License-Identifier: Apache-2.0
// Numerical proof, in double: ring attention over zigzag, THD-packed and HDP rings, and Ulysses,
// forward and backward, equal full causal attention on one rank (relative error < 1e-10). The rings
// run the library's executor (run/ring_attention.hpp, with model::reference_attention) on loopback
// ranks (threads); the reference is the independent naive attention of reference_attention.hpp.
#include <doctest/doctest.h>

#include <map>
#include <mutex>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/run/ring_attention.hpp>
#include <hetmesh/seq/seq.hpp>

#include "reference_attention.hpp"

using namespace hetmesh;
using namespace seqtest;

namespace {

constexpr int kHeads = 4, kKvHeads = 2, kDim = 8;
constexpr double kTol = 1e-10;

/// A packed stream of documents with its reference attention.
struct stream {
  std::vector<std::int64_t> lengths;
  token_meta meta;
  tensor q, k, v, dout;
  full_result ref;
};

stream make_stream(std::vector<std::int64_t> lengths, std::uint64_t seed) {
  stream s;
  s.lengths = lengths;
  for (std::size_t d = 0; d < lengths.size(); ++d)
    for (std::int64_t t = 0; t < lengths[d]; ++t) {
      s.meta.doc.push_back(static_cast<std::int64_t>(d));
      s.meta.pos.push_back(t);
    }
  const auto n = static_cast<std::int64_t>(s.meta.doc.size());
  s.q = make_tensor(seed, n, kHeads, kDim);
  s.k = make_tensor(seed + 1, n, kKvHeads, kDim);
  s.v = make_tensor(seed + 2, n, kKvHeads, kDim);
  s.dout = make_tensor(seed + 3, n, kHeads, kDim);
  s.ref = full_attention(s.q, s.k, s.v, s.meta, s.dout);
  return s;
}

/// Inputs of one ring position, in its local token order (chunk after chunk).
struct local_io {
  tensor q, k, v, dout;
};

/// Results of one ring position.
struct position_result {
  tensor out, dq, dk, dv;
};

std::int64_t tokens_of(const std::vector<seq::cp_chunk>& chunks) {
  std::int64_t n = 0;
  for (const auto& c : chunks) n += c.positions.size();
  return n;
}

/// This rank's position of ring `s`, forward then backward, through the library's executor.
template <class Comm>
position_result run_position(Comm& c, const seq::ring_schedule& s, const local_io& io) {
  position_result r{tensor(io.q.tokens, kHeads, kDim), tensor(io.q.tokens, kHeads, kDim),
                    tensor(io.k.tokens, kKvHeads, kDim), tensor(io.v.tokens, kKvHeads, kDim)};
  std::vector<double> lse(static_cast<std::size_t>(io.q.tokens * kHeads));
  const run::ring_attention_input<double> in{
      {kHeads, kKvHeads, kDim}, 1.0 / std::sqrt(static_cast<double>(kDim)), io.q.v, io.k.v, io.v.v};
  model::reference_attention kernel;
  run::ring_attention_forward(c, s, kernel, in, std::span<double>(r.out.v), std::span<double>(lse));
  run::ring_attention_backward(c, s, kernel, in, std::span<const double>(r.out.v),
                               std::span<const double>(lse), std::span<const double>(io.dout.v),
                               std::span<double>(r.dq.v), std::span<double>(r.dk.v),
                               std::span<double>(r.dv.v));
  return r;
}

void copy_row(const tensor& from, std::int64_t fr, tensor& to, std::int64_t tr) {
  for (int h = 0; h < from.heads; ++h)
    for (int d = 0; d < from.dim; ++d) to.at(tr, h, d) = from.at(fr, h, d);
}

/// Local inputs of a CP shard: real tokens copy the stream rows; pad tokens get their own values
/// and a zero output gradient (they carry no loss, as TE's padding label -100).
local_io io_for(const seq::cp_rank_shard& sh, const stream& s) {
  const auto n = sh.tokens();
  local_io io{tensor(n, kHeads, kDim), tensor(n, kKvHeads, kDim), tensor(n, kKvHeads, kDim),
              tensor(n, kHeads, kDim)};
  const auto pq = make_tensor(991, n, kHeads, kDim), pk = make_tensor(992, n, kKvHeads, kDim);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto src = sh.source_index[static_cast<std::size_t>(i)];
    if (src < 0) {
      copy_row(pq, i, io.q, i);
      copy_row(pk, i, io.k, i);
      copy_row(pk, i, io.v, i);
      continue;
    }
    copy_row(s.q, src, io.q, i);
    copy_row(s.k, src, io.k, i);
    copy_row(s.v, src, io.v, i);
    copy_row(s.dout, src, io.dout, i);
  }
  return io;
}

struct gathered {
  tensor out, dq, dk, dv;
  std::mutex m;
  explicit gathered(const stream& s)
      : out(s.q.tokens, kHeads, kDim),
        dq(s.q.tokens, kHeads, kDim),
        dk(s.k.tokens, kKvHeads, kDim),
        dv(s.v.tokens, kKvHeads, kDim) {}
  void put(const position_result& r, const std::vector<std::int64_t>& source) {
    std::lock_guard lock(m);
    for (std::size_t i = 0; i < source.size(); ++i) {
      if (source[i] < 0) continue;
      const auto li = static_cast<std::int64_t>(i);
      copy_row(r.out, li, out, source[i]);
      copy_row(r.dq, li, dq, source[i]);
      copy_row(r.dk, li, dk, source[i]);
      copy_row(r.dv, li, dv, source[i]);
    }
  }
  void check(const stream& s, const std::string& what) {
    const double e[4] = {rel_err(out.v, s.ref.out.v), rel_err(dq.v, s.ref.dq.v), rel_err(dk.v, s.ref.dk.v),
                         rel_err(dv.v, s.ref.dv.v)};
    MESSAGE(what, ": rel err out ", e[0], ", dq ", e[1], ", dk ", e[2], ", dv ", e[3]);
    for (double x : e) CHECK(x < kTol);
  }
};

void check_partition_ring(const seq::cp_partition& part, const stream& s, std::vector<int> ring,
                          const char* what) {
  const auto sched = seq::ring_for(part, ring);
  std::vector<local_io> io;
  for (const auto& sh : part.ranks) io.push_back(io_for(sh, s));
  {  // loopback ranks: position p runs on rank ring[p]; ranks outside the ring idle
    gathered g(s);
    const int world = *std::max_element(ring.begin(), ring.end()) + 1;
    comm::loopback::run(world, [&](comm::loopback::communicator& c) {
      const auto it = std::find(ring.begin(), ring.end(), c.rank());
      if (it == ring.end()) return;
      const int p = static_cast<int>(it - ring.begin());
      auto r = run_position(c, sched, io[static_cast<std::size_t>(p)]);
      g.put(r, part.ranks[static_cast<std::size_t>(p)].source_index);
    });
    g.check(s, std::string(what) + " (loopback)");
  }
}

}  // namespace

TEST_CASE("reference attention backward matches finite differences") {
  const auto s = make_stream({5, 4}, 7);
  auto loss = [&](const tensor& q, const tensor& k, const tensor& v) {
    const auto r = full_attention(q, k, v, s.meta, s.dout);
    double l = 0;
    for (std::size_t i = 0; i < r.out.v.size(); ++i) l += r.out.v[i] * s.dout.v[i];
    return l;
  };
  const double h = 1e-6;
  for (std::size_t i : {std::size_t{3}, std::size_t{40}, std::size_t{131}}) {
    auto qp = s.q, qm = s.q;
    qp.v[i] += h;
    qm.v[i] -= h;
    CHECK((loss(qp, s.k, s.v) - loss(qm, s.k, s.v)) / (2 * h) ==
          doctest::Approx(s.ref.dq.v[i]).epsilon(1e-6));
    auto kp = s.k, km = s.k;
    kp.v[i % kp.v.size()] += h;
    km.v[i % km.v.size()] -= h;
    CHECK((loss(s.q, kp, s.v) - loss(s.q, km, s.v)) / (2 * h) ==
          doctest::Approx(s.ref.dk.v[i % kp.v.size()]).epsilon(1e-6));
    auto vp = s.v, vm = s.v;
    vp.v[i % vp.v.size()] += h;
    vm.v[i % vm.v.size()] -= h;
    CHECK((loss(s.q, s.k, vp) - loss(s.q, s.k, vm)) / (2 * h) ==
          doctest::Approx(s.ref.dv.v[i % vp.v.size()]).epsilon(1e-6));
  }
}

TEST_CASE("model::reference_attention equals the naive attention of the seq tests (GQA, packed documents)") {
  const auto s = make_stream({9, 14, 3}, 5);
  const auto n = static_cast<std::size_t>(s.q.tokens);
  const model::attention_block<double> b{{kHeads, kKvHeads, kDim},
                                         s.q.v,
                                         s.k.v,
                                         s.v.v,
                                         s.meta.doc,
                                         s.meta.pos,
                                         s.meta.doc,
                                         s.meta.pos,
                                         seq::block_mask::causal,
                                         1.0 / std::sqrt(static_cast<double>(kDim))};
  std::vector<double> out(s.q.v.size()), lse(n * kHeads), delta(n * kHeads), dq(s.q.v.size(), 0.0),
      dk(s.k.v.size(), 0.0), dv(s.v.v.size(), 0.0);
  model::reference_attention kernel;
  kernel.forward(b, {out, lse});
  seq::attention_delta(std::span<const double>(out), std::span<const double>(s.dout.v),
                       std::span<double>(delta), static_cast<std::size_t>(kDim));
  kernel.backward(b, {s.dout.v, lse, delta, dq, dk, dv});
  CHECK(rel_err(out, s.ref.out.v) < kTol);
  CHECK(rel_err(lse, s.ref.lse) < kTol);
  CHECK(rel_err(dq, s.ref.dq.v) < kTol);
  CHECK(rel_err(dk, s.ref.dk.v) < kTol);
  CHECK(rel_err(dv, s.ref.dv.v) < kTol);
}

TEST_CASE("ring attention over a zigzag CP ring equals full causal attention, forward and backward") {
  const auto s = make_stream({64}, 11);
  check_partition_ring(seq::partition_zigzag(64, 4), s, {2, 0, 3, 1}, "zigzag cp=4");
  check_partition_ring(seq::partition_zigzag(64, 1), s, {0}, "zigzag cp=1");
}

TEST_CASE("ring attention over a THD-packed ring (padded per document) equals full causal attention") {
  const auto s = make_stream({7, 11, 5, 20, 1}, 23);
  check_partition_ring(seq::partition_thd(s.lengths, 3, true), s, {0, 1, 2}, "thd cp=3 padded");
  check_partition_ring(seq::partition_contiguous(s.lengths, 3), s, {1, 2, 0}, "contiguous cp=3");
}

TEST_CASE("ring attention over HDP rings on one parent communicator equals full causal attention") {
  // Capacity 16 tokens per rank, pool of 6: the 40-token sequence rings over 3 ranks, the 30 over 2,
  // the rest pack onto single ranks; micro-batches run in plan order on every rank.
  const std::vector<seq::seq_desc> seqs{{100, 40}, {101, 30}, {102, 10}, {103, 12},
                                        {104, 5},  {105, 16}, {106, 7},  {107, 33}};
  const auto plan = seq::plan_hdp(seqs, {.capacity = 16}, 6);
  std::map<std::int64_t, stream> per_seq;
  std::map<std::int64_t, std::unique_ptr<gathered>> got;
  for (const auto& sd : seqs) {
    per_seq.emplace(sd.id, make_stream({sd.length}, 1000 + static_cast<std::uint64_t>(sd.id)));
    got.emplace(sd.id, std::make_unique<gathered>(per_seq.at(sd.id)));
  }
  int rings = 0;
  for (const auto& it : plan.sharding.items) rings += it.packed ? 0 : 1;
  CHECK(rings == 3);
  comm::loopback::run(6, [&](comm::loopback::communicator& c) {
    for (const auto& mb : plan.per_rank[static_cast<std::size_t>(c.rank())]) {
      const auto sched = seq::ring_for(plan, mb.item);
      const auto& chunks = sched.chunks[static_cast<std::size_t>(mb.ring_position)];
      // Local inputs: each chunk's rows come from its sequence; sources are rows of that sequence.
      const auto n = tokens_of(chunks);
      local_io io{tensor(n, kHeads, kDim), tensor(n, kKvHeads, kDim), tensor(n, kKvHeads, kDim),
                  tensor(n, kHeads, kDim)};
      for (const auto& ch : chunks) {
        const auto& s = per_seq.at(ch.doc);
        for (auto t = ch.positions.begin; t < ch.positions.end; ++t) {
          const auto li = ch.local_offset + (t - ch.positions.begin);
          copy_row(s.q, t, io.q, li);
          copy_row(s.k, t, io.k, li);
          copy_row(s.v, t, io.v, li);
          copy_row(s.dout, t, io.dout, li);
        }
      }
      auto r = run_position(c, sched, io);
      // Scatter back per sequence.
      for (const auto& ch : chunks) {
        std::vector<std::int64_t> src(static_cast<std::size_t>(n), -1);
        for (auto t = ch.positions.begin; t < ch.positions.end; ++t)
          src[static_cast<std::size_t>(ch.local_offset + (t - ch.positions.begin))] = t;
        got.at(ch.doc)->put(r, src);
      }
    }
  });
  for (const auto& sd : seqs)
    got.at(sd.id)->check(per_seq.at(sd.id), fmt::format("hdp seq {} (len {})", sd.id, sd.length));
}

TEST_CASE(
    "Ulysses all-to-all (GQA, KV heads replicated) equals full causal attention, forward and backward") {
  const int d = 4;
  const auto s = make_stream({9, 14, 3}, 31);  // 26 tokens, uneven over 4 ranks
  const std::int64_t T = s.q.tokens;
  std::vector<std::int64_t> local(d);
  for (int r = 0; r < d; ++r) local[static_cast<std::size_t>(r)] = (r + 1) * T / d - r * T / d;
  const auto plan =
      seq::plan_ulysses(local, {.degree = d, .heads = kHeads, .kv_heads = kKvHeads, .head_dim = kDim});
  REQUIRE(plan.kv_replication == 2);
  gathered g(s);
  comm::loopback::run(d, [&](comm::loopback::communicator& c) {
    const int me = c.rank();
    const auto first = me * T / d, mine = local[static_cast<std::size_t>(me)];
    const int hq = plan.heads_per_rank, hk = plan.kv_heads_per_rank;
    // Pack: for each peer p, my tokens x p's heads x dim.
    auto pack = [&](const tensor& x, int per, const std::vector<int>& head_begin) {
      std::vector<double> buf;
      for (int p = 0; p < d; ++p)
        for (std::int64_t t = 0; t < mine; ++t)
          for (int h = 0; h < per; ++h)
            for (int e = 0; e < kDim; ++e)
              buf.push_back(x.at(first + t, head_begin[static_cast<std::size_t>(p)] + h, e));
      return buf;
    };
    auto counts = [&](int per, bool sending) {
      std::vector<std::int64_t> n(d), disp(d);
      std::int64_t at = 0;
      for (int p = 0; p < d; ++p) {
        n[static_cast<std::size_t>(p)] = (sending ? mine : local[static_cast<std::size_t>(p)]) * per * kDim;
        disp[static_cast<std::size_t>(p)] = at;
        at += n[static_cast<std::size_t>(p)];
      }
      return std::pair(n, disp);
    };
    auto a2a = [&](const std::vector<double>& send, int per) {
      auto [sc, sd] = counts(per, true);
      auto [rc, rd] = counts(per, false);
      std::vector<double> recv(static_cast<std::size_t>(T * per * kDim));
      comm::all_to_all_v(c, std::span<const double>(send), std::span<const std::int64_t>(sc),
                         std::span<const std::int64_t>(sd), std::span<double>(recv),
                         std::span<const std::int64_t>(rc), std::span<const std::int64_t>(rd));
      tensor out(T, per, kDim);
      out.v = std::move(recv);  // sources in rank order = stream order, token-major: [T][per][dim]
      return out;
    };
    const auto q = a2a(pack(s.q, hq, plan.q_head_begin), hq);
    const auto k = a2a(pack(s.k, hk, plan.kv_head_begin), hk);
    const auto v = a2a(pack(s.v, hk, plan.kv_head_begin), hk);
    const auto dout = a2a(pack(s.dout, hq, plan.q_head_begin), hq);
    // Attention over the whole stream for my heads.
    const head_map hm{plan.q_head_begin[static_cast<std::size_t>(me)], kHeads / kKvHeads,
                      plan.kv_head_begin[static_cast<std::size_t>(me)]};
    std::vector<double> o, lse;
    block_forward(q, s.meta, 0, T, k, v, s.meta, 0, T, true, hm, o, lse);
    std::vector<double> delta(lse.size());
    seq::attention_delta(std::span<const double>(o), std::span<const double>(dout.v),
                         std::span<double>(delta), static_cast<std::size_t>(kDim));
    tensor dq(T, hq, kDim), dk(T, hk, kDim), dv(T, hk, kDim);
    block_backward(q, s.meta, 0, T, k, v, s.meta, 0, T, true, hm, lse, delta, dout, 0, dq, 0, dk, dv, 0);
    // Reverse all-to-all: send rows of peer p's tokens back; sum replicated KV-head gradients.
    auto back = [&](const std::vector<double>& x, int per) {
      auto [sc, sd] = counts(per, false);
      auto [rc, rd] = counts(per, true);
      std::vector<double> recv(static_cast<std::size_t>(d * mine * per * kDim));
      comm::all_to_all_v(c, std::span<const double>(x), std::span<const std::int64_t>(sc),
                         std::span<const std::int64_t>(sd), std::span<double>(recv),
                         std::span<const std::int64_t>(rc), std::span<const std::int64_t>(rd));
      return recv;  // [peer][my token][per][dim]
    };
    auto scatter = [&](const std::vector<double>& recv, int per, const std::vector<int>& head_begin,
                       tensor& into, bool add) {
      std::size_t at = 0;
      for (int p = 0; p < d; ++p)
        for (std::int64_t t = 0; t < mine; ++t)
          for (int h = 0; h < per; ++h)
            for (int e = 0; e < kDim; ++e) {
              auto& dst = into.at(t, head_begin[static_cast<std::size_t>(p)] + h, e);
              dst = add ? dst + recv[at] : recv[at];
              ++at;
            }
    };
    tensor mo(mine, kHeads, kDim), mdq(mine, kHeads, kDim), mdk(mine, kKvHeads, kDim),
        mdv(mine, kKvHeads, kDim);
    scatter(back(o, hq), hq, plan.q_head_begin, mo, false);
    scatter(back(dq.v, hq), hq, plan.q_head_begin, mdq, false);
    scatter(back(dk.v, hk), hk, plan.kv_head_begin, mdk, true);
    scatter(back(dv.v, hk), hk, plan.kv_head_begin, mdv, true);
    std::lock_guard lock(g.m);
    for (std::int64_t t = 0; t < mine; ++t) {
      copy_row(mo, t, g.out, first + t);
      copy_row(mdq, t, g.dq, first + t);
      copy_row(mdk, t, g.dk, first + t);
      copy_row(mdv, t, g.dv, first + t);
    }
  });
  g.check(s, "ulysses d=4 (GQA 4q/2kv, replicated)");
}

TEST_CASE(
    "HDP loss normalisation: per-rank sums over global_tokens, SUM-reduced, equal plain data parallelism") {
  // A token-level loss l = sum_t 0.5*|W x_t|^2 / N over the batch; dl/dW = sum_t (W x_t) x_t^T / N.
  const std::vector<seq::seq_desc> seqs{{100, 40}, {101, 30}, {102, 10}, {103, 12},
                                        {104, 5},  {105, 16}, {106, 7}};
  const auto plan = seq::plan_hdp(seqs, {.capacity = 16}, 6);
  constexpr int n = 3;
  const auto w = make_tensor(5, 1, n * n, 1);  // W as n*n values
  auto x_of = [](std::int64_t id, std::int64_t pos, int d) {
    const auto k = hetmesh::key_hash(
        {77, static_cast<std::uint64_t>(id), static_cast<std::uint64_t>(pos), static_cast<std::uint64_t>(d)});
    return static_cast<double>(k >> 11) * 0x1.0p-52 - 1.0;
  };
  auto add_token = [&](std::vector<double>& g, std::int64_t id, std::int64_t pos, double scale) {
    double x[n], y[n] = {0, 0, 0};
    for (int j = 0; j < n; ++j) x[j] = x_of(id, pos, j);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) y[i] += w.v[static_cast<std::size_t>(i * n + j)] * x[j];
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) g[static_cast<std::size_t>(i * n + j)] += scale * y[i] * x[j];
  };
  const double N = static_cast<double>(plan.global_tokens());
  std::vector<double> ref(n * n, 0.0);
  for (const auto& s : seqs)
    for (std::int64_t t = 0; t < s.length; ++t) add_token(ref, s.id, t, 1.0 / N);
  std::vector<double> got, per_rank_mean;
  std::mutex m;
  comm::loopback::run(6, [&](comm::loopback::communicator& c) {
    std::vector<double> g(n * n, 0.0), mean(n * n, 0.0);
    std::int64_t mine = 0;
    for (const auto& mb : plan.per_rank[static_cast<std::size_t>(c.rank())])
      for (const auto& sg : mb.segments)
        for (auto t = sg.tokens.begin; t < sg.tokens.end; ++t) {
          add_token(g, sg.seq_id, t, 1.0 / N);
          ++mine;
        }
    // The wrong normalisation for comparison: each rank's own token mean, averaged over ranks.
    for (std::size_t i = 0; i < g.size(); ++i)
      mean[i] = mine > 0 ? g[i] * N / static_cast<double>(mine) : 0.0;
    comm::all_reduce(c, std::span<double>(g), comm::reduce_op::sum);
    comm::all_reduce(c, std::span<double>(mean), comm::reduce_op::avg);
    if (c.rank() == 0) {
      std::lock_guard lock(m);
      got = g;
      per_rank_mean = mean;
    }
  });
  MESSAGE("HDP gradient vs plain DP: rel err ", rel_err(got, ref),
          "; averaging per-rank means instead: ", rel_err(per_rank_mean, ref));
  CHECK(rel_err(got, ref) < kTol);
  CHECK(rel_err(per_rank_mean, ref) > 1e-3);  // token counts differ per rank, so that would be wrong
}
