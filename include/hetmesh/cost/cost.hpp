// SPDX-License-Identifier: Apache-2.0
// hetmesh::cost: the cost-model room in one include.
#pragma once

#include "activation_memory.hpp"
#include "calibrate.hpp"
#include "comm.hpp"
#include "compute.hpp"
#include "encoder.hpp"
#include "fixed.hpp"
#include "moe.hpp"
