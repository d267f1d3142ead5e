// SPDX-License-Identifier: Apache-2.0
// example_torch_train's compiled layouts, one translation unit each (run_<layout>.cpp), so that no file
// compiles more than one train::system type.
#pragma once

#include <hetmesh/comm/loopback.hpp>
#ifdef HETMESH_EXAMPLE_MPI
#include <hetmesh/comm/mpi.hpp>
#endif

#include "torch_train/options.hpp"
#include "torch_train/reference.hpp"

namespace torch_train {

using loopback_comm = hetmesh::comm::loopback::communicator;

/// HDP (rings of as many ranks as a document needs, 48 tokens per rank) with the joint 2-stage
/// encoder-LLM pipeline (pipeline::colocated_encoder, 1F1B): 8 ranks are 2 stages x a pool of 4.
int run_hdp(loopback_comm& world, const options& o, const reference_run* ref);
/// Static CP: Megatron's zigzag over groups of 2 ranks, 1 stage, the encoders before it.
int run_cp(loopback_comm& world, const options& o, const reference_run* ref);
/// Data parallel: whole documents per rank (THD with cp = 1), 1 stage.
int run_dp(loopback_comm& world, const options& o, const reference_run* ref);
#ifdef HETMESH_EXAMPLE_MPI
/// The hdp layout over MPI processes (the one layout compiled for MPI).
int run_hdp(hetmesh::comm::mpi::communicator& world, const options& o, const reference_run* ref);
#endif

}  // namespace torch_train
