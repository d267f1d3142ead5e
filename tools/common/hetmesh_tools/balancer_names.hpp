// SPDX-License-Identifier: Apache-2.0
// Names (strings) to balancer families, for hetmesh-plan (balance, compare), the benchmarks and the tests
// that choose balancers by name. The library chooses balancers by type (hetmesh::balance::bytescale,
// gap_filling_hdp, ...); mapping names to them is the tools' business, so it lives here.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hetmesh/balance/balancers.hpp>
#include <hetmesh/balance/strategies.hpp>
#include <hetmesh/balance/strategy_plan.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/format.hpp>

namespace hetmesh::tools {

/// Any balancer family, for code that chooses by name at run time.
using balancer_policy = std::variant<balance::random_placement, balance::token_count, balance::static_dp_cp,
                                     balance::bytescale, balance::gap_filling_hdp>;

/// The names balancer_from_name accepts, in the order compare_strategies reports them.
inline constexpr std::array<std::string_view, 5> strategy_names{
    balance::random_placement::name, balance::token_count::name, balance::static_dp_cp::name,
    balance::bytescale::name, balance::gap_filling_hdp::name};

/// The parameters the tools set on whichever balancer a name picks (each balancer takes its own).
struct balancer_options {
  std::uint64_t seed = 1;    ///< random_placement's seed
  std::int64_t context = 0;  ///< static_dp_cp's context length (0: the longest sequence)
  int group_size = 0;        ///< gap_filling_hdp's locality group size (0: the whole pool)
};

/// The balancer `name` (one of strategy_names) denotes, with its parameters from `opt`. Throws
/// invalid_argument naming `who` for an unknown name.
[[nodiscard]] inline balancer_policy balancer_from_name(std::string_view name,
                                                        const balancer_options& opt = {},
                                                        std::string_view who = "balancer_from_name") {
  if (name == balance::random_placement::name) return balance::random_placement{.seed = opt.seed};
  if (name == balance::token_count::name) return balance::token_count{};
  if (name == balance::static_dp_cp::name) return balance::static_dp_cp{.context = opt.context};
  if (name == balance::bytescale::name) return balance::bytescale{};
  if (name == balance::gap_filling_hdp::name) return balance::gap_filling_hdp{.group_size = opt.group_size};
  throw_error<invalid_argument>("balance::{}: unknown strategy '{}'; expected one of {}", who, name,
                                fmt::join(strategy_names, ", "));
}

/// The plan of the balancer `name` denotes (balance::plan_strategy). Same errors as balancer_from_name
/// and the balancer. Pure.
[[nodiscard]] inline balance::strategy_plan plan_strategy(std::string_view name,
                                                          std::span<const seq::seq_desc> seqs,
                                                          const balance::strategy_config& cfg,
                                                          const balancer_options& opt = {}) {
  return std::visit([&](const auto& b) { return balance::plan_strategy(b, seqs, cfg); },
                    balancer_from_name(name, opt, "plan_strategy"));
}

/// The modelled result of the balancer `name` denotes (balance::run_strategy). Same errors. Pure.
[[nodiscard]] inline balance::strategy_result run_strategy(std::string_view name,
                                                           std::span<const seq::seq_desc> seqs,
                                                           const balance::strategy_config& cfg,
                                                           const balancer_options& opt = {}) {
  return std::visit([&](const auto& b) { return balance::run_strategy(b, seqs, cfg); },
                    balancer_from_name(name, opt, "run_strategy"));
}

/// Every balancer of `names` (default: all five) on the same batch, side by side. Same contract as
/// run_strategy.
[[nodiscard]] inline std::vector<balance::strategy_result> compare_strategies(
    std::span<const seq::seq_desc> seqs, const balance::strategy_config& cfg,
    const balancer_options& opt = {}, std::span<const std::string_view> names = strategy_names) {
  std::vector<balance::strategy_result> out;
  out.reserve(names.size());
  for (auto n : names) out.push_back(run_strategy(n, seqs, cfg, opt));
  return out;
}

}  // namespace hetmesh::tools

/// Prints the balancer the variant holds, as that balancer prints.
template <>
struct fmt::formatter<hetmesh::tools::balancer_policy> : hetmesh::empty_spec_formatter {
  auto format(const hetmesh::tools::balancer_policy& p, fmt::format_context& ctx) const
      -> decltype(ctx.out()) {
    return std::visit([&](const auto& q) { return hetmesh::format_to(ctx.out(), "{}", q); }, p);
  }
};
