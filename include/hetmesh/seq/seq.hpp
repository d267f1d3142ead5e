// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: the sequence-partitioning room in one include.
#pragma once

#include "attention_merge.hpp"
#include "cp.hpp"
#include "hdp.hpp"
#include "hdp_placement.hpp"
#include "hdp_plan.hpp"
#include "long_short.hpp"
#include "moe_aux_loss.hpp"
#include "moe_dispatch.hpp"
#include "offload.hpp"
#include "packing.hpp"
#include "partition.hpp"
#include "ring.hpp"
#include "sample.hpp"
#include "types.hpp"
#include "ulysses.hpp"
