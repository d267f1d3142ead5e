// SPDX-License-Identifier: Apache-2.0
// An attention kernel without forward is refused with the message naming the requirement.
#ifndef HETMESH_COMPILE_FAIL_CONTROL
#define HETMESH_TEST_OMIT_ATTENTION_FORWARD
#endif
#define HETMESH_TEST_FIXTURE_KERNEL
#include "model_fixture.hpp"

static_assert(hetmesh::model::check_attention_kernel<fixture::kernel, float>());

int main() { return 0; }
