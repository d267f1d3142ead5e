// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: schedule families as policy types. Each family is a small aggregate (its type is the
// choice, its members the parameters); `generate` turns (policy, pp, microbatches) into a compute-only
// schedule (F, B, I, W per rank, in order). The `schedule_family` concept and the split-backward rule
// are in schedule_family.hpp; names (strings) to policies are the tools' business (tools/common).
// Orders match the peers whose names they share:
//   gpipe, one_f_one_b           PyTorch ScheduleGPipe / Schedule1F1B (= Megatron-LM without interleaving)
//   interleaved_1f1b             PyTorch ScheduleInterleaved1F1B by default (group_rule::pytorch: group size
//                                M / max(1, M / pp), any M that is a multiple of max(1, M / pp), M < pp
//                                included); with group_rule::megatron, Megatron-LM's
//                                forward_backward_pipelining_with_interleaving for a micro-batch group size
//   looped_bfs                   PyTorch ScheduleLoopedBFS (breadth first, v stages per rank)
//   zero_bubble                  ZB-H1: PyTorch ScheduleInterleavedZeroBubble with one stage per rank, in
//                                order and in the micro-batch counts it accepts
//   interleaved_zero_bubble      PyTorch ScheduleInterleavedZeroBubble (ZB1P)
//   zbv                          PyTorch ScheduleZBVZeroBubble (V layout, two stages per rank)
// The zero-bubble families (split backward) are in zero_bubble.hpp, the helpers all of them share in
// detail/schedule_builders.hpp; this header includes both.
// The algorithms were re-derived from those projects' published descriptions and code structure;
// see docs/pipeline.md for the derivation and the golden tests in tests/pipeline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
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
#include "zero_bubble.hpp"

namespace hetmesh::pipeline {

/// GPipe: all forwards, then all backwards, micro-batches in order.
struct gpipe {
  /// The family's name in schedule files, traces and the tools.
  static constexpr std::string_view name = "gpipe";
  /// Backward runs whole (B): any backbone stage will do.
  static constexpr bool requires_split_backward = false;
  /// generate(*this, pp, microbatches): the schedule of this family (see the free generate).
  [[nodiscard]] schedule generate(int pp, int microbatches) const;
  friend constexpr bool operator==(const gpipe&, const gpipe&) = default;
  void hash_append(hasher& h) const { append(h, name); }
};

/// 1F1B (PipeDream-flush): rank r runs min(pp-1-r, M) warm-up forwards, then alternates F and B.
struct one_f_one_b {
  /// The family's name in schedule files, traces and the tools.
  static constexpr std::string_view name = "1f1b";
  /// Backward runs whole (B): any backbone stage will do.
  static constexpr bool requires_split_backward = false;
  /// generate(*this, pp, microbatches): the schedule of this family (see the free generate).
  [[nodiscard]] schedule generate(int pp, int microbatches) const;
  friend constexpr bool operator==(const one_f_one_b&, const one_f_one_b&) = default;
  void hash_append(hasher& h) const { append(h, name); }
};

/// Which project's rule picks and checks the micro-batch group size of interleaved schedules.
enum class group_rule : std::uint8_t {
  megatron,  ///< group_size in [pp, M] (0 = pp); M % group_size is 0 or >= pp.
  pytorch,   ///< group_size = M / max(1, M / pp); M must be a multiple of max(1, M / pp).
};

/// Interleaved 1F1B with `virtual_stages` model chunks per rank (stage s on rank s % pp). By default
/// PyTorch's ScheduleInterleaved1F1B (`rule = group_rule::pytorch`: micro-batches go in rounds of
/// M / max(1, M / pp), fewer micro-batches than ranks accepted); `rule = group_rule::megatron` with a
/// `group_size` is Megatron-LM's interleaved schedule for that microbatch_group_size_per_vp_stage.
struct interleaved_1f1b {
  /// The family's name in schedule files, traces and the tools.
  static constexpr std::string_view name = "interleaved-1f1b";
  /// Backward runs whole (B): any backbone stage will do.
  static constexpr bool requires_split_backward = false;
  /// generate(*this, pp, microbatches): the schedule of this family (see the free generate).
  [[nodiscard]] schedule generate(int pp, int microbatches) const;
  int virtual_stages = 2;  ///< model chunks per rank
  int group_size = 0;      ///< Megatron's microbatch_group_size_per_vp_stage; 0 = the rule's default.
  group_rule rule = group_rule::pytorch;  ///< how micro-batches group (PyTorch's, or Megatron's)
  friend constexpr bool operator==(const interleaved_1f1b&, const interleaved_1f1b&) = default;
  void hash_append(hasher& h) const { append_all(h, name, virtual_stages, group_size, rule); }
};

/// PyTorch's ScheduleLoopedBFS (breadth-first pipeline parallelism, arXiv 2211.05953) with
/// `virtual_stages` stages per rank (stage s on rank s % pp): each rank runs every micro-batch's forward
/// through its first stage, then its second, ...; then the backwards, last local stage first, micro-batches
/// in reverse order.
struct looped_bfs {
  /// The family's name in schedule files, traces and the tools.
  static constexpr std::string_view name = "looped-bfs";
  /// Backward runs whole (B): any backbone stage will do.
  static constexpr bool requires_split_backward = false;
  /// generate(*this, pp, microbatches): the schedule of this family (see the free generate).
  [[nodiscard]] schedule generate(int pp, int microbatches) const;
  int virtual_stages = 2;  ///< stages per rank
  friend constexpr bool operator==(const looped_bfs&, const looped_bfs&) = default;
  void hash_append(hasher& h) const { append_all(h, name, virtual_stages); }
};

/// The schedule name a policy prints as: its family's `name`.
template <class Policy>
requires requires { Policy::requires_split_backward; }
[[nodiscard]] constexpr std::string_view name_of(const Policy&) noexcept { return Policy::name; }

/// GPipe order. Preconditions: pp >= 1, microbatches >= 1 (else invalid_argument). Pure; O(pp * M).
[[nodiscard]] inline schedule generate(const gpipe&, int pp, int microbatches) {
  detail::check_basic("gpipe", pp, microbatches);
  auto s = detail::make_empty("gpipe", pp, pp, microbatches, stage_layout::loop);
  for (int r = 0; r < pp; ++r) {
    auto& ops = s.ranks[static_cast<std::size_t>(r)];
    for (int mb = 0; mb < microbatches; ++mb) ops.push_back(F(r, mb));
    for (int mb = 0; mb < microbatches; ++mb) ops.push_back(B(r, mb));
  }
  assert_deadlock_free(s, "pipeline::generate(gpipe)");
  return s;
}

/// 1F1B order (PyTorch Schedule1F1B's pipeline order; Megatron-LM's non-interleaved schedule).
/// Preconditions as gpipe. Pure; O(pp * M).
[[nodiscard]] inline schedule generate(const one_f_one_b&, int pp, int microbatches) {
  detail::check_basic("1f1b", pp, microbatches);
  auto s = detail::make_empty("1f1b", pp, pp, microbatches, stage_layout::loop);
  const auto table = detail::schedule_table(microbatches, 1, microbatches);
  for (int r = 0; r < pp; ++r)
    s.ranks[static_cast<std::size_t>(r)] =
        detail::one_f_one_b_rank(pp, 1, r, microbatches, table, std::min(pp - 1 - r, microbatches), false, 0);
  assert_deadlock_free(s, "pipeline::generate(1f1b)");
  return s;
}

/// The micro-batch group size an interleaved policy resolves to for (pp, M), after its rule's checks.
/// Throws invalid_argument naming the broken rule.
[[nodiscard]] inline int resolved_group_size(const interleaved_1f1b& p, int pp, int microbatches) {
  if (p.rule == group_rule::pytorch) {
    const int g = detail::pytorch_group_size("interleaved-1f1b", pp, microbatches);
    if (p.group_size != 0 && p.group_size != g)
      throw_error<invalid_argument>(
          "pipeline interleaved-1f1b: PyTorch's rule fixes the group size to {} for pp={}, microbatches={}, "
          "but group_size={} was given; expected 0 or {}, or rule = group_rule::megatron for a group size "
          "of your choice",
          g, pp, microbatches, p.group_size, g);
    return g;
  }
  return detail::megatron_group_size("interleaved-1f1b", pp, microbatches, p.group_size);
}

/// Interleaved 1F1B: stage c*pp + r is rank r's chunk c. Rank r runs min((v-1)*g + 2*(pp-1-r), v*M)
/// warm-up forwards, then F/B pairs in Megatron's schedule-table order. Preconditions: pp >= 1,
/// microbatches >= 1, virtual_stages >= 1, and the group-size rule; each broken one is named in the
/// invalid_argument thrown. Pure; O(pp * v * M).
[[nodiscard]] inline schedule generate(const interleaved_1f1b& p, int pp, int microbatches) {
  detail::check_basic("interleaved-1f1b", pp, microbatches);
  detail::check_virtual("interleaved-1f1b", p.virtual_stages);
  const int v = p.virtual_stages;
  const int g = resolved_group_size(p, pp, microbatches);
  auto s = detail::make_empty("interleaved-1f1b", pp, pp * v, microbatches, stage_layout::loop);
  const auto table = detail::schedule_table(microbatches, v, g);
  for (int r = 0; r < pp; ++r) {
    const int warmup = std::min((v - 1) * g + 2 * (pp - 1 - r), v * microbatches);
    s.ranks[static_cast<std::size_t>(r)] =
        detail::one_f_one_b_rank(pp, v, r, microbatches, table, warmup, false, 0);
  }
  assert_deadlock_free(s, "pipeline::generate(interleaved-1f1b)");
  return s;
}

/// PyTorch's ScheduleLoopedBFS: rank r runs F of stages r, r+pp, ... (each over micro-batches 0..M-1),
/// then B of the same stages in reverse (each over micro-batches M-1..0). Preconditions: pp >= 1,
/// microbatches >= 1, virtual_stages >= 1 (invalid_argument naming the broken one); any M, as PyTorch.
/// Pure; O(pp * v * M).
[[nodiscard]] inline schedule generate(const looped_bfs& p, int pp, int microbatches) {
  detail::check_basic("looped-bfs", pp, microbatches);
  detail::check_virtual("looped-bfs", p.virtual_stages);
  const int v = p.virtual_stages;
  auto s = detail::make_empty("looped-bfs", pp, pp * v, microbatches, stage_layout::loop);
  for (int r = 0; r < pp; ++r) {
    auto& ops = s.ranks[static_cast<std::size_t>(r)];
    ops.reserve(2 * static_cast<std::size_t>(v) * static_cast<std::size_t>(microbatches));
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < microbatches; ++mb) ops.push_back(F(c * pp + r, mb));
    for (int c = v - 1; c >= 0; --c)
      for (int mb = microbatches - 1; mb >= 0; --mb) ops.push_back(B(c * pp + r, mb));
  }
  assert_deadlock_free(s, "pipeline::generate(looped-bfs)");
  return s;
}

// The member form of each family's generator (declared in the class, defined once the free ones exist).
inline schedule gpipe::generate(int pp, int microbatches) const {
  return pipeline::generate(*this, pp, microbatches);
}
inline schedule one_f_one_b::generate(int pp, int microbatches) const {
  return pipeline::generate(*this, pp, microbatches);
}
inline schedule interleaved_1f1b::generate(int pp, int microbatches) const {
  return pipeline::generate(*this, pp, microbatches);
}
inline schedule looped_bfs::generate(int pp, int microbatches) const {
  return pipeline::generate(*this, pp, microbatches);
}

}  // namespace hetmesh::pipeline

template <>
struct fmt::formatter<hetmesh::pipeline::group_rule> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(hetmesh::pipeline::group_rule r, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}",
                              r == hetmesh::pipeline::group_rule::megatron ? "megatron" : "pytorch");
  }
};

template <>
struct fmt::formatter<hetmesh::pipeline::gpipe> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::gpipe& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", hetmesh::pipeline::name_of(p));
  }
};

template <>
struct fmt::formatter<hetmesh::pipeline::one_f_one_b> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::one_f_one_b& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "{}", hetmesh::pipeline::name_of(p));
  }
};

template <>
struct fmt::formatter<hetmesh::pipeline::interleaved_1f1b> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::interleaved_1f1b& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "interleaved-1f1b(virtual_stages={}, group_size={}, rule={})",
                              p.virtual_stages, p.group_size, p.rule);
  }
};

template <>
struct fmt::formatter<hetmesh::pipeline::looped_bfs> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::pipeline::looped_bfs& p, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(ctx.out(), "looped-bfs(virtual_stages={})", p.virtual_stages);
  }
};
