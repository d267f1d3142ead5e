// SPDX-License-Identifier: Apache-2.0
// run_strategy takes a balancer family; a type without plan(seqs, cfg) is refused with a message
// naming what a balancer provides.
#include <string_view>
#include <vector>

#include <hetmesh/balance/strategies.hpp>

struct round_robin {
  static constexpr std::string_view name = "round_robin";
  friend constexpr bool operator==(const round_robin&, const round_robin&) = default;
};

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using balancer = hetmesh::balance::token_count;
#else
using balancer = round_robin;
#endif

int main() {
  const std::vector<hetmesh::seq::seq_desc> seqs{{.id = 0, .length = 100}};
  const auto r =
      hetmesh::balance::run_strategy(balancer{}, seqs, hetmesh::balance::strategy_config{.ranks = 2});
  return r.tasks > 0 ? 0 : 1;
}
