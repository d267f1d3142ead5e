// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: column- and row-parallel linear layers, forward and backward, over the tp group's
// communicator, with the regions of run/tp_regions.hpp placed as Megatron-LM places them. The layer computes
// y = x W with x [tokens][in], W [in][out] (row-major; no bias: a column layer's bias is split like its
// output columns and added by the caller to its local output, a row layer's bias is added after the
// reduction). The GEMMs are the caller's: a `gemm` callable (run::tp_gemm) that runs where the buffers live;
// run::host_gemm is the plain host default.
//
//   column-parallel: W split by output columns, rank j holds W[:, j out/tp .. (j+1) out/tp) as [in][out/tp].
//     forward   x --copy_to_tp (or gather_from_sp)--> x W_j --(optional gather_from_tp)--> y
//     backward  dW_j += x^T dy_j;  dx = dy_j W_j^T, all-reduced over tp (or reduce-scattered under SP)
//   row-parallel: W split by input rows, rank j holds W[j in/tp .. (j+1) in/tp, :] as [in/tp][out]; its input
//     is already split by columns (a column layer's output).
//     forward   y = x_j W_j --reduce_from_tp (or reduce_scatter_to_sp)--> y
//     backward  dy (all-gathered under SP);  dx_j = dy W_j^T;  dW_j += x_j^T dy
//
// Under sequence parallelism (tp_linear_options::sequence_parallel) the tokens outside the pair are split
// over tp: a column layer's input and a row layer's output are [tokens / tp][..] on each rank (rank j's rows
// [j tokens/tp, (j+1) tokens/tp)); the column layer's backward all-gathers its input again rather than
// keeping the gathered copy (as Megatron does: memory over one more all-gather).
//
// Contract of the four functions: collective over the tp group (every member calls the same function with
// equal shapes and options, in the same order as its other collectives on `c`); deterministic (the
// communicator's rank-ordered reductions, the caller's GEMM); bad shapes or buffer sizes raise
// invalid_argument naming the function and the buffer before anything is communicated. Weight gradients are
// accumulated (+=), as gradient accumulation over micro-batches needs; everything else is written.
#pragma once

#include <cstdint>
#include <span>

#include "../config.hpp"
#include "../core/format.hpp"
#include "tp_regions.hpp"

namespace hetmesh::run {

/// Which product a tp_gemm call computes; c is [rows][cols], all row-major:
///  - nn: c = a b,   a [rows][inner], b [inner][cols]   (forward: y = x W);
///  - nt: c = a b^T, a [rows][inner], b [cols][inner]   (input gradient: dx = dy W^T);
///  - tn: c = a^T b, a [inner][rows], b [inner][cols]   (weight gradient: dW = x^T dy).
enum class gemm_op : std::uint8_t { nn, nt, tn };

/// A GEMM for the tensor-parallel layers, over buffers of element type T. Requirements:
///  1. `g(op, rows, cols, inner, a, b, c, accumulate)` with op a gemm_op, extents std::int64_t, a and b
///     std::span<const T>, c std::span<T>, accumulate bool: c = op(a, b), or c += op(a, b) when accumulate;
///  2. it reads and writes the memory the layer's buffers live in (host for run::host_gemm, the device for
///     a cuBLAS wrapper), ordered with the communicator's operations (same stream, or synchronous).
/// Models: run::host_gemm.
template <class G, class T>
concept tp_gemm = requires(G& g, gemm_op op, std::int64_t n, std::span<const T> a, std::span<T> c, bool acc) {
  g(op, n, n, n, a, a, c, acc);
};

/// The plain host GEMM: three loops, the inner sum in index order (deterministic), on the calling thread.
/// Cost: rows x cols x inner multiply-adds.
struct host_gemm {
  /// c (+)= op(a, b) as gemm_op says. Pre: the spans hold the sizes gemm_op gives.
  template <class T>
  void operator()(gemm_op op, std::int64_t rows, std::int64_t cols, std::int64_t inner, std::span<const T> a,
                  std::span<const T> b, std::span<T> c, bool accumulate) const {
    const auto n = static_cast<std::size_t>(rows), m = static_cast<std::size_t>(cols),
               k = static_cast<std::size_t>(inner);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) {
        T s = accumulate ? c[i * m + j] : T(0);
        for (std::size_t p = 0; p < k; ++p) {
          const T av = op == gemm_op::tn ? a[p * n + i] : a[i * k + p];
          const T bv = op == gemm_op::nt ? b[j * k + p] : b[p * m + j];
          s += av * bv;
        }
        c[i * m + j] = s;
      }
  }
};

static_assert(tp_gemm<host_gemm, float> && tp_gemm<host_gemm, double>);

/// The shape of a linear layer y = x W, unsplit: x [tokens][in], W [in][out]. `tokens` counts all the tokens
/// of the tp group's micro-batch (each rank holds tokens / tp of them under sequence parallelism).
struct tp_linear_shape {
  std::int64_t tokens = 0;  ///< rows of x and y, unsplit
  std::int64_t in = 0;      ///< columns of x, rows of W
  std::int64_t out = 0;     ///< columns of y and W

  friend bool operator==(const tp_linear_shape&, const tp_linear_shape&) = default;
};

/// How a tensor-parallel linear layer communicates (a value; equal on every tp rank).
struct tp_linear_options {
  /// Tokens outside the column/row pair are split over tp (Megatron's sequence parallelism): all-gather
  /// before a column layer, reduce-scatter after a row layer, instead of the all-reduces.
  bool sequence_parallel = false;
  /// Column layers only: all-gather the output columns so that every rank holds y [tokens][out] (the
  /// output then feeds no row layer; e.g. logits for a non-parallel loss).
  bool gather_output = false;

  friend bool operator==(const tp_linear_options&, const tp_linear_options&) = default;
};

namespace detail {

inline std::int64_t tp_rows_in(const tp_linear_options& o, std::int64_t tokens, int tp) {
  return o.sequence_parallel ? tokens / tp : tokens;
}

HETMESH_COMPILED void check_linear_shape(const char* who, const tp_linear_shape& s,
                                         const tp_linear_options& o, int tp, bool column)
#if HETMESH_BODIES
{
  if (s.tokens < 0 || s.in < 1 || s.out < 1)
    throw_error<invalid_argument>(
        "run::{}: shape tokens {}, in {}, out {}; expected tokens >= 0, in and out >= 1", who, s.tokens, s.in,
        s.out);
  check_tp_divides(who, column ? "the output width (out)" : "the input width (in)", column ? s.out : s.in,
                   tp);
  if (o.sequence_parallel && s.tokens % tp != 0)
    throw_error<invalid_argument>(
        "run::{}: the number of tokens is {}, not divisible by the tensor-parallel size {} (sequence "
        "parallelism splits the tokens)",
        who, s.tokens, tp);
  if (!column && o.gather_output)
    throw_error<invalid_argument>("run::{}: gather_output is an option of column-parallel layers only", who);
}
#else
    ;
#endif

}  // namespace detail

/// Column-parallel forward: y = x W_j on rank j. `x` is [tokens][in] (equal on every tp rank), or under
/// sequence parallelism this rank's [tokens / tp][in], all-gathered first. `w` is this rank's [in][out / tp]
/// columns. `y` is [tokens][out / tp], or [tokens][out] with gather_output. Pre: out divisible by tp (and
/// tokens under sequence parallelism). Cost: one GEMM of tokens x out/tp x in; under sequence parallelism one
/// all-gather of tokens x in; with gather_output one all-gather of tokens x out.
template <comm::communicator C, class T, model::memory_policy M, tp_gemm<T> G = host_gemm>
void column_parallel_forward(C& c, const tp_linear_shape& s, const tp_linear_options& o, std::span<const T> x,
                             std::span<const T> w, std::span<T> y, const M& mem, G&& gemm = {}) {
  constexpr const char* who = "column_parallel_forward";
  const int tp = c.size();
  detail::check_linear_shape(who, s, o, tp, true);
  const std::int64_t ol = s.out / tp;
  detail::check_tp_buffer(who, "x", x.size(), detail::tp_rows_in(o, s.tokens, tp) * s.in,
                          o.sequence_parallel ? "tokens / tp x in" : "tokens x in");
  detail::check_tp_buffer(who, "w", w.size(), s.in * ol, "in x out / tp");
  detail::check_tp_buffer(who, "y", y.size(), s.tokens * (o.gather_output ? s.out : ol),
                          o.gather_output ? "tokens x out" : "tokens x out / tp");
  typename M::template buffer<T> xg, yl;
  std::span<const T> xf = x;
  if (o.sequence_parallel) {
    xg.resize(static_cast<std::size_t>(s.tokens * s.in));
    gather_from_sp_forward(c, x, xg.span(), s.tokens, s.in, mem);
    xf = xg.span();
  }
  std::span<T> yo = y;
  if (o.gather_output) {
    yl.resize(static_cast<std::size_t>(s.tokens * ol));
    yo = yl.span();
  }
  gemm(gemm_op::nn, s.tokens, ol, s.in, xf, w, yo, false);
  if (o.gather_output) gather_from_tp_forward(c, std::span<const T>(yo), y, s.tokens, s.out, mem);
}

/// Column-parallel backward. `x`, `w` as in the forward; `dy` shaped as the forward's y. Writes `dx` (shaped
/// as x: the sum over tp of every rank's dy_j W_j^T, all-reduced, or reduce-scattered to this rank's tokens
/// under sequence parallelism) and adds x^T dy_j into `dw` [in][out / tp]. Cost: two GEMMs of the forward's
/// size; one all-reduce of tokens x in (or an all-gather and a reduce-scatter of it under sequence
/// parallelism).
template <comm::communicator C, class T, model::memory_policy M, tp_gemm<T> G = host_gemm>
void column_parallel_backward(C& c, const tp_linear_shape& s, const tp_linear_options& o,
                              std::span<const T> x, std::span<const T> w, std::span<const T> dy,
                              std::span<T> dx, std::span<T> dw, const M& mem, G&& gemm = {}) {
  constexpr const char* who = "column_parallel_backward";
  const int tp = c.size();
  detail::check_linear_shape(who, s, o, tp, true);
  const std::int64_t ol = s.out / tp, rows_in = detail::tp_rows_in(o, s.tokens, tp);
  const char* x_formula = o.sequence_parallel ? "tokens / tp x in" : "tokens x in";
  detail::check_tp_buffer(who, "x", x.size(), rows_in * s.in, x_formula);
  detail::check_tp_buffer(who, "dx", dx.size(), rows_in * s.in, x_formula);
  detail::check_tp_buffer(who, "w", w.size(), s.in * ol, "in x out / tp");
  detail::check_tp_buffer(who, "dw", dw.size(), s.in * ol, "in x out / tp");
  detail::check_tp_buffer(who, "dy", dy.size(), s.tokens * (o.gather_output ? s.out : ol),
                          o.gather_output ? "tokens x out" : "tokens x out / tp");
  typename M::template buffer<T> dyl, xg, dxf;
  std::span<const T> dyo = dy;
  if (o.gather_output) {
    dyl.resize(static_cast<std::size_t>(s.tokens * ol));
    gather_from_tp_backward(c, dy, dyl.span(), s.tokens, s.out, mem);
    dyo = dyl.span();
  }
  if (!o.sequence_parallel) {
    gemm(gemm_op::nt, s.tokens, s.in, ol, dyo, w, dx, false);
    copy_to_tp_backward(c, dx);
    gemm(gemm_op::tn, s.in, ol, s.tokens, x, dyo, dw, true);
    return;
  }
  xg.resize(static_cast<std::size_t>(s.tokens * s.in));
  dxf.resize(xg.size());
  gather_from_sp_forward(c, x, xg.span(), s.tokens, s.in, mem);
  gemm(gemm_op::nt, s.tokens, s.in, ol, dyo, w, dxf.span(), false);
  gather_from_sp_backward(c, std::span<const T>(dxf.span()), dx, s.tokens, s.in, mem);
  gemm(gemm_op::tn, s.in, ol, s.tokens, std::span<const T>(xg.span()), dyo, dw, true);
}

/// Row-parallel forward: y = sum over tp of x_j W_j. `x` is this rank's [tokens][in / tp] columns (a column
/// layer's output), `w` its [in / tp][out] rows. `y` is [tokens][out] (all-reduced), or this rank's
/// [tokens / tp][out] under sequence parallelism (reduce-scattered). Pre: in divisible by tp (and tokens
/// under sequence parallelism); gather_output false. Cost: one GEMM of tokens x out x in/tp; one all-reduce
/// (or reduce-scatter) of tokens x out.
template <comm::communicator C, class T, model::memory_policy M, tp_gemm<T> G = host_gemm>
void row_parallel_forward(C& c, const tp_linear_shape& s, const tp_linear_options& o, std::span<const T> x,
                          std::span<const T> w, std::span<T> y, const M& mem, G&& gemm = {}) {
  constexpr const char* who = "row_parallel_forward";
  const int tp = c.size();
  detail::check_linear_shape(who, s, o, tp, false);
  const std::int64_t il = s.in / tp;
  detail::check_tp_buffer(who, "x", x.size(), s.tokens * il, "tokens x in / tp");
  detail::check_tp_buffer(who, "w", w.size(), il * s.out, "in / tp x out");
  detail::check_tp_buffer(who, "y", y.size(), detail::tp_rows_in(o, s.tokens, tp) * s.out,
                          o.sequence_parallel ? "tokens / tp x out" : "tokens x out");
  if (!o.sequence_parallel) {
    gemm(gemm_op::nn, s.tokens, s.out, il, x, w, y, false);
    reduce_from_tp_forward(c, y);
    return;
  }
  typename M::template buffer<T> yp;
  yp.resize(static_cast<std::size_t>(s.tokens * s.out));
  gemm(gemm_op::nn, s.tokens, s.out, il, x, w, yp.span(), false);
  reduce_scatter_to_sp_forward(c, std::span<const T>(yp.span()), y, s.tokens, s.out, mem);
}

/// Row-parallel backward. `x`, `w` as in the forward; `dy` shaped as the forward's y (all-gathered first
/// under sequence parallelism). Writes `dx` [tokens][in / tp] = dy W_j^T and adds x_j^T dy into `dw`
/// [in / tp][out]. Cost: two GEMMs of the forward's size; under sequence parallelism one all-gather of
/// tokens x out.
template <comm::communicator C, class T, model::memory_policy M, tp_gemm<T> G = host_gemm>
void row_parallel_backward(C& c, const tp_linear_shape& s, const tp_linear_options& o, std::span<const T> x,
                           std::span<const T> w, std::span<const T> dy, std::span<T> dx, std::span<T> dw,
                           const M& mem, G&& gemm = {}) {
  constexpr const char* who = "row_parallel_backward";
  const int tp = c.size();
  detail::check_linear_shape(who, s, o, tp, false);
  const std::int64_t il = s.in / tp;
  detail::check_tp_buffer(who, "x", x.size(), s.tokens * il, "tokens x in / tp");
  detail::check_tp_buffer(who, "dx", dx.size(), s.tokens * il, "tokens x in / tp");
  detail::check_tp_buffer(who, "w", w.size(), il * s.out, "in / tp x out");
  detail::check_tp_buffer(who, "dw", dw.size(), il * s.out, "in / tp x out");
  detail::check_tp_buffer(who, "dy", dy.size(), detail::tp_rows_in(o, s.tokens, tp) * s.out,
                          o.sequence_parallel ? "tokens / tp x out" : "tokens x out");
  typename M::template buffer<T> dyg;
  std::span<const T> dyf = dy;
  if (o.sequence_parallel) {
    dyg.resize(static_cast<std::size_t>(s.tokens * s.out));
    reduce_scatter_to_sp_backward(c, dy, dyg.span(), s.tokens, s.out, mem);
    dyf = dyg.span();
  }
  gemm(gemm_op::nt, s.tokens, il, s.out, dyf, w, dx, false);
  gemm(gemm_op::tn, il, s.out, s.tokens, x, dyf, dw, true);
}

}  // namespace hetmesh::run

/// Prints "tp_linear_shape(tokens=8, in=6, out=12)".
template <>
struct fmt::formatter<hetmesh::run::tp_linear_shape> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::run::tp_linear_shape& s, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "tp_linear_shape(tokens={}, in={}, out={})", s.tokens, s.in, s.out);
  }
};

/// Prints "tp_linear_options(sequence_parallel=true, gather_output=false)".
template <>
struct fmt::formatter<hetmesh::run::tp_linear_options> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::run::tp_linear_options& o, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "tp_linear_options(sequence_parallel={}, gather_output={})",
                              o.sequence_parallel, o.gather_output);
  }
};
