// SPDX-License-Identifier: Apache-2.0
// A mesh extent of a type other than C<N> or std::int64_t is refused with a message naming both.
#include <hetmesh/mesh/layout.hpp>

#ifdef HETMESH_COMPILE_FAIL_CONTROL
using extent = std::int64_t;
#else
using extent = int;
#endif

int main() { return static_cast<int>(sizeof(hetmesh::mesh::layout<extent>) > 0); }
