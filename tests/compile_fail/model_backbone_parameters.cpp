// SPDX-License-Identifier: Apache-2.0
// A backbone stage without parameters()/gradients() is refused with the message naming the requirement.
#ifndef HETMESH_COMPILE_FAIL_CONTROL
#define HETMESH_TEST_OMIT_BACKBONE_PARAMETERS
#endif
#define HETMESH_TEST_FIXTURE_STAGES
#include "model_fixture.hpp"

static_assert(hetmesh::model::check_backbone_stage<fixture::backbone, float>());

int main() { return 0; }
