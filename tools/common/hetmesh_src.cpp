// SPDX-License-Identifier: Apache-2.0
// The library's compiled part for hetmesh's own programs that build with HETMESH_SEPARATE_COMPILATION=1
// (cmake/HetmeshTargets.cmake: hetmesh_src_library, one static library per assertion level): the test
// binaries, example_mllm_train and its GPU variant. The HETMESH_COMPILED functions (planners, plan builders,
// the loopback communicator, the executor's instantiations) are compiled here once instead of in each of
// their translation units (docs/compile-time.md).
#include <hetmesh/src.hpp>
