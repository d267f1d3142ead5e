// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: every header of the data plane (formats, mixture, planner, loaders, constructors,
// checkpoints, memory accounting, the wire form of micro-batches). Delivery and the data service, which
// communicate, are in run/ (run/delivery.hpp, run/data_service.hpp).
#pragma once

#include "autoscale.hpp"
#include "checkpoint.hpp"
#include "constructor.hpp"
#include "convert.hpp"
#include "indexed_dataset.hpp"
#include "loader.hpp"
#include "memory.hpp"
#include "mixture.hpp"
#include "mixture_json.hpp"
#include "planner.hpp"
#include "sample.hpp"
#include "service_layout.hpp"
#include "source.hpp"
#include "tar.hpp"
#include "webdataset.hpp"
#include "wire.hpp"
