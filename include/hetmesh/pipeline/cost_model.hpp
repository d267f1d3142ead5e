// SPDX-License-Identifier: Apache-2.0
// hetmesh::pipeline: what the simulator charges per action: the cost model (compute seconds, transfer
// seconds, activation bytes, how an overlapped F+B combines its halves), and two ways to build one:
// equal costs for every micro-batch (uniform_costs), and per-micro-batch costs, filled by hand or priced
// with cost/'s models (micro_batch_costs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "../core/checked.hpp"
#include "../core/error.hpp"
#include "../cost/activation_memory.hpp"
#include "../cost/comm.hpp"
#include "../cost/compute.hpp"
#include "action.hpp"

namespace hetmesh::pipeline {

/// Per-action costs. `compute` is required; the others default to 0 seconds and 1 unit.
struct cost_model {
  /// Seconds a compute action (F, B, I, W, EF, EB, REDUCE_GRAD) occupies its rank's stream.
  std::function<double(const action&)> compute{};
  /// Seconds to move the output of producing action `a` (F: activation; B/I: input gradient; EF: encoder
  /// output; B/I on stage 0: embedding gradient) to a consumer on another rank.
  std::function<double(const action&)> transfer{};
  /// Bytes an F or EF keeps alive until its B / W / EB.
  std::function<std::int64_t(const action&)> memory{};
  /// Seconds an overlapped forward-backward (OVERLAP_F_B) occupies its rank's stream, from its halves'
  /// `compute` seconds (forward, backward). Empty: their sum, because both halves run on the one
  /// compute stream (what DualPipe overlaps is a half's communication, which no action here models);
  /// e.g. `[](double f, double b) { return std::max(f, b); }` for perfect overlap.
  std::function<double(double, double)> overlap{};
};

/// Equal costs for every micro-batch: F = forward, B = backward, I = backward - weight, W = weight,
/// EF = encoder_forward, EB = encoder_backward, each transfer = transfer, memory 1 per activation.
struct uniform_costs {
  double forward = 1.0;           ///< F
  double backward = 2.0;          ///< full B
  double weight = 1.0;            ///< the W part of a split backward (I takes backward - weight)
  double encoder_forward = 0.0;   ///< EF
  double encoder_backward = 0.0;  ///< EB
  double transfer = 0.0;          ///< each send/recv

  /// The cost model of these costs, for simulate().
  [[nodiscard]] cost_model model() const {
    const uniform_costs c = *this;
    cost_model m;
    m.compute = [c](const action& a) {
      switch (a.type) {
        case action_type::forward:
          return c.forward;
        case action_type::backward:
          return c.backward;
        case action_type::backward_input:
          return c.backward - c.weight;
        case action_type::backward_weight:
          return c.weight;
        case action_type::encoder_forward:
          return c.encoder_forward;
        case action_type::encoder_backward:
          return c.encoder_backward;
        default:
          return 0.0;
      }
    };
    m.transfer = [c](const action&) { return c.transfer; };
    return m;
  }
};

/// Per-action costs of variable micro-batches, in seconds: a stage's forward of micro-batch k costs
/// forward_s[k], the full backward twice that (I and W one forward each); transfer_s[k] moves its
/// activation (or gradient) between stages; an F keeps memory_bytes[k] alive. Built from cost/'s
/// models by `priced`, or filled by hand.
struct micro_batch_costs {
  std::vector<double> forward_s;           ///< per micro-batch: forward time
  std::vector<double> transfer_s;          ///< per micro-batch: stage-to-stage transfer time
  std::vector<std::int64_t> memory_bytes;  ///< per micro-batch: activation memory of an F

  /// Prices micro-batch k (its documents `docs[k]`, packed in one row) with cost/ models: the
  /// backbone `llm` (llm.layers layers, in ms) cut into `stage_shards` equal parts (pipeline stages x
  /// tensor-parallel ranks), so a stage's forward is llm.packed_row / (train_factor x stage_shards);
  /// the activation handed on is tokens x hidden bf16 values over `stage_link`; a stage keeps
  /// act.bytes(tokens). Pre: stage_shards > 0, hidden >= 0. O(documents).
  [[nodiscard]] static micro_batch_costs priced(std::span<const std::vector<std::int64_t>> docs,
                                                const cost::llm_compute& llm, double stage_shards,
                                                const cost::link& stage_link, std::int64_t hidden,
                                                const cost::activation_memory& act) {
    if (!(stage_shards > 0.0) || hidden < 0)
      throw_error<invalid_argument>(
          "pipeline::micro_batch_costs::priced: stage_shards = {}, hidden = {}; expected > 0 and >= 0",
          stage_shards, hidden);
    micro_batch_costs c;
    for (const auto& d : docs) {
      const std::int64_t tokens =
          checked_sum(d, "pipeline::micro_batch_costs::priced: a micro-batch's tokens");
      // Activation bytes are int64 in the simulator; 2^62 leaves room for the live ones' sum to be checked.
      if (!(act.bytes(tokens) < 0x1p62))
        throw_error<overflow_error>(
            "pipeline::micro_batch_costs::priced: a micro-batch of {} tokens keeps {:.3g} activation bytes "
            "on a "
            "stage; expected fewer than 2^62",
            tokens, act.bytes(tokens));
      // Model units are ms; the simulator's are seconds.
      c.forward_s.push_back(llm.packed_row(d) / (llm.train_factor * stage_shards) / 1000.0);
      c.transfer_s.push_back(
          stage_link.time(2.0 * static_cast<double>(hidden) * static_cast<double>(tokens)) / 1000.0);
      c.memory_bytes.push_back(static_cast<std::int64_t>(act.bytes(tokens)));
    }
    return c;
  }

  /// The cost model of these costs, for simulate().
  [[nodiscard]] cost_model model() const {
    const auto f = forward_s;
    const auto t = transfer_s;
    const auto m = memory_bytes;
    cost_model c;
    c.compute = [f](const action& a) {
      const double x = f.at(static_cast<std::size_t>(a.microbatch));
      switch (a.type) {
        case action_type::forward:
          return x;
        case action_type::backward:
          return 2.0 * x;
        case action_type::backward_input:
        case action_type::backward_weight:
          return x;
        default:
          return 0.0;
      }
    };
    c.transfer = [t](const action& a) {
      return a.microbatch >= 0 ? t.at(static_cast<std::size_t>(a.microbatch)) : 0.0;
    };
    c.memory = [m](const action& a) {
      return a.microbatch >= 0 ? m.at(static_cast<std::size_t>(a.microbatch)) : std::int64_t{0};
    };
    return c;
  }
};

}  // namespace hetmesh::pipeline
