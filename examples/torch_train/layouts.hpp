// SPDX-License-Identifier: Apache-2.0
// example_torch_train's layouts as policy values (run_<layout>.cpp instantiate them).
#pragma once

#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/joint.hpp>
#include <hetmesh/seq/partition.hpp>
#include <hetmesh/train/train.hpp>

namespace torch_train {

/// HDP: 48 tokens of activations per rank per micro-batch; a longer document gets a ring of ranks.
inline hetmesh::seq::hdp<hetmesh::seq::no_offload> hdp_layout() { return {.capacity = 48}; }
/// The joint pipeline: 2 backbone stages, the encoders interleaved with them on the same ranks.
using joint_pipeline =
    hetmesh::train::pipeline_config<hetmesh::pipeline::one_f_one_b, hetmesh::pipeline::colocated_encoder>;
/// Static CP: each document in 2 x cp zigzag chunks over a group of cp = 2 ranks.
inline constexpr hetmesh::seq::cp_zigzag static_cp{.cp = 2, .pad = true};
/// DP: whole documents per rank.
inline constexpr hetmesh::seq::cp_thd data_parallel{.cp = 1, .pad = true};
/// One stage, the encoders before it.
using no_pipeline = hetmesh::train::pipeline_config<>;

}  // namespace torch_train
