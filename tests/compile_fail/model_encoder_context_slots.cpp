// SPDX-License-Identifier: Apache-2.0
// An encoder attention context without slots is refused with the message naming the requirement.
#ifndef HETMESH_COMPILE_FAIL_CONTROL
#define HETMESH_TEST_OMIT_ENCODER_CONTEXT_SLOTS
#endif
#define HETMESH_TEST_FIXTURE_CONTEXT
#include "model_fixture.hpp"

static_assert(hetmesh::model::check_encoder_attention_context<fixture::encoder_context, float>());

int main() { return 0; }
