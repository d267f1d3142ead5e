// SPDX-License-Identifier: Apache-2.0
// The mesh for a 64-rank job on 8 nodes of 8 GPUs: the LLM's mesh (MoE with expert parallelism), an
// encoder mesh over the same devices, how the two map onto each other, and the layout search's choice
// against Megatron-LM's default order.
#include <hetmesh/mesh/mesh.hpp>

#include <fmt/format.h>

using namespace hetmesh::literals;
namespace hm = hetmesh::mesh;

int main() {
  const hm::topology topo{.nodes = 8, .devices_per_node = 8};

  // LLM: tp=2 (static), cp=2, ep=4, dp=4 (dynamic, e.g. from a config); Megatron's default order.
  const auto llm = hm::make_mesh(hm::megatron_order, hm::tp(2_c), hm::cp(2_c), hm::ep(4), hm::dp(4));
  llm.check_world(topo.world());
  fmt::print("LLM mesh ({}): {}\n", llm.order_string(), llm);
  fmt::print("  tp group of rank 13: {}\n", fmt::join(llm.group_of(13, hm::tp), ","));
  fmt::print("  ep group of rank 13: {}\n", fmt::join(llm.group_of(13, hm::ep), ","));
  fmt::print("  HDP pool (dp x cp) of rank 13: {}\n",
             fmt::join(llm.flatten("dp_cp", hm::cp, hm::dp).group_of(13, "dp_cp"), ","));

  // Encoder: Ulysses sequence parallel inside a node (esp=8), encoder data parallel across nodes.
  const hm::dim esp{"esp"}, edp{"edp"};
  const auto encoder = hm::make_mesh(esp(8_c), edp(8_c));
  fmt::print("\nencoder mesh: {}\n", encoder);

  const hm::decoupled both(encoder, llm, topo);
  fmt::print("{}\n", both);
  for (int r : {0, 9, 13, 63}) {
    fmt::print("  encoder rank {:>2} {} runs on node {} -> LLM {}\n", r, hm::named_coord_of(encoder, r),
               topo.node_of(r), both.llm_coord_of_encoder_rank(r));
  }
  fmt::print("  esp group 1: {}\n", both.encoder_groups(esp)[1]);
  fmt::print("  edp group 0: {}\n", both.encoder_groups(edp)[0]);

  // Layout search: MoE token all-to-alls (ep) dominate, then tp all-reduces; cp ring and dp gradients
  // are lighter (bytes per rank per step; modelled traffic for a 30B-class MoE step).
  const hm::traffic load{.tp = 4.0e9, .cp = 1.0e9, .ep = 6.0e9, .dp = 0.5e9, .pp = 0};
  const auto choice = hm::search_layout(llm, load, topo);
  fmt::print("\n{}\n{}\n", load, choice);
  const auto best = hm::make_mesh(choice.best().order, hm::tp(2_c), hm::cp(2_c), hm::ep(4), hm::dp(4));
  fmt::print("chosen LLM mesh: {}\n", best);
  return 0;
}
