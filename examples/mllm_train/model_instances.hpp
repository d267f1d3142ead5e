// SPDX-License-Identifier: Apache-2.0
// The example's model compiled once, as a user's model is: model_instances.cpp instantiates the model's
// float code (constructors, stage and encoder calls) for the contexts its train::system types run it
// under, and a translation unit that includes this header leaves that code to it (extern template)
// instead of compiling it again beside its systems. A context not listed here (another communicator,
// kernel or memory policy) still works: its translation unit instantiates the model itself.
// The contexts depend on the communicator, kernel, element and memory policy and on the partition
// family's attention mechanism (rings or Ulysses groups), not on the balancer, schedule or placement: one
// instantiation serves every system over them (train::system::context_type, encoder_context_type).
#pragma once

#include <span>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/train/context.hpp>
#include <hetmesh/train/encoder_context.hpp>

#include "mllm_train/model.hpp"

#if HETMESH_EXAMPLE_MPI
#include <hetmesh/comm/mpi.hpp>
#endif

namespace mllm::instances {

/// A backbone context over `Comm` with the reference kernel in host memory, attention over rings (HDP,
/// static CP, DP).
template <class Comm>
using rings_context =
    hetmesh::train::step_context<Comm, hetmesh::model::reference_attention, float,
                                 hetmesh::model::host_memory, hetmesh::train::attention_over_rings>;
/// The same with attention over Ulysses groups.
template <class Comm>
using groups_context =
    hetmesh::train::step_context<Comm, hetmesh::model::reference_attention, float,
                                 hetmesh::model::host_memory, hetmesh::train::attention_over_groups>;
/// An encoder context over `Comm` with the reference kernel in host memory.
template <class Comm>
using encoder_context = hetmesh::train::encoder_context<Comm, hetmesh::model::reference_attention, float>;

}  // namespace mllm::instances

/// The backbone's stage calls for context `Ctx` (EXTERN: `extern` to declare, empty to define).
#define MLLM_BACKBONE_INSTANCES(EXTERN, Ctx)                                                          \
  EXTERN template void mllm::backbone<float>::forward<Ctx>(                                           \
      const Ctx&, const hetmesh::model::micro_batch_view&, std::span<const float>, std::span<float>); \
  EXTERN template void mllm::backbone<float>::backward_input<Ctx>(                                    \
      const Ctx&, const hetmesh::model::micro_batch_view&, std::span<const float>, std::span<float>); \
  EXTERN template void mllm::backbone<float>::backward_weight<Ctx>(const Ctx&,                        \
                                                                   const hetmesh::model::micro_batch_view&);

/// An encoder's calls for context `Ctx`.
#define MLLM_ENCODER_INSTANCES(EXTERN, Ctx)                                                             \
  EXTERN template void mllm::encoder_layers<float>::forward<Ctx>(                                       \
      const Ctx&, const hetmesh::model::encoder_batch_view&, std::span<const float>, std::span<float>); \
  EXTERN template void mllm::encoder_layers<float>::backward<Ctx>(                                      \
      const Ctx&, const hetmesh::model::encoder_batch_view&, std::span<const float>, std::span<float>);

/// Every instance of the model over communicator `Comm`: both attention mechanisms and the encoders.
#define MLLM_MODEL_INSTANCES(EXTERN, Comm)                               \
  MLLM_BACKBONE_INSTANCES(EXTERN, mllm::instances::rings_context<Comm>)  \
  MLLM_BACKBONE_INSTANCES(EXTERN, mllm::instances::groups_context<Comm>) \
  MLLM_ENCODER_INSTANCES(EXTERN, mllm::instances::encoder_context<Comm>)

extern template struct mllm::backbone<float>;
extern template struct mllm::encoder_layers<float>;
MLLM_MODEL_INSTANCES(extern, hetmesh::comm::loopback::communicator)
#if HETMESH_EXAMPLE_MPI
MLLM_MODEL_INSTANCES(extern, hetmesh::comm::mpi::communicator)
#endif
