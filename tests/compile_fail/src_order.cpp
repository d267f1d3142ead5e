// SPDX-License-Identifier: Apache-2.0
// <hetmesh/src.hpp> after another hetmesh header is refused: that header's HETMESH_COMPILED functions were
// already declared without their bodies, so the program would not define them.
#define HETMESH_SEPARATE_COMPILATION 1
#include <hetmesh/seq/types.hpp>
#include <hetmesh/src.hpp>

int main() { return 0; }
