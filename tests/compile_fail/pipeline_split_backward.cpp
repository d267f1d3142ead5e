// SPDX-License-Identifier: Apache-2.0
// A zero-bubble schedule family (ZB-V) with a backbone stage that has no split backward is refused at
// compile time, with a message naming what the stage must provide.
#include <hetmesh/pipeline/schedule_family.hpp>

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using schedule = hetmesh::pipeline::one_f_one_b;  // whole backward: any stage will do
#else
using schedule = hetmesh::pipeline::zbv;  // I and W: needs backward_input and backward_weight
#endif

constexpr bool stage_has_split_backward = false;
static_assert(hetmesh::pipeline::check_schedule_accepts<schedule, stage_has_split_backward>());

int main() { return 0; }
