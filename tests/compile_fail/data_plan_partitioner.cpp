// SPDX-License-Identifier: Apache-2.0
// data::plan_step balances with a balance::partitioner type; a type without split(costs, bins) is refused
// with a message naming what a partitioner provides.
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include <hetmesh/data/planner.hpp>

struct halves {  // no split(costs, bins)
  static constexpr std::string_view name = "halves";
  friend constexpr bool operator==(const halves&, const halves&) = default;
};

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using split = hetmesh::balance::karmarkar_karp_partition;
#else
using split = halves;
#endif

struct one_source {  // a metadata_source: every sample has 8 tokens
  [[nodiscard]] std::int64_t source_size(int) const { return 100; }
  [[nodiscard]] std::pair<std::int64_t, hetmesh::seq::sample_meta> lookup(int, std::int64_t,
                                                                          std::int64_t p) const {
    hetmesh::seq::sample_meta m;
    m.tokens = 8;
    return {p, m};
  }
};

int main() {
  hetmesh::data::mixture_config cfg;
  cfg.global_batch = 4;
  cfg.sources.push_back({.name = "a", .paths = {"a"}});
  one_source meta;
  const auto p = hetmesh::data::plan_step(cfg, hetmesh::data::initial_state(cfg), meta, split{});
  return p.plan.samples.size() == 4 ? 0 : 1;
}
