// SPDX-License-Identifier: Apache-2.0
// run::moe_* on loopback ranks, ep in {1, 2, 4}: an MoE layer whose experts are small per-expert linear maps
// (y = sum over kept choices of gate x W_e x), run as plan -> dispatch -> experts -> combine and back, equals
// a single-rank reference of the same layer over the group's tokens (rank order), forward and backward (the
// input, expert weight and gate gradients), in double to 1e-12, dropless and with capacity drops under both
// drop policies. Under "position" the drops also equal those of a one-rank plan over the concatenated batch.
// The auxiliary loss's shares over a group sum to the one-rank loss, with the same per-expert gradient. Over
// emulated device memory (a policy with scale_add and dot) the layer gives the host run bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/run/moe.hpp>

using namespace hetmesh;

namespace moe_layer_tests {  // named: the unity build joins this file with others

constexpr std::int64_t h = 3;
constexpr auto hw = static_cast<std::size_t>(h);  // row width, in and out of every expert

struct rank_data {
  std::vector<std::int64_t> experts;  // k per token
  std::vector<double> gates, x, dy;   // [T k], [T][h], [T][h]
};

struct layer_case {
  seq::moe_layout layout;
  seq::moe_capacity policy;
  std::vector<rank_data> ranks;
  std::vector<double> w;  // [experts][h][h], W_e x = sum_j w[e][i][j] x[j]
};

layer_case random_case(rng& r, int ep, const seq::moe_capacity& policy) {
  layer_case c;
  const std::int64_t experts = 4 * (ep == 4 ? 2 : 1);
  c.layout = {experts, ep, 2};
  c.policy = policy;
  for (std::int64_t i = 0; i < experts * h * h; ++i) c.w.push_back(r.unit() - 0.5);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(experts));
  for (int q = 0; q < ep; ++q) {
    rank_data d;
    const auto tokens = static_cast<std::int64_t>(r.below(14));
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::iota(ids.begin(), ids.end(), 0);
      for (std::size_t j = 0; j < 2; ++j) {
        const auto pick = r.below(2) == 0 ? 0 : r.below(ids.size() - j);  // expert 0 popular: drops
        std::swap(ids[j], ids[j + pick]);
        d.experts.push_back(ids[j]);
        d.gates.push_back(0.1 + r.unit());
      }
      for (std::int64_t i = 0; i < h; ++i) {
        d.x.push_back(r.unit() - 0.5);
        d.dy.push_back(r.unit() - 0.5);
      }
    }
    c.ranks.push_back(std::move(d));
  }
  return c;
}

// out [h] = W_e in (or W_e^T in).
void apply(const std::vector<double>& w, std::int64_t e, const double* in, double* out, bool transpose) {
  for (std::int64_t i = 0; i < h; ++i) {
    double s = 0.0;
    for (std::int64_t j = 0; j < h; ++j)
      s += (transpose ? w[static_cast<std::size_t>((e * h + j) * h + i)]
                      : w[static_cast<std::size_t>((e * h + i) * h + j)]) *
           in[j];
    out[i] = s;
  }
}

struct result {
  std::vector<std::vector<double>> y, dx, dgates;   // per rank
  std::vector<double> dw;                           // [experts][h][h]
  std::vector<std::vector<std::int64_t>> kept_row;  // per rank: row_of_choice
};

// The reference: every token of the group in rank order on one rank, `keep` saying which choices count.
result reference(const layer_case& c, const std::vector<std::vector<std::int64_t>>& keep) {
  result out;
  out.dw.assign(c.w.size(), 0.0);
  const int k = c.layout.top_k;
  for (std::size_t q = 0; q < c.ranks.size(); ++q) {
    const auto& d = c.ranks[q];
    const auto tokens = d.x.size() / h;
    std::vector<double> y(d.x.size(), 0.0), dx(d.x.size(), 0.0), dg(d.gates.size(), 0.0), o(h), back(h);
    for (std::size_t t = 0; t < tokens; ++t)
      for (int j = 0; j < k; ++j) {
        const auto ci = t * static_cast<std::size_t>(k) + static_cast<std::size_t>(j);
        if (keep[q][ci] < 0) continue;
        const auto e = d.experts[ci];
        apply(c.w, e, &d.x[t * h], o.data(), false);
        double dot = 0.0;
        for (std::int64_t i = 0; i < h; ++i) {
          y[t * h + static_cast<std::size_t>(i)] += d.gates[ci] * o[static_cast<std::size_t>(i)];
          dot += d.dy[t * h + static_cast<std::size_t>(i)] * o[static_cast<std::size_t>(i)];
        }
        dg[ci] = dot;
        std::vector<double> g(h);
        for (std::int64_t i = 0; i < h; ++i)
          g[static_cast<std::size_t>(i)] = d.gates[ci] * d.dy[t * h + static_cast<std::size_t>(i)];
        apply(c.w, e, g.data(), back.data(), true);
        for (std::int64_t i = 0; i < h; ++i)
          dx[t * h + static_cast<std::size_t>(i)] += back[static_cast<std::size_t>(i)];
        for (std::int64_t i = 0; i < h; ++i)
          for (std::int64_t jj = 0; jj < h; ++jj)
            out.dw[static_cast<std::size_t>((e * h + i) * h + jj)] +=
                g[static_cast<std::size_t>(i)] * d.x[t * h + static_cast<std::size_t>(jj)];
      }
    out.y.push_back(y);
    out.dx.push_back(dx);
    out.dgates.push_back(dg);
  }
  return out;
}

// Emulated device memory with the two optional members combine runs its gate arithmetic through.
struct gate_memory : model::emulated_device_memory {
  template <class T>
  void scale_add(std::span<T> dst, std::span<const T> alpha, std::span<const T> src) const {
    const auto d = emulated::to_host(dst), s = emulated::to_host(src);
    const T a = emulated::to_host(alpha)[0];
    for (std::size_t i = 0; i < d.size(); ++i) d[i] += a * s[i];
  }
  template <class T>
  void dot(std::span<T> out, std::span<const T> x, std::span<const T> y) const {
    const auto a = emulated::to_host(x), b = emulated::to_host(y);
    T s{};
    for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    emulated::to_host(out)[0] = s;
  }
};
static_assert(model::memory_policy<gate_memory>);

template <class M>
typename M::template buffer<double> put(const M& mem, const std::vector<double>& v) {
  typename M::template buffer<double> b;
  b.resize(v.size());
  mem.upload(b.span(), std::span<const double>(v));
  return b;
}
template <class M>
std::vector<double> get(const M& mem, const typename M::template buffer<double>& b) {
  std::vector<double> v(b.size());
  mem.download(std::span<double>(v), b.span());
  return v;
}
template <class B>
std::span<const double> in(const B& b) {
  return b.span();
}

// One rank of the layer through run::moe_*: buffers in M's memory, the experts on the host (downloaded and
// uploaded around them).
template <class G, class M>
void layer_on_rank(G& g, const M& mem, const layer_case& c, result& out) {
  const auto me = static_cast<std::size_t>(g.rank());
  const auto& d = c.ranks[me];
  const auto plan = run::moe_plan(g, c.layout, c.policy, std::span<const std::int64_t>(d.experts),
                                  std::span<const double>(d.gates), mem);
  const auto rows = static_cast<std::size_t>(plan.expert_rows());
  const auto x = put(mem, d.x), gates = put(mem, d.gates), dy = put(mem, d.dy);
  auto expert_in = put(mem, std::vector<double>(rows * hw)),
       routed = put(mem, std::vector<double>(d.gates.size() * hw));
  auto y = put(mem, std::vector<double>(d.x.size()));
  run::moe_dispatch_forward(g, plan, h, in(x), expert_in.span(), mem);
  // The experts: local expert j on its plan.expert_counts[j] rows.
  const auto first = c.layout.first_expert(g.rank());
  std::vector<std::int64_t> expert_of_row;
  for (std::size_t j = 0; j < plan.expert_counts.size(); ++j)
    expert_of_row.insert(expert_of_row.end(), static_cast<std::size_t>(plan.expert_counts[j]),
                         first + static_cast<std::int64_t>(j));
  const auto xin = get(mem, expert_in);
  std::vector<double> eo(rows * hw);
  for (std::size_t i = 0; i < rows; ++i) apply(c.w, expert_of_row[i], &xin[i * hw], &eo[i * hw], false);
  const auto expert_out = put(mem, eo);
  run::moe_combine_forward(g, plan, h, in(expert_out), in(gates), routed.span(), y.span(), mem);
  auto d_out = put(mem, std::vector<double>(rows * hw)),
       d_gates = put(mem, std::vector<double>(d.gates.size()));
  run::moe_combine_backward(g, plan, h, in(dy), in(gates), in(routed), d_out.span(), d_gates.span(), mem);
  const auto deo = get(mem, d_out);
  std::vector<double> din(rows * hw), dw(c.w.size(), 0.0);
  for (std::size_t i = 0; i < rows; ++i) {
    const auto e = expert_of_row[i];
    apply(c.w, e, &deo[i * hw], &din[i * hw], true);
    for (std::size_t a = 0; a < hw; ++a)
      for (std::size_t b = 0; b < hw; ++b)
        dw[static_cast<std::size_t>(e) * hw * hw + a * hw + b] += deo[i * hw + a] * xin[i * hw + b];
  }
  const auto d_in = put(mem, din);
  auto dx = put(mem, std::vector<double>(d.x.size()));
  run::moe_dispatch_backward(g, plan, h, in(d_in), dx.span(), mem);
  out.y[me] = get(mem, y);
  out.dx[me] = get(mem, dx);
  out.dgates[me] = get(mem, d_gates);
  out.kept_row[me] = plan.row_of_choice;
  // Each rank owns its experts' slices of dw: no two ranks write the same element.
  const auto slice = static_cast<std::size_t>(first) * hw * hw;
  const auto n = static_cast<std::size_t>(c.layout.local_experts()) * hw * hw;
  std::copy_n(dw.begin() + static_cast<std::ptrdiff_t>(slice), n,
              out.dw.begin() + static_cast<std::ptrdiff_t>(slice));
}

// The layer on ep loopback ranks, over host memory or over emulated device memory.
result distributed(const layer_case& c, bool device = false) {
  const int ep = c.layout.ep;
  result out;
  out.y.resize(static_cast<std::size_t>(ep));
  out.dx = out.dgates = out.y;
  out.kept_row.resize(static_cast<std::size_t>(ep));
  out.dw.assign(c.w.size(), 0.0);
  comm::loopback::run(ep, [&](comm::loopback::communicator& g) {
    if (device) {
      comm::emulated_device<comm::loopback::communicator> dev(g);
      layer_on_rank(dev, gate_memory{}, c, out);
    } else {
      layer_on_rank(g, model::host_memory{}, c, out);
    }
  });
  return out;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST_CASE("moe layer on loopback ranks equals the one-rank reference, forward and backward") {
  rng r(333);
  const std::vector<seq::moe_capacity> policies{
      {}, {.factor = 0.75}, {.factor = 0.6, .drop = seq::moe_drop::probs}};
  int with_drops = 0;
  for (int trial = 0; trial < 12; ++trial)
    for (int ep : {1, 2, 4})
      for (const auto& policy : policies) {
        CAPTURE(trial);
        CAPTURE(ep);
        const auto c = random_case(r, ep, policy);
        const auto got = distributed(c);
        const auto want = reference(c, got.kept_row);
        for (std::size_t q = 0; q < c.ranks.size(); ++q) {
          CHECK(max_diff(got.y[q], want.y[q]) < 1e-12);
          CHECK(max_diff(got.dx[q], want.dx[q]) < 1e-12);
          CHECK(max_diff(got.dgates[q], want.dgates[q]) < 1e-12);
          for (auto v : got.kept_row[q]) with_drops += v < 0 ? 1 : 0;
        }
        CHECK(max_diff(got.dw, want.dw) < 1e-12);
        if (policy.dropless()) {
          for (const auto& rows : got.kept_row)
            CHECK(std::none_of(rows.begin(), rows.end(), [](std::int64_t v) { return v < 0; }));
        } else if (policy.drop == seq::moe_drop::position) {
          // The drops of a one-rank plan over the concatenated batch.
          std::vector<std::int64_t> all;
          for (const auto& d : c.ranks) all.insert(all.end(), d.experts.begin(), d.experts.end());
          const seq::moe_layout one{c.layout.experts, 1, c.layout.top_k};
          const auto p =
              seq::make_moe_dispatch_plan(one, policy, 0, all, {}, seq::moe_expert_counts(one, all));
          std::size_t i = 0;
          for (const auto& rows : got.kept_row)
            for (auto v : rows) CHECK((v < 0) == (p.row_of_choice[i++] < 0));
        }
      }
  CHECK(with_drops > 20);
}

TEST_CASE("moe layer over emulated device memory equals the host run bit for bit") {
  rng r(335);
  for (int ep : {2, 4})
    for (const seq::moe_capacity& policy : {seq::moe_capacity{}, seq::moe_capacity{.factor = 0.75}}) {
      CAPTURE(ep);
      const auto c = random_case(r, ep, policy);
      const auto host = distributed(c), dev = distributed(c, true);
      CHECK(host.kept_row == dev.kept_row);
      CHECK(host.y == dev.y);
      CHECK(host.dx == dev.dx);
      CHECK(host.dgates == dev.dgates);
      CHECK(host.dw == dev.dw);
    }
}

TEST_CASE("moe aux loss over a group: shares sum to the one-rank loss; bad calls refused") {
  rng r(334);
  const seq::moe_layout l{4, 2, 2};
  for (int group : {1, 2, 4}) {
    std::vector<std::vector<std::int64_t>> experts(static_cast<std::size_t>(group));
    std::vector<std::vector<double>> probs(static_cast<std::size_t>(group));
    std::vector<std::int64_t> all_experts;
    std::vector<double> all_probs;
    for (int q = 0; q < group; ++q) {
      const auto tokens = 1 + static_cast<std::int64_t>(r.below(6));
      for (std::int64_t t = 0; t < tokens; ++t) {
        const auto a = static_cast<std::int64_t>(r.below(4));
        experts[static_cast<std::size_t>(q)].insert(experts[static_cast<std::size_t>(q)].end(),
                                                    {a, (a + 1) % 4});
        for (int e = 0; e < 4; ++e) probs[static_cast<std::size_t>(q)].push_back(r.unit());
      }
      all_experts.insert(all_experts.end(), experts[static_cast<std::size_t>(q)].begin(),
                         experts[static_cast<std::size_t>(q)].end());
      all_probs.insert(all_probs.end(), probs[static_cast<std::size_t>(q)].begin(),
                       probs[static_cast<std::size_t>(q)].end());
    }
    std::vector<seq::moe_aux_loss_value> shares(static_cast<std::size_t>(group));
    comm::loopback::run(group, [&](comm::loopback::communicator& g) {
      const auto me = static_cast<std::size_t>(g.rank());
      shares[me] = run::moe_aux_loss(g, l, std::span<const std::int64_t>(experts[me]),
                                     std::span<const double>(probs[me]), 0.01, model::host_memory{});
    });
    const auto one =
        seq::moe_aux_loss(std::span<const double>(all_probs), seq::moe_expert_counts(l, all_experts),
                          static_cast<std::int64_t>(all_experts.size() / 2), 2, 0.01);
    double sum = 0.0;
    for (const auto& s : shares) {
      sum += s.loss;
      CHECK(max_diff(s.grad, one.grad) < 1e-15);
    }
    CHECK(std::abs(sum - one.loss) < 1e-14);
  }
  // Sizes that do not fit the plan, and a group that is not the layout's, are refused by name.
  comm::loopback::run(2, [&](comm::loopback::communicator& g) {
    const model::host_memory mem;
    const std::vector<std::int64_t> ex{0, 1};
    const std::vector<double> gates{0.5, 0.5}, x(3);
    CHECK_THROWS_AS((void)run::moe_plan(g, seq::moe_layout{4, 4, 2}, {}, std::span<const std::int64_t>(ex),
                                        std::span<const double>(gates), mem),
                    invalid_argument);
    const auto plan =
        run::moe_plan(g, l, {}, std::span<const std::int64_t>(ex), std::span<const double>(gates), mem);
    std::vector<double> in(static_cast<std::size_t>(plan.expert_rows() * h) + 1);
    CHECK_THROWS_AS(
        run::moe_dispatch_forward(g, plan, h, std::span<const double>(x), std::span<double>(in), mem),
        invalid_argument);
    CHECK_THROWS_AS((void)run::moe_aux_loss(g, l, std::span<const std::int64_t>(ex),
                                            std::span<const double>(x), 1.0, mem),
                    invalid_argument);
  });
}

}  // namespace moe_layer_tests
