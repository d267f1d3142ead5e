// SPDX-License-Identifier: Apache-2.0
// example_torch_train: a multimodal model written with torch::nn (vision and audio encoders, a causal
// transformer backbone; forward only, autograd gives the backward: model.hpp, stages.hpp) trained through
// train::system by hetmesh's libtorch adapters, on the data plane's steps of the mllm_train example's
// sources. With --check-reference it also trains the same model in a plain single-process libtorch loop
// (loss.backward(), torch::optim::Adam: reference.hpp) on the same batches and compares: step 0's
// gradients within 1e-5 of the largest gradient, every step's loss within 1e-4.
//
// example_torch_train [--layout hdp|cp|dp] [--ranks N] [--steps S] [--lr X] [--backend loopback|mpi]
//   [--data-dir D] [--check-reference] [--mutate none|drop-output-grad]
// --layout: hdp (HDP rings, the joint 2-stage encoder-LLM pipeline), cp (static zigzag CP over groups of 2),
// dp (whole documents per rank). --backend mpi runs the hdp layout over the MPI world (mpirun -np 8).
// --mutate drop-output-grad: the adapters receive a zero output gradient, so the check must fail.
// Exit status: 0 done (the check passed); 1 the check failed; 2 bad flags; 3 an error (one line on stderr).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh_tools/args.hpp>

#include "torch_train/options.hpp"
#include "torch_train/reference.hpp"
#include "torch_train/runs.hpp"

namespace {

using torch_train::options;

/// The run the flags name on one rank of `world`.
int run_rank(torch_train::loopback_comm& world, const options& o, const torch_train::reference_run* ref) {
  if (o.layout == "hdp") return torch_train::run_hdp(world, o, ref);
  if (o.layout == "cp") return torch_train::run_cp(world, o, ref);
  return torch_train::run_dp(world, o, ref);
}

void check(const options& o) {
  using hetmesh::tools::usage_error;
  const std::vector<std::string> layouts{"hdp", "cp", "dp"};
  if (std::find(layouts.begin(), layouts.end(), o.layout) == layouts.end())
    throw usage_error("--layout '" + o.layout + "': expected hdp, cp or dp");
  if (o.backend != "loopback" && o.backend != "mpi")
    throw usage_error("--backend '" + o.backend + "': expected loopback or mpi");
  if (o.backend == "mpi" && o.layout != "hdp")
    throw usage_error("--backend mpi is compiled for --layout hdp only");
  if (o.mutate != "none" && o.mutate != "drop-output-grad")
    throw usage_error("--mutate '" + o.mutate + "': expected none or drop-output-grad");
  const int unit = o.layout == "dp" ? 1 : 2;  // cp: groups of 2; hdp: 2 pipeline stages
  if (o.backend == "loopback" && o.ranks % unit != 0)
    throw usage_error("--layout " + o.layout + " needs --ranks a multiple of " + std::to_string(unit));
}

/// The plain loop's run over a fresh step source of `o.data_dir`, when --check-reference asks for it.
std::optional<torch_train::reference_run> reference(const options& o) {
  if (!o.check_reference) return std::nullopt;
  const auto dc = torch_train::data_config(HETMESH_EXAMPLE_DATA_DIR);
  mllm::step_source data(o.data_dir, dc);
  return torch_train::train_reference(torch_train::model_shape(dc), torch_train::model_seed,
                                      torch_train::dtype, data, o.steps, o.lr);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    hetmesh::tools::parse_into(
        hetmesh::tools::arguments(argc, argv),
        std::initializer_list<hetmesh::tools::bound_option>{
            {"--layout", "hdp|cp|dp", "the parallel layout", &o.layout},
            {"--ranks", "N", "loopback ranks (threads)", &o.ranks, 1, 64},
            {"--steps", "S", "training steps", &o.steps, 1},
            {"--lr", "X", "Adam's learning rate", &o.lr},
            {"--backend", "loopback|mpi", "ranks as threads or MPI processes", &o.backend},
            {"--data-dir", "D", "where the data plane's sources are written", &o.data_dir},
            {"--check-reference", "", "compare with the plain libtorch loop", &o.check_reference},
            {"--mutate", "none|drop-output-grad", "the mutation the check must catch", &o.mutate},
        });
    check(o);
  } catch (const hetmesh::tools::usage_error& e) {
    std::fprintf(stderr, "example_torch_train: %s\n", e.what());
    return 2;
  }
  if (o.data_dir.empty())
    o.data_dir = (std::filesystem::temp_directory_path() / "hetmesh-torch-data").string();
  torch::set_num_threads(1);  // the ranks are the parallelism (loopback threads, or processes)
  const auto dc = torch_train::data_config(HETMESH_EXAMPLE_DATA_DIR);
  try {
    if (o.backend == "mpi") {
#ifdef HETMESH_EXAMPLE_MPI
      hetmesh::comm::mpi::environment env(&argc, &argv);
      auto world = hetmesh::comm::mpi::communicator::world({.timeout = std::chrono::seconds(120)});
      if (world.size() % 2 != 0) {
        if (world.rank() == 0)
          std::fprintf(stderr,
                       "example_torch_train: --layout hdp needs an even number of processes; got %d\n",
                       world.size());
        return 2;
      }
      if (world.rank() == 0) mllm::make_sources(o.data_dir, dc);
      hetmesh::comm::barrier(world);
      const auto ref = reference(o);  // each process runs the plain loop (small) and compares its own stages
      return torch_train::run_hdp(world, o, ref ? &*ref : nullptr);
#else
      std::fprintf(stderr, "example_torch_train: --backend mpi: this build has no MPI\n");
      return 2;
#endif
    }
    mllm::make_sources(o.data_dir, dc);
    const auto ref = reference(o);
    std::vector<int> status(static_cast<std::size_t>(o.ranks), 0);
    hetmesh::comm::loopback::run(o.ranks, [&](torch_train::loopback_comm& c) {
      status[static_cast<std::size_t>(c.rank())] = run_rank(c, o, ref ? &*ref : nullptr);
    });
    return status[0];
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_torch_train: %s\n", e.what());
    return 3;
  }
}
