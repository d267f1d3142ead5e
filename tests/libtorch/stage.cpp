// SPDX-License-Identifier: Apache-2.0
// test_libtorch_stage: libtorch::backbone and libtorch::encoder (module -> stage adapters),
// libtorch::flat_parameters, and the autograd bridge to the contexts' attention. One TU (each torch TU
// costs ~20 s to compile).
// torch first: c10 defines a CHECK macro (a fatal log) that would replace doctest's CHECK silently (both
// are system headers) and turn every CHECK into a no-op for doctest; doctest's must win.
#include "libtorch/stage_support.hpp"
#undef CHECK
#include <doctest/doctest.h>

#include "libtorch/stage_system.hpp"

using namespace torchtest;

namespace {

/// max |a - b| over max |b| (|b| > 0).
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a.reshape({-1}) - b.reshape({-1})).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

/// The module's gradients as one flat tensor (module.parameters() order), zeros where undefined.
at::Tensor flat_grads(torch::nn::Module& m) {
  std::vector<at::Tensor> g;
  for (const auto& p : m.parameters())
    g.push_back(p.grad().defined() ? p.grad().reshape({-1}) : at::zeros({p.numel()}, p.options()));
  return at::cat(g);
}

/// The plain reference's call: stage `stage` of `stages` over mb, attention by plain torch ops.
struct plain_call {
  libtorch::standalone_call c;
  plain_call(const model::micro_batch_view& mb, int stage, int stages)
      : c(mb, stage, stages, plain_attention_of(mb)) {}
  [[nodiscard]] libtorch::stage_call call() { return c.call(); }
};

/// The weighted loss terms of the last stage, as the adapter makes them.
at::Tensor weighted(const at::Tensor& losses, const model::micro_batch_view& mb) {
  return libtorch::weight_token_losses<double>(losses, mb);
}

local_context<double> context_for(const model::micro_batch_view& mb, int stage, int* fwd = nullptr,
                                  int* bwd = nullptr) {
  local_context<double> ctx;
  ctx.stage = stage;
  ctx.micro_batch = mb.index;
  ctx.mb = &mb;
  ctx.forwards = fwd;
  ctx.backwards = bwd;
  return ctx;
}

using cspan = std::span<const double>;
using mspan = std::span<double>;

}  // namespace

TEST_CASE("backbone: a middle stage gives plain libtorch's output, input and weight gradients") {
  at::set_num_threads(1);
  const auto batch = make_batch(7, block_shape{}.vocab);
  const auto mb = batch.view();
  const auto n = static_cast<std::size_t>(mb.size() * block_shape{}.width);
  const auto in = seeded(11, n), gout = seeded(12, n);

  auto ref = make_stack(5, 3);
  plain_call pc(mb, 1, 3);
  auto x = at::tensor(in).requires_grad_(true);
  const auto y = ref->forward(x, pc.call());
  y.backward(at::tensor(gout).view_as(y));

  stack_stage stage(make_stack(5, 3), {.stages = 3});
  int fwd = 0, bwd = 0, fwd_b = 0, bwd_b = 0;
  const auto ctx = context_for(mb, 1, &fwd, &bwd);
  const auto ctx_b = context_for(mb, 1, &fwd_b, &bwd_b);  // the backward call's own context
  std::vector<double> out(n), gin(n);
  stage.forward(ctx, mb, cspan(in), mspan(out));
  CHECK(stage.module().saw_context);  // call.context<Ctx>() is the running call's
  CHECK(stage.pending() == 1);
  CHECK(stage.holds(1, 0));
  CHECK(fwd == 1);
  stage.backward(ctx_b, mb, cspan(gout), mspan(gin));
  CHECK(stage.pending() == 0);
  CHECK(bwd == 0);  // the attention's backward ran with the backward call's context, not the forward's
  CHECK(bwd_b == 1);
  CHECK(fwd_b == 0);
  CHECK(rel_diff(at::tensor(out), y.detach()) < 1e-12);
  CHECK(rel_diff(at::tensor(gin), x.grad()) < 1e-12);
  CHECK(rel_diff(stage.flat().grads(), flat_grads(*ref)) < 1e-12);
  CHECK(stage.flat().grads().abs().max().item<double>() > 1e-3);  // not a comparison of zeros
}

TEST_CASE("backbone: float stages match plain libtorch in float") {
  const auto batch = make_batch(9, block_shape{}.vocab);
  const auto mb = batch.view();
  const auto n = static_cast<std::size_t>(mb.size() * block_shape{}.width);
  const auto ind = seeded(14, n), goutd = seeded(15, n);
  const std::vector<float> in(ind.begin(), ind.end()), gout(goutd.begin(), goutd.end());
  auto ref = make_stack(5, 3, 0, at::kFloat);
  plain_call pc(mb, 1, 3);
  auto x = at::tensor(in).requires_grad_(true);
  const auto y = ref->forward(x, pc.call());
  y.backward(at::tensor(gout).view_as(y));

  libtorch::backbone<StackImpl, float> stage(make_stack(5, 3, 0, at::kFloat), {.stages = 3});
  local_context<float> ctx;
  ctx.stage = 1;
  ctx.mb = &mb;
  std::vector<float> out(n), gin(n);
  stage.forward(ctx, mb, std::span<const float>(in), std::span<float>(out));
  stage.backward(ctx, mb, std::span<const float>(gout), std::span<float>(gin));
  CHECK(rel_diff(at::tensor(out), y.detach()) < 1e-5);
  CHECK(rel_diff(at::tensor(gin), x.grad()) < 1e-5);
  CHECK(rel_diff(stage.flat().grads(), flat_grads(*ref)) < 1e-5);
  CHECK_THROWS_AS(stack_stage(make_stack(5, 3, 0, at::kFloat), {.stages = 3}), invalid_argument);  // dtype
}

TEST_CASE("backbone: the last stage weights its token losses; split backward adds what backward adds") {
  const auto batch = make_batch(8, block_shape{}.vocab);
  const auto mb = batch.view();
  const auto n = static_cast<std::size_t>(mb.size() * block_shape{}.width);
  const auto in = seeded(13, n);

  auto ref = make_stack(6, 2);
  plain_call pc(mb, 1, 2);
  auto x = at::tensor(in).requires_grad_(true);
  const auto terms = weighted(ref->forward(x, pc.call()), mb);
  terms.sum().backward();

  stack_stage full(make_stack(6, 2), {.stages = 2});
  stack_stage split(make_stack(6, 2), {.stages = 2});
  int bwd_full = 0, bwd_split = 0;
  const auto ctx_full = context_for(mb, 1, nullptr, &bwd_full);
  const auto ctx_split = context_for(mb, 1, nullptr, &bwd_split);
  std::vector<double> out(static_cast<std::size_t>(mb.size())), out2(out.size()), gin(n), gin2(n);
  full.forward(ctx_full, mb, cspan(in), mspan(out));
  full.backward(ctx_full, mb, cspan(), mspan(gin));
  CHECK(rel_diff(at::tensor(out), terms.detach()) < 1e-12);
  for (std::size_t t = 0; t < out.size(); ++t)
    if (mb.loss_weights[t] == 0.0) CHECK(out[t] == 0.0);
  CHECK(rel_diff(at::tensor(gin), x.grad()) < 1e-12);
  CHECK(rel_diff(full.flat().grads(), flat_grads(*ref)) < 1e-12);

  split.forward(ctx_split, mb, cspan(in), mspan(out2));
  split.backward_input(ctx_split, mb, cspan(), mspan(gin2));
  CHECK(split.pending() == 1);  // W still needs the graph
  CHECK(split.flat().grads().abs().max().item<double>() == 0.0);
  CHECK(rel_diff(at::tensor(gin2), x.grad()) < 1e-12);
  split.backward_weight(ctx_split, mb);
  CHECK(split.pending() == 0);
  CHECK(bwd_split == 1);  // the attention's backward ran once (in I); W reused its gradients
  CHECK(rel_diff(split.flat().grads(), full.flat().grads()) < 1e-12);
}

TEST_CASE("backbone: a 2-stage pipeline in 1F1B order keeps the micro-batches' graphs apart") {
  constexpr int kMb = 4;
  std::vector<model::micro_batch> batches;
  for (int m = 0; m < kMb; ++m) batches.push_back(make_batch(20 + static_cast<std::uint64_t>(m), 11, m));

  auto ref = make_stack(9, 2, 4);  // two blocks per stage
  for (const auto& b : batches) {
    const auto mb = b.view();
    plain_call p0(mb, 0, 2), p1(mb, 1, 2);
    const auto h = ref->forward(at::zeros({0}, at::kDouble), p0.call());
    weighted(ref->forward(h.reshape({-1}), p1.call()), mb).sum().backward();
  }

  for (const bool zero_bubble : {false, true}) {
    CAPTURE(zero_bubble);
    stack_stage s0(make_stack(9, 2, 4), {.stages = 2}), s1(make_stack(9, 2, 4), {.stages = 2});
    std::vector<std::vector<double>> act(kMb), grad(kMb), loss(kMb);
    std::size_t most = 0;
    auto f0 = [&](int m) {
      const auto mb = batches[static_cast<std::size_t>(m)].view();
      act[static_cast<std::size_t>(m)].assign(static_cast<std::size_t>(s0.output_size(mb, 0)), 0.0);
      s0.forward(context_for(mb, 0), mb, cspan(), mspan(act[static_cast<std::size_t>(m)]));
      most = std::max(most, s0.pending());
    };
    auto f1 = [&](int m) {
      const auto mb = batches[static_cast<std::size_t>(m)].view();
      loss[static_cast<std::size_t>(m)].assign(static_cast<std::size_t>(mb.size()), 0.0);
      s1.forward(context_for(mb, 1), mb, cspan(act[static_cast<std::size_t>(m)]),
                 mspan(loss[static_cast<std::size_t>(m)]));
    };
    auto b1 = [&](int m) {
      const auto mb = batches[static_cast<std::size_t>(m)].view();
      grad[static_cast<std::size_t>(m)].assign(act[static_cast<std::size_t>(m)].size(), 0.0);
      s1.backward(context_for(mb, 1), mb, cspan(), mspan(grad[static_cast<std::size_t>(m)]));
    };
    std::vector<int> weight_queue;
    auto b0 = [&](int m) {
      const auto mb = batches[static_cast<std::size_t>(m)].view();
      if (zero_bubble) {  // I now, W two micro-batches later (or at the end)
        s0.backward_input(context_for(mb, 0), mb, cspan(grad[static_cast<std::size_t>(m)]), mspan());
        weight_queue.push_back(m);
        if (weight_queue.size() > 1) {
          const auto w = batches[static_cast<std::size_t>(weight_queue.front())].view();
          s0.backward_weight(context_for(w, 0), w);
          weight_queue.erase(weight_queue.begin());
        }
      } else {
        s0.backward(context_for(mb, 0), mb, cspan(grad[static_cast<std::size_t>(m)]), mspan());
      }
    };
    // 1F1B with 2 stages: stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3; stage 1 F0 B0 F1 B1 F2 B2 F3 B3.
    f0(0), f0(1), f1(0), b1(0), b0(0), f0(2), f1(1), b1(1), b0(1), f0(3), f1(2), b1(2), b0(2), f1(3), b1(3),
        b0(3);
    for (const int m : weight_queue) {
      const auto w = batches[static_cast<std::size_t>(m)].view();
      s0.backward_weight(context_for(w, 0), w);
    }
    CHECK(most == (zero_bubble ? 3u : 2u));  // W keeps a graph two micro-batches longer
    CHECK(s0.pending() == 0);
    CHECK(s1.pending() == 0);
    CHECK(rel_diff(s0.flat().grads() + s1.flat().grads(), flat_grads(*ref)) < 1e-12);
  }
}

TEST_CASE("backbone: the mutation (backward ignores the received output gradient) changes the gradients") {
  const auto batch = make_batch(7, block_shape{}.vocab);
  const auto mb = batch.view();
  const auto n = static_cast<std::size_t>(mb.size() * block_shape{}.width);
  const auto in = seeded(11, n), gout = seeded(12, n);
  auto run = [&](bool mutate) {
    stack_stage stage(make_stack(5, 3), {.stages = 3, .ignore_output_gradient = mutate});
    const auto ctx = context_for(mb, 1);
    std::vector<double> out(n), gin(n);
    stage.forward(ctx, mb, cspan(in), mspan(out));
    stage.backward(ctx, mb, cspan(gout), mspan(gin));
    return std::pair{stage.flat().grads().clone(), at::tensor(gin)};
  };
  const auto [g, gin] = run(false);
  const auto [gm, ginm] = run(true);
  CHECK(rel_diff(gm, g) > 1e-2);
  CHECK(rel_diff(ginm, gin) > 1e-2);
}

TEST_CASE("backbone: backward without a forward, a second forward, W before I are errors naming the slot") {
  const auto batch = make_batch(7, block_shape{}.vocab);
  const auto mb = batch.view();
  const auto n = static_cast<std::size_t>(mb.size() * block_shape{}.width);
  const auto in = seeded(11, n), gout = seeded(12, n);
  stack_stage stage(make_stack(5, 3), {.stages = 3});
  const auto ctx = context_for(mb, 1);
  std::vector<double> out(n), gin(n);
  CHECK_THROWS_WITH_AS(stage.backward(ctx, mb, cspan(gout), mspan(gin)),
                       doctest::Contains("backward of (stage 1, micro-batch 0) found no autograd graph"),
                       model::activation_error);
  CHECK_THROWS_AS(stage.backward_weight(ctx, mb), model::activation_error);
  stage.forward(ctx, mb, cspan(in), mspan(out));
  CHECK_THROWS_WITH_AS(stage.forward(ctx, mb, cspan(in), mspan(out)),
                       doctest::Contains("forward of (stage 1, micro-batch 0) found the autograd graph"),
                       model::activation_error);
  CHECK(stage.pending() == 1);  // the first forward's graph is still there
  CHECK_THROWS_WITH_AS(stage.backward_weight(ctx, mb), doctest::Contains("before its backward_input"),
                       model::activation_error);
  CHECK(stage.pending() == 0);  // a failed pass releases its slot
  stage.forward(ctx, mb, cspan(in), mspan(out));
  CHECK_THROWS_AS(stage.backward(ctx, mb, cspan(gout).first(3), mspan(gin)), invalid_argument);
  CHECK_THROWS_AS(stage.backward(ctx, mb, cspan(gout), mspan(gin)), model::activation_error);  // released
  auto wrong = context_for(mb, 3);
  CHECK_THROWS_AS(stage.forward(wrong, mb, cspan(in), mspan(out)), invalid_argument);
  // a context without attention entries: the module's attention call says so
  model::default_stage_context<double> bare;
  bare.stage = 1;
  CHECK_THROWS_WITH_AS(stage.forward(bare, mb, cspan(in), mspan(out)),
                       doctest::Contains("no attention entry"), invalid_argument);
  CHECK(stage.pending() == 0);
  libtorch::standalone_call no_attention(mb, 1, 3);  // a standalone call without a local attention
  CHECK_THROWS_WITH_AS((void)stage.module().forward(at::tensor(in), no_attention.call()),
                       doctest::Contains("without a local attention"), invalid_argument);
  // wrong output size: a module output that does not fit the buffer
  CHECK_THROWS_AS(stage.forward(ctx, mb, cspan(in), mspan(out).first(5)), invalid_argument);
  CHECK(stage.pending() == 0);
}

TEST_CASE("backbone_options print") {
  CHECK(fmt::format("{}", libtorch::backbone_options{.stages = 2}) ==
        "backbone(stages=2, last=token losses)");
  CHECK(fmt::format("{}", libtorch::backbone_options{.stages = 1,
                                                     .last = libtorch::last_stage_output::loss_terms,
                                                     .ignore_output_gradient = true}) ==
        "backbone(stages=1, last=loss terms, ignores output gradients)");
}

TEST_CASE("flat_parameters: views share storage; span updates reach the module; gradients accumulate") {
  auto m = make_stack(3, 1);
  const auto before = m->parameters();
  std::vector<at::Tensor> values;
  for (const auto& p : before) values.push_back(p.detach().clone());
  libtorch::flat_parameters<double> flat(*m);
  REQUIRE(flat.count() == before.size());
  const auto* base = flat.values().data_ptr<double>();
  std::int64_t total = 0;
  const auto after = m->parameters();
  for (std::size_t i = 0; i < flat.count(); ++i) {
    const auto& p = after[i];
    CHECK(p.is_same(before[i]));                           // the module's own tensor objects
    CHECK(p.data_ptr<double>() == base + flat.offset(i));  // viewing the flat buffer
    CHECK(p.grad().data_ptr<double>() == flat.grads().data_ptr<double>() + flat.offset(i));
    CHECK(at::equal(p.detach(), values[i]));  // values kept
    CHECK(flat.parameters()[i].data() == base + flat.offset(i));
    CHECK(flat.parameters()[i].size() == static_cast<std::size_t>(p.numel()));
    total += p.numel();
  }
  CHECK(flat.size() == total);
  // an update through the spans is an update of the module
  for (auto s : flat.parameters())
    for (auto& v : s) v *= 2;
  CHECK(at::equal(m->parameters()[0].detach(), values[0] * 2));

  // gradients accumulate into the flat buffer, in place
  const auto batch = make_batch(4, block_shape{}.vocab);
  const auto mb = batch.view();
  plain_call pc(mb, 0, 1);
  auto once = [&] { weighted(m->forward(at::zeros({0}, at::kDouble), pc.call()), mb).sum().backward(); };
  once();
  const auto g1 = flat.grads().clone();
  CHECK(g1.abs().max().item<double>() > 1e-3);
  once();
  CHECK(rel_diff(flat.grads(), g1 * 2) < 1e-12);
  // zero_grad(set_to_none) drops the views; bind_gradients restores them
  m->zero_grad(true);
  CHECK(!m->parameters()[0].grad().defined());
  flat.bind_gradients();
  CHECK(m->parameters()[0].grad().data_ptr<double>() == flat.grads().data_ptr<double>());
  flat.grads().zero_();
  once();
  CHECK(rel_diff(flat.grads(), g1) < 1e-12);

  auto f = torch::nn::Linear(3, 2);  // float parameters: refused for double
  CHECK_THROWS_AS(static_cast<void>(libtorch::flat_parameters<double>(*f)), invalid_argument);
  const libtorch::flat_parameters<float> ff(*f);
  CHECK(ff.size() == 8);
}

TEST_CASE("tensor views: as_tensor and as_span share memory; copy_to checks sizes") {
  std::vector<double> v{1, 2, 3, 4, 5, 6};
  auto t = libtorch::as_tensor(mspan(v), {2, 3});
  t[1][2] = 60.0;
  CHECK(v[5] == 60.0);
  CHECK_THROWS_AS((void)libtorch::as_tensor(mspan(v), {4, 2}), invalid_argument);
  const auto s = libtorch::as_span<const double>(t);
  CHECK(s.data() == v.data());
  CHECK_THROWS_AS((void)libtorch::as_span<float>(t), invalid_argument);
  CHECK_THROWS_AS((void)libtorch::as_span<double>(t.t()), invalid_argument);  // not contiguous
  std::vector<double> w(6);
  libtorch::copy_to(t.t(), mspan(w));
  CHECK(w[1] == 4.0);
  CHECK_THROWS_AS(libtorch::copy_to(t, mspan(w).first(5)), invalid_argument);
  CHECK(libtorch::as_tensor(mspan()).numel() == 0);
  static_assert(libtorch::dtype_of<float>() == at::kFloat);
}

TEST_CASE("encoder: an adapted encoder gives plain libtorch's output and gradients; item attention") {
  const auto eb = make_encoder_batch();
  const auto ev = eb.view();
  const auto n = static_cast<std::size_t>(ev.size() * 8);
  const auto in = seeded(31, n), gout = seeded(32, n);

  Enc ref(17);
  const auto [doc, pos] = item_tokens(ev);
  libtorch::standalone_call plain(
      ev, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const model::attention_shape& sh,
              double scale) { return plain_attention(q, k, v, doc, pos, false, sh, scale); });
  auto x = at::tensor(in).requires_grad_(true);
  const auto y = ref->forward(x, plain.call());
  y.backward(at::tensor(gout).view_as(y));

  libtorch::encoder<EncImpl, double> enc(Enc(17));
  static_assert(libtorch::encoder<EncImpl, double>::modality == "vision");
  CHECK(enc.attention_heads() == 2);
  CHECK(enc.input_size(ev) == static_cast<std::int64_t>(n));
  int bwd = 0;
  local_encoder_context<double> ctx;
  ctx.backwards = &bwd;
  std::vector<double> out(n), gin(n);
  enc.forward(ctx, ev, cspan(in), mspan(out));
  CHECK(enc.pending() == 1);
  CHECK_THROWS_AS(enc.forward(ctx, ev, cspan(in), mspan(out)), model::activation_error);
  enc.backward(ctx, ev, cspan(gout), mspan(gin));
  CHECK(bwd == 1);
  CHECK(rel_diff(at::tensor(out), y.detach()) < 1e-12);
  CHECK(rel_diff(at::tensor(gin), x.grad()) < 1e-12);
  CHECK(rel_diff(enc.flat().grads(), flat_grads(*ref)) < 1e-12);
  // raw inputs: no input gradient asked, the same weight gradients again
  enc.forward(ctx, ev, cspan(in), mspan(out));
  enc.backward(ctx, ev, cspan(gout), mspan());
  CHECK(rel_diff(enc.flat().grads(), flat_grads(*ref) * 2) < 1e-12);
  CHECK_THROWS_AS(enc.backward(ctx, ev, cspan(gout), mspan()), model::activation_error);
}

TEST_CASE(
    "system: an adapted module trains under DP with CP rings, and under HDP, on 4 loopback ranks as on 1") {
  for (const std::uint64_t seed : {1u, 2u}) {
    const auto r = torch_parity(4, seed, [](comm::loopback::communicator& w) {
      return train::system<seq::cp_zigzag, model::reference_attention, comm::loopback::communicator>(
          seq::cp_zigzag{.cp = 2, .pad = true}, w);
    });
    MESSAGE(fmt::format("{}", r));
    CHECK(r.passed);
    CHECK(r.rel_error < 1e-10);
    CHECK(r.max_gradient > 1e-4);
    // HDP: rings of the sizes each document needs over the pool of 4 (capacity 6 tokens a rank)
    const auto h = torch_parity(4, seed, [](comm::loopback::communicator& w) {
      return train::system<seq::hdp<seq::no_offload>, model::reference_attention,
                           comm::loopback::communicator>(seq::hdp<seq::no_offload>{.capacity = 6}, w);
    });
    MESSAGE(fmt::format("hdp: {}", h));
    CHECK(h.passed);
    CHECK(h.rel_error < 1e-10);
    const auto plan =
        train::plan_step(seq::hdp<seq::no_offload>{.capacity = 6},
                         model::document_descs(random_step(seed, 6, 14)), 4, train::family_placement{});
    int widest = 0;
    for (const auto& ring : plan.rings) widest = std::max(widest, static_cast<int>(ring.size()));
    CHECK(widest > 1);  // some document runs over a ring of several ranks
  }
}

TEST_CASE("system: a 2-stage zero-bubble pipeline (split backward) over CP rings matches 1 rank") {
  using sys_t =
      train::system<seq::cp_zigzag, model::reference_attention, comm::loopback::communicator,
                    train::family_placement, pipeline::zero_bubble, pipeline::encoder_on_first_stage>;
  const auto make = [](comm::loopback::communicator& w) {
    return sys_t(seq::cp_zigzag{.cp = 2, .pad = true}, train::family_placement{},
                 train::pipeline_config<pipeline::zero_bubble, pipeline::encoder_on_first_stage>{2, {}, {}},
                 w);
  };
  const auto r = torch_parity(4, 3, make);
  MESSAGE(fmt::format("{}", r));
  CHECK(r.passed);
  CHECK(r.rel_error < 1e-10);
  // the mutation: stage 0 drops the gradient stage 1 sent; the parity check catches it
  const auto m = torch_parity(4, 3, make, true);
  MESSAGE(fmt::format("{}", m));
  CHECK(!m.passed);
  CHECK(m.rel_error > 1e-3);
}

TEST_CASE("system: an adapted encoder and backbone in the joint pipeline (pp 2, 1F1B) match 1 rank") {
  using sys_t = train::system<seq::cp_zigzag, model::reference_attention, comm::loopback::communicator,
                              train::family_placement, pipeline::one_f_one_b, pipeline::colocated_encoder>;
  const auto r = torch_mm_parity(4, 5, [](comm::loopback::communicator& w) {
    return sys_t(seq::cp_zigzag{.cp = 2, .pad = true}, train::family_placement{},
                 train::pipeline_config<pipeline::one_f_one_b, pipeline::colocated_encoder>{2, {}, {}}, w);
  });
  MESSAGE(fmt::format("{}", r));
  CHECK(r.passed);
  CHECK(r.rel_error < 1e-10);
  CHECK(r.stats.encoder_items > 0);
}
