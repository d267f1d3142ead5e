// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda: CUDA runtime status codes turned into hetmesh::backend_error with CUDA's own text.
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include <fmt/format.h>

#include "../core/error.hpp"

namespace hetmesh::cuda {

/// Throws backend_error(code) naming `call` and `where` when `status` is not cudaSuccess.
inline void check(cudaError_t status, std::string_view call, std::string_view where = "cuda") {
  if (status != cudaSuccess)
    throw backend_error(fmt::format("{}: {} failed: {} ({})", where, call, cudaGetErrorString(status),
                                    cudaGetErrorName(status)),
                        static_cast<int>(status));
}

/// Number of visible CUDA devices; 0 when there is no device or no driver (never throws, so that
/// tests can skip cleanly on machines without a GPU).
[[nodiscard]] inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" status
    return 0;
  }
  return n;
}

}  // namespace hetmesh::cuda
