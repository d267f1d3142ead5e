// SPDX-License-Identifier: Apache-2.0
// run::halo_forward / halo_backward on loopback ranks over random group layouts (seeded): every halo row
// holds the value of the token it names (values are functions of document, position and column), rows
// read locally and zeros are the plan's, and backward is forward's adjoint: summed over the ranks,
// <halo, dhalo> equals <x, dx> exactly (small integers in doubles). Members run on a subset of a larger
// communicator in a shuffled rank order, as HDP rings do.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/run/halo.hpp>

using namespace hetmesh;

namespace {

double value(std::int64_t doc, std::int64_t pos, std::int64_t col) {
  return static_cast<double>(doc * 1000 + pos * 10 + col);
}

std::vector<std::vector<seq::position_run>> random_layout(rng& r, int n) {
  std::vector<std::vector<seq::position_run>> members(static_cast<std::size_t>(n));
  const int docs = 1 + static_cast<int>(r.below(4));
  for (int d = 0; d < docs; ++d) {
    const std::int64_t len = 1 + static_cast<std::int64_t>(r.below(30));
    for (std::int64_t p = 0; p < len;) {
      const std::int64_t piece = std::min<std::int64_t>(len - p, 1 + static_cast<std::int64_t>(r.below(7)));
      members[r.below(static_cast<std::uint64_t>(n))].push_back({d, {p, p + piece}});
      p += piece;
    }
  }
  for (auto& m : members)
    for (std::size_t i = m.size(); i > 1; --i) std::swap(m[i - 1], m[r.below(i)]);
  return members;
}

}  // namespace

TEST_CASE("halo exchange on loopback: forward fills every halo row, backward is its adjoint") {
  constexpr int world = 6;
  rng r(31);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + static_cast<int>(r.below(world));
    const int k = 1 + static_cast<int>(r.below(5));
    const std::int64_t width = 1 + static_cast<std::int64_t>(r.below(3));
    const auto layout = random_layout(r, n);
    std::vector<int> ranks(world);
    std::iota(ranks.begin(), ranks.end(), 0);
    for (std::size_t i = ranks.size(); i > 1; --i) std::swap(ranks[i - 1], ranks[r.below(i)]);
    ranks.resize(static_cast<std::size_t>(n));  // member m is world rank ranks[m]
    std::vector<double> dots(world * 2, 0.0);
    CAPTURE(trial);
    comm::loopback::run(world, [&](comm::loopback::communicator& c) {
      const auto it = std::find(ranks.begin(), ranks.end(), c.rank());
      if (it == ranks.end()) return;  // not a member: takes no part
      const int me = static_cast<int>(it - ranks.begin());
      const auto plan = seq::make_halo_plan(layout, me, k);
      std::vector<std::pair<std::int64_t, std::int64_t>> rows;
      for (const auto& run : layout[static_cast<std::size_t>(me)])
        for (auto p = run.positions.begin; p < run.positions.end; ++p) rows.emplace_back(run.doc, p);
      std::vector<double> x(rows.size() * static_cast<std::size_t>(width));
      for (std::size_t t = 0; t < rows.size(); ++t)
        for (std::int64_t j = 0; j < width; ++j)
          x[t * static_cast<std::size_t>(width) + static_cast<std::size_t>(j)] =
              value(rows[t].first, rows[t].second, j);
      std::vector<double> halo(static_cast<std::size_t>(plan.halo_rows * width), -1.0);
      model::host_memory mem;
      run::halo_forward(c, std::span<const int>(ranks), plan, width, std::span<const double>(x),
                        std::span<double>(halo), mem);
      for (std::size_t t = 0; t < rows.size(); ++t)
        for (int lag = 1; lag <= k; ++lag) {
          const auto s = plan.source(static_cast<std::int64_t>(t), lag);
          const auto [doc, pos] = rows[t];
          for (std::int64_t j = 0; j < width; ++j) {
            double got = 0.0;
            if (s.where == seq::halo_source::kind::local)
              got = x[static_cast<std::size_t>(s.index * width + j)];
            else if (s.where == seq::halo_source::kind::halo)
              got = halo[static_cast<std::size_t>(s.index * width + j)];
            CHECK(got == (pos - lag < 0 ? 0.0 : value(doc, pos - lag, j)));
          }
        }
      // Adjoint: dhalo of small integers, dx from zero; <halo, dhalo> summed equals <x, dx> summed.
      std::vector<double> dhalo(halo.size()), dx(x.size(), 0.0);
      for (std::size_t i = 0; i < dhalo.size(); ++i) dhalo[i] = static_cast<double>((i * 7 + me) % 11) - 5.0;
      run::halo_backward(c, std::span<const int>(ranks), plan, width, std::span<const double>(dhalo),
                         std::span<double>(dx), mem);
      double a = 0, b = 0;
      for (std::size_t i = 0; i < halo.size(); ++i) a += halo[i] * dhalo[i];
      for (std::size_t i = 0; i < x.size(); ++i) b += x[i] * dx[i];
      dots[static_cast<std::size_t>(2 * c.rank())] = a;
      dots[static_cast<std::size_t>(2 * c.rank() + 1)] = b;
    });
    double a = 0, b = 0;
    for (int i = 0; i < world; ++i) {
      a += dots[static_cast<std::size_t>(2 * i)];
      b += dots[static_cast<std::size_t>(2 * i + 1)];
    }
    CHECK(a == b);
  }
}

TEST_CASE("halo exchange: buffers that do not match the plan are refused before any message") {
  const std::vector<std::vector<seq::position_run>> layout{{{0, {0, 4}}}, {{0, {4, 8}}}};
  comm::loopback::run(2, [&](comm::loopback::communicator& c) {
    const auto plan = seq::make_halo_plan(layout, c.rank(), 2);
    std::vector<double> x(4 * 3), halo(static_cast<std::size_t>(plan.halo_rows) * 3 + 1);
    const std::vector<int> ranks{0, 1};
    model::host_memory mem;
    CHECK_THROWS_WITH_AS(run::halo_forward(c, std::span<const int>(ranks), plan, 3,
                                           std::span<const double>(x), std::span<double>(halo), mem),
                         doctest::Contains("halo elements; expected 2 ranks"), invalid_argument);
  });
}
