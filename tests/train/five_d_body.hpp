// SPDX-License-Identifier: Apache-2.0
// Training steps under a 5-D layout (a partition family over the pool, pp, and the mesh's tp and ep), with
// Adam or ZeRO-1 Adam, on any world: the bodies of tests/train/five_d.cpp (loopback) and of the MPI case in
// system_mpi.cpp. The model: tiny_stack with 4 query and 2 KV heads split over tp when ep = 1, the MoE model
// (moe_lm: 4 experts, top 2) when ep > 1. Every rank returns the steps' losses (equal on every rank).
#pragma once

#include <cstdint>
#include <vector>

#include <hetmesh/train/train.hpp>
#include <hetmesh/train/zero.hpp>

#include "train/moe_lm.hpp"
#include "train/pipeline_body.hpp"
#include "train/train_body.hpp"

namespace traintest {

/// One layout of the 5-D grid: pipeline depth, mesh (tp, ep) and ZeRO-1 or not.
struct five_d_layout {
  int pp = 1;
  train::system_mesh mesh{};
  bool zero = false;
};

/// `steps` steps of Adam (lr 0.01; ZeRO-1 over each group's data-parallel ranks when layout.zero) on new
/// seeded batches; the losses. Collective over world. Reproducible sums (rank order): bitwise the same on
/// every backend.
template <class Partition, class C>
std::vector<double> five_d_losses(C& world, const Partition& partition, const five_d_layout& layout,
                                  int steps = 5) {
  train::system_options o;
  o.mesh = layout.mesh;
  o.reproducible = true;
  train::system<Partition, model::reference_attention, C> sys(
      partition, train::family_placement{}, train::pipeline_config<>{layout.pp, {}, {}}, world, {}, o);
  auto train_with = [&](auto& m) {
    std::vector<double> losses;
    train::adam<double> adam{.lr = 0.01};
    train::zero1<train::adam<double>> zero{.inner = {.lr = 0.01}};
    for (int s = 0; s < steps; ++s) {
      const auto batch = random_batch(900 + static_cast<std::uint64_t>(s), 8, 26);
      const auto plan = sys.plan(batch);
      const auto st = layout.zero ? sys.run(plan, batch, m, zero) : sys.run(plan, batch, m, adam);
      losses.push_back(st.loss);
    }
    return losses;
  };
  if (layout.mesh.ep > 1) {
    moe_lm<double> m(kShape, 23, sys.split());
    return train_with(m);
  }
  tiny_stack<double> m(kTpShape, 23, kBlocks, sys.split());
  return train_with(m);
}

}  // namespace traintest
