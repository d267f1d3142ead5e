// SPDX-License-Identifier: Apache-2.0
// example_torch_train's command line (main.cpp parses it; run.hpp reads it) and the sizes of its model and
// data.
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "mllm_train/data.hpp"
#include "torch_train/model.hpp"

namespace torch_train {

/// The flags of example_torch_train.
struct options {
  std::string layout = "hdp";        ///< hdp (the joint 2-stage pipeline) | cp (static, zigzag) | dp
  std::string backend = "loopback";  ///< loopback threads, or MPI processes
  std::string data_dir;              ///< where the data plane's sources are written
  std::string mutate = "none";       ///< none | drop-output-grad (the adapters see a zero output gradient)
  int ranks = 8;                     ///< loopback threads (under MPI: the world's size)
  int steps = 10;                    ///< training steps
  double lr = 1e-2;                  ///< Adam's learning rate
  bool check_reference = false;      ///< compare with the plain libtorch loop; exit 1 when it differs
};

/// The model's seed (parameters are a function of it and their names, model.hpp).
inline constexpr std::uint64_t model_seed = 7;
/// The element type: double, so that step 0's gradients agree within 1e-5 of the largest whatever order
/// the ranks sum in, and ten Adam steps stay within 1e-4 of the plain loop's losses.
using value_type = double;
/// value_type as torch's dtype.
inline constexpr torch::Dtype dtype = torch::kFloat64;

/// The data: the mllm_train example's sources (the vendored samples in examples/data, through the data
/// plane's loader), with short steps: about 384 tokens of documents up to 96 tokens.
inline mllm::data_config data_config(const std::string& samples_dir) {
  mllm::data_config d;
  d.samples_dir = samples_dir;
  d.tokens_per_step = 384;
  d.max_doc_tokens = 96;
  d.max_caption_tokens = 24;
  d.max_item_tokens = 8;
  d.text_start = 0.4;  // images and audio from the first step on: every encoder has a gradient at step 0
  d.image_start = 0.35;
  d.audio_start = 0.25;
  return d;
}

/// The model's sizes for the data `d` (its vocabulary and feature widths).
inline shape model_shape(const mllm::data_config& d) {
  shape s;
  s.vocab = d.vocab;
  s.image_dim = d.image_dim;
  s.audio_dim = d.audio_dim;
  return s;
}

}  // namespace torch_train
