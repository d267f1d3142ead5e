// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: every header of the data plane (formats, mixture, planner, loaders, constructors,
// delivery, checkpoints, memory accounting).
#pragma once

#include "autoscale.hpp"
#include "checkpoint.hpp"
#include "constructor.hpp"
#include "convert.hpp"
#include "delivery.hpp"
#include "indexed_dataset.hpp"
#include "loader.hpp"
#include "memory.hpp"
#include "mixture.hpp"
#include "mixture_json.hpp"
#include "planner.hpp"
#include "sample.hpp"
#include "service.hpp"
#include "source.hpp"
#include "tar.hpp"
#include "webdataset.hpp"
