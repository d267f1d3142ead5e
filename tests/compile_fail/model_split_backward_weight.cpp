// SPDX-License-Identifier: Apache-2.0
// A zero-bubble stage without backward_weight is refused with the message naming the requirement.
#ifndef HETMESH_COMPILE_FAIL_CONTROL
#define HETMESH_TEST_OMIT_BACKWARD_WEIGHT
#endif
#define HETMESH_TEST_FIXTURE_STAGES
#include "model_fixture.hpp"

static_assert(hetmesh::model::check_split_backward_stage<fixture::backbone, float>());

int main() { return 0; }
