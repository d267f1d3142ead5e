// SPDX-License-Identifier: Apache-2.0
// example_mllm_train: trains a small multimodal model (a vision and an audio encoder, a causal
// transformer backbone; model.hpp) on the example's data (data.hpp) through train::system, on loopback
// threads or MPI processes. Each step prints the loss, the tokens, a summary of the plan, the measured
// per-rank busy time and its imbalance, and the modelled step time of the same batch (the pipeline
// simulator, with costs calibrated on the first step's measured actions). The trainer itself is
// trainer.hpp; this file parses the command line and picks the compiled policies (runs.hpp: each group of
// train::system types is a translation unit of its own, run_*.cpp); report.cpp writes the reports.
//
// example_mllm_train [--steps N] [--ranks R] [--backend loopback|mpi] [--partition static-cp|ulysses|hdp|dp]
//   [--schedule 1f1b|gpipe|interleaved-1f1b|zero-bubble|zbv] [--encoder joint|first-stage|separate]
//   [--balancer bytescale|gap-filling|family] [--pp P] [--checkpoint-dir D] [--resume] [--report FILE.json]
//   [--check-parity] [--out DIR] [--data-dir D] [--kill-after K] [--hosts H] [--answer-only-loss]
//   [--tp T] [--ep E] [--zero 0|1] [--checkpoint-every N] [--async-checkpoint]
// --tp T splits the backbone's heads, MLP columns and vocabulary over T ranks (backbone.hpp); --ep E spreads
// the MoE layer's 4 experts (top-2; moe_mlp.hpp) over E ranks of the pool; --zero 1 shards Adam's moments
// over each parameter group's data-parallel ranks (train::zero1). The world is tp x pp x pool (Megatron's
// order tp-cp-ep-dp-pp), and rank 0 prints the layout and its groups first.
// --encoder separate gives each pipeline a pool of pp encoder-only ranks after its pp LLM ranks
// (pipeline::encoder_pool), so --ranks must be a multiple of 2 * pp. --hosts H adds H data-plane hosts
// after the --ranks trainers (hosts.hpp: they load the steps and send each trainer its routed share; the
// losses are those of the run without hosts); under MPI the world is then --ranks + H processes.
// --answer-only-loss writes image and audio captions with a loss mask (data_config::answer_only_loss: only
// the class and its tail count, as a fine-tuning mask counts only the answer) that the data plane carries
// to the loss.
// --checkpoint-dir D saves a checkpoint (the library's: train::save_checkpoint, docs/checkpoint.md) after
// every --checkpoint-every N steps (default 1) and after the last, on a background thread with
// --async-checkpoint (train::checkpoint_writer); --resume continues from the newest one under any layout
// (--tp, --pp, --ranks, --zero may differ: it reshards on load).
// Exit status: 0 done; 1 --check-parity failed; 2 bad flags or combinations (one line on stderr).
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/files.hpp>
#ifdef HETMESH_EXAMPLE_MPI
#include <hetmesh/comm/mpi.hpp>
#endif

#include "mllm_train/backbone.hpp"
#include "mllm_train/data.hpp"
#include "mllm_train/demo.hpp"
#include "mllm_train/layers.hpp"
#include "mllm_train/options.hpp"
#include "mllm_train/runs.hpp"

namespace {

using namespace hetmesh;
using mllm::options;
using mllm::usage_error;

options parse(int argc, char** argv) {
  options o;
  const hetmesh::tools::bound_option flags[] = {
      {"--steps", "N", "steps", &o.steps, 1},
      {"--ranks", "R", "trainer ranks", &o.ranks, 1},
      {"--pp", "P", "pipeline stages", &o.pp, 1},
      {"--hosts", "H", "data-plane hosts after the trainers", &o.hosts, 0},
      {"--tp", "T", "tensor-parallel ranks", &o.tp, 1},
      {"--ep", "E", "expert-parallel ranks (the MoE layer's experts)", &o.ep, 1},
      {"--zero", "0|1", "ZeRO stage: 1 shards Adam's moments", &o.zero, 0, 1},
      {"--kill-after", "K", "stop after step K (the resume test)", &o.kill_after, 0},
      {"--backend", "loopback|mpi", "ranks as threads or MPI processes", &o.backend},
      {"--partition", "static-cp|ulysses|hdp|dp", "LLM partition family", &o.partition},
      {"--schedule", "1f1b|gpipe|interleaved-1f1b|zero-bubble|zbv", "pipeline schedule", &o.schedule},
      {"--encoder", "joint|first-stage|separate", "encoder placement", &o.encoder},
      {"--balancer", "bytescale|gap-filling|family", "balancer", &o.balancer},
      {"--checkpoint-dir", "D", "where checkpoints go", &o.checkpoint_dir},
      {"--checkpoint-every", "N", "checkpoint after every N steps (and the last)", &o.checkpoint_every, 1},
      {"--report", "FILE.json", "the run's report", &o.report},
      {"--out", "DIR", "trace and plan output", &o.out},
      {"--data-dir", "D", "where the example's sources are written", &o.data_dir},
      {"--resume", "", "resume from --checkpoint-dir", &o.resume},
      {"--async-checkpoint", "", "write checkpoints on a background thread", &o.async_checkpoint},
      {"--check-parity", "", "rerun each step on one rank and compare", &o.check_parity},
      {"--answer-only-loss", "", "captions carry a loss mask", &o.answer_only_loss},
  };
  hetmesh::tools::parse_into(hetmesh::tools::arguments(argc, argv), flags);
  auto one_of = [](const std::string& flag, const std::string& v, std::initializer_list<const char*> ok) {
    for (const char* x : ok)
      if (v == x) return;
    std::string list;
    for (const char* x : ok) list += (list.empty() ? "" : ", ") + std::string(x);
    throw usage_error(fmt::format("option {} '{}': expected one of {}", flag, v, list));
  };
  one_of("--backend", o.backend, {"loopback", "mpi"});
  one_of("--partition", o.partition, {"static-cp", "ulysses", "hdp", "dp"});
  one_of("--schedule", o.schedule, {"1f1b", "gpipe", "interleaved-1f1b", "zero-bubble", "zbv"});
  one_of("--encoder", o.encoder, {"joint", "first-stage", "separate"});
  if (!o.balancer.empty()) one_of("--balancer", o.balancer, {"bytescale", "gap-filling", "family"});
  if (o.balancer.empty()) o.balancer = o.partition == "hdp" ? "bytescale" : "family";
  if (o.partition != "hdp" && o.balancer != "family")
    throw usage_error(fmt::format("--balancer {} places HDP rings: it needs --partition hdp", o.balancer));
  if (o.resume && o.checkpoint_dir.empty()) throw usage_error("--resume needs --checkpoint-dir");
  if (!o.out.empty() && std::filesystem::exists(o.out) && !std::filesystem::is_directory(o.out))
    throw usage_error("--out '" + o.out +
                      "' exists and is not a directory; expected a directory or a new name");
  if (!o.report.empty()) {  // refused before the run, not after it (core/files.hpp)
    try {
      hetmesh::check_output_target(o.report, "--report");
    } catch (const hetmesh::data_error& e) {
      throw usage_error(e.what());
    }
  }
  if (o.hosts > 0 && o.check_parity)
    throw usage_error(
        "--check-parity reruns the whole step on one rank; with --hosts the trainers hold only its metadata "
        "and their share (compare the losses with a run without --hosts instead)");
  if (o.hosts > 0 && !o.checkpoint_dir.empty())
    throw usage_error(
        "--checkpoint-dir saves the data position on trainer 0; with --hosts it is the hosts' "
        "(not written): run without --hosts to checkpoint");
  if (o.async_checkpoint && o.checkpoint_dir.empty())
    throw usage_error("--async-checkpoint needs --checkpoint-dir");
  // --encoder separate: each pipeline gets as many encoder-only ranks as it has LLM ranks.
  const int width = (o.encoder == "separate" ? 2 * o.pp : o.pp) * o.tp;
  if (o.ranks % width != 0)
    throw usage_error(
        o.encoder == "separate"
            ? fmt::format("--encoder separate runs pp = {} LLM and {} encoder ranks per pipeline: "
                          "--tp {} x {} does not divide --ranks {}",
                          o.pp, o.pp, o.tp, 2 * o.pp, o.ranks)
            : fmt::format("--tp {} x --pp {} does not divide --ranks {}", o.tp, o.pp, o.ranks));
  const int pool = o.ranks / width;
  if (o.ep > 1 && (o.encoder == "separate" || pool % o.ep != 0))
    throw usage_error(
        o.encoder == "separate"
            ? fmt::format("--ep {} with --encoder separate: the encoder pool's ranks hold no "
                          "experts; expected --ep 1",
                          o.ep)
            : fmt::format("--ep {} does not divide the pool of {} ranks (--ranks / (--tp x --pp))", o.ep,
                          pool));
  if ((o.partition == "static-cp" || o.partition == "ulysses") && pool % 2 != 0)
    throw usage_error(fmt::format("--partition {} runs groups of 2 ranks: --ranks / --pp = {} must be even",
                                  o.partition, pool));
  if (o.schedule == "zbv" && o.pp < 2) throw usage_error("--schedule zbv needs --pp >= 2");
  // What is compiled (runs.hpp's table): refuse the rest here, before any rank starts.
  if (mllm::find_compiled_run(o) == nullptr) {
    std::string rows;
    for (const auto& r : mllm::compiled_runs)
      if (r.backend == o.backend)
        rows += fmt::format("\n  --partition {} --balancer {} --encoder {{{}}} --schedule {{{}}}",
                            r.partition, r.balancer, r.encoders, r.schedules);
    throw usage_error(fmt::format(
        "--backend {} --partition {} --balancer {} --encoder {} --schedule {} is not compiled; compiled for "
        "--backend {}:{}",
        o.backend, o.partition, o.balancer, o.encoder, o.schedule, o.backend, rows));
  }
  return o;
}

/// One rank's whole run under the policies the flags name (runs.hpp: each group of train::system types
/// is compiled in a translation unit of its own). Returns the exit status.
template <class Comm>
int run_rank(Comm& world, const options& o, const mllm::config& mc, const mllm::data_config& dc) {
  [[maybe_unused]] const auto* row =
      mllm::find_compiled_run(o);  // parse() refused a combination that is not compiled
  if constexpr (std::is_same_v<Comm, comm::loopback::communicator>)
    return row->loopback(world, o, mc, dc);
  else
    return mllm::run_hdp_bytescale(world, o, mc, dc);  // the table's one MPI row
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "example_mllm_train: %s\n", e.what());
    return 2;
  }
  const auto setup = mllm::demo(HETMESH_EXAMPLE_DATA_DIR);
  mllm::config mc = setup.model;
  mc.moe_experts = 4;  // the last block's MLP: 4 experts, top-2 (moe_mlp.hpp)
  mc.moe_top_k = 2;
  try {  // --tp must divide the heads, the vocabulary and the MLP widths; --ep the experts
    mllm::backbone<float>::check_split(mc, o.tp, o.ep);
  } catch (const hetmesh::invalid_argument& e) {
    std::fprintf(stderr, "example_mllm_train: %s\n", e.what());
    return 2;
  }
  mllm::data_config dc = setup.data;
  dc.answer_only_loss = o.answer_only_loss;
  if (o.data_dir.empty())
    o.data_dir = (std::filesystem::temp_directory_path() / "hetmesh-mllm-data").string();
  try {
    if (o.backend == "mpi") {
#ifdef HETMESH_EXAMPLE_MPI
      comm::mpi::environment env(&argc, &argv);
      auto world = comm::mpi::communicator::world({.timeout = std::chrono::seconds(120)});
      if (world.size() != o.ranks + o.hosts) {  // every rank refuses: mpirun exits non-zero, no rank waits
        if (world.rank() == 0)
          std::fprintf(stderr,
                       "example_mllm_train: --ranks %d plus --hosts %d is %d, but MPI started %d processes; "
                       "expected mpirun -np %d (or --ranks %d)\n",
                       o.ranks, o.hosts, o.ranks + o.hosts, world.size(), o.ranks + o.hosts,
                       world.size() - o.hosts);
        return 2;
      }
      if (world.rank() == 0) mllm::make_sources(o.data_dir, dc);
      comm::barrier(world);
      return run_rank(world, o, mc, dc);
#else
      std::fprintf(stderr, "example_mllm_train: --backend mpi: this build has no MPI\n");
      return 2;
#endif
    }
    mllm::make_sources(o.data_dir, dc);
    std::vector<int> status(static_cast<std::size_t>(o.ranks + o.hosts), 0);
    comm::loopback::run(o.ranks + o.hosts, [&](comm::loopback::communicator& c) {
      status[static_cast<std::size_t>(c.rank())] = run_rank(c, o, mc, dc);
    });
    return status[0];
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_mllm_train: %s\n", e.what());
    return 3;
  }
}
