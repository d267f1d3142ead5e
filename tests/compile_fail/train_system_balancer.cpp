// SPDX-License-Identifier: Apache-2.0
// train::system places HDP work by a balance:: balancer: a balancer with a family it cannot place (static
// CP zigzag, whose documents go to fixed dp groups) is refused at compile time, naming what it accepts.
#include "train_fixture.hpp"

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using partition = hetmesh::seq::hdp<hetmesh::seq::no_offload>;
#else
using partition = hetmesh::seq::cp_zigzag;
#endif

int main() { compile_fail::plan_step<partition, hetmesh::balance::bytescale>(); }
