// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: a model::attention_kernel (model/attention.hpp) computed with torch ops, for float and
// double. The block's spans are viewed as tensors (no copies of q, k, v or the outputs); the forward is
// libtorch::attention_with_lse (attention_with_lse.hpp) without autograd; the backward is the closed form
// from the merged lse and delta that ring attention hands every block:
//   P = exp(scale q k^T - lse) on visible keys, dS = P * (dout v^T - delta),
//   dv += P^T dout, dq += scale dS k, dk += scale dS^T q,
// batched over KV heads (the query heads of one KV head are stacked, so dk and dv sum over the group in one
// product). Forward and backward run document by document when a block's same-document pairs are at most
// three quarters of its pairs (packed sequences: each document's rows gathered, computed densely, added
// back), else densely over the whole block. With torch >= 2.2, a block of one document whose mask is full, or
// causal over equal query and key positions, runs the forward in the fused CPU kernel
// (_scaled_dot_product_flash_attention_for_cpu, which returns the lse); the torch CI installs (Debian's 1.13)
// has no fused kernel returning the lse, so there that branch is compiled out and every block runs the
// composed ops. The fused branch was checked by hand against the PyPI wheel's torch 2.15 CPU libraries
// (docs/torch.md), not in CI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/where.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

#include "../model/attention.hpp"
#include "attention_with_lse.hpp"

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#define HETMESH_TORCH_FUSED_ATTENTION 1
#else
#define HETMESH_TORCH_FUSED_ATTENTION 0
#endif

namespace hetmesh::libtorch {

namespace detail {

/// A tensor of shape `sizes` over the elements of `s` (not owned; `s` must hold exactly that many), on
/// `device`. Writes through it write `s`.
template <class T>
at::Tensor over_span(std::span<T> s, at::IntArrayRef sizes, const at::Device& device) {
  using E = std::remove_const_t<T>;
  static_assert(std::is_same_v<E, float> || std::is_same_v<E, double>, "libtorch: float or double elements");
  return at::from_blob(const_cast<E*>(s.data()), sizes,
                       at::TensorOptions().dtype(c10::CppTypeToScalarType<E>::value).device(device));
}

/// True when the fused kernel computes this block exactly as the mask says: one document on both sides,
/// and a full mask, or a causal mask over equal query and key positions (then causal is the diagonal).
template <class T>
bool fusable(const model::attention_block<T>& b) {
  const auto doc = b.q_doc.empty() ? std::int64_t{0} : b.q_doc[0];
  for (auto d : b.q_doc)
    if (d != doc) return false;
  for (auto d : b.k_doc)
    if (d != doc) return false;
  if (b.mask == seq::block_mask::full) return true;
  if (b.q_pos.size() != b.k_pos.size()) return false;
  for (std::size_t i = 0; i < b.q_pos.size(); ++i)
    if (b.q_pos[i] != b.k_pos[i] || (i > 0 && b.q_pos[i] != b.q_pos[i - 1] + 1)) return false;
  return true;
}

/// Sizes of a block (query and key tokens, heads, head size), from its metadata and shape.
struct block_sizes {
  std::size_t nq = 0, nk = 0, hq = 1, hk = 1, dim = 1;
};

/// One span of a call and the elements it must hold.
struct extent {
  const char* name;  ///< the span's name in the message
  std::size_t got;   ///< elements it holds
  std::size_t want;  ///< elements the block needs
};

/// Throws invalid_argument, prefixed by `who`, unless b's shape is valid, its mask full or causal and every
/// span of `extra` (besides the block's own) holds what it must; returns the block's sizes.
template <class T>
block_sizes check_block(const model::attention_block<T>& b, const char* who,
                        std::initializer_list<extent> extra = {}) {
  model::check_attention_shape(b.shape, who);
  if (b.mask == seq::block_mask::none)
    throw_error<invalid_argument>("{}: called with block_mask::none; expected full or causal", who);
  const block_sizes d{b.q_doc.size(), b.k_doc.size(), static_cast<std::size_t>(b.shape.q_heads),
                      static_cast<std::size_t>(b.shape.kv_heads), static_cast<std::size_t>(b.shape.head_dim)};
  const auto q = d.nq * d.hq * d.dim, kv = d.nk * d.hk * d.dim;
  for (const auto& e : {extent{"q_pos", b.q_pos.size(), d.nq}, extent{"k_pos", b.k_pos.size(), d.nk},
                        extent{"q", b.q.size(), q}, extent{"k", b.k.size(), kv}, extent{"v", b.v.size(), kv}})
    if (e.got != e.want)
      throw_error<invalid_argument>(
          "{}: {} holds {} elements; expected {} for {} query and {} key tokens (q_heads={}, kv_heads={}, "
          "head_dim={})",
          who, e.name, e.got, e.want, d.nq, d.nk, d.hq, d.hk, d.dim);
  for (const auto& e : extra)
    if (e.got != e.want)
      throw_error<invalid_argument>("{}: {} holds {} elements; expected {} for {} query and {} key tokens",
                                    who, e.name, e.got, e.want, d.nq, d.nk);
  return d;
}

/// Gradients of one block's inputs (what its backward adds).
struct block_grads {
  at::Tensor dq, dk, dv;  ///< [nq][hq][d], [nk][hk][d], [nk][hk][d]
};

/// The closed-form backward of a dense block (header comment) from the merged lse and delta [nq][hq].
inline block_grads closed_form_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& dout, const at::Tensor& lse,
                                        const at::Tensor& delta, const token_meta& m, seq::block_mask mask,
                                        double scale) {
  const auto nq = q.size(0), hk = k.size(1), g = q.size(1) / hk;
  const double inf = std::numeric_limits<double>::infinity();
  const auto qg = group_queries(q, hk, g), dog = group_queries(dout, hk, g);  // [hk][g nq][d]
  const auto kh = k.permute({1, 0, 2}), vh = v.permute({1, 0, 2});            // [hk][nk][d]
  const auto l = group_queries(lse.unsqueeze(2), hk, g), dl = group_queries(delta.unsqueeze(2), hk, g);
  const auto vis = visibility(m, nq, k.size(0), mask, q.device());
  const auto s = qg.bmm(kh.transpose(1, 2)).mul(scale).masked_fill(vis.logical_not().repeat({g, 1}), -inf);
  const auto p = s.sub(at::where(l.eq(-inf), inf, l)).exp();  // [hk][g nq][nk]; 0 off the mask
  const auto ds = p.mul(dog.bmm(vh.transpose(1, 2)).sub(dl));
  return {ungroup(ds.bmm(kh).mul(scale), nq, g), ds.transpose(1, 2).bmm(qg).mul(scale).permute({1, 0, 2}),
          p.transpose(1, 2).bmm(dog).permute({1, 0, 2})};
}

}  // namespace detail

/// Block attention over torch ops: a model::attention_kernel<block_attention, T> for float and double. The
/// spans of a block are memory of `device` (CPU by default; a CUDA device when the caller's memory policy
/// and communicator are CUDA ones, libtorch::tensor_memory's device variant; untested here, as the
/// installed torch is CPU-only); the per-token metadata is host memory, as model::attention_block says.
/// Stateless apart from the device; forward and backward are const. Deterministic: the same block gives
/// bitwise the same results for a fixed number of torch intra-op threads (no atomics on CPU; on CUDA,
/// torch's matmuls are deterministic with the default cuBLAS workspace settings).
struct block_attention {
  at::Device device{at::kCPU};  ///< where the block's tensors live
  bool fused = true;            ///< use the fused kernel where torch has one and the block allows it

  /// Forward of one block: writes out.out (the block's partial output) and out.lse (natural-log row
  /// log-sum-exp); rows that see no key get lse = -infinity and out = 0 (model::attention_forward_out).
  /// Pre: spans sized as model::attention_block describes (invalid_argument otherwise, before any write);
  /// mask full or causal. Not collective. Cost: O(nq nk q_heads head_dim) time; O(nq nk q_heads) scratch.
  template <class T>
  requires std::is_same_v<T, float> || std::is_same_v<T, double>
  void forward(const model::attention_block<T>& b, model::attention_forward_out<T> out) const {
    const auto d = detail::check_block(
        b, "libtorch::block_attention::forward",
        {{"out", out.out.size(), b.q.size()},
         {"lse", out.lse.size(), b.q_doc.size() * static_cast<std::size_t>(b.shape.q_heads)}});
    const c10::NoGradGuard no_grad;
    const auto nq = static_cast<std::int64_t>(d.nq), nk = static_cast<std::int64_t>(d.nk);
    const auto hq = static_cast<std::int64_t>(d.hq), hk = static_cast<std::int64_t>(d.hk);
    const auto dim = static_cast<std::int64_t>(d.dim);
    const auto q = detail::over_span(b.q, {nq, hq, dim}, device);
    const auto k = detail::over_span(b.k, {nk, hk, dim}, device);
    const auto v = detail::over_span(b.v, {nk, hk, dim}, device);
    auto o = detail::over_span(out.out, {nq, hq, dim}, device);
    auto l = detail::over_span(out.lse, {nq, hq}, device);
#if HETMESH_TORCH_FUSED_ATTENTION
    if (fused && device.is_cpu() && nq > 0 && nk > 0 && detail::fusable(b)) {
      const auto g = hq / hk;  // [1][heads][tokens][dim], KV heads repeated for the query heads
      const auto r = at::_scaled_dot_product_flash_attention_for_cpu(
          q.permute({1, 0, 2}).unsqueeze(0), k.permute({1, 0, 2}).repeat_interleave(g, 0).unsqueeze(0),
          v.permute({1, 0, 2}).repeat_interleave(g, 0).unsqueeze(0), 0.0, b.mask == seq::block_mask::causal,
          std::nullopt, static_cast<double>(b.scale));
      o.copy_(std::get<0>(r).squeeze(0).permute({1, 0, 2}));
      l.copy_(std::get<1>(r).squeeze(0).transpose(0, 1));
      return;
    }
#endif
    const auto r = attention_with_lse(q, k, v, token_meta{b.q_doc, b.q_pos, b.k_doc, b.k_pos}, b.mask,
                                      static_cast<double>(b.scale));
    o.copy_(r.out);
    l.copy_(r.lse);
  }

  /// Backward of one block from the merged lse and delta of its query rows: adds dq, dk and dv (never
  /// clears them) by the closed form in the header comment; rows with lse = -infinity add nothing.
  /// Pre: spans sized as model::attention_block and model::attention_backward_io describe
  /// (invalid_argument otherwise, before any write). Not collective. Cost: O(nq nk q_heads head_dim) time;
  /// O(nq nk q_heads) scratch.
  template <class T>
  requires std::is_same_v<T, float> || std::is_same_v<T, double>
  void backward(const model::attention_block<T>& b, model::attention_backward_io<T> io) const {
    const auto rows = b.q_doc.size() * static_cast<std::size_t>(b.shape.q_heads);
    const auto d = detail::check_block(b, "libtorch::block_attention::backward",
                                       {{"dout", io.dout.size(), b.q.size()},
                                        {"lse", io.lse.size(), rows},
                                        {"delta", io.delta.size(), rows},
                                        {"dq", io.dq.size(), b.q.size()},
                                        {"dk", io.dk.size(), b.k.size()},
                                        {"dv", io.dv.size(), b.k.size()}});
    const c10::NoGradGuard no_grad;
    const auto nq = static_cast<std::int64_t>(d.nq), nk = static_cast<std::int64_t>(d.nk);
    const auto hq = static_cast<std::int64_t>(d.hq), hk = static_cast<std::int64_t>(d.hk);
    const auto dim = static_cast<std::int64_t>(d.dim);
    const auto q = detail::over_span(b.q, {nq, hq, dim}, device),
               dout = detail::over_span(io.dout, {nq, hq, dim}, device);
    const auto k = detail::over_span(b.k, {nk, hk, dim}, device),
               v = detail::over_span(b.v, {nk, hk, dim}, device);
    const auto lse = detail::over_span(io.lse, {nq, hq}, device),
               delta = detail::over_span(io.delta, {nq, hq}, device);
    auto dq = detail::over_span(io.dq, {nq, hq, dim}, device);
    auto dk = detail::over_span(io.dk, {nk, hk, dim}, device),
         dv = detail::over_span(io.dv, {nk, hk, dim}, device);
    const token_meta meta{b.q_doc, b.q_pos, b.k_doc, b.k_pos};
    const auto scale = static_cast<double>(b.scale);
    const auto parts = detail::split_by_document(meta, nq, nk, device);
    if (parts.empty()) {
      const auto r = detail::closed_form_backward(q, k, v, dout, lse, delta, meta, b.mask, scale);
      dq.add_(r.dq), dk.add_(r.dk), dv.add_(r.dv);
      return;
    }
    for (const auto& p : parts) {  // document by document: each row belongs to one, so adds never meet
      const auto r = detail::closed_form_backward(q.index_select(0, p.q_rows), k.index_select(0, p.k_rows),
                                                  v.index_select(0, p.k_rows), dout.index_select(0, p.q_rows),
                                                  lse.index_select(0, p.q_rows),
                                                  delta.index_select(0, p.q_rows), p.meta(), b.mask, scale);
      dq.index_add_(0, p.q_rows, r.dq), dk.index_add_(0, p.k_rows, r.dk), dv.index_add_(0, p.k_rows, r.dv);
    }
  }
};

static_assert(model::attention_kernel<block_attention, float>);
static_assert(model::attention_kernel<block_attention, double>);

}  // namespace hetmesh::libtorch
