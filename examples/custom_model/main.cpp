// SPDX-License-Identifier: Apache-2.0
// example_custom_model: a model of the user's own, neither encoder nor backbone a library type, trained
// through train::system (docs/tutorial.md walks through it). A video encoder (video_encoder.hpp: frames of
// patches to rows, attention inside each clip) feeds a backbone whose token mixers are a causal
// convolution through the halo exchange and attention (backbone.hpp), on generated data from the data
// plane (data.hpp). With --check-parity it compares one step with the library's 1-rank reference
// (train::check_parity) and exits; otherwise it trains a few steps and prints the loss.
//
// example_custom_model [--layout dp|cp|hdp|pipeline|ulysses] [--ranks N] [--steps S]
//   [--backend loopback|mpi] [--halo-off] [--check-parity]
// --ranks: loopback threads (default 4); under --backend mpi the world (mpirun -np N), compiled for
// --layout pipeline only. --halo-off is the mutation: the convolution skips the exchange, so its halo rows
// stay zero, and parity must fail under any sequence split.
// Exit status: 0 done (parity passed); 1 parity failed; 2 bad flags; 3 an error (one line on stderr).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh_tools/args.hpp>

#include "custom_model/runs.hpp"

namespace {

using custom::options;

/// The run the flags name on one rank of `world`.
int run_rank(custom::loopback_comm& world, const options& o) {
  if (o.layout == "dp") return custom::run_dp(world, o);
  if (o.layout == "cp") return custom::run_cp(world, o);
  if (o.layout == "hdp") return custom::run_hdp(world, o);
  if (o.layout == "pipeline") return custom::run_pipeline(world, o);
  return custom::run_ulysses(world, o);
}

void check(const options& o) {
  using hetmesh::tools::usage_error;
  const std::vector<std::string> layouts{"dp", "cp", "hdp", "pipeline", "ulysses"};
  if (std::find(layouts.begin(), layouts.end(), o.layout) == layouts.end())
    throw usage_error("--layout '" + o.layout + "': expected dp, cp, hdp, pipeline or ulysses");
  if (o.backend != "loopback" && o.backend != "mpi")
    throw usage_error("--backend '" + o.backend + "': expected loopback or mpi");
  if (o.backend == "mpi" && o.layout != "pipeline")
    throw usage_error("--backend mpi is compiled for --layout pipeline only");
  // cp, pipeline and ulysses run groups of 2 ranks (the pipeline: 2 stages of such groups).
  const int unit = o.layout == "dp" || o.layout == "hdp" ? 1 : o.layout == "pipeline" ? 4 : 2;
  if (o.backend == "loopback" && o.ranks % unit != 0)
    throw usage_error("--layout " + o.layout + " needs --ranks a multiple of " + std::to_string(unit));
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    hetmesh::tools::parse_into(
        hetmesh::tools::arguments(argc, argv),
        std::initializer_list<hetmesh::tools::bound_option>{
            {"--layout", "dp|cp|hdp|pipeline|ulysses", "the parallel layout", &o.layout},
            {"--ranks", "N", "loopback ranks (threads)", &o.ranks, 1, 64},
            {"--steps", "S", "training steps", &o.steps, 1},
            {"--backend", "loopback|mpi", "ranks as threads or MPI processes", &o.backend},
            {"--halo-off", "", "the mutation: skip the halo exchange", &o.halo_off},
            {"--check-parity", "", "compare one step with a 1-rank run and exit", &o.check_parity},
        });
    check(o);
  } catch (const hetmesh::tools::usage_error& e) {
    std::fprintf(stderr, "example_custom_model: %s\n", e.what());
    return 2;
  }
  try {
    if (o.backend == "mpi") {
#ifdef HETMESH_EXAMPLE_MPI
      hetmesh::comm::mpi::environment env(&argc, &argv);
      auto world = hetmesh::comm::mpi::communicator::world({.timeout = std::chrono::seconds(60)});
      if (world.size() % 4 != 0) {
        if (world.rank() == 0)
          std::fprintf(stderr,
                       "example_custom_model: --layout pipeline needs a multiple of 4 processes; got %d\n",
                       world.size());
        return 2;
      }
      return custom::run_pipeline_mpi(world, o);
#else
      std::fprintf(stderr, "example_custom_model: --backend mpi: this build has no MPI\n");
      return 2;
#endif
    }
    std::vector<int> status(static_cast<std::size_t>(o.ranks), 0);
    hetmesh::comm::loopback::run(o.ranks, [&](custom::loopback_comm& c) {
      status[static_cast<std::size_t>(c.rank())] = run_rank(c, o);
    });
    return status[0];
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_custom_model: %s\n", e.what());
    return 3;
  }
}
