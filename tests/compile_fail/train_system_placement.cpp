// SPDX-License-Identifier: Apache-2.0
// train::system places encoders by one of the pipeline room's placements (first stage, the joint
// pipeline's bubbles, a separate encoder pool); a placement of the user's own is refused at compile time
// with the list, rather than failing somewhere inside the schedule's construction.
#include "train_fixture.hpp"

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using placement = hetmesh::pipeline::encoder_pool;
#else
struct placement {  // not a pipeline::encoder_placement
  friend constexpr bool operator==(const placement&, const placement&) = default;
};
#endif

int main() {
  compile_fail::run_pipelined_step<hetmesh::model::scale_stage<double>, hetmesh::pipeline::one_f_one_b,
                                   placement>();
}
