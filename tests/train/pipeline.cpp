// SPDX-License-Identifier: Apache-2.0
// train::system with pipelines and encoders on 8 loopback ranks: the parity grid (pipeline_cases.hpp), and
// what a step's plan and run promise at any depth.
#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/data/routes.hpp>
#include <hetmesh/pipeline/trace.hpp>
#include <hetmesh/train/report_json.hpp>
#include <hetmesh/train/train.hpp>

#include "support/rank0.hpp"
#include "train/pipeline_cases.hpp"

using namespace hetmesh;
using namespace traintest;

namespace {

using lctx = train::step_context<comm::loopback::communicator, model::reference_attention, double>;
static_assert(model::check_split_backward_stage<tiny_stack<double>, double, lctx>());

/// The bytes of encoder item `it` as delivery moves them here: item_features' values for every row of the
/// item, as T in host byte order.
template <class T>
std::vector<std::uint8_t> item_bytes(const model::encoder_item& it) {
  const std::vector<model::encoder_piece> one{{it.id, it.tokens, {0, it.tokens}, 0, 1, 0}};
  std::vector<T> x(static_cast<std::size_t>(it.tokens * kShape.width));
  item_features<T>{kShape.width, it.encoder}(
      model::encoder_batch_view{it.encoder, 0, 0, std::span<const model::encoder_piece>(one), it.tokens},
      std::span<T>(x));
  std::vector<std::uint8_t> out(x.size() * sizeof(T));
  std::memcpy(out.data(), x.data(), out.size());
  return out;
}

/// An encoder input that reads the items' rows from this rank's delivered share only (what plan_delivery
/// routed here); an item the share lacks throws, so a rank encoding an item delivery did not bring it fails.
template <class T>
struct share_features {
  const data::delivered_share* got;
  const model::step_batch* shape;  // the step's metadata: which document holds an item, at which index
  int encoder = 0;
  void operator()(const model::encoder_batch_view& v, std::span<T> in) const {
    for (const auto& p : v.pieces) {
      std::span<const std::uint8_t> b;
      for (const auto& d : shape->documents)
        for (std::size_t k = 0; k < d.items.size(); ++k)
          if (d.items[k].encoder == encoder && d.items[k].id == p.item)
            b = got->find(d.id, static_cast<int>(k));
      if (b.size() != static_cast<std::size_t>(p.item_tokens * kShape.width) * sizeof(T))
        throw std::runtime_error(fmt::format("encoder {} item {}: {} bytes delivered here; expected {} rows",
                                             encoder, p.item, b.size(), p.item_tokens));
      const auto row = static_cast<std::size_t>(kShape.width) * sizeof(T);
      std::memcpy(in.data() + p.offset * kShape.width,
                  b.data() + static_cast<std::size_t>(p.tokens.begin) * row,
                  static_cast<std::size_t>(p.tokens.size()) * row);
    }
  }
};

/// One step of the multimodal model over `world` under the given policies twice, on the whole batch and
/// on this rank's delivered share (sys.delivery: train::plan_delivery over the system's ranks; the share
/// taken locally, data::local_share, text and encoder items; train::share_of), with the same initial
/// model. Returns "" or what differs on this rank; `partial` is set when the rank received fewer parts
/// (texts and items) than the step has.
template <class T, class Partition, class Balancer, class Schedule, class Placement, class C>
std::string share_parity_body(C& world, const Partition& partition, const Balancer& balancer,
                              const train::pipeline_config<Schedule, Placement>& pc,
                              const model::step_batch& batch, std::uint64_t seed,
                              const train::system_options& options, bool& partial) {
  using sys_t = train::system<Partition, model::reference_attention, C, Balancer, Schedule, Placement>;
  sys_t sys(partition, balancer, pc, world, {}, options);
  const auto plan = sys.plan(batch);
  const auto routes = sys.delivery(plan, batch);
  std::map<std::size_t, std::vector<std::uint8_t>> keep;
  const auto got =
      data::local_share(routes, world.rank(), [&](std::size_t i) -> std::span<const std::uint8_t> {
        const auto& part = routes.parts[i];
        const auto& d = *std::find_if(batch.documents.begin(), batch.documents.end(),
                                      [&](const model::document& x) { return x.id == part.sample; });
        if (part.item == data::text_part) return train::text_bytes(d);
        return keep[i] = item_bytes<T>(d.items[static_cast<std::size_t>(part.item)]);
      });
  const auto share = train::share_of(plan, batch, got);
  partial = got.parts.size() < routes.parts.size();

  mm_result<T> whole, shared;
  for (auto* r : {&whole, &shared}) {
    tiny_stack<T> lm(kShape, seed, kBlocks, plan.pipeline.num_stages, sys.local_stages(plan));
    model::scale_encoder<T, model::vision_modality> vision(kShape.width, T(0.9));
    model::scale_encoder<T, model::audio_modality> audio(kShape.width, T(1.1));
    int calls = 0;
    if (r == &whole)
      r->stats = sys.run(plan, batch, lm, mm_optimizer<T>{&calls},
                         train::bind_encoder(vision, item_features<T>{kShape.width, 0}),
                         train::bind_encoder(audio, item_features<T>{kShape.width, 1}));
    else
      r->stats = sys.run(plan, share, lm, mm_optimizer<T>{&calls},
                         train::bind_encoder(vision, share_features<T>{&got, &batch, 0}),
                         train::bind_encoder(audio, share_features<T>{&got, &batch, 1}));
    r->grads = lm.grad;
    r->grads[-1] = std::vector<T>(vision.gradients()[0].begin(), vision.gradients()[0].end());
    r->grads[-2] = std::vector<T>(audio.gradients()[0].begin(), audio.gradients()[0].end());
  }
  std::string f;
  if (shared.grads != whole.grads) f += "gradients differ; ";
  const auto &a = shared.stats, &b = whole.stats;
  if (a.loss != b.loss || a.targets != b.targets || a.tokens != b.tokens ||
      a.micro_batches != b.micro_batches || a.encoder_items != b.encoder_items || a.plan_hash != b.plan_hash)
    f += fmt::format("stats {} vs {}; ", a, b);
  if (b.targets != model::summarize_step(batch).targets) f += "the whole-batch run lost targets; ";
  return f;
}

}  // namespace

TEST_CASE(
    "train::system: pipelined multimodal steps' gradients equal a single-rank run's (loopback, 8 ranks)") {
  pipeline_cases([](auto body) { return testsupport::rank0_of(8, body); });
}

TEST_CASE(
    "train::system: long encoder items split over a Ulysses group (long-short SP) keep the gradients of an "
    "encoder that attends inside items") {
  long_short_cases([](auto body) { return testsupport::rank0_of(8, body); });
  // The split is real: with the same cap, more encoder calls' items (pieces) than with whole items.
  train::system_options split, whole_items;
  split.encoder_sp.max_tokens_per_rank = 3;
  split.encoder_sp.heads = whole_items.encoder_sp.heads = 4;
  whole_items.encoder_sp.balance_factor = 1e9;  // no item is too costly to run whole
  const auto pc = train::pipeline_config<pipeline::gpipe, pipeline::colocated_encoder>{2, {}, {}};
  for (std::uint64_t seed : {21u, 22u}) {
    auto run = [&](const train::system_options& o) {
      return testsupport::rank0_of(8, [&](auto& w) {
        return mm_parity_body<double, attention_encoder>(w, seq::cp_zigzag{.cp = 2, .pad = true},
                                                         train::family_placement{}, pc, seed, 8, 30, o);
      });
    };
    const auto v = run(split), whole = run(whole_items);
    MESSAGE("split items: ", v.describe(), "; whole items: ", whole.encoder_items, " encoder calls' items");
    CHECK(v.rel <= 1e-10);
    CHECK(whole.rel <= 1e-10);
    CHECK(v.encoder_items > whole.encoder_items);  // items ran as pieces on several ranks
  }
  // An item longer than a shard's pool row can hold: the planner's capacity error, naming the item.
  train::system_options tight;
  tight.encoder_sp.max_tokens_per_rank = 1;
  tight.encoder_sp.heads = 4;
  CHECK_THROWS_WITH(testsupport::rank0_of(8,
                                          [&](auto& w) {
                                            return mm_parity_body<double, attention_encoder>(
                                                w, seq::cp_zigzag{.cp = 2, .pad = true},
                                                train::family_placement{}, pc, 21u, 8, 30, tight);
                                          }),
                    doctest::Contains("needs more than"));
}

TEST_CASE("train: slots align every ring's members and give each rank at most one micro-batch per slot") {
  for (std::uint64_t seed = 200; seed < 230; ++seed) {
    const auto b =
        random_batch(seed, 1 + static_cast<int>(seed % 13), 1 + static_cast<std::int64_t>(seed % 4) * 20);
    const auto docs = model::document_descs(b);
    auto check = [](const auto& plan) {
      std::vector<std::vector<int>> ring_slots(plan.rings.size());
      for (const auto& list : plan.per_rank) {
        int last = -1;
        for (const auto& pm : list) {
          CHECK(pm.slot > last);  // increasing along the rank's list: at most one per slot
          CHECK(pm.slot < plan.slots);
          last = pm.slot;
          ring_slots[static_cast<std::size_t>(pm.ring)].push_back(pm.slot);
        }
      }
      for (const auto& rs : ring_slots) {
        REQUIRE(!rs.empty());
        CHECK(std::all_of(rs.begin(), rs.end(), [&](int s) { return s == rs.front(); }));
      }
    };
    check(train::plan_step(seq::cp_zigzag{.cp = 2, .pad = true}, docs, 4));
    check(train::plan_step(test_hdp(), docs, 8));
    check(train::plan_step(test_hdp(), docs, 8, balance::bytescale{}));
  }
}

TEST_CASE("train::system: bad pipeline configurations and missing encoders fail with a clear error") {
  comm::loopback::run(4, [](comm::loopback::communicator& c) {
    using sys_t = train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator,
                                train::family_placement, pipeline::one_f_one_b>;
    CHECK_THROWS_WITH_AS(sys_t(seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{},
                               train::pipeline_config<>{3, {}, {}}, c),
                         doctest::Contains("pp = 3 over a world of 4 ranks"), invalid_argument);
    sys_t sys(seq::cp_thd{.cp = 2, .pad = true}, train::family_placement{},
              train::pipeline_config<>{2, {}, {}}, c);
    CHECK(sys.pool_size() == 2);
    CHECK(sys.pipeline_rank() == c.rank() / 2);
    const auto batch = random_mm_batch(5, 6, 30);
    const auto plan = sys.plan(batch);
    CHECK(plan.pp == 2);
    CHECK(plan.pipeline.num_encoder_shards() == 1);
    CHECK(sys.local_stages(plan) == std::vector<int>{c.rank() / 2});
    tiny_stack<double> lm(kShape, 1, kBlocks, 2, sys.local_stages(plan));
    // The batch has encoder items but run gets no encoder: every rank fails, none hangs.
    CHECK_THROWS_WITH_AS((void)sys.run(plan, batch, lm, train::sgd<double>{}),
                         doctest::Contains("encoders were passed to run"), invalid_argument);
    // A separate encoder pool: its ranks count in the world's shape, and a pool of no ranks is refused.
    using pool_sys = train::system<seq::cp_thd, model::reference_attention, comm::loopback::communicator,
                                   train::family_placement, pipeline::one_f_one_b, pipeline::encoder_pool>;
    using pool_cfg = train::pipeline_config<pipeline::one_f_one_b, pipeline::encoder_pool>;
    CHECK_THROWS_WITH_AS(pool_sys(seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{},
                                  pool_cfg{2, {}, {.ranks = 1}}, c),
                         doctest::Contains("pp = 2 with 1 encoder-pool ranks per pipeline over a world of 4"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(pool_sys(seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{},
                                  pool_cfg{2, {}, {.ranks = 0}}, c),
                         doctest::Contains("expected ranks >= 1"), invalid_argument);
    pool_sys ps(seq::cp_thd{.cp = 1, .pad = true}, train::family_placement{}, pool_cfg{1, {}, {.ranks = 1}},
                c);
    CHECK(ps.pool_size() == 2);
    CHECK(ps.encoder_ranks() == 1);
    CHECK(ps.is_encoder_rank() == (c.rank() >= 2));
    const auto pplan = ps.plan(model::document_descs(batch));  // no batch: the pool still takes part
    CHECK(pplan.pipeline.total_ranks() == 2);
    CHECK(pplan.pipeline.num_encoder_shards() == 1);
    CHECK(ps.local_stages(pplan) == (c.rank() >= 2 ? std::vector<int>{} : std::vector<int>{0}));
  });
}

TEST_CASE("train: a step's report gathers every rank's measured times and executed actions") {
  comm::loopback::run(4, [](comm::loopback::communicator& c) {
    train::system<seq::cp_zigzag, model::reference_attention, comm::loopback::communicator,
                  train::family_placement, pipeline::zero_bubble, pipeline::colocated_encoder>
        sys({.cp = 2, .pad = true}, {}, {2, {}, {}}, c);
    const auto batch = random_mm_batch(7, 8, 30);
    const auto plan = sys.plan(batch);
    tiny_stack<double> lm(kShape, 1, kBlocks, plan.pipeline.num_stages, sys.local_stages(plan));
    model::scale_encoder<double, model::vision_modality> vision(kShape.width);
    model::scale_encoder<double, model::audio_modality> audio(kShape.width);
    const auto st = sys.run(plan, batch, lm, train::sgd<double>{},
                            train::bind_encoder(vision, item_features<double>{kShape.width, 0}),
                            train::bind_encoder(audio, item_features<double>{kShape.width, 1}));
    const auto r = train::gather_report(c, st);
    REQUIRE(r.busy_seconds.size() == 4);
    CHECK(r.busy_seconds[static_cast<std::size_t>(c.rank())] == doctest::Approx(st.busy_seconds));
    CHECK(r.imbalance() >= 1.0);
    // The CPU accounting: run()'s time covers its parts; with pp = 2 every rank sends and receives.
    CHECK(st.cpu_step_seconds > 0.0);
    CHECK(st.cpu_comm_seconds > 0.0);
    CHECK(st.cpu_optimizer_seconds >= 0.0);
    CHECK(st.cpu_busy_seconds + st.cpu_comm_seconds + st.cpu_optimizer_seconds <=
          doctest::Approx(st.cpu_step_seconds).epsilon(1e-6));
    CHECK(st.library_cpu_seconds() == doctest::Approx(st.cpu_step_seconds - st.cpu_busy_seconds -
                                                      st.cpu_comm_seconds - st.cpu_optimizer_seconds));
    REQUIRE(r.library_cpu_seconds.size() == 4);
    CHECK(r.library_cpu_seconds[static_cast<std::size_t>(c.rank())] == st.library_cpu_seconds());
    CHECK(r.library_share() > 0.0);
    CHECK(r.library_share() < 1.0);
    for (int rank = 0; rank < 4; ++rank) {  // every action of the rank's pipeline list ran once, in order
      std::vector<pipeline::action> ran;
      for (const auto& t : r.timeline)
        if (t.rank == rank) {
          CHECK(t.end >= t.start);
          ran.push_back(t.what);
        }
      CHECK(ran == plan.pipeline.ranks[static_cast<std::size_t>(rank / 2)]);
    }
    const auto line = fmt::format("{}", r);
    CHECK(line.find("ranks=4") != std::string::npos);
    CHECK(line.find(fmt::format("actions={}", r.timeline.size())) != std::string::npos);
    CHECK(fmt::format("{}", sys.pipeline()) == fmt::format("pipeline{{pp=2, schedule={}, encoders={}}}",
                                                           pipeline::zero_bubble{},
                                                           pipeline::colocated_encoder{}));
    const auto js = train::to_json(r);
    CHECK(js.at("busy_s").size() == 4);
    CHECK(js.at("tokens").get<std::int64_t>() == model::summarize_step(batch).tokens);
    const auto trace = train::step_trace(r);
    CHECK(trace.at("traceEvents").size() > r.timeline.size());  // the actions plus rank names
    const auto svg = pipeline::svg_timeline(r.timeline, "step <0> & more");
    CHECK(svg.find("step &lt;0&gt; &amp; more") != std::string::npos);
    std::size_t boxes = 0, computes = 0;
    for (auto at = svg.find("<title>"); at != std::string::npos; at = svg.find("<title>", at + 1)) ++boxes;
    for (const auto& t : r.timeline) computes += pipeline::is_compute(t.what.type) ? 1 : 0;
    CHECK(boxes == computes);
    CHECK(svg.find("rank 3") != std::string::npos);
  });
}

TEST_CASE("train::system: selective offload moves the plan's share of activations and keeps the gradients") {
  seq::hdp<seq::selective_offload> offload{.capacity = 16};
  offload.model.d2h_bandwidth = offload.model.h2d_bandwidth = std::numeric_limits<double>::infinity();
  offload.model.activation.layers = 32;  // a declared link needs the layers per rank
  // A batch whose plan offloads: some long document gets a ratio > 0 (ByteScale's solver).
  std::uint64_t seed = 300;
  for (; seed < 340; ++seed) {
    const auto plan = train::plan_step(offload, model::document_descs(random_mm_batch(seed, 12, 60)), 4);
    bool any = false;
    for (const auto& list : plan.partition.hdp.per_rank)
      for (const auto& mb : list) any = any || mb.offload_ratio > 0;
    if (any) break;
  }
  REQUIRE(seed < 340);
  for (int pp : {1, 2}) {
    const auto v = testsupport::rank0_of(8, [&](auto& w) {
      const auto batch = random_mm_batch(seed, 12, 60);
      using sys_t = train::system<seq::hdp<seq::selective_offload>, model::reference_attention,
                                  std::remove_cvref_t<decltype(w)>, train::family_placement,
                                  pipeline::one_f_one_b, pipeline::colocated_encoder>;
      sys_t sys(offload, train::family_placement{}, {pp, {}, {}}, w);
      const auto r = train::check_parity(
          sys, batch,
          [&](int stages, std::span<const int> local) {
            return mm_model<double, model::scale_encoder>(seed + 1, stages, local);
          },
          {.gradient = 1e-8, .loss = 1e-8}, item_features<double>{kShape.width, 0},
          item_features<double>{kShape.width, 1});
      std::int64_t moved[2] = {r.stats.offloaded_bytes, r.stats.activation_peak_bytes > 0 ? 1 : 0};
      comm::all_reduce(w, std::span<std::int64_t>(moved), comm::reduce_op::sum);
      return std::tuple<std::string, bool, std::int64_t, std::int64_t>{fmt::format("{}", r), r.passed,
                                                                       moved[0], moved[1]};
    });
    MESSAGE("pp ", pp, ": ", std::get<0>(v), "; ", std::get<2>(v), " bytes offloaded");
    CHECK(std::get<1>(v));       // gradients within 1e-8 of the largest, the loss and counts equal
    CHECK(std::get<2>(v) > 0);   // the plan's ratios moved activations
    CHECK(std::get<3>(v) == 8);  // every rank saved activations
  }
}

TEST_CASE("train::offload_store keeps (1 - r) of each tensor resident and reads it back whole") {
  train::offload_store<double> s;
  s.set_ratio(0, 1, 0.25);
  const std::vector<double> x{1, 2, 3, 4, 5, 6, 7, 8};
  s.write({0, 1, 0}, x);
  s.write({0, 2, 0}, x);  // no ratio: all resident
  CHECK(s.bytes() == static_cast<std::int64_t>((6 + 8) * sizeof(double)));
  CHECK(s.offloaded_bytes() == static_cast<std::int64_t>(2 * sizeof(double)));
  const auto back = s.read({0, 1, 0});
  CHECK(std::vector<double>(back.begin(), back.end()) == x);
  CHECK(s.fetched_bytes() == static_cast<std::int64_t>(2 * sizeof(double)));
  s.release({0, 1, 0});
  CHECK(s.release_all(0, 2) == 1);
  CHECK(s.bytes() == 0);
  CHECK(s.peak_bytes() == static_cast<std::int64_t>(14 * sizeof(double)));
  CHECK_THROWS_AS(s.set_ratio(0, 3, 1.5), invalid_argument);
  CHECK_THROWS_AS((void)s.read({0, 1, 0}), model::activation_error);
}

TEST_CASE("train::offload_store over a device resident store moves the tail to the host and reads it back") {
  // Emulated device memory: the resident side hands out device pointers, the offloaded tail reaches the host
  // store through the policy's download and comes back by upload, into a device buffer.
  using device_store = model::memory_activation_store<double, model::emulated_device_memory>;
  train::offload_store<double, device_store> s;
  static_assert(std::is_same_v<decltype(s)::memory_type, model::emulated_device_memory>);
  // The offloaded share lives in the policy's host buffers (pinned memory for cuda::device_memory).
  static_assert(std::is_same_v<model::host_buffer_t<model::emulated_device_memory, double>,
                               model::emulated_device_memory::host_buffer<double>>);
  static_assert(
      std::is_same_v<model::host_buffer_t<model::host_memory, double>, model::host_memory::buffer<double>>);
  s.set_ratio(0, 1, 0.25);
  const std::vector<double> x{1, 2, 3, 4, 5, 6, 7, 8};
  model::emulated_device_memory mem;
  model::emulated_device_memory::buffer<double> dx;
  dx.resize(x.size());
  mem.upload(dx.span(), std::span<const double>(x));
  s.write({0, 1, 0}, std::span<const double>(dx.span()));
  CHECK(s.offloaded_bytes() == static_cast<std::int64_t>(2 * sizeof(double)));
  CHECK(s.bytes() == static_cast<std::int64_t>(6 * sizeof(double)));
  const auto back = s.read({0, 1, 0});
  CHECK(emulated::is_device_pointer(back.data()));
  std::vector<double> host(back.size());
  mem.download(std::span<double>(host), back);
  CHECK(host == x);
  // A host span where the device store expects device memory is refused, naming the copy.
  CHECK_THROWS_WITH_AS(s.write({0, 2, 0}, std::span<const double>(x)),
                       doctest::Contains("emulated_device_memory::copy"), invalid_argument);
  CHECK_FALSE(s.contains({0, 2, 0}));  // the failed write left nothing behind
  s.release({0, 1, 0});
  CHECK(s.bytes() == 0);
}

TEST_CASE("train::system: a step over each rank's delivered share equals the whole-batch step at pp = 2, 4") {
  // Delivery by plan at depth > 1: middle and last pipeline ranks and the encoder shards (joint pipeline,
  // a separate encoder pool) read only what plan_delivery routes them; gradients, loss and counts are
  // bitwise the whole-batch run's (every rank compares its own stages' and the encoders' gradients).
  train::system_options split;
  split.encoder_sp.max_tokens_per_rank = 5;  // items above 5 tokens run over groups of shards (long-short SP)
  // The heads as a declared value: scale_encoder mixes no tokens, so any split works.
  split.encoder_sp.heads = 0;
  auto check = [](const std::string& what, auto body, bool some_partial = true) {
    std::vector<std::string> failures(8);
    std::vector<int> partial(8, 0);
    comm::loopback::run(8, [&](comm::loopback::communicator& w) {
      bool p = false;
      try {
        failures[static_cast<std::size_t>(w.rank())] = body(w, p);
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(w.rank())] = e.what();
      }
      partial[static_cast<std::size_t>(w.rank())] = p ? 1 : 0;
    });
    CAPTURE(what);
    for (const auto& f : failures) CHECK(f == "");
    if (some_partial) CHECK(std::count(partial.begin(), partial.end(), 1) > 0);  // not the whole step
  };
  for (std::uint64_t seed : {41u, 42u}) {
    // HDP rings of up to 2 x 16 tokens fit at pp = 4; items of up to 10 tokens fit 2 shards of 5. No loss
    // masks: train::share_of counts the targets of documents without one (the step's metadata).
    auto batch = random_mm_batch(seed, 12, 30);
    for (auto& d : batch.documents) d.loss_mask.clear();
    CAPTURE(seed);
    for (int pp : {2, 4}) {
      CAPTURE(pp);
      check("hdp, joint pipeline", [&](auto& w, bool& p) {
        return share_parity_body<double>(
            w, test_hdp(), train::family_placement{},
            train::pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{pp, {}, {}}, batch,
            seed + 1, split, p);
      });
      check("hdp bytescale, zero-bubble joint pipeline", [&](auto& w, bool& p) {
        return share_parity_body<double>(
            w, test_hdp(), balance::bytescale{},
            train::pipeline_config<pipeline::zero_bubble, pipeline::colocated_encoder>{pp, {}, {}}, batch,
            seed + 1, {}, p);
      });
    }
    // Static CP: pool 4 = dp 2 x cp 2 at pp = 2; at pp = 4 one cp group of 2 (every rank reads every
    // document, and with these batches every rank's shard encodes a piece of every item: the share is the
    // whole step, the run still goes through it); encoders on the first stage and in the joint pipeline.
    for (int pp : {2, 4}) {
      CAPTURE(pp);
      check(
          "static cp, joint pipeline",
          [&](auto& w, bool& p) {
            return share_parity_body<double>(
                w, seq::cp_zigzag{.cp = 2, .pad = true}, train::family_placement{},
                train::pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{pp, {}, {}}, batch,
                seed + 1, split, p);
          },
          pp == 2);
    }
    check("static cp, first-stage encoders", [&](auto& w, bool& p) {
      return share_parity_body<double>(
          w, seq::cp_thd{.cp = 2, .pad = true}, train::family_placement{},
          train::pipeline_config<pipeline::one_f_one_b, pipeline::encoder_on_first_stage>{2, {}, {}}, batch,
          seed + 1, {}, p);
    });
    // A separate encoder pool: pp = 2 LLM ranks and 2 encoder-only ranks per pipeline, a pool of 2.
    check("hdp, separate encoder pool", [&](auto& w, bool& p) {
      return share_parity_body<double>(
          w, test_hdp(), train::family_placement{},
          train::pipeline_config<pipeline::one_f_one_b, pipeline::encoder_pool>{2, {}, {.ranks = 2}}, batch,
          seed + 1, split, p);
    });
  }
}

TEST_CASE(
    "train::system: under tp 2 each encoder item is encoded once in the world, over rows of tp x pool ranks, "
    "and the gradients equal the 1-rank run's") {
  // tp 2 x pp 2 x pool 2 on 8 ranks, the joint pipeline: the encoder domain is 2 shards x rows of 4 ranks.
  train::system_options o;
  o.mesh.tp = 2;
  o.encoder_sp.max_tokens_per_rank = 3;  // long items split over Ulysses groups inside a row
  o.encoder_sp.heads = 4;
  const auto pc = train::pipeline_config<pipeline::gpipe, pipeline::colocated_encoder>{2, {}, {}};
  for (std::uint64_t seed : {21u, 23u}) {
    CAPTURE(seed);
    const auto zigzag = testsupport::rank0_of(8, [&](auto& w) {
      return mm_parity_body<double, attention_encoder>(w, seq::cp_zigzag{.cp = 2, .pad = true},
                                                       train::family_placement{}, pc, seed, 8, 30, o);
    });
    MESSAGE("tp 2, static CP: ", zigzag.describe());
    CHECK(zigzag.rel <= 1e-10);
    CHECK(zigzag.loss_rel <= 1e-12);
    const auto hdp = testsupport::rank0_of(8, [&](auto& w) {
      return mm_parity_body<double, attention_encoder>(w, seq::hdp<seq::no_offload>{.capacity = 40},
                                                       train::family_placement{}, pc, seed, 8, 30, o);
    });
    MESSAGE("tp 2, HDP: ", hdp.describe());
    CHECK(hdp.rel <= 1e-10);
  }
  // Each piece of an item is read (delivery by plan) and encoded by one rank of the world, never by its
  // tp peers too; both tp coordinates encode (the work is spread over the world, not copied per tp).
  const auto batch = random_mm_batch(21u, 12, 30);
  const auto got = testsupport::rank0_of(8, [&](auto& w) {
    using C = std::remove_cvref_t<decltype(w)>;
    train::system<seq::cp_zigzag, model::reference_attention, C, train::family_placement, pipeline::gpipe,
                  pipeline::colocated_encoder>
        sys(seq::cp_zigzag{.cp = 2, .pad = true}, train::family_placement{}, pc, w, {}, o);
    const auto plan = sys.plan(batch);
    std::map<std::pair<int, std::int64_t>, std::int64_t> pieces;  // (encoder, item) -> pieces encoded
    for (const auto& slot : plan.encoder_domain)
      for (std::size_t k = 0; k < slot.size(); ++k)
        for (const auto& a : slot[k].items) pieces[{static_cast<int>(k), a.item.id}] += a.degree;
    std::map<std::int64_t, const model::document*> by_id;
    for (const auto& d : batch.documents) by_id[d.id] = &d;
    std::vector<int> readers(8, 0);
    int copied = 0, odd_text = 0;
    for (const auto& part : sys.delivery(plan, batch).parts) {
      if (part.item == data::text_part) {
        odd_text += part.ranks.size() % 2 == 0 ? 0 : 1;  // a document's text: both tp ranks of a reader
        continue;
      }
      const auto& item = by_id.at(part.sample)->items[static_cast<std::size_t>(part.item)];
      copied += static_cast<std::int64_t>(part.ranks.size()) > pieces.at({item.encoder, item.id}) ? 1 : 0;
      for (int r : part.ranks) ++readers[static_cast<std::size_t>(r)];
    }
    int tp0 = 0, tp1 = 0;  // pieces read by each tp coordinate's ranks (world rank parity: tp fastest)
    for (int r = 0; r < 8; ++r) (r % 2 == 0 ? tp0 : tp1) += readers[static_cast<std::size_t>(r)];
    return std::vector<int>{plan.tp, plan.encoder_row(), copied, odd_text, tp0 > 0 ? 1 : 0, tp1 > 0 ? 1 : 0};
  });
  CHECK(got == std::vector<int>{2, 4, 0, 0, 1, 1});
}
