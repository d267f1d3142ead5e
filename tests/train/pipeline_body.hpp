// SPDX-License-Identifier: Apache-2.0
// Pipelined, multimodal gradient parity for train::system, for any communicator (loopback threads, MPI
// processes): one step of tiny_stack with two encoders (vision and audio, model::scale_encoder) under a
// partition family, balancer, schedule family, pipeline depth and encoder placement, against a
// single-rank run of the same batch (pp = 1, one stage holding every block) through train::check_parity:
// every rank compares its own stages' tensors and the encoders' by global tensor id.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/model/stage.hpp>
#include <hetmesh/train/train.hpp>

#include "train/attention_encoder.hpp"
#include "train/tiny_stack.hpp"
#include "train/train_body.hpp"

namespace traintest {

inline constexpr int kBlocks = 4;
/// The model's sizes under tensor parallelism: 4 query and 2 KV heads split over tp 2 (2 and 1 per rank).
inline constexpr lm_shape kTpShape{.vocab = 13, .width = 8, .attn = {4, 2, 4}};

/// random_batch with encoder items: about half the documents of >= 6 tokens carry one item (encoder
/// doc % 2) over a third of their tokens, starting at token 1.
inline model::step_batch random_mm_batch(std::uint64_t seed, int docs, std::int64_t max_len) {
  auto b = random_batch(seed, docs, max_len);
  rng g(seed ^ 0x9e37u);
  for (std::size_t i = 0; i < b.documents.size(); ++i) {
    auto& d = b.documents[i];
    if (d.length() < 6 || g.uniform(0, 1) == 0) continue;
    const auto n = d.length() / 3;
    d.items.push_back({static_cast<int>(i % 2), static_cast<std::int64_t>(i), 1, n});
  }
  return b;
}

/// The encoders' input: a feature per (item, token, feature), in the view's buffer order.
template <class T>
struct item_features {
  std::int64_t width = 1;
  int encoder = 0;
  void operator()(const model::encoder_batch_view& v, std::span<T> in) const {
    for (const auto& p : v.pieces)
      for (std::int64_t t = p.tokens.begin; t < p.tokens.end; ++t)
        for (std::int64_t f = 0; f < width; ++f)
          in[static_cast<std::size_t>((p.offset + t - p.tokens.begin) * width + f)] = static_cast<T>(
              static_cast<double>(
                  key_hash({static_cast<std::uint64_t>(encoder), static_cast<std::uint64_t>(p.item),
                            static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(f)}) >>
                  11) *
                  0x1.0p-53 -
              0.5);
  }
};

template <class T>
struct mm_result {
  std::map<int, std::vector<T>> grads;  ///< by tensor id; encoders: -1 vision, -2 audio
  train::step_stats stats;
  int slots = 0, stages = 0, encoder_shards = 0;
};

template <class T>
struct mm_optimizer {
  int* calls;
  template <class P, class G>
  void operator()(P&&, G&&) const {
    ++*calls;
  }
};

/// Every gradient span of `e`, one after the other.
template <class T, class E>
std::vector<T> all_gradients(E& e) {
  std::vector<T> out;
  for (auto g : e.gradients()) out.insert(out.end(), g.begin(), g.end());
  return out;
}

/// One step of the multimodal model on `world` under the given policies, with encoders of type
/// Encoder<T, modality> (model::scale_encoder, or attention_encoder: attention inside items).
template <class T, template <class, class> class Encoder = model::scale_encoder, class Partition,
          class Balancer, class Schedule, class Placement, class C>
mm_result<T> run_mm_step(C& world, const Partition& partition, const Balancer& balancer,
                         const train::pipeline_config<Schedule, Placement>& pc,
                         const model::step_batch& batch, std::uint64_t seed,
                         const train::system_options& options = {}) {
  using sys_t = train::system<Partition, model::reference_attention, C, Balancer, Schedule, Placement>;
  sys_t sys(partition, balancer, pc, world, {}, options);
  // The model first (its stages are known before any plan), then the plan with its encoders' heads.
  tiny_stack<T> lm(kShape, seed, kBlocks, sys.num_stages(), sys.local_stages());
  Encoder<T, model::vision_modality> vision(kShape.width, T(0.9));
  Encoder<T, model::audio_modality> audio(kShape.width, T(1.1));
  const auto plan = sys.plan(batch, vision, audio);
  if (plan.pipeline.num_stages != sys.num_stages() || sys.local_stages(plan) != sys.local_stages())
    throw_error<invalid_argument>("mm step: the plan's stages differ from the system's before the plan");
  int calls = 0;
  mm_result<T> r;
  r.stats = sys.run(plan, batch, lm, mm_optimizer<T>{&calls},
                    train::bind_encoder(vision, item_features<T>{kShape.width, 0}),
                    train::bind_encoder(audio, item_features<T>{kShape.width, 1}));
  if (calls != 3)
    throw_error<invalid_argument>("mm step: optimizer called {} times; expected 3 (stage + 2 encoders)",
                                  calls);
  r.grads = lm.grad;
  r.grads[-1] = all_gradients<T>(vision);
  r.grads[-2] = all_gradients<T>(audio);
  r.slots = plan.slots;
  r.stages = plan.pipeline.num_stages;
  r.encoder_shards = plan.pipeline.num_encoder_shards();
  return r;
}

struct mm_verdict {
  double rel = 0, loss_rel = 0;
  std::int64_t targets = 0, tokens = 0, expected_targets = 0, expected_tokens = 0;
  std::int64_t encoder_items = 0;
  int stages = 0, slots = 0, encoder_shards = 0, tensors = 0;
  std::string parity;  ///< check_parity's result, printed
  std::string describe() const {
    return fmt::format("{}; encoder items {}, {} stages, {} slots, {} encoder shards", parity, encoder_items,
                       stages, slots, encoder_shards);
  }
};

/// The multimodal model as train::check_parity builds it: tiny_stack's stages `local` of `stages` and the
/// two encoders. Tensor ids: tiny_stack's; the encoders' k-th gradient span -1 - 10k (vision), -2 - 10k
/// (audio).
template <class T, template <class, class> class Encoder>
struct mm_model {
  tiny_stack<T> lm;
  Encoder<T, model::vision_modality> vision{kShape.width, T(0.9)};
  Encoder<T, model::audio_modality> audio{kShape.width, T(1.1)};

  mm_model(std::uint64_t seed, int stages, std::span<const int> local)
      : lm(kShape, seed, kBlocks, stages, local) {}
  /// The stages and tp block of `split`, the heads of `shape` (split over tp).
  mm_model(std::uint64_t seed, const train::model_split& split, const lm_shape& shape = kShape)
      : lm(shape, seed, kBlocks, split) {}
  tiny_stack<T>& backbone() { return lm; }
  auto encoders() { return std::tie(vision, audio); }
  std::vector<train::model_tensor<T>> tensors() {
    auto out = lm.tensors();
    auto add = [&](auto& e, std::int64_t first) {
      const auto p = e.parameters();
      const auto g = e.gradients();
      for (std::size_t k = 0; k < p.size(); ++k)
        out.push_back({first - 10 * static_cast<std::int64_t>(k), p[k], g[k]});
    };
    add(vision, -1);
    add(audio, -2);
    return out;
  }
};

/// One step of the multimodal model under the given policies over `world` against the 1-rank reference
/// (train::check_parity), on a seeded random batch with encoder items. Collective over world.
template <class T, template <class, class> class Encoder = model::scale_encoder, class Partition,
          class Balancer, class Schedule, class Placement, class C>
mm_verdict mm_parity_body(C& world, const Partition& partition, const Balancer& balancer,
                          const train::pipeline_config<Schedule, Placement>& pc, std::uint64_t seed, int docs,
                          std::int64_t max_len, const train::system_options& options = {}) {
  const auto batch = random_mm_batch(seed, docs, max_len);
  using sys_t = train::system<Partition, model::reference_attention, C, Balancer, Schedule, Placement>;
  sys_t sys(partition, balancer, pc, world, {}, options);
  const auto shape = options.mesh.tp > 1 ? kTpShape : kShape;  // heads that split over tp
  const auto r = train::check_parity(
      sys, batch, [&](const train::model_split& sp) { return mm_model<T, Encoder>(seed + 1, sp, shape); }, {},
      item_features<T>{kShape.width, 0}, item_features<T>{kShape.width, 1});
  if (r.optimizer_calls != 3)
    throw_error<invalid_argument>("mm step: optimizer called {} times; expected 3 (stage + 2 encoders)",
                                  r.optimizer_calls);
  mm_model<T, Encoder> probe(seed + 1, sys.split(), shape);
  const auto plan = std::apply([&](auto&... e) { return sys.plan(batch, e...); }, probe.encoders());
  mm_verdict v;
  v.rel = r.rel_error;
  v.loss_rel = r.loss_rel_error;
  v.targets = r.targets;
  v.tokens = r.tokens;
  const auto s = model::summarize_step(batch);
  v.expected_targets = s.targets;
  v.expected_tokens = s.tokens;
  v.encoder_items = r.stats.encoder_items;
  v.stages = plan.pipeline.num_stages;
  v.slots = plan.slots;
  v.encoder_shards = plan.pipeline.num_encoder_shards();
  v.tensors = static_cast<int>(r.tensors);
  v.parity = fmt::format("{}", r);
  return v;
}

}  // namespace traintest
