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

}  // namespace mllm
