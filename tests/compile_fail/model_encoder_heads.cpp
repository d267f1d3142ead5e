// SPDX-License-Identifier: Apache-2.0
// An encoder that does not declare its attention heads is refused with the message naming the requirement
// (issue 34: no library-wide default for them).
#ifndef HETMESH_COMPILE_FAIL_CONTROL
#define HETMESH_TEST_OMIT_ENCODER_HEADS
#endif
#define HETMESH_TEST_FIXTURE_STAGES
#include "model_fixture.hpp"

static_assert(hetmesh::model::check_encoder_stage<fixture::encoder, float>());

int main() { return 0; }
