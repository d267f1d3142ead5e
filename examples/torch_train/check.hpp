// SPDX-License-Identifier: Apache-2.0
// example_torch_train's --check-reference: the distributed run against the plain loop (reference.hpp).
// Step 0's gradients: every parameter, on whichever ranks hold it, equals the plain loop's gradient within
// 1e-5 of the largest gradient of the model; every parameter of the model is held by some rank. Each
// step's loss: within 1e-4 of the plain loop's.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hetmesh/comm/collectives.hpp>

#include "torch_train/reference.hpp"

namespace torch_train {

/// Relative tolerance of step 0's gradients (of the largest gradient) and absolute tolerance of the losses.
inline constexpr double gradient_tolerance = 1e-5;
inline constexpr double loss_tolerance = 1e-4;

/// max |t| (0 for an empty tensor).
inline double max_abs(const torch::Tensor& t) { return t.numel() == 0 ? 0.0 : t.abs().max().item<double>(); }

/// What the comparison of step 0's gradients found, the same on every rank.
struct gradient_check {
  double error = 0;          ///< largest |distributed - plain| over every parameter element
  double largest = 0;        ///< largest |plain| over every parameter element
  double local_error = 0;    ///< this rank's largest error
  std::string worst;         ///< the parameter of this rank's largest error
  std::int64_t missing = 0;  ///< parameters of the model no rank held
  /// Whether it passed.
  [[nodiscard]] bool passed() const { return missing == 0 && error <= gradient_tolerance * largest; }
};

/// Compares the gradients of `local` (this rank's parameters by their names in the whole model, their .grad
/// after a step's run) with the plain loop's. Collective over `world`.
template <class Comm>
gradient_check compare_gradients(Comm& world, const std::vector<std::pair<std::string, torch::Tensor>>& local,
                                 const reference_run& ref) {
  gradient_check out;
  std::vector<double> held(ref.gradients.size(), 0.0);  // by the plain loop's (sorted) names
  for (const auto& [name, g] : ref.gradients) out.largest = std::max(out.largest, max_abs(g));
  for (const auto& [name, p] : local) {
    const auto it = ref.gradients.find(name);
    if (it == ref.gradients.end()) throw std::runtime_error("the plain loop has no parameter " + name);
    held[static_cast<std::size_t>(std::distance(ref.gradients.begin(), it))] = 1.0;
    const auto g = p.grad().defined() ? p.grad() : torch::zeros_like(p);
    const double e = max_abs(g - it->second);
    if (e > out.error) {
      out.error = e;
      out.worst = name;
    }
  }
  out.local_error = out.error;
  hetmesh::comm::all_reduce(world, std::span<double>(held), hetmesh::comm::reduce_op::max);
  hetmesh::comm::all_reduce(world, std::span<double>(&out.error, 1), hetmesh::comm::reduce_op::max);
  out.missing = std::count(held.begin(), held.end(), 0.0);
  return out;
}

/// The largest |loss - plain loop's| over the steps both ran.
inline double loss_difference(const std::vector<double>& losses, const reference_run& ref) {
  double d = 0;
  for (std::size_t i = 0; i < losses.size() && i < ref.losses.size(); ++i)
    d = std::max(d, std::abs(losses[i] - ref.losses[i]));
  return d;
}

}  // namespace torch_train
