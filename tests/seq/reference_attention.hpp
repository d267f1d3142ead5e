// SPDX-License-Identifier: Apache-2.0
// Naive softmax attention and its backward, in double, for the seq/ numerical tests. Tokens carry a
// document id and a position; a query sees keys of its document at positions <= its own (causal),
// or every key of its document (causal = false). Layout: [token][head][dim], row-major. GQA: query
// head h reads KV head h / (heads / kv_heads) - offset, so a rank holding a slice of heads passes
// the offsets of its slices.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <hetmesh/core/random.hpp>

namespace seqtest {

struct tensor {
  std::int64_t tokens = 0;
  int heads = 0;
  int dim = 0;
  std::vector<double> v;

  tensor() = default;
  tensor(std::int64_t t, int h, int d)
      : tokens(t), heads(h), dim(d), v(static_cast<std::size_t>(t * h * d), 0.0) {}
  double& at(std::int64_t t, int h, int d) { return v[static_cast<std::size_t>((t * heads + h) * dim + d)]; }
  double at(std::int64_t t, int h, int d) const {
    return v[static_cast<std::size_t>((t * heads + h) * dim + d)];
  }
  double* row(std::int64_t t, int h) { return v.data() + (t * heads + h) * dim; }
  const double* row(std::int64_t t, int h) const { return v.data() + (t * heads + h) * dim; }
};

/// Verifiable values in [-1, 1): a pure function of (seed, token, head, dim).
inline tensor make_tensor(std::uint64_t seed, std::int64_t tokens, int heads, int dim) {
  tensor x(tokens, heads, dim);
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int d = 0; d < dim; ++d) {
        const auto k = hetmesh::key_hash({seed, static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(h),
                                          static_cast<std::uint64_t>(d)});
        x.at(t, h, d) = static_cast<double>(k >> 11) * 0x1.0p-52 - 1.0;
      }
  return x;
}

struct token_meta {
  std::vector<std::int64_t> doc;
  std::vector<std::int64_t> pos;
};

/// Heads mapping: q head hq (local index) -> kv head local index.
struct head_map {
  int q_head_offset = 0;   // global index of local q head 0
  int group = 1;           // q heads per kv head (global)
  int kv_head_offset = 0;  // global index of local kv head 0
  int kv(int hq_local) const { return (q_head_offset + hq_local) / group - kv_head_offset; }
};

inline bool visible(const token_meta& qm, std::int64_t i, const token_meta& km, std::int64_t j, bool causal) {
  return qm.doc[static_cast<std::size_t>(i)] == km.doc[static_cast<std::size_t>(j)] &&
         (!causal || km.pos[static_cast<std::size_t>(j)] <= qm.pos[static_cast<std::size_t>(i)]);
}

/// Attention of queries q (rows qr0..qr0+nq) over keys k/v (rows kr0..kr0+nk): writes the partial
/// output and row lse (one per (token, head)) for these rows only; rows seeing no key get lse = -inf.
inline void block_forward(const tensor& q, const token_meta& qm, std::int64_t qr0, std::int64_t nq,
                          const tensor& k, const tensor& v, const token_meta& km, std::int64_t kr0,
                          std::int64_t nk, bool causal, head_map hm, std::vector<double>& out,
                          std::vector<double>& lse) {
  const int dim = q.dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  out.assign(static_cast<std::size_t>(nq * q.heads * dim), 0.0);
  lse.assign(static_cast<std::size_t>(nq * q.heads), -std::numeric_limits<double>::infinity());
  std::vector<double> s(static_cast<std::size_t>(nk));
  for (std::int64_t i = 0; i < nq; ++i)
    for (int h = 0; h < q.heads; ++h) {
      const int hk = hm.kv(h);
      double m = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < nk; ++j) {
        if (!visible(qm, qr0 + i, km, kr0 + j, causal)) {
          s[static_cast<std::size_t>(j)] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double dot = 0;
        for (int d = 0; d < dim; ++d) dot += q.at(qr0 + i, h, d) * k.at(kr0 + j, hk, d);
        s[static_cast<std::size_t>(j)] = dot * scale;
        m = std::max(m, s[static_cast<std::size_t>(j)]);
      }
      if (m == -std::numeric_limits<double>::infinity()) continue;
      double z = 0;
      double* o = out.data() + (i * q.heads + h) * dim;
      for (std::int64_t j = 0; j < nk; ++j) {
        if (s[static_cast<std::size_t>(j)] == -std::numeric_limits<double>::infinity()) continue;
        const double p = std::exp(s[static_cast<std::size_t>(j)] - m);
        z += p;
        for (int d = 0; d < dim; ++d) o[d] += p * v.at(kr0 + j, hk, d);
      }
      for (int d = 0; d < dim; ++d) o[d] /= z;
      lse[static_cast<std::size_t>(i * q.heads + h)] = m + std::log(z);
    }
}

/// Backward of one block given the FINAL row lse and delta (rowsum dO*O) of the query rows:
/// accumulates into dq (rows of q), dk and dv (rows of k). Independent of other blocks.
inline void block_backward(const tensor& q, const token_meta& qm, std::int64_t qr0, std::int64_t nq,
                           const tensor& k, const tensor& v, const token_meta& km, std::int64_t kr0,
                           std::int64_t nk, bool causal, head_map hm, const std::vector<double>& lse,
                           const std::vector<double>& delta, const tensor& dout, std::int64_t dr0, tensor& dq,
                           std::int64_t dqr0, tensor& dk, tensor& dv, std::int64_t dkr0) {
  const int dim = q.dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (std::int64_t i = 0; i < nq; ++i)
    for (int h = 0; h < q.heads; ++h) {
      const int hk = hm.kv(h);
      const double l = lse[static_cast<std::size_t>((dr0 + i) * q.heads + h)];
      if (l == -std::numeric_limits<double>::infinity()) continue;
      const double dl = delta[static_cast<std::size_t>((dr0 + i) * q.heads + h)];
      for (std::int64_t j = 0; j < nk; ++j) {
        if (!visible(qm, qr0 + i, km, kr0 + j, causal)) continue;
        double dot = 0;
        for (int d = 0; d < dim; ++d) dot += q.at(qr0 + i, h, d) * k.at(kr0 + j, hk, d);
        const double p = std::exp(dot * scale - l);
        double dp = 0;
        for (int d = 0; d < dim; ++d) dp += dout.at(dr0 + i, h, d) * v.at(kr0 + j, hk, d);
        const double ds = p * (dp - dl);
        for (int d = 0; d < dim; ++d) {
          dv.at(dkr0 + j, hk, d) += p * dout.at(dr0 + i, h, d);
          dq.at(dqr0 + i, h, d) += scale * ds * k.at(kr0 + j, hk, d);
          dk.at(dkr0 + j, hk, d) += scale * ds * q.at(qr0 + i, h, d);
        }
      }
    }
}

/// Full attention of a token stream on one rank: forward (out, lse) and backward (dq, dk, dv).
struct full_result {
  tensor out, dq, dk, dv;
  std::vector<double> lse;
};

inline full_result full_attention(const tensor& q, const tensor& k, const tensor& v, const token_meta& meta,
                                  const tensor& dout, bool causal = true) {
  full_result r;
  const head_map hm{0, q.heads / k.heads, 0};
  std::vector<double> o;
  block_forward(q, meta, 0, q.tokens, k, v, meta, 0, k.tokens, causal, hm, o, r.lse);
  r.out = tensor(q.tokens, q.heads, q.dim);
  r.out.v = o;
  std::vector<double> delta(r.lse.size());
  for (std::size_t i = 0; i < delta.size(); ++i) {
    double s = 0;
    for (int d = 0; d < q.dim; ++d)
      s += dout.v[i * static_cast<std::size_t>(q.dim) + d] * o[i * static_cast<std::size_t>(q.dim) + d];
    delta[i] = s;
  }
  r.dq = tensor(q.tokens, q.heads, q.dim);
  r.dk = tensor(k.tokens, k.heads, k.dim);
  r.dv = tensor(v.tokens, v.heads, v.dim);
  block_backward(q, meta, 0, q.tokens, k, v, meta, 0, k.tokens, causal, hm, r.lse, delta, dout, 0, r.dq, 0,
                 r.dk, r.dv, 0);
  return r;
}

/// max |a-b| / max |b| over matching elements.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  return den > 0 ? num / den : num;
}

}  // namespace seqtest
