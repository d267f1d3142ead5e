// SPDX-License-Identifier: Apache-2.0
// example_mllm_train's compiled policies, one entry point per group of train::system types. Each group is a
// translation unit of its own (run_*.cpp, over run_policies.hpp), so no translation unit of the example
// compiles more than five systems (about 19 s at g++ -O2; docs/compile-time.md); main.cpp picks the entry
// point by the flags.
//
//   run_hdp_bytescale     HDP (ByteScale's rings, selective offload) } each: 1F1B with the joint,
//                         with ByteScale's balancer                  } first-stage or separate-pool
//   run_hdp_gap_filling   HDP with the gap-filling balancer          } encoders; zero-bubble and
//   run_hdp_family        HDP with the family placement              } interleaved 1F1B with the joint
//   run_static_cp         static CP (zigzag, cp = 2)                 } pipeline
//   run_ulysses           Ulysses (degree 2)                         }
//   run_dp                pure DP (THD, cp = 1)                      }
//   run_hdp_gpipe_zbv     HDP with ByteScale's balancer under GPipe or ZB-V, joint pipeline
//   run_hdp_bytescale     under MPI: HDP, ByteScale's balancer, joint, 1F1B or zero-bubble (run_mpi.cpp)
//
// Each runs one rank's whole run (the trainer, the parity check at step 0, the per-step line, the
// reports) and returns its exit status; it throws usage_error for flags its group does not compile.
#pragma once

#include <string_view>

#include <hetmesh/comm/loopback.hpp>
#ifdef HETMESH_EXAMPLE_MPI
#include <hetmesh/comm/mpi.hpp>
#endif

#include "mllm_train/options.hpp"

namespace mllm {

struct config;
struct data_config;

using loopback_comm = hetmesh::comm::loopback::communicator;

int run_hdp_bytescale(loopback_comm& world, const options& o, const config& mc, const data_config& dc);
int run_hdp_gap_filling(loopback_comm& world, const options& o, const config& mc, const data_config& dc);
int run_hdp_family(loopback_comm& world, const options& o, const config& mc, const data_config& dc);
int run_static_cp(loopback_comm& world, const options& o, const config& mc, const data_config& dc);
int run_ulysses(loopback_comm& world, const options& o, const config& mc, const data_config& dc);
int run_dp(loopback_comm& world, const options& o, const config& mc, const data_config& dc);
int run_hdp_gpipe_zbv(loopback_comm& world, const options& o, const config& mc, const data_config& dc);
#ifdef HETMESH_EXAMPLE_MPI
int run_hdp_bytescale(hetmesh::comm::mpi::communicator& world, const options& o, const config& mc,
                      const data_config& dc);
#endif

/// One row of what the example compiles: a backend, a partition and a balancer, the encoder placements and
/// schedules compiled with them (space-separated flag values), and the entry point that runs them.
struct compiled_run {
  std::string_view backend;    ///< --backend
  std::string_view partition;  ///< --partition
  std::string_view balancer;   ///< --balancer
  std::string_view encoders;   ///< --encoder values
  std::string_view schedules;  ///< --schedule values
  int (*loopback)(loopback_comm&, const options&, const config&, const data_config&) = nullptr;  ///< entry
};

/// The example's run-time choice among its compiled systems: the first row whose values all match the
/// flags runs (MPI: run_hdp_bytescale over the MPI communicator, the only entry compiled for it).
inline constexpr compiled_run compiled_runs[] = {
    {"loopback", "hdp", "bytescale", "joint", "1f1b zero-bubble interleaved-1f1b", run_hdp_bytescale},
    {"loopback", "hdp", "bytescale", "first-stage separate", "1f1b", run_hdp_bytescale},
    {"loopback", "hdp", "bytescale", "joint", "gpipe zbv", run_hdp_gpipe_zbv},
    {"loopback", "hdp", "gap-filling", "joint", "1f1b zero-bubble interleaved-1f1b", run_hdp_gap_filling},
    {"loopback", "hdp", "gap-filling", "first-stage separate", "1f1b", run_hdp_gap_filling},
    {"loopback", "hdp", "family", "joint", "1f1b zero-bubble interleaved-1f1b", run_hdp_family},
    {"loopback", "hdp", "family", "first-stage separate", "1f1b", run_hdp_family},
    {"loopback", "static-cp", "family", "joint", "1f1b zero-bubble interleaved-1f1b", run_static_cp},
    {"loopback", "static-cp", "family", "first-stage separate", "1f1b", run_static_cp},
    {"loopback", "ulysses", "family", "joint", "1f1b zero-bubble interleaved-1f1b", run_ulysses},
    {"loopback", "ulysses", "family", "first-stage separate", "1f1b", run_ulysses},
    {"loopback", "dp", "family", "joint", "1f1b zero-bubble interleaved-1f1b", run_dp},
    {"loopback", "dp", "family", "first-stage separate", "1f1b", run_dp},
    {"mpi", "hdp", "bytescale", "joint", "1f1b zero-bubble", nullptr},
};

/// Whether `value` is one of the space-separated words of `list`.
constexpr bool listed(std::string_view list, std::string_view value) {
  while (!list.empty()) {
    const auto end = list.find(' ');
    if (list.substr(0, end) == value) return true;
    if (end == std::string_view::npos) break;
    list.remove_prefix(end + 1);
  }
  return false;
}

/// The row of compiled_runs the flags select, or null when the combination is not compiled.
inline const compiled_run* find_compiled_run(const options& o) {
  for (const auto& r : compiled_runs)
    if (r.backend == o.backend && r.partition == o.partition && r.balancer == o.balancer &&
        listed(r.encoders, o.encoder) && listed(r.schedules, o.schedule))
      return &r;
  return nullptr;
}

}  // namespace mllm
