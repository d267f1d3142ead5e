// SPDX-License-Identifier: Apache-2.0
// An encoder without backward is refused with the message naming the requirement.
#ifndef HETMESH_COMPILE_FAIL_CONTROL
#define HETMESH_TEST_OMIT_ENCODER_BACKWARD
#endif
#define HETMESH_TEST_FIXTURE_STAGES
#include "model_fixture.hpp"

static_assert(hetmesh::model::check_encoder_stage<fixture::encoder, float>());

int main() { return 0; }
