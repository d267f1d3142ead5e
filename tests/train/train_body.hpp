// SPDX-License-Identifier: Apache-2.0
// Gradient parity bodies for train::system, one per rank, for any host communicator: loopback threads in
// test_train and mpirun processes in test_train_mpi (8 ranks). Each rank builds the same seeded random
// batch and the same model and compares one step of the distributed system with a single-rank run of the
// same global batch through train::check_parity (rank 0 runs it on a one-rank loopback world and
// broadcasts it). The verdict is the same on every rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/train.hpp>

#include "train/tiny_lm.hpp"

namespace traintest {

inline constexpr lm_shape kShape{};

/// A seeded random step: `docs` documents of 1..max_len tokens (ids 1000 + 7i), token ids in [1, vocab)
/// (0 is the pad token), and on about half of them a loss mask that drops a prompt-like prefix.
inline model::step_batch random_batch(std::uint64_t seed, int docs, std::int64_t max_len) {
  rng g(seed);
  model::step_batch b;
  b.pad_token = 0;
  for (int i = 0; i < docs; ++i) {
    model::document d;
    d.id = 1000 + 7 * i;
    const auto len = static_cast<std::int64_t>(g.uniform(1, max_len));
    for (std::int64_t t = 0; t < len; ++t)
      d.tokens.push_back(static_cast<std::int64_t>(g.uniform(1, kShape.vocab - 1)));
    if (g.uniform(0, 1) == 1) {
      d.loss_mask.assign(static_cast<std::size_t>(len), 1);
      for (std::int64_t t = 0; t < len / 3; ++t) d.loss_mask[static_cast<std::size_t>(t)] = 0;
    }
    b.documents.push_back(std::move(d));
  }
  return b;
}

/// The result of one step: the reduced gradients (concatenated) and the stats.
template <class T>
struct step_result {
  std::vector<T> grads;
  train::step_stats stats;
  int optimizer_calls = 0;
};

/// An optimizer hook that records the gradients it is handed (after the reduction) and does not update.
template <class T>
struct recording_optimizer {
  step_result<T>* out;
  template <class P, class G>
  void operator()(P&&, G&& grads) const {
    ++out->optimizer_calls;
    out->grads.clear();
    for (auto g : grads) out->grads.insert(out->grads.end(), g.begin(), g.end());
  }
};

/// Parity verdict (train::check_parity's, reduced over the world) and the step's stats beside the batch's
/// own counts.
struct verdict {
  double rel = 0;            ///< gradient error relative to the largest gradient
  double loss_rel = 0;       ///< loss relative error
  std::int64_t targets = 0;  ///< stats.targets (sum of loss weights over ranks)
  std::int64_t tokens = 0;   ///< stats.tokens
  std::int64_t expected_targets = 0, expected_tokens = 0;
  std::int64_t micro_batches = 0;
  int optimizer_calls = 0;
  std::vector<int> ring_sizes;  ///< sizes of the plan's rings (for coverage)
  std::string parity;           ///< check_parity's result, printed

  std::string describe() const {
    return fmt::format("{}; {} micro-batches, rings {}", parity, micro_batches, ring_sizes);
  }
};

/// One step of tiny_lm under `partition` placed by `balancer` over `world` against the 1-rank reference
/// (train::check_parity), on a seeded random batch. Collective over world.
template <class T, class Partition, class C, class Balancer = train::family_placement>
verdict parity_body(C& world, const Partition& partition, std::uint64_t seed, int docs, std::int64_t max_len,
                    const Balancer& balancer = {}) {
  const auto batch = random_batch(seed, docs, max_len);
  train::system<Partition, model::reference_attention, C, Balancer> sys(partition, balancer, world);
  const auto r = train::check_parity(sys, batch,
                                     [&](int, std::span<const int>) { return tiny_lm<T>(kShape, seed + 1); });
  verdict v;
  v.rel = r.rel_error;
  v.loss_rel = r.loss_rel_error;
  v.targets = r.targets;
  v.tokens = r.tokens;
  const auto s = model::summarize_step(batch);
  v.expected_targets = s.targets;
  v.expected_tokens = s.tokens;
  v.micro_batches = r.stats.micro_batches;
  v.optimizer_calls = r.optimizer_calls;
  v.parity = fmt::format("{}", r);
  const auto plan = train::plan_step(partition, model::document_descs(batch), world.size(), balancer);
  for (const auto& ring : plan.rings) v.ring_sizes.push_back(ring.size());
  std::sort(v.ring_sizes.begin(), v.ring_sizes.end());
  return v;
}

/// The HDP family of the tests: a capacity small enough that the longer documents need rings of 2 to 4,
/// no offloading.
inline seq::hdp<seq::no_offload> test_hdp(
    seq::hdp_placement_kind placement = seq::hdp_placement_kind::waves) {
  return {.capacity = 16, .placement = placement};
}

}  // namespace traintest
