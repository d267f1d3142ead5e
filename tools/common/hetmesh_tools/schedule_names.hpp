// SPDX-License-Identifier: Apache-2.0
// Names (strings) to pipeline schedule families, for the tools (hetmesh-plan pipeline / simulate) and the
// benchmarks and tests that loop over schedules by name. The library chooses schedules by type
// (hetmesh::pipeline::gpipe, zbv, ...); mapping names to them is the tools' business, so it lives here.
#pragma once

#include <array>
#include <string_view>
#include <variant>

#include <fmt/format.h>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/format.hpp>
#include <hetmesh/pipeline/dualpipe.hpp>
#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/schedule_family.hpp>

namespace hetmesh::tools {

/// Any schedule family, for code that chooses by name at run time.
using schedule_policy =
    std::variant<pipeline::gpipe, pipeline::one_f_one_b, pipeline::interleaved_1f1b, pipeline::zero_bubble,
                 pipeline::interleaved_zero_bubble, pipeline::zbv, pipeline::dualpipev, pipeline::looped_bfs>;

/// Every schedule name, in the order of schedule_policy's alternatives.
inline constexpr std::array<std::string_view, 8> schedule_names{pipeline::gpipe::name,
                                                                pipeline::one_f_one_b::name,
                                                                pipeline::interleaved_1f1b::name,
                                                                pipeline::zero_bubble::name,
                                                                pipeline::interleaved_zero_bubble::name,
                                                                pipeline::zbv::name,
                                                                pipeline::dualpipev::name,
                                                                pipeline::looped_bfs::name};

/// Generates the schedule of whichever family `p` holds: its `generate(pp, microbatches)`.
[[nodiscard]] inline pipeline::schedule generate(const schedule_policy& p, int pp, int microbatches) {
  return std::visit([&](const auto& q) { return q.generate(pp, microbatches); }, p);
}

/// Whether the family `p` holds needs split backward (its requires_split_backward).
[[nodiscard]] inline bool requires_split_backward(const schedule_policy& p) {
  return std::visit([](const auto& q) { return std::decay_t<decltype(q)>::requires_split_backward; }, p);
}

/// The policy a CLI name denotes: gpipe | 1f1b | interleaved-1f1b | zero-bubble |
/// interleaved-zero-bubble | zbv | dualpipev | looped-bfs. `virtual_stages` (0 = default 2) applies to
/// the interleaved ones and looped-bfs, `group_size` to both interleaved ones: 0 is PyTorch's rule; for
/// interleaved-1f1b a size picks Megatron-LM's rule with that microbatch_group_size_per_vp_stage.
/// Throws invalid_argument for unknown names and for parameters the named schedule does not take.
[[nodiscard]] inline schedule_policy policy_from_name(std::string_view name, int virtual_stages = 0,
                                                      int group_size = 0) {
  namespace pl = pipeline;
  const bool interleaved = name == pl::interleaved_1f1b::name || name == pl::interleaved_zero_bubble::name;
  const bool looped = name == pl::looped_bfs::name;
  if (!interleaved && !looped && name != pl::gpipe::name && name != pl::one_f_one_b::name &&
      name != pl::zero_bubble::name && name != pl::zbv::name && name != pl::dualpipev::name)
    throw_error<invalid_argument>(
        "pipeline: unknown schedule \"{}\"; expected one of gpipe, 1f1b, interleaved-1f1b, zero-bubble, "
        "interleaved-zero-bubble, zbv, dualpipev, looped-bfs",
        name);
  if (!interleaved && group_size != 0)
    throw_error<invalid_argument>(
        "pipeline {}: --group-size applies only to interleaved-1f1b and interleaved-zero-bubble", name);
  if (looped) return pl::looped_bfs{.virtual_stages = virtual_stages == 0 ? 2 : virtual_stages};
  const bool two_chunks = name == pl::zbv::name || name == pl::dualpipev::name;
  if (!interleaved && virtual_stages != 0 && !(two_chunks && virtual_stages == 2) &&
      !(!two_chunks && virtual_stages == 1))
    throw_error<invalid_argument>(
        "pipeline {}: --virtual {} does not apply; {} runs {} stage(s) per rank (use an interleaved schedule "
        "for more)",
        name, virtual_stages, name, two_chunks ? 2 : 1);
  const int v = virtual_stages == 0 ? 2 : virtual_stages;
  if (name == pl::gpipe::name) return pl::gpipe{};
  if (name == pl::one_f_one_b::name) return pl::one_f_one_b{};
  if (name == pl::zero_bubble::name) return pl::zero_bubble{};
  if (name == pl::zbv::name) return pl::zbv{};
  if (name == pl::dualpipev::name) return pl::dualpipev{};
  if (name == pl::interleaved_1f1b::name)
    return pl::interleaved_1f1b{.virtual_stages = v,
                                .group_size = group_size,
                                .rule = group_size == 0 ? pl::group_rule::pytorch : pl::group_rule::megatron};
  return pl::interleaved_zero_bubble{.virtual_stages = v, .group_size = group_size};
}

/// Makes a schedule from a CLI name and parameters: the entry point of `hetmesh-plan pipeline`.
/// Same errors as policy_from_name and the family's generator. Pure.
[[nodiscard]] inline pipeline::schedule make_schedule(std::string_view name, int pp, int microbatches,
                                                      int virtual_stages = 0, int group_size = 0) {
  return generate(policy_from_name(name, virtual_stages, group_size), pp, microbatches);
}

}  // namespace hetmesh::tools

/// Prints the family the variant holds, as that family prints.
template <>
struct fmt::formatter<hetmesh::tools::schedule_policy> : hetmesh::empty_spec_formatter {
  auto format(const hetmesh::tools::schedule_policy& p, fmt::format_context& ctx) const
      -> decltype(ctx.out()) {
    return std::visit([&](const auto& q) { return hetmesh::format_to(ctx.out(), "{}", q); }, p);
  }
};
