// SPDX-License-Identifier: Apache-2.0
// example_mllm_train's runs under compiled policies (runs.hpp's entry points are built from these): one
// rank's run under one train::system type, and the choice of schedule and encoder placement by the flags
// for a given partition and balancer.
#pragma once

#include <signal.h>

#include <algorithm>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/train.hpp>

#include "mllm_train/hosts.hpp"
#include "mllm_train/model_instances.hpp"
#include "mllm_train/options.hpp"
#include "mllm_train/report.hpp"
#include "mllm_train/trainer.hpp"

namespace mllm {

/// --check-parity: train::check_parity of the step's batch from the model's initial parameters (the
/// distributed step of `sys` against the library's 1-rank reference); prints the verdict on rank 0.
/// Returns 0 when it passed, else 1. Collective over the trainers.
template <class System>
int check_step_parity(System& sys, const step_result& r, const config& mc, std::uint64_t seed) {
  const auto make = [&](const hetmesh::train::model_split& sp) { return sharded_model<float>(mc, seed, sp); };
  const auto verdict =
      hetmesh::train::check_parity(sys, *r.batch, make, {.gradient = 2e-5, .loss = 1e-5},
                                   r.data->input<float>(vision_index), r.data->input<float>(audio_index));
  if (sys.world().rank() == 0) fmt::print("step {}: {}\n", r.step, verdict);
  return verdict.passed ? 0 : 1;
}

/// Prints the run's layout (rank 0): the mesh, the pipeline, the pool and its family, ZeRO, and each
/// family of groups the system derived (world ranks; Megatron's groups for its order).
template <class System>
void print_layout(const System& sys, const options& o) {
  const auto& l = sys.layout();
  fmt::print("layout: {} ranks = tp {} x pp {} x pool {} ({}{}), ep {} inside, ZeRO-{}; {}\n", l.world(),
             l.tp(), o.pp, l.pool(), o.partition, o.encoder == "separate" ? ", separate encoder pool" : "",
             l.ep(), o.zero, l.mesh());
  const char* names[] = {"tp", "pool", "pp", "slice", "ep"};
  for (int f = 0; f < 5; ++f) {
    std::string groups;
    for (const auto& g : l.family(f)) groups += fmt::format(" [{}]", fmt::join(g, " "));
    if (l.family(f).front().size() > 1) fmt::print("  {:>5} groups:{}\n", names[f], groups);
  }
}

/// The layout a checkpoint is saved under, as its manifest records it ("tp 2 pp 2 pool 2 ep 2 zero 1
/// partition hdp schedule 1f1b encoder joint ranks 8").
template <class System>
std::string layout_text(const System& sys, const options& o) {
  const auto& l = sys.layout();
  return fmt::format("tp {} pp {} pool {} ep {} zero {} partition {} schedule {} encoder {} ranks {}", l.tp(),
                     o.pp, l.pool(), l.ep(), o.zero, o.partition, o.schedule, o.encoder, l.world());
}

/// One rank's whole run under train::system<Partition, reference attention, Comm, Balancer, Schedule,
/// Placement>: the trainer, the parity check at step 0 (--check-parity), the per-step line and the
/// reports (rank 0); or, on the last --hosts ranks, a data-plane host's run. Returns the exit status (1:
/// parity failed).
template <class Comm, class Partition, class Balancer, class Schedule, class Placement>
int run_policies(Comm& world, const options& o, const config& mc, const data_config& dc, Partition partition,
                 Balancer balancer, Schedule schedule, Placement placement) {
  using system_t = hetmesh::train::system<Partition, hetmesh::model::reference_attention, Comm, Balancer,
                                          Schedule, Placement>;
  const hetmesh::train::pipeline_config<Schedule, Placement> pc{o.pp, schedule, placement};
  hetmesh::train::system_options so{.reproducible = true};
  so.mesh.tp = o.tp;  // Megatron's order tp-cp-ep-dp-pp; experts split over tp too (etp = tp)
  so.mesh.ep = o.ep;
  // The encoders' heads as a declared value (the hosts plan without the model); the encoders declare the same
  // (attention_heads()), which run() checks against the plan's groups.
  so.encoder_sp.heads = mc.enc_heads;
  // With data-plane hosts (--hosts H), the last H ranks serve the data and the others train.
  const bool host = world.rank() >= world.size() - o.hosts;
  Comm trainers = hetmesh::comm::split(world, host ? 1 : 0, world.rank());
  if (host) {
    serve_hosts(world, o.hosts, o.steps, o.data_dir, dc, partition, balancer, pc, so);
    return 0;
  }
  system_t sys(partition, balancer, pc, trainers, {}, so);
  if (trainers.rank() == 0) print_layout(sys, o);
  step_feed<Comm> data(world, o.hosts, o.data_dir, dc);
  const trainer_options to{.steps = o.steps,
                           .data_dir = o.data_dir,
                           .ckpt_dir = o.checkpoint_dir,
                           .ckpt_every = o.checkpoint_every,
                           .ckpt_async = o.async_checkpoint,
                           .layout = layout_text(sys, o),
                           .resume = o.resume,
                           .zero = o.zero == 1};
  run_log log(o.out, trainers.rank() == 0);
  int status = 0;
  bool first = true;
  train(sys, data, mc, to, [&](const step_result& r) {
    if (o.check_parity && first) status = check_step_parity(sys, r, mc, to.seed);
    first = false;
    log.step(r);
    if (o.kill_after >= 0 && r.step == o.kill_after) {  // a crash right after a checkpoint
      r.wait_checkpoint();
      ::raise(SIGKILL);
    }
  });
  if (trainers.rank() == 0) {
    log.finish();
    if (!o.report.empty()) log.write_report(o.report, o);
  }
  return status;
}

/// The run of `partition` and `balancer` under the schedule and encoder placement the flags name: 1F1B
/// with the joint encoders, and when `Full` with the first-stage or separate-pool ones too; zero-bubble
/// with the joint pipeline, and when `Full` interleaved 1F1B too (five systems when `Full`, two else).
/// Throws usage_error for the rest.
template <bool Full, class Comm, class Partition, class Balancer>
int run_schedules(Comm& world, const options& o, const config& mc, const data_config& dc, Partition partition,
                  Balancer balancer) {
  namespace pipeline = hetmesh::pipeline;
  auto by_schedule = [&](auto placement) -> int {
    using P = decltype(placement);
    if (o.schedule == "1f1b")
      return run_policies(world, o, mc, dc, partition, balancer, pipeline::one_f_one_b{}, placement);
    if constexpr (std::is_same_v<P, pipeline::colocated_encoder>) {
      if (o.schedule == "zero-bubble")
        return run_policies(world, o, mc, dc, partition, balancer, pipeline::zero_bubble{}, placement);
      if constexpr (Full) {
        if (o.schedule == "interleaved-1f1b")
          return run_policies(world, o, mc, dc, partition, balancer, pipeline::interleaved_1f1b{}, placement);
      }
    }
    throw usage_error(fmt::format("--schedule {} is not compiled with these flags", o.schedule));
  };
  if (o.encoder == "joint") return by_schedule(pipeline::colocated_encoder{});
  if constexpr (Full) {
    if (o.encoder == "separate") return by_schedule(pipeline::encoder_pool{.ranks = o.pp});
    if (o.encoder == "first-stage") return by_schedule(pipeline::encoder_on_first_stage{});
  }
  throw usage_error(fmt::format("--encoder {} is not compiled for this backend", o.encoder));
}

/// HDP over the pool: C tokens of activations per rank; a longer sequence gets a ring and offloads part
/// of its activations (ByteScale's solver, over the layers one pipeline rank holds).
inline hetmesh::seq::hdp<hetmesh::seq::selective_offload> hdp_partition(const options& o, const config& mc) {
  hetmesh::seq::hdp<hetmesh::seq::selective_offload> hdp{.capacity = 192};
  hdp.model.activation.layers = std::max(2, mc.blocks / o.pp);
  // The host link as a declared value (the default, 0, models no copy hiding: rings, never offload): on
  // loopback ranks the "host" store is memory too, so the copies hide.
  hdp.model.d2h_bandwidth = hdp.model.h2d_bandwidth = std::numeric_limits<double>::infinity();
  return hdp;
}

}  // namespace mllm
