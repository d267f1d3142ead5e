// SPDX-License-Identifier: Apache-2.0
// example_custom_model's model: the video encoder and the convolution-and-attention backbone, held together
// as train::check_parity reads a model (a train::parity_model): backbone(), encoders() and tensors().
// docs/tutorial.md quotes this file (example_custom_model.tutorial checks the quotes).
#pragma once

#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include "custom_model/backbone.hpp"
#include "custom_model/layers.hpp"
#include "custom_model/video_encoder.hpp"

namespace custom {

/// One rank's share of the model: its backbone stages and the encoder (every rank encodes clips; the
/// encoder's gradients are reduced over the world).
template <class T>
struct custom_model {
  conv_backbone<T> llm;
  video_encoder<T> video;

  /// The model of `s` from `seed`, holding backbone stages `local` of `num_stages`.
  custom_model(const shape& s, std::uint64_t seed, int num_stages, std::span<const int> local)
      : llm(s, seed, num_stages, local), video(s, seed) {}

  /// The backbone stages train::system::run runs.
  conv_backbone<T>& backbone() { return llm; }
  /// The encoders, in encoder-index order (run::record_projection::encoders).
  std::tuple<video_encoder<T>&> encoders() { return {video}; }
  /// Every tensor this rank holds, by global id (backbone below 1000, encoder from 1000).
  [[nodiscard]] std::vector<hetmesh::train::model_tensor<T>> tensors() {
    auto out = llm.tensors();
    for (auto& t : video.tensors()) out.push_back(t);
    return out;
  }
};

static_assert(hetmesh::train::check_parity_model<custom_model<float>>());

}  // namespace custom
