// SPDX-License-Identifier: Apache-2.0
// hetmesh::libtorch: the optional component over libtorch (PyTorch's C++ frontend), target hetmesh::torch.
// A user's torch::nn modules become the stages train::system runs (libtorch::backbone, libtorch::encoder),
// with autograd for their backward, their parameters in one flat buffer (libtorch::flat_parameters) and
// their attention through the runtime's contexts (stage_call::attention). hetmesh/hetmesh.hpp does not
// include this header: libtorch is an optional dependency.
#pragma once

#include "backbone_module.hpp"
#include "encoder_module.hpp"
#include "flat_parameters.hpp"
#include "graph_slots.hpp"
#include "stage_call.hpp"
#include "tensor_view.hpp"
