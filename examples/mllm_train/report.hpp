// SPDX-License-Identifier: Apache-2.0
// example_mllm_train's reporting: the line per step (loss, tokens, the plan, measured busy time and its
// imbalance, the modelled step time), the modelled step (the pipeline simulator over each pipeline's
// token loads, with per-(action type, stage) costs T(tokens) = a t^2 + b t + c fitted to the first step's
// stage calls' thread CPU times by cost::fit_quadratic, since ranks share cores), the files of --out (a
// Chrome trace and SVG timelines of one measured step and its modelled twin, an SVG plot of loss and busy
// time over steps) and the --report JSON.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "mllm_train/options.hpp"

namespace mllm {

struct config;
struct step_result;

/// The per-step lines, the modelled steps and the files of one run (printing and files on the root rank).
/// Bodies in report.cpp.
class run_log {
 public:
  /// Writes the files of --out under `out` (none when empty); prints and writes only when `root`.
  run_log(std::filesystem::path out, bool root);
  ~run_log();
  run_log(const run_log&) = delete;
  run_log& operator=(const run_log&) = delete;

  /// Prints step r's line; the second step also writes the measured and modelled timelines.
  void step(const step_result& r);
  /// The library's share of all steps' thread CPU time (planning + run(), every rank).
  [[nodiscard]] double library_share() const noexcept;
  /// Prints the library's overhead and writes the loss plot.
  void finish() const;
  /// Writes the --report JSON (the run's flags `o`, then the series per step) to `path`.
  void write_report(const std::filesystem::path& path, const options& o) const;

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

}  // namespace mllm
