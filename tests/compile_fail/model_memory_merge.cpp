// SPDX-License-Identifier: Apache-2.0
// An attention memory without merge_attention is refused with the message naming the requirement.
#ifndef HETMESH_COMPILE_FAIL_CONTROL
#define HETMESH_TEST_OMIT_MEMORY_MERGE
#endif
#define HETMESH_TEST_FIXTURE_MEMORY
#include "model_fixture.hpp"

static_assert(hetmesh::model::check_attention_memory<fixture::memory, float>());

int main() { return 0; }
