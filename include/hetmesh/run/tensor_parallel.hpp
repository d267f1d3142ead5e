// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: what a tensor-parallel layer needs, in one include (Megatron-LM's tensor_parallel package,
// over any comm::communicator and model::memory_policy):
//  - tp_regions.hpp: the communication regions, forward and backward (copy-to / reduce-from / gather-from /
//    scatter-to the tp group along the features; gather-from / reduce-scatter-to / scatter-to the sequence-
//    parallel split along the tokens);
//  - tp_linear.hpp: column- and row-parallel linear layers over the caller's GEMM, with sequence
//    parallelism as an option;
//  - tp_vocab.hpp: the vocabulary-parallel embedding and cross-entropy.
// The tp group is model::stage_context::tp; docs/tensor_parallel.md shows an attention block and an MLP
// written with these helpers.
#pragma once

#include "tp_linear.hpp"
#include "tp_regions.hpp"
#include "tp_vocab.hpp"
