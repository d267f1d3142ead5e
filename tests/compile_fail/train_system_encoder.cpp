// SPDX-License-Identifier: Apache-2.0
// train::system::run takes the model's encoders: an encoder that does not name its modality is refused at
// compile time with model::check_encoder_stage's message for that requirement.
#include "train_fixture.hpp"

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using encoder = hetmesh::model::scale_encoder<double, hetmesh::model::vision_modality>;
#else
struct encoder : hetmesh::model::scale_encoder<double, hetmesh::model::vision_modality> {
  using hetmesh::model::scale_encoder<double, hetmesh::model::vision_modality>::scale_encoder;
  static constexpr int modality = 0;  // not a name
};
#endif

int main() {
  compile_fail::run_pipelined_step<hetmesh::model::scale_stage<double>, hetmesh::pipeline::one_f_one_b,
                                   hetmesh::pipeline::encoder_on_first_stage, encoder>();
}
