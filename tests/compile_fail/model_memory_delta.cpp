// SPDX-License-Identifier: Apache-2.0
// An attention memory without attention_delta is refused with the message naming the requirement.
#ifndef HETMESH_COMPILE_FAIL_CONTROL
#define HETMESH_TEST_OMIT_MEMORY_DELTA
#endif
#define HETMESH_TEST_FIXTURE_MEMORY
#include "model_fixture.hpp"

static_assert(hetmesh::model::check_attention_memory<fixture::memory, float>());

int main() { return 0; }
