// SPDX-License-Identifier: Apache-2.0
// Topology, layout search and decoupled meshes. The search's modelled times are re-derived here from
// the layouts' own groups, so the test checks the search against the mesh, not against itself.
#include <doctest/doctest.h>

#include <hetmesh/core/random.hpp>
#include <hetmesh/mesh/mesh.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

using namespace hetmesh::literals;
namespace hm = hetmesh::mesh;

namespace {

const hm::topology eight_by_eight{.nodes = 8, .devices_per_node = 8};

// The modelled time of `order` recomputed from a layout built with that order string.
std::int64_t expected_time_ns(const std::vector<std::pair<hm::dim, std::int64_t>>& shape,
                              const std::string& order, const hm::traffic& load, const hm::topology& t,
                              hm::combine total) {
  hm::view v;
  {
    std::vector<hm::view_mode> modes;
    std::int64_t stride = 1;
    std::size_t start = 0;
    while (start <= order.size()) {
      const auto end = std::min(order.find('-', start), order.size());
      const hm::dim d(order.substr(start, end - start));
      const auto it = std::find_if(shape.begin(), shape.end(), [&](const auto& s) { return s.first == d; });
      REQUIRE(it != shape.end());
      modes.push_back({d, {{it->second, stride}}});
      stride *= it->second;
      start = end + 1;
    }
    v = hm::view(std::move(modes), 0);
  }
  std::int64_t sum = 0, worst = 0;
  for (std::size_t i = 0; i < v.dims_count(); ++i) {
    int nodes = 1;
    for (const auto& g : v.groups(v.name(i))) nodes = std::max(nodes, t.nodes_spanned(g));
    const double bytes = load.of(v.name(i));
    std::int64_t ns = 0;
    if (bytes > 0) {
      const bool local = nodes == 1;
      const double s =
          bytes / ((local ? t.intra_bw_gbps : t.inter_bw_gbps) * 1e9) +
          static_cast<double>(v.extent(i) - 1) * (local ? t.intra_latency_us : t.inter_latency_us) * 1e-6;
      ns = std::llround(s * 1e9);
    }
    sum += ns;
    worst = std::max(worst, ns);
  }
  return total == hm::combine::sum ? sum : worst;
}

std::int64_t factorial(std::size_t n) { return n <= 1 ? 1 : static_cast<std::int64_t>(n) * factorial(n - 1); }

}  // namespace

TEST_CASE("topology places ranks in node blocks") {
  const hm::topology t{.nodes = 4, .devices_per_node = 8};
  CHECK(t.world() == 32);
  CHECK(t.node_of(0) == 0);
  CHECK(t.node_of(15) == 1);
  CHECK(t.local_of(15) == 7);
  CHECK(t.same_node(8, 15));
  CHECK(!t.same_node(7, 8));
  CHECK(t.ranks_of_node(3) == std::vector<int>{24, 25, 26, 27, 28, 29, 30, 31});
  CHECK(t.nodes_spanned(std::vector<int>{0, 8, 9, 31}) == 3);
  CHECK(t.within_one_node(std::vector<int>{16, 23}));
  CHECK(hetmesh::to_string(t) ==
        "4 nodes x 8 devices (intra-node 450 GB/s, 3 us; inter-node 50 GB/s, 10 us)");
  using hetmesh::invalid_argument;
  CHECK_THROWS_WITH_AS((void)t.node_of(32), doctest::Contains("rank 32 is outside"), invalid_argument);
  CHECK_THROWS_WITH_AS((void)t.ranks_of_node(4), doctest::Contains("node 4 is outside"), invalid_argument);
  CHECK_THROWS_WITH_AS((hm::topology{.nodes = 0}.validate()), doctest::Contains("expected both >= 1"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((hm::topology{.inter_bw_gbps = 0}.validate()), doctest::Contains("expected both > 0"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((hm::topology{.intra_latency_us = -1}.validate()),
                       doctest::Contains("expected both >= 0"), invalid_argument);
}

TEST_CASE("layout search keeps heavy tp groups inside a node for typical dense traffic") {
  // Dense LLM: tp all-reduces dominate; cp ring next; dp gradients last; pp small.
  const auto llm = hm::make_mesh(hm::tp(8_c), hm::cp(2_c), hm::dp(2), hm::pp(2));
  const hm::traffic load{.tp = 8e9, .cp = 2e9, .ep = 0, .dp = 1e9, .pp = 0.1e9};
  const auto choice = hm::search_layout(llm, load, eight_by_eight);
  REQUIRE(choice.ranking.size() == 24);
  const auto& best = choice.best();
  const auto tp_cost =
      std::find_if(best.dims.begin(), best.dims.end(), [](const auto& d) { return d.name == hm::tp; });
  REQUIRE(tp_cost != best.dims.end());
  CHECK(tp_cost->in_node());
  CHECK(tp_cost->stride == 1);
  // Here Megatron's default is already optimal, and the explanation says so.
  CHECK(best.order == "tp-cp-dp-pp");
  CHECK(choice.baseline_index == 0);
  CHECK(choice.explain().find("already as fast") != std::string::npos);
  // Deterministic: the same inputs give the same plan, and the shape's order does not matter.
  const auto again = hm::search_layout(hm::make_mesh_outermost(hm::cp(2), hm::pp(2), hm::dp(2), hm::tp(8)),
                                       load, eight_by_eight);
  CHECK(again.ranking == choice.ranking);
  CHECK(hetmesh::plan_hash(again) == hetmesh::plan_hash(choice));
}

TEST_CASE("layout search moves heavy expert all-to-alls into a node, beating Megatron's order") {
  const auto llm = hm::make_mesh(hm::tp(2_c), hm::cp(2_c), hm::ep(4), hm::dp(4));
  const hm::traffic load{.tp = 4e9, .cp = 1e9, .ep = 6e9, .dp = 0.5e9};
  const auto choice = hm::search_layout(llm, load, eight_by_eight);
  const auto& best = choice.best();
  CHECK(choice.baseline().order == "tp-cp-ep-dp");
  CHECK(best.time_ns < choice.baseline().time_ns);
  CHECK(choice.speedup() > 2.0);
  for (const auto& d : best.dims) {
    if (d.name == hm::ep || d.name == hm::tp) CHECK(d.in_node());
    if (d.name == hm::dp || d.name == hm::cp) CHECK(!d.in_node());
  }
  const std::string text = choice.explain();
  CHECK(text.find("ep (6.00 GB/rank/step) moves inside a node") != std::string::npos);
  CHECK(text.find("cp (1.00 GB/rank/step) moves across nodes") != std::string::npos);
  CHECK(hetmesh::to_string(choice).find("<- baseline") != std::string::npos);
}

TEST_CASE("layout search ranks every order by the time re-derived from the mesh's groups") {
  hetmesh::rng g(42);
  const std::vector<hm::dim> names{hm::tp, hm::cp, hm::ep, hm::dp, hm::pp};
  for (int trial = 0; trial < 12; ++trial) {
    // A world of 2^k ranks over 4 nodes of 4 or 8 devices, dims of extent 1, 2 or 4.
    const int per_node = g.below(2) == 0 ? 4 : 8;
    const hm::topology t{.nodes = 4,
                         .devices_per_node = per_node,
                         .intra_bw_gbps = 100.0 + 400.0 * g.unit(),
                         .inter_bw_gbps = 10.0 + 40.0 * g.unit(),
                         .intra_latency_us = 5.0 * g.unit(),
                         .inter_latency_us = 5.0 + 10.0 * g.unit()};
    std::vector<std::pair<hm::dim, std::int64_t>> shape;
    std::int64_t left = t.world();
    for (const auto& n : names) shape.emplace_back(n, 1);
    while (left > 1) {
      auto& s = shape[g.below(shape.size())];
      if (s.second < 4) {
        s.second *= 2;
        left /= 2;
      }
    }
    const hm::traffic load{.tp = 1e9 * g.unit(),
                           .cp = 1e9 * g.unit(),
                           .ep = 1e9 * g.unit(),
                           .dp = 1e9 * g.unit(),
                           .pp = 1e8 * g.unit()};
    const auto total = g.below(2) == 0 ? hm::combine::sum : hm::combine::max;
    const auto choice = hm::search_layout(shape, load, t, {.total = total});
    std::size_t nontrivial = 0;
    for (const auto& s : shape) nontrivial += s.second > 1 ? 1 : 0;
    REQUIRE(static_cast<std::int64_t>(choice.ranking.size()) == factorial(nontrivial));
    std::set<std::string> orders;
    for (std::size_t i = 0; i < choice.ranking.size(); ++i) {
      const auto& c = choice.ranking[i];
      orders.insert(c.order);
      REQUIRE(c.time_ns == expected_time_ns(shape, c.order, load, t, total));
      if (i > 0) REQUIRE(choice.ranking[i - 1].time_ns <= c.time_ns);
    }
    REQUIRE(orders.size() == choice.ranking.size());
    // Input order of the shape does not change the plan.
    auto reversed = shape;
    std::reverse(reversed.begin(), reversed.end());
    REQUIRE(hm::search_layout(reversed, load, t, {.total = total}) == choice);
  }
}

TEST_CASE("layout search errors") {
  using hetmesh::invalid_argument;
  const hm::traffic load{.tp = 1};
  CHECK_THROWS_WITH_AS((void)hm::search_layout(hm::make_mesh(hm::tp(8), hm::dp(4)), load, eight_by_eight),
                       doctest::Contains("the mesh has 32 ranks but the topology has 64 devices"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS((void)hm::search_layout({{hm::tp, 8}, {hm::tp, 8}}, load, eight_by_eight),
                       doctest::Contains("dim 'tp' twice"), invalid_argument);
  CHECK_THROWS_WITH_AS(
      (void)hm::search_layout({{hm::tp, 8}, {hm::dp, 8}}, hm::traffic{.dp = -1}, eight_by_eight),
      doctest::Contains("traffic of dim 'dp' is -1 bytes"), invalid_argument);
  CHECK_THROWS_WITH_AS(
      (void)hm::search_layout({{hm::tp, 64}}, load,
                              hm::topology{.nodes = 8, .devices_per_node = 8, .intra_bw_gbps = -5}),
      doctest::Contains("expected both > 0"), invalid_argument);
  std::vector<std::pair<hm::dim, std::int64_t>> nine;
  for (int i = 0; i < 9; ++i) nine.emplace_back(hm::dim(fmt::format("d{}", i)), 2);
  CHECK_THROWS_WITH_AS((void)hm::search_layout(nine, load, hm::topology{.nodes = 64, .devices_per_node = 8}),
                       doctest::Contains("expected at most 8"), invalid_argument);
  CHECK_THROWS_WITH_AS(
      (void)hm::search_layout({{hm::tp, 8}, {hm::dp, 8}}, load, eight_by_eight, {.baseline = "tp-Dp"}),
      doctest::Contains("bad mesh dim name 'Dp'"), invalid_argument);
}

TEST_CASE("decoupled encoder and LLM meshes map through devices and round-trip") {
  const hm::dim esp{"esp"}, edp{"edp"};
  const auto llm = hm::make_mesh(hm::tp(2_c), hm::cp(2_c), hm::ep(4), hm::dp(4));
  for (std::int64_t sp : {2, 4, 8, 16}) {
    const auto encoder = hm::make_mesh(esp(sp), edp(64 / sp));
    const hm::decoupled both(encoder, llm, eight_by_eight);
    for (int r = 0; r < 64; ++r) {
      const auto lc = both.llm_coord_of_encoder_rank(r);
      const auto c = llm.coord_of(r);
      REQUIRE(lc.entries.size() == 4);
      for (std::size_t i = 0; i < 4; ++i) REQUIRE(lc.at(llm.name(i)) == c[i]);
      REQUIRE(both.llm_rank_of_encoder_rank(r) == r);
      REQUIRE(both.encoder_rank_of_llm_coord(std::vector<std::int64_t>(c.begin(), c.end())) == r);
      REQUIRE(both.encoder_coord_of_llm_rank(r).at(esp) == encoder.coord_of(r, esp));
    }
    // esp groups are node-local exactly when they fit in a node (esp is innermost).
    const auto groups = both.encoder_groups(esp);
    REQUIRE(groups.size() == static_cast<std::size_t>(64 / sp));
    for (const auto& g : groups) {
      REQUIRE(g.in_node() == (sp <= 8));
      REQUIRE(g.nodes == std::max<std::int64_t>(1, sp / 8));
      // Its devices differ along exactly the LLM dims whose stride is below sp.
      std::vector<hm::dim> expected;
      for (std::size_t i = 0; i < 4; ++i) {
        if (llm.stride(i) < sp) expected.push_back(llm.name(i));
      }
      REQUIRE(g.llm_dims == expected);
    }
    const hm::dim only[] = {esp};
    REQUIRE(both.encoder_groups_in_node(only) == (sp <= 8 ? groups.size() : 0));
  }
  const hm::decoupled both(hm::make_mesh(esp(8_c), edp(8_c)), llm, eight_by_eight);
  CHECK(hetmesh::to_string(both.llm_coord_of_encoder_rank(13)) == "{tp=1,cp=0,ep=3,dp=0}");
  CHECK(hetmesh::to_string(both.encoder_groups(edp)[1]) ==
        "1,9,17,25,33,41,49,57 on 8 nodes (LLM dims: ep,dp)");
  CHECK(hetmesh::to_string(both).find("esp groups: 8 of 8 inside one node") != std::string::npos);
  CHECK_THROWS_WITH_AS(hm::decoupled(hm::make_mesh(esp(4), edp(8)), llm, eight_by_eight),
                       doctest::Contains("encoder mesh (esp=4,edp=8):(1,4) has 32 ranks"),
                       hetmesh::invalid_argument);
  CHECK_THROWS_WITH_AS((void)both.llm_coord_of_encoder_rank(64), doctest::Contains("rank 64 is not in mesh"),
                       hetmesh::invalid_argument);
}

TEST_CASE("an admissible predicate restricts the orders; the baseline stays as the reference") {
  const auto llm = hm::make_mesh(hm::tp(2), hm::cp(2), hm::ep(4), hm::dp(2), hm::pp(2));
  const hm::traffic load{.tp = 4e9, .cp = 1e9, .ep = 6e9, .dp = 0.5e9, .pp = 0.1e9};
  // Pipeline stages outermost and tp innermost: 3! = 6 orders, plus the baseline (which satisfies both).
  auto pp_outer_tp_inner = [](std::span<const hm::dim> order) {
    return order.back() == hm::pp && order.front() == hm::tp;
  };
  const auto choice = hm::search_layout(llm, load, eight_by_eight, {.admissible = pp_outer_tp_inner});
  CHECK(choice.ranking.size() == 6);
  for (const auto& c : choice.ranking) {
    CHECK(c.admissible);
    CHECK(c.order.substr(0, 3) == "tp-");
    CHECK(c.order.substr(c.order.size() - 3) == "-pp");
  }
  CHECK(choice.best().order == "tp-ep-cp-dp-pp");
  // A predicate the baseline fails: the baseline is still ranked, marked, and never chosen.
  auto ep_inner = [](std::span<const hm::dim> order) { return order.front() == hm::ep; };
  const auto other = hm::search_layout(llm, load, eight_by_eight, {.admissible = ep_inner});
  CHECK(other.ranking.size() == 24 + 1);
  CHECK(!other.baseline().admissible);
  CHECK(other.best().admissible);
  CHECK(other.best().order.substr(0, 3) == "ep-");
  auto none = [](std::span<const hm::dim>) { return false; };
  CHECK_THROWS_WITH_AS((void)hm::search_layout(llm, load, eight_by_eight, {.admissible = none}),
                       doctest::Contains("no order of"), hetmesh::invalid_argument);
}
