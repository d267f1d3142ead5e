// SPDX-License-Identifier: Apache-2.0
// bench_train's memory row: the example's backbone (examples/mllm_train, text only, pp = 1) over a pool of
// P loopback ranks (HDP, gap-filling), one training step with replicated Adam and one with ZeRO-1 over
// the same Adam (train::zero1), side by side. The bytes are what each rank's step_stats reports
// (parameter_bytes, gradient_bytes, optimizer_state_bytes, gathered by train::gather_report); they are
// accounted bytes, so the row is the same on any machine. Target: with ZeRO-1, every rank's optimizer state
// is within 5% of 1/P of the replicated state (ZeRO-1 pads each bucket to a multiple of P, so a rank may
// hold a few elements more than 1/P).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/train.hpp>
#include <hetmesh/train/zero.hpp>

#include "mllm_train/backbone.hpp"

namespace hetmesh::bench {

/// One pool size's figures: per rank, the bytes under replicated Adam and under ZeRO-1.
struct memory_figures {
  int pool = 0;
  std::vector<std::int64_t> parameter_bytes, gradient_bytes;            // the same under both optimizers
  std::vector<std::int64_t> replicated_state_bytes, zero1_state_bytes;  // per rank
  double worst_ratio_over_target = 0;  // max over ranks |(zero1 / replicated) x P - 1|
  bool same_parameters = false;        // both optimizers' parameters equal after the step (bitwise)
};

/// Runs the memory row for a pool of `pool` loopback ranks on `batch` (HDP with capacity `capacity`).
inline memory_figures measure_memory(const mllm::config& mc, int pool, const model::step_batch& batch,
                                     std::int64_t capacity) {
  using comm_t = comm::loopback::communicator;
  memory_figures out;
  out.pool = pool;
  comm::loopback::run(pool, [&](comm_t& c) {
    using system_t = train::system<seq::hdp<seq::no_offload>, model::reference_attention, comm_t,
                                   balance::gap_filling_hdp>;
    system_t sys(seq::hdp<seq::no_offload>{.capacity = capacity}, balance::gap_filling_hdp{}, c);
    const auto plan = sys.plan(batch);
    mllm::backbone<float> rep_model(mc, 7, plan.pipeline.num_stages, sys.local_stages(plan));
    mllm::backbone<float> zero_model(mc, 7, plan.pipeline.num_stages, sys.local_stages(plan));
    train::adam<float> adam{.lr = 1e-3F};
    train::zero1<train::adam<float>> zero{.inner = {.lr = 1e-3F}};
    const auto rep = train::gather_report(c, sys.run(plan, batch, rep_model, adam));
    const auto z = train::gather_report(c, sys.run(plan, batch, zero_model, zero));
    // Loopback's all-reduce adds in rank order, as zero1's reduce-scatter does: the same bits.
    int differs = 0;
    const auto a = rep_model.parameters(), z_params = zero_model.parameters();
    if (a.size() != z_params.size()) differs = 1;
    for (std::size_t k = 0; differs == 0 && k < a.size(); ++k)
      differs = std::equal(a[k].begin(), a[k].end(), z_params[k].begin(), z_params[k].end()) ? 0 : 1;
    comm::all_reduce(c, std::span<int>(&differs, 1), comm::reduce_op::sum);
    if (c.rank() != 0) return;
    out.parameter_bytes = z.parameter_bytes;
    out.gradient_bytes = z.gradient_bytes;
    out.replicated_state_bytes = rep.optimizer_state_bytes;
    out.zero1_state_bytes = z.optimizer_state_bytes;
    out.same_parameters = differs == 0;
    for (std::size_t r = 0; r < z.optimizer_state_bytes.size(); ++r) {
      const double ratio = static_cast<double>(z.optimizer_state_bytes[r]) /
                           static_cast<double>(std::max<std::int64_t>(1, rep.optimizer_state_bytes[r]));
      out.worst_ratio_over_target = std::max(out.worst_ratio_over_target, std::abs(ratio * pool - 1.0));
    }
  });
  return out;
}

/// The row's JSON: per pool size P the bytes and the ratio; `ok` is set false when a pool misses the 5%.
inline nlohmann::json memory_row(const mllm::config& mc, const std::vector<int>& pools, std::int64_t capacity,
                                 bool& ok) {
  using nlohmann::json;
  json per = json::array();
  ok = true;
  std::printf("\nmemory per rank (bytes), replicated Adam vs ZeRO-1 over a pool of P ranks:\n");
  std::printf("%4s %12s %12s %14s %14s %10s %10s\n", "P", "parameters", "gradients", "Adam state",
              "ZeRO-1 state", "ratio", "ratio x P");
  for (int p : pools) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(p));
    std::uniform_int_distribution<std::int64_t> len(16, 256), tok(0, mc.vocab - 1);
    model::step_batch b;
    std::int64_t total = 0;
    while (total < capacity * p) {  // about one capacity of tokens per rank
      model::document d;
      d.id = static_cast<std::int64_t>(b.documents.size());
      const auto l = std::min(len(rng), capacity * p - total);
      for (std::int64_t t = 0; t < std::max<std::int64_t>(l, 1); ++t) d.tokens.push_back(tok(rng));
      total += d.length();
      b.documents.push_back(std::move(d));
    }
    const auto f = measure_memory(mc, p, b, capacity);
    const auto max_of = [](const std::vector<std::int64_t>& v) {
      return *std::max_element(v.begin(), v.end());
    };
    const double ratio = static_cast<double>(max_of(f.zero1_state_bytes)) /
                         static_cast<double>(max_of(f.replicated_state_bytes));
    const bool met = f.worst_ratio_over_target <= 0.05 && f.same_parameters;
    ok = ok && met;
    std::printf("%4d %12lld %12lld %14lld %14lld %10.4f %10.4f%s\n", p,
                static_cast<long long>(max_of(f.parameter_bytes)),
                static_cast<long long>(max_of(f.gradient_bytes)),
                static_cast<long long>(max_of(f.replicated_state_bytes)),
                static_cast<long long>(max_of(f.zero1_state_bytes)), ratio, ratio * p, met ? "" : "  MISSED");
    per.push_back({{"pool", p},
                   {"parameter_bytes_per_rank", f.parameter_bytes},
                   {"gradient_bytes_per_rank", f.gradient_bytes},
                   {"replicated_adam_state_bytes_per_rank", f.replicated_state_bytes},
                   {"zero1_adam_state_bytes_per_rank", f.zero1_state_bytes},
                   {"zero1_over_replicated_largest_rank", ratio},
                   {"target_ratio", 1.0 / p},
                   {"worst_rank_deviation_from_1_over_p", f.worst_ratio_over_target},
                   {"same_parameters_after_step", f.same_parameters},
                   {"within_5_percent", met}});
  }
  return {{"what",
           "the example's backbone (fp32) over a pool of P loopback ranks (HDP, gap-filling balancer), one "
           "step with replicated train::adam and one with train::zero1<train::adam> (one 16 MiB bucket): "
           "each rank's step_stats bytes (train::gather_report). Accounted bytes, not timed"},
          {"target", "every rank's ZeRO-1 optimizer state within 5% of 1/P of the replicated state"},
          {"met", ok},
          {"per_pool", per}};
}

}  // namespace hetmesh::bench
