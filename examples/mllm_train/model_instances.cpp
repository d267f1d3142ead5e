// SPDX-License-Identifier: Apache-2.0
// example_mllm_train's model, compiled once for the contexts its systems run it under (model_instances.hpp).
#include "mllm_train/model_instances.hpp"

template struct mllm::backbone<float>;
template struct mllm::encoder_layers<float>;
MLLM_MODEL_INSTANCES(, hetmesh::comm::loopback::communicator)
#if HETMESH_EXAMPLE_MPI
MLLM_MODEL_INSTANCES(, hetmesh::comm::mpi::communicator)
#endif
