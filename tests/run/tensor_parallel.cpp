// SPDX-License-Identifier: Apache-2.0
// The tensor-parallel helpers (run/tensor_parallel.hpp) on loopback ranks, tp in {1, 2, 4}, against the
// unsplit single-rank computation on seeded data (values are pure functions of (tag, rank, index)):
//  - every region, forward and backward, on small integers (exact in float and double), and each region's
//    two halves are adjoint: summed over the ranks, <f(x), y> == <x, f^T(y)> exactly;
//  - column- and row-parallel linear forward and backward (with and without sequence parallelism and
//    gather_output), float and double;
//  - a 2-layer MLP (column, tanh, row) with and without sequence parallelism: output and every gradient
//    equal the unsplit MLP's to 1e-12 (double), and the device path (comm::emulated_device with
//    model::emulated_device_memory and a device GEMM) gives the host run's numbers bit for bit;
//  - a vocabulary-parallel embedding, a column-parallel output layer and the vocabulary-parallel
//    cross-entropy: losses and gradients equal the unsplit model's, host and device;
//  - bad shapes and buffer sizes are refused with messages naming the mismatch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/run/tensor_parallel.hpp>

using namespace hetmesh;

// A named namespace: the test binary is a unity build, and other files have helpers of the same names.
namespace tp_test {

using i64 = std::int64_t;

namespace {

// Uniform in [-1, 1) from (tag, rank, index).
template <class T>
std::vector<T> real_data(std::uint64_t tag, std::uint64_t rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<T>(static_cast<double>(key_hash({tag, rank, i}) >> 11) * 0x1p-52 - 1.0);
  return v;
}

// Small integers in [-4, 4] (sums of a few products are exact in float and double).
template <class T>
std::vector<T> int_data(std::uint64_t tag, std::uint64_t rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<T>(static_cast<int>(key_hash({tag, rank, i}) % 9) - 4);
  return v;
}

// Columns [j cols/tp, (j+1) cols/tp) of full [rows][cols].
template <class T>
std::vector<T> cols_of(const std::vector<T>& full, i64 rows, i64 cols, int tp, int j) {
  const i64 w = cols / tp;
  std::vector<T> out;
  for (i64 r = 0; r < rows; ++r)
    for (i64 k = 0; k < w; ++k) out.push_back(full[static_cast<std::size_t>(r * cols + j * w + k)]);
  return out;
}

// Rows [j rows/tp, (j+1) rows/tp) of full [rows][cols].
template <class T>
std::vector<T> rows_of(const std::vector<T>& full, i64 rows, i64 cols, int tp, int j) {
  const auto n = static_cast<std::size_t>(rows / tp * cols);
  return std::vector<T>(full.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(j) * n),
                        full.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(j + 1) * n));
}

template <class T>
double dot(const std::vector<T>& a, const std::vector<T>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

template <class T>
std::vector<T> plus(std::vector<T> a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

// c = op(a, b) on the host (the reference GEMM).
template <class T>
std::vector<T> gemm(run::gemm_op op, i64 rows, i64 cols, i64 inner, const std::vector<T>& a,
                    const std::vector<T>& b) {
  std::vector<T> c(static_cast<std::size_t>(rows * cols));
  run::host_gemm{}(op, rows, cols, inner, std::span<const T>(a), std::span<const T>(b), std::span<T>(c),
                   false);
  return c;
}

// |a - b| <= tol * max(1, max |b|) element by element.
template <class T>
bool close(const std::vector<T>& a, const std::vector<T>& b, double tol) {
  if (a.size() != b.size()) return false;
  double scale = 1;
  for (T x : b) scale = std::max(scale, std::abs(static_cast<double>(x)));
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])) > tol * scale) return false;
  return true;
}

template <class T>
constexpr double tol_of = sizeof(T) == 4 ? 2e-5 : 1e-12;

// Moves host vectors into a policy's buffers and back.
template <class T, class M>
typename M::template buffer<T> up(const M& mem, const std::vector<T>& h) {
  typename M::template buffer<T> b;
  b.resize(h.size());
  mem.upload(b.span(), std::span<const T>(h));
  return b;
}
template <class M, class B>
auto down(const M& mem, B& b) {
  using T = typename decltype(b.span())::element_type;
  std::vector<T> h(b.size());
  mem.download(std::span<T>(h), std::span<const T>(b.span()));
  return h;
}

// The device GEMM and vocabulary kernel of the emulated device: the host ones behind device pointers.
struct emulated_gemm {
  template <class T>
  void operator()(run::gemm_op op, i64 rows, i64 cols, i64 inner, std::span<const T> a, std::span<const T> b,
                  std::span<T> c, bool accumulate) const {
    run::host_gemm{}(op, rows, cols, inner, emulated::to_host(a), emulated::to_host(b), emulated::to_host(c),
                     accumulate);
  }
};
struct emulated_vocab_kernel {
  run::host_vocab_kernel k;
  template <class T>
  void row_max(std::span<const T> l, i64 rows, i64 cols, std::span<T> max) const {
    k.row_max(emulated::to_host(l), rows, cols, emulated::to_host(max));
  }
  template <class T>
  void row_sum_exp(std::span<const T> l, i64 rows, i64 cols, std::span<const T> max, std::span<T> sum) const {
    k.row_sum_exp(emulated::to_host(l), rows, cols, emulated::to_host(max), emulated::to_host(sum));
  }
  template <class T>
  void pick(std::span<const T> l, i64 rows, i64 cols, std::span<const i64> target, std::span<T> out) const {
    k.pick(emulated::to_host(l), rows, cols, emulated::to_host(target), emulated::to_host(out));
  }
  template <class T>
  void softmax_grad(std::span<const T> l, i64 rows, i64 cols, std::span<const T> lse,
                    std::span<const i64> target, std::span<const T> scale, std::span<T> d) const {
    k.softmax_grad(emulated::to_host(l), rows, cols, emulated::to_host(lse), emulated::to_host(target),
                   emulated::to_host(scale), emulated::to_host(d));
  }
};
static_assert(run::tp_gemm<emulated_gemm, double> && run::tp_vocab_kernel<emulated_vocab_kernel, double>);

// ---- regions ------------------------------------------------------------------------------------------

constexpr int n_regions = 7;

template <class T>
void regions_case(int tp) {
  constexpr i64 R = 8, C = 12;
  const auto N = static_cast<std::size_t>(R * C), Np = N / static_cast<std::size_t>(tp);
  const auto X = int_data<T>(1, 0, N);
  auto sum_over = [&](std::uint64_t tag, std::size_t n) {
    std::vector<T> s(n, T(0));
    for (int r = 0; r < tp; ++r) s = plus(s, int_data<T>(tag, static_cast<std::uint64_t>(r), n));
    return s;
  };
  auto concat = [&](std::uint64_t tag, std::size_t n) {
    std::vector<T> s;
    for (int r = 0; r < tp; ++r) {
      const auto p = int_data<T>(tag, static_cast<std::uint64_t>(r), n);
      s.insert(s.end(), p.begin(), p.end());
    }
    return s;
  };
  auto assemble_cols = [&](std::uint64_t tag) {  // [R][C] from every rank's [R][C/tp] block of columns
    std::vector<T> s(N);
    const i64 w = C / tp;
    for (int r = 0; r < tp; ++r) {
      const auto p = int_data<T>(tag, static_cast<std::uint64_t>(r), Np);
      for (i64 i = 0; i < R; ++i)
        for (i64 k = 0; k < w; ++k)
          s[static_cast<std::size_t>(i * C + r * w + k)] = p[static_cast<std::size_t>(i * w + k)];
    }
    return s;
  };
  std::vector<double> lhs(static_cast<std::size_t>(tp * n_regions)), rhs(lhs.size());
  comm::loopback::run(tp, [&](comm::loopback::communicator& c) {
    const int j = c.rank();
    const auto uj = static_cast<std::uint64_t>(j);
    const bool first = j == 0;
    model::host_memory mem;
    double* l = &lhs[static_cast<std::size_t>(j * n_regions)];
    double* r = &rhs[static_cast<std::size_t>(j * n_regions)];
    {  // gather_from_tp: columns -> replicated full; backward splits.
      const auto part = cols_of(X, R, C, tp, j);
      std::vector<T> full(N), dpart(Np);
      run::gather_from_tp_forward(c, std::span<const T>(part), std::span<T>(full), R, C, mem);
      CHECK(full == X);
      const auto dy = int_data<T>(2, 0, N);
      run::gather_from_tp_backward(c, std::span<const T>(dy), std::span<T>(dpart), R, C, mem);
      CHECK(dpart == cols_of(dy, R, C, tp, j));
      l[0] = first ? dot(full, dy) : 0.0;
      r[0] = dot(part, dpart);
    }
    {  // scatter_to_tp: replicated full -> columns; backward all-gathers.
      std::vector<T> part(Np), dfull(N);
      run::scatter_to_tp_forward(c, std::span<const T>(X), std::span<T>(part), R, C, mem);
      CHECK(part == cols_of(X, R, C, tp, j));
      const auto dpart = int_data<T>(3, uj, Np);
      run::scatter_to_tp_backward(c, std::span<const T>(dpart), std::span<T>(dfull), R, C, mem);
      CHECK(dfull == assemble_cols(3));
      l[1] = dot(part, dpart);
      r[1] = first ? dot(X, dfull) : 0.0;
    }
    {  // copy_to_tp: identity forward, all-reduce backward.
      const auto y = int_data<T>(4, uj, N);
      auto g = y;
      run::copy_to_tp_backward(c, std::span<T>(g));
      CHECK(g == sum_over(4, N));
      l[2] = dot(X, y);
      r[2] = first ? dot(X, g) : 0.0;
    }
    {  // reduce_from_tp: all-reduce forward, identity backward.
      const auto x = int_data<T>(5, uj, N);
      auto y = x;
      run::reduce_from_tp_forward(c, std::span<T>(y));
      CHECK(y == sum_over(5, N));
      const auto dy = int_data<T>(6, 0, N);
      l[3] = first ? dot(y, dy) : 0.0;
      r[3] = dot(x, dy);
    }
    {  // gather_from_sp: rows -> every rank's own copy of the full; backward reduce-scatters.
      const auto part = rows_of(X, R, C, tp, j);
      std::vector<T> full(N), dpart(Np);
      run::gather_from_sp_forward(c, std::span<const T>(part), std::span<T>(full), R, C, mem);
      CHECK(full == X);
      const auto dfull = int_data<T>(7, uj, N);
      run::gather_from_sp_backward(c, std::span<const T>(dfull), std::span<T>(dpart), R, C, mem);
      CHECK(dpart == rows_of(sum_over(7, N), R, C, tp, j));
      l[4] = dot(full, dfull);
      r[4] = dot(part, dpart);
    }
    {  // reduce_scatter_to_sp: partial fulls -> summed rows; backward all-gathers the rows.
      const auto full = int_data<T>(8, uj, N);
      std::vector<T> part(Np), dfull(N);
      run::reduce_scatter_to_sp_forward(c, std::span<const T>(full), std::span<T>(part), R, C, mem);
      CHECK(part == rows_of(sum_over(8, N), R, C, tp, j));
      const auto dpart = int_data<T>(9, uj, Np);
      run::reduce_scatter_to_sp_backward(c, std::span<const T>(dpart), std::span<T>(dfull), R, C, mem);
      CHECK(dfull == concat(9, Np));
      l[5] = dot(part, dpart);
      r[5] = dot(full, dfull);
    }
    {  // scatter_to_sp: replicated full -> rows; backward all-gathers.
      std::vector<T> part(Np), dfull(N);
      run::scatter_to_sp_forward(c, std::span<const T>(X), std::span<T>(part), R, C, mem);
      CHECK(part == rows_of(X, R, C, tp, j));
      const auto dpart = int_data<T>(10, uj, Np);
      run::scatter_to_sp_backward(c, std::span<const T>(dpart), std::span<T>(dfull), R, C, mem);
      CHECK(dfull == concat(10, Np));
      l[6] = dot(part, dpart);
      r[6] = first ? dot(X, dfull) : 0.0;
    }
  });
  for (int k = 0; k < n_regions; ++k) {
    double a = 0, b = 0;
    for (int j = 0; j < tp; ++j) {
      a += lhs[static_cast<std::size_t>(j * n_regions + k)];
      b += rhs[static_cast<std::size_t>(j * n_regions + k)];
    }
    CHECK_MESSAGE(a == b, "region ", k, " is not adjoint at tp ", tp);
    CHECK(a != 0.0);
  }
}

}  // namespace

TEST_CASE(
    "tp regions on loopback: each equals the unsplit map, forward and backward, and the pairs are adjoint") {
  for (int tp : {1, 2, 4}) {
    CAPTURE(tp);
    regions_case<float>(tp);
    regions_case<double>(tp);
  }
}

// The regions that move columns (strided copies through the memory policy) and tokens, on the emulated
// device: the host run's buffers bit for bit.
TEST_CASE("tp regions on the emulated device give the host results") {
  constexpr i64 R = 8, C = 12;
  for (int tp : {1, 2, 4})
    comm::loopback::run(tp, [&](comm::loopback::communicator& c) {
      const auto uj = static_cast<std::uint64_t>(c.rank());
      const auto N = static_cast<std::size_t>(R * C), Np = N / static_cast<std::size_t>(tp);
      const auto part = real_data<double>(60, uj, Np), full = real_data<double>(61, 0, N);
      model::host_memory hm;
      model::emulated_device_memory dm;
      comm::emulated_device<comm::loopback::communicator> dev(c);
      std::vector<std::vector<double>> host(5), devr(5);
      auto run_all = [&](auto& comm_, const auto& mem, std::vector<std::vector<double>>& out) {
        auto p = up(mem, part), f = up(mem, full);
        typename std::remove_cvref_t<decltype(mem)>::template buffer<double> g, sp, st, ss, rs;
        g.resize(N), sp.resize(Np), st.resize(N), ss.resize(Np), rs.resize(Np);
        run::gather_from_tp_forward(comm_, std::span<const double>(p.span()), g.span(), R, C, mem);
        run::gather_from_tp_backward(comm_, std::span<const double>(f.span()), sp.span(), R, C, mem);
        run::scatter_to_tp_backward(comm_, std::span<const double>(p.span()), st.span(), R, C, mem);
        run::scatter_to_sp_forward(comm_, std::span<const double>(f.span()), ss.span(), R, C, mem);
        run::reduce_scatter_to_sp_forward(comm_, std::span<const double>(f.span()), rs.span(), R, C, mem);
        out = {down(mem, g), down(mem, sp), down(mem, st), down(mem, ss), down(mem, rs)};
      };
      run_all(c, hm, host);
      run_all(dev, dm, devr);
      CHECK(host == devr);
      CHECK(host[0] == host[2]);  // gather_from_tp forward == scatter_to_tp backward
      CHECK(host[1] == cols_of(full, R, C, tp, c.rank()));
      CHECK(host[3] == rows_of(full, R, C, tp, c.rank()));
    });
}

// ---- linear layers ------------------------------------------------------------------------------------

namespace {

template <class T>
void column_case(int tp, run::tp_linear_options o) {
  constexpr i64 N = 8, K = 6, M = 12;
  const auto X = real_data<T>(20, 0, N * K), W = real_data<T>(21, 0, K * M), dY = real_data<T>(22, 0, N * M);
  const auto Y = gemm(run::gemm_op::nn, N, M, K, X, W);
  const auto dX = gemm(run::gemm_op::nt, N, K, M, dY, W);
  const auto dW = gemm(run::gemm_op::tn, K, M, N, X, dY);
  comm::loopback::run(tp, [&](comm::loopback::communicator& c) {
    const int j = c.rank();
    model::host_memory mem;
    const run::tp_linear_shape s{N, K, M};
    const auto x = o.sequence_parallel ? rows_of(X, N, K, tp, j) : X;
    const auto w = cols_of(W, K, M, tp, j);
    std::vector<T> y(static_cast<std::size_t>(N * (o.gather_output ? M : M / tp)));
    run::column_parallel_forward(c, s, o, std::span<const T>(x), std::span<const T>(w), std::span<T>(y), mem);
    CHECK(close(y, o.gather_output ? Y : cols_of(Y, N, M, tp, j), tol_of<T>));
    const auto dy = o.gather_output ? dY : cols_of(dY, N, M, tp, j);
    std::vector<T> dx(x.size()), dw(w.size(), T(1));  // dw accumulates onto 1
    run::column_parallel_backward(c, s, o, std::span<const T>(x), std::span<const T>(w),
                                  std::span<const T>(dy), std::span<T>(dx), std::span<T>(dw), mem);
    CHECK(close(dx, o.sequence_parallel ? rows_of(dX, N, K, tp, j) : dX, tol_of<T>));
    CHECK(close(dw, plus(cols_of(dW, K, M, tp, j), std::vector<T>(w.size(), T(1))), tol_of<T>));
  });
}

template <class T>
void row_case(int tp, run::tp_linear_options o) {
  constexpr i64 N = 8, K = 12, M = 6;
  const auto X = real_data<T>(30, 0, N * K), W = real_data<T>(31, 0, K * M), dY = real_data<T>(32, 0, N * M);
  const auto Y = gemm(run::gemm_op::nn, N, M, K, X, W);
  const auto dX = gemm(run::gemm_op::nt, N, K, M, dY, W);
  const auto dW = gemm(run::gemm_op::tn, K, M, N, X, dY);
  comm::loopback::run(tp, [&](comm::loopback::communicator& c) {
    const int j = c.rank();
    model::host_memory mem;
    const run::tp_linear_shape s{N, K, M};
    const auto x = cols_of(X, N, K, tp, j);
    const auto w = rows_of(W, K, M, tp, j);
    std::vector<T> y(static_cast<std::size_t>((o.sequence_parallel ? N / tp : N) * M));
    run::row_parallel_forward(c, s, o, std::span<const T>(x), std::span<const T>(w), std::span<T>(y), mem);
    CHECK(close(y, o.sequence_parallel ? rows_of(Y, N, M, tp, j) : Y, tol_of<T>));
    const auto dy = o.sequence_parallel ? rows_of(dY, N, M, tp, j) : dY;
    std::vector<T> dx(x.size()), dw(w.size(), T(0));
    run::row_parallel_backward(c, s, o, std::span<const T>(x), std::span<const T>(w), std::span<const T>(dy),
                               std::span<T>(dx), std::span<T>(dw), mem);
    CHECK(close(dx, cols_of(dX, N, K, tp, j), tol_of<T>));
    CHECK(close(dw, rows_of(dW, K, M, tp, j), tol_of<T>));
  });
}

}  // namespace

TEST_CASE("column- and row-parallel linear on loopback equal the unsplit layer, forward and backward") {
  for (int tp : {1, 2, 4})
    for (bool sp : {false, true}) {
      CAPTURE(tp);
      CAPTURE(sp);
      for (bool gather : {false, true}) {
        CAPTURE(gather);
        column_case<float>(tp, {.sequence_parallel = sp, .gather_output = gather});
        column_case<double>(tp, {.sequence_parallel = sp, .gather_output = gather});
      }
      row_case<float>(tp, {.sequence_parallel = sp});
      row_case<double>(tp, {.sequence_parallel = sp});
    }
}

// ---- a 2-layer MLP ------------------------------------------------------------------------------------

namespace {

constexpr i64 mlp_n = 8, mlp_h = 8, mlp_f = 16;

// Output and gradients of y = tanh(x W1) W2 for the loss <y, dY>, per rank (split as the rank holds them).
struct mlp_out {
  std::vector<double> y, dx, dw1, dw2;
};

struct mlp_data {
  std::vector<double> x = real_data<double>(40, 0, mlp_n*mlp_h), w1 = real_data<double>(41, 0, mlp_h*mlp_f),
                      w2 = real_data<double>(42, 0, mlp_f*mlp_h), dy = real_data<double>(43, 0, mlp_n*mlp_h);
};

mlp_out mlp_unsplit(const mlp_data& d) {
  using run::gemm_op;
  auto z = gemm(gemm_op::nn, mlp_n, mlp_f, mlp_h, d.x, d.w1);
  for (auto& v : z) v = std::tanh(v);
  mlp_out o;
  o.y = gemm(gemm_op::nn, mlp_n, mlp_h, mlp_f, z, d.w2);
  o.dw2 = gemm(gemm_op::tn, mlp_f, mlp_h, mlp_n, z, d.dy);
  auto da = gemm(gemm_op::nt, mlp_n, mlp_f, mlp_h, d.dy, d.w2);
  for (std::size_t i = 0; i < da.size(); ++i) da[i] *= 1 - z[i] * z[i];
  o.dw1 = gemm(gemm_op::tn, mlp_h, mlp_f, mlp_n, d.x, da);
  o.dx = gemm(gemm_op::nt, mlp_n, mlp_h, mlp_f, da, d.w1);
  return o;
}

// One rank of the tensor-parallel MLP over communicator c, memory policy mem and GEMM g. The activation
// runs on the host between a download and an upload (a user's kernel on a device).
template <class C, class M, class G>
mlp_out mlp_rank(C& c, const M& mem, G g, const mlp_data& d, bool sp) {
  const int tp = c.size(), j = c.rank();
  const run::tp_linear_options o{.sequence_parallel = sp};
  const run::tp_linear_shape s1{mlp_n, mlp_h, mlp_f}, s2{mlp_n, mlp_f, mlp_h};
  const i64 rows = sp ? mlp_n / tp : mlp_n, fl = mlp_f / tp;
  auto x = up(mem, sp ? rows_of(d.x, mlp_n, mlp_h, tp, j) : d.x);
  auto w1 = up(mem, cols_of(d.w1, mlp_h, mlp_f, tp, j)), w2 = up(mem, rows_of(d.w2, mlp_f, mlp_h, tp, j));
  typename M::template buffer<double> a, y, dz, dx, dw1, dw2;
  a.resize(static_cast<std::size_t>(mlp_n * fl));
  y.resize(static_cast<std::size_t>(rows * mlp_h));
  run::column_parallel_forward(c, s1, o, std::span<const double>(x.span()),
                               std::span<const double>(w1.span()), a.span(), mem, g);
  auto zh = down(mem, a);
  for (auto& v : zh) v = std::tanh(v);
  auto z = up(mem, zh);
  run::row_parallel_forward(c, s2, o, std::span<const double>(z.span()), std::span<const double>(w2.span()),
                            y.span(), mem, g);
  auto dy = up(mem, sp ? rows_of(d.dy, mlp_n, mlp_h, tp, j) : d.dy);
  dz.resize(a.size());
  dx.resize(x.size());
  dw1.resize(w1.size());
  dw2.resize(w2.size());
  mem.fill(dw1.span(), 0.0);
  mem.fill(dw2.span(), 0.0);
  run::row_parallel_backward(c, s2, o, std::span<const double>(z.span()), std::span<const double>(w2.span()),
                             std::span<const double>(dy.span()), dz.span(), dw2.span(), mem, g);
  auto dah = down(mem, dz);
  for (std::size_t i = 0; i < dah.size(); ++i) dah[i] *= 1 - zh[i] * zh[i];
  auto da = up(mem, dah);
  run::column_parallel_backward(c, s1, o, std::span<const double>(x.span()),
                                std::span<const double>(w1.span()), std::span<const double>(da.span()),
                                dx.span(), dw1.span(), mem, g);
  return {down(mem, y), down(mem, dx), down(mem, dw1), down(mem, dw2)};
}

}  // namespace

TEST_CASE("a tensor-parallel MLP (column, tanh, row) equals the unsplit MLP to 1e-12, with and without SP") {
  const mlp_data d;
  const auto ref = mlp_unsplit(d);
  for (int tp : {1, 2, 4})
    for (bool sp : {false, true}) {
      CAPTURE(tp);
      CAPTURE(sp);
      comm::loopback::run(tp, [&](comm::loopback::communicator& c) {
        const int j = c.rank();
        const auto h = mlp_rank(c, model::host_memory{}, run::host_gemm{}, d, sp);
        CHECK(close(h.y, sp ? rows_of(ref.y, mlp_n, mlp_h, tp, j) : ref.y, 1e-12));
        CHECK(close(h.dx, sp ? rows_of(ref.dx, mlp_n, mlp_h, tp, j) : ref.dx, 1e-12));
        CHECK(close(h.dw1, cols_of(ref.dw1, mlp_h, mlp_f, tp, j), 1e-12));
        CHECK(close(h.dw2, rows_of(ref.dw2, mlp_f, mlp_h, tp, j), 1e-12));
        comm::emulated_device<comm::loopback::communicator> dev(c);
        const auto e = mlp_rank(dev, model::emulated_device_memory{}, emulated_gemm{}, d, sp);
        CHECK(e.y == h.y);
        CHECK(e.dx == h.dx);
        CHECK(e.dw1 == h.dw1);
        CHECK(e.dw2 == h.dw2);
      });
    }
}

// ---- vocabulary-parallel embedding and cross-entropy --------------------------------------------------

namespace {

constexpr i64 lm_n = 8, lm_v = 16, lm_h = 4, lm_step_targets = 10;

struct lm_data {
  std::vector<i64> tokens, targets;
  std::vector<double> weights;
  std::vector<double> table = real_data<double>(50, 0, lm_v*lm_h), wout = real_data<double>(51, 0, lm_h*lm_v);
  lm_data() {
    for (i64 t = 0; t < lm_n; ++t) {
      tokens.push_back(static_cast<i64>(key_hash({52, 0, static_cast<std::uint64_t>(t)}) % lm_v));
      const bool counts = t % 3 != 2;  // some tokens do not count: weight 0, target never read
      weights.push_back(counts ? 1.0 + 0.5 * static_cast<double>(t % 2) : 0.0);
      targets.push_back(counts ? static_cast<i64>(key_hash({53, 0, static_cast<std::uint64_t>(t)}) % lm_v)
                               : -7);
    }
  }
};

// Per-token losses and the gradients of their sum, unsplit.
struct lm_out {
  std::vector<double> loss, dtable, dwout;
};

lm_out lm_unsplit(const lm_data& d) {
  using run::gemm_op;
  std::vector<double> x;
  for (i64 t : d.tokens) x.insert(x.end(), d.table.begin() + t * lm_h, d.table.begin() + (t + 1) * lm_h);
  const auto logits = gemm(gemm_op::nn, lm_n, lm_v, lm_h, x, d.wout);
  lm_out o{std::vector<double>(lm_n, 0.0), std::vector<double>(d.table.size(), 0.0), {}};
  std::vector<double> dlogits(logits.size(), 0.0);
  for (std::size_t t = 0; t < static_cast<std::size_t>(lm_n); ++t) {
    if (d.weights[t] == 0.0) continue;
    const auto row = std::span<const double>(logits).subspan(t * lm_v, lm_v);
    const double m = *std::max_element(row.begin(), row.end());
    double s = 0;
    for (double v : row) s += std::exp(v - m);
    const double c = d.weights[t] / lm_step_targets;
    o.loss[t] = c * (m + std::log(s) - row[static_cast<std::size_t>(d.targets[t])]);
    for (std::size_t v = 0; v < static_cast<std::size_t>(lm_v); ++v)
      dlogits[t * lm_v + v] =
          c * (std::exp(row[v] - m) / s - (static_cast<i64>(v) == d.targets[t] ? 1.0 : 0.0));
  }
  o.dwout = gemm(gemm_op::tn, lm_h, lm_v, lm_n, x, dlogits);
  const auto dx = gemm(gemm_op::nt, lm_n, lm_h, lm_v, dlogits, d.wout);
  for (std::size_t t = 0; t < static_cast<std::size_t>(lm_n); ++t)
    for (std::size_t e = 0; e < static_cast<std::size_t>(lm_h); ++e)
      o.dtable[static_cast<std::size_t>(d.tokens[t]) * lm_h + e] += dx[t * lm_h + e];
  return o;
}

// One rank: embedding (reduce-scattered under SP), column-parallel output layer (gathering the tokens under
// SP), vocabulary-parallel cross-entropy; then the backward of the three.
template <class C, class M, class G, class K>
lm_out lm_rank(C& c, const M& mem, G g, K k, const lm_data& d, bool sp) {
  const int tp = c.size(), j = c.rank();
  const run::tp_linear_options o{.sequence_parallel = sp};
  const run::tp_linear_shape s{lm_n, lm_h, lm_v};
  const i64 rows = sp ? lm_n / tp : lm_n;
  const std::span<const i64> tokens(d.tokens);
  auto table = up(mem, rows_of(d.table, lm_v, lm_h, tp, j)),
       wout = up(mem, cols_of(d.wout, lm_h, lm_v, tp, j));
  typename M::template buffer<double> x, logits, dlogits, dx, dtable, dwout;
  x.resize(static_cast<std::size_t>(rows * lm_h));
  logits.resize(static_cast<std::size_t>(lm_n * lm_v / tp));
  run::vocab_parallel_embedding_forward(c, lm_v, lm_h, sp, tokens, std::span<const double>(table.span()),
                                        x.span(), mem);
  run::column_parallel_forward(c, s, o, std::span<const double>(x.span()),
                               std::span<const double>(wout.span()), logits.span(), mem, g);
  lm_out out{std::vector<double>(lm_n), {}, {}};
  run::vocab_cross_entropy_state<double, M> state;
  run::vocab_parallel_cross_entropy_forward(
      c, lm_v, std::span<const double>(logits.span()), std::span<const i64>(d.targets),
      std::span<const double>(d.weights), lm_step_targets, std::span<double>(out.loss), state, mem, k);
  dlogits.resize(logits.size());
  run::vocab_parallel_cross_entropy_backward(c, lm_v, std::span<const double>(logits.span()), state,
                                             dlogits.span(), k);
  dx.resize(x.size());
  dtable.resize(table.size());
  dwout.resize(wout.size());
  mem.fill(dtable.span(), 0.0);
  mem.fill(dwout.span(), 0.0);
  run::column_parallel_backward(c, s, o, std::span<const double>(x.span()),
                                std::span<const double>(wout.span()), std::span<const double>(dlogits.span()),
                                dx.span(), dwout.span(), mem, g);
  run::vocab_parallel_embedding_backward(c, lm_v, lm_h, sp, tokens, std::span<const double>(dx.span()),
                                         dtable.span(), mem);
  out.dtable = down(mem, dtable);
  out.dwout = down(mem, dwout);
  return out;
}

}  // namespace

TEST_CASE("vocabulary-parallel embedding and cross-entropy equal the unsplit loss and gradients") {
  const lm_data d;
  const auto ref = lm_unsplit(d);
  double total = 0;
  for (double l : ref.loss) total += l;
  CHECK(total > 0.0);
  for (int tp : {1, 2, 4})
    for (bool sp : {false, true}) {
      CAPTURE(tp);
      CAPTURE(sp);
      comm::loopback::run(tp, [&](comm::loopback::communicator& c) {
        const int j = c.rank();
        const auto h = lm_rank(c, model::host_memory{}, run::host_gemm{}, run::host_vocab_kernel{}, d, sp);
        CHECK(close(h.loss, ref.loss, 1e-12));
        CHECK(close(h.dtable, rows_of(ref.dtable, lm_v, lm_h, tp, j), 1e-12));
        CHECK(close(h.dwout, cols_of(ref.dwout, lm_h, lm_v, tp, j), 1e-12));
        comm::emulated_device<comm::loopback::communicator> dev(c);
        const auto e =
            lm_rank(dev, model::emulated_device_memory{}, emulated_gemm{}, emulated_vocab_kernel{}, d, sp);
        CHECK(e.loss == h.loss);
        CHECK(e.dtable == h.dtable);
        CHECK(e.dwout == h.dwout);
      });
    }
}

TEST_CASE("vocabulary-parallel cross-entropy in float equals the double computation") {
  const lm_data d;
  const auto ref = lm_unsplit(d);
  std::vector<double> x;
  for (i64 t : d.tokens) x.insert(x.end(), d.table.begin() + t * lm_h, d.table.begin() + (t + 1) * lm_h);
  const auto logits = gemm(run::gemm_op::nn, lm_n, lm_v, lm_h, x, d.wout);
  const std::vector<float> logits_f(logits.begin(), logits.end());
  for (int tp : {1, 2, 4})
    comm::loopback::run(tp, [&](comm::loopback::communicator& c) {
      model::host_memory mem;
      const auto mine = cols_of(logits_f, lm_n, lm_v, tp, c.rank());
      std::vector<float> loss(lm_n), dl(mine.size());
      run::vocab_cross_entropy_state<float, model::host_memory> st;
      run::vocab_parallel_cross_entropy_forward(
          c, lm_v, std::span<const float>(mine), std::span<const i64>(d.targets),
          std::span<const double>(d.weights), lm_step_targets, std::span<float>(loss), st, mem);
      run::vocab_parallel_cross_entropy_backward(c, lm_v, std::span<const float>(mine), st,
                                                 std::span<float>(dl));
      const std::vector<double> loss_d(loss.begin(), loss.end());
      CHECK(close(loss_d, ref.loss, 1e-5));
      // dlogits summed over the vocabulary is 0 for every token (softmax minus one-hot, scaled).
      for (i64 t = 0; t < lm_n; ++t) {
        double s = 0;
        for (i64 v = 0; v < lm_v / c.size(); ++v)
          s += dl[static_cast<std::size_t>(t * (lm_v / c.size()) + v)];
        double total = s;
        comm::all_reduce(c, std::span<double>(&total, 1), comm::reduce_op::sum);
        CHECK(std::abs(total) < 1e-6);
      }
    });
}

TEST_CASE("tensor-parallel values compare and print") {
  CHECK(run::vocab_shard_of(16, 4, 1) == run::vocab_shard{4, 8});
  CHECK(run::vocab_shard_of(16, 4, 3).holds(15));
  CHECK_FALSE(run::vocab_shard_of(16, 4, 3).holds(11));
  CHECK(hetmesh::format("{}", run::vocab_shard_of(16, 4, 1)) == "vocab_shard[4, 8)");
  CHECK(hetmesh::format("{}", run::tp_linear_shape{8, 6, 12}) == "tp_linear_shape(tokens=8, in=6, out=12)");
  CHECK(hetmesh::format("{}", run::tp_linear_options{.sequence_parallel = true}) ==
        "tp_linear_options(sequence_parallel=true, gather_output=false)");
}

// ---- bad input ----------------------------------------------------------------------------------------

TEST_CASE("tensor-parallel helpers refuse bad shapes and buffer sizes, naming the mismatch") {
  comm::loopback::run(4, [](comm::loopback::communicator& c) {
    model::host_memory mem;
    std::vector<double> a(30), b(120), w(6 * 3), y(8 * 3);
    const auto ca = std::span<const double>(a);
    CHECK_THROWS_WITH_AS(
        run::gather_from_tp_forward(c, ca, std::span<double>(b), 12, 10, mem),
        doctest::Contains("number of columns is 10, not divisible by the tensor-parallel size 4"),
        invalid_argument);
    CHECK_THROWS_WITH_AS(run::gather_from_sp_forward(c, ca, std::span<double>(b), 10, 12, mem),
                         doctest::Contains("number of tokens (rows) is 10, not divisible"), invalid_argument);
    CHECK_THROWS_WITH_AS(
        run::reduce_scatter_to_sp_forward(c, std::span<const double>(b), std::span<double>(b).first(31), 12,
                                          10, mem),
        doctest::Contains(
            "the local (sequence-split) buffer holds 31 elements; expected 30 (rows / tp x cols)"),
        invalid_argument);
    // A column layer of 6 -> 12 over 8 tokens: y must hold 8 x 3 on each of 4 ranks.
    const run::tp_linear_shape s{8, 6, 12};
    CHECK_THROWS_WITH_AS(
        run::column_parallel_forward(c, s, {}, std::span<const double>(b).first(48),
                                     std::span<const double>(w), std::span<double>(b).first(25), mem),
        doctest::Contains("y holds 25 elements; expected 24 (tokens x out / tp)"), invalid_argument);
    CHECK_THROWS_WITH_AS(
        run::column_parallel_forward(c, run::tp_linear_shape{8, 6, 10}, {},
                                     std::span<const double>(b).first(48), std::span<const double>(w),
                                     std::span<double>(y), mem),
        doctest::Contains("output width (out) is 10, not divisible by the tensor-parallel size 4"),
        invalid_argument);
    CHECK_THROWS_WITH_AS(
        run::row_parallel_forward(c, run::tp_linear_shape{6, 12, 3}, {.sequence_parallel = true},
                                  std::span<const double>(b).first(18), std::span<const double>(w),
                                  std::span<double>(y), mem),
        doctest::Contains("number of tokens is 6, not divisible by the tensor-parallel size 4"),
        invalid_argument);
    CHECK_THROWS_WITH_AS(run::row_parallel_forward(c, run::tp_linear_shape{8, 12, 3}, {.gather_output = true},
                                                   std::span<const double>(b).first(24),
                                                   std::span<const double>(w), std::span<double>(y), mem),
                         doctest::Contains("gather_output is an option of column-parallel layers only"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(
        (void)run::vocab_shard_of(30, 4, 0),
        doctest::Contains("vocabulary size is 30, not divisible by the tensor-parallel size 4"),
        invalid_argument);
    const std::vector<i64> tokens{1, 2, 99, 3};
    std::vector<double> table(4 * 2), emb(4 * 2);
    CHECK_THROWS_WITH_AS(
        run::vocab_parallel_embedding_forward(c, 16, 2, false, std::span<const i64>(tokens),
                                              std::span<const double>(table), std::span<double>(emb), mem),
        doctest::Contains("token 2 is 99, outside the vocabulary [0, 16)"), invalid_argument);
    const std::vector<i64> targets{1, 16};
    const std::vector<double> weights{1.0, 1.0};
    std::vector<double> logits(2 * 4), loss(2);
    run::vocab_cross_entropy_state<double, model::host_memory> st;
    CHECK_THROWS_WITH_AS(run::vocab_parallel_cross_entropy_forward(
                             c, 16, std::span<const double>(logits), std::span<const i64>(targets),
                             std::span<const double>(weights), 2, std::span<double>(loss), st, mem),
                         doctest::Contains("target 1 is 16, outside the vocabulary [0, 16)"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(run::vocab_parallel_cross_entropy_forward(
                             c, 16, std::span<const double>(logits).first(7), std::span<const i64>(targets),
                             std::span<const double>(weights), 2, std::span<double>(loss), st, mem),
                         doctest::Contains("logits holds 7 elements; expected 8 (tokens x vocab / tp)"),
                         invalid_argument);
  });
}

}  // namespace tp_test
