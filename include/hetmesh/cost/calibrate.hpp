// SPDX-License-Identifier: Apache-2.0
// hetmesh::cost: calibration. Coefficients of T(s) = a s^2 + b s + c (or Act(s) = alpha s + beta) are
// fitted by least squares to measured (length, time) points. By default the fit minimises *relative*
// error (weights 1/t^2), because short and long sequences matter equally to a balancer: an absolute fit
// would let the 128K point swamp the 4K one. Coefficients are kept non-negative (a negative quadratic
// or linear term would make cost non-monotone in length and break greedy balancing): the fit solves
// the exact non-negative least-squares problem by trying every subset of free terms.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "compute.hpp"

namespace hetmesh::cost {

/// One measurement: a length (tokens, frames, ...) and its time (model units).
struct sample_point {
  double length = 0.0;  ///< sequence length, tokens
  double time = 0.0;    ///< measured time
};

/// Which terms the fit may use, and how it weights points.
struct fit_options {
  bool quadratic = true;    ///< a s^2
  bool linear = true;       ///< b s
  bool constant = true;     ///< c
  bool relative = true;     ///< minimise sum ((T(s) - t) / t)^2; else sum (T(s) - t)^2
  bool nonnegative = true;  ///< a, b, c >= 0
  friend constexpr bool operator==(const fit_options&, const fit_options&) = default;
};

/// A fitted model with its errors on the points it was fitted to.
struct fit_result {
  quadratic_time model{};           ///< the fitted T(s) = a s^2 + b s + c
  double max_relative_error = 0.0;  ///< max |T(s) - t| / t
  double rms_relative_error = 0.0;  ///< root mean square of |T(s) - t| / t
};

namespace detail {

/// Solves the weighted least-squares problem on the terms in `mask` (bit 0: s^2, 1: s, 2: 1), with
/// columns scaled by the largest length so the normal equations stay well conditioned. Returns false
/// when the system is singular (too few distinct lengths for the terms).
HETMESH_COMPILED bool solve_terms(std::span<const sample_point> pts, unsigned mask, bool relative,
                                  double scale, std::array<double, 3>& coef);

}  // namespace detail

/// Least-squares fit of T(s) = a s^2 + b s + c to `points`.
/// Pre: at least one point; every length >= 0 and time > 0 when relative (invalid_argument otherwise);
/// at least one term enabled. Post: the model minimising the chosen error among models with the enabled
/// terms (and non-negative coefficients when asked); the errors reported are relative. Local;
/// deterministic; O(points).
[[nodiscard]] inline fit_result fit_quadratic(std::span<const sample_point> points, fit_options opt = {}) {
  if (points.empty()) throw_error<invalid_argument>("cost::fit_quadratic: no points; expected at least one");
  const unsigned allowed = (opt.quadratic ? 1U : 0U) | (opt.linear ? 2U : 0U) | (opt.constant ? 4U : 0U);
  if (allowed == 0)
    throw_error<invalid_argument>("cost::fit_quadratic: every term disabled; expected at least one");
  double scale = 0.0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    if (!(p.length >= 0.0) || !std::isfinite(p.length) || !std::isfinite(p.time) ||
        (opt.relative && !(p.time > 0.0))) {
      throw_error<invalid_argument>(
          "cost::fit_quadratic: point {} = (length {}, time {}); expected finite length >= 0 and time > 0", i,
          p.length, p.time);
    }
    scale = std::max(scale, p.length);
  }
  if (scale == 0.0) scale = 1.0;
  double best_err = std::numeric_limits<double>::infinity();
  std::array<double, 3> best{};
  bool found = false;
  for (unsigned mask = 1; mask < 8; ++mask) {
    if ((mask & ~allowed) != 0) continue;
    // Without the non-negativity constraint only the full set of allowed terms matters.
    if (!opt.nonnegative && mask != allowed) continue;
    std::array<double, 3> coef{};
    if (!detail::solve_terms(points, mask, opt.relative, scale, coef)) continue;
    if (opt.nonnegative && (coef[0] < 0.0 || coef[1] < 0.0 || coef[2] < 0.0)) continue;
    double err = 0.0;
    for (const auto& p : points) {
      const double r = coef[0] * p.length * p.length + coef[1] * p.length + coef[2] - p.time;
      err += opt.relative ? (r / p.time) * (r / p.time) : r * r;
    }
    if (err < best_err) {
      best_err = err;
      best = coef;
      found = true;
    }
  }
  if (!found) {
    throw_error<invalid_argument>(
        "cost::fit_quadratic: {} points do not determine the enabled terms; expected at least as many "
        "distinct "
        "lengths as terms",
        points.size());
  }
  fit_result out;
  out.model = quadratic_time{best[0], best[1], best[2]};
  double sq = 0.0;
  for (const auto& p : points) {
    const double rel = p.time != 0.0 ? std::fabs(out.model(p.length) - p.time) / std::fabs(p.time) : 0.0;
    out.max_relative_error = std::max(out.max_relative_error, rel);
    sq += rel * rel;
  }
  out.rms_relative_error = std::sqrt(sq / static_cast<double>(points.size()));
  return out;
}

}  // namespace hetmesh::cost

template <>
struct fmt::formatter<hetmesh::cost::sample_point> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::cost::sample_point& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "({}, {})", p.length, p.time);
  }
};

template <>
struct fmt::formatter<hetmesh::cost::fit_result> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::cost::fit_result& r, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "fit({}, max_rel_err={:.4f}, rms_rel_err={:.4f})", r.model,
                              r.max_relative_error, r.rms_relative_error);
  }
};

#if HETMESH_BODIES

namespace hetmesh::cost::detail {

HETMESH_COMPILED bool solve_terms(std::span<const sample_point> pts, unsigned mask, bool relative,
                                  double scale, std::array<double, 3>& coef) {
  std::array<int, 3> cols{};
  int k = 0;
  for (int j = 0; j < 3; ++j)
    if ((mask >> j) & 1U) cols[static_cast<std::size_t>(k++)] = j;
  double m[3][4] = {};
  for (const auto& p : pts) {
    const double x = p.length / scale;
    const double basis[3] = {x * x, x, 1.0};
    const double w = relative ? 1.0 / (p.time * p.time) : 1.0;
    for (int r = 0; r < k; ++r) {
      for (int c = 0; c < k; ++c) m[r][c] += w * basis[cols[r]] * basis[cols[c]];
      m[r][3] += w * basis[cols[r]] * p.time;
    }
  }
  // Gaussian elimination with partial pivoting on the k x k system.
  for (int c = 0; c < k; ++c) {
    int piv = c;
    for (int r = c + 1; r < k; ++r)
      if (std::fabs(m[r][c]) > std::fabs(m[piv][c])) piv = r;
    if (std::fabs(m[piv][c]) < 1e-300) return false;
    for (int j = 0; j < 4; ++j) std::swap(m[c][j], m[piv][j]);
    for (int r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (int j = c; j < 4; ++j) m[r][j] -= f * m[c][j];
    }
  }
  coef = {0.0, 0.0, 0.0};
  for (int r = 0; r < k; ++r) coef[static_cast<std::size_t>(cols[r])] = m[r][3] / m[r][r];
  // Undo the column scaling: x = s / scale.
  coef[0] /= scale * scale;
  coef[1] /= scale;
  return true;
}

}  // namespace hetmesh::cost::detail
#endif  // HETMESH_BODIES
