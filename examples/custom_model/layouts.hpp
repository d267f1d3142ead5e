// SPDX-License-Identifier: Apache-2.0
// example_custom_model's layouts as policy values (run_<layout>.cpp instantiate them).
// docs/tutorial.md quotes this file (example_custom_model.tutorial checks the quotes).
#pragma once

#include <hetmesh/pipeline/generators.hpp>
#include <hetmesh/pipeline/joint.hpp>
#include <hetmesh/seq/partition.hpp>
#include <hetmesh/train/train.hpp>

#include "custom_model/run.hpp"

namespace custom {

/// Static CP: each document in 2 x cp zigzag chunks over a group of cp ranks.
inline constexpr hetmesh::seq::cp_zigzag kCp{.cp = 2, .pad = true};
/// HDP: 16 tokens of activations per rank; a longer document gets a ring of ranks.
inline hetmesh::seq::hdp<hetmesh::seq::no_offload> hdp_layout() { return {.capacity = 16}; }
/// Ulysses: heads over groups of 2 ranks (the backbone's attention shape).
inline hetmesh::seq::ulysses ulysses_layout() {
  return {.degree = 2,
          .heads = kShape.attn.q_heads,
          .kv_heads = kShape.attn.kv_heads,
          .head_dim = kShape.attn.head_dim};
}
/// The joint pipeline: 2 backbone stages, the encoder interleaved with them on the same ranks.
using joint_pipeline =
    hetmesh::train::pipeline_config<hetmesh::pipeline::one_f_one_b, hetmesh::pipeline::colocated_encoder>;
/// One stage, the encoder before it.
using no_pipeline = hetmesh::train::pipeline_config<>;

}  // namespace custom
