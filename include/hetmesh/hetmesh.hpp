// SPDX-License-Identifier: Apache-2.0
// hetmesh: the umbrella header. Includes every host-side room; backends that need MPI or NCCL are
// included when their component is linked (HETMESH_HAS_MPI, HETMESH_HAS_NCCL).
#pragma once

#include "config.hpp"
#include "core/assert.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/hash.hpp"
#include "core/integral.hpp"
#include "core/random.hpp"
