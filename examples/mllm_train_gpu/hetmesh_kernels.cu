// SPDX-License-Identifier: Apache-2.0
// The one .cu file of example_mllm_train_gpu that defines the launchers hetmesh's CUDA headers declare:
// cuda::device_memory's kernels (fill, add, merge_attention, attention_delta) and
// cuda::device_reference_attention's.
#include <hetmesh/cuda/attention_kernels.cuh>
#include <hetmesh/cuda/memory_kernels.cuh>
