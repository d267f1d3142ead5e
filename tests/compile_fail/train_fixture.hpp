// SPDX-License-Identifier: Apache-2.0
// What the train::system compile-fail tests share: a step run with a given stage, kernel and optimizer,
// and a step plan with a given partition family and balancer, on a one-rank loopback world. Each test
// swaps one of them for a non-conforming type (and, under HETMESH_COMPILE_FAIL_CONTROL, back for a
// conforming one).
#pragma once

#include <span>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/model/stage.hpp>
#include <hetmesh/train/train.hpp>

namespace compile_fail {

/// A conforming optimizer hook that does nothing.
struct no_update {
  template <class P, class G>
  void operator()(P&&, G&&) const {}
};

template <class Stage, class Kernel, class Optimizer = no_update>
void run_step() {
  hetmesh::comm::loopback::run(1, [](hetmesh::comm::loopback::communicator& c) {
    hetmesh::train::system<hetmesh::seq::cp_thd, Kernel, hetmesh::comm::loopback::communicator> sys(
        {.cp = 1, .pad = true}, c);
    hetmesh::model::step_batch b;
    b.documents.push_back({1, {1, 2, 3}, {}, {}});
    Stage stage(4);
    sys.run(sys.plan(b), b, stage, Optimizer{});
  });
}

/// A two-stage pipelined step (pp = 2 on two loopback ranks) of `Stage` under schedule family `Schedule`,
/// with the encoders `encs` bound to a do-nothing input.
template <class Stage, class Schedule, class Placement = hetmesh::pipeline::encoder_on_first_stage,
          class... Encoders>
void run_pipelined_step() {
  hetmesh::comm::loopback::run(2, [](hetmesh::comm::loopback::communicator& c) {
    hetmesh::train::system<hetmesh::seq::cp_thd, hetmesh::model::reference_attention,
                           hetmesh::comm::loopback::communicator, hetmesh::train::family_placement, Schedule,
                           Placement>
        sys({.cp = 1, .pad = true}, {}, {2, {}, {}}, c);
    hetmesh::model::step_batch b;
    b.documents.push_back({1, {1, 2, 3}, {}, {}});
    Stage stage(4);
    auto input = [](const hetmesh::model::encoder_batch_view&, std::span<double>) {};
    [&](auto... enc) {
      sys.run(sys.plan(b), b, stage, no_update{}, hetmesh::train::bind_encoder(enc, input)...);
    }(Encoders(4)...);
  });
}

/// Plans a step of two-token documents with a default-constructed partition family and balancer.
template <class Partition, class Balancer>
void plan_step() {
  hetmesh::comm::loopback::run(1, [](hetmesh::comm::loopback::communicator& c) {
    hetmesh::train::system<Partition, hetmesh::model::reference_attention,
                           hetmesh::comm::loopback::communicator, Balancer>
        sys(Partition{}, Balancer{}, c);
    hetmesh::model::step_batch b;
    b.documents.push_back({1, {1, 2}, {}, {}});
    (void)sys.plan(b);
  });
}

}  // namespace compile_fail
