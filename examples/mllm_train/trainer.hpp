// SPDX-License-Identifier: Apache-2.0
// The mllm_train example's trainer: everything a user writes on top of train::system to train the
// multimodal model (model.hpp) on the example's data (data.hpp). Per step: the next batch from the data
// plane (hosts.hpp: read locally, or the metadata from data-plane hosts), a pure plan, this rank's share
// of the step under delivery by plan (the documents and encoder items its micro-batches and encoder shards
// read, taken locally or received from the hosts), one run on it (encoders in the LLM pipeline, ring
// attention, gradient reduction, Adam), the gathered report; a checkpoint (each rank its tensors and Adam
// moments by tensor id, rank 0 the data position) after every step when asked, and a resume from it.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <hetmesh/core/cpu_time.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/train.hpp>

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

namespace ckpt_io {
inline void put(std::ostream& o, std::int64_t x) { o.write(reinterpret_cast<const char*>(&x), sizeof x); }
inline std::int64_t get(std::istream& i) {
  std::int64_t x = 0;
  i.read(reinterpret_cast<char*>(&x), sizeof x);
  return x;
}
inline void put(std::ostream& o, const float* p, std::size_t n) {
  o.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(float)));
}
inline void get(std::istream& i, float* p, std::size_t n) {
  i.read(reinterpret_cast<char*>(p), static_cast<std::streamsize>(n * sizeof(float)));
}
}  // namespace ckpt_io

/// Writes this rank's tensors and their Adam moments (by tensor id) after `step`, atomically.
inline void save_rank(const std::filesystem::path& file, std::int64_t step, multimodal_model<float>& m,
                      hetmesh::train::adam<float>& opt) {
  const auto tmp = file.string() + ".tmp";
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    ckpt_io::put(o, step);
    for (auto& t : m.tensors()) {
      auto& s = opt.moments(t.value);
      ckpt_io::put(o, t.id);
      ckpt_io::put(o, static_cast<std::int64_t>(t.value.size()));
      ckpt_io::put(o, s.t);
      for (const float* p : {t.value.data(), s.m.data(), s.v.data()}) ckpt_io::put(o, p, t.value.size());
    }
    if (!o) throw std::runtime_error("checkpoint: cannot write " + tmp);
  }
  std::filesystem::rename(tmp, file);
}

/// Reads what save_rank wrote into a model of the same split; returns the step it was saved after.
inline std::int64_t load_rank(const std::filesystem::path& file, multimodal_model<float>& m,
                              hetmesh::train::adam<float>& opt) {
  std::ifstream i(file, std::ios::binary);
  if (!i) throw std::runtime_error("resume: no checkpoint " + file.string());
  const auto step = ckpt_io::get(i);
  for (auto& t : m.tensors()) {
    auto& s = opt.moments(t.value);
    if (ckpt_io::get(i) != t.id || ckpt_io::get(i) != static_cast<std::int64_t>(t.value.size()))
      throw std::runtime_error("resume: " + file.string() + " holds another model split");
    s.t = ckpt_io::get(i);
    for (float* p : {t.value.data(), s.m.data(), s.v.data()}) ckpt_io::get(i, p, t.value.size());
  }
  if (!i) throw std::runtime_error("resume: " + file.string() + " is truncated");
  return step;
}

/// Trains the model of `mc` on the steps of `data` over the trainers of `sys` under its policies, calling
/// `on_step` after every step. Collective over the trainers (and the hosts `data` receives from).
template <class System, class Feed>
void train(System& sys, Feed& data, const config& mc, const trainer_options& o,
           const std::function<void(const step_result&)>& on_step) {
  auto& world = sys.world();
  std::optional<multimodal_model<float>> model;
  hetmesh::train::adam<float> opt{.lr = o.lr};
  const auto rank_file = o.ckpt_dir / ("rank-" + std::to_string(world.rank()) + ".bin");
  if (o.resume) data.source()->load(o.ckpt_dir / "data.ckpt");
  for (std::int64_t step = data.step(); step < o.steps; ++step) {
    const auto batch = data.next();
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = hetmesh::thread_cpu_seconds();
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
    if (!model) {  // the split is the schedule's, known once a plan exists
      model.emplace(mc, o.seed, plan.pipeline.num_stages, sys.local_stages(plan));
      if (o.resume && load_rank(rank_file, *model, opt) + 1 != step)
        throw std::runtime_error("resume: the model checkpoint and the data position disagree");
    }
    const auto stats = sys.run(
        plan, share, model->llm, opt,
        hetmesh::train::bind_encoder(
            model->vision, delivered_input<float>(got, batch, vision_index, data.width(vision_index))),
        hetmesh::train::bind_encoder(
            model->audio, delivered_input<float>(got, batch, audio_index, data.width(audio_index))));
    const auto report = hetmesh::train::gather_report(world, stats);
    if (!o.ckpt_dir.empty()) {
      std::filesystem::create_directories(o.ckpt_dir);
      save_rank(rank_file, step, *model, opt);
      hetmesh::comm::barrier(world);  // every rank's tensors are on disk before the data position moves on
      if (world.rank() == 0) data.source()->save(o.ckpt_dir / "data.ckpt");
      hetmesh::comm::barrier(world);
    }
    on_step({step, &plan, &report, plan_ms, plan_cpu_s, &*model, &batch, data.source()});
  }
}

}  // namespace mllm
