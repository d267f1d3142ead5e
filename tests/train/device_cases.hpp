// SPDX-License-Identifier: Apache-2.0
// train::system's device path without a GPU, for any host communicator (loopback threads, MPI processes):
// the same multimodal step (tiny_stack, two encoders) on 8 ranks twice, once over the host communicator and
// host memory, once over comm::emulated_device and model::emulated_device_memory, where every buffer the
// runtime holds is an emulated device pointer (a CPU access faults; a host buffer handed to the device
// communicator or policy is refused). The models sit behind adapters that map spans to host memory as a GPU
// model's kernels would read them (device_stage.hpp). Gradients, loss and counts must be equal bit for bit,
// over partitions, schedules (split backward included), encoder placements and balancers, with plan
// agreement checked on the device path where the tests build at the collective assertion level.
#pragma once

#include <doctest/doctest.h>

#include <string>

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/pipeline/dualpipe.hpp>

#include "train/device_stage.hpp"
#include "train/pipeline_body.hpp"

namespace traintest {

/// run_mm_step over comm::emulated_device on the same ranks as `world`, the models behind device adapters.
template <class T, template <class, class> class Encoder, class Partition, class Balancer, class Schedule,
          class Placement, class C>
mm_result<T> run_device_mm_step(C& world, const Partition& partition, const Balancer& balancer,
                                const train::pipeline_config<Schedule, Placement>& pc,
                                const model::step_batch& batch, std::uint64_t seed,
                                const train::system_options& options = {}) {
  using D = comm::emulated_device<C>;
  D dev(comm::split(world, 0, world.rank()));
  using sys_t = train::system<Partition, device_reference_attention, D, Balancer, Schedule, Placement>;
  static_assert(std::is_same_v<typename sys_t::memory_type, model::emulated_device_memory>);
  sys_t sys(partition, balancer, pc, dev, {}, options);
  device_stage<tiny_stack<T>, T> lm{
      tiny_stack<T>(kShape, seed, kBlocks, sys.num_stages(), sys.local_stages())};
  device_encoder<Encoder<T, model::vision_modality>, T> vision{
      Encoder<T, model::vision_modality>(kShape.width, T(0.9))};
  device_encoder<Encoder<T, model::audio_modality>, T> audio{
      Encoder<T, model::audio_modality>(kShape.width, T(1.1))};
  const auto plan = sys.plan(batch, vision, audio);  // as run_mm_step: the encoders' heads in the plan
  int calls = 0;
  mm_result<T> r;
  r.stats = sys.run(plan, batch, lm, mm_optimizer<T>{&calls},
                    train::bind_encoder(vision, device_input<item_features<T>>{{kShape.width, 0}}),
                    train::bind_encoder(audio, device_input<item_features<T>>{{kShape.width, 1}}));
  if (calls != 3)
    throw_error<invalid_argument>(
        "device mm step: optimizer called {} times; expected 3 (stage + 2 encoders)", calls);
  r.grads = lm.inner.grad;
  r.grads[-1] = all_gradients<T>(vision.inner);
  r.grads[-2] = all_gradients<T>(audio.inner);
  return r;
}

/// What a device run differs in from the host run, reduced over the world: the number of ranks that saw a
/// difference, this rank's first one, and the step's encoder items.
struct device_verdict {
  int differing_ranks = 0;
  std::string first;
  std::int64_t encoder_items = 0;
};

/// Host and device runs of one configuration on `world`: collective; every rank returns the same counts.
template <class T, template <class, class> class Encoder = model::scale_encoder, class Partition,
          class Balancer, class Schedule, class Placement, class C>
device_verdict device_body(C& world, const Partition& partition, const Balancer& balancer,
                           const train::pipeline_config<Schedule, Placement>& pc, std::uint64_t seed,
                           int docs, std::int64_t max_len, const train::system_options& options = {}) {
  const auto batch = random_mm_batch(seed, docs, max_len);
  const auto host = run_mm_step<T, Encoder>(world, partition, balancer, pc, batch, seed + 1, options);
  const auto dev = run_device_mm_step<T, Encoder>(world, partition, balancer, pc, batch, seed + 1, options);
  std::string d;
  if (host.grads.size() != dev.grads.size())
    d += fmt::format("{} vs {} tensors; ", host.grads.size(), dev.grads.size());
  for (const auto& [id, g] : host.grads)
    if (!dev.grads.contains(id) || dev.grads.at(id) != g) d += fmt::format("tensor {} differs; ", id);
  if (host.stats.loss != dev.stats.loss) d += fmt::format("loss {} vs {}; ", host.stats.loss, dev.stats.loss);
  if (host.stats.targets != dev.stats.targets || host.stats.tokens != dev.stats.tokens ||
      host.stats.encoder_items != dev.stats.encoder_items || host.stats.plan_hash != dev.stats.plan_hash)
    d += "stats differ; ";
  int differing = d.empty() ? 0 : 1;
  comm::all_reduce(world, std::span<int>(&differing, 1), comm::reduce_op::sum);
  return {differing, d, dev.stats.encoder_items};
}

inline void check_device(const device_verdict& v, const std::string& what) {
  MESSAGE(what, ": ", v.encoder_items, " encoder items; ranks differing: ", v.differing_ranks, " ", v.first);
  CHECK(v.differing_ranks == 0);
  CHECK(v.encoder_items > 0);
}

/// The configurations: static CP, HDP with both balancers, Ulysses; 1F1B, zero-bubble, ZBV, interleaved,
/// DualPipeV; encoders on the first stage, joint, in a separate pool; long-short SP with attention inside
/// items; double and float; the reproducible reduction.
template <class On8>
void device_cases(On8 on8) {
  const auto fam = train::family_placement{};
  const auto first = pipeline::encoder_on_first_stage{};
  const auto joint = pipeline::colocated_encoder{};
  using train::pipeline_config;
  check_device(on8([&](auto& w) {
                 return device_body<double>(
                     w, seq::cp_zigzag{.cp = 2, .pad = true}, fam,
                     pipeline_config<pipeline::one_f_one_b, pipeline::encoder_on_first_stage>{2, {}, first},
                     11, 10, 30);
               }),
               "zigzag cp2 pp2 1f1b first-stage");
  check_device(on8([&](auto& w) {
                 return device_body<double>(
                     w, test_hdp(), balance::bytescale{},
                     pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{2, {}, joint}, 11,
                     12, 50);
               }),
               "hdp bytescale pp2 1f1b joint");
  check_device(on8([&](auto& w) {
                 return device_body<double>(
                     w, seq::cp_zigzag{.cp = 4, .pad = true}, fam,
                     pipeline_config<pipeline::zero_bubble, pipeline::colocated_encoder>{2, {}, joint}, 12,
                     10, 30);
               }),
               "zigzag cp4 pp2 zero-bubble joint");
  check_device(on8([&](auto& w) {
                 return device_body<float>(
                     w, test_hdp(), balance::gap_filling_hdp{},
                     pipeline_config<pipeline::zbv, pipeline::encoder_on_first_stage>{2, {}, first}, 12, 12,
                     50);
               }),
               "hdp gap-filling pp2 zbv first-stage float");
  check_device(on8([&](auto& w) {
                 return device_body<double>(w, test_hdp(), balance::bytescale{},
                                            pipeline_config<pipeline::one_f_one_b, pipeline::encoder_pool>{
                                                2, {}, pipeline::encoder_pool{.ranks = 2}},
                                            11, 10, 30);
               }),
               "hdp bytescale pp2 1f1b encoder-pool(2)");
  check_device(on8([&](auto& w) {
                 return device_body<double>(
                     w, seq::ulysses{.degree = 2, .heads = 2, .kv_heads = 1, .head_dim = 4}, fam,
                     pipeline_config<pipeline::interleaved_1f1b, pipeline::colocated_encoder>{2, {}, joint},
                     11, 10, 30);
               }),
               "ulysses 2 pp2 interleaved-1f1b joint");
  train::system_options split;  // long-short SP: encoder items above 3 tokens run over Ulysses groups
  split.encoder_sp.max_tokens_per_rank = 3;
  split.encoder_sp.heads = attention_encoder<double, model::vision_modality>::kHeads;
  check_device(on8([&](auto& w) {
                 return device_body<double, attention_encoder>(
                     w, seq::cp_zigzag{.cp = 2, .pad = true}, fam,
                     pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{2, {}, joint}, 31,
                     10, 30, split);
               }),
               "long-short attention encoders, zigzag cp2 pp2 1f1b joint");
  train::system_options repro;
  repro.reproducible = true;  // gradients and stats reduced in rank order through device buffers
  check_device(on8([&](auto& w) {
                 return device_body<double>(
                     w, seq::cp_thd{.cp = 2, .pad = true}, fam,
                     pipeline_config<pipeline::dualpipev, pipeline::colocated_encoder>{2, {}, joint}, 13, 10,
                     30, repro);
               }),
               "thd cp2 pp2 dualpipev joint reproducible");
}

}  // namespace traintest
