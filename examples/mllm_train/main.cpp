// SPDX-License-Identifier: Apache-2.0
// example_mllm_train: trains a small multimodal model (a vision and an audio encoder, a causal
// transformer backbone; model.hpp) on the example's data (data.hpp) through train::system, on loopback
// threads or MPI processes. Each step prints the loss, the tokens, a summary of the plan, the measured
// per-rank busy time and its imbalance, and the modelled step time of the same batch (the pipeline
// simulator, with costs calibrated on the first step's measured actions). The trainer itself is
// trainer.hpp; this file parses the command line, picks the compiled policies and writes the reports.
//
// example_mllm_train [--steps N] [--ranks R] [--backend loopback|mpi] [--partition static-cp|ulysses|hdp|dp]
//   [--schedule 1f1b|gpipe|interleaved-1f1b|zero-bubble|zbv] [--encoder joint|first-stage|separate]
//   [--balancer bytescale|gap-filling|family] [--pp P] [--checkpoint-dir D] [--resume] [--report FILE.json]
//   [--check-parity] [--out DIR] [--data-dir D] [--kill-after K]
// --encoder separate gives each pipeline a pool of pp encoder-only ranks after its pp LLM ranks
// (pipeline::encoder_pool), so --ranks must be a multiple of 2 * pp.
// Exit status: 0 done; 1 --check-parity failed; 2 bad flags or combinations (one line on stderr).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/cost/calibrate.hpp>
#include <hetmesh/pipeline/trace.hpp>
#include <hetmesh/train/report_json.hpp>
#ifdef HETMESH_EXAMPLE_MPI
#include <hetmesh/comm/mpi.hpp>
#endif

#include "mllm_train/report.hpp"
#include "mllm_train/trainer.hpp"

namespace {

using namespace hetmesh;

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  int steps = 60, ranks = 8, pp = 2, kill_after = -1;
  std::string backend = "loopback", partition = "hdp", schedule = "1f1b", encoder = "joint", balancer;
  std::string checkpoint_dir, report, out, data_dir;
  bool resume = false, check_parity = false;
};

int to_int(const std::string& flag, const std::string& v, int lo) {
  try {
    std::size_t used = 0;
    const int x = std::stoi(v, &used);
    if (used == v.size() && x >= lo) return x;
  } catch (const std::exception&) {
  }
  throw usage_error(fmt::format("{} {}: expected an integer >= {}", flag, v, lo));
}

options parse(int argc, char** argv) {
  options o;
  auto one_of = [](const std::string& flag, const std::string& v, std::initializer_list<const char*> ok) {
    for (const char* x : ok)
      if (v == x) return v;
    std::string list;
    for (const char* x : ok) list += (list.empty() ? "" : ", ") + std::string(x);
    throw usage_error(fmt::format("{} {}: expected one of {}", flag, v, list));
  };
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw usage_error(fmt::format("{} needs a value", f));
      return argv[++i];
    };
    if (f == "--steps")
      o.steps = to_int(f, value(), 1);
    else if (f == "--ranks")
      o.ranks = to_int(f, value(), 1);
    else if (f == "--pp")
      o.pp = to_int(f, value(), 1);
    else if (f == "--kill-after")
      o.kill_after = to_int(f, value(), 0);
    else if (f == "--backend")
      o.backend = one_of(f, value(), {"loopback", "mpi"});
    else if (f == "--partition")
      o.partition = one_of(f, value(), {"static-cp", "ulysses", "hdp", "dp"});
    else if (f == "--schedule")
      o.schedule = one_of(f, value(), {"1f1b", "gpipe", "interleaved-1f1b", "zero-bubble", "zbv"});
    else if (f == "--encoder")
      o.encoder = one_of(f, value(), {"joint", "first-stage", "separate"});
    else if (f == "--balancer")
      o.balancer = one_of(f, value(), {"bytescale", "gap-filling", "family"});
    else if (f == "--checkpoint-dir")
      o.checkpoint_dir = value();
    else if (f == "--report")
      o.report = value();
    else if (f == "--out")
      o.out = value();
    else if (f == "--data-dir")
      o.data_dir = value();
    else if (f == "--resume")
      o.resume = true;
    else if (f == "--check-parity")
      o.check_parity = true;
    else
      throw usage_error(fmt::format("unknown flag {} (see the usage at the top of main.cpp)", f));
  }
  if (o.balancer.empty()) o.balancer = o.partition == "hdp" ? "bytescale" : "family";
  if (o.partition != "hdp" && o.balancer != "family")
    throw usage_error(fmt::format("--balancer {} places HDP rings: it needs --partition hdp", o.balancer));
  if (o.resume && o.checkpoint_dir.empty()) throw usage_error("--resume needs --checkpoint-dir");
  // --encoder separate: each pipeline gets as many encoder-only ranks as it has LLM ranks.
  const int width = o.encoder == "separate" ? 2 * o.pp : o.pp;
  if (o.ranks % width != 0)
    throw usage_error(
        o.encoder == "separate"
            ? fmt::format("--encoder separate runs pp = {} LLM and {} encoder ranks per pipeline: "
                          "{} does not divide --ranks {}",
                          o.pp, o.pp, width, o.ranks)
            : fmt::format("--pp {} does not divide --ranks {}", o.pp, o.ranks));
  const int pool = o.ranks / width;
  if ((o.partition == "static-cp" || o.partition == "ulysses") && pool % 2 != 0)
    throw usage_error(fmt::format("--partition {} runs groups of 2 ranks: --ranks / --pp = {} must be even",
                                  o.partition, pool));
  if (o.schedule == "zbv" && o.pp < 2) throw usage_error("--schedule zbv needs --pp >= 2");
  // What is compiled (with_policies): refuse the rest here, before any rank starts.
  const bool hdp_bytescale_joint = o.partition == "hdp" && o.balancer == "bytescale" && o.encoder == "joint";
  if (o.encoder != "joint" && o.schedule != "1f1b")
    throw usage_error(
        fmt::format("--encoder {} is compiled with --schedule 1f1b only, not {}", o.encoder, o.schedule));
  if ((o.schedule == "gpipe" || o.schedule == "zbv") && !hdp_bytescale_joint)
    throw usage_error(
        fmt::format("--schedule {} is compiled with --partition hdp --balancer bytescale --encoder joint "
                    "only",
                    o.schedule));
  if (o.backend == "mpi" && !(hdp_bytescale_joint && (o.schedule == "1f1b" || o.schedule == "zero-bubble")))
    throw usage_error(
        "--backend mpi is compiled for --partition hdp --balancer bytescale --encoder joint with "
        "--schedule 1f1b or zero-bubble");
  return o;
}

/// Runs `body(policies...)` with the compiled instantiation the options name. Compiled (each is a
/// train::system type; parse() refuses the others): every partition and balancer with 1F1B (joint,
/// first-stage or separate-pool encoders), zero-bubble and interleaved 1F1B (joint); GPipe and ZB-V with HDP,
/// ByteScale and the joint pipeline. Under MPI (`Full` false): HDP, ByteScale, joint, with 1F1B or
/// zero-bubble.
template <bool Full, class F>
void with_policies(const options& o, const mllm::config& mc, F&& body) {
  auto by_schedule = [&](auto partition, auto balancer, auto placement) {
    using P = decltype(placement);
    if (o.schedule == "1f1b") return body(partition, balancer, pipeline::one_f_one_b{}, placement);
    if constexpr (std::is_same_v<P, pipeline::colocated_encoder>) {
      if (o.schedule == "zero-bubble") return body(partition, balancer, pipeline::zero_bubble{}, placement);
      if constexpr (Full) {
        if (o.schedule == "interleaved-1f1b")
          return body(partition, balancer, pipeline::interleaved_1f1b{}, placement);
        if constexpr (std::is_same_v<decltype(balancer), balance::bytescale>) {
          if (o.schedule == "gpipe") return body(partition, balancer, pipeline::gpipe{}, placement);
          if (o.schedule == "zbv") return body(partition, balancer, pipeline::zbv{}, placement);
        }
      }
    }
    throw usage_error(fmt::format("--schedule {} is not compiled with these flags", o.schedule));
  };
  auto by_encoder = [&](auto partition, auto balancer) {
    if (o.encoder == "joint") return by_schedule(partition, balancer, pipeline::colocated_encoder{});
    if constexpr (Full) {
      if (o.encoder == "separate")
        return by_schedule(partition, balancer, pipeline::encoder_pool{.ranks = o.pp});
      return by_schedule(partition, balancer, pipeline::encoder_on_first_stage{});
    }
    throw usage_error(fmt::format("--encoder {} is not compiled for this backend", o.encoder));
  };
  // HDP over the pool: C tokens of activations per rank; a longer sequence gets a ring and offloads part
  // of its activations (ByteScale's solver, over the layers one pipeline rank holds).
  seq::hdp<seq::selective_offload> hdp{.capacity = 192};
  hdp.model.activation.layers = std::max(2, mc.blocks / o.pp);
  if constexpr (Full) {
    const train::family_placement family{};
    if (o.partition == "static-cp") return by_encoder(seq::cp_zigzag{.cp = 2, .pad = true}, family);
    if (o.partition == "dp") return by_encoder(seq::cp_thd{.cp = 1, .pad = true}, family);
    if (o.partition == "ulysses")
      return by_encoder(seq::ulysses{.degree = 2,
                                     .heads = mc.attn.q_heads,
                                     .kv_heads = mc.attn.kv_heads,
                                     .head_dim = mc.attn.head_dim},
                        family);
    if (o.balancer == "gap-filling") return by_encoder(hdp, balance::gap_filling_hdp{});
    if (o.balancer == "family") return by_encoder(hdp, family);
  }
  if (o.partition == "hdp" && o.balancer == "bytescale") return by_encoder(hdp, balance::bytescale{});
  throw usage_error(
      fmt::format("--partition {} --balancer {} is not compiled for this backend", o.partition, o.balancer));
}

/// One rank's whole run: the trainer with the chosen policies, the parity check at step 0, the per-step
/// line and the reports (rank 0). Returns the exit status.
template <class Comm>
int run_rank(Comm& world, const options& o, const mllm::config& mc, const mllm::data_config& dc) {
  int status = 0;
  with_policies<std::is_same_v<Comm, comm::loopback::communicator>>(
      o, mc, [&](auto partition, auto balancer, auto schedule, auto placement) {
        using system_t = train::system<decltype(partition), model::reference_attention, Comm,
                                       decltype(balancer), decltype(schedule), decltype(placement)>;
        system_t sys(partition, balancer, {o.pp, schedule, placement}, world, {}, {.reproducible = true});
        mllm::trainer_options to{
            .steps = o.steps, .data_dir = o.data_dir, .ckpt_dir = o.checkpoint_dir, .resume = o.resume};
        mllm::run_log log(o.out, world.rank() == 0);
        bool first = true;
        mllm::train(sys, mc, dc, to, [&](const mllm::step_result& r) {
          if (o.check_parity && first) status = mllm::check_parity(world, r, mc, to.seed);
          first = false;
          log.step(r);
          if (o.kill_after >= 0 && r.step == o.kill_after)
            ::raise(SIGKILL);  // a crash right after a checkpoint
        });
        if (world.rank() == 0) {
          log.finish();
          if (!o.report.empty())
            log.write_report(o.report, nlohmann::json{{"steps", o.steps},
                                                      {"ranks", o.ranks},
                                                      {"backend", o.backend},
                                                      {"partition", o.partition},
                                                      {"schedule", o.schedule},
                                                      {"encoder", o.encoder},
                                                      {"balancer", o.balancer},
                                                      {"pp", o.pp}});
        }
      });
  return status;
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
  mllm::config mc;
  mllm::data_config dc;
  dc.samples_dir = HETMESH_EXAMPLE_DATA_DIR;
  dc.tokens_per_step = 4096;  // long-tailed documents up to 768 tokens: HDP gives the long ones rings
  dc.text_scale = 16;
  dc.max_doc_tokens = 768;
  dc.curriculum_steps = 40;
  mc.patch = dc.image_dim;
  mc.frame = dc.audio_dim;
  mc.vocab = dc.vocab;
  mc.blocks = 8;
  if (o.data_dir.empty())
    o.data_dir = (std::filesystem::temp_directory_path() / "hetmesh-mllm-data").string();
  try {
    if (o.backend == "mpi") {
#ifdef HETMESH_EXAMPLE_MPI
      comm::mpi::environment env(&argc, &argv);
      auto world = comm::mpi::communicator::world({.timeout = std::chrono::seconds(120)});
      if (world.rank() == 0) mllm::make_sources(o.data_dir, dc);
      comm::barrier(world);
      return run_rank(world, o, mc, dc);
#else
      std::fprintf(stderr, "example_mllm_train: --backend mpi: this build has no MPI\n");
      return 2;
#endif
    }
    mllm::make_sources(o.data_dir, dc);
    std::vector<int> status(static_cast<std::size_t>(o.ranks), 0);
    comm::loopback::run(o.ranks, [&](comm::loopback::communicator& c) {
      status[static_cast<std::size_t>(c.rank())] = run_rank(c, o, mc, dc);
    });
    return status[0];
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_mllm_train: %s\n", e.what());
    return 3;
  }
}
