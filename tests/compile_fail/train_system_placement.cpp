// SPDX-License-Identifier: Apache-2.0
// train::system places encoders on the first stage or in the LLM's bubbles (the joint pipeline); a
// separate encoder pool, which the pipeline room can schedule but the training system does not run yet,
// is refused at compile time rather than at the first multimodal step.
#include "train_fixture.hpp"

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using placement = hetmesh::pipeline::colocated_encoder;
#else
using placement = hetmesh::pipeline::encoder_pool;
#endif

int main() {
  compile_fail::run_pipelined_step<hetmesh::model::scale_stage<double>, hetmesh::pipeline::one_f_one_b,
                                   placement>();
}
