// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda: the 16-bit floating types as communication elements. Including this header makes
// `__half` and `__nv_bfloat16` valid elements of the collectives (dtype float16 / bfloat16), on device
// backends; host backends reject them (they cannot reduce them). Include it next to comm/nccl.hpp to
// move half-precision buffers. Host conversions from and to float come from CUDA's own headers
// (__float2half, __bfloat162float, ...), which are host-callable.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../core/dtype.hpp"

/// `__half` is dtype::float16, so device buffers of halves go through the communicators.
template <>
struct hetmesh::dtype_of<__half> {
  /// dtype::float16.
  static constexpr dtype value = dtype::float16;
};
/// `__nv_bfloat16` is dtype::bfloat16, so device buffers of bfloat16 go through the communicators.
template <>
struct hetmesh::dtype_of<__nv_bfloat16> {
  /// dtype::bfloat16.
  static constexpr dtype value = dtype::bfloat16;
};

static_assert(hetmesh::element<__half> && hetmesh::element<__nv_bfloat16>);
static_assert(!hetmesh::host_element<__nv_bfloat16>);
