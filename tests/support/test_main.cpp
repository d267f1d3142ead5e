// SPDX-License-Identifier: Apache-2.0
// The doctest main shared by hetmesh's test binaries.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
