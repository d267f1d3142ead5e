// SPDX-License-Identifier: Apache-2.0
// example_torch_train's run under one layout: the torch::nn model (model.hpp) built whole on every rank from
// the seed, this rank's pipeline stages and both encoders wrapped by the libtorch adapters
// (libtorch::backbone, libtorch::encoder: forward only, autograd for the backward, parameters in one flat
// buffer per stage), trained through train::system (attention blocks by libtorch::block_attention) on the
// data plane's steps (the mllm_train example's sources) with hetmesh's Adam. With --check-reference it
// compares step 0's gradients and every step's loss with the plain loop's (check.hpp). Each layout's
// train::system is compiled in a translation unit of its own (run_<layout>.cpp).
#pragma once

#include <algorithm>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hetmesh/libtorch/backbone_module.hpp>
#include <hetmesh/libtorch/block_attention.hpp>
#include <hetmesh/libtorch/encoder_module.hpp>
#include <hetmesh/model/stage.hpp>
#include <hetmesh/train/train.hpp>

#include "mllm_train/data.hpp"
#include "torch_train/check.hpp"
#include "torch_train/options.hpp"
#include "torch_train/reference.hpp"
#include "torch_train/stages.hpp"

namespace torch_train {

/// The mutation --mutate drop-output-grad: a thin wrapper around a library adapter that hands it a zero
/// output gradient (the backbone stage's from the next stage, the encoder's from the backbone) when `drop`
/// is set, and is the adapter otherwise. The check must fail with it.
template <class Adapter>
struct drop_output_grad : Adapter {
  using Adapter::Adapter;
  bool drop = false;  ///< zero the received output gradient

  /// The adapter's backward, with the output gradient zeroed when `drop`.
  template <class Ctx, class View, class T>
  void backward(const Ctx& ctx, const View& v, std::span<const T> gout, std::span<T> gin) {
    const std::vector<T> zero(drop ? gout.size() : 0, T(0));
    Adapter::backward(ctx, v, drop ? std::span<const T>(zero) : gout, gin);
  }
  /// The adapter's backward_input (zero-bubble schedules), likewise.
  template <class Ctx, class T>
  void backward_input(const Ctx& ctx, const hetmesh::model::micro_batch_view& mb, std::span<const T> gout,
                      std::span<T> gin) {
    const std::vector<T> zero(drop ? gout.size() : 0, T(0));
    Adapter::backward_input(ctx, mb, drop ? std::span<const T>(zero) : gout, gin);
  }
};

/// The backbone stages and the encoders of one rank, adapted.
using backbone_adapter = drop_output_grad<hetmesh::libtorch::backbone<backbone_stages_impl, value_type>>;
template <class Modality>
using encoder_adapter = drop_output_grad<hetmesh::libtorch::encoder<encoder_stage<Modality>, value_type>>;

/// This rank's parameters by their names in the whole model (check.hpp compares them by name).
inline void add_named(std::vector<std::pair<std::string, torch::Tensor>>& out, const std::string& prefix,
                      const torch::nn::Module& m) {
  for (const auto& p : m.named_parameters()) out.emplace_back(prefix + p.key(), p.value());
}

/// ", N documents on rings of up to R ranks" when the plan put documents above capacity on HDP rings.
inline std::string rings(const hetmesh::train::step_stats& st) {
  int n = 0, most = 0;
  for (const auto& r : st.reasons)
    if (r.kind == hetmesh::train::reason_kind::ring) {
      ++n;
      most = std::max(most, r.ranks);
    }
  return n == 0 ? std::string() : fmt::format(", {} documents on rings of up to {} ranks", n, most);
}

/// One rank's run of the model under train::system<Partition, libtorch::block_attention (the attention
/// kernel over torch ops), Comm,
/// family_placement, Schedule, Placement> with pipeline `pc`: o.steps steps, each loss printed on rank 0;
/// with `ref` (--check-reference) the comparison. Returns the exit status: 0, or 1 when the check failed.
/// Collective over `world`.
template <class Comm, class Partition, class Schedule, class Placement>
int run_layout(Comm& world, const options& o, const reference_run* ref, Partition partition,
               hetmesh::train::pipeline_config<Schedule, Placement> pc) {
  namespace train = hetmesh::train;
  using system_t = train::system<Partition, hetmesh::libtorch::block_attention, Comm, train::family_placement,
                                 Schedule, Placement>;
  torch::set_num_threads(1);  // per rank thread: the ranks are the parallelism
  system_t sys(partition, {}, pc, world, {}, {.reproducible = true});
  const bool root = world.rank() == 0;
  const auto dc = data_config(HETMESH_EXAMPLE_DATA_DIR);
  const shape s = model_shape(dc);
  mllm::step_source data(o.data_dir, dc);  // every rank reads the same steps; the plan says who runs what

  // The whole model from the seed on every rank; the adapters take this rank's stages and the encoders.
  multimodal whole(s);
  init_parameters(*whole, model_seed, dtype);
  backbone_stages stages(whole->backbone, sys.num_stages(), sys.local_stages());
  backbone_adapter llm(stages, {.stages = sys.num_stages()});
  encoder_adapter<hetmesh::model::vision_modality> vision(
      std::make_shared<encoder_stage<hetmesh::model::vision_modality>>(whole->vision, s, s.image_dim));
  encoder_adapter<hetmesh::model::audio_modality> audio(
      std::make_shared<encoder_stage<hetmesh::model::audio_modality>>(whole->audio, s, s.audio_dim));
  llm.drop = vision.drop = audio.drop = o.mutate == "drop-output-grad";
  std::vector<std::pair<std::string, torch::Tensor>> named;
  add_named(named, "llm.", *stages);
  add_named(named, "vision.", vision.module());
  add_named(named, "audio.", audio.module());

  train::adam<value_type> adam{.lr = static_cast<value_type>(o.lr)};
  std::vector<double> losses;
  bool passed = true;
  for (int step = 0; step < o.steps; ++step) {
    const auto batch = data.next();
    const auto plan = sys.plan(batch, vision, audio);
    const auto stats = sys.run(plan, batch, llm, adam,
                               train::bind_encoder(vision, data.input<value_type>(mllm::vision_index)),
                               train::bind_encoder(audio, data.input<value_type>(mllm::audio_index)));
    losses.push_back(stats.loss);
    if (root) {
      fmt::print("step {}: loss {:.9f}", step, stats.loss);
      if (ref != nullptr && static_cast<std::size_t>(step) < ref->losses.size())
        fmt::print(" (plain loop {:.9f})", ref->losses[static_cast<std::size_t>(step)]);
      fmt::print(" ({} tokens, {} micro-batches, {} encoder items{})\n", stats.tokens, stats.micro_batches,
                 stats.encoder_items, rings(stats));
    }
    if (ref == nullptr || step != 0) continue;
    // Step 0's gradients, reduced by the run and still in the flat buffers (the next run zeroes them).
    const auto g = compare_gradients(world, named, *ref);
    passed = passed && g.passed();
    if (root)
      fmt::print(
          "--layout {}: step 0 gradients: largest error {:.3e} of the largest gradient {:.3e} ({:.3e}; "
          "tolerance {:.0e}), {} parameters held by no rank: {}\n",
          o.layout, g.error, g.largest, g.error / g.largest, gradient_tolerance, g.missing,
          g.passed() ? "passed" : "FAILED");
    if (!g.passed() && g.local_error > gradient_tolerance * g.largest)
      std::fprintf(stderr, "example_torch_train: rank %d: parameter %s differs by %.3e\n", world.rank(),
                   g.worst.c_str(), g.local_error);
  }
  if (ref != nullptr) {
    const double d = loss_difference(losses, *ref);
    passed = passed && d <= loss_tolerance;
    if (root)
      fmt::print("--layout {}: losses of {} steps: largest difference {:.3e} (tolerance {:.0e}): {}\n",
                 o.layout, losses.size(), d, loss_tolerance, d <= loss_tolerance ? "passed" : "FAILED");
    if (root && !passed) std::fprintf(stderr, "example_torch_train: check against the plain loop FAILED\n");
  }
  return passed ? 0 : 1;
}

}  // namespace torch_train
