// SPDX-License-Identifier: Apache-2.0
// mesh::megatron_moe_mesh against Megatron-LM: every group family initialize_model_parallel builds, for
// the shapes of a golden file written by megatron-core itself (tests/mesh/data, see its "origin"), and
// the shapes it refuses, with its reason. Then properties over seeded random shapes up to 128 ranks:
// families partition the world, both meshes share their pp groups, sizes multiply to the world.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <hetmesh/core/format.hpp>
#include <hetmesh/mesh/layout.hpp>
#include <hetmesh/mesh/megatron_moe.hpp>

using namespace hetmesh;
using namespace hetmesh::mesh;

namespace {

megatron_moe_sizes sizes_of(const nlohmann::json& j) {
  return {.world = j.at("world").get<std::int64_t>(),
          .tp = j.at("tp").get<std::int64_t>(),
          .cp = j.at("cp").get<std::int64_t>(),
          .pp = j.at("pp").get<std::int64_t>(),
          .ep = j.at("ep").get<std::int64_t>(),
          .etp = j.value("etp", std::int64_t{0}),
          .order = j.at("order").get<std::string>()};
}

std::string refusal(const megatron_moe_sizes& s) {
  try {
    (void)megatron_moe_mesh(s);
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return "";
}

// True when `groups` partition 0..world-1.
bool partitions(const std::vector<std::vector<int>>& groups, std::int64_t world) {
  std::vector<int> seen;
  for (const auto& g : groups) seen.insert(seen.end(), g.begin(), g.end());
  std::sort(seen.begin(), seen.end());
  if (static_cast<std::int64_t>(seen.size()) != world) return false;
  for (std::size_t i = 0; i < seen.size(); ++i)
    if (seen[i] != static_cast<int>(i)) return false;
  return true;
}

}  // namespace

TEST_CASE("megatron_moe_mesh: every group family equals megatron-core's, refusals carry its reason") {
  std::ifstream in(HETMESH_MESH_DATA_DIR "/megatron_moe_groups.json");
  REQUIRE(in);
  const auto doc = nlohmann::json::parse(in);
  const auto& cases = doc.at("cases");
  REQUIRE(cases.size() >= 10);
  int accepted = 0, refused = 0;
  for (const auto& c : cases) {
    const auto s = sizes_of(c.at("shape"));
    CAPTURE(s);
    if (c.contains("refused")) {
      ++refused;
      const std::string why = refusal(s);
      CHECK(why.find("Megatron-LM refuses") != std::string::npos);
      CHECK(why.find(c.at("refused").get<std::string>()) != std::string::npos);
      continue;
    }
    ++accepted;
    const megatron_moe_mesh m(s);
    std::map<std::string, std::vector<std::vector<int>>> ours;
    for (const auto& f : m.families()) ours[f.name] = f.groups;
    std::set<std::string> theirs;
    for (const auto& [name, groups] : c.at("groups").items()) {
      theirs.insert(name);
      CAPTURE(name);
      CHECK(ours[name] == groups.get<std::vector<std::vector<int>>>());
    }
    CHECK(theirs.size() == ours.size());  // no family Megatron does not build
  }
  CHECK(accepted >= 8);
  CHECK(refused == 3);
}

TEST_CASE("megatron_moe_mesh: ep folds into dp x cp, unlike a plain five-dim mesh") {
  // 16 ranks, tp = cp = ep = pp = 2: Megatron's expert mesh puts ep right after etp (stride 2), where a
  // plain tp-cp-ep-dp-pp mesh has stride tp*cp = 4.
  const megatron_moe_mesh m({.world = 16, .tp = 2, .cp = 2, .pp = 2, .ep = 2});
  CHECK(m.sizes().etp == 2);
  CHECK(m.dp() == 2);
  CHECK(m.edp() == 2);
  CHECK(m.expert_groups("ep").front() == std::vector<int>{0, 2});
  const auto plain = make_mesh(megatron_order, tp(std::int64_t{2}), cp(std::int64_t{2}), ep(std::int64_t{2}),
                               dp(std::int64_t{1}), pp(std::int64_t{2}));
  CHECK(plain.group_of(0, ep) == std::vector<int>{0, 4});
  // The decoder mesh is Megatron's non-MoE mesh: ep has extent 1 there.
  CHECK(m.decoder().str() == "(tp=2,cp=2,ep=1,dp=2,pp=2):(_1,2,4,4,8)");
  CHECK(m.expert().str() == "(etp=2,ep=2,edp=2,pp=2):(_1,2,4,8)");
  CHECK(m.decoder_groups("dp-cp") ==
        m.decoder_groups("cp-dp"));           // get_ranks orders by the mesh, not the token
  CHECK(m.expert_groups("cp").size() == 16);  // cp has extent 1 in the expert mesh
  CHECK(to_string(m) ==
        "megatron_moe_mesh{decoder (tp=2,cp=2,ep=1,dp=2,pp=2):(_1,2,4,4,8), expert "
        "(etp=2,ep=2,edp=2,pp=2):(_1,2,4,8)}");
  // Under tp-cp-ep-pp-dp, pp sits inside dp: the same pp groups in both meshes since dp == edp.
  const megatron_moe_mesh q({.world = 16, .tp = 2, .cp = 2, .pp = 2, .ep = 2, .order = "tp-cp-ep-pp-dp"});
  CHECK(q.decoder_groups("pp").front() == std::vector<int>{0, 4});
  CHECK(q.expert_groups("pp") == q.decoder_groups("pp"));
}

TEST_CASE("megatron_moe_mesh: Megatron's refusals and bad input") {
  // Megatron's five refusals, each with its reason.
  CHECK(refusal({.world = 10, .tp = 4}).find("world_size (10) is not divisible by tp*pp*cp = 4") !=
        std::string::npos);
  CHECK(refusal({.world = 12, .tp = 2, .pp = 2, .ep = 2, .etp = 2})
            .find("expert_tensor_model_pipeline_parallel size etp*ep*pp = 8") != std::string::npos);
  CHECK(refusal({.world = 16, .tp = 4, .pp = 2, .ep = 2, .etp = 1, .order = "tp-cp-ep-pp-dp"})
            .find("when not using pp-last rank ordering") != std::string::npos);
  CHECK(refusal({.world = 8, .tp = 2, .order = "cp-ep-dp-pp"}).find("the size of (tp) is (2)") !=
        std::string::npos);
  CHECK(refusal({.world = 8, .ep = 2, .order = "tp-cp-dp-pp"}).find("the size of (ep) is (2)") !=
        std::string::npos);
  // pp right after tp: stride tp = 2 in the decoder, etp = 1 in the expert mesh; dp == edp, yet the pp groups
  // differ.
  CHECK(refusal({.world = 8, .tp = 2, .pp = 2, .ep = 2, .etp = 1, .order = "tp-pp-cp-ep-dp"})
            .find("pipeline parallel groups are expected to be the same") != std::string::npos);
  // Where Megatron fails without a reason, hetmesh gives one.
  CHECK(refusal({.world = 8, .order = "tp-xx-dp"}).find("unknown dim 'xx'") != std::string::npos);
  CHECK(refusal({.world = 8, .order = "tp-tp-dp"}).find("lists 'tp' twice") != std::string::npos);
  CHECK(refusal({.world = 8, .tp = 0}).find("tp = 0") != std::string::npos);
  // Sizes whose product overflows int64 are refused as not dividing the world, without overflow.
  CHECK(refusal({.world = 8, .tp = std::int64_t{1} << 40, .cp = std::int64_t{1} << 40})
            .find("tp*pp*cp = 1099511627776*1*1099511627776") != std::string::npos);
  CHECK(refusal({.world = 8, .ep = std::int64_t{1} << 62, .etp = 4})
            .find("etp*ep*pp = 4*4611686018427387904*1") != std::string::npos);
  CHECK(refusal({.world = 8, .etp = -1}).find("etp = -1") != std::string::npos);
  const megatron_moe_mesh m({.world = 8, .ep = 2});
  CHECK_THROWS_AS((void)m.decoder_groups("tp-xx"), invalid_argument);
  CHECK_THROWS_AS((void)m.expert_groups("ep-ep"), invalid_argument);
}

TEST_CASE("megatron_moe_mesh: seeded random shapes up to 128 ranks partition the world, share pp groups") {
  std::uint64_t state = 0x5eedu;
  const auto below = [&](std::int64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::int64_t>((state >> 33) % static_cast<std::uint64_t>(n));
  };
  const auto divisor_of = [&](std::int64_t n) {
    std::vector<std::int64_t> d;
    for (std::int64_t i = 1; i <= n; ++i)
      if (n % i == 0) d.push_back(i);
    return d[static_cast<std::size_t>(below(static_cast<std::int64_t>(d.size())))];
  };
  int built = 0;
  for (int trial = 0; trial < 300; ++trial) {
    megatron_moe_sizes s{.world = 1 + below(128)};
    s.tp = divisor_of(s.world);
    s.cp = divisor_of(s.world / s.tp);
    s.pp = divisor_of(s.world / (s.tp * s.cp));
    s.etp = divisor_of(s.world / s.pp);
    s.ep = divisor_of(s.world / (s.pp * s.etp));
    s.order = below(2) ? "tp-cp-ep-dp-pp" : "tp-cp-ep-pp-dp";
    CAPTURE(s);
    const bool megatron_accepts = s.order.ends_with("pp") || s.pp == 1 ||
                                  s.world / (s.tp * s.cp * s.pp) == s.world / (s.etp * s.ep * s.pp);
    if (!megatron_accepts) {
      CHECK(refusal(s).find("pp-last") != std::string::npos);
      continue;
    }
    ++built;
    const megatron_moe_mesh m(s);
    CHECK(s.tp * s.cp * m.dp() * s.pp == s.world);
    CHECK(m.sizes().etp * s.ep * m.edp() * s.pp == s.world);
    CHECK(m.decoder_groups("pp") == m.expert_groups("pp"));
    for (const auto& f : m.families()) {
      CAPTURE(f.name);
      if (f.name == "EMBEDDING_GROUP" || f.name == "POSITION_EMBEDDING_GROUP") continue;  // stages only
      CHECK(partitions(f.groups, s.world));
    }
    // Nesting: each expert tp-ep group is a union of etp groups and of ep groups.
    const auto tpep = m.expert_groups("tp-ep");
    for (const auto& g : m.expert_groups("ep")) {
      CHECK(std::any_of(tpep.begin(), tpep.end(), [&](const std::vector<int>& big) {
        return std::all_of(g.begin(), g.end(),
                           [&](int r) { return std::find(big.begin(), big.end(), r) != big.end(); });
      }));
    }
    CHECK(static_cast<std::int64_t>(m.expert_groups("dp").size()) == s.world / m.edp());
  }
  CHECK(built > 200);
}
