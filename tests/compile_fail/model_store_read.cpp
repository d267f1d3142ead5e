// SPDX-License-Identifier: Apache-2.0
// An activation store without read is refused with the message naming the requirement.
#ifndef HETMESH_COMPILE_FAIL_CONTROL
#define HETMESH_TEST_OMIT_STORE_READ
#endif
#define HETMESH_TEST_FIXTURE_STORE
#include "model_fixture.hpp"

static_assert(hetmesh::model::check_activation_store<fixture::store, float>());

int main() { return 0; }
