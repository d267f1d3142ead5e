// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda: row gather and scatter by an index map on the device. This is how a plan's token
// indices (a context-parallel partition, a packing, a reshard's receive order) are applied to device
// buffers of tokens or activations: row i of the output is row indices[i] of the input.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "../core/error.hpp"

namespace hetmesh::cuda {

namespace detail {
/// gather: dst row i = src row indices[i]; scatter: dst row indices[i] = src row i.
enum class row_direction { gather, scatter };

// Narrow rows: one thread per element (V: the widest unit that divides a row and the buffers' alignment)
// over the flattened index list. Element k of the indexed side (row k / width) pairs with element
// (k % width) of row indices[row] on the table side; only which side is written differs.
template <class V, row_direction Dir>
__global__ void move_rows_kernel(const V* __restrict__ src, const std::int64_t* __restrict__ indices,
                                 V* __restrict__ dst, std::int64_t rows, std::int64_t width) {
  const std::int64_t total = rows * width;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += stride) {
    const std::int64_t row = k / width;
    const std::int64_t table = indices[row] * width + (k - row * width);
    if constexpr (Dir == row_direction::gather)
      dst[k] = src[table];
    else
      dst[table] = src[k];
  }
}
// One-unit rows (a row is one V: 4-, 8- or 16-byte rows, the narrowest): no division, and four rows in
// flight per thread (their indices and values loaded before any store), so a warp keeps more loads
// outstanding than one element per thread does.
template <class V, row_direction Dir>
__global__ void move_unit_rows_kernel(const V* __restrict__ src, const std::int64_t* __restrict__ indices,
                                      V* __restrict__ dst, std::int64_t rows) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; k + 3 * stride < rows; k += 4 * stride) {
    const std::int64_t i0 = indices[k], i1 = indices[k + stride], i2 = indices[k + 2 * stride],
                       i3 = indices[k + 3 * stride];
    if constexpr (Dir == row_direction::gather) {
      const V v0 = src[i0], v1 = src[i1], v2 = src[i2], v3 = src[i3];
      dst[k] = v0, dst[k + stride] = v1, dst[k + 2 * stride] = v2, dst[k + 3 * stride] = v3;
    } else {
      const V v0 = src[k], v1 = src[k + stride], v2 = src[k + 2 * stride], v3 = src[k + 3 * stride];
      dst[i0] = v0, dst[i1] = v1, dst[i2] = v2, dst[i3] = v3;
    }
  }
  for (; k < rows; k += stride) {
    if constexpr (Dir == row_direction::gather)
      dst[k] = src[indices[k]];
    else
      dst[indices[k]] = src[k];
  }
}
// Wide rows (>= wide_row_bytes): a block per row, its threads over the row's units of V: one index
// load per row, no division, 16-byte accesses where the row allows them.
template <class V, row_direction Dir>
__global__ void move_wide_rows_kernel(const V* __restrict__ src, const std::int64_t* __restrict__ indices,
                                      V* __restrict__ dst, std::int64_t rows, std::int64_t width) {
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t table = indices[row] * width, mine = row * width;
    for (std::int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      if constexpr (Dir == row_direction::gather)
        dst[mine + c] = src[table + c];
      else
        dst[table + c] = src[mine + c];
    }
  }
}
inline constexpr std::size_t wide_row_bytes = 256;
inline unsigned grid_for(std::int64_t total, unsigned block) {
  const std::int64_t blocks = (total + block - 1) / block;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}
// This header is compiled by nvcc, which cannot take fmt: messages are built by hand here.
inline std::string str(std::size_t v) { return std::to_string(v); }
inline void check_launch(const char* op) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw backend_error(std::string("cuda::") + op + ": kernel launch failed: " + cudaGetErrorString(status),
                        static_cast<int>(status));
}
inline void check_rows(std::size_t src_size, std::size_t idx_size, std::size_t dst_size, std::int64_t width,
                       const char* op, row_direction dir) {
  const bool gather = dir == row_direction::gather;
  const std::string where = std::string("cuda::") + op + ": ";
  if (width <= 0) throw invalid_argument(where + "row width is " + std::to_string(width) + ", expected > 0");
  const auto w = static_cast<std::size_t>(width);
  const std::size_t moved = gather ? dst_size : src_size;
  if (moved != idx_size * w)
    throw invalid_argument(where + (gather ? "dst" : "src") + " has " + str(moved) +
                           " elements, expected indices (" + str(idx_size) + ") x width (" + str(w) +
                           ") = " + str(idx_size * w));
  const std::size_t table = gather ? src_size : dst_size;
  if (table % w != 0)
    throw invalid_argument(where + (gather ? "src" : "dst") + " has " + str(table) +
                           " elements, not a multiple of the row width " + str(w));
}
/// Checks the shapes, then launches move_rows_kernel over the rows of the index list on `stream`.
template <row_direction Dir, class T>
void move_rows(std::span<const T> src, std::span<const std::int64_t> indices, std::span<T> dst,
               std::int64_t width, cudaStream_t stream, const char* op) {
  check_rows(src.size(), indices.size(), dst.size(), width, op, Dir);
  const auto total = static_cast<std::int64_t>(Dir == row_direction::gather ? dst.size() : src.size());
  if (total == 0) return;
  const std::size_t row_bytes = static_cast<std::size_t>(width) * sizeof(T);
  const auto aligned = [&](std::size_t unit) {
    return row_bytes % unit == 0 && reinterpret_cast<std::uintptr_t>(src.data()) % unit == 0 &&
           reinterpret_cast<std::uintptr_t>(dst.data()) % unit == 0;
  };
  const auto rows = static_cast<std::int64_t>(indices.size());
  const auto launch = [&]<class V>(V*) {
    const auto units = static_cast<std::int64_t>(row_bytes / sizeof(V));
    const auto* s = reinterpret_cast<const V*>(src.data());
    auto* d = reinterpret_cast<V*>(dst.data());
    if (units == 1) {
      constexpr unsigned block = 256;
      move_unit_rows_kernel<V, Dir>
          <<<grid_for((rows + 3) / 4, block), block, 0, stream>>>(s, indices.data(), d, rows);
    } else if (row_bytes >= wide_row_bytes) {
      const unsigned block = units >= 256 ? 256 : (units >= 128 ? 128 : 64);
      const auto grid = static_cast<unsigned>(rows < 65535 * 16 ? rows : 65535 * 16);
      move_wide_rows_kernel<V, Dir><<<grid, block, 0, stream>>>(s, indices.data(), d, rows, units);
    } else {
      constexpr unsigned block = 256;
      move_rows_kernel<V, Dir>
          <<<grid_for(rows * units, block), block, 0, stream>>>(s, indices.data(), d, rows, units);
    }
  };
  if (sizeof(T) < 16 && aligned(16))
    launch(static_cast<uint4*>(nullptr));
  else if (sizeof(T) < 8 && aligned(8))
    launch(static_cast<uint2*>(nullptr));
  else if (sizeof(T) < 4 && aligned(4))
    launch(static_cast<unsigned*>(nullptr));
  else
    launch(static_cast<T*>(nullptr));
  check_launch(op);
}
}  // namespace detail

/// dst row i = src row indices[i], rows of `width` elements; all three spans hold device memory.
/// Preconditions: dst.size() == indices.size() * width; src.size() a multiple of width; every index in
/// [0, src.size() / width) (not checked on the device: indices come from a verified plan).
/// Postconditions: enqueued on `stream`; nothing synchronises. Not collective. Deterministic.
/// Cost: one read and one write of dst.size() elements, in 16-byte units where rows and buffers allow.
template <class T>
void gather_rows(std::span<const T> src, std::span<const std::int64_t> indices, std::span<T> dst,
                 std::int64_t width, cudaStream_t stream = nullptr) {
  detail::move_rows<detail::row_direction::gather>(src, indices, dst, width, stream, "gather_rows");
}

/// dst row indices[i] = src row i: the inverse of gather_rows for a permutation, and the
/// backward pass of a gather whose indices are distinct. Preconditions as gather_rows, with the roles
/// of src and dst exchanged; indices distinct (otherwise the surviving write is unspecified).
template <class T>
void scatter_rows(std::span<const T> src, std::span<const std::int64_t> indices, std::span<T> dst,
                  std::int64_t width, cudaStream_t stream = nullptr) {
  detail::move_rows<detail::row_direction::scatter>(src, indices, dst, width, stream, "scatter_rows");
}

}  // namespace hetmesh::cuda
