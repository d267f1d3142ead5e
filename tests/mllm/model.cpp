// SPDX-License-Identifier: Apache-2.0
// The mllm_train example's model through train::system: (a) finite-difference gradients (double) of sampled
// entries of every backbone and encoder tensor, one step on one loopback rank; (b) pipelined parity: the
// gradients of pp = 2 runs (CP zigzag with 1F1B and zero-bubble on 4 ranks, HDP placed by ByteScale's
// balancer on 8) equal a single-rank run's, tensor by global id; (c) the stages model the concepts.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/train.hpp>

#include "mllm_train/model.hpp"
#include "train/pipeline_body.hpp"

using namespace hetmesh;

namespace {

using lctx = train::step_context<comm::loopback::communicator, model::reference_attention, double>;
using lctx_f = train::step_context<comm::loopback::communicator, model::reference_attention, float>;
using ectx = model::stage_context<comm::loopback::communicator, model::host_activation_store<double>>;
static_assert(model::check_split_backward_stage<mllm::backbone<double>, double, lctx>());
static_assert(model::check_split_backward_stage<mllm::backbone<float>, float, lctx_f>());
static_assert(model::check_encoder_stage<mllm::vision_encoder<double>, double, ectx>());
static_assert(model::check_encoder_stage<mllm::audio_encoder<double>, double, ectx>());
static_assert(mllm::vision_encoder<float>::modality == "vision");
static_assert(mllm::audio_encoder<float>::modality == "audio");

/// Small enough for many steps, large enough for GQA, RoPE pairs and both encoders' layers.
mllm::config test_config() {
  mllm::config c;
  c.vocab = 16;  // random_batch draws token ids in [1, 13)
  c.width = 16;
  c.attn = {4, 2, 4};
  c.mlp_hidden = 24;
  c.blocks = 4;
  c.patch = 6;
  c.frame = 5;
  c.enc_width = 8;
  c.enc_hidden = 12;
  c.enc_layers = 2;
  return c;
}

struct no_update {
  int* calls;
  template <class P, class G>
  void operator()(P&&, G&&) const {
    ++*calls;
  }
};

/// The gradients of one step, by global tensor id, and the step's loss.
template <class T>
struct step_out {
  std::map<int, std::vector<T>> grads;
  double loss = 0;
  int stages = 0;
};

template <class T, class Sys>
step_out<T> run_model(Sys& sys, const typename Sys::plan_type& plan, const model::step_batch& batch,
                      mllm::multimodal_model<T>& m) {
  const auto c = m.llm.cfg;
  int calls = 0;
  step_out<T> r;
  r.loss = sys.run(plan, batch, m.llm, no_update{&calls},
                   train::bind_encoder(m.vision, traintest::item_features<T>{c.patch, 0}),
                   train::bind_encoder(m.audio, traintest::item_features<T>{c.frame, 1}))
               .loss;
  // The backbone (its expert group is empty without an MoE layer: no call), then the two encoders.
  if (calls != 3) throw_error<invalid_argument>("mllm step: optimizer called {} times; expected 3", calls);
  for (auto& t : m.tensors()) r.grads[t.id].assign(t.grad.begin(), t.grad.end());
  r.stages = plan.pipeline.num_stages;
  return r;
}

/// train::check_parity's verdict on the example's model: the largest |got - ref| over the largest |ref|
/// over every tensor (each held by some rank), the loss's relative error, the reference's tensor count.
struct parity {
  double rel = 0, loss_rel = 0;
  int tensors = 0, stages = 0, items = 0;  ///< items: encoder items of the batch
  std::string verdict;                     ///< check_parity's line
};

template <class T, class Partition, class Balancer, class Schedule, class Placement, class C>
parity parity_body(C& world, const Partition& partition, const Balancer& balancer,
                   const train::pipeline_config<Schedule, Placement>& pc, std::uint64_t seed, int docs,
                   std::int64_t max_len) {
  const auto batch = traintest::random_mm_batch(seed, docs, max_len);
  train::system<Partition, model::reference_attention, C, Balancer, Schedule, Placement> sys(
      partition, balancer, pc, world);
  const auto cfg = test_config();
  const auto r = train::check_parity(
      sys, batch,
      [&](int stages, std::span<const int> local) {
        return mllm::multimodal_model<T>(cfg, seed + 1, stages, local);
      },
      {}, traintest::item_features<T>{cfg.patch, 0}, traintest::item_features<T>{cfg.frame, 1});
  int items = 0;
  for (const auto& d : batch.documents) items += static_cast<int>(d.items.size());
  return {r.rel_error, r.loss_rel_error,    static_cast<int>(r.tensors), sys.num_stages(),
          items,       fmt::format("{}", r)};
}

template <class Body>
parity on_loopback(int n, Body body) {
  parity out{};
  std::mutex mu;
  comm::loopback::run(n, [&](comm::loopback::communicator& c) {
    const auto v = body(c);
    if (c.rank() == 0) {
      std::lock_guard lock(mu);
      out = v;
    }
  });
  return out;
}

// The tensors of the whole model on one rank (every stage and both encoders).
int reference_tensors() {
  const int all[1] = {0};
  mllm::multimodal_model<double> m(test_config(), 1, 1, std::span<const int>(all));
  return static_cast<int>(m.tensors().size());
}

void check_parity(const parity& p, double tol, const std::string& what, int expected_tensors) {
  MESSAGE(what << ": " << p.verdict << "; " << p.stages << " stages, " << p.items << " encoder items");
  CHECK(p.rel <= tol);
  CHECK(p.loss_rel <= tol);
  CHECK(p.stages == 2);
  CHECK(p.items > 0);
  CHECK(p.tensors == expected_tensors);  // the reference's tensors, each found on some rank
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("mllm model: finite differences of every tensor through one train::system step (double)") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto batch = traintest::random_mm_batch(21, 6, 24);
  int items = 0;
  for (const auto& d : batch.documents) items += static_cast<int>(d.items.size());
  REQUIRE(items >= 2);
  comm::loopback::run(1, [&](comm::loopback::communicator& c) {
    train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator> sys(
        seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{}, train::pipeline_config<>{}, c);
    const auto plan = sys.plan(batch);
    mllm::multimodal_model<double> m(test_config(), 7, 1, std::vector<int>{0});
    const auto base = run_model<double>(sys, plan, batch, m);
    auto tensors = m.tensors();
    REQUIRE(tensors.size() == 3 + 8 * 4 + 2 * (9 + 5 * 2));  // encoders: 5 attention tensors per layer
    constexpr double h = 1e-4;
    double worst = 0;
    int checked = 0, nonzero_tensors = 0;
    std::string worst_at;
    for (auto& t : tensors) {
      const auto& g = base.grads.at(t.id);
      // Three entries per tensor: the largest gradient and two seeded ones.
      std::vector<std::size_t> at{static_cast<std::size_t>(
          std::max_element(g.begin(), g.end(), [](double a, double b) { return std::abs(a) < std::abs(b); }) -
          g.begin())};
      for (std::uint64_t k = 0; k < 2; ++k)
        at.push_back(
            static_cast<std::size_t>(key_hash({99, static_cast<std::uint64_t>(t.id), k}) % g.size()));
      nonzero_tensors += std::abs(g[at[0]]) > 0 ? 1 : 0;
      for (auto i : at) {
        // Central differences at h and h / 2, Richardson-extrapolated: O(h^4) truncation.
        const double keep = t.value[i];
        auto central = [&](double step) {
          t.value[i] = keep + step;
          const double up = run_model<double>(sys, plan, batch, m).loss;
          t.value[i] = keep - step;
          const double down = run_model<double>(sys, plan, batch, m).loss;
          t.value[i] = keep;
          return (up - down) / (2 * step);
        };
        const double fd = (4 * central(h / 2) - central(h)) / 3;
        const double err = std::abs(fd - g[i]) / std::max({std::abs(fd), std::abs(g[i]), 1e-4});
        ++checked;
        if (err > worst) {
          worst = err;
          worst_at = fmt::format("tensor {} entry {}: analytic {:.10g}, finite difference {:.10g}", t.id, i,
                                 g[i], fd);
        }
      }
    }
    MESSAGE("finite differences: " << checked << " entries of " << tensors.size() << " tensors ("
                                   << nonzero_tensors << " with a non-zero gradient), worst rel err " << worst
                                   << " at " << worst_at << "; loss " << base.loss << ", "
                                   << seconds_since(t0) << " s");
    CHECK(nonzero_tensors == static_cast<int>(tensors.size()));
    CHECK(worst <= 1e-6);
  });
}

TEST_CASE(
    "mllm model: pp = 2 gradients equal a single-rank run's (CP zigzag 1F1B and zero-bubble on 4 ranks)") {
  const auto joint = pipeline::colocated_encoder{};
  for (std::uint64_t seed : {31u, 32u}) {
    const auto t0 = std::chrono::steady_clock::now();
    check_parity(on_loopback(4,
                             [&](auto& w) {
                               return parity_body<double>(
                                   w, seq::cp_zigzag{.cp = 2, .pad = true}, train::family_placement{},
                                   train::pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{
                                       2, {}, joint},
                                   seed, 10, 30);
                             }),
                 1e-10, fmt::format("zigzag cp2 pp2 1f1b joint, seed {}", seed), reference_tensors());
    check_parity(on_loopback(4,
                             [&](auto& w) {
                               return parity_body<double>(
                                   w, seq::cp_zigzag{.cp = 2, .pad = true}, train::family_placement{},
                                   train::pipeline_config<pipeline::zero_bubble, pipeline::colocated_encoder>{
                                       2, {}, joint},
                                   seed, 10, 30);
                             }),
                 1e-10, fmt::format("zigzag cp2 pp2 zero-bubble joint, seed {}", seed), reference_tensors());
    MESSAGE("seed " << seed << ": " << seconds_since(t0) << " s");
  }
}

TEST_CASE("mllm model: pp = 2 gradients equal a single-rank run's (HDP, ByteScale balancer, 8 ranks)") {
  const auto joint = pipeline::colocated_encoder{};
  for (std::uint64_t seed : {41u, 42u}) {
    const auto t0 = std::chrono::steady_clock::now();
    check_parity(on_loopback(8,
                             [&](auto& w) {
                               return parity_body<double>(
                                   w, seq::hdp<seq::no_offload>{.capacity = 16}, balance::bytescale{},
                                   train::pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{
                                       2, {}, joint},
                                   seed, 12, 50);
                             }),
                 1e-10, fmt::format("hdp bytescale pp2 1f1b joint, seed {}", seed), reference_tensors());
    MESSAGE("seed " << seed << ": " << seconds_since(t0) << " s");
  }
}

namespace {

/// The backbone, counting which backward entries the runtime calls.
struct counted_backbone : mllm::backbone<double> {
  using mllm::backbone<double>::backbone;
  int full = 0, input = 0, weight = 0;
  template <class Ctx>
  void backward(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const double> g,
                std::span<double> gi) {
    ++full;
    mllm::backbone<double>::backward(ctx, mb, g, gi);
  }
  template <class Ctx>
  void backward_input(const Ctx& ctx, const model::micro_batch_view& mb, std::span<const double> g,
                      std::span<double> gi) {
    ++input;
    mllm::backbone<double>::backward_input(ctx, mb, g, gi);
  }
  template <class Ctx>
  void backward_weight(const Ctx& ctx, const model::micro_batch_view& mb) {
    ++weight;
    mllm::backbone<double>::backward_weight(ctx, mb);
  }
};

}  // namespace

TEST_CASE("mllm model: zero-bubble runs the split backward (I then W), never the full one") {
  const auto batch = traintest::random_mm_batch(51, 10, 30);
  std::mutex mu;
  int full = 0, input = 0, weight = 0;
  comm::loopback::run(4, [&](comm::loopback::communicator& c) {
    using sys_t = train::system<seq::cp_zigzag, model::reference_attention, comm::loopback::communicator,
                                train::family_placement, pipeline::zero_bubble, pipeline::colocated_encoder>;
    sys_t sys(seq::cp_zigzag{.cp = 2, .pad = true}, train::family_placement{},
              train::pipeline_config<pipeline::zero_bubble, pipeline::colocated_encoder>{2, {}, {}}, c);
    const auto plan = sys.plan(batch);
    const auto cfg = test_config();
    counted_backbone llm(cfg, 3, plan.pipeline.num_stages, sys.local_stages(plan));
    mllm::vision_encoder<double> vision(cfg, 3);
    mllm::audio_encoder<double> audio(cfg, 3);
    int calls = 0;
    (void)sys.run(plan, batch, llm, no_update{&calls},
                  train::bind_encoder(vision, traintest::item_features<double>{cfg.patch, 0}),
                  train::bind_encoder(audio, traintest::item_features<double>{cfg.frame, 1}));
    std::lock_guard lock(mu);
    full += llm.full;
    input += llm.input;
    weight += llm.weight;
  });
  MESSAGE("zero-bubble: " << input << " I, " << weight << " W, " << full << " full backward calls");
  CHECK(full == 0);
  CHECK(input > 0);
  CHECK(weight == input);
}

TEST_CASE("mllm model: float pp = 2 gradients match a single-rank run's (CP zigzag 1F1B, 4 ranks)") {
  check_parity(on_loopback(4,
                           [&](auto& w) {
                             return parity_body<float>(
                                 w, seq::cp_zigzag{.cp = 2, .pad = true}, train::family_placement{},
                                 train::pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{
                                     2, {}, pipeline::colocated_encoder{}},
                                 33, 10, 30);
                           }),
               1e-5, "float zigzag cp2 pp2 1f1b joint", reference_tensors());
}

TEST_CASE("mllm model: one float step of the example's default size (D = 32, 4 blocks) on one rank") {
  const auto batch = traintest::random_mm_batch(61, 4, 300);
  std::int64_t tokens = 0;
  for (const auto& d : batch.documents) tokens += d.length();
  comm::loopback::run(1, [&](comm::loopback::communicator& c) {
    train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator> sys(
        seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{}, train::pipeline_config<>{}, c);
    const auto plan = sys.plan(batch);
    const mllm::config cfg;  // the example's defaults
    mllm::multimodal_model<float> m(cfg, 5, 1, std::vector<int>{0});
    int calls = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const auto st = sys.run(plan, batch, m.llm, no_update{&calls},
                            train::bind_encoder(m.vision, traintest::item_features<float>{cfg.patch, 0}),
                            train::bind_encoder(m.audio, traintest::item_features<float>{cfg.frame, 1}));
    const double secs = seconds_since(t0);
    MESSAGE("default config, " << tokens << " tokens, " << st.encoder_items << " encoder items: loss "
                               << st.loss << ", step " << secs << " s");
    CHECK(std::isfinite(st.loss));
    CHECK(st.loss > 0);
    // Near log(vocab) at initialisation: the head's logits start small.
    CHECK(st.loss < 2 * std::log(static_cast<double>(cfg.vocab)));
  });
}
