// SPDX-License-Identifier: Apache-2.0
// Gradient parity bodies for train::system, one per rank, for any host communicator: loopback threads in
// test_train and mpirun processes in test_train_mpi (8 ranks). Each rank builds the same seeded random
// batch and the same model, runs one step of the distributed system, and compares the reduced gradients
// with those of a single-rank run of the same global batch (a one-rank loopback world, computed on every
// rank). Errors are reduced (max) over the world so every rank sees the same verdict.
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

/// One step of `partition` placed by `balancer` over `world` on `batch`: collective over world.
template <class T, class Partition, class C, class Balancer = train::family_placement>
step_result<T> run_step(C& world, const Partition& partition, const model::step_batch& batch,
                        std::uint64_t seed, const Balancer& balancer = {}) {
  train::system<Partition, model::reference_attention, C, Balancer> sys(partition, balancer, world);
  const auto plan = sys.plan(batch);
  tiny_lm<T> lm(kShape, seed);
  step_result<T> r;
  r.stats = sys.run(plan, batch, lm, recording_optimizer<T>{&r});
  return r;
}

/// The single-rank run of the same batch: every document whole on one rank (static THD with cp = 1 on a
/// one-rank loopback world).
template <class T>
step_result<T> single_rank(const model::step_batch& batch, std::uint64_t seed) {
  step_result<T> r;
  comm::loopback::run(1, [&](comm::loopback::communicator& c) {
    r = run_step<T>(c, seq::cp_thd{.cp = 1, .pad = true}, batch, seed);
  });
  return r;
}

/// Parity verdict: max |g - ref| / max |ref| over every gradient element, reduced over the world, and
/// the step's stats beside the batch's own counts.
struct verdict {
  double rel = 0;            ///< gradient relative error
  double loss_rel = 0;       ///< loss relative error
  std::int64_t targets = 0;  ///< stats.targets (sum of loss weights over ranks)
  std::int64_t tokens = 0;   ///< stats.tokens
  std::int64_t expected_targets = 0, expected_tokens = 0;
  std::int64_t micro_batches = 0;
  int optimizer_calls = 0;
  std::vector<int> ring_sizes;  ///< sizes of the plan's rings (for coverage)

  std::string describe() const {
    return fmt::format(
        "grad rel err {:.3g}, loss rel err {:.3g}, targets {}/{}, tokens {}/{}, {} micro-batches, "
        "rings {}",
        rel, loss_rel, targets, expected_targets, tokens, expected_tokens, micro_batches, ring_sizes);
  }
};

/// Largest |got - ref| and largest |ref| over gradient elements compared so far (a size mismatch counts
/// as an infinite error).
struct grad_error {
  double num = 0, den = 0;
  template <class T>
  void add(const std::vector<T>& got, const std::vector<T>& ref) {
    if (got.size() != ref.size()) num = 1e300;
    for (std::size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
      num = std::max(num, std::abs(static_cast<double>(got[i]) - static_cast<double>(ref[i])));
      den = std::max(den, std::abs(static_cast<double>(ref[i])));
    }
  }
  /// {gradient relative error, loss relative error}, the largest over the world's ranks. Collective.
  template <class C>
  std::pair<double, double> over(C& world, double loss, double ref_loss) const {
    double e[2] = {den > 0 ? num / den : num, std::abs(loss - ref_loss) / std::abs(ref_loss)};
    comm::all_reduce(world, std::span<double>(e), comm::reduce_op::max);
    return {e[0], e[1]};
  }
};

template <class T, class Partition, class C, class Balancer = train::family_placement>
verdict parity_body(C& world, const Partition& partition, std::uint64_t seed, int docs, std::int64_t max_len,
                    const Balancer& balancer = {}) {
  const auto batch = random_batch(seed, docs, max_len);
  const auto ref = single_rank<T>(batch, seed + 1);
  const auto got = run_step<T>(world, partition, batch, seed + 1, balancer);
  verdict v;
  grad_error err;
  err.add(got.grads, ref.grads);
  std::tie(v.rel, v.loss_rel) = err.over(world, got.stats.loss, ref.stats.loss);
  v.targets = got.stats.targets;
  v.tokens = got.stats.tokens;
  const auto s = model::summarize_step(batch);
  v.expected_targets = s.targets;
  v.expected_tokens = s.tokens;
  v.micro_batches = got.stats.micro_batches;
  v.optimizer_calls = got.optimizer_calls;
  const auto plan = train::plan_step(partition, model::document_descs(batch), world.size(), balancer);
  for (const auto& r : plan.rings) v.ring_sizes.push_back(r.size());
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
