// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: a model::attention_kernel (model/attention.hpp) computed with torch ops, for float and
// double. The block's spans are viewed as tensors (no copies of q, k, v or the outputs); the forward is
// libtorch::attention_with_lse (attention_with_lse.hpp) without autograd; the backward is the closed form
// from the merged lse and delta that ring attention hands every block:
//   P = exp(scale q k^T - lse) on visible keys, dS = P * (dout v^T - delta),
//   dv += P^T dout, dq += scale dS k, dk += scale dS^T q,
// batched over KV heads (the query heads of one KV head are stacked, so dk and dv sum over the group in one
// product). With torch >= 2.2, a block of one document whose mask is full, or causal over equal query and
// key positions, runs the forward in the fused CPU kernel (_scaled_dot_product_flash_attention_for_cpu,
// which returns the lse); the installed torch here is 1.13, which has no fused kernel returning the lse, so
// that branch is compiled out and untested here, and every block runs the composed ops.
#pragma once

#include <cstdint>
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

/// Sizes of a block (query and key tokens, heads, head size), checked against its spans.
struct block_sizes {
  std::size_t nq = 0, nk = 0, hq = 1, hk = 1, dim = 1;
};

/// Throws invalid_argument, prefixed by `who`, unless b's shape is valid, its mask full or causal and its
/// spans sized as model::attention_block describes.
template <class T>
block_sizes check_block(const model::attention_block<T>& b, const char* who) {
  model::check_attention_shape(b.shape, who);
  if (b.mask == seq::block_mask::none)
    throw_error<invalid_argument>("{}: called with block_mask::none; expected full or causal", who);
  block_sizes d{b.q_doc.size(), b.k_doc.size(), static_cast<std::size_t>(b.shape.q_heads),
                static_cast<std::size_t>(b.shape.kv_heads), static_cast<std::size_t>(b.shape.head_dim)};
  if (b.q_pos.size() != d.nq || b.k_pos.size() != d.nk || b.q.size() != d.nq * d.hq * d.dim ||
      b.k.size() != d.nk * d.hk * d.dim || b.v.size() != b.k.size())
    throw_error<invalid_argument>(
        "{}: {} query tokens ({} positions, q of {} elements), {} key tokens ({} positions, k of {}, v of {} "
        "elements) for q_heads={}, kv_heads={}, head_dim={}; expected q = tokens*q_heads*head_dim and k, v "
        "= tokens*kv_heads*head_dim",
        who, d.nq, b.q_pos.size(), b.q.size(), d.nk, b.k_pos.size(), b.k.size(), b.v.size(), d.hq, d.hk,
        d.dim);
  return d;
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
    const auto d = detail::check_block(b, "libtorch::block_attention::forward");
    if (out.out.size() != b.q.size() || out.lse.size() != d.nq * d.hq)
      throw_error<invalid_argument>(
          "libtorch::block_attention::forward: out of {} and lse of {} elements for {} query tokens; "
          "expected "
          "{} and {}",
          out.out.size(), out.lse.size(), d.nq, b.q.size(), d.nq * d.hq);
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
    const auto d = detail::check_block(b, "libtorch::block_attention::backward");
    if (io.dout.size() != b.q.size() || io.dq.size() != b.q.size() || io.lse.size() != d.nq * d.hq ||
        io.delta.size() != d.nq * d.hq || io.dk.size() != b.k.size() || io.dv.size() != b.k.size())
      throw_error<invalid_argument>(
          "libtorch::block_attention::backward: dout {}, dq {}, lse {}, delta {}, dk {}, dv {} elements; "
          "expected dout and dq {}, lse and delta {}, dk and dv {}",
          io.dout.size(), io.dq.size(), io.lse.size(), io.delta.size(), io.dk.size(), io.dv.size(),
          b.q.size(), d.nq * d.hq, b.k.size());
    const c10::NoGradGuard no_grad;
    const auto nq = static_cast<std::int64_t>(d.nq), nk = static_cast<std::int64_t>(d.nk);
    const auto hq = static_cast<std::int64_t>(d.hq), hk = static_cast<std::int64_t>(d.hk);
    const auto dim = static_cast<std::int64_t>(d.dim), g = hq / hk;
    const double scale = static_cast<double>(b.scale), inf = std::numeric_limits<double>::infinity();
    const auto qg = detail::group_queries(detail::over_span(b.q, {nq, hq, dim}, device), hk, g);
    const auto dog = detail::group_queries(detail::over_span(io.dout, {nq, hq, dim}, device), hk, g);
    const auto kh = detail::over_span(b.k, {nk, hk, dim}, device).permute({1, 0, 2});  // [hk][nk][d]
    const auto vh = detail::over_span(b.v, {nk, hk, dim}, device).permute({1, 0, 2});
    const auto lse = detail::group_queries(detail::over_span(io.lse, {nq, hq, 1}, device), hk, g);
    const auto delta = detail::group_queries(detail::over_span(io.delta, {nq, hq, 1}, device), hk, g);
    const auto vis =
        detail::visibility(token_meta{b.q_doc, b.q_pos, b.k_doc, b.k_pos}, nq, nk, b.mask, device);
    const auto s = qg.bmm(kh.transpose(1, 2)).mul(scale).masked_fill(vis.logical_not().repeat({g, 1}), -inf);
    const auto p = s.sub(at::where(lse.eq(-inf), inf, lse)).exp();  // [hk][g nq][nk]; 0 off the mask
    const auto ds = p.mul(dog.bmm(vh.transpose(1, 2)).sub(delta));
    detail::over_span(io.dv, {nk, hk, dim}, device).add_(p.transpose(1, 2).bmm(dog).permute({1, 0, 2}));
    detail::over_span(io.dk, {nk, hk, dim}, device)
        .add_(ds.transpose(1, 2).bmm(qg).mul(scale).permute({1, 0, 2}));
    detail::over_span(io.dq, {nq, hq, dim}, device).add_(detail::ungroup(ds.bmm(kh).mul(scale), nq, g));
  }
};

static_assert(model::attention_kernel<block_attention, float>);
static_assert(model::attention_kernel<block_attention, double>);

}  // namespace hetmesh::libtorch
