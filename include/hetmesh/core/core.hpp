// SPDX-License-Identifier: Apache-2.0
// hetmesh::core: the core room in one include (errors and assertions, checked arithmetic, element types,
// formatting, hashing, static/dynamic integers, line reading, numerics, random numbers, sorting, thread CPU
// time). core/memory_space.hpp (host or device memory, emulated device pointers) is left out: the device
// code paths that need it include it.
#pragma once

#include "assert.hpp"
#include "checked.hpp"
#include "cpu_time.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "exactly_once.hpp"
#include "format.hpp"
#include "function_ref.hpp"
#include "hash.hpp"
#include "integral.hpp"
#include "lines.hpp"
#include "numeric.hpp"
#include "random.hpp"
#include "sort.hpp"
