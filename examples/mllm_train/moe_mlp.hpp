// SPDX-License-Identifier: Apache-2.0
// The example's mixture-of-experts MLP (the last backbone block's MLP when config::moe_experts > 0), as a
// user writes one over hetmesh's MoE pieces (docs/moe.md): a router (a [D][E] linear map and a softmax,
// replicated on every rank), top-k routing with the chosen probabilities as gates, dropless dispatch of each
// token's rows to the experts' ranks over ctx.ep (run::moe_plan, moe_dispatch_forward; one all_to_all_v),
// SiLU expert MLPs, and the gated combine back (moe_combine_forward). Experts are spread over ep as Megatron
// spreads them (ep rank r holds experts [r E/ep, (r+1) E/ep)), and each expert's weights are split over tp
// (expert tp = tp, Megatron's default): up [D][hidden] by columns, down [hidden][D] by rows, the expert
// outputs and the expert inputs' gradients all-reduced over ctx.tp. With ep = 1 (ctx.ep null) the same plan
// is made locally and the rows move by copies. Dropless routing keeps every token's output independent of
// the other tokens, so any split of the batch gives the 1-rank model's numbers (the parity checks); the
// load-balancing loss (run::moe_aux_loss) is left out for the same reason.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/run/moe.hpp>
#include <hetmesh/seq/moe_dispatch.hpp>

#include "mllm_train/layers.hpp"

namespace mllm {

/// The MoE MLP of one backbone block on one rank: sizes, where its tensors sit in the backbone's store,
/// and what each micro-batch's forward keeps for its backward. Tensor ids: `router` [D][E] (replicated),
/// expert e's up `expert_id(e)` [D][hidden / tp] and down `expert_id(e) + 1` [hidden / tp][D].
template <class T>
class moe_mlp {
 public:
  /// First expert tensor id (expert e: 2e and 2e + 1 after it).
  static constexpr int first_expert_id = 8000;
  /// Tensor id of expert e's up projection (its down projection is the next id).
  [[nodiscard]] static constexpr int expert_id(std::int64_t e) noexcept {
    return first_expert_id + 2 * static_cast<int>(e);
  }

  moe_mlp() = default;
  /// The layer of `c` on a rank at tp place (tp_rank, tp) and ep place (ep_rank, ep), router tensor `router`.
  moe_mlp(const config& c, int router, int tp_rank, int tp, int ep_rank, int ep)
      : d_(static_cast<std::size_t>(c.width)),
        f_(static_cast<std::size_t>(c.moe_hidden / tp)),
        layout_{.experts = c.moe_experts, .ep = ep, .top_k = c.moe_top_k},
        router_(router),
        tp_rank_(tp_rank),
        tp_(tp),
        ep_rank_(ep_rank) {
    layout_.validate();
  }

  /// The experts this rank holds: [first, first + count).
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> local_experts() const noexcept {
    return {layout_.first_expert(ep_rank_), layout_.local_experts()};
  }
  /// Adds the router and this rank's experts (their tp blocks) to `s`, values from `seed`. O(parameters).
  void add_tensors(tensor_store<T>& s, std::uint64_t seed) const {
    const auto e = static_cast<std::size_t>(layout_.experts), full = f_ * static_cast<std::size_t>(tp_);
    s.add(router_, d_ * e, seed, 1.0 / std::sqrt(static_cast<double>(d_)));
    const auto [first, count] = local_experts();
    for (auto x = first; x < first + count; ++x) {
      const std::size_t col0 = static_cast<std::size_t>(tp_rank_) * f_;
      s.add_block(expert_id(x), d_ * f_, seed, 1.0 / std::sqrt(static_cast<double>(d_)), 0.0,
                  [&](std::size_t i) { return (i / f_) * full + col0 + i % f_; });
      s.add_block(expert_id(x) + 1, f_ * d_, seed, 1.0 / std::sqrt(static_cast<double>(full)), 0.0,
                  [&](std::size_t i) { return col0 * d_ + i; });
    }
  }

  /// y [n][D] = the layer on xn [n][D]. Collective over ctx.ep (the plan's all-gather, two all_to_all_v)
  /// and ctx.tp (one all-reduce), in schedule order. Keeps what the backward needs until backward_weight.
  template <class Ctx>
  void forward(const Ctx& ctx, const tensor_store<T>& s, std::span<const T> xn, std::span<T> y) {
    auto& m = saved_[{ctx.stage, ctx.micro_batch}];
    const std::size_t n = xn.size() / d_, k = static_cast<std::size_t>(layout_.top_k),
                      ne = static_cast<std::size_t>(layout_.experts);
    m.xn.assign(xn.begin(), xn.end());
    m.probs.assign(n * ne, T(0));
    matmul<T>(xn, s.p(router_), m.probs, n, d_, ne);
    m.experts.assign(n * k, 0);
    m.gates.assign(n * k, T(0));
    for (std::size_t t = 0; t < n; ++t) {
      auto row = std::span<T>(m.probs).subspan(t * ne, ne);
      const T mx = *std::max_element(row.begin(), row.end());
      T sum = 0;
      for (auto& z : row) sum += (z = std::exp(z - mx));
      for (auto& z : row) z /= sum;
      std::vector<std::int64_t> order(ne);
      for (std::size_t e = 0; e < ne; ++e) order[e] = static_cast<std::int64_t>(e);
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) {
        return row[static_cast<std::size_t>(a)] > row[static_cast<std::size_t>(b)];
      });
      for (std::size_t j = 0; j < k; ++j) {
        m.experts[t * k + j] = order[j];
        m.gates[t * k + j] = row[static_cast<std::size_t>(order[j])];
      }
    }
    const std::span<const std::int64_t> ex(m.experts);
    if (ctx.ep != nullptr)
      m.plan = hetmesh::run::moe_plan(*ctx.ep, layout_, {}, ex, std::span<const T>(m.gates), mem_);
    else
      m.plan = hetmesh::seq::make_moe_dispatch_plan(layout_, {}, 0, ex, {},
                                                    hetmesh::seq::moe_expert_counts(layout_, ex));
    const auto rows = static_cast<std::size_t>(m.plan.expert_rows());
    m.expert_in.assign(rows * d_, T(0));
    if (ctx.ep != nullptr)
      hetmesh::run::moe_dispatch_forward(*ctx.ep, m.plan, width(), xn, std::span<T>(m.expert_in), mem_);
    else
      for (std::size_t i = 0; i < rows; ++i)
        std::copy_n(xn.begin() + static_cast<std::ptrdiff_t>(m.plan.send_order[i] / layout_.top_k * width()),
                    d_, m.expert_in.begin() + static_cast<std::ptrdiff_t>(i * d_));
    std::vector<T> out(rows * d_, T(0));
    m.u.assign(rows * f_, T(0));
    for_each_expert(m.plan, [&](std::int64_t e, std::size_t r0, std::size_t cnt) {
      std::vector<T> act(cnt * f_);
      auto u = std::span<T>(m.u).subspan(r0 * f_, cnt * f_);
      matmul<T>(std::span<const T>(m.expert_in).subspan(r0 * d_, cnt * d_), s.p(expert_id(e)), u, cnt, d_,
                f_);
      silu_forward<T>(u, act);
      matmul<T>(act, s.p(expert_id(e) + 1), std::span<T>(out).subspan(r0 * d_, cnt * d_), cnt, f_, d_);
    });
    if (ctx.tp != nullptr)
      hetmesh::comm::all_reduce(*ctx.tp, std::span<T>(out), hetmesh::comm::reduce_op::sum);
    m.routed.assign(n * k * d_, T(0));
    if (ctx.ep != nullptr) {
      hetmesh::run::moe_combine_forward(*ctx.ep, m.plan, width(), std::span<const T>(out),
                                        std::span<const T>(m.gates), std::span<T>(m.routed), y, mem_);
      return;
    }
    std::fill(y.begin(), y.end(), T(0));
    for (std::size_t c = 0; c < n * k; ++c) {
      const auto row = static_cast<std::size_t>(m.plan.row_of_choice[c]);
      for (std::size_t i = 0; i < d_; ++i) {
        m.routed[c * d_ + i] = out[row * d_ + i];
        y[c / k * d_ + i] += m.gates[c] * m.routed[c * d_ + i];
      }
    }
  }

  /// dxn [n][D] (overwritten) = the input gradient for the output gradient dy [n][D]; keeps the output
  /// gradients the weight gradients need. Collective over ctx.ep and ctx.tp, in schedule order.
  template <class Ctx>
  void backward_input(const Ctx& ctx, const tensor_store<T>& s, std::span<const T> dy, std::span<T> dxn) {
    auto& m = saved_.at({ctx.stage, ctx.micro_batch});
    const std::size_t k = static_cast<std::size_t>(layout_.top_k),
                      ne = static_cast<std::size_t>(layout_.experts), n = m.xn.size() / d_,
                      rows = m.expert_in.size() / d_;
    std::vector<T> d_gates(n * k, T(0));
    m.d_out.assign(rows * d_, T(0));
    if (ctx.ep != nullptr) {
      hetmesh::run::moe_combine_backward(*ctx.ep, m.plan, width(), dy, std::span<const T>(m.gates),
                                         std::span<const T>(m.routed), std::span<T>(m.d_out),
                                         std::span<T>(d_gates), mem_);
    } else {
      for (std::size_t c = 0; c < n * k; ++c) {
        const auto row = static_cast<std::size_t>(m.plan.row_of_choice[c]);
        for (std::size_t i = 0; i < d_; ++i) {
          d_gates[c] += dy[c / k * d_ + i] * m.routed[c * d_ + i];
          m.d_out[row * d_ + i] = m.gates[c] * dy[c / k * d_ + i];
        }
      }
    }
    std::vector<T> d_in(rows * d_, T(0));
    m.du.assign(rows * f_, T(0));
    for_each_expert(m.plan, [&](std::int64_t e, std::size_t r0, std::size_t cnt) {
      std::vector<T> dact(cnt * f_, T(0));
      add_dy_wt<T>(std::span<const T>(m.d_out).subspan(r0 * d_, cnt * d_), s.p(expert_id(e) + 1), dact, cnt,
                   f_, d_);
      auto du = std::span<T>(m.du).subspan(r0 * f_, cnt * f_);
      silu_backward<T>(std::span<const T>(m.u).subspan(r0 * f_, cnt * f_), dact, du);
      add_dy_wt<T>(du, s.p(expert_id(e)), std::span<T>(d_in).subspan(r0 * d_, cnt * d_), cnt, d_, f_);
    });
    if (ctx.tp != nullptr)
      hetmesh::comm::all_reduce(*ctx.tp, std::span<T>(d_in), hetmesh::comm::reduce_op::sum);
    if (ctx.ep != nullptr) {
      hetmesh::run::moe_dispatch_backward(*ctx.ep, m.plan, width(), std::span<const T>(d_in), dxn, mem_);
    } else {
      std::fill(dxn.begin(), dxn.end(), T(0));
      for (std::size_t c = 0; c < n * k; ++c)
        for (std::size_t i = 0; i < d_; ++i)
          dxn[c / k * d_ + i] += d_in[static_cast<std::size_t>(m.plan.row_of_choice[c]) * d_ + i];
    }
    // The router: the gates are the chosen probabilities; softmax backward, then the linear map's.
    m.dlogits.assign(n * ne, T(0));
    for (std::size_t t = 0; t < n; ++t) {
      std::vector<T> dp(ne, T(0));
      for (std::size_t j = 0; j < k; ++j)
        dp[static_cast<std::size_t>(m.experts[t * k + j])] += d_gates[t * k + j];
      T dot = 0;
      for (std::size_t e = 0; e < ne; ++e) dot += m.probs[t * ne + e] * dp[e];
      for (std::size_t e = 0; e < ne; ++e) m.dlogits[t * ne + e] = m.probs[t * ne + e] * (dp[e] - dot);
    }
    add_dy_wt<T>(m.dlogits, s.p(router_), dxn, n, d_, ne);
  }

  /// Adds the router's and this rank's experts' weight gradients into `s`; releases the micro-batch's
  /// state. Local.
  template <class Ctx>
  void backward_weight(const Ctx& ctx, tensor_store<T>& s) {
    const auto it = saved_.find({ctx.stage, ctx.micro_batch});
    auto& m = it->second;
    const std::size_t ne = static_cast<std::size_t>(layout_.experts), n = m.xn.size() / d_;
    add_xt_dy<T>(m.xn, m.dlogits, s.g(router_), n, d_, ne);
    for_each_expert(m.plan, [&](std::int64_t e, std::size_t r0, std::size_t cnt) {
      std::vector<T> act(cnt * f_);
      silu_forward<T>(std::span<const T>(m.u).subspan(r0 * f_, cnt * f_), act);
      add_xt_dy<T>(act, std::span<const T>(m.d_out).subspan(r0 * d_, cnt * d_), s.g(expert_id(e) + 1), cnt,
                   f_, d_);
      add_xt_dy<T>(std::span<const T>(m.expert_in).subspan(r0 * d_, cnt * d_),
                   std::span<const T>(m.du).subspan(r0 * f_, cnt * f_), s.g(expert_id(e)), cnt, d_, f_);
    });
    saved_.erase(it);
  }

 private:
  struct saved {
    hetmesh::seq::moe_dispatch_plan plan;
    std::vector<std::int64_t> experts;
    std::vector<T> xn, probs, gates, expert_in, u, routed, d_out, du, dlogits;
  };
  [[nodiscard]] std::int64_t width() const noexcept { return static_cast<std::int64_t>(d_); }
  /// f(global expert, first row, rows) over this rank's experts, in the plan's expert-major layout.
  template <class F>
  void for_each_expert(const hetmesh::seq::moe_dispatch_plan& p, F&& f) const {
    std::size_t r0 = 0;
    for (std::size_t j = 0; j < p.expert_counts.size(); ++j) {
      const auto cnt = static_cast<std::size_t>(p.expert_counts[j]);
      if (cnt > 0) f(local_experts().first + static_cast<std::int64_t>(j), r0, cnt);
      r0 += cnt;
    }
  }

  std::size_t d_ = 0, f_ = 0;  // width; this rank's columns of each expert's hidden layer
  hetmesh::seq::moe_layout layout_{};
  int router_ = 0, tp_rank_ = 0, tp_ = 1, ep_rank_ = 0;
  hetmesh::model::host_memory mem_{};
  std::map<std::pair<int, int>, saved> saved_;  // by (stage, micro-batch)
};

}  // namespace mllm
