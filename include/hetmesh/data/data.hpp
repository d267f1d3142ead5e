// SPDX-License-Identifier: Apache-2.0
// hetmesh::data: every header of the data plane (formats, mixture, planner, loaders, constructors,
// checkpoints, memory accounting, the wire form of micro-batches). Delivery and the data service, which
// communicate, are in run/ (run/delivery.hpp, run/data_service.hpp).
//
// Headers that read or write JSON are left out, so this include does not pay for nlohmann/json's
// templates: include them where JSON is read or written -- data/mixture_json.hpp (mixtures),
// data/checkpoint.hpp (checkpoint files), data/convert.hpp (the jsonl converters) and
// data/webdataset.hpp (WebDataset shards, whose samples carry a `.json` member; a program that opens a
// WebDataset source includes it in some translation unit, which registers the reader with open_source).
#pragma once

#include "autoscale.hpp"
#include "constructor.hpp"
#include "indexed_dataset.hpp"
#include "loader.hpp"
#include "memory_report.hpp"
#include "memory_source.hpp"
#include "mixture.hpp"
#include "planner.hpp"
#include "routes.hpp"
#include "sample.hpp"
#include "service_layout.hpp"
#include "source.hpp"
#include "tar.hpp"
#include "trainer_mesh.hpp"
#include "wire.hpp"
