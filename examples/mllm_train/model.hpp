// SPDX-License-Identifier: Apache-2.0
// The mllm_train example's model, as a user of hetmesh writes it: a vision and an audio encoder
// (encoder.hpp) and a pipelined transformer backbone with split backward (backbone.hpp), over the layers of
// layers.hpp. train::system runs them: the encoders through train::bind_encoder, the backbone as the
// rank's stages; train::check_parity reads it as a train::parity_model (backbone(), encoders(), tensors()).
// Every tensor has a global id (backbone 0..9999, vision 10000+, audio 20000+), so a trainer checkpoints,
// restores and compares tensors by id whatever the pipeline split.
#pragma once

#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include "mllm_train/backbone.hpp"
#include "mllm_train/encoder.hpp"
#include "mllm_train/layers.hpp"

namespace mllm {

/// One rank's share of the model: its backbone stages and both encoders (every rank runs encoders under
/// the colocated and first-stage placements; their gradients are reduced over the world).
template <class T>
struct multimodal_model {
  mllm::backbone<T> llm;
  vision_encoder<T> vision;
  audio_encoder<T> audio;

  /// The model of `c` from `seed`, holding backbone stages `local` of `num_stages`. O(parameters).
  multimodal_model(const config& c, std::uint64_t seed, int num_stages, std::span<const int> local)
      : llm(c, seed, num_stages, local), vision(c, seed), audio(c, seed) {}
  /// The model of `c` from `seed` as train::system splits it for this rank (sys.split()): its backbone
  /// stages, tensor-parallel blocks and experts, and both encoders whole. O(parameters).
  multimodal_model(const config& c, std::uint64_t seed, const hetmesh::train::model_split& sp)
      : llm(c, seed, sp), vision(c, seed), audio(c, seed) {}

  /// The backbone stages train::system::run runs (train::check_parity reads the model through these).
  mllm::backbone<T>& backbone() { return llm; }
  /// The encoders, in encoder-index order (vision_index, audio_index).
  std::tuple<vision_encoder<T>&, audio_encoder<T>&> encoders() { return {vision, audio}; }

  /// (global id, value, gradient) of every tensor this rank holds, in id order: backbone, vision, audio.
  [[nodiscard]] std::vector<tensor_ref<T>> tensors() {
    auto out = llm.tensors();
    for (auto& t : vision.tensors()) out.push_back(t);
    for (auto& t : audio.tensors()) out.push_back(t);
    return out;
  }
  /// tensors() with the block of the full tensor each is under tensor parallelism (train::check_parity's
  /// records; sharded_model reads the model through them).
  [[nodiscard]] std::vector<hetmesh::train::model_tensor<T>> sharded_tensors() {
    std::vector<hetmesh::train::model_tensor<T>> out;
    for (auto& t : llm.tensors()) out.push_back({t.id, t.value, t.grad, llm.shard_of(t.id)});
    for (auto& t : vision.tensors()) out.push_back({t.id, t.value, t.grad, {}});
    for (auto& t : audio.tensors()) out.push_back({t.id, t.value, t.grad, {}});
    return out;
  }
};

/// The model as train::check_parity reads a tensor-parallel split: its tensors() are the blocks
/// (multimodal_model::sharded_tensors).
template <class T>
struct sharded_model : multimodal_model<T> {
  using multimodal_model<T>::multimodal_model;
  /// Every tensor with its tp block.
  [[nodiscard]] std::vector<hetmesh::train::model_tensor<T>> tensors() { return this->sharded_tensors(); }
};

}  // namespace mllm
