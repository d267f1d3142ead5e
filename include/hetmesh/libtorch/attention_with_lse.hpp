// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: local attention over torch tensors that returns the row log-sum-exp beside the output,
// both as autograd tensors. It is the composed-ops body of libtorch::block_attention (block_attention.hpp)
// and, with autograd on, a differentiable attention for modules that run without a ring (and for a plain
// libtorch reference loop). Layouts are model/attention.hpp's: q and out [tokens][q_heads][head_dim], k and
// v [tokens][kv_heads][head_dim], lse [tokens][q_heads]; grouped-query heads (query head h reads KV head
// h / (q_heads / kv_heads)); the per-document mask of model::attention_block (a query sees a key of its own
// document, under causal only at or before its position).
//
// Light headers: ATen's core tensor and the few per-operator headers used here, never <torch/torch.h>.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/where.h>

#include "../core/error.hpp"
#include "../seq/ring.hpp"

namespace hetmesh::libtorch {

/// Per-token metadata of one attention call (host memory, valid for the call): the document and position
/// of every query and key token, as model::attention_block holds them. Empty spans for q_doc and k_doc mean
/// one document: every query sees every key (full), or keys at positions up to its own (causal), with
/// positions 0, 1, ... when q_pos / k_pos are empty too.
struct token_meta {
  std::span<const std::int64_t> q_doc;  ///< [nq] document of each query token (empty: one document)
  std::span<const std::int64_t> q_pos;  ///< [nq] position of each query token (empty: 0, 1, ...)
  std::span<const std::int64_t> k_doc;  ///< [nk] document of each key token (empty: one document)
  std::span<const std::int64_t> k_pos;  ///< [nk] position of each key token (empty: 0, 1, ...)
};

/// Output and row log-sum-exp of an attention call: out [nq][q_heads][head_dim] and lse [nq][q_heads]
/// (natural log; -infinity, with out = 0, for a row that sees no key). Autograd tensors when an input
/// required grad.
struct attention_output {
  at::Tensor out;  ///< [nq][q_heads][head_dim]
  at::Tensor lse;  ///< [nq][q_heads]
};

namespace detail {

/// An int64 CPU tensor over `s`, or 0..n-1 when `s` is empty, moved to `device`.
inline at::Tensor meta_tensor(std::span<const std::int64_t> s, std::int64_t n, const at::Device& device) {
  at::Tensor t;
  if (s.empty())
    t = at::arange(n, at::TensorOptions().dtype(at::kLong));
  else
    t = at::from_blob(const_cast<std::int64_t*>(s.data()), {static_cast<std::int64_t>(s.size())},
                      at::TensorOptions().dtype(at::kLong));  // read at once: the mask is a new tensor
  return t.to(device);
}

/// The visibility mask [nq][nk] (bool, on `device`) of a block with metadata `m` under `mask`.
inline at::Tensor visibility(const token_meta& m, std::int64_t nq, std::int64_t nk, seq::block_mask mask,
                             const at::Device& device) {
  if (mask == seq::block_mask::none)
    throw_error<invalid_argument>(
        "libtorch attention: called with block_mask::none; expected full or causal");
  const bool one_doc = m.q_doc.empty() && m.k_doc.empty();
  if (!one_doc &&
      (static_cast<std::int64_t>(m.q_doc.size()) != nq || static_cast<std::int64_t>(m.k_doc.size()) != nk))
    throw_error<invalid_argument>(
        "libtorch attention: {} query and {} key document ids for {} query and {} key "
        "tokens; expected one per token (or none for one document)",
        m.q_doc.size(), m.k_doc.size(), nq, nk);
  if ((!m.q_pos.empty() && static_cast<std::int64_t>(m.q_pos.size()) != nq) ||
      (!m.k_pos.empty() && static_cast<std::int64_t>(m.k_pos.size()) != nk))
    throw_error<invalid_argument>(
        "libtorch attention: {} query and {} key positions for {} query and {} key "
        "tokens; expected one per token (or none: 0, 1, ...)",
        m.q_pos.size(), m.k_pos.size(), nq, nk);
  at::Tensor vis;
  if (!one_doc)
    vis = meta_tensor(m.q_doc, nq, device).unsqueeze(1).eq(meta_tensor(m.k_doc, nk, device).unsqueeze(0));
  if (mask == seq::block_mask::causal) {
    auto c = meta_tensor(m.k_pos, nk, device).unsqueeze(0).le(meta_tensor(m.q_pos, nq, device).unsqueeze(1));
    vis = vis.defined() ? vis.logical_and(c) : c;
  }
  if (!vis.defined()) vis = at::ones({nq, nk}, at::TensorOptions().dtype(at::kBool).device(device));
  return vis;
}

/// Checks q [nq][hq][d], k and v [nk][hk][d] (hk dividing hq, same dtype and device); returns hq / hk.
inline std::int64_t check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (q.dim() != 3 || k.dim() != 3 || !k.sizes().equals(v.sizes()) || q.size(2) != k.size(2) ||
      k.size(1) < 1 || q.size(1) % k.size(1) != 0 || q.scalar_type() != k.scalar_type() ||
      q.scalar_type() != v.scalar_type())
    throw_error<invalid_argument>(
        "libtorch attention: q of {} dims, k of {}, v of {}; expected q [tokens][q_heads][head_dim], k and v "
        "[tokens][kv_heads][head_dim] of one dtype, kv_heads dividing q_heads",
        q.dim(), k.dim(), v.dim());
  return q.size(1) / k.size(1);
}

/// q [nq][hq][d] as [hk][g * nq][d] (query heads of one KV head together, group-major).
inline at::Tensor group_queries(const at::Tensor& q, std::int64_t hk, std::int64_t g) {
  const auto nq = q.size(0), d = q.size(2);
  return q.reshape({nq, hk, g, d}).permute({1, 2, 0, 3}).reshape({hk, g * nq, d});
}

/// x [hk][g * nq][w] back to [nq][hk * g][w] (w = 1 drops the last dim).
inline at::Tensor ungroup(const at::Tensor& x, std::int64_t nq, std::int64_t g) {
  const auto hk = x.size(0), w = x.size(2);
  return x.reshape({hk, g, nq, w}).permute({2, 0, 1, 3}).reshape({nq, hk * g, w});
}

/// Dense attention of every query against every key under the mask of `m` (attention_with_lse's body).
inline attention_output dense_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const token_meta& m, seq::block_mask mask, double scale) {
  const auto g = check_qkv(q, k, v);
  const auto nq = q.size(0), nk = k.size(0), hk = k.size(1);
  const auto vis = visibility(m, nq, nk, mask, q.device());  // [nq][nk]
  const double inf = std::numeric_limits<double>::infinity();
  if (nq == 0 || nk == 0)  // nothing to see: every row is empty
    return {q.mul(0), at::full({nq, q.size(1)}, -inf, q.options())};
  const auto qg = group_queries(q, hk, g);  // [hk][g nq][d]
  const auto kh = k.permute({1, 0, 2});     // [hk][nk][d]
  const auto vh = v.permute({1, 0, 2});
  const auto hidden = vis.logical_not().repeat({g, 1});  // [g nq][nk], broadcast over hk
  auto s = qg.bmm(kh.transpose(1, 2)).mul(scale).masked_fill(hidden, -inf);
  const auto seen = vis.any(1).repeat({g}).unsqueeze(0).unsqueeze(2);          // [1][g nq][1]
  const auto mx = at::where(seen, std::get<0>(s.detach().max(2, true)), 0.0);  // shift, no gradient
  const auto p = s.sub(mx).exp();                                              // hidden keys: exactly 0
  const auto z = p.sum(2, true);
  const auto z_safe = at::where(seen, z, 1.0);
  const auto out = p.bmm(vh).div(z_safe);                        // empty rows: 0
  const auto lse = at::where(seen, z_safe.log().add(mx), -inf);  // [hk][g nq][1]
  return {ungroup(out, nq, g), ungroup(lse, nq, g).squeeze(2)};
}

/// One document's share of a block: its query and key rows (index tensors on the block's device) and
/// their positions as a one-document token_meta (valid while this object lives).
struct document_part {
  at::Tensor q_rows, k_rows;               ///< int64 row indices into the block's queries and keys
  std::vector<std::int64_t> q_pos, k_pos;  ///< their positions
  [[nodiscard]] token_meta meta() const { return {{}, q_pos, {}, k_pos}; }
};

/// The block split by document when that pays: two or more documents with both queries and keys, whose
/// query-key pairs are at most three quarters of the block's; empty otherwise (then the dense body runs).
/// Host work O((nq + nk) log(nq + nk)).
inline std::vector<document_part> split_by_document(const token_meta& m, std::int64_t nq, std::int64_t nk,
                                                    const at::Device& device) {
  const auto n = [](std::span<const std::int64_t> s) { return static_cast<std::int64_t>(s.size()); };
  if (n(m.q_doc) != nq || n(m.k_doc) != nk || (!m.q_pos.empty() && n(m.q_pos) != nq) ||
      (!m.k_pos.empty() && n(m.k_pos) != nk) || nq == 0 || nk == 0)
    return {};  // one document, or sizes the dense body refuses with its message
  std::map<std::int64_t, std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> rows;
  for (std::int64_t i = 0; i < nq; ++i) rows[m.q_doc[static_cast<std::size_t>(i)]].first.push_back(i);
  for (std::int64_t j = 0; j < nk; ++j) {
    const auto it = rows.find(m.k_doc[static_cast<std::size_t>(j)]);
    if (it != rows.end()) it->second.second.push_back(j);
  }
  std::int64_t pairs = 0, docs = 0;
  for (const auto& [doc, r] : rows) {
    pairs += static_cast<std::int64_t>(r.first.size() * r.second.size());
    docs += r.second.empty() ? 0 : 1;
  }
  if (docs < 2 || 4 * pairs > 3 * nq * nk) return {};
  std::vector<document_part> parts;
  const auto index = [&](std::vector<std::int64_t>& v) {
    return at::from_blob(v.data(), {static_cast<std::int64_t>(v.size())},
                         at::TensorOptions().dtype(at::kLong))
        .clone()
        .to(device);  // owns its indices
  };
  const auto pos = [](std::span<const std::int64_t> p, const std::vector<std::int64_t>& at_rows) {
    std::vector<std::int64_t> out;
    for (const auto i : at_rows) out.push_back(p.empty() ? i : p[static_cast<std::size_t>(i)]);
    return out;
  };
  for (auto& [doc, r] : rows) {
    if (r.second.empty()) continue;
    parts.push_back({index(r.first), index(r.second), pos(m.q_pos, r.first), pos(m.k_pos, r.second)});
  }
  return parts;
}

}  // namespace detail

/// Attention with its row log-sum-exp: for each query row (token i, head h), out = softmax(scale q k^T) v
/// over the keys it sees (mask and metadata `m`, as model::attention_block) of KV head h / (q_heads /
/// kv_heads), and lse = log sum exp of those scores; a row that sees no key gets out = 0 and lse =
/// -infinity (and no gradient). Differentiable in q, k and v through out and lse (autograd of the composed
/// ops; the empty rows' -infinity never reaches a gradient). q [nq][q_heads][head_dim], k and v
/// [nk][kv_heads][head_dim], any layout (reshaped as needed), float or double, on one device.
/// A block of several documents whose same-document pairs are at most three quarters of all pairs runs
/// document by document (gathering each one's rows), so packed sequences cost what their documents' pairs
/// cost. Pre: shapes as above (invalid_argument otherwise), metadata sized as token_meta says, mask full or
/// causal. Not collective. Deterministic for a fixed number of intra-op threads. Cost: O(P q_heads
/// head_dim) time and O(P q_heads) memory for the scores (saved for backward when autograd records), P the
/// query-key pairs computed (nq nk, or the same-document pairs when split).
inline attention_output attention_with_lse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const token_meta& m, seq::block_mask mask, double scale) {
  detail::check_qkv(q, k, v);
  const auto parts = detail::split_by_document(m, q.size(0), k.size(0), q.device());
  if (parts.empty()) return detail::dense_attention(q, k, v, m, mask, scale);
  const double inf = std::numeric_limits<double>::infinity();
  auto out = q.new_zeros({q.size(0), q.size(1), v.size(2)});
  auto lse = at::full({q.size(0), q.size(1)}, -inf, q.options());
  for (const auto& d : parts) {
    const auto r = detail::dense_attention(q.index_select(0, d.q_rows), k.index_select(0, d.k_rows),
                                           v.index_select(0, d.k_rows), d.meta(), mask, scale);
    out = out.index_copy(0, d.q_rows, r.out);
    lse = lse.index_copy(0, d.q_rows, r.lse);
  }
  return {out, lse};
}

}  // namespace hetmesh::libtorch
