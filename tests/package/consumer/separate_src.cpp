// SPDX-License-Identifier: Apache-2.0
// The library's compiled part, for the consumer built with HETMESH_SEPARATE_COMPILATION=1
// (CONSUMER_SEPARATE): main.cpp's calls of HETMESH_COMPILED functions (the pipeline generators' checks, the
// planners) link to the definitions compiled here.
#include <hetmesh/src.hpp>
