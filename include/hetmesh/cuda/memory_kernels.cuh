// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda: the kernels of cuda::device_memory (cuda/device_memory.hpp) and their launchers. Include
// this header in exactly one .cu file of a program that uses device_memory's fill, add, merge_attention or
// attention_delta: it defines the launchers cuda/device_memory.hpp declares (hetmesh::cuda::kernels), which
// plain C++ translation units call.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "device_memory.hpp"

namespace hetmesh::cuda {

namespace detail {

template <class T>
__global__ void fill_kernel(T* __restrict__ dst, std::size_t n, T value) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = value;
}

template <class T>
__global__ void add_kernel(T* __restrict__ dst, const T* __restrict__ src, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] += src[i];
}

// One warp per row: lane 0 reads both log-sum-exps, every lane rescales its share of the row, lane 0
// writes the merged lse. Rows whose block saw no key (lse_b = -inf) are left alone.
template <class T>
__global__ void merge_attention_kernel(T* __restrict__ out, T* __restrict__ lse, const T* __restrict__ out_b,
                                       const T* __restrict__ lse_b, std::size_t rows, std::size_t dim,
                                       T neg_inf) {
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t r = static_cast<std::size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    const T a = lse[r], b = lse_b[r];
    if (b == neg_inf) continue;
    T* o = out + r * dim;
    const T* ob = out_b + r * dim;
    if (a == neg_inf) {
      for (std::size_t d = lane; d < dim; d += 32) o[d] = ob[d];
    } else {
      const T m = a > b ? a : b;
      const T merged = m + log(exp(a - m) + exp(b - m));
      const T wa = exp(a - merged), wb = exp(b - merged);
      for (std::size_t d = lane; d < dim; d += 32) o[d] = o[d] * wa + ob[d] * wb;
      __syncwarp();
      if (lane == 0) lse[r] = merged;
      continue;
    }
    __syncwarp();
    if (lane == 0) lse[r] = b;
  }
}

// One warp per row: delta[r] = sum_d dout[r, d] * out[r, d], reduced across the warp by shuffles.
template <class T>
__global__ void attention_delta_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                                       T* __restrict__ delta, std::size_t rows, std::size_t dim) {
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  const unsigned lane = threadIdx.x % 32;
  for (std::size_t r = static_cast<std::size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    T s = 0;
    for (std::size_t d = lane; d < dim; d += 32) s += dout[r * dim + d] * out[r * dim + d];
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) delta[r] = s;
  }
}

inline unsigned blocks_for(std::size_t work, unsigned per_block) {
  const std::size_t b = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

template <class T>
void launch_fill(T* dst, std::size_t n, T value, cudaStream_t s) {
  fill_kernel<<<blocks_for(n, 256), 256, 0, s>>>(dst, n, value);
  check(cudaGetLastError(), "fill_kernel launch", "cuda::device_memory::fill");
}
template <class T>
void launch_add(T* dst, const T* src, std::size_t n, cudaStream_t s) {
  add_kernel<<<blocks_for(n, 256), 256, 0, s>>>(dst, src, n);
  check(cudaGetLastError(), "add_kernel launch", "cuda::device_memory::add");
}
template <class T>
void launch_merge(T* out, T* lse, const T* out_b, const T* lse_b, std::size_t rows, std::size_t dim,
                  cudaStream_t s) {
  merge_attention_kernel<<<blocks_for(rows, 8), 256, 0, s>>>(out, lse, out_b, lse_b, rows, dim,
                                                             -std::numeric_limits<T>::infinity());
  check(cudaGetLastError(), "merge_attention_kernel launch", "cuda::device_memory::merge_attention");
}
template <class T>
void launch_delta(const T* out, const T* dout, T* delta, std::size_t rows, std::size_t dim, cudaStream_t s) {
  attention_delta_kernel<<<blocks_for(rows, 8), 256, 0, s>>>(out, dout, delta, rows, dim);
  check(cudaGetLastError(), "attention_delta_kernel launch", "cuda::device_memory::attention_delta");
}

}  // namespace detail

/// Definitions of the launchers cuda/device_memory.hpp declares.
namespace kernels {
/// Enqueues the fill kernel on `s`.
void fill(float* dst, std::size_t n, float value, cudaStream_t s) { detail::launch_fill(dst, n, value, s); }
/// Enqueues the fill kernel on `s`.
void fill(double* dst, std::size_t n, double value, cudaStream_t s) { detail::launch_fill(dst, n, value, s); }
/// Enqueues the add kernel on `s`.
void add(float* dst, const float* src, std::size_t n, cudaStream_t s) { detail::launch_add(dst, src, n, s); }
/// Enqueues the add kernel on `s`.
void add(double* dst, const double* src, std::size_t n, cudaStream_t s) {
  detail::launch_add(dst, src, n, s);
}
/// Enqueues the add kernel on `s`.
void add(std::int64_t* dst, const std::int64_t* src, std::size_t n, cudaStream_t s) {
  detail::launch_add(dst, src, n, s);
}
/// Enqueues the merge kernel on `s`.
void merge_attention(float* out, float* lse, const float* out_b, const float* lse_b, std::size_t rows,
                     std::size_t dim, cudaStream_t s) {
  detail::launch_merge(out, lse, out_b, lse_b, rows, dim, s);
}
/// Enqueues the merge kernel on `s`.
void merge_attention(double* out, double* lse, const double* out_b, const double* lse_b, std::size_t rows,
                     std::size_t dim, cudaStream_t s) {
  detail::launch_merge(out, lse, out_b, lse_b, rows, dim, s);
}
/// Enqueues the delta kernel on `s`.
void attention_delta(const float* out, const float* dout, float* delta, std::size_t rows, std::size_t dim,
                     cudaStream_t s) {
  detail::launch_delta(out, dout, delta, rows, dim, s);
}
/// Enqueues the delta kernel on `s`.
void attention_delta(const double* out, const double* dout, double* delta, std::size_t rows, std::size_t dim,
                     cudaStream_t s) {
  detail::launch_delta(out, dout, delta, rows, dim, s);
}
}  // namespace kernels

}  // namespace hetmesh::cuda
