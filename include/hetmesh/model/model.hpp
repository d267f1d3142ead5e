// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: the umbrella of the model room: the concepts a user's encoder stages, backbone stages
// and attention kernel satisfy, the attention entries of their contexts, the memory policies, the unified
// multimodal micro-batch, the encoder micro-batch, activation slots and the stage context.
#pragma once

#include "activation.hpp"
#include "attention.hpp"
#include "attention_check.hpp"
#include "attention_context.hpp"
#include "attention_memory.hpp"
#include "context.hpp"
#include "document.hpp"
#include "encoder_batch.hpp"
#include "micro_batch.hpp"
#include "micro_batch_runs.hpp"
#include "reference_attention.hpp"
#include "stage.hpp"
