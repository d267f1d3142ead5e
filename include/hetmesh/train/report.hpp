// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: what a step did on every rank, gathered: per-rank measured times (busy, forward,
// backward, the pipeline's wall time) and every rank's executed actions with their wall times, in the
// pipeline simulator's trace format (pipeline::timed_action), so a measured step and a modelled one
// (pipeline::simulate of the same schedule) can be laid side by side. Ranks start a step's pipeline
// after a barrier, so their timelines share an origin up to the barrier's skew. JSON and Chrome trace
// output: train/report_json.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "../comm/collectives.hpp"
#include "../config.hpp"
#include "../core/format.hpp"
#include "../pipeline/simulate.hpp"
#include "system.hpp"
#if HETMESH_SEPARATE_COMPILATION
#include "../comm/loopback.hpp"
#if HETMESH_COMPILED_MPI
#include "../comm/mpi.hpp"
#endif
#endif

namespace hetmesh::train {

/// A step's stats gathered from every rank of the world.
struct step_report {
  step_stats stats;                      ///< the step's reduced stats (loss, tokens, ...), this rank's times
  std::vector<double> busy_seconds;      ///< per world rank: time in compute actions
  std::vector<double> forward_seconds;   ///< per world rank: time in forward actions
  std::vector<double> backward_seconds;  ///< per world rank: time in backward actions
  std::vector<double> step_seconds;      ///< per world rank: the pipeline's wall time
  std::vector<double> cpu_busy_seconds;  ///< per world rank: thread CPU time in the stages and encoders
  std::vector<double> cpu_step_seconds;  ///< per world rank: thread CPU time of the whole run() call
  std::vector<double> cpu_comm_seconds;  ///< per world rank: thread CPU time moving bytes (step_stats)
  std::vector<double> library_cpu_seconds;          ///< per world rank: step_stats::library_cpu_seconds()
  std::vector<std::int64_t> parameter_bytes;        ///< per world rank: its parameters (step_stats)
  std::vector<std::int64_t> gradient_bytes;         ///< per world rank: its gradient tensors
  std::vector<std::int64_t> optimizer_state_bytes;  ///< per world rank: its optimizer state (1/P with zero1)
  std::vector<pipeline::timed_action> timeline;     ///< every rank's executed actions, by rank then time
  std::vector<pipeline::timed_action> cpu_actions;  ///< every rank's stage calls with thread CPU times

  /// The largest busy time: the measured step's critical rank.
  [[nodiscard]] double max_busy() const noexcept {
    return busy_seconds.empty() ? 0.0 : *std::max_element(busy_seconds.begin(), busy_seconds.end());
  }
  /// max / mean busy time (1 = perfectly balanced; 0 without ranks or work).
  [[nodiscard]] double imbalance() const noexcept { return imbalance_of(busy_seconds); }
  /// The largest thread CPU busy time.
  [[nodiscard]] double max_cpu_busy() const noexcept {
    return cpu_busy_seconds.empty() ? 0.0
                                    : *std::max_element(cpu_busy_seconds.begin(), cpu_busy_seconds.end());
  }
  /// max / mean thread CPU busy time.
  [[nodiscard]] double cpu_imbalance() const noexcept { return imbalance_of(cpu_busy_seconds); }
  /// The library's share of run()'s thread CPU time over all ranks: sum of library_cpu_seconds / sum of
  /// cpu_step_seconds (0 without work). Planning happens outside run(); callers that time it add it to both.
  [[nodiscard]] double library_share() const noexcept {
    double lib = 0, all = 0;
    for (std::size_t i = 0; i < cpu_step_seconds.size(); ++i) {
      lib += library_cpu_seconds[i];
      all += cpu_step_seconds[i];
    }
    return all > 0 ? lib / all : 0.0;
  }

 private:
  static double imbalance_of(const std::vector<double>& v) noexcept {
    double sum = 0, most = 0;
    for (double b : v) {
      sum += b;
      most = std::max(most, b);
    }
    return sum > 0 ? most * static_cast<double>(v.size()) / sum : 0.0;
  }
};

namespace detail {
/// Every rank's `mine`, in rank order, on every rank. Collective.
template <comm::communicator C>
std::vector<pipeline::timed_action> gather_actions(C& world,
                                                   const std::vector<pipeline::timed_action>& mine) {
  std::vector<double> flat;  // rank, stage, type, micro-batch, start, end per action
  flat.reserve(6 * mine.size());
  for (const auto& t : mine)
    flat.insert(flat.end(), {static_cast<double>(t.rank), static_cast<double>(t.what.stage),
                             static_cast<double>(static_cast<int>(t.what.type)),
                             static_cast<double>(t.what.microbatch), t.start, t.end});
  std::vector<pipeline::timed_action> out;
  for (const auto& part : comm::all_gather_vectors(world, std::span<const double>(flat)))
    for (std::size_t i = 0; i + 5 < part.size(); i += 6)
      out.push_back({static_cast<int>(part[i]),
                     pipeline::action{static_cast<int>(part[i + 1]),
                                      static_cast<pipeline::action_type>(static_cast<int>(part[i + 2])),
                                      static_cast<int>(part[i + 3])},
                     part[i + 4], part[i + 5]});
  return out;
}
}  // namespace detail

/// Gathers `s` (this rank's stats of the step) from every rank of `world`. Collective over the world;
/// every rank gets the whole report. Cost: one all-gather of 8 doubles and one of 3 integers per rank, and
/// two of action lists.
template <comm::communicator C>
[[nodiscard]] step_report gather_report(C& world, const step_stats& s) {
  step_report r;
  r.stats = s;
  const auto n = static_cast<std::size_t>(world.size());
  constexpr std::size_t k = 8;
  const double mine[k] = {s.busy_seconds,     s.forward_seconds,      s.backward_seconds,
                          s.step_seconds,     s.cpu_busy_seconds,     s.cpu_step_seconds,
                          s.cpu_comm_seconds, s.library_cpu_seconds()};
  std::vector<double> all(k * n);
  comm::all_gather(world, std::span<const double>(mine), std::span<double>(all));
  for (std::size_t i = 0; i < n; ++i) {
    r.busy_seconds.push_back(all[k * i]);
    r.forward_seconds.push_back(all[k * i + 1]);
    r.backward_seconds.push_back(all[k * i + 2]);
    r.step_seconds.push_back(all[k * i + 3]);
    r.cpu_busy_seconds.push_back(all[k * i + 4]);
    r.cpu_step_seconds.push_back(all[k * i + 5]);
    r.cpu_comm_seconds.push_back(all[k * i + 6]);
    r.library_cpu_seconds.push_back(all[k * i + 7]);
  }
  const std::int64_t bytes[3] = {s.parameter_bytes, s.gradient_bytes, s.optimizer_state_bytes};
  std::vector<std::int64_t> every(3 * n);
  comm::all_gather(world, std::span<const std::int64_t>(bytes), std::span<std::int64_t>(every));
  for (std::size_t i = 0; i < n; ++i) {
    r.parameter_bytes.push_back(every[3 * i]);
    r.gradient_bytes.push_back(every[3 * i + 1]);
    r.optimizer_state_bytes.push_back(every[3 * i + 2]);
  }
  r.timeline = detail::gather_actions(world, s.timeline);
  r.cpu_actions = detail::gather_actions(world, s.cpu_actions);
  return r;
}

// Compiled once (HETMESH_SEPARATE_COMPILATION): the report over the loopback communicator (and MPI's, with
// HETMESH_COMPILED_MPI). HETMESH_INSTANTIATE is `extern template` in every translation unit but the one of
// <hetmesh/src.hpp> (config.hpp).
#if HETMESH_SEPARATE_COMPILATION
HETMESH_INSTANTIATE step_report gather_report<comm::loopback::communicator>(comm::loopback::communicator&,
                                                                            const step_stats&);
#if HETMESH_COMPILED_MPI
HETMESH_INSTANTIATE step_report gather_report<comm::mpi::communicator>(comm::mpi::communicator&,
                                                                       const step_stats&);
#endif
#endif

}  // namespace hetmesh::train

template <>
struct fmt::formatter<hetmesh::train::step_report> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::step_report& r, FormatContext& ctx) const -> decltype(ctx.out()) {
    return hetmesh::format_to(
        ctx.out(),
        "report{{loss={:.6g}, tokens={}, ranks={}, busy max={:.3g}s (imbalance {:.3f}), "
        "CPU busy max={:.3g}s (imbalance {:.3f}), actions={}}}",
        r.stats.loss, r.stats.tokens, r.busy_seconds.size(), r.max_busy(), r.imbalance(), r.max_cpu_busy(),
        r.cpu_imbalance(), r.timeline.size());
  }
};
