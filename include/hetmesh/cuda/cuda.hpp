// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda: the CUDA room's host-side headers in one include: device buffers and memory, streams,
// error checks, half-precision element types and the reference attention's launchers. They need the CUDA
// runtime headers but not nvcc, so any C++ translation unit of a CUDA build may include this. The kernels
// (attention_kernels.cuh, gather.cuh, memory_kernels.cuh) are not included: one .cu file of a program
// includes each of those it uses (nvcc only).
#pragma once

#include "attention.hpp"
#include "buffer.hpp"
#include "check.hpp"
#include "device_memory.hpp"
#include "half.hpp"
#include "stream.hpp"
