// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda: the 16-bit floating types as communication elements. Including this header makes
// `__half` and `__nv_bfloat16` valid elements of the collectives (dtype float16 / bfloat16), on device
// backends; host backends reject them (they cannot reduce them). Host conversions from and to float
// come from CUDA's own headers (__float2half, __bfloat162float, ...), which are host-callable.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../comm/dtype.hpp"

template <>
struct hetmesh::comm::dtype_of<__half> {
  static constexpr dtype value = dtype::float16;
};
template <>
struct hetmesh::comm::dtype_of<__nv_bfloat16> {
  static constexpr dtype value = dtype::bfloat16;
};

static_assert(hetmesh::comm::element<__half> && hetmesh::comm::element<__nv_bfloat16>);
static_assert(!hetmesh::comm::host_element<__nv_bfloat16>);
