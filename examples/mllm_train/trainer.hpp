// SPDX-License-Identifier: Apache-2.0
// The mllm_train example's trainer: everything a user writes on top of train::system to train the
// multimodal model (model.hpp) on the example's data (data.hpp). Per step: the next batch from the data
// plane (hosts.hpp: read locally, or the metadata from data-plane hosts), a pure plan, this rank's share
// of the step under delivery by plan (the documents and encoder items its micro-batches and encoder shards
// read, taken locally or received from the hosts), one run on it (encoders in the LLM pipeline, ring
// attention, gradient reduction, Adam), the gathered report; a checkpoint through the library (train::capture
// of the model's tensors by global id and tensor-parallel block and of the optimizer's state, the data
// position as a blob; train::save_checkpoint or, asynchronously, train::checkpoint_writer) after every
// --checkpoint-every steps when asked, and a verified resume from the newest one under any layout
// (train::restore reshards).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <hetmesh/core/cpu_time.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/run/agreement.hpp>
#include <hetmesh/train/checkpoint.hpp>
#include <hetmesh/train/checkpoint_state.hpp>
#include <hetmesh/train/train.hpp>
#include <hetmesh/train/zero.hpp>

#include "mllm_train/data.hpp"
#include "mllm_train/hosts.hpp"
#include "mllm_train/model.hpp"

namespace mllm {

struct trainer_options {
  int steps = 30;                  ///< train until this step
  std::filesystem::path data_dir;  ///< where make_sources wrote the sources
  std::filesystem::path ckpt_dir;  ///< where checkpoints go (none when empty)
  int ckpt_every = 1;       ///< checkpoint after every step s with (s + 1) % ckpt_every == 0, and the last
  bool ckpt_async = false;  ///< write checkpoints on a background thread (train::checkpoint_writer)
  std::string layout;       ///< the layout saved in each checkpoint's manifest (for people and tools)
  bool resume = false;      ///< continue from ckpt_dir
  float lr = 3e-3F;         ///< Adam's learning rate
  std::uint64_t seed = 7;   ///< the model's initialisation
  bool zero = false;        ///< ZeRO-1: Adam's moments sharded over each group's ranks (--zero 1)
};

/// The example's optimizer, Adam, replicated or under ZeRO-1 by a run-time value (one train::system::run
/// instantiation for both): a train::sharded_optimizer, so the system hands it each parameter group with
/// the group's data-parallel communicator. Replicated, it sums the gradients over the group (in rank order
/// when reproducible, as the system's own reduction does) and steps every tensor; under ZeRO-1 it is
/// train::zero1, which reduce-scatters, steps its shard and all-gathers the parameters.
struct optimizer {
  /// Marks the type as sharded (train::sharded_optimizer): the system calls step() per group.
  using is_sharded_optimizer = void;
  /// The parameters' element type.
  using value_type = float;

  bool zero = false;                                             ///< ZeRO-1, else replicated Adam
  hetmesh::train::adam<float> replicated;                        ///< the replicated optimizer
  hetmesh::train::zero1<hetmesh::train::adam<float>> sharded{};  ///< ZeRO-1 over the same Adam settings

  /// The optimizer's state bytes on this rank (Adam's moments, or this rank's shard of them).
  [[nodiscard]] std::int64_t state_bytes() const {
    return zero ? sharded.state_bytes() : hetmesh::train::optimizer_state_bytes(replicated);
  }
  /// The checkpoint hook (train::saves_optimizer_state): the active optimizer's state for tensors `ts`.
  void save_state(std::span<const hetmesh::train::checkpoint_tensor<float>> ts,
                  hetmesh::train::rank_snapshot<float>& s) const {
    if (zero)
      hetmesh::train::save_optimizer_state(sharded, ts, s);
    else
      hetmesh::train::save_optimizer_state(replicated, ts, s);
  }
  /// The restore hook (train::loads_optimizer_state): the active optimizer's state for `ts` from `src`,
  /// whatever layout saved it (ZeRO-1 takes whole-tensor moments and slices them at its next step).
  template <class S>
  void load_state(std::span<const hetmesh::train::checkpoint_tensor<float>> ts, const S& src) {
    if (zero)
      hetmesh::train::load_optimizer_state(sharded, ts, src);
    else
      hetmesh::train::load_optimizer_state(replicated, ts, src);
  }
  /// One step of a parameter group over its data-parallel ranks `c`. Collective over c.
  template <class C, class M, class Params, class Grads>
  void step(C& c, const M& mem, Params&& parameters, Grads&& gradients, bool in_rank_order) {
    if (zero) {
      sharded.step(c, mem, parameters, gradients, in_rank_order);
      return;
    }
    for (auto g : gradients) hetmesh::train::sum_over_ranks(c, mem, std::span<float>(g), in_rank_order);
    replicated(parameters, gradients);
  }
};

/// What the trainer hands the caller after each step (on every rank).
struct step_result {
  std::int64_t step = 0;
  const hetmesh::train::step_layout* plan = nullptr;
  const hetmesh::train::step_report* report = nullptr;
  double plan_ms = 0;
  double plan_cpu_s = 0;  ///< thread CPU seconds of sys.plan() and the rank's share (delivery by plan),
                          ///< summed over the world's ranks
  multimodal_model<float>* model = nullptr;  ///< this rank's model (gradients of this step still in place)
  const hetmesh::model::step_batch* batch = nullptr;  ///< the step's batch
  const step_source* data = nullptr;  ///< the step source (this step's encoder inputs); null with hosts
  /// Waits until this step's checkpoint is committed on every rank (collective over the trainers; a
  /// no-op without --async-checkpoint, whose save returns committed). Call it on every rank or none.
  std::function<void()> wait_checkpoint{};
};

/// This rank's share of the checkpoint after step `step` (train::capture of the model's tensors with their
/// tensor-parallel blocks and the optimizer's state, replicated or ZeRO-1), the "step" counter and the data
/// position after it as the "data" blob (the data room's checkpoint JSON; every trainer holds the same).
template <class Feed>
hetmesh::train::rank_snapshot<float> checkpoint_snapshot(multimodal_model<float>& m, const optimizer& opt,
                                                         Feed& data, std::int64_t step) {
  auto s = hetmesh::train::capture(m.sharded_tensors(), opt);
  s.counters["step"] = step;
  const std::string text = data.source()->save_text();
  const auto* bytes = reinterpret_cast<const std::byte*>(text.data());
  s.blobs["data"] = std::vector<std::byte>(bytes, bytes + text.size());
  return s;
}

/// Where train() starts: without --resume, step 0 (refusing a directory that already holds a checkpoint: it
/// would be overwritten); with it, the verified checkpoint `latest` names under `o.ckpt_dir`, whatever
/// layout saved it (train::load_checkpoint, then train::restore resharding into this rank's blocks and
/// optimizer state, and the data position from its "data" blob). Collective over `world`: one rank's error
/// fails every rank (run::agree_on_failure).
template <class Comm, class Feed>
void resume_from(Comm& world, const trainer_options& o, Feed& data, multimodal_model<float>& model,
                 optimizer& opt) {
  if (o.ckpt_dir.empty()) return;
  const std::string root = o.ckpt_dir.string();
  if (!o.resume) {
    if (const auto dir = hetmesh::train::latest_checkpoint(root))
      throw std::runtime_error("checkpoint: '" + root + "' already holds a checkpoint (" +
                               std::filesystem::path(*dir).filename().string() +
                               "); pass --resume to continue it, or choose another --checkpoint-dir");
    return;
  }
  const auto reader = hetmesh::train::load_checkpoint(world, root);
  std::exception_ptr failure;
  try {
    const auto where = "'" + reader.directory() + "' blob 'data'";
    const auto step = reader.counter("step");
    const auto blob = reader.blob("data");
    if (!step || !blob)
      throw std::runtime_error("resume: '" + reader.directory() + "' has no step or data blob");
    hetmesh::train::restore(reader, model.sharded_tensors(), opt);
    data.source()->load_text(std::string_view(reinterpret_cast<const char*>(blob->data()), blob->size()),
                             where);
    if (data.step() != *step + 1)
      throw std::runtime_error("resume: " + where + " is the data position of step " +
                               std::to_string(data.step()) + "; the model was saved after step " +
                               std::to_string(*step));
  } catch (...) {
    failure = std::current_exception();
  }
  hetmesh::run::agree_on_failure(world, failure, "resume");
}

/// Trains the model of `mc` on the steps of `data` over the trainers of `sys` under its policies, calling
/// `on_step` after every step. Collective over the trainers (and the hosts `data` receives from).
template <class System, class Feed>
void train(System& sys, Feed& data, const config& mc, const trainer_options& o,
           const std::function<void(const step_result&)>& on_step) {
  auto& world = sys.world();
  optimizer opt{.zero = o.zero, .replicated = {.lr = o.lr}, .sharded = {.inner = {.lr = o.lr}}};
  // The model first: the stages, tensor-parallel blocks and experts this rank holds are the system's
  // split, known before any plan.
  multimodal_model<float> model(mc, o.seed, sys.split());
  resume_from(world, o, data, model, opt);
  hetmesh::train::checkpoint_writer writer;
  const hetmesh::train::checkpoint_options saving{.layout = o.layout};
  for (std::int64_t step = data.step(); step < o.steps; ++step) {
    const auto batch = data.next();
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = hetmesh::thread_cpu_seconds();
    // The encoders' heads come as a declared value (system_options::encoder_sp.heads, run_policies.hpp):
    // the data-plane hosts, which hold no model, plan the same steps. run() checks them against the
    // encoders' attention_heads().
    const auto plan = sys.plan(batch);
    const double plan_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // Delivery by plan: this rank runs on the documents and encoder items the plan routes to it.
    const auto routes = sys.delivery(plan, batch);
    const auto got = data.share(step, routes, batch);
    const auto share = hetmesh::train::share_of(plan, batch, got);
    double plan_cpu_s = hetmesh::thread_cpu_seconds() - c0;
    // Every rank plans (the plan is decentralised); the library's overhead counts each rank's planning.
    hetmesh::comm::all_reduce(world, std::span<double>(&plan_cpu_s, 1), hetmesh::comm::reduce_op::sum);
    const auto stats =
        sys.run(plan, share, model.llm, opt,
                hetmesh::train::bind_encoder(
                    model.vision, delivered_input<float>(got, batch, vision_index, data.width(vision_index))),
                hetmesh::train::bind_encoder(
                    model.audio, delivered_input<float>(got, batch, audio_index, data.width(audio_index))));
    const auto report = hetmesh::train::gather_report(world, stats);
    if (!o.ckpt_dir.empty() && ((step + 1) % o.ckpt_every == 0 || step + 1 == o.steps)) {
      // Crash-consistent (docs/checkpoint.md): a kill at any point leaves the previous checkpoint whole.
      if (o.ckpt_async)
        writer.save_async(world, o.ckpt_dir.string(), step, checkpoint_snapshot(model, opt, data, step),
                          saving);
      else
        (void)hetmesh::train::save_checkpoint(world, o.ckpt_dir.string(), step,
                                              checkpoint_snapshot(model, opt, data, step), saving);
    }
    on_step({step, &plan, &report, plan_ms, plan_cpu_s, &model, &batch, data.source(), [&] {
               if (writer.pending()) writer.wait(world);
             }});
  }
  if (!o.ckpt_dir.empty())
    writer.wait(world);  // the last checkpoint is committed (and any rank's error thrown) before returning
}

}  // namespace mllm
