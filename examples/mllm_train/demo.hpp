// SPDX-License-Identifier: Apache-2.0
// The demo's sizes: the model and the data both mllm_train examples train (the CPU trainer and its GPU
// variant), so that their runs are the same problem.
#pragma once

#include <string>

#include "mllm_train/data.hpp"
#include "mllm_train/layers.hpp"

namespace mllm {

/// A model config and the data config it reads.
struct demo_setup {
  config model;      ///< the model (its input widths and vocabulary follow the data's)
  data_config data;  ///< the sources, read from `samples_dir`
};

/// The demo: 4,096-token steps of long-tailed documents (up to 768 tokens), a curriculum over 40 steps,
/// an 8-block backbone. `samples_dir`: the vendored samples (examples/data).
inline demo_setup demo(const std::string& samples_dir) {
  demo_setup d;
  d.data.samples_dir = samples_dir;
  d.data.tokens_per_step = 4096;  // long-tailed documents up to 768 tokens: HDP gives the long ones rings
  d.data.text_scale = 16;
  d.data.max_doc_tokens = 768;
  d.data.curriculum_steps = 40;
  d.model.patch = d.data.image_dim;
  d.model.frame = d.data.audio_dim;
  d.model.vocab = d.data.vocab;
  d.model.blocks = 8;
  return d;
}

}  // namespace mllm
