// SPDX-License-Identifier: Apache-2.0
// ZeRO-1 (train::zero1): the shard layout covers every element exactly once; zero1 over loopback ranks gives
// the replicated optimizer's parameters bit for bit (buckets that cut tensors, rank-order sums on and off,
// gradients kept whole on request); through train::system, several steps of the multimodal model under DP,
// static CP, HDP and a pipeline give the replicated run's losses and parameters bit for bit, with
// optimizer state per rank about 1/P of the replicated state.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/train/train.hpp>

#include "support/rank0.hpp"
#include "train/pipeline_body.hpp"

using namespace hetmesh;

namespace {

TEST_CASE("train::shard_layout: every element in exactly one rank's slice, positions distinct and in range") {
  rng g(2026);
  for (int trial = 0; trial < 300; ++trial) {
    const train::shard_layout l{g.uniform(0, 200), g.uniform(1, 40), static_cast<int>(g.uniform(1, 9))};
    std::vector<int> owner(static_cast<std::size_t>(l.padded_elements()), -1);
    std::int64_t shard_total = 0;
    for (int r = 0; r < l.ranks; ++r)
      for (std::int64_t b = 0; b < l.buckets(); ++b) {
        CHECK(l.padded(b) == l.ranks * l.slice(b));
        for (std::int64_t k = 0; k < l.slice(b); ++k) {
          auto& o = owner.at(static_cast<std::size_t>(l.padded_offset(b) + r * l.slice(b) + k));
          CHECK(o == -1);
          o = r;
        }
        if (r == 0) shard_total += l.slice(b);
      }
    CHECK(shard_total == l.shard_elements());
    CHECK(l.shard_elements() * l.ranks == l.padded_elements());
    std::vector<int> seen(owner.size(), 0);
    for (std::int64_t i = 0; i < l.elements; ++i) {  // element i's padded position: distinct, owned
      const auto pos = (i / l.bucket) * l.padded(0) + i % l.bucket;
      CHECK(owner.at(static_cast<std::size_t>(pos)) >= 0);
      CHECK(++seen[static_cast<std::size_t>(pos)] == 1);
    }
    CHECK(l.padded_elements() - l.elements < l.buckets() * l.ranks + (l.elements == 0 ? 1 : 0));
  }
}

// A rank's gradient of element i of tensor k at step s.
double grad_of(int rank, std::size_t k, std::size_t i, int s) {
  return static_cast<double>(
             key_hash({static_cast<std::uint64_t>(rank), k, i, static_cast<std::uint64_t>(s)}) >> 11) *
             0x1.0p-53 -
         0.5;
}

// Three steps of adam on tensors of `sizes` (parameters equal on every rank, gradients per rank), replicated
// (all-reduce, then adam) or sharded (zero1). Returns this rank's parameters and gradients after the steps,
// and the optimizer's state bytes.
struct steps_result {
  std::vector<std::vector<double>> params, grads;
  std::int64_t state_bytes = 0;
};
steps_result three_steps(comm::loopback::communicator& c, const std::vector<std::size_t>& sizes, bool sharded,
                         std::int64_t bucket_bytes, bool in_rank_order, bool keep_full) {
  steps_result r;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    r.params.emplace_back(sizes[k]);
    for (std::size_t i = 0; i < sizes[k]; ++i) r.params[k][i] = grad_of(99, k, i, 0);
    r.grads.emplace_back(sizes[k]);
  }
  auto spans = [](std::vector<std::vector<double>>& v) {
    std::vector<std::span<double>> s;
    for (auto& t : v) s.emplace_back(t);
    return s;
  };
  train::adam<double> replicated{.lr = 0.01, .weight_decay = 0.1};
  train::zero1<train::adam<double>> zero{.inner = {.lr = 0.01, .weight_decay = 0.1},
                                         .bucket_bytes = bucket_bytes,
                                         .keep_full_gradients = keep_full};
  const model::host_memory mem;
  for (int s = 0; s < 3; ++s) {
    for (std::size_t k = 0; k < sizes.size(); ++k)
      for (std::size_t i = 0; i < sizes[k]; ++i) r.grads[k][i] = grad_of(c.rank(), k, i, s);
    if (sharded) {
      zero.step(c, mem, spans(r.params), spans(r.grads), in_rank_order);
    } else {
      for (auto g : spans(r.grads)) train::sum_over_ranks(c, mem, g, in_rank_order);
      replicated(spans(r.params), spans(r.grads));
    }
  }
  r.state_bytes = sharded ? train::optimizer_state_bytes(zero) : train::optimizer_state_bytes(replicated);
  return r;
}

TEST_CASE("train::zero1 on loopback ranks: the replicated adam's parameters bit for bit") {
  const std::vector<std::size_t> sizes{7, 13, 1, 40};  // 61 elements
  for (const int ranks : {1, 3, 4}) {
    for (const std::int64_t bucket : {std::int64_t{5 * 8}, std::int64_t{1} << 20}) {
      for (const bool ordered : {false, true}) {
        comm::loopback::run(ranks, [&](comm::loopback::communicator& c) {
          const auto want = three_steps(c, sizes, false, bucket, ordered, false);
          const auto got = three_steps(c, sizes, true, bucket, ordered, false);
          CHECK(got.params == want.params);
          const auto whole = three_steps(c, sizes, true, bucket, ordered, true);
          CHECK(whole.params == want.params);
          CHECK(whole.grads == want.grads);  // the reduced gradients, gathered back
          // Adam's moments: 2 x 61 doubles replicated; zero1 holds 2 x this rank's padded shard.
          CHECK(want.state_bytes == 2 * 61 * 8);
          const train::shard_layout l{61, bucket / 8, ranks};
          CHECK(got.state_bytes == 2 * l.shard_elements() * 8);
        });
      }
    }
  }
}

TEST_CASE("train::zero1: bad input is refused naming what is wrong") {
  comm::loopback::run(2, [](comm::loopback::communicator& c) {
    std::vector<double> p(4), g(3);
    train::zero1<train::sgd<double>> z{.bucket_bytes = 64};
    const model::host_memory mem;
    CHECK_THROWS_WITH_AS(
        z.step(c, mem, std::vector<std::span<double>>{p}, std::vector<std::span<double>>{g}, false),
        doctest::Contains("tensor 0 has 3 gradients for 4 parameters"), invalid_argument);
    z.bucket_bytes = 4;
    CHECK_THROWS_WITH_AS(
        z.step(c, mem, std::vector<std::span<double>>{p}, std::vector<std::span<double>>{p}, false),
        doctest::Contains("bucket_bytes 4; expected at least one element (8 bytes)"), invalid_argument);
  });
}

// Steps of the multimodal model (tiny_stack, two encoders) under `partition` and `pc`, one new batch per
// step, with adam or zero1(adam); every rank returns its tensors by id after the last step (encoders: -1,
// -2), the losses and its last step's stats.
struct run_result {
  std::map<int, std::vector<double>> params;
  std::vector<double> losses;
  train::step_stats last;
};
template <class Partition, class Balancer, class Schedule, class Placement, class Opt>
run_result train_steps(comm::loopback::communicator& world, const Partition& partition,
                       const Balancer& balancer, const train::pipeline_config<Schedule, Placement>& pc,
                       Opt& opt, int steps) {
  using namespace traintest;
  using sys_t = train::system<Partition, model::reference_attention, comm::loopback::communicator, Balancer,
                              Schedule, Placement>;
  sys_t sys(partition, balancer, pc, world, {}, {});
  run_result r;
  std::optional<tiny_stack<double>> lm;
  model::scale_encoder<double, model::vision_modality> vision(kShape.width, 0.9);
  model::scale_encoder<double, model::audio_modality> audio(kShape.width, 1.1);
  for (int s = 0; s < steps; ++s) {
    const auto batch = random_mm_batch(700 + static_cast<std::uint64_t>(s), 9, 36);
    const auto plan = sys.plan(batch);
    if (!lm) lm.emplace(kShape, 5, kBlocks, plan.pipeline.num_stages, sys.local_stages(plan));
    r.last =
        sys.run(plan, batch, *lm, opt, train::bind_encoder(vision, item_features<double>{kShape.width, 0}),
                train::bind_encoder(audio, item_features<double>{kShape.width, 1}));
    r.losses.push_back(r.last.loss);
  }
  r.params = lm->param;
  for (auto p : vision.parameters()) r.params[-1].insert(r.params[-1].end(), p.begin(), p.end());
  for (auto p : audio.parameters()) r.params[-2].insert(r.params[-2].end(), p.begin(), p.end());
  return r;
}

struct zero_verdict {
  int mismatched_tensors = 1;
  bool losses_equal = false;
  double state_ratio = 0;     // zero1's optimizer state / the replicated one's, the largest over ranks
  int report_mismatches = 1;  // ranks whose gathered report's memory figures differ from their stats
  int ranks = 0;
};

template <class Partition, class Balancer, class Schedule, class Placement>
zero_verdict compare(const Partition& partition, const Balancer& balancer,
                     const train::pipeline_config<Schedule, Placement>& pc,
                     std::int64_t bucket_bytes = std::int64_t{16} << 20) {
  return testsupport::rank0_of(8, [&](comm::loopback::communicator& w) {
    train::adam<double> adam{.lr = 0.01};
    train::zero1<train::adam<double>> zero{.inner = {.lr = 0.01}, .bucket_bytes = bucket_bytes};
    const auto want = train_steps(w, partition, balancer, pc, adam, 3);
    const auto got = train_steps(w, partition, balancer, pc, zero, 3);
    zero_verdict v;
    int bad = 0;
    for (const auto& [id, p] : want.params) bad += got.params.at(id) != p ? 1 : 0;
    comm::all_reduce(w, std::span<int>(&bad, 1), comm::reduce_op::sum);
    v.mismatched_tensors = bad;
    v.losses_equal = got.losses == want.losses;
    double ratio = static_cast<double>(got.last.optimizer_state_bytes) /
                   static_cast<double>(want.last.optimizer_state_bytes);
    comm::all_reduce(w, std::span<double>(&ratio, 1), comm::reduce_op::max);
    v.state_ratio = ratio;
    const auto rep = train::gather_report(w, got.last);
    const auto me = static_cast<std::size_t>(w.rank());
    int off = rep.optimizer_state_bytes.size() != 8 ||
              rep.optimizer_state_bytes.at(me) != got.last.optimizer_state_bytes ||
              rep.parameter_bytes.at(me) != got.last.parameter_bytes || got.last.parameter_bytes <= 0 ||
              rep.gradient_bytes.at(me) != got.last.gradient_bytes;
    comm::all_reduce(w, std::span<int>(&off, 1), comm::reduce_op::sum);
    v.report_mismatches = off;
    v.ranks = w.size();
    return v;
  });
}

TEST_CASE("train::system with zero1: the replicated adam's losses and parameters, optimizer state 1/P") {
  using traintest::kBlocks;
  const train::pipeline_config<> pp1{};
  // DP (one rank per document group), static CP, HDP: the pool is all 8 ranks (P = 8); the encoders'
  // group is the world (8). Pipeline of 2: each stage's pool has 4 ranks.
  const auto dp = compare(seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{}, pp1);
  CHECK(dp.mismatched_tensors == 0);
  CHECK(dp.losses_equal);
  MESSAGE("zero1 optimizer state / replicated, DP over 8: ", dp.state_ratio);
  CHECK(dp.state_ratio <= 1.05 / 8);
  CHECK(dp.report_mismatches == 0);
  // Buckets of 12 doubles: every tensor cut across buckets.
  const auto cp = compare(seq::cp_zigzag{.cp = 2, .pad = true}, train::family_placement{}, pp1, 96);
  CHECK(cp.mismatched_tensors == 0);
  CHECK(cp.losses_equal);
  const auto hdp = compare(seq::hdp<seq::selective_offload>{.capacity = 24}, balance::bytescale{}, pp1);
  CHECK(hdp.mismatched_tensors == 0);
  CHECK(hdp.losses_equal);
  const auto pp2 =
      compare(seq::cp_thd{.cp = 2, .pad = true}, train::family_placement{},
              train::pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{2, {}, {}});
  CHECK(pp2.mismatched_tensors == 0);
  CHECK(pp2.losses_equal);
  CHECK(pp2.state_ratio <= 1.05 / 4);  // the stages over pools of 4, the encoders over the world
}

}  // namespace
