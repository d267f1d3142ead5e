// SPDX-License-Identifier: Apache-2.0
// example_mllm_train's command line (main.cpp parses it; the run_*.cpp files and the reports read it).
#pragma once

#include <string>

#include <hetmesh_tools/args.hpp>

namespace mllm {

/// A bad flag or combination of flags (exit status 2, one line on stderr): the one argument parser's error.
using usage_error = hetmesh::tools::usage_error;

/// The flags of example_mllm_train (main.cpp's usage).
struct options {
  int steps = 60, ranks = 8, pp = 2, kill_after = -1;
  int hosts = 0;  ///< data-plane hosts after the trainers (--hosts): they load and send, the others train
  int tp = 1;     ///< tensor-parallel ranks (--tp): heads, MLP columns and the vocabulary split over them
  int ep = 1;     ///< expert-parallel ranks (--ep): the MoE layer's experts spread over them
  int zero = 0;   ///< ZeRO stage (--zero 0|1): 1 shards Adam's moments over each group's ranks
  std::string backend = "loopback", partition = "hdp", schedule = "1f1b", encoder = "joint", balancer;
  std::string checkpoint_dir, report, out, data_dir;
  bool resume = false, check_parity = false;
  int checkpoint_every = 1;       ///< checkpoint after every N steps (--checkpoint-every N; and the last)
  bool async_checkpoint = false;  ///< write checkpoints on a background thread (--async-checkpoint)
  bool answer_only_loss = false;  ///< captions carry a loss mask (--answer-only-loss: data_config's field)
};

}  // namespace mllm
