// SPDX-License-Identifier: Apache-2.0
// Test bodies of the Ulysses exchange and token dispatch, templated on the communicator: the loopback
// tests (ulysses.cpp, dispatch.cpp) run them on threads, exchange_mpi.cpp on MPI ranks under mpirun.
// Data are verifiable: every value is a pure function of (seed, sequence or token, head, column), so
// a row in the wrong place is caught, not averaged away.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include <hetmesh/balance/dispatch.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/run/dispatch.hpp>
#include <hetmesh/run/ulysses.hpp>
#include <hetmesh/seq/cp.hpp>
#include <hetmesh/seq/hdp.hpp>
#include <hetmesh/seq/ulysses.hpp>

#include "seq/reference_attention.hpp"

namespace runtest {

using namespace hetmesh;

/// Verifiable integer of the keys, small enough that sums of 8 copies do not overflow.
inline std::int64_t ival(std::initializer_list<std::uint64_t> k) {
  return static_cast<std::int64_t>(key_hash(k) >> 8);
}

/// Token counts of `total` tokens cut unevenly over d ranks (some may be empty), a pure function of seed.
inline std::vector<std::int64_t> uneven_tokens(int d, std::int64_t total, std::uint64_t seed) {
  rng g(seed);
  std::vector<std::int64_t> cuts{0, total};
  for (int r = 1; r < d; ++r) cuts.push_back(g.uniform(0, total));
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::int64_t> out;
  for (std::size_t r = 0; r + 1 < cuts.size(); ++r) out.push_back(cuts[r + 1] - cuts[r]);
  return out;
}

// ---------------------------------------------------------------- Ulysses

/// Exact data movement of the Ulysses exchange for both parts: to_heads puts head h of global token t
/// where the plan says; to_sequence(first) inverts it bitwise; to_sequence(sum) gives each head times
/// its number of replicas. Collective over c (c.size() == pol.degree).
template <class C>
void ulysses_movement(C& c, const seq::ulysses_policy& pol, std::span<const std::int64_t> tokens,
                      std::uint64_t seed) {
  const auto plan = seq::plan_ulysses(tokens, pol);
  const int me = c.rank();
  const auto d = static_cast<std::size_t>(c.size());
  std::int64_t first = 0;
  for (int r = 0; r < me; ++r) first += tokens[static_cast<std::size_t>(r)];
  const std::int64_t mine = tokens[static_cast<std::size_t>(me)], D = pol.head_dim;
  for (const auto part : {run::ulysses_part::query, run::ulysses_part::key_value}) {
    const bool q = part == run::ulysses_part::query;
    const std::int64_t H = q ? pol.heads : pol.kv_heads,
                       per = q ? plan.heads_per_rank : plan.kv_heads_per_rank;
    const auto& begin = q ? plan.q_head_begin : plan.kv_head_begin;
    auto val = [&](std::int64_t t, std::int64_t h, std::int64_t e) {
      return ival({seed, q ? 1u : 2u, static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(h),
                   static_cast<std::uint64_t>(e)});
    };
    std::vector<std::int64_t> x(static_cast<std::size_t>(mine * H * D));
    for (std::int64_t t = 0; t < mine; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t e = 0; e < D; ++e)
          x[static_cast<std::size_t>((t * H + h) * D + e)] = val(first + t, h, e);
    std::vector<std::int64_t> y(static_cast<std::size_t>(run::ulysses_head_size(plan, part)), -1);
    run::ulysses_to_heads(c, plan, part, std::span<const std::int64_t>(x), std::span<std::int64_t>(y));
    std::int64_t bad = 0;
    for (std::int64_t t = 0; t < plan.total_tokens; ++t)
      for (std::int64_t k = 0; k < per; ++k)
        for (std::int64_t e = 0; e < D; ++e)
          bad += y[static_cast<std::size_t>((t * per + k) * D + e)] !=
                 val(t, begin[static_cast<std::size_t>(me)] + k, e);
    CHECK_MESSAGE(bad == 0, "ulysses_to_heads misplaced ", bad, " elements on rank ", me);
    std::vector<std::int64_t> back(x.size(), -1), sum(x.size(), -1);
    run::ulysses_to_sequence(c, plan, part, std::span<const std::int64_t>(y), std::span<std::int64_t>(back));
    CHECK_MESSAGE(back == x, "ulysses_to_sequence(first) is not the inverse on rank ", me);
    run::ulysses_to_sequence(c, plan, part, std::span<const std::int64_t>(y), std::span<std::int64_t>(sum),
                             run::ulysses_combine::sum);
    bad = 0;
    for (std::int64_t h = 0; h < H; ++h) {
      std::int64_t copies = 0;
      for (std::size_t p = 0; p < d; ++p) copies += begin[p] <= h && h < begin[p] + per;
      if (!q && pol.kv_heads < pol.degree) CHECK(copies == pol.degree / pol.kv_heads);
      for (std::int64_t t = 0; t < mine; ++t)
        for (std::int64_t e = 0; e < D; ++e) {
          const auto i = static_cast<std::size_t>((t * H + h) * D + e);
          bad += sum[i] != copies * x[i];
        }
    }
    CHECK_MESSAGE(bad == 0, "ulysses_to_sequence(sum) is not copies x value on rank ", me);
  }
}

/// Ulysses around a single-rank attention equals full causal attention (forward: out; backward: dq, dk,
/// dv) on every rank's tokens, relative error <= 1e-10. The stream is a packed set of documents;
/// rank r holds the r-th slice of `tokens`. Collective over c.
template <class C>
void ulysses_attention(C& c, const seq::ulysses_policy& pol, std::span<const std::int64_t> doc_lengths,
                       std::span<const std::int64_t> tokens, std::uint64_t seed) {
  using namespace seqtest;
  const int H = pol.heads, Hkv = pol.kv_heads, D = pol.head_dim;
  token_meta meta;
  for (std::size_t d = 0; d < doc_lengths.size(); ++d)
    for (std::int64_t t = 0; t < doc_lengths[d]; ++t) {
      meta.doc.push_back(static_cast<std::int64_t>(d));
      meta.pos.push_back(t);
    }
  const auto T = static_cast<std::int64_t>(meta.doc.size());
  const auto q = make_tensor(seed, T, H, D), k = make_tensor(seed + 1, T, Hkv, D),
             v = make_tensor(seed + 2, T, Hkv, D), dout = make_tensor(seed + 3, T, H, D);
  const auto ref = full_attention(q, k, v, meta, dout);
  const auto plan = seq::plan_ulysses(tokens, pol);
  const int me = c.rank();
  std::int64_t first = 0;
  for (int r = 0; r < me; ++r) first += tokens[static_cast<std::size_t>(r)];
  const std::int64_t mine = tokens[static_cast<std::size_t>(me)];
  auto slice = [&](const tensor& x) {
    const auto row = static_cast<std::ptrdiff_t>(x.heads * x.dim);
    return std::span<const double>(x.v.data() + first * row, static_cast<std::size_t>(mine * row));
  };
  auto qkv = run::ulysses_qkv_to_heads(c, plan, slice(q), slice(k), slice(v));
  const int hq = plan.heads_per_rank, hk = plan.kv_heads_per_rank;
  tensor lq(T, hq, D), lk(T, hk, D), lv(T, hk, D), ldout(T, hq, D);
  lq.v = std::move(qkv.q), lk.v = std::move(qkv.k), lv.v = std::move(qkv.v);
  run::ulysses_to_heads(c, plan, run::ulysses_part::query, slice(dout), std::span<double>(ldout.v));
  const head_map hm{plan.q_head_begin[static_cast<std::size_t>(me)], H / Hkv,
                    plan.kv_head_begin[static_cast<std::size_t>(me)]};
  std::vector<double> o, lse;
  block_forward(lq, meta, 0, T, lk, lv, meta, 0, T, true, hm, o, lse);
  std::vector<double> delta(lse.size());
  for (std::size_t i = 0; i < delta.size(); ++i) {
    double s = 0;
    for (int e = 0; e < D; ++e)
      s += ldout.v[i * static_cast<std::size_t>(D) + static_cast<std::size_t>(e)] *
           o[i * static_cast<std::size_t>(D) + static_cast<std::size_t>(e)];
    delta[i] = s;
  }
  tensor dq(T, hq, D), dk(T, hk, D), dv(T, hk, D);
  block_backward(lq, meta, 0, T, lk, lv, meta, 0, T, true, hm, lse, delta, ldout, 0, dq, 0, dk, dv, 0);
  std::vector<double> out(
      static_cast<std::size_t>(run::ulysses_sequence_size(plan, run::ulysses_part::query, me)));
  run::ulysses_to_sequence(c, plan, run::ulysses_part::query, std::span<const double>(o),
                           std::span<double>(out));
  const auto g = run::ulysses_grads_to_sequence(c, plan, std::span<const double>(dq.v),
                                                std::span<const double>(dk.v), std::span<const double>(dv.v));
  auto err = [&](const std::vector<double>& got, const tensor& want) {
    const auto s = slice(want);
    double num = 0, den = 0;
    for (double w : want.v) den = std::max(den, std::abs(w));
    for (std::size_t i = 0; i < s.size(); ++i) num = std::max(num, std::abs(got[i] - s[i]));
    return got.size() == s.size() ? num / den : 1.0;
  };
  CHECK_MESSAGE(err(out, ref.out) <= 1e-10, "out on rank ", me);
  CHECK_MESSAGE(err(g.q, ref.dq) <= 1e-10, "dq on rank ", me);
  CHECK_MESSAGE(err(g.k, ref.dk) <= 1e-10, "dk on rank ", me);
  CHECK_MESSAGE(err(g.v, ref.dv) <= 1e-10, "dv on rank ", me);
}

// ---------------------------------------------------------------- token dispatch

/// A row element that is no comm::element (moved as bytes): fields of a token's record.
struct token_record {
  std::int64_t id = 0;
  std::int32_t pos = 0;
  float weight = 0;
  friend bool operator==(const token_record&, const token_record&) = default;
};

/// One random dispatch problem over n ranks: owners' sources (with gaps between sequences) and the
/// targets of a partition of kind 0 (random cuts on random ranks, gaps, shuffled rows), 1 (THD
/// context parallel over n ranks, padded) or 2 (HDP over a pool of n). A pure function of (n, kind, seed).
struct dispatch_case {
  std::vector<seq::seq_desc> seqs;
  std::vector<balance::token_source> sources;
  std::vector<balance::llm_block> targets;
};

inline dispatch_case make_dispatch_case(int n, int kind, std::uint64_t seed) {
  rng g(key_hash({seed, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(kind)}));
  dispatch_case dc;
  const auto count = g.uniform(1, 10);
  std::int64_t longest = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    dc.seqs.push_back({1000 + 17 * i + g.uniform(0, 16), g.uniform(kind == 0 ? 0 : 1, 40)});
    longest = std::max(longest, dc.seqs.back().length);
  }
  std::vector<std::int64_t> next(static_cast<std::size_t>(n), 0);
  for (const auto& s : dc.seqs) {
    const auto r = static_cast<int>(g.below(static_cast<std::uint64_t>(n)));
    auto& at = next[static_cast<std::size_t>(r)];
    at += g.uniform(0, 2);  // a gap no sequence covers
    dc.sources.push_back({s.id, r, at, s.length});
    at += s.length;
  }
  if (kind == 0) {
    struct piece {
      std::int64_t id;
      seq::token_range tokens;
      int rank;
    };
    std::vector<piece> pieces;
    for (const auto& s : dc.seqs) {
      std::int64_t b = 0;
      while (b < s.length) {
        const auto e = std::min(s.length, b + g.uniform(1, 12));
        pieces.push_back({s.id, {b, e}, static_cast<int>(g.below(static_cast<std::uint64_t>(n)))});
        b = e;
      }
    }
    shuffle(std::span<piece>(pieces), g);
    std::vector<std::int64_t> row(static_cast<std::size_t>(n), 0);
    for (const auto& p : pieces) {
      auto& at = row[static_cast<std::size_t>(p.rank)];
      at += g.uniform(0, 1);
      dc.targets.push_back({p.id, p.rank, p.tokens, at});
      at += p.tokens.size();
    }
  } else if (kind == 1) {
    std::vector<std::int64_t> lengths, ids;
    for (const auto& s : dc.seqs) lengths.push_back(s.length), ids.push_back(s.id);
    const auto part = seq::partition_thd(lengths, n, true);
    dc.targets = balance::dispatch_targets(part, ids);
  } else {
    const std::int64_t cap = std::max<std::int64_t>(8, (longest + n - 1) / n + 1);
    const auto plan = seq::plan_hdp(dc.seqs, {.capacity = cap}, n);
    dc.targets = balance::dispatch_targets(plan);
  }
  return dc;
}

/// Dispatches the case's token rows (width columns of T, made by make(seq, pos, column)) and gathers
/// them back: every target row holds exactly its planned token (pads and unplanned rows keep their
/// sentinel), the gathered sources equal the originals bitwise and the gaps keep theirs. Returns the
/// token rows this rank received. Collective over c (c.size() == n of the case).
/// Rank `me`'s source rows of `dc` under `plan` (width elements per token, make(seq, token, k)), with one
/// sentinel row past the end (a row the dispatch must never touch).
template <class T, class Plan, class Make>
std::vector<T> dispatch_sources(int me, const dispatch_case& dc, const Plan& plan, std::size_t w, Make make,
                                T sentinel) {
  std::vector<T> src(static_cast<std::size_t>(plan.source_rows[static_cast<std::size_t>(me)] + 1) * w,
                     sentinel);
  for (const auto& s : dc.sources)
    if (s.rank == me)
      for (std::int64_t t = 0; t < s.length; ++t)
        for (std::size_t k = 0; k < w; ++k)
          src[static_cast<std::size_t>(s.offset + t) * w + k] = make(s.seq_id, t, k);
  return src;
}

template <class T, class C, class Make>
std::int64_t dispatch_round_trip(C& c, const dispatch_case& dc, std::int64_t width, Make make, T sentinel) {
  const int me = c.rank();
  const auto plan = balance::plan_token_dispatch(c.size(), dc.sources, dc.targets);
  const auto w = static_cast<std::size_t>(width);
  std::vector<T> src = dispatch_sources<T>(me, dc, plan, w, make, sentinel);
  std::vector<T> dst(static_cast<std::size_t>(plan.target_rows[static_cast<std::size_t>(me)] + 1) * w,
                     sentinel);
  run::dispatch_tokens(c, plan, std::span<const T>(src), std::span<T>(dst), width);
  std::vector<T> want(dst.size(), sentinel);
  std::int64_t received = 0;
  for (const auto& b : dc.targets) {
    if (b.rank != me) continue;
    std::int64_t length = 0;
    for (const auto& s : dc.sources)
      if (s.seq_id == b.sample_id) length = s.length;
    for (std::int64_t p = b.tokens.begin; p < std::min(b.tokens.end, length); ++p, ++received)
      for (std::size_t k = 0; k < w; ++k)
        want[static_cast<std::size_t>(b.offset + p - b.tokens.begin) * w + k] = make(b.sample_id, p, k);
  }
  CHECK_MESSAGE(dst == want, "rank ", me, ": target rows differ from the plan");
  std::vector<T> back(src.size(), sentinel);  // rows no sequence covers stay the sentinel, as in src
  run::gather_tokens(c, plan, std::span<const T>(dst), std::span<T>(back), width);
  CHECK_MESSAGE(back == src, "rank ", me, ": gather_tokens did not restore the sources");
  return received;
}

/// The exactly-once property for one case: int64 rows (typed path) and token_record rows (bytes), and
/// the received counts summed over the group equal the tokens of the batch.
template <class C>
void dispatch_property(C& c, int kind, std::uint64_t seed) {
  const auto dc = make_dispatch_case(c.size(), kind, seed);
  const auto got = dispatch_round_trip<std::int64_t>(
      c, dc, 3,
      [&](std::int64_t id, std::int64_t p, std::size_t k) {
        return ival({seed, static_cast<std::uint64_t>(id), static_cast<std::uint64_t>(p), k});
      },
      std::int64_t{-1});
  (void)dispatch_round_trip<token_record>(
      c, dc, 2,
      [&](std::int64_t id, std::int64_t p, std::size_t k) {
        return token_record{id, static_cast<std::int32_t>(p), static_cast<float>(k) + 0.5f};
      },
      token_record{-1, -1, -1.0f});
  std::int64_t all = got;
  comm::all_reduce(c, std::span<std::int64_t>(&all, 1), comm::reduce_op::sum);
  std::int64_t tokens = 0;
  for (const auto& s : dc.seqs) tokens += s.length;
  CHECK(all == tokens);
}

}  // namespace runtest
