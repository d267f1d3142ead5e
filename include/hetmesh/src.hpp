// SPDX-License-Identifier: Apache-2.0
// hetmesh: the compiled part of the library under separate compilation (HETMESH_SEPARATE_COMPILATION).
#pragma once

/// \file
/// The definitions of every HETMESH_COMPILED function, for a program built with
/// HETMESH_SEPARATE_COMPILATION=1: include this in exactly one source file of the program (a file of its
/// own that includes nothing else before it, built with the same HETMESH_ macros as the rest), and the
/// other translation units compile only declarations of those functions (as Asio's and spdlog's compiled
/// modes). Without HETMESH_SEPARATE_COMPILATION the library is header-only and this file is not needed.

#ifdef HETMESH_BODIES
#error "<hetmesh/src.hpp> must come before every other hetmesh header in its source file"
#endif
#if !defined(HETMESH_SEPARATE_COMPILATION) || !HETMESH_SEPARATE_COMPILATION
#error "<hetmesh/src.hpp> is for HETMESH_SEPARATE_COMPILATION=1 builds (header-only builds do not need it)"
#endif
/// Marks the translation unit that defines the HETMESH_COMPILED functions (config.hpp).
#define HETMESH_SOURCE 1

// Every header that declares a HETMESH_COMPILED function (scripts/check_rooms.py checks the list).
#include "balance/balancers.hpp"
#include "balance/bytescale.hpp"
#include "balance/dispatch.hpp"
#include "balance/dp.hpp"
#include "balance/hdp_common.hpp"
#include "balance/model.hpp"
#include "balance/partition.hpp"
#include "balance/planner.hpp"
#include "balance/reorder.hpp"
#include "balance/reshard.hpp"
#include "balance/ring_layout.hpp"
#include "balance/ring_repack.hpp"
#include "balance/ring_search.hpp"
#include "balance/solvers.hpp"
#include "balance/strategies.hpp"
#include "balance/strategy_plan.hpp"
#include "balance/workload.hpp"
#include "comm/communicator.hpp"
#include "comm/detail/checks.hpp"
#include "comm/detail/loopback_impl.hpp"
#include "comm/group_cache.hpp"
#include "comm/loopback.hpp"
#include "comm/ring.hpp"
#include "core/checked.hpp"
#include "core/cpu_time.hpp"
#include "core/error.hpp"
#include "core/exactly_once.hpp"
#include "core/files.hpp"
#include "core/lines.hpp"
#include "core/random.hpp"
#include "core/sort.hpp"
#include "cost/activation_memory.hpp"
#include "cost/calibrate.hpp"
#include "cost/comm.hpp"
#include "cost/compute.hpp"
#include "cost/encoder.hpp"
#include "cost/fixed.hpp"
#include "cost/moe.hpp"
#include "data/autoscale.hpp"
#include "data/constructor.hpp"
#include "data/detail/planner_impl.hpp"
#include "data/indexed_dataset.hpp"
#include "data/memory_report.hpp"
#include "data/memory_source.hpp"
#include "data/mixture.hpp"
#include "data/planner.hpp"
#include "data/routes.hpp"
#include "data/sample.hpp"
#include "data/service_layout.hpp"
#include "data/source.hpp"
#include "data/tar.hpp"
#include "data/trainer_mesh.hpp"
#include "data/wire.hpp"
#include "mesh/decoupled.hpp"
#include "mesh/detail/view_impl.hpp"
#include "mesh/megatron_moe.hpp"
#include "mesh/search.hpp"
#include "mesh/topology.hpp"
#include "mesh/view.hpp"
#include "model/activation.hpp"  // the activation stores' instantiations (HETMESH_INSTANTIATE)
#include "model/attention.hpp"
#include "model/document.hpp"
#include "model/encoder_batch.hpp"
#include "model/host_memory.hpp"
#include "model/micro_batch.hpp"
#include "pipeline/action.hpp"
#include "pipeline/detail/schedule_builders.hpp"
#include "pipeline/io.hpp"
#include "pipeline/joint.hpp"
#include "pipeline/lower.hpp"
#include "run/agreement.hpp"
#include "run/detail/ring_context.hpp"
#include "run/detail/rows.hpp"
#include "run/grouped_reorder.hpp"
#include "run/halo.hpp"
#include "run/long_short_attention.hpp"
#include "run/moe.hpp"                // the MoE collectives' instantiations (HETMESH_INSTANTIATE)
#include "run/pipeline_executor.hpp"  // the executor's instantiations (HETMESH_INSTANTIATE)
#include "run/plan_delivery.hpp"
#include "run/records.hpp"
#include "run/ring_attention.hpp"  // ring attention's instantiations (HETMESH_INSTANTIATE)
#include "run/ring_io.hpp"
#include "run/tp_linear.hpp"
#include "run/tp_regions.hpp"
#include "run/tp_vocab.hpp"
#include "run/ulysses.hpp"
#include "run/ulysses_attention.hpp"  // Ulysses attention's instantiations (HETMESH_INSTANTIATE)
#include "seq/cp.hpp"
#include "seq/detail/best_fit.hpp"
#include "seq/halo.hpp"
#include "seq/hdp.hpp"
#include "seq/hdp_placement.hpp"
#include "seq/hdp_plan.hpp"
#include "seq/long_short.hpp"
#include "seq/moe_dispatch.hpp"
#include "seq/offload.hpp"
#include "seq/packing.hpp"
#include "seq/partition.hpp"
#include "seq/ring.hpp"
#include "seq/sample.hpp"
#include "seq/types.hpp"
#include "seq/ulysses.hpp"
#include "train/build.hpp"
#include "train/checkpoint_files.hpp"
#include "train/checkpoint_json.hpp"
#include "train/checkpoint_manifest.hpp"
#include "train/checkpoint_store.hpp"
#include "train/delivery.hpp"
#include "train/encoder_context.hpp"  // the encoder context's instantiations (HETMESH_INSTANTIATE)
#include "train/encoder_domain.hpp"
#include "train/encoders.hpp"
#include "train/families.hpp"
#include "train/optimizer.hpp"  // Adam's instantiations (HETMESH_INSTANTIATE)
#include "train/pipeline_plan.hpp"
#include "train/report.hpp"        // gather_report's instantiations (HETMESH_INSTANTIATE)
#include "train/stage_runner.hpp"  // the stage runner's instantiations (HETMESH_INSTANTIATE)
#include "train/step_plan.hpp"
#include "train/step_run.hpp"
#include "train/step_stats.hpp"
#include "train/system_comms.hpp"  // the system's communicators' instantiations (HETMESH_INSTANTIATE)
#include "train/system_mesh.hpp"
