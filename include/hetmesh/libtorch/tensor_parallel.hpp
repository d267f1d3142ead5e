// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: run::'s tensor-parallel regions (run/tp_regions.hpp) and the vocabulary-parallel
// cross-entropy (run/tp_vocab.hpp) as autograd functions on torch tensors, so a torch module splits its
// layers over the tp group of its stage context (ctx.tp) as Megatron-LM does:
//
//   function                      forward                           backward
//   copy_to_tp(c, x)              identity                          all-reduce (sum) of the gradient
//   reduce_from_tp(c, x)          all-reduce (sum)                  identity
//   gather_from_tp(c, x)          all-gather along the last dim     this rank's columns
//   scatter_to_tp(c, x)           this rank's columns               all-gather along the last dim
//   gather_from_sp(c, x)          all-gather along dim 0 (tokens)   reduce-scatter along dim 0
//   reduce_scatter_to_sp(c, x)    reduce-scatter along dim 0        all-gather along dim 0
//   vocab_parallel_cross_entropy  per-token loss over the whole     scale (softmax - one-hot), this
//                                 vocabulary from this rank's       rank's columns, times the loss
//                                 logit columns                     gradient
//
// A column-parallel linear is copy_to_tp then a local linear over this rank's output columns; a
// row-parallel one is a local linear over this rank's input columns then reduce_from_tp. Every function is
// collective over `c` in forward or backward as the table says (every member calls the same function on
// tensors of the same shape, in the same order as its other collectives on `c`), and its backward runs
// collectives too: every rank must run its backward through them in the same order (one autograd backward
// per rank, as one loopback thread or one process). The communicator is held by pointer until backward has
// run: it must outlive the graph. Tensors: float or double, contiguous or not (made contiguous), on the
// communicator's memory (CPU for host communicators, CUDA for device ones; the CUDA path is untested here).
// The EP exchange (run/moe.hpp) as moe_dispatch / moe_combine: the tokens' rows to this rank's experts and
// the experts' gated outputs back, over ctx.ep, with the plan of run::moe_plan.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include "../comm/collectives.hpp"
#include "../run/moe.hpp"
#include "../run/tp_regions.hpp"
#include "../run/tp_vocab.hpp"
#include "tensor_memory.hpp"

namespace hetmesh::libtorch {

/// The memory policy of communicator C's buffers: tensor_memory for host communicators, cuda_tensor_memory
/// for device ones.
template <class C>
using tensor_memory_for = std::conditional_t<std::remove_cvref_t<C>::memory == memory_space::host,
                                             tensor_memory, cuda_tensor_memory>;

namespace detail {

/// Runs f(T{}) with T the element type of `t` (float or double; invalid_argument otherwise).
template <class F>
decltype(auto) by_dtype(const at::Tensor& t, const char* who, F&& f) {
  if (t.scalar_type() == at::kFloat) return f(float{});
  if (t.scalar_type() == at::kDouble) return f(double{});
  throw_error<invalid_argument>("libtorch::{}: a tensor of {}; expected float or double", who,
                                std::string(c10::toString(t.scalar_type())));
}

/// The elements of contiguous `t` as a span of T.
template <class T>
std::span<T> elements(const at::Tensor& t) {
  return {t.data_ptr<T>(), static_cast<std::size_t>(t.numel())};
}

/// Stores and recovers the communicator of an autograd node (by address; it must outlive the graph).
template <class C>
void keep_comm(torch::autograd::AutogradContext* ctx, C& c) {
  ctx->saved_data["hetmesh_comm"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&c));
}
template <class C>
C& comm_of(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<C*>(static_cast<std::intptr_t>(ctx->saved_data["hetmesh_comm"].toInt()));
}

/// x (any shape) all-reduced (sum) over c, as a new contiguous tensor.
template <class C>
at::Tensor all_reduced(C& c, const at::Tensor& x, const char* who) {
  auto y = x.contiguous().clone();
  by_dtype(y, who, [&](auto t) { comm::all_reduce(c, elements<decltype(t)>(y), comm::reduce_op::sum); });
  return y;
}

/// The regions along the last dim (columns) or dim 0 (tokens), by direction.
enum class region { gather_columns, split_columns, gather_tokens, reduce_scatter_tokens };

/// Applies `r` to x over c: the output shape follows from x's and the tp size.
template <class C>
at::Tensor apply_region(C& c, const at::Tensor& x, region r, const char* who) {
  const auto in = x.contiguous();
  const int tp = c.size();
  if (in.dim() < 1)
    throw_error<invalid_argument>("libtorch::{}: a 0-dim tensor; expected at least one dim", who);
  const auto last = in.size(-1), rows = last == 0 ? 0 : in.numel() / last;
  auto sizes = in.sizes().vec();
  const bool columns = r == region::gather_columns || r == region::split_columns;
  const bool grow = r == region::gather_columns || r == region::gather_tokens;
  auto& dim = columns ? sizes.back() : sizes.front();
  if (!grow && dim % tp != 0)
    throw_error<invalid_argument>(
        "libtorch::{}: the split dim is {}, not divisible by the tensor-parallel size {}", who, dim, tp);
  dim = grow ? dim * tp : dim / tp;
  auto out = at::empty(sizes, in.options());
  const tensor_memory_for<C> mem;
  by_dtype(in, who, [&](auto t) {
    using T = decltype(t);
    const std::span<const T> src = elements<T>(in);
    const auto dst = elements<T>(out);
    const auto full_cols = columns ? (grow ? last * tp : last) : last;
    const auto full_rows = columns ? rows : (grow ? rows * tp : rows);
    switch (r) {
      case region::gather_columns:
        run::gather_from_tp_forward(c, src, dst, full_rows, full_cols, mem);
        break;
      case region::split_columns:
        run::scatter_to_tp_forward(c, src, dst, full_rows, full_cols, mem);
        break;
      case region::gather_tokens:
        run::gather_from_sp_forward(c, src, dst, full_rows, full_cols, mem);
        break;
      case region::reduce_scatter_tokens:
        run::reduce_scatter_to_sp_forward(c, src, dst, full_rows, full_cols, mem);
        break;
    }
  });
  return out;
}

/// An autograd function whose forward is region F and backward region B (identity and all-reduce are
/// written out in copy_to_tp and reduce_from_tp).
template <class C, region F, region B>
struct region_function : torch::autograd::Function<region_function<C, F, B>> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, C* c) {
    keep_comm(ctx, *c);
    return apply_region(*c, x, F, "tensor-parallel region forward");
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {apply_region(comm_of<C>(ctx), g[0], B, "tensor-parallel region backward"), at::Tensor()};
  }
};

template <class C>
struct copy_to_tp_function : torch::autograd::Function<copy_to_tp_function<C>> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, C* c) {
    keep_comm(ctx, *c);
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {all_reduced(comm_of<C>(ctx), g[0], "copy_to_tp backward"), at::Tensor()};
  }
};

template <class C>
struct reduce_from_tp_function : torch::autograd::Function<reduce_from_tp_function<C>> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x, C* c) {
    return all_reduced(*c, x, "reduce_from_tp");
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    return {g[0], at::Tensor()};
  }
};

template <class C>
struct vocab_cross_entropy_function : torch::autograd::Function<vocab_cross_entropy_function<C>> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, C* c,
                            std::int64_t vocab, std::span<const std::int64_t> targets,
                            std::span<const double> weights, std::int64_t step_targets) {
    const auto in = logits.contiguous();
    const tensor_memory_for<C> mem;
    at::Tensor loss = at::empty({static_cast<std::int64_t>(targets.size())}, in.options());
    by_dtype(in, "vocab_parallel_cross_entropy", [&](auto t) {
      using T = decltype(t);
      run::vocab_cross_entropy_state<T, tensor_memory_for<C>> state;
      if (in.is_cpu()) {
        run::vocab_parallel_cross_entropy_forward(*c, vocab, std::span<const T>(elements<T>(in)), targets,
                                                  weights, step_targets, elements<T>(loss), state, mem);
      } else {  // the loss is host memory in run::'s contract
        std::vector<T> host(targets.size());
        run::vocab_parallel_cross_entropy_forward(*c, vocab, std::span<const T>(elements<T>(in)), targets,
                                                  weights, step_targets, std::span<T>(host), state, mem);
        mem.upload(elements<T>(loss), std::span<const T>(host));
      }
      ctx->saved_data["lse"] = state.lse.tensor();
      ctx->saved_data["target"] = state.local_target.tensor();
      ctx->saved_data["scale"] = state.scale.tensor();
    });
    ctx->save_for_backward({in});
    return loss;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const auto logits = ctx->get_saved_variables()[0];
    const auto target = ctx->saved_data["target"].toTensor();
    const auto seen = target.ge(0);  // rows whose target column this rank holds
    auto d = logits.sub(ctx->saved_data["lse"].toTensor().unsqueeze(1)).exp();
    d.scatter_add_(1, target.clamp_min(0).unsqueeze(1), seen.to(d.scalar_type()).neg().unsqueeze(1));
    d.mul_(ctx->saved_data["scale"].toTensor().mul(g[0]).unsqueeze(1));
    return {d, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// Stores and recovers the MoE plan of an autograd node (by address; it must outlive the graph).
inline void keep_plan(torch::autograd::AutogradContext* ctx, const seq::moe_dispatch_plan& p) {
  ctx->saved_data["hetmesh_plan"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&p));
}
inline const seq::moe_dispatch_plan& plan_of(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<const seq::moe_dispatch_plan*>(
      static_cast<std::intptr_t>(ctx->saved_data["hetmesh_plan"].toInt()));
}

template <class C>
struct moe_dispatch_function : torch::autograd::Function<moe_dispatch_function<C>> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, C* c,
                            const seq::moe_dispatch_plan* plan) {
    keep_comm(ctx, *c);
    keep_plan(ctx, *plan);
    const auto in = x.contiguous();
    auto out = at::empty({plan->expert_rows(), in.size(-1)}, in.options());
    by_dtype(in, "moe_dispatch", [&](auto t) {
      using T = decltype(t);
      run::moe_dispatch_forward(*c, *plan, in.size(-1), std::span<const T>(elements<T>(in)), elements<T>(out),
                                tensor_memory_for<C>{});
    });
    ctx->saved_data["sizes"] = in.sizes().vec();
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const auto d = g[0].contiguous();
    auto dx = at::empty(ctx->saved_data["sizes"].toIntVector(), d.options());
    by_dtype(d, "moe_dispatch backward", [&](auto t) {
      using T = decltype(t);
      run::moe_dispatch_backward(comm_of<C>(ctx), plan_of(ctx), d.size(-1),
                                 std::span<const T>(elements<T>(d)), elements<T>(dx), tensor_memory_for<C>{});
    });
    return {dx, at::Tensor(), at::Tensor()};
  }
};

template <class C>
struct moe_combine_function : torch::autograd::Function<moe_combine_function<C>> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& expert_out,
                            const at::Tensor& gates, C* c, const seq::moe_dispatch_plan* plan) {
    keep_comm(ctx, *c);
    keep_plan(ctx, *plan);
    const auto eo = expert_out.contiguous(), gt = gates.contiguous();
    const auto w = eo.size(-1), choices = static_cast<std::int64_t>(plan->row_of_choice.size());
    auto routed = at::empty({choices, w}, eo.options()), y = at::empty({plan->tokens, w}, eo.options());
    by_dtype(eo, "moe_combine", [&](auto t) {
      using T = decltype(t);
      run::moe_combine_forward(*c, *plan, w, std::span<const T>(elements<T>(eo)),
                               std::span<const T>(elements<T>(gt)), elements<T>(routed), elements<T>(y),
                               tensor_memory_for<C>{});
    });
    ctx->save_for_backward({gt, routed});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const auto saved = ctx->get_saved_variables();
    const auto dy = g[0].contiguous();
    const auto& plan = plan_of(ctx);
    auto d_out = at::empty({plan.expert_rows(), dy.size(-1)}, dy.options()),
         d_gates = at::empty_like(saved[0]);
    by_dtype(dy, "moe_combine backward", [&](auto t) {
      using T = decltype(t);
      run::moe_combine_backward(comm_of<C>(ctx), plan, dy.size(-1), std::span<const T>(elements<T>(dy)),
                                std::span<const T>(elements<T>(saved[0])),
                                std::span<const T>(elements<T>(saved[1])), elements<T>(d_out),
                                elements<T>(d_gates), tensor_memory_for<C>{});
    });
    return {d_out, d_gates, at::Tensor(), at::Tensor()};
  }
};

}  // namespace detail

/// The EP exchange's dispatch (run::moe_dispatch_forward as an autograd function): x [plan.tokens][width]
/// -> the rows of this rank's experts [plan.expert_rows()][width], grouped by local expert as the plan
/// says (plan.expert_counts). Backward: run::moe_dispatch_backward (each token's gradient summed over its
/// kept choices). `plan` is this step's run::moe_plan over `ep`; it and `ep` must outlive the graph.
/// Collective over ep both ways.
template <comm::communicator C>
at::Tensor moe_dispatch(C& ep, const seq::moe_dispatch_plan& plan, const at::Tensor& x) {
  return detail::moe_dispatch_function<C>::apply(x, &ep, &plan);
}

/// The EP exchange's combine (run::moe_combine_forward as an autograd function): the experts' outputs
/// [plan.expert_rows()][width] (laid out as moe_dispatch left their inputs) and `gates` [plan.tokens *
/// top_k] -> y [plan.tokens][width], y[t] = sum over t's kept choices c of gates[c] * output of c.
/// Differentiable in both (run::moe_combine_backward). Collective over ep both ways; `plan` and `ep` must
/// outlive the graph.
template <comm::communicator C>
at::Tensor moe_combine(C& ep, const seq::moe_dispatch_plan& plan, const at::Tensor& expert_out,
                       const at::Tensor& gates) {
  return detail::moe_combine_function<C>::apply(expert_out, gates, &ep, &plan);
}

/// Vocabulary-parallel cross-entropy (run::vocab_parallel_cross_entropy_forward as an autograd function):
/// `logits` is this rank's [tokens][vocab / tp] columns (rank j holds columns [j vocab/tp, (j+1) vocab/tp));
/// `targets` and `weights` (host, one per token, equal on every tp rank) the next tokens and their loss
/// weights. Returns loss [tokens], equal on every rank: weights[t] (log sum over the whole vocabulary of
/// exp(logits[t]) - logits[t][targets[t]]) / step_targets (0 where the weight is 0). Backward: this rank's
/// columns of scale (softmax - one-hot of the target), times the loss gradient (local). Pre: vocab
/// divisible by tp, targets in [0, vocab) where weighted, step_targets >= 1 (invalid_argument otherwise).
/// Collective in forward (three all-reduces of [tokens]). The host spans are read during the call only.
template <comm::communicator C>
at::Tensor vocab_parallel_cross_entropy(C& c, const at::Tensor& logits, std::int64_t vocab,
                                        std::span<const std::int64_t> targets,
                                        std::span<const double> weights, std::int64_t step_targets) {
  return detail::vocab_cross_entropy_function<C>::apply(logits, &c, vocab, targets, weights, step_targets);
}

/// Enters a tensor-parallel region (before a column-parallel layer): forward returns x as it is (every tp
/// rank holds the same x); backward all-reduces (sums) the input gradient over c. Collective in backward.
template <comm::communicator C>
at::Tensor copy_to_tp(C& c, const at::Tensor& x) {
  return detail::copy_to_tp_function<C>::apply(x, &c);
}

/// Leaves a tensor-parallel region (after a row-parallel layer): forward returns the sum over c of every
/// rank's partial x (a new tensor); backward passes the gradient through. Collective in forward.
template <comm::communicator C>
at::Tensor reduce_from_tp(C& c, const at::Tensor& x) {
  return detail::reduce_from_tp_function<C>::apply(x, &c);
}

/// Every rank's x [..., n] concatenated along the last dim in rank order: [..., n * tp]. Backward: this
/// rank's columns of the gradient (local). Collective in forward.
template <comm::communicator C>
at::Tensor gather_from_tp(C& c, const at::Tensor& x) {
  using R = detail::region;
  return detail::region_function<C, R::gather_columns, R::split_columns>::apply(x, &c);
}

/// This rank's block of columns of x [..., n] (equal on every rank): [..., n / tp] (n divisible by tp;
/// invalid_argument otherwise). Backward: the gradients' blocks gathered. Collective in backward.
template <comm::communicator C>
at::Tensor scatter_to_tp(C& c, const at::Tensor& x) {
  using R = detail::region;
  return detail::region_function<C, R::split_columns, R::gather_columns>::apply(x, &c);
}

/// Sequence parallelism, before a column-parallel layer: every rank's x [t, ...] concatenated along dim 0
/// in rank order: [t * tp, ...]. Backward: reduce-scatter (sum) of the gradient along dim 0. Collective
/// both ways.
template <comm::communicator C>
at::Tensor gather_from_sp(C& c, const at::Tensor& x) {
  using R = detail::region;
  return detail::region_function<C, R::gather_tokens, R::reduce_scatter_tokens>::apply(x, &c);
}

/// Sequence parallelism, after a row-parallel layer: this rank's rows of the sum over c of every rank's x
/// [t, ...]: [t / tp, ...] (t divisible by tp). Backward: the gradients gathered along dim 0. Collective
/// both ways.
template <comm::communicator C>
at::Tensor reduce_scatter_to_sp(C& c, const at::Tensor& x) {
  using R = detail::region;
  return detail::region_function<C, R::reduce_scatter_tokens, R::gather_tokens>::apply(x, &c);
}

}  // namespace hetmesh::libtorch
