// SPDX-License-Identifier: Apache-2.0
// seq::make_halo_plan over random group layouts (seeded): every (token, lag) source names the token `lag`
// positions earlier in the same document (a local row, a halo row that the owning member's send list fills
// row for row, or zero before the document's start); each halo row is filled exactly once; relabelling the
// members permutes the transfer lists and changes nothing else; bad layouts are refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <hetmesh/core/random.hpp>
#include <hetmesh/seq/halo.hpp>

using namespace hetmesh;

namespace {

struct layout {
  std::vector<std::vector<seq::position_run>> members;  // per member: runs in local order
};

// Documents of random lengths cut into random pieces, dealt to random members, each member's pieces in a
// random local order (adjacent pieces of one document on one member stay possible: they merge).
layout random_layout(rng& r, int n) {
  layout l;
  l.members.resize(static_cast<std::size_t>(n));
  const int docs = 1 + static_cast<int>(r.below(5));
  for (int d = 0; d < docs; ++d) {
    const std::int64_t len = 1 + static_cast<std::int64_t>(r.below(40));
    std::int64_t p = 0;
    while (p < len) {
      const std::int64_t piece = std::min<std::int64_t>(len - p, 1 + static_cast<std::int64_t>(r.below(9)));
      l.members[r.below(static_cast<std::uint64_t>(n))].push_back({100 + d, {p, p + piece}});
      p += piece;
    }
  }
  for (auto& m : l.members)
    for (std::size_t i = m.size(); i > 1; --i) std::swap(m[i - 1], m[r.below(i)]);
  return l;
}

// (doc, position) of every local row of a member.
std::vector<std::pair<std::int64_t, std::int64_t>> rows_of(const std::vector<seq::position_run>& runs) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const auto& r : runs)
    for (auto p = r.positions.begin; p < r.positions.end; ++p) out.emplace_back(r.doc, p);
  return out;
}

}  // namespace

TEST_CASE("halo plan: every source is the same document's earlier token, and transfer lists match") {
  rng r(2026);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(r.below(5));
    const int k = 1 + static_cast<int>(r.below(6));
    const auto l = random_layout(r, n);
    std::vector<seq::halo_plan> plans;
    for (int m = 0; m < n; ++m) plans.push_back(seq::make_halo_plan(l.members, m, k));
    CAPTURE(trial);
    for (int me = 0; me < n; ++me) {
      const auto& p = plans[static_cast<std::size_t>(me)];
      const auto mine = rows_of(l.members[static_cast<std::size_t>(me)]);
      REQUIRE(p.tokens == static_cast<std::int64_t>(mine.size()));
      // Each halo row is filled by exactly one receive entry, and by the owner's matching send entry.
      std::vector<int> filled(static_cast<std::size_t>(p.halo_rows), 0);
      std::vector<std::pair<int, std::size_t>> from(static_cast<std::size_t>(p.halo_rows));
      for (int o = 0; o < n; ++o) {
        const auto& rv = p.recv[static_cast<std::size_t>(o)];
        REQUIRE(rv.size() == plans[static_cast<std::size_t>(o)].send[static_cast<std::size_t>(me)].size());
        CHECK((o != me || rv.empty()));
        for (std::size_t i = 0; i < rv.size(); ++i) {
          ++filled[static_cast<std::size_t>(rv[i])];
          from[static_cast<std::size_t>(rv[i])] = {o, i};
        }
      }
      CHECK(std::all_of(filled.begin(), filled.end(), [](int f) { return f == 1; }));
      for (std::int64_t t = 0; t < p.tokens; ++t)
        for (int lag = 1; lag <= k; ++lag) {
          const auto [doc, pos] = mine[static_cast<std::size_t>(t)];
          const auto s = p.source(t, lag);
          if (pos - lag < 0) {
            CHECK(s.where == seq::halo_source::kind::zero);
            continue;
          }
          REQUIRE(s.where != seq::halo_source::kind::zero);
          std::pair<std::int64_t, std::int64_t> got;
          if (s.where == seq::halo_source::kind::local) {
            got = mine[static_cast<std::size_t>(s.index)];
          } else {
            const auto [o, i] = from[static_cast<std::size_t>(s.index)];
            const auto row = plans[static_cast<std::size_t>(o)].send[static_cast<std::size_t>(me)][i];
            got = rows_of(l.members[static_cast<std::size_t>(o)])[static_cast<std::size_t>(row)];
            CHECK(o != me);
          }
          CHECK(got == std::pair{doc, pos - lag});
        }
    }
  }
}

TEST_CASE("halo plan: relabelling the members permutes the transfer lists; a lone member is local") {
  rng r(7);
  for (int trial = 0; trial < 100; ++trial) {
    const int n = 2 + static_cast<int>(r.below(4));
    const int k = 1 + static_cast<int>(r.below(4));
    const auto l = random_layout(r, n);
    std::vector<int> perm(static_cast<std::size_t>(n));
    std::iota(perm.begin(), perm.end(), 0);
    for (std::size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[r.below(i)]);
    layout moved;
    moved.members.resize(static_cast<std::size_t>(n));
    for (int m = 0; m < n; ++m)
      moved.members[static_cast<std::size_t>(perm[static_cast<std::size_t>(m)])] =
          l.members[static_cast<std::size_t>(m)];
    for (int m = 0; m < n; ++m) {
      auto a = seq::make_halo_plan(l.members, m, k);
      const auto b = seq::make_halo_plan(moved.members, perm[static_cast<std::size_t>(m)], k);
      CHECK(a == seq::make_halo_plan(l.members, m, k));  // deterministic
      CHECK(a.run_source == b.run_source);
      CHECK(a.halo_rows == b.halo_rows);
      for (int o = 0; o < n; ++o) {
        const auto po = static_cast<std::size_t>(perm[static_cast<std::size_t>(o)]);
        CHECK(a.send[static_cast<std::size_t>(o)] == b.send[po]);
        CHECK(a.recv[static_cast<std::size_t>(o)] == b.recv[po]);
      }
    }
  }
  // One member holding everything, in any order: no exchange at all.
  const std::vector<std::vector<seq::position_run>> one{{{1, {5, 9}}, {2, {0, 3}}, {1, {0, 5}}}};
  const auto p = seq::make_halo_plan(one, 0, 3);
  CHECK(p.local_only());
  using kind = seq::halo_source::kind;
  CHECK(p.source(0, 1) == seq::halo_source{kind::local, 11});  // doc 1 position 5 reads position 4
  CHECK(p.source(0, 3) == seq::halo_source{kind::local, 9});   // ... and position 2
  CHECK(p.source(3, 2) == seq::halo_source{kind::local, 1});   // doc 1 position 8 reads position 6
  CHECK(p.source(4, 1) == seq::halo_source{});                 // doc 2 position 0: before its start
  CHECK(p.source(5, 1) == seq::halo_source{kind::local, 4});   // doc 2 position 1 reads position 0
  // runs_of joins consecutive positions of one document.
  const std::vector<std::int64_t> doc{4, 4, 4, 5, 4}, pos{0, 1, 2, 0, 3};
  const auto runs = seq::runs_of(doc, pos);
  REQUIRE(runs.size() == 3);
  CHECK(runs[0] == seq::position_run{4, {0, 3}});
  CHECK(runs[2] == seq::position_run{4, {3, 4}});
}

TEST_CASE("halo plan: bad layouts are refused naming the member, document and position") {
  using runs = std::vector<std::vector<seq::position_run>>;
  auto message = [](const runs& l, int me, int k) {
    try {
      (void)seq::make_halo_plan(l, me, k);
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(
      message(runs{{{1, {0, 4}}}, {{1, {3, 6}}}}, 0, 2).find("position 3 of document 1 is held by members") !=
      std::string::npos);
  CHECK(message(runs{{{1, {0, 2}}}, {{1, {4, 6}}}}, 0, 2).find("member 1 needs position 2 of document 1") !=
        std::string::npos);
  CHECK(message(runs{{{1, {0, 2}}}}, 0, -1).find("expected k >= 0") != std::string::npos);
  CHECK(message(runs{{{1, {0, 2}}}}, 1, 1).find("member 1 of a group of 1") != std::string::npos);
  CHECK(message(runs{{{1, {2, 2}}}}, 0, 1).find("expected a non-empty run") != std::string::npos);
  CHECK_THROWS_AS((void)seq::runs_of(std::vector<std::int64_t>{1, 2}, std::vector<std::int64_t>{0}),
                  invalid_argument);
}
