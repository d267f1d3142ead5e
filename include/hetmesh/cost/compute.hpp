// SPDX-License-Identifier: Apache-2.0
// hetmesh::cost: compute-time models of the LLM backbone. ByteScale's per-layer model
// T(s) = a s^2 + b s + c prices one causal sequence; a packed row (documents concatenated under a
// block-diagonal causal mask) pays the quadratic term per document and the constant once. Times are
// in model units (whatever the coefficients were calibrated in; milliseconds for the Fig. 6(a) fit),
// computed in double and rounded to cost::fixed before any planner compares them.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include <fmt/format.h>

#include "../config.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "fixed.hpp"

namespace hetmesh::cost {

/// T(s) = a s^2 + b s + c: the one compute formula of hetmesh, per layer and per modality. With
/// double coefficients (quadratic_time) it is the forward time of one layer over one sequence of s
/// tokens: for a causal LLM layer `a` prices attention (the mask is a triangle), `b` the projections
/// and MLP, `c` fixed overheads (launches); an encoder modality's layer likewise (encoder.hpp). With
/// integer coefficients (quadratic_count) it is an exact price in abstract units for planners that
/// compare integers without any rounding (the data plane's sample costs). Value type; `==`;
/// hashable; printable.
template <class T>
struct basic_quadratic {
  T a{};  ///< coefficient of s^2 (attention)
  T b{};  ///< coefficient of s (GEMMs, MLP)
  T c{};  ///< constant (launches)

  /// The length-dependent part (a s + b) s: what packing s with other documents adds. O(1).
  [[nodiscard]] constexpr T variable(T s) const noexcept { return (a * s + b) * s; }
  /// T(s). Pre: s >= 0. O(1).
  [[nodiscard]] constexpr T operator()(T s) const noexcept { return variable(s) + c; }
  friend constexpr bool operator==(const basic_quadratic&, const basic_quadratic&) = default;
  void hash_append(hasher& h) const { append_all(h, a, b, c); }
};

/// Time per layer, model units (ms for the Fig. 6(a) fit); calibrated by cost::fit_quadratic.
using quadratic_time = basic_quadratic<double>;
/// Exact integer price a s^2 + b s + c (overflow is the caller's: keep a s^2 within int64).
using quadratic_count = basic_quadratic<std::int64_t>;

/// The backbone's compute on one rank: `layers` layers (one pipeline stage's worth), each priced by
/// `layer`, trained at `train_factor` times the forward cost (3: forward + backward at twice forward;
/// 4: with full recomputation).
struct llm_compute {
  quadratic_time layer{};     ///< time of one layer as a function of length
  std::int64_t layers = 1;    ///< layers of the model (or of the stage)
  double train_factor = 3.0;  ///< training / forward time (3: forward + 2x backward)

  /// Coefficients from transformer FLOPs: per layer forward 24 h^2 s (projections, MLP ratio 4) plus
  /// 2 h s^2 for causal attention (half of the full 4 h s^2), divided by the achieved FLOP rate
  /// `flops_per_unit` (FLOPs per model unit, e.g. 400e9 for 400 TFLOP/s with ms units). `kv_ratio`
  /// (kv heads / heads, GQA) scales the K and V projections. Pre: hidden, flops_per_unit > 0.
  [[nodiscard]] HETMESH_COMPILED static llm_compute from_dims(std::int64_t hidden, std::int64_t layers,
                                                              double flops_per_unit, double kv_ratio = 1.0,
                                                              double train_factor = 3.0);

  /// layers x train_factor: what one layer's forward time is multiplied by. O(1).
  [[nodiscard]] constexpr double scale() const noexcept { return static_cast<double>(layers) * train_factor; }
  /// The length-dependent training time of a sequence of s tokens, without the per-row constant c
  /// (packing shares c): the work a lower bound or a balancer spreads. O(1).
  [[nodiscard]] double work(std::int64_t s) const noexcept {
    const auto x = static_cast<double>(s);
    // (scale x (a s + b)) x, not scale x variable(s): the association every lower bound was computed
    // with, kept so that bounds (and the plans widened against them) stay bit-identical.
    return scale() * (layer.a * x + layer.b) * x;
  }
  /// The training time a balancer charges a short sequence of s tokens that will be packed into rows
  /// of `capacity` tokens: its work plus its share s / capacity of the row constant (rows are nearly
  /// full after best fit, so c is split among their members). Pre: capacity >= 1. O(1).
  [[nodiscard]] double placement(std::int64_t s, std::int64_t capacity) const noexcept {
    const auto x = static_cast<double>(s);
    return scale() * (layer.variable(x) + layer.c * x / static_cast<double>(capacity));
  }
  /// placement() as fixed-point: what a planner compares. O(1).
  [[nodiscard]] fixed placement_fixed(std::int64_t s, std::int64_t capacity) const {
    return fixed::from_units(placement(s, capacity));
  }
  /// One layer's forward time of one of `d` zigzag shards of a packed row of `documents` (THD zigzag
  /// per document: each shard holds 1/d of every document's mask area and tokens and pays the
  /// constant once). Pre: d >= 1. O(documents).
  [[nodiscard]] HETMESH_COMPILED double shard_layer(std::span<const std::int64_t> documents,
                                                    std::int64_t d) const noexcept;

  /// Training time of one causal sequence of s tokens on this rank. Pre: s >= 0. O(1).
  [[nodiscard]] double sequence(std::int64_t s) const noexcept {
    return scale() * layer(static_cast<double>(s));
  }
  /// Training time of one packed row: sum over documents of (a l^2 + b l), plus c once per layer.
  /// Pre: every l >= 0. O(documents).
  [[nodiscard]] double packed_row(std::span<const std::int64_t> documents) const noexcept {
    double t = layer.c;
    for (auto l : documents) t += layer.variable(static_cast<double>(l));
    return scale() * t;
  }
  /// Training time of one of `d` zigzag shards of a causal sequence of s tokens (a ring of d ranks): each
  /// shard holds 1/d of the mask area and of the tokens, and pays the constant once. Pre: d >= 1.
  [[nodiscard]] double shard(std::int64_t s, std::int64_t d) const noexcept {
    return scale() * shard_layer(std::span<const std::int64_t>(&s, 1), d);
  }

  /// sequence() as fixed-point. O(1).
  [[nodiscard]] fixed sequence_fixed(std::int64_t s) const { return fixed::from_units(sequence(s)); }
  /// packed_row() as fixed-point. O(docs).
  [[nodiscard]] fixed packed_row_fixed(std::span<const std::int64_t> docs) const {
    return fixed::from_units(packed_row(docs));
  }
  /// shard() as fixed-point. O(1).
  [[nodiscard]] fixed shard_fixed(std::int64_t s, std::int64_t d) const {
    return fixed::from_units(shard(s, d));
  }

  friend bool operator==(const llm_compute&, const llm_compute&) = default;
  HETMESH_COMPILED void hash_append(hasher& h) const;
};

/// ByteScale Fig. 6(a) per-layer forward time (attention + MLP) of a 7B-class model in milliseconds,
/// as fitted by cost::fit_quadratic to the six published points (see tests/cost). A ready default for
/// examples and benchmarks; a real run calibrates its own.
[[nodiscard]] inline quadratic_time bytescale_fig6a_layer() noexcept {
  return quadratic_time{9.19352e-9, 3.55797e-4, 0.0854399};
}

}  // namespace hetmesh::cost

template <class T>
struct fmt::formatter<hetmesh::cost::basic_quadratic<T>> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::cost::basic_quadratic<T>& q, FormatContext& ctx) const -> decltype(ctx.out()) {
    if constexpr (std::is_floating_point_v<T>)
      return hetmesh::format_to(ctx.out(), "T(s)={:.4g}*s^2+{:.4g}*s+{:.4g}", q.a, q.b, q.c);
    else
      return hetmesh::format_to(ctx.out(), "c(s)={}*s^2+{}*s+{}", q.a, q.b, q.c);
  }
};

template <>
struct fmt::formatter<hetmesh::cost::llm_compute> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::cost::llm_compute& m, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "llm_compute({}, layers={}, train_factor={})", m.layer, m.layers,
                              m.train_factor);
  }
};

#if HETMESH_BODIES

namespace hetmesh::cost {

HETMESH_COMPILED llm_compute llm_compute::from_dims(std::int64_t hidden, std::int64_t layers,
                                                    double flops_per_unit, double kv_ratio,
                                                    double train_factor) {
  if (hidden <= 0 || layers <= 0 || !(flops_per_unit > 0.0) || !(kv_ratio > 0.0 && kv_ratio <= 1.0)) {
    throw_error<invalid_argument>(
        "cost::llm_compute::from_dims: hidden={}, layers={}, flops_per_unit={}, kv_ratio={}; expected "
        "hidden, layers, flops_per_unit > 0 and 0 < kv_ratio <= 1",
        hidden, layers, flops_per_unit, kv_ratio);
  }
  const double h = static_cast<double>(hidden);
  // q and out projections 2*2h^2, k and v 2*2h^2*kv_ratio, MLP 2*2*4h^2 = 16h^2.
  const double linear = (4.0 + 4.0 * kv_ratio + 16.0) * h * h;
  return llm_compute{quadratic_time{2.0 * h / flops_per_unit, linear / flops_per_unit, 0.0}, layers,
                     train_factor};
}

HETMESH_COMPILED double llm_compute::shard_layer(std::span<const std::int64_t> documents,
                                                 std::int64_t d) const noexcept {
  double v = 0.0;
  for (auto l : documents) v += layer.variable(static_cast<double>(l));
  return v / static_cast<double>(d) + layer.c;
}

HETMESH_COMPILED void llm_compute::hash_append(hasher& h) const {
  append_all(h, layer, layers, train_factor);
}

}  // namespace hetmesh::cost
#endif  // HETMESH_BODIES
