// SPDX-License-Identifier: Apache-2.0
// test_libtorch_stage: libtorch::backbone and libtorch::encoder (module -> stage adapters),
// libtorch::flat_parameters, and the autograd bridge to the contexts' attention. One TU (each torch TU
// costs ~20 s to compile).
// torch first: c10 defines a CHECK macro (a fatal log) that would replace doctest's CHECK silently (both
// are system headers) and turn every CHECK into a no-op for doctest; doctest's must win.
#include "libtorch/stage_support.hpp"
#undef CHECK
#include <doctest/doctest.h>

using namespace torchtest;

namespace {

/// max |a - b| over max |b| (|b| > 0).
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

/// The module's gradients as one flat tensor (module.parameters() order), zeros where undefined.
at::Tensor flat_grads(torch::nn::Module& m) {
  std::vector<at::Tensor> g;
  for (const auto& p : m.parameters())
    g.push_back(p.grad().defined() ? p.grad().reshape({-1}) : at::zeros({p.numel()}, p.options()));
  return at::cat(g);
}

}  // namespace

TEST_CASE("backbone: a middle stage gives plain libtorch's output, input and weight gradients") {
  const block_shape s;
  const auto batch = make_batch(7, s.vocab);
  const auto mb = batch.view();
  const auto n = static_cast<std::size_t>(mb.size() * s.width);
  const auto in = seeded(11, n), gout = seeded(12, n);

  // plain libtorch on a second module of the same values
  Block ref(s, 3, 5);
  ref->plain = true;
  libtorch::detail::call_binding b;
  b.stage = 1;
  b.stages = 3;
  b.batch = &mb;
  const libtorch::stage_call plain_call(b);
  auto x = at::tensor(in).requires_grad_(true);
  const auto y = ref->forward(x, plain_call);
  y.backward(at::tensor(gout).view_as(y));

  libtorch::backbone<BlockImpl, double> stage(Block(s, 3, 5), {.stages = 3});
  int fwd = 0, bwd = 0;
  local_context<double> ctx;
  ctx.stage = 1;
  ctx.micro_batch = 0;
  ctx.mb = &mb;
  ctx.forwards = &fwd;
  ctx.backwards = &bwd;
  std::vector<double> out(n), gin(n);
  stage.forward(ctx, mb, std::span<const double>(in), std::span<double>(out));
  CHECK(stage.pending() == 1);
  CHECK(fwd == 1);
  stage.backward(ctx, mb, std::span<const double>(gout), std::span<double>(gin));
  CHECK(stage.pending() == 0);
  CHECK(bwd == 1);

  CHECK(rel_diff(at::tensor(out), y.detach().reshape({-1})) < 1e-12);
  CHECK(rel_diff(at::tensor(gin), x.grad()) < 1e-12);
  CHECK(rel_diff(stage.flat().grads(), flat_grads(*ref)) < 1e-12);
}
