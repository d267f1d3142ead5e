// SPDX-License-Identifier: Apache-2.0
// An activation store without write is refused with the message naming the requirement.
#ifndef HETMESH_COMPILE_FAIL_CONTROL
#define HETMESH_TEST_OMIT_STORE_WRITE
#endif
#define HETMESH_TEST_FIXTURE_STORE
#include "model_fixture.hpp"

static_assert(hetmesh::model::check_activation_store<fixture::store, float>());

int main() { return 0; }
