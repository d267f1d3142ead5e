// SPDX-License-Identifier: Apache-2.0
// The libtorch kernels and helpers: libtorch::block_attention equals model::reference_attention on seeded
// random blocks (GQA, causal and full, several documents, rows with no key; double within 1e-12, float
// within 1e-5), bitwise repeatably, and drives ring attention over loopback ranks to the reference's
// results; libtorch::attention_with_lse's autograd gradients equal finite differences and the block
// kernel's closed form; libtorch::tensor_memory computes the memory sequence of host_memory and runs an
// activation store and the ring; the tensor-parallel autograd functions give a column-then-row parallel
// MLP on 2 loopback ranks the 1-rank output and gradients.
// The torch headers come first: glog (through c10's logging) defines CHECK, which doctest's must replace.
#include <ATen/ops/linspace.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/autograd.h>

#include <hetmesh/libtorch/attention_with_lse.hpp>
#include <hetmesh/libtorch/block_attention.hpp>
#include <hetmesh/libtorch/tensor_memory.hpp>
#include <hetmesh/libtorch/tensor_parallel.hpp>

#undef CHECK
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <span>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/activation.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/seq/attention_merge.hpp>

#include "run/ring_attention_body.hpp"
#include "support/memory_sequence.hpp"

using namespace hetmesh;

namespace {

constexpr double neg_inf = -std::numeric_limits<double>::infinity();

/// A random block: nq queries and nk keys over documents 0..docs-1 with random positions; query tokens
/// of document 9 (never a key's) see no key.
template <class T>
struct random_block {
  model::attention_shape shape;
  std::vector<T> q, k, v, dout;
  std::vector<std::int64_t> q_doc, q_pos, k_doc, k_pos;

  random_block(std::uint64_t seed, std::size_t nq, std::size_t nk, model::attention_shape s, int docs)
      : shape(s) {
    rng g(seed);
    auto fill = [&](std::vector<T>& x, std::size_t n) {
      x.resize(n);
      for (auto& e : x) e = static_cast<T>(g.unit() * 2 - 1);
    };
    const auto hq = static_cast<std::size_t>(s.q_heads), hk = static_cast<std::size_t>(s.kv_heads),
               d = static_cast<std::size_t>(s.head_dim);
    fill(q, nq * hq * d), fill(dout, nq * hq * d), fill(k, nk * hk * d), fill(v, nk * hk * d);
    for (std::size_t i = 0; i < nq; ++i) {
      q_doc.push_back(i + 1 == nq ? 9 : static_cast<std::int64_t>(g.below(static_cast<std::uint64_t>(docs))));
      q_pos.push_back(static_cast<std::int64_t>(g.below(12)));
    }
    for (std::size_t j = 0; j < nk; ++j) {
      k_doc.push_back(static_cast<std::int64_t>(g.below(static_cast<std::uint64_t>(docs))));
      k_pos.push_back(static_cast<std::int64_t>(g.below(12)));
    }
  }
  model::attention_block<T> block(seq::block_mask m, T scale) const {
    return {shape, q, k, v, q_doc, q_pos, k_doc, k_pos, m, scale};
  }
};

struct fb_result {
  std::vector<double> out, lse, dq, dk, dv;
};

/// Forward then backward (from the block's own lse and delta, onto dq/dk/dv preset to 0.5) with kernel K.
template <class T, class K>
fb_result run_kernel(K& kern, const random_block<T>& rb, seq::block_mask m) {
  const auto b = rb.block(m, static_cast<T>(0.37));
  std::vector<T> out(rb.q.size()), lse(rb.q_doc.size() * static_cast<std::size_t>(rb.shape.q_heads));
  kern.forward(b, {out, lse});
  std::vector<T> delta(lse.size()), dq(rb.q.size(), T(0.5)), dk(rb.k.size(), T(0.5)), dv(rb.k.size(), T(0.5));
  seq::attention_delta(std::span<const T>(out), std::span<const T>(rb.dout), std::span<T>(delta),
                       static_cast<std::size_t>(rb.shape.head_dim));
  kern.backward(b, {rb.dout, lse, delta, dq, dk, dv});
  auto wide = [](const std::vector<T>& x) { return std::vector<double>(x.begin(), x.end()); };
  return {wide(out), wide(lse), wide(dq), wide(dk), wide(dv)};
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;  // equal infinities too
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

template <class T>
void compare_with_reference(double tol) {
  const model::attention_shape shapes[] = {{4, 2, 8}, {3, 3, 5}, {6, 1, 4}, {1, 1, 16}};
  int empty_rows = 0, split = 0, dense = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed)
    for (const auto& s : shapes)
      for (auto m : {seq::block_mask::causal, seq::block_mask::full}) {
        CAPTURE(seed);
        CAPTURE(s.q_heads);
        CAPTURE(static_cast<int>(m));
        const random_block<T> rb(seed, 5 + seed * 3, 4 + seed * 2, s, 1 + static_cast<int>(seed % 3));
        // Both bodies run: document by document, and dense.
        const libtorch::token_meta meta{rb.q_doc, rb.q_pos, rb.k_doc, rb.k_pos};
        const auto nq = static_cast<std::int64_t>(rb.q_doc.size()),
                   nk = static_cast<std::int64_t>(rb.k_doc.size());
        (libtorch::detail::split_by_document(meta, nq, nk, at::kCPU).empty() ? dense : split) += 1;
        model::reference_attention ref;
        libtorch::block_attention kern;
        const auto want = run_kernel(ref, rb, m), got = run_kernel(kern, rb, m);
        CHECK(max_diff(got.out, want.out) <= tol);
        CHECK(max_diff(got.lse, want.lse) <= tol);
        CHECK(max_diff(got.dq, want.dq) <= tol);
        CHECK(max_diff(got.dk, want.dk) <= tol);
        CHECK(max_diff(got.dv, want.dv) <= tol);
        for (std::size_t i = 0; i < got.lse.size(); ++i)
          if (want.lse[i] == neg_inf) {
            CHECK(got.lse[i] == neg_inf);
            ++empty_rows;
          }
        // Bitwise repeatable.
        const auto again = run_kernel(kern, rb, m);
        CHECK(again.out == got.out);
        CHECK(again.dq == got.dq);
        CHECK(again.dk == got.dk);
      }
  CHECK(empty_rows > 0);
  CHECK(split > 0);
  CHECK(dense > 0);
}

}  // namespace

TEST_CASE("libtorch::block_attention equals model::reference_attention (GQA, masks, documents, empty rows)") {
  compare_with_reference<double>(1e-12);
  compare_with_reference<float>(1e-5);
}

TEST_CASE("libtorch::block_attention refuses bad blocks before writing") {
  const random_block<double> rb(3, 6, 5, {4, 2, 8}, 2);
  std::vector<double> out(rb.q.size(), 7.0), lse(6 * 4, 7.0);
  libtorch::block_attention kern;
  auto b = rb.block(seq::block_mask::causal, 0.3);
  b.q = std::span<const double>(rb.q).first(8);
  CHECK_THROWS_WITH_AS(kern.forward(b, {out, lse}), doctest::Contains("q holds 8 elements; expected 192"),
                       invalid_argument);
  CHECK_THROWS_AS(kern.forward(rb.block(seq::block_mask::none, 0.3), {out, lse}), invalid_argument);
  CHECK_THROWS_WITH_AS(
      kern.forward(rb.block(seq::block_mask::full, 0.3), {out, std::span<double>(lse).first(3)}),
      doctest::Contains("lse holds 3 elements; expected 24"), invalid_argument);
  std::vector<double> g(rb.q.size()), small(4);
  CHECK_THROWS_WITH_AS(
      kern.backward(rb.block(seq::block_mask::full, 0.3), {rb.dout, lse, lse, g, small, small}),
      doctest::Contains("dk holds 4 elements; expected 80"), invalid_argument);
  CHECK(out[0] == 7.0);
}

namespace {

/// Loss of attention_with_lse: sum(out * dout) + sum over rows that see a key of lse * w.
double lse_loss(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
                const at::Tensor& w, const libtorch::token_meta& meta, seq::block_mask m) {
  const auto r = libtorch::attention_with_lse(q, k, v, meta, m, 0.37);
  const auto finite = r.lse.isfinite();
  return r.out.mul(dout).sum().add(at::where(finite, r.lse, 0.0).mul(w).sum()).item<double>();
}

}  // namespace

TEST_CASE("libtorch::attention_with_lse: autograd gradients equal finite differences and the closed form") {
  const random_block<double> rb(11, 7, 6, {4, 2, 3}, 2);
  const libtorch::token_meta meta{rb.q_doc, rb.q_pos, rb.k_doc, rb.k_pos};
  auto tensor = [](const std::vector<double>& x, std::int64_t n, std::int64_t h) {
    return at::tensor(at::ArrayRef<double>(x), at::TensorOptions().dtype(at::kDouble)).reshape({n, h, 3});
  };
  for (auto m : {seq::block_mask::causal, seq::block_mask::full}) {
    CAPTURE(static_cast<int>(m));
    auto q = tensor(rb.q, 7, 4).requires_grad_(), k = tensor(rb.k, 6, 2).requires_grad_(),
         v = tensor(rb.v, 6, 2).requires_grad_();
    const auto dout = tensor(rb.dout, 7, 4);
    const auto w = at::linspace(-1.0, 1.0, 28, at::TensorOptions().dtype(at::kDouble)).reshape({7, 4});
    const auto r = libtorch::attention_with_lse(q, k, v, meta, m, 0.37);
    CHECK(r.lse[6].eq(neg_inf).all().item<bool>());  // document 9 sees nothing
    CHECK(r.out[6].eq(0.0).all().item<bool>());
    const auto loss = r.out.mul(dout).sum().add(at::where(r.lse.isfinite(), r.lse, 0.0).mul(w).sum());
    const auto grads = torch::autograd::grad({loss}, {q, k, v}, {}, /*retain_graph=*/true);
    double worst = 0;
    const double h = 1e-6;
    for (int which = 0; which < 3; ++which) {
      auto x = std::vector<at::Tensor>{q, k, v}[static_cast<std::size_t>(which)].detach().clone();
      auto flat = x.view({-1});
      for (std::int64_t i = 0; i < flat.numel(); ++i) {
        const double x0 = flat[i].item<double>();
        auto with = [&](double val) {
          flat[i] = val;
          const auto qq = which == 0 ? x : q.detach(), kk = which == 1 ? x : k.detach(),
                     vv = which == 2 ? x : v.detach();
          return lse_loss(qq, kk, vv, dout, w, meta, m);
        };
        const double fd = (with(x0 + h) - with(x0 - h)) / (2 * h);
        flat[i] = x0;
        worst = std::max(
            worst, std::abs(fd - grads[static_cast<std::size_t>(which)].reshape({-1})[i].item<double>()));
      }
    }
    CHECK(worst < 1e-7);
    // Without the lse term, the gradients are the block kernel's closed form (from the own lse and delta).
    const auto plain = torch::autograd::grad({r.out.mul(dout).sum()}, {q, k, v});
    libtorch::block_attention kern;
    const auto want = run_kernel(kern, rb, m);
    auto minus_half = [](const std::vector<double>& x) {
      std::vector<double> y(x);
      for (auto& e : y) e -= 0.5;  // run_kernel accumulates onto 0.5
      return y;
    };
    auto as_vec = [](const at::Tensor& t) {
      const auto c = t.contiguous();
      return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
    };
    CHECK(max_diff(as_vec(plain[0]), minus_half(want.dq)) < 1e-12);
    CHECK(max_diff(as_vec(plain[1]), minus_half(want.dk)) < 1e-12);
    CHECK(max_diff(as_vec(plain[2]), minus_half(want.dv)) < 1e-12);
  }
}

TEST_CASE("libtorch::attention_with_lse: one document by default, and empty blocks") {
  at::manual_seed(1234);  // seeded inputs (ranks draw in turn from the one generator)
  auto q = at::randn({5, 2, 4}, at::TensorOptions().dtype(at::kDouble));
  auto k = at::randn({5, 1, 4}, at::TensorOptions().dtype(at::kDouble));
  const std::vector<std::int64_t> zeros(5, 0), pos{0, 1, 2, 3, 4};
  const auto a = libtorch::attention_with_lse(q, k, k, {}, seq::block_mask::causal, 0.5);
  const auto b =
      libtorch::attention_with_lse(q, k, k, {zeros, pos, zeros, pos}, seq::block_mask::causal, 0.5);
  CHECK(a.out.equal(b.out));
  CHECK(a.lse.equal(b.lse));
  const auto e =
      libtorch::attention_with_lse(q, k.narrow(0, 0, 0), k.narrow(0, 0, 0), {}, seq::block_mask::full, 1.0);
  CHECK(e.lse.eq(neg_inf).all().item<bool>());
  CHECK(e.out.eq(0.0).all().item<bool>());
  CHECK_THROWS_AS(libtorch::attention_with_lse(q, q, q.narrow(1, 0, 1), {}, seq::block_mask::full, 1.0),
                  invalid_argument);
}

TEST_CASE("libtorch::tensor_memory computes host_memory's memory sequence; its buffers are tensors") {
  for (std::size_t dim : {1, 4, 33})
    for (std::size_t rows : {1, 9, 100}) {
      rng g(rows * 7 + dim);
      std::vector<double> x(rows * dim), y(rows * dim), la(rows), lb(rows);
      for (auto* vec : {&x, &y})
        for (auto& e : *vec) e = g.unit() * 2 - 1;
      for (std::size_t r = 0; r < rows; ++r) {
        la[r] = r % 7 == 0 ? neg_inf : g.unit() * 4 - 2;
        lb[r] = r % 5 == 0 || r % 3 == 0 ? neg_inf : g.unit() * 4 - 2;
      }
      model::host_memory h;
      libtorch::tensor_memory t;
      const auto want =
          test_support::run_memory_sequence(h, std::span<const double>(x), std::span<const double>(y),
                                            std::span<const double>(la), std::span<const double>(lb), dim);
      const auto got =
          test_support::run_memory_sequence(t, std::span<const double>(x), std::span<const double>(y),
                                            std::span<const double>(la), std::span<const double>(lb), dim);
      CHECK(max_diff(got, want) < 1e-13);  // torch's exp and log, not std::'s: not bitwise
    }
  libtorch::tensor_memory::buffer<float> b;
  CHECK(b.size() == 0);
  b.resize(6);
  for (std::size_t i = 0; i < 6; ++i) b.span()[i] = static_cast<float>(i);
  CHECK(b.tensor().data_ptr<float>() == b.span().data());  // the span is the tensor's storage
  b.resize(8);
  CHECK(b.span()[5] == 5.0f);  // kept
  CHECK(b.tensor().numel() == 8);
  libtorch::tensor_memory mem;
  std::vector<float> small(3);
  CHECK_THROWS_WITH_AS(mem.copy(b.span(), std::span<const float>(small)),
                       doctest::Contains("destination holds 8 elements, source 3"), invalid_argument);
  // The runtime's activation store runs over it.
  model::memory_activation_store<double, libtorch::tensor_memory> store;
  const std::vector<double> data{1.5, -2.0, 3.25};
  store.write(model::activation_key{1, 2, 0}, data);
  const auto back = store.read(model::activation_key{1, 2, 0});
  CHECK(std::vector<double>(back.begin(), back.end()) == data);
  // The CUDA policy needs a torch with CUDA.
  if (!at::hasCUDA()) CHECK_THROWS_AS(libtorch::cuda_tensor_memory{}, invalid_argument);
}

namespace {

/// THD-packed documents over a ring of 4 loopback ranks: ring attention forward and backward with kernel
/// K and memory policy M; returns every position's results, concatenated (rank 0's view after a gather
/// is not needed: each rank compares its own).
template <class K, class M>
std::vector<double> ring_run(comm::loopback::communicator& world, K& kern, M& mem) {
  using namespace ringtest;
  const std::int64_t lens[5] = {7, 11, 5, 20, 3};
  const auto s = seq::ring_for(seq::partition_thd(lens, 4, true), {2, 0, 3, 1});
  std::map<std::int64_t, std::int64_t> lengths;
  for (std::int64_t d = 0; d < 5; ++d) lengths[d] = lens[d];
  const int p = run::ring_position(s, world.rank());
  auto io = make_io<double>(s, p, lengths, 17);
  std::vector<run::ring_forward_task<double>> fw{{&s, input_of(io), io.out, io.lse}};
  std::vector<run::ring_backward_task<double>> bw{
      {&s, input_of(io), io.out, io.lse, io.dout, io.dq, io.dk, io.dv}};
  run::ring_attention_forward_all(world, fw, kern, mem);
  run::ring_attention_backward_all(world, bw, kern, mem);
  std::vector<double> all;
  for (const auto* x : {&io.out, &io.lse, &io.dq, &io.dk, &io.dv})
    all.insert(all.end(), x->begin(), x->end());
  return all;
}

}  // namespace

TEST_CASE(
    "ring attention over 4 loopback ranks: block_attention and tensor_memory give the reference's results") {
  std::vector<double> worst(4, -1.0);
  std::vector<std::size_t> sizes(4);
  comm::loopback::run(4, [&](comm::loopback::communicator& c) {
    model::reference_attention ref;
    model::host_memory host;
    libtorch::block_attention kern;
    libtorch::tensor_memory tmem;
    const auto want = ring_run(c, ref, host);
    const auto got = ring_run(c, kern, tmem);
    worst[static_cast<std::size_t>(c.rank())] = max_diff(got, want);
    sizes[static_cast<std::size_t>(c.rank())] = want.size();
  });
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(sizes[r] > 0);
    CHECK(worst[r] >= 0.0);
    CHECK(worst[r] < 1e-12);
  }
}

namespace {

/// A 2-layer MLP y = tanh(x W1^T) W2^T, column-then-row parallel over c (W1's rows and W2's columns split
/// in rank order); returns y and the gradients of sum(y * dy) w.r.t. x and this rank's W1 and W2 blocks.
/// With enter = false the input skips copy_to_tp (the mutation the test must catch).
std::vector<at::Tensor> tp_mlp(comm::loopback::communicator& c, const at::Tensor& x0, const at::Tensor& w1,
                               const at::Tensor& w2, const at::Tensor& dy, bool enter = true) {
  const std::int64_t f = w1.size(0) / c.size(), r = c.rank();
  auto x = x0.clone().requires_grad_();
  auto a = w1.narrow(0, r * f, f).clone().requires_grad_();
  auto b = w2.narrow(1, r * f, f).clone().requires_grad_();
  const auto h = at::tanh((enter ? libtorch::copy_to_tp(c, x) : x).matmul(a.t()));
  const auto y = libtorch::reduce_from_tp(c, h.matmul(b.t()));
  const auto g = torch::autograd::grad({y.mul(dy).sum()}, {x, a, b});
  return {y.detach(), g[0], g[1], g[2]};
}

}  // namespace

TEST_CASE("tensor-parallel autograd functions: a column-then-row MLP on 2 ranks equals 1 rank") {
  at::manual_seed(1234);  // seeded inputs (ranks draw in turn from the one generator)
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  const auto x = at::randn({5, 6}, opt), w1 = at::randn({8, 6}, opt), w2 = at::randn({6, 8}, opt),
             dy = at::randn({5, 6}, opt);
  std::vector<at::Tensor> one;
  comm::loopback::run(1, [&](comm::loopback::communicator& c) { one = tp_mlp(c, x, w1, w2, dy); });
  std::vector<std::vector<at::Tensor>> two(2);
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    two[static_cast<std::size_t>(c.rank())] = tp_mlp(c, x, w1, w2, dy);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto& t = two[r];
    const auto ri = static_cast<std::int64_t>(r);
    CHECK(t[0].allclose(one[0], 0, 1e-12));  // the output, whole on every rank
    CHECK(t[1].allclose(one[1], 0, 1e-12));  // dx, all-reduced by copy_to_tp's backward
    CHECK(t[2].allclose(one[2].narrow(0, ri * 4, 4), 0, 1e-12));
    CHECK(t[3].allclose(one[3].narrow(1, ri * 4, 4), 0, 1e-12));
  }
  // Without copy_to_tp's all-reduce each rank's dx is only its part: the check above would fail.
  std::vector<at::Tensor> skipped;
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    auto t = tp_mlp(c, x, w1, w2, dy, false);
    if (c.rank() == 0) skipped = std::move(t);
  });
  CHECK(skipped[0].allclose(one[0], 0, 1e-12));
  CHECK_FALSE(skipped[1].allclose(one[1], 0, 1e-6));
}

TEST_CASE("tensor-parallel autograd functions: gather/scatter along columns and tokens are adjoint") {
  at::manual_seed(1234);  // seeded inputs (ranks draw in turn from the one generator)
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  const auto full = at::randn({4, 6}, opt), dfull = at::randn({4, 6}, opt);
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    const auto r = c.rank();
    auto part = full.narrow(1, r * 3, 3).clone().requires_grad_();
    const auto g = libtorch::gather_from_tp(c, part);
    CHECK(g.equal(full));
    const auto dpart = torch::autograd::grad({g.mul(dfull).sum()}, {part})[0];
    CHECK(dpart.equal(dfull.narrow(1, r * 3, 3)));
    auto whole = full.clone().requires_grad_();
    const auto s = libtorch::scatter_to_tp(c, whole);
    CHECK(s.equal(full.narrow(1, r * 3, 3)));
    const auto dwhole = torch::autograd::grad({s.mul(dfull.narrow(1, r * 3, 3)).sum()}, {whole})[0];
    CHECK(dwhole.equal(dfull));  // both ranks' blocks gathered
    auto rows = full.narrow(0, r * 2, 2).clone().requires_grad_();
    const auto gs = libtorch::gather_from_sp(c, rows);
    CHECK(gs.equal(full));
    const auto drows = torch::autograd::grad({gs.mul(dfull).sum()}, {rows})[0];
    CHECK(drows.allclose(dfull.narrow(0, r * 2, 2).mul(2), 0, 1e-15));  // summed over both ranks' copies
    auto partial = full.mul(r + 1).requires_grad_();
    const auto rs = libtorch::reduce_scatter_to_sp(c, partial);
    CHECK(rs.allclose(full.narrow(0, r * 2, 2).mul(3), 0, 1e-14));
    CHECK_THROWS_AS(libtorch::scatter_to_tp(c, at::randn({2, 3}, opt)), invalid_argument);
  });
}

TEST_CASE("vocab_parallel_cross_entropy on 2 ranks equals the whole-vocabulary loss and its gradient") {
  at::manual_seed(1234);  // seeded inputs (ranks draw in turn from the one generator)
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  const auto logits = at::randn({5, 8}, opt);
  const std::vector<std::int64_t> targets{3, 7, 0, 4, 5};
  const std::vector<double> weights{1.0, 0.5, 0.0, 1.0, 2.0};
  const auto dloss = at::randn({5}, opt);
  // The plain loss over the whole vocabulary, with autograd.
  auto whole = logits.clone().requires_grad_();
  const auto t = at::tensor(at::ArrayRef<std::int64_t>(targets), at::TensorOptions().dtype(at::kLong));
  const auto w = at::tensor(at::ArrayRef<double>(weights), opt);
  const auto want = whole.logsumexp(1).sub(whole.gather(1, t.unsqueeze(1)).squeeze(1)).mul(w).div(3.0);
  const auto dwant = torch::autograd::grad({want.mul(dloss).sum()}, {whole})[0];
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    auto mine = logits.narrow(1, c.rank() * 4, 4).clone().requires_grad_();
    const auto loss = libtorch::vocab_parallel_cross_entropy(c, mine, 8, targets, weights, 3);
    CHECK(loss.allclose(want.detach(), 0, 1e-12));
    const auto d = torch::autograd::grad({loss.mul(dloss).sum()}, {mine})[0];
    CHECK(d.allclose(dwant.narrow(1, c.rank() * 4, 4), 0, 1e-12));
  });
}

TEST_CASE("moe_dispatch and moe_combine on 2 EP ranks equal the gated sum of the experts, with gradients") {
  at::manual_seed(1234);  // seeded inputs (ranks draw in turn from the one generator)
  // 4 experts over ep = 2, top 2; expert e scales its rows by e + 1. Each rank routes its own tokens.
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  const seq::moe_layout layout{4, 2, 2};
  const at::Tensor xs[2] = {at::randn({6, 3}, opt), at::randn({6, 3}, opt)},
                   gs[2] = {at::rand({12}, opt), at::rand({12}, opt)},
                   dys[2] = {at::randn({6, 3}, opt), at::randn({6, 3}, opt)};
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    const auto r = static_cast<std::uint64_t>(c.rank());
    rng g(40 + r);
    const std::int64_t n = 6;
    std::vector<std::int64_t> experts;
    for (std::int64_t t = 0; t < n; ++t) {
      const auto a = static_cast<std::int64_t>(g.below(4)),
                 b = (a + 1 + static_cast<std::int64_t>(g.below(3))) % 4;
      experts.push_back(a), experts.push_back(b);
    }
    const auto x0 = xs[r], g0 = gs[r], dy = dys[r];
    const std::vector<double> gates_host(g0.data_ptr<double>(), g0.data_ptr<double>() + n * 2);
    const libtorch::tensor_memory mem;
    const auto plan = run::moe_plan(c, layout, {}, std::span<const std::int64_t>(experts),
                                    std::span<const double>(gates_host), mem);
    auto x = x0.clone().requires_grad_(), gates = g0.clone().requires_grad_();
    const auto in = libtorch::moe_dispatch(c, plan, x);
    std::vector<double> scale;
    for (std::size_t j = 0; j < plan.expert_counts.size(); ++j)
      scale.insert(scale.end(), static_cast<std::size_t>(plan.expert_counts[j]),
                   static_cast<double>(layout.first_expert(c.rank()) + static_cast<std::int64_t>(j) + 1));
    const auto s = at::tensor(at::ArrayRef<double>(scale), opt).unsqueeze(1);
    const auto y = libtorch::moe_combine(c, plan, in.mul(s), gates);
    const auto gr = torch::autograd::grad({y.mul(dy).sum()}, {x, gates});
    // The same layer on this rank alone, with autograd: y[t] = sum_j gates[t j] (e_j + 1) x[t].
    auto xr = x0.clone().requires_grad_(), gr0 = g0.clone().requires_grad_();
    const auto e = at::tensor(at::ArrayRef<std::int64_t>(experts), at::TensorOptions().dtype(at::kLong));
    const auto factor = gr0.mul(e.to(at::kDouble).add(1)).reshape({n, 2}).sum(1, true);
    const auto yr = xr.mul(factor);
    const auto want = torch::autograd::grad({yr.mul(dy).sum()}, {xr, gr0});
    CHECK(y.allclose(yr, 0, 1e-12));
    CHECK(gr[0].allclose(want[0], 0, 1e-12));
    CHECK(gr[1].allclose(want[1], 0, 1e-12));
    CHECK(plan.expert_rows() > 0);
  });
}
