// SPDX-License-Identifier: Apache-2.0
// model::attention_context and model::encoder_attention_context: which contexts model them (each requirement
// removed in turn), that the two entries are told apart by their arguments, and that a stage written
// against the concept runs with a context of the user's own (the library's contexts are checked in
// tests/train/system.cpp and by static_asserts in train/).
#include <doctest/doctest.h>

#include <span>
#include <vector>

#include <hetmesh/model/attention_context.hpp>
#include <hetmesh/model/context.hpp>
#include <hetmesh/model/stage.hpp>

using namespace hetmesh;
using namespace hetmesh::model;

namespace {

using store_t = host_activation_store<double>;

/// A one-rank backbone context: attention of each query over itself (out = v, lse = 0), counting calls.
/// Each requirement can be switched off.
template <bool Fwd = true, bool Bwd = true, bool Slots = true>
struct ring_ctx {
  stage_context<communicator_archetype, store_t> base;
  mutable int forwards = 0;
  mutable int backwards = 0;

  void attention_forward(attention_shape, double, std::span<const double>, std::span<const double>,
                         std::span<const double> v, std::span<double> out,
                         std::span<double> lse) const requires Fwd {
    ++forwards;
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = v[i];
    for (auto& l : lse) l = 0;
  }
  void attention_backward(attention_shape, double, std::span<const double>, std::span<const double>,
                          std::span<const double>, std::span<const double>, std::span<const double>,
                          std::span<const double> dout, std::span<double> dq, std::span<double> dk,
                          std::span<double> dv) const requires Bwd {
    ++backwards;
    for (auto& x : dq) x = 0;
    for (auto& x : dk) x = 0;
    for (std::size_t i = 0; i < dv.size(); ++i) dv[i] = dout[i];
  }
  activation_slot<store_t> slots() const requires Slots { return base.slots(); }
};

/// An encoder context: the same entries with the call's encoder_batch_view first.
template <bool Fwd = true, bool Bwd = true, bool Slots = true>
struct item_ctx {
  stage_context<communicator_archetype, store_t> base;
  void attention_forward(const encoder_batch_view&, attention_shape, double, std::span<const double>,
                         std::span<const double>, std::span<const double>, std::span<double>,
                         std::span<double>) const requires Fwd {}
  void attention_backward(const encoder_batch_view&, attention_shape, double, std::span<const double>,
                          std::span<const double>, std::span<const double>, std::span<const double>,
                          std::span<const double>, std::span<const double>, std::span<double>,
                          std::span<double>, std::span<double>) const requires Bwd {}
  activation_slot<store_t> slots() const requires Slots { return base.slots(); }
};

static_assert(attention_context<ring_ctx<>, double>);
static_assert(check_attention_context<ring_ctx<>, double>());
static_assert(!attention_context<ring_ctx<false>, double>);
static_assert(!attention_context<ring_ctx<true, false>, double>);
static_assert(!attention_context<ring_ctx<true, true, false>, double>);
static_assert(!attention_context<ring_ctx<>, float>);  // spans of double do not take float tensors

static_assert(encoder_attention_context<item_ctx<>, double>);
static_assert(check_encoder_attention_context<item_ctx<>, double>());
static_assert(!encoder_attention_context<item_ctx<false>, double>);
static_assert(!encoder_attention_context<item_ctx<true, false>, double>);
static_assert(!encoder_attention_context<item_ctx<true, true, false>, double>);

// The two entries differ by the encoder batch view: neither context models the other's concept.
static_assert(!encoder_attention_context<ring_ctx<>, double>);
static_assert(!attention_context<item_ctx<>, double>);
// A plain stage context has no attention entry.
static_assert(!attention_context<stage_context<communicator_archetype, store_t>, double>);

/// A backbone stage body constrained on the concept: y = attention(x, x, x), saving x.
template <attention_context<double> Ctx>
void attend(const Ctx& ctx, std::span<const double> x, std::span<double> y) {
  std::vector<double> lse(x.size());
  ctx.attention_forward(attention_shape{1, 1, 1}, 1.0, x, x, x, y, lse);
  ctx.slots().save(0, x);
}

}  // namespace

TEST_CASE("attention_context: a stage written against the concept runs with the user's context") {
  store_t store;
  ring_ctx<> ctx;
  ctx.base.activations = &store;
  ctx.base.stage = 1;
  ctx.base.micro_batch = 2;
  const std::vector<double> x{0.5, -1.5, 2.0};
  std::vector<double> y(3);
  attend(ctx, std::span<const double>(x), std::span<double>(y));
  CHECK(ctx.forwards == 1);
  CHECK(y == x);
  CHECK(store.contains(activation_key{1, 2, 0}));
}
