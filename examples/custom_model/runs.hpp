// SPDX-License-Identifier: Apache-2.0
// example_custom_model's compiled layouts, one translation unit each (run_<layout>.cpp), so that no file
// compiles more than one train::system type.
#pragma once

#include <hetmesh/comm/loopback.hpp>

#include "custom_model/run.hpp"

#ifdef HETMESH_EXAMPLE_MPI
#include <hetmesh/comm/mpi.hpp>
#endif

namespace custom {

using loopback_comm = hetmesh::comm::loopback::communicator;

/// Data parallel: whole documents per rank (static THD with cp = 1).
int run_dp(loopback_comm& world, const options& o);
/// Static context parallelism: Megatron's zigzag over groups of 2 ranks.
int run_cp(loopback_comm& world, const options& o);
/// Hybrid data parallelism (ByteScale): rings of as many ranks as a document's length needs.
int run_hdp(loopback_comm& world, const options& o);
/// The 2-stage joint encoder-LLM pipeline (pipeline::colocated_encoder, 1F1B), zigzag CP over the pool.
int run_pipeline(loopback_comm& world, const options& o);
/// Ulysses over groups of 2 ranks.
int run_ulysses(loopback_comm& world, const options& o);
#ifdef HETMESH_EXAMPLE_MPI
/// The pipeline layout over MPI processes (the one layout compiled for MPI).
int run_pipeline_mpi(hetmesh::comm::mpi::communicator& world, const options& o);
#endif

}  // namespace custom
