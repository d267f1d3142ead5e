// SPDX-License-Identifier: Apache-2.0
// Layouts and views: bijection and group partition as properties over random shapes (static and
// dynamic), agreement with an independent re-implementation of Megatron-LM's group construction,
// flatten, submesh, printing, and every error case.
#include <doctest/doctest.h>

#include <hetmesh/core/random.hpp>
#include <hetmesh/mesh/layout.hpp>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace hetmesh::literals;
namespace hm = hetmesh::mesh;

namespace {

// Megatron-LM's generate_masked_orthogonal_rank_groups, written from its documented equation:
// sizes in order (first fastest); masked dims form the group, first masked fastest; groups are
// enumerated over the unmasked dims, first fastest.
std::vector<std::vector<int>> megatron_groups(const std::vector<std::int64_t>& sizes,
                                              const std::vector<bool>& mask) {
  std::vector<std::int64_t> stride(sizes.size());
  std::int64_t s = 1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    stride[i] = s;
    s *= sizes[i];
  }
  std::vector<std::int64_t> in_shape, in_stride, out_shape, out_stride;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    (mask[i] ? in_shape : out_shape).push_back(sizes[i]);
    (mask[i] ? in_stride : out_stride).push_back(stride[i]);
  }
  auto count = [](const std::vector<std::int64_t>& v) {
    std::int64_t n = 1;
    for (auto x : v) n *= x;
    return n;
  };
  auto dot = [](std::int64_t index, const std::vector<std::int64_t>& shape,
                const std::vector<std::int64_t>& st) {
    std::int64_t r = 0;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      r += (index % shape[i]) * st[i];
      index /= shape[i];
    }
    return r;
  };
  std::vector<std::vector<int>> out;
  for (std::int64_t g = 0; g < count(out_shape); ++g) {
    std::vector<int> group;
    for (std::int64_t k = 0; k < count(in_shape); ++k) {
      group.push_back(static_cast<int>(dot(k, in_shape, in_stride) + dot(g, out_shape, out_stride)));
    }
    out.push_back(group);
  }
  return out;
}

struct random_shape {
  std::array<std::int64_t, 5> extent;  // tp cp ep dp pp
  std::vector<hm::dim> order;          // a permutation of the five, innermost first
  std::string order_string;
};

random_shape make_random_shape(hetmesh::rng& g) {
  random_shape s{};
  for (auto& e : s.extent) e = g.uniform(1, 4);
  std::vector<hm::dim> dims{hm::tp, hm::cp, hm::ep, hm::dp, hm::pp};
  hetmesh::shuffle(std::span<hm::dim>(dims), g);
  s.order = dims;
  for (const auto& d : dims)
    s.order_string += std::string(s.order_string.empty() ? "" : "-") + std::string(d.name());
  return s;
}

std::int64_t extent_of(const random_shape& s, const hm::dim& d) {
  const std::array<hm::dim, 5> names{hm::tp, hm::cp, hm::ep, hm::dp, hm::pp};
  for (std::size_t i = 0; i < 5; ++i) {
    if (names[i] == d) return s.extent[i];
  }
  return -1;
}

// Checks, for one mesh, the bijection and that groups along every subset of dims partition it.
// `compact`: the mesh is an order-derived layout, so Megatron-LM's construction applies to it.
template <class Mesh>
void check_bijection_and_partition(const Mesh& m, bool compact = true) {
  const auto n = static_cast<int>(hetmesh::value_of(m.size()));
  std::set<std::vector<std::int64_t>> coords;
  for (int r = 0; r < n; ++r) {
    const auto c = m.coord_of(r);
    for (std::size_t i = 0; i < m.dims_count(); ++i) REQUIRE((c[i] >= 0 && c[i] < m.extent(i)));
    REQUIRE(m.rank_of(c) == r);
    coords.insert(std::vector<std::int64_t>(c.begin(), c.end()));
  }
  REQUIRE(coords.size() == static_cast<std::size_t>(n));

  const std::size_t k = m.dims_count();
  for (unsigned subset = 0; subset < (1U << k); ++subset) {
    std::vector<hm::dim> dims;
    std::int64_t expected_size = 1;
    for (std::size_t i = 0; i < k; ++i) {
      if (subset & (1U << i)) {
        dims.push_back(m.name(i));
        expected_size *= m.extent(i);
      }
    }
    const auto groups = m.groups(std::span<const hm::dim>(dims));
    std::vector<int> seen(static_cast<std::size_t>(n), 0);
    for (const auto& group : groups) {
      REQUIRE(static_cast<std::int64_t>(group.size()) == expected_size);
      for (std::size_t j = 0; j < group.size(); ++j) {
        const int r = group[j];
        ++seen[static_cast<std::size_t>(r)];
        // Same coordinates off the group's dims; along them, j decomposes first-listed-fastest.
        const auto c0 = m.coord_of(group[0]);
        const auto c = m.coord_of(r);
        std::int64_t rest = static_cast<std::int64_t>(j);
        for (std::size_t i = 0; i < k; ++i) {
          if (!(subset & (1U << i))) REQUIRE(c[i] == c0[i]);
        }
        for (const auto& d : dims) {
          const std::size_t i = m.index_of(d);
          REQUIRE(c[i] == rest % m.extent(i));
          rest /= m.extent(i);
        }
      }
      REQUIRE(m.group_of(group.back(), std::span<const hm::dim>(dims)) == group);
    }
    for (int x : seen) REQUIRE(x == 1);
    // Megatron-LM's construction gives the same groups in the same order.
    if (!compact) continue;
    std::vector<std::int64_t> sizes;
    std::vector<bool> mask;
    for (std::size_t i = 0; i < k; ++i) {
      sizes.push_back(m.extent(i));
      mask.push_back((subset & (1U << i)) != 0);
    }
    REQUIRE(groups == megatron_groups(sizes, mask));
  }
}

}  // namespace

TEST_CASE("bijection and group partition over random dynamic shapes and orders") {
  hetmesh::rng g(20260511);
  for (int trial = 0; trial < 60; ++trial) {
    const random_shape s = make_random_shape(g);
    const auto m = hm::make_mesh(s.order_string, hm::tp(s.extent[0]), hm::cp(s.extent[1]),
                                 hm::ep(s.extent[2]), hm::dp(s.extent[3]), hm::pp(s.extent[4]));
    CAPTURE(m.str());
    REQUIRE(m.order_string() == s.order_string);
    // Strides are prefix products in the order string's order.
    std::int64_t stride = 1;
    for (std::size_t i = 0; i < 5; ++i) {
      REQUIRE(m.name(i) == s.order[i]);
      REQUIRE(m.stride(i) == stride);
      stride *= extent_of(s, s.order[i]);
    }
    REQUIRE(m.size() == stride);
    check_bijection_and_partition(m);
    check_bijection_and_partition(m.to_view());
  }
}

TEST_CASE("bijection and group partition for static meshes") {
  check_bijection_and_partition(hm::make_mesh(hm::tp(8_c), hm::cp(2_c), hm::dp(4_c)));
  check_bijection_and_partition(
      hm::make_mesh(hm::tp(2_c), hm::cp(2_c), hm::ep(2_c), hm::dp(3_c), hm::pp(2_c)));
  check_bijection_and_partition(hm::make_mesh("tp-cp-ep-dp-pp", hm::pp(3_c), hm::tp(4_c), hm::dp(2)));
  check_bijection_and_partition(hm::make_mesh_outermost(hm::dim("edp")(4_c), hm::dim("esp")(4_c)));
}

TEST_CASE("the 16-rank worked example matches Megatron-LM's groups") {
  const auto m = hm::make_mesh(hm::tp(2_c), hm::cp(2_c), hm::dp(2_c), hm::pp(2_c));
  using G = std::vector<std::vector<int>>;
  CHECK(m.groups(hm::tp) == G{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(m.groups(hm::cp) == G{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(m.groups(hm::dp) == G{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(m.groups(hm::pp) == G{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  CHECK(m.group_of(13, hm::cp, hm::dp) == std::vector<int>{9, 11, 13, 15});
  CHECK(m.group_of(13, hm::dp, hm::cp) == std::vector<int>{9, 13, 11, 15});  // first listed fastest
  CHECK(m.group_of(13) == std::vector<int>{13});
}

TEST_CASE("order strings, outermost-first construction and omitted extent-1 dims agree") {
  const auto a = hm::make_mesh(hm::tp(8), hm::cp(2), hm::dp(4));
  const auto b = hm::make_mesh("tp-cp-ep-dp-pp", hm::dp(4), hm::cp(2), hm::tp(8));
  const auto c = hm::make_mesh_outermost(hm::dp(4), hm::cp(2), hm::tp(8));
  const auto d = hm::make_mesh("tp-cp-dp", hm::tp(8_c), hm::cp(2_c), hm::dp(4));
  CHECK(a == b);
  CHECK(a == c);
  CHECK(a == d);
  CHECK(hetmesh::plan_hash(a) == hetmesh::plan_hash(d));  // static or dynamic: same mesh, same hash
  CHECK(hetmesh::plan_hash(a) != hetmesh::plan_hash(hm::make_mesh(hm::cp(2), hm::tp(8), hm::dp(4))));
  // An extent-1 dim left out of the string goes outermost.
  const auto e = hm::make_mesh("tp-dp", hm::ep(1), hm::tp(4), hm::dp(2));
  CHECK(e.order_string() == "tp-dp-ep");
  CHECK(e.stride(hm::ep) == 8);
  for (int r = 0; r < 8; ++r) CHECK(e.coord_of(r, hm::ep) == 0);
}

TEST_CASE("printing") {
  CHECK(hetmesh::to_string(hm::make_mesh(hm::tp(8_c), hm::cp(2_c), hm::dp(4))) ==
        "(tp=_8,cp=_2,dp=4):(_1,_8,_16)");
  CHECK(hetmesh::to_string(hm::make_mesh(hm::tp(8), hm::cp(2_c), hm::dp(4))) ==
        "(tp=8,cp=_2,dp=4):(_1,8,16)");
  CHECK(hetmesh::to_string(hm::make_mesh_outermost(hm::pp(2_c), hm::dp(4), hm::tp(8_c))) ==
        "(tp=_8,dp=4,pp=_2):(_1,_8,32)");
  CHECK(hetmesh::to_string(hm::make_mesh("esp-edp", hm::dim("edp")(16), hm::dim("esp")(4_c))) ==
        "(esp=_4,edp=16):(_1,_4)");
  const auto m = hm::make_mesh(hm::tp(2), hm::cp(2), hm::ep(2), hm::dp(2));
  CHECK(hetmesh::to_string(m.to_view()) == "(tp=2,cp=2,ep=2,dp=2):(1,2,4,8)");
  CHECK(hetmesh::to_string(m.flatten("dp_cp", hm::cp, hm::dp)) == "(tp=2,dp_cp=(2,2),ep=2):(1,(2,8),4)");
  CHECK(hetmesh::to_string(m.submesh({{hm::dp, 1}, {hm::tp, 1}})) == "(cp=2,ep=2):(2,4)+9");
  CHECK(hetmesh::to_string(m.flatten("dp_cp", hm::cp, hm::dp).modes()[1]) == "dp_cp=[2:2, 2:8]");
  CHECK(hetmesh::to_string(m.to_view().modes()[3]) == "dp=2:8");
  CHECK(hetmesh::to_string(hm::tp) == "tp");
  CHECK(hetmesh::to_string(hm::tp(8_c)) == "tp=_8");
  CHECK(hetmesh::to_string(hm::dim("edp")(3)) == "edp=3");
}

TEST_CASE("flatten merges dims into one pool without moving ranks") {
  hetmesh::rng g(99);
  for (int trial = 0; trial < 30; ++trial) {
    const random_shape s = make_random_shape(g);
    const auto m = hm::make_mesh(s.order_string, hm::tp(s.extent[0]), hm::cp(s.extent[1]),
                                 hm::ep(s.extent[2]), hm::dp(s.extent[3]), hm::pp(s.extent[4]));
    CAPTURE(m.str());
    const auto f = m.flatten("dp_cp", hm::cp, hm::dp);
    REQUIRE(f.dims_count() == 4);
    REQUIRE(f.extent("dp_cp") == s.extent[1] * s.extent[3]);
    REQUIRE(f.groups("dp_cp") == m.groups(hm::cp, hm::dp));
    REQUIRE(f.groups(hm::tp, "dp_cp") == m.groups(hm::tp, hm::cp, hm::dp));
    for (int r = 0; r < f.size(); ++r) {
      REQUIRE(f.group_of(r, "dp_cp") == m.group_of(r, hm::cp, hm::dp));
      REQUIRE(f.coord_of(r, hm::tp) == m.coord_of(r, hm::tp));
      // The pool coordinate runs over cp first, then dp.
      REQUIRE(f.coord_of(r, "dp_cp") == m.coord_of(r, hm::cp) + s.extent[1] * m.coord_of(r, hm::dp));
      REQUIRE(f.rank_of(f.coord_of(r)) == r);
    }
    check_bijection_and_partition(f, false);
    // A flattened view can be flattened again and fixed.
    const auto all = f.flatten("world", "dp_cp", hm::tp, hm::ep, hm::pp);
    REQUIRE(all.groups("world").size() == 1);
    REQUIRE(all.groups("world")[0].size() == static_cast<std::size_t>(m.size()));
  }
}

TEST_CASE("submesh fixes coordinates") {
  hetmesh::rng g(7);
  for (int trial = 0; trial < 30; ++trial) {
    const random_shape s = make_random_shape(g);
    const auto m = hm::make_mesh(s.order_string, hm::tp(s.extent[0]), hm::cp(s.extent[1]),
                                 hm::ep(s.extent[2]), hm::dp(s.extent[3]), hm::pp(s.extent[4]));
    CAPTURE(m.str());
    const std::int64_t pp_at = g.uniform(0, s.extent[4] - 1), dp_at = g.uniform(0, s.extent[3] - 1);
    const auto sub = m.submesh({{hm::pp, pp_at}, {hm::dp, dp_at}});
    REQUIRE(sub.size() == m.size() / (s.extent[3] * s.extent[4]));
    std::set<int> expected;
    for (int r = 0; r < m.size(); ++r) {
      const bool in = m.coord_of(r, hm::pp) == pp_at && m.coord_of(r, hm::dp) == dp_at;
      REQUIRE(sub.contains(r) == in);
      if (in) {
        expected.insert(r);
        REQUIRE(sub.coord_of(r, hm::tp) == m.coord_of(r, hm::tp));
        REQUIRE(sub.rank_of(sub.coord_of(r)) == r);
        REQUIRE(sub.group_of(r, hm::tp, hm::cp) == m.group_of(r, hm::tp, hm::cp));
      }
    }
    const auto ranks = sub.ranks();
    REQUIRE(std::set<int>(ranks.begin(), ranks.end()) == expected);
    REQUIRE(sub.groups(hm::cp, hm::ep, hm::tp).size() == 1);
  }
}

TEST_CASE("errors name what was wrong and what was expected") {
  using hetmesh::invalid_argument;
  const auto m = hm::make_mesh(hm::tp(8), hm::cp(2), hm::dp(4));
  CHECK_THROWS_WITH_AS(m.check_world(48), doctest::Contains("has 64 ranks but the world has 48"),
                       invalid_argument);
  CHECK_NOTHROW(m.check_world(64));
  CHECK_THROWS_WITH_AS((void)hm::make_mesh(hm::tp(8), hm::cp(0)), doctest::Contains("dim 'cp' has extent 0"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)hm::make_mesh(hm::tp(-2), hm::cp(2)),
                       doctest::Contains("expected a positive extent"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)hm::make_mesh(hm::tp(2), hm::dp(2), hm::tp(2)), doctest::Contains("'tp' twice"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)hm::make_mesh("tp-dp", hm::tp(2), hm::tp(2)), doctest::Contains("'tp' twice"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)hm::make_mesh("tp-cp-tp", hm::tp(2), hm::cp(2)),
                       doctest::Contains("lists 'tp' twice"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)hm::make_mesh("tp-xp-dp", hm::tp(2), hm::dp(2)),
                       doctest::Contains("unknown dim 'xp' in order string"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)hm::make_mesh("esp", hm::dim("esp")(2), hm::dim("edp")(2)),
                       doctest::Contains("dim 'edp' has extent 2 but order string \"esp\" does not list it"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)hm::make_mesh("tp--dp", hm::tp(2), hm::dp(2)),
                       doctest::Contains("empty dim name"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)hm::make_mesh("", hm::tp(2)), doctest::Contains("empty order string"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(hm::dim("Tp"), doctest::Contains("bad mesh dim name 'Tp'"), invalid_argument);
  CHECK_THROWS_WITH_AS(hm::dim("a_very_long_dim_name"), doctest::Contains("1 to 15 characters"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)m.group_of(3, hm::ep),
                       doctest::Contains("has no dim 'ep': expected one of tp, cp, dp"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)m.groups(hm::dp, hm::pp), doctest::Contains("has no dim 'pp'"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)m.groups(hm::dp, hm::dp), doctest::Contains("'dp' is listed twice"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)m.group_of(64, hm::dp), doctest::Contains("rank 64 is outside mesh"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)m.coord_of(-1), doctest::Contains("expected 0 <= rank < 64"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)m.rank_of({8, 0, 0}), doctest::Contains("coordinate 8 along dim 'tp'"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)m.extent(hm::pp), doctest::Contains("has no dim 'pp'"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)m.flatten("tp", hm::cp, hm::dp), doctest::Contains("'tp' twice"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)m.flatten("pool", hm::cp, hm::ep), doctest::Contains("has no dim 'ep'"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)m.submesh({{hm::dp, 4}}), doctest::Contains("fixes dim 'dp' at 4"),
                       invalid_argument);
  const auto sub = m.submesh({{hm::dp, 1}});
  CHECK_THROWS_WITH_AS((void)sub.coord_of(3), doctest::Contains("rank 3 is not in mesh"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)sub.group_of(16, hm::dp), doctest::Contains("has no dim 'dp'"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)sub.rank_of({1}), doctest::Contains("coordinate has 1 entries"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((hm::view{{{hm::tp, {{2, 1}}}, {hm::tp, {{2, 2}}}}, 0}),
                       doctest::Contains("'tp' twice"), invalid_argument);
}

TEST_CASE("the snippet in docs/mesh.md") {
  constexpr auto m = hm::make_mesh(hm::tp(8_c), hm::cp(2_c), hm::dp(4));
  CHECK(hetmesh::to_string(m) == "(tp=_8,cp=_2,dp=4):(_1,_8,_16)");
  CHECK_NOTHROW(m.check_world(64));
  CHECK(m.coord_of(43) == decltype(m)::coord_type{3, 1, 2});
  CHECK(m.rank_of({3, 1, 2}) == 43);
  CHECK(m.group_of(19, hm::dp) == std::vector<int>{3, 19, 35, 51});
  CHECK(m.groups(hm::tp).size() == 8);
  CHECK(m.flatten("dp_cp", hm::cp, hm::dp).extent("dp_cp") == 8);
  CHECK(m.submesh({{hm::dp, 0}}).ranks() == m.groups(hm::tp, hm::cp)[0]);
}
