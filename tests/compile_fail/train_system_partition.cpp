// SPDX-License-Identifier: Apache-2.0
// train::system takes seq::'s LLM partition families: one that train cannot lower to a step plan yet
// (seq::cp_contiguous, the contiguous baseline) is refused at compile time, naming the families it can.
#include "train_fixture.hpp"

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using partition = hetmesh::seq::cp_zigzag;
#else
using partition = hetmesh::seq::cp_contiguous;  // an LLM partition family without a step plan
#endif

int main() { compile_fail::plan_step<partition, hetmesh::train::family_placement>(); }
