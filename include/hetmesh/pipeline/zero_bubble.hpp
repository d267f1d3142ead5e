// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: the zero-bubble schedule families, whose backward is split into I (input) and W
// (weight) so that W fills the bubbles: ZB-H1 (zero_bubble), ZB1P (interleaved_zero_bubble) and ZB-V
// (zbv), with the orders of PyTorch's ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble. The other
// families and the table of which peer each order matches are in generators.hpp, which includes this.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../core/hash.hpp"
#include "action.hpp"
#include "detail/schedule_builders.hpp"
#include "verify.hpp"

namespace hetmesh::pipeline {

/// ZB-H1: one stage per rank, backward split into I and W, W deferred by `rank` steps. Identical to
/// interleaved_zero_bubble{.virtual_stages = 1} (PyTorch's ScheduleInterleavedZeroBubble with one stage
/// per rank), including the micro-batch counts it refuses.
struct zero_bubble {
  /// The family's name in schedule files, traces and the tools.
  static constexpr std::string_view name = "zero-bubble";
  /// Backward is split into I (input) and W (weight): the stage must provide both.
  static constexpr bool requires_split_backward = true;
  /// generate(*this, pp, microbatches): the schedule of this family (see the free generate).
  [[nodiscard]] schedule generate(int pp, int microbatches) const;
  friend constexpr bool operator==(const zero_bubble&, const zero_bubble&) = default;
  void hash_append(hasher& h) const { append(h, name); }
};

/// PyTorch's ScheduleInterleavedZeroBubble (ZB1P) with `virtual_stages` chunks per rank.
struct interleaved_zero_bubble {
  /// The family's name in schedule files, traces and the tools.
  static constexpr std::string_view name = "interleaved-zero-bubble";
  /// Backward is split into I (input) and W (weight): the stage must provide both.
  static constexpr bool requires_split_backward = true;
  /// generate(*this, pp, microbatches): the schedule of this family (see the free generate).
  [[nodiscard]] schedule generate(int pp, int microbatches) const;
  int virtual_stages = 2;  ///< model chunks per rank
  int group_size = 0;      ///< 0 = PyTorch's rule; else a Megatron-style group size in [1, M].
  friend constexpr bool operator==(const interleaved_zero_bubble&, const interleaved_zero_bubble&) = default;
  void hash_append(hasher& h) const { append_all(h, name, virtual_stages, group_size); }
};

/// ZB-V: two stages per rank in a V (rank r holds stages r and 2*pp-1-r).
struct zbv {
  /// The family's name in schedule files, traces and the tools.
  static constexpr std::string_view name = "zbv";
  /// Backward is split into I (input) and W (weight): the stage must provide both.
  static constexpr bool requires_split_backward = true;
  /// generate(*this, pp, microbatches): the schedule of this family (see the free generate).
  [[nodiscard]] schedule generate(int pp, int microbatches) const;
  friend constexpr bool operator==(const zbv&, const zbv&) = default;
  void hash_append(hasher& h) const { append(h, name); }
};

/// ZB-H1: PyTorch's zero-bubble order with one stage per rank: pp-1-r warm-up forwards, then F and I
/// pairs; W of the k-th backward follows the (k + r)-th I. Preconditions as gpipe, and PyTorch's rule
/// for ScheduleInterleavedZeroBubble: M a multiple of max(1, M / pp) (invalid_argument naming it).
/// Pure; O(pp * M).
[[nodiscard]] inline schedule generate(const zero_bubble&, int pp, int microbatches) {
  detail::check_basic("zero-bubble", pp, microbatches);
  (void)detail::pytorch_group_size("zero-bubble", pp, microbatches);
  auto s = detail::make_empty("zero-bubble", pp, pp, microbatches, stage_layout::loop);
  const auto table = detail::schedule_table(microbatches, 1, microbatches);
  for (int r = 0; r < pp; ++r)
    s.ranks[static_cast<std::size_t>(r)] =
        detail::one_f_one_b_rank(pp, 1, r, microbatches, table, std::min(pp - 1 - r, microbatches), true, r);
  assert_deadlock_free(s, "pipeline::generate(zero-bubble)");
  return s;
}

/// PyTorch's ScheduleInterleavedZeroBubble: warm-up min((v-1)*g + (pp-1-r), v*M) forwards, F/I pairs,
/// W deferred by r backwards. Group size g by PyTorch's rule unless `group_size` is given (then
/// 1 <= g <= M). Errors name the broken rule. Pure; O(pp * v * M).
[[nodiscard]] inline schedule generate(const interleaved_zero_bubble& p, int pp, int microbatches) {
  detail::check_basic("interleaved-zero-bubble", pp, microbatches);
  detail::check_virtual("interleaved-zero-bubble", p.virtual_stages);
  const int v = p.virtual_stages;
  int g = p.group_size;
  if (g == 0) {
    g = detail::pytorch_group_size("interleaved-zero-bubble", pp, microbatches);
  } else if (g < 1 || g > microbatches) {
    throw_error<invalid_argument>(
        "pipeline interleaved-zero-bubble: group_size={} is outside [1, microbatches={}]; expected 0 "
        "(PyTorch's "
        "rule) or a size in that range",
        g, microbatches);
  }
  auto s = detail::make_empty("interleaved-zero-bubble", pp, pp * v, microbatches, stage_layout::loop);
  const auto table = detail::schedule_table(microbatches, v, g);
  for (int r = 0; r < pp; ++r) {
    const int warmup = std::min((v - 1) * g + (pp - 1 - r), v * microbatches);
    s.ranks[static_cast<std::size_t>(r)] =
        detail::one_f_one_b_rank(pp, v, r, microbatches, table, warmup, true, r);
  }
  assert_deadlock_free(s, "pipeline::generate(interleaved-zero-bubble)");
  return s;
}

/// PyTorch's ScheduleZBVZeroBubble: 2*pp stages in a V. The order is built for max(2*pp-1, M)
/// micro-batches and the extra ones dropped, as PyTorch does. Preconditions as gpipe. Pure; O(pp * M).
[[nodiscard]] inline schedule generate(const zbv&, int pp, int microbatches) {
  detail::check_basic("zbv", pp, microbatches);
  const int stages = 2 * pp;
  auto s = detail::make_empty("zbv", pp, stages, microbatches, stage_layout::v);
  const int n = std::max(2 * pp - 1, microbatches);
  for (int r = 0; r < pp; ++r) {
    std::vector<action> ops;
    const int c0 = r, c1 = stages - 1 - r;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto push = [&](action a) {
      if (a.microbatch < microbatches) ops.push_back(a);
    };
    for (int i = 0; i < 2 * (pp - r) - 1; ++i) push(F(c0, f0++));
    for (int i = 0; i < r; ++i) {
      push(F(c1, f1++));
      push(F(c0, f0++));
    }
    for (int i = 0; i < pp - r; ++i) {
      push(F(c1, f1++));
      push(I(c1, b1));
      push(W(c1, b1++));
    }
    while (f1 < f0 || f0 < n) {
      if (f0 < n) push(F(c0, f0++));
      push(I(c0, b0));
      push(W(c0, b0++));
      push(F(c1, f1++));
      push(I(c1, b1));
      push(W(c1, b1++));
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < r; ++i) {
      push(I(c0, b0++));
      push(I(c1, b1++));
    }
    for (int i = 0; i < pp - r; ++i) {
      push(I(c0, b0++));
      push(W(c0, w0++));
    }
    while (w1 < b1) push(W(c1, w1++));
    while (w0 < b0) push(W(c0, w0++));
    s.ranks[static_cast<std::size_t>(r)] = std::move(ops);
  }
  assert_deadlock_free(s, "pipeline::generate(zbv)");
  return s;
}

// The member form of each family's generator (declared in the class, defined once the free ones exist).
inline schedule zero_bubble::generate(int pp, int microbatches) const {
  return pipeline::generate(*this, pp, microbatches);
}
inline schedule interleaved_zero_bubble::generate(int pp, int microbatches) const {
  return pipeline::generate(*this, pp, microbatches);
}
inline schedule zbv::generate(int pp, int microbatches) const {
  return pipeline::generate(*this, pp, microbatches);
}

}  // namespace hetmesh::pipeline

template <>
struct fmt::formatter<hetmesh::pipeline::zero_bubble> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::zero_bubble& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", p.name);
  }
};

template <>
struct fmt::formatter<hetmesh::pipeline::zbv> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::zbv& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", p.name);
  }
};

template <>
struct fmt::formatter<hetmesh::pipeline::interleaved_zero_bubble> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::interleaved_zero_bubble& p, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "interleaved-zero-bubble(virtual_stages={}, group_size={})",
                              p.virtual_stages, p.group_size);
  }
};
