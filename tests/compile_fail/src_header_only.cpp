// SPDX-License-Identifier: Apache-2.0
// <hetmesh/src.hpp> in a header-only build (no HETMESH_SEPARATE_COMPILATION) is refused: every function is
// inline there already, and a second set of definitions would break the one-definition rule.
#include <hetmesh/src.hpp>

int main() { return 0; }
