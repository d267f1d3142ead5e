// SPDX-License-Identifier: Apache-2.0
// The mllm_train example's trainer: everything a user writes on top of train::system to train the
// multimodal model (model.hpp) on the example's data (data.hpp). Per step: the next batch from the data
// plane (hosts.hpp: read locally, or the metadata from data-plane hosts), a pure plan, this rank's share
// of the step under delivery by plan (the documents and encoder items its micro-batches and encoder shards
// read, taken locally or received from the hosts), one run on it (encoders in the LLM pipeline, ring
// attention, gradient reduction, Adam), the gathered report; a checkpoint (each rank its tensors and Adam
// moments by tensor id, rank 0 the data position and the manifest; checkpoint.hpp) after every step when
// asked, and a verified resume from the newest complete one.
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
#include <hetmesh/train/train.hpp>
#include <hetmesh/train/zero.hpp>

#include "mllm_train/checkpoint.hpp"
#include "mllm_train/data.hpp"
#include "mllm_train/hosts.hpp"
#include "mllm_train/model.hpp"

namespace mllm {

struct trainer_options {
  int steps = 30;                  ///< train until this step
  std::filesystem::path data_dir;  ///< where make_sources wrote the sources
  std::filesystem::path ckpt_dir;  ///< checkpoint after every step when not empty
  bool resume = false;             ///< continue from ckpt_dir
  float lr = 3e-3F;                ///< Adam's learning rate
  std::uint64_t seed = 7;          ///< the model's initialisation
  bool zero = false;               ///< ZeRO-1: Adam's moments sharded over each group's ranks (--zero 1)
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
};

/// The views save_rank writes of `m`'s tensors and their Adam moments (created zero for a tensor the
/// optimizer has not updated yet).
inline std::vector<ckpt::tensor_view> checkpoint_views(multimodal_model<float>& m,
                                                       hetmesh::train::adam<float>& opt) {
  std::vector<ckpt::tensor_view> out;
  for (auto& t : m.tensors()) {
    auto& s = opt.moments(t.value);
    out.push_back({t.id, t.value, s.m, s.v, s.t});
  }
  return out;
}

/// Restores `m`'s tensors and their Adam moments from `st` (ckpt::load_latest checked it). Throws
/// std::runtime_error when it holds another model split.
inline void restore_model(const ckpt::rank_state& st, multimodal_model<float>& m,
                          hetmesh::train::adam<float>& opt) {
  auto tensors = m.tensors();
  if (st.size() != tensors.size())
    throw std::runtime_error("resume: the checkpoint holds " + std::to_string(st.size()) +
                             " tensors for this rank; its model has " + std::to_string(tensors.size()) +
                             " (another model split)");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto& s = opt.moments(tensors[i].value);
    s.t = st.restore(i, tensors[i].id, tensors[i].value, s.m, s.v);
  }
}

/// Where train() resumes: the verified checkpoint `latest` names under `o.ckpt_dir` (this rank's part),
/// with the data position loaded into `data`; none without --resume. Refuses a run without --resume into
/// a directory that already holds a checkpoint (it would be overwritten step by step).
template <class Feed>
std::optional<ckpt::resume_point> resume_from(const trainer_options& o, Feed& data, int rank, int ranks) {
  if (o.ckpt_dir.empty()) return std::nullopt;
  if (!o.resume) {
    if (const auto name = ckpt::latest_name(o.ckpt_dir); !name.empty())
      throw std::runtime_error("checkpoint: '" + o.ckpt_dir.string() + "' already holds a checkpoint (" +
                               name + "); pass --resume to continue it, or choose another --checkpoint-dir");
    return std::nullopt;
  }
  auto from = ckpt::load_latest(o.ckpt_dir, rank, ranks);
  data.source()->load(from.data_file());
  if (data.step() != from.step + 1)
    throw std::runtime_error("resume: '" + from.data_file().string() + "' is the data position of step " +
                             std::to_string(data.step()) + "; the model was saved after step " +
                             std::to_string(from.step));
  return from;
}

/// Trains the model of `mc` on the steps of `data` over the trainers of `sys` under its policies, calling
/// `on_step` after every step. Collective over the trainers (and the hosts `data` receives from).
template <class System, class Feed>
void train(System& sys, Feed& data, const config& mc, const trainer_options& o,
           const std::function<void(const step_result&)>& on_step) {
  auto& world = sys.world();
  optimizer opt{.zero = o.zero, .replicated = {.lr = o.lr}, .sharded = {.inner = {.lr = o.lr}}};
  auto from = resume_from(o, data, world.rank(), world.size());
  // The model first: the stages, tensor-parallel blocks and experts this rank holds are the system's
  // split, known before any plan.
  multimodal_model<float> model(mc, o.seed, sys.split());
  if (from) restore_model(from->mine, model, opt.replicated);
  from.reset();
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
    if (!o.ckpt_dir.empty()) {  // crash-consistent (checkpoint.hpp): 'latest' moves after all is durable
      if (world.rank() == 0) ckpt::begin_save(o.ckpt_dir, step);
      hetmesh::comm::barrier(world);
      ckpt::save_rank(o.ckpt_dir, step, world.rank(), checkpoint_views(model, opt.replicated));
      hetmesh::comm::barrier(world);  // every rank's tensors are durable before the manifest names them
      if (world.rank() == 0)
        ckpt::commit_save(o.ckpt_dir, step, world.size(),
                          [&](const std::filesystem::path& p) { data.source()->save(p); });
      hetmesh::comm::barrier(world);
    }
    on_step({step, &plan, &report, plan_ms, plan_cpu_s, &model, &batch, data.source()});
  }
}

}  // namespace mllm
