// SPDX-License-Identifier: Apache-2.0
// The GPU example's kernels (examples/mllm_train_gpu/math.hpp) on their host and emulated backends: each
// against the CPU example's layer (examples/mllm_train/layers.hpp, bit for bit where the summation order is
// the same), a direct loop of its documented formula, or train::adam, over random inputs including zero
// sizes, in float and double; the emulated backend gives the host backend's results through device views
// and refuses a host pointer by the kernel's name. The CUDA backend is the same kernel bodies, compiled
// (a GPU runs it through example_mllm_train_gpu --check-reference).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <hetmesh/core/memory_space.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/train/optimizer.hpp>

#include "mllm_train/layers.hpp"
#include "mllm_train_gpu/math.hpp"

namespace {

using mllm_gpu::backend;
using mllm_gpu::math;
using i64 = std::int64_t;

/// Checks a == b elementwise: exactly when tol == 0, else within tol relative to max(1, |b|).
template <class T>
void same(const std::string& what, const std::vector<T>& a, const std::vector<T>& b, double tol = 0) {
  INFO(what);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(static_cast<double>(a[i])) && std::isnan(static_cast<double>(b[i]))) continue;
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (tol == 0 ? a[i] != b[i] : d > tol * std::max(1.0, std::abs(static_cast<double>(b[i])))) {
      INFO("element " << i << ": " << static_cast<double>(a[i]) << " vs " << static_cast<double>(b[i]));
      CHECK(false);
      return;
    }
  }
}

struct inputs {
  std::mt19937_64 rng{42};
  template <class T>
  std::vector<T> draw(std::size_t n, double lo = -2, double hi = 2) {
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<T> v(n);
    for (auto& x : v) x = static_cast<T>(u(rng));
    return v;
  }
};

template <class T>
std::span<const T> cs(const std::vector<T>& v) {
  return v;
}

template <class T>
void linear_maps(const math<T>& M, inputs& in, double tol_dy_wt) {
  const std::vector<std::array<i64, 3>> shapes = {{5, 7, 3}, {1, 1, 1}, {0, 4, 3},
                                                  {4, 0, 3}, {4, 3, 0}, {17, 33, 9}};
  for (auto [n, k, m] : shapes) {
    const auto sh = " n" + std::to_string(n) + " k" + std::to_string(k) + " m" + std::to_string(m);
    auto x = in.draw<T>(n * k), w = in.draw<T>(k * m), dy = in.draw<T>(n * m);
    auto y = in.draw<T>(n * m), yr = in.draw<T>(n * m);  // overwritten
    M.matmul(x.data(), w.data(), y.data(), n, k, m);
    mllm::matmul<T>(cs(x), cs(w), std::span<T>(yr), n, k, m);
    same("matmul" + sh, y, yr);
    auto dw = in.draw<T>(k * m), dwr = dw;
    M.add_xt_dy(x.data(), dy.data(), dw.data(), n, k, m);
    mllm::add_xt_dy<T>(cs(x), cs(dy), std::span<T>(dwr), n, k, m);
    same("add_xt_dy" + sh, dw, dwr);
    auto dx = in.draw<T>(n * k), dxr = dx;  // the reference sums into a local first
    M.add_dy_wt(dy.data(), w.data(), dx.data(), n, k, m);
    mllm::add_dy_wt<T>(cs(dy), cs(w), std::span<T>(dxr), n, k, m);
    same("add_dy_wt" + sh, dx, dxr, tol_dy_wt);
  }
}

template <class T>
void rows_and_norms(const math<T>& M, inputs& in) {
  for (auto [n, wd] : std::vector<std::array<i64, 2>>{{6, 10}, {1, 1}, {0, 5}, {5, 0}, {40, 64}}) {
    const auto sh = " n" + std::to_string(n) + " w" + std::to_string(wd);
    auto x = in.draw<T>(n * wd), g = in.draw<T>(wd, 0.5, 1.5), dy = in.draw<T>(n * wd);
    auto y = in.draw<T>(n * wd), yr = y, r = in.draw<T>(n), rr = r;
    M.rmsnorm_forward(x.data(), g.data(), y.data(), r.data(), n, wd, 1e-6);
    mllm::rmsnorm_forward<T>(cs(x), cs(g), std::span<T>(yr), std::span<T>(rr), n, wd, 1e-6);
    same("rmsnorm_forward" + sh, y, yr);
    same("rmsnorm_forward rstd" + sh, r, rr);
    auto dx = in.draw<T>(n * wd), dxr = dx;
    M.rmsnorm_input_grad(x.data(), g.data(), r.data(), dy.data(), dx.data(), n, wd);
    mllm::rmsnorm_input_grad<T>(cs(x), cs(g), cs(r), cs(dy), std::span<T>(dxr), n, wd);
    same("rmsnorm_input_grad" + sh, dx, dxr);
    auto dg = in.draw<T>(wd), dgr = dg;
    M.rmsnorm_gain_grad(x.data(), r.data(), dy.data(), dg.data(), n, wd);
    mllm::rmsnorm_gain_grad<T>(cs(x), cs(r), cs(dy), std::span<T>(dgr), n, wd);
    same("rmsnorm_gain_grad" + sh, dg, dgr);
    auto b = in.draw<T>(wd), xb = x, xbr = x;
    M.add_bias(xb.data(), b.data(), n, wd);
    for (i64 i = 0; i < n; ++i)
      for (i64 j = 0; j < wd; ++j) xbr[i * wd + j] += b[j];
    same("add_bias" + sh, xb, xbr);
    auto db = in.draw<T>(wd), dbr = db;
    M.add_column_sums(dy.data(), db.data(), n, wd);
    for (i64 i = 0; i < n; ++i)
      for (i64 j = 0; j < wd; ++j) dbr[j] += dy[i * wd + j];
    same("add_column_sums" + sh, db, dbr);
  }
  for (i64 n : {0, 1, 13, 1000}) {
    const auto sh = " n" + std::to_string(n);
    auto u = in.draw<T>(n, -30, 30), dy = in.draw<T>(n), y = in.draw<T>(n), yr = y;
    M.silu_forward(u.data(), y.data(), n);
    mllm::silu_forward<T>(cs(u), std::span<T>(yr));
    same("silu_forward" + sh, y, yr);
    auto du = in.draw<T>(n), dur = du;
    M.silu_backward(u.data(), dy.data(), du.data(), n);
    mllm::silu_backward<T>(cs(u), cs(dy), std::span<T>(dur));
    same("silu_backward" + sh, du, dur);
    auto f = in.draw<T>(n);
    M.fill(f.data(), T(3.5), n);
    same("fill" + sh, f, std::vector<T>(static_cast<std::size_t>(n), T(3.5)));
    auto s = in.draw<T>(n), sr = s;
    M.add(s.data(), u.data(), n);
    for (i64 i = 0; i < n; ++i) sr[i] += u[i];
    same("add" + sh, s, sr);
    auto c = in.draw<T>(n);
    M.copy(c.data(), u.data(), n);
    same("copy" + sh, c, u);
  }
  for (auto [n, h, hd] : std::vector<std::array<i64, 3>>{{5, 3, 8}, {0, 2, 4}, {7, 4, 16}, {2, 1, 6}}) {
    std::vector<std::int64_t> pos(static_cast<std::size_t>(n));
    for (auto& p : pos) p = static_cast<std::int64_t>(in.rng() % 5000);
    for (int sign : {1, -1}) {
      auto x = in.draw<T>(n * h * hd), xr = x;
      M.rope(x.data(), pos.data(), n, h, hd, 10000.0, sign);
      mllm::rope<T>(std::span<T>(xr), std::span<const std::int64_t>(pos), n, h, hd, 10000.0, sign);
      same("rope n" + std::to_string(n) + " sign " + std::to_string(sign), x, xr);
    }
  }
}

template <class T>
void embedding_rows_loss(const math<T>& M, inputs& in) {
  for (auto [n, d, V] : std::vector<std::array<i64, 3>>{{9, 5, 4}, {0, 3, 4}, {4, 0, 3}, {30, 7, 11}}) {
    const auto sh = " n" + std::to_string(n) + " d" + std::to_string(d) + " V" + std::to_string(V);
    std::vector<std::int64_t> tok(static_cast<std::size_t>(n));
    for (auto& t : tok) t = static_cast<std::int64_t>(in.rng() % static_cast<std::uint64_t>(V + 2)) - 2;
    auto emb = in.draw<T>(V * d), h = in.draw<T>(n * d), hr = h;
    M.embed(tok.data(), emb.data(), h.data(), n, d);
    for (i64 t = 0; t < n; ++t)
      if (tok[t] >= 0)
        for (i64 c = 0; c < d; ++c) hr[t * d + c] = emb[tok[t] * d + c];
    same("embed" + sh, h, hr);
    auto dh = in.draw<T>(n * d), ge = in.draw<T>(V * d), ger = ge;
    M.embed_grad(tok.data(), dh.data(), ge.data(), n, d, V);
    for (i64 t = 0; t < n; ++t)
      if (tok[t] >= 0)
        for (i64 c = 0; c < d; ++c) ger[tok[t] * d + c] += dh[t * d + c];
    same("embed_grad" + sh, ge, ger);
    const i64 big = n + 3;  // rows (7r + 1) mod (n + 3): distinct while gcd(7, n + 3) = 1
    std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
    for (i64 r = 0; r < n; ++r) idx[r] = (r * 7 + 1) % big;
    auto src = in.draw<T>(n * d), dst = in.draw<T>(big * d), dstr = dst;
    M.scatter_rows(src.data(), idx.data(), dst.data(), n, d);
    for (i64 r = 0; r < n; ++r)
      for (i64 c = 0; c < d; ++c) dstr[idx[r] * d + c] = src[r * d + c];
    same("scatter_rows" + sh, dst, dstr);
    auto g = in.draw<T>(n * d), gr = g;
    M.gather_rows(dst.data(), idx.data(), g.data(), n, d);
    for (i64 r = 0; r < n; ++r)
      for (i64 c = 0; c < d; ++c) gr[r * d + c] = dst[idx[r] * d + c];
    same("gather_rows" + sh, g, gr);
  }
  for (auto [n, V] : std::vector<std::array<i64, 2>>{{8, 5}, {0, 4}, {3, 1}, {20, 50}}) {
    const auto sh = " n" + std::to_string(n) + " V" + std::to_string(V);
    auto z = in.draw<T>(n * V, -20, 20);
    std::vector<std::int64_t> tg(static_cast<std::size_t>(n));
    std::vector<T> wt(static_cast<std::size_t>(n));
    for (i64 t = 0; t < n; ++t) {
      const bool counted = t % 3 != 1;
      wt[t] = counted ? static_cast<T>(0.25 + static_cast<double>(t % 4)) : T(0);
      tg[t] = counted ? static_cast<std::int64_t>(in.rng() % static_cast<std::uint64_t>(V)) : -12345678;
    }
    const T scale = T(1.0 / 7.0);
    auto loss = in.draw<T>(n), dl = in.draw<T>(n * V);
    M.cross_entropy(z.data(), tg.data(), wt.data(), scale, loss.data(), dl.data(), n, V);
    std::vector<T> lr(static_cast<std::size_t>(n), T(0)), dlr(static_cast<std::size_t>(n * V), T(0));
    for (i64 t = 0; t < n; ++t) {
      if (wt[t] == 0) continue;
      long double mx = z[t * V];
      for (i64 j = 0; j < V; ++j) mx = std::max<long double>(mx, z[t * V + j]);
      long double s = 0;
      for (i64 j = 0; j < V; ++j) s += std::exp(static_cast<long double>(z[t * V + j]) - mx);
      const long double lse = mx + std::log(s), c = static_cast<long double>(wt[t]) * scale;
      lr[t] = static_cast<T>(c * (lse - z[t * V + tg[t]]));
      for (i64 j = 0; j < V; ++j)
        dlr[t * V + j] = static_cast<T>(
            c * (std::exp(static_cast<long double>(z[t * V + j]) - mx) / s - (j == tg[t] ? 1 : 0)));
    }
    const double tol = sizeof(T) == 8 ? 1e-12 : 1e-5;
    same("cross_entropy loss" + sh, loss, lr, tol);
    same("cross_entropy dlogits" + sh, dl, dlr, tol);
  }
}

template <class T>
void adam_steps(const math<T>& M, inputs& in) {
  for (i64 n : {0, 1, 37})
    for (T wd : {T(0), T(0.01)}) {
      hetmesh::train::adam<T> ref{.lr = T(0.05), .weight_decay = wd};
      auto p = in.draw<T>(n), pr = p;
      std::vector<T> m(static_cast<std::size_t>(n), T(0)), v = m;
      for (std::int64_t step = 1; step <= 3; ++step) {
        auto g = in.draw<T>(n);
        M.adam(p.data(), g.data(), m.data(), v.data(), n, ref.lr, ref.beta1, ref.beta2, ref.eps,
               ref.weight_decay, step);
        std::vector<std::span<T>> ps{std::span<T>(pr)}, gs{std::span<T>(g)};
        ref(ps, gs);
        same("adam parameters n" + std::to_string(n) + " step " + std::to_string(step), p, pr);
        if (n > 0) {
          auto& st = ref.moments(std::span<const T>(pr));
          same("adam m", m, st.m);
          same("adam v", v, st.v);
        }
      }
    }
}

template <class T>
void every_kernel(double tol_dy_wt) {
  const math<T> M(backend::host);
  CHECK(M.where() == backend::host);
  M.synchronize();
  inputs in;
  linear_maps(M, in, tol_dy_wt);
  rows_and_norms(M, in);
  embedding_rows_loss(M, in);
  adam_steps(M, in);
}

}  // namespace

TEST_CASE(
    "mllm_gpu::math on the host: every kernel against the CPU example's layers, loops and train::adam") {
  every_kernel<double>(1e-12);
  every_kernel<float>(1e-5);
}

TEST_CASE(
    "mllm_gpu::math emulated: the host results through device views; a host pointer is refused by name") {
  namespace emu = hetmesh::emulated;
  const math<double> host(backend::host), dev(backend::emulated);
  CHECK(dev.where() == backend::emulated);
  inputs in;
  const i64 n = 6, k = 5, m = 4;
  auto x = in.draw<double>(n * k), w = in.draw<double>(k * m), y = in.draw<double>(n * m), yd = y;
  host.matmul(x.data(), w.data(), y.data(), n, k, m);
  dev.matmul(emu::to_device(x.data()), emu::to_device(w.data()), emu::to_device(yd.data()), n, k, m);
  same("emulated matmul", yd, y);
  std::vector<std::int64_t> pos{0, 3, 1, 7, 2, 9};
  auto q = in.draw<double>(n * 2 * 4), qd = q;
  host.rope(q.data(), pos.data(), n, 2, 4, 10000.0, 1);
  dev.rope(emu::to_device(qd.data()), emu::to_device(pos.data()), n, 2, 4, 10000.0, 1);
  same("emulated rope", qd, q);
  // The micro-batch's host positions where their device copy belongs: refused, naming the kernel.
  CHECK_THROWS_WITH_AS(dev.rope(emu::to_device(qd.data()), pos.data(), n, 2, 4, 10000.0, 1),
                       doctest::Contains("mllm_gpu::math::rope"), hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS(dev.fill(y.data(), 1.0, n * m), doctest::Contains("is a host pointer"),
                       hetmesh::invalid_argument);
}

TEST_CASE("mllm_gpu::math: moves keep the kernels; cuda without a GPU fails by name") {
  math<float> a(backend::host);
  math<float> b(std::move(a));
  math<float> c(backend::emulated);
  c = std::move(b);
  CHECK(c.where() == backend::host);
  std::vector<float> v(4);
  c.fill(v.data(), 2.0F, 4);
  same("moved fill", v, std::vector<float>(4, 2.0F));
  if (mllm_gpu::cuda_devices() == 0)
    CHECK_THROWS_WITH_AS(math<float>(backend::cuda), doctest::Contains("mllm_gpu::math"), std::runtime_error);
}
