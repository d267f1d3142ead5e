// SPDX-License-Identifier: Apache-2.0
// hetmesh::mesh: everything about meshes. Dims and extents (dim.hpp), layouts with an explicit order
// (layout.hpp), flattened and sub-meshes (view.hpp), the cluster (topology.hpp), the communication-
// efficient layout search (search.hpp), decoupled encoder/LLM meshes (decoupled.hpp) and Megatron-LM's
// MoE decoder/expert meshes (megatron_moe.hpp).
#pragma once

#include "decoupled.hpp"     // IWYU pragma: export
#include "dim.hpp"           // IWYU pragma: export
#include "layout.hpp"        // IWYU pragma: export
#include "megatron_moe.hpp"  // IWYU pragma: export
#include "search.hpp"        // IWYU pragma: export
#include "topology.hpp"      // IWYU pragma: export
#include "view.hpp"          // IWYU pragma: export
