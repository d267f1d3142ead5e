// SPDX-License-Identifier: Apache-2.0
// The library's compiled part for example_mllm_train, its GPU variant and tests/mllm, which build with
// HETMESH_SEPARATE_COMPILATION=1 (data_library.cmake): the planners and plan builders are compiled here once
// instead of in each of the example's translation units (docs/compile-time.md).
#include <hetmesh/src.hpp>
