// SPDX-License-Identifier: Apache-2.0
// hetmesh::run: the runtime room in one include -- everything that executes a plan over a communicator:
// plan agreement, grouped-reorder and reshard execution, delivery and the data service, the projection of
// loaded records onto the model's step batch (records.hpp), the pipeline executor, ring attention over CP
// and HDP rings, and the tensor-parallel helpers (tensor_parallel.hpp). The plans themselves come from
// balance/, data/, pipeline/ and seq/.
#pragma once

#include "agreement.hpp"
#include "data_service.hpp"
#include "delivery.hpp"
#include "dispatch.hpp"
#include "grouped_reorder.hpp"
#include "moe.hpp"
#include "pipeline_executor.hpp"
#include "plan_delivery.hpp"
#include "records.hpp"
#include "reshard.hpp"
#include "ring_attention.hpp"
#include "tensor_parallel.hpp"
#include "ulysses.hpp"
