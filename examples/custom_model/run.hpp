// SPDX-License-Identifier: Apache-2.0
// example_custom_model's run under one layout: the system, the model built before the first plan, and then
// either train::check_parity on the first step (--check-parity) or a few training steps printing the loss.
// Each layout's train::system is compiled in a translation unit of its own (run_<layout>.cpp).
// docs/tutorial.md quotes this file (example_custom_model.tutorial checks the quotes).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

#include <fmt/format.h>

#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/train.hpp>

#include "custom_model/data.hpp"
#include "custom_model/model.hpp"

namespace custom {

/// The command line (main.cpp).
struct options {
  std::string layout = "cp";         ///< dp | cp | hdp | pipeline | ulysses
  std::string backend = "loopback";  ///< loopback threads, or MPI processes
  int ranks = 4;                     ///< loopback threads (under MPI: the world's size)
  int steps = 20;                    ///< training steps (without --check-parity)
  bool halo_off = false;             ///< the mutation: the mixer skips the halo exchange
  bool check_parity = false;         ///< compare one step with a 1-rank run and exit
};

inline constexpr shape kShape{};
inline constexpr std::uint64_t kModelSeed = 7;
inline constexpr std::uint64_t kDataSeed = 3;
inline constexpr std::int64_t kBatch = 8;  ///< samples per step

/// One rank's run of the model under train::system<Partition, reference attention, Comm,
/// family_placement, Schedule, Placement> with pipeline `pc`. Returns the exit status: 0, or 1 when
/// --check-parity failed. Collective over `world`.
template <class Comm, class Partition, class Schedule, class Placement>
int run_layout(Comm& world, const options& o, Partition partition,
               hetmesh::train::pipeline_config<Schedule, Placement> pc) {
  namespace train = hetmesh::train;
  using system_t = train::system<Partition, hetmesh::model::reference_attention, Comm,
                                 train::family_placement, Schedule, Placement>;
  system_t sys(partition, {}, pc, world);
  step_source data(kShape, kBatch, kDataSeed);
  const bool root = world.rank() == 0;
  if (o.check_parity) {
    const auto& batch = data.next();
    const auto make = [&](int stages, std::span<const int> local) {
      custom_model<float> m(kShape, kModelSeed, stages, local);
      m.llm.halo_off = o.halo_off;
      return m;
    };
    const auto verdict = train::check_parity(sys, batch, make, {.gradient = 2e-5, .loss = 1e-5},
                                             data.input<float>(kShape.patch_dim));
    if (root) fmt::print("--layout {}{}: {}\n", o.layout, o.halo_off ? " --halo-off" : "", verdict);
    if (root && !verdict.passed)
      std::fprintf(stderr, "example_custom_model: %s\n", fmt::format("{}", verdict).c_str());
    return verdict.passed ? 0 : 1;
  }
  // The model first: the stages this rank runs are known before any plan.
  custom_model<float> model(kShape, kModelSeed, sys.num_stages(), sys.local_stages());
  model.llm.halo_off = o.halo_off;
  train::adam<float> opt{.lr = 1e-2F};
  for (int step = 0; step < o.steps; ++step) {
    const auto& batch = data.next();
    const auto plan = sys.plan(batch, model.video);  // the encoder's attention_heads() size its groups
    const auto stats = sys.run(plan, batch, model.llm, opt,
                               train::bind_encoder(model.video, data.input<float>(kShape.patch_dim)));
    if (root)
      fmt::print("step {}: loss {:.6f} ({} targets, {} tokens, {} clips)\n", step, stats.loss, stats.targets,
                 stats.tokens, stats.encoder_items);
  }
  return 0;
}

}  // namespace custom
