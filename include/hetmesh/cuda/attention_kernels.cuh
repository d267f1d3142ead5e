// SPDX-License-Identifier: Apache-2.0
// hetmesh::cuda: the kernels of cuda::device_reference_attention (attention.hpp) and the definitions of its
// host launchers, cuda::kernels::attention_forward / attention_backward for float and double. Include this
// header in exactly ONE .cu file of a program (nvcc): it defines the launchers, which g++ translation
// units reach through attention.hpp; a second inclusion is a duplicate-symbol link error.
//
// Correctness first: one thread per row, scores recomputed rather than stored, outputs accumulated in
// global memory in model::reference_attention's order, no atomics (so deterministic):
//  - forward: a thread per query row (token i, head h): a pass over the keys for the maximum score, a
//    second for the sum of exp and the weighted values, then out /= sum, lse = max + log(sum);
//  - backward dq: a thread per query row, over the keys in order;
//  - backward dk, dv: a thread per key row (token j, KV head g), over the query tokens in order and, for
//    each, the query heads of group g in order: the reference's (i, h) order for every (j, g).
// The row functions are __host__ __device__, so the arithmetic can be checked on a CPU.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "../core/error.hpp"
#include "attention.hpp"

namespace hetmesh::cuda {

namespace detail {

__host__ __device__ inline float attention_exp(float x) { return expf(x); }
__host__ __device__ inline double attention_exp(double x) { return exp(x); }
__host__ __device__ inline float attention_log(float x) { return logf(x); }
__host__ __device__ inline double attention_log(double x) { return log(x); }

template <class T>
__host__ __device__ inline bool attention_visible(const attention_args<T>& b, std::int64_t i,
                                                  std::int64_t j) {
  return b.q_doc[i] == b.k_doc[j] && (!b.causal || b.k_pos[j] <= b.q_pos[i]);
}

template <class T>
__host__ __device__ inline T attention_dot(const T* x, const T* y, std::int64_t n) {
  T s = 0;
  for (std::int64_t e = 0; e < n; ++e) s += x[e] * y[e];
  return s;
}

// Forward of query row r = i * q_heads + h.
template <class T>
__host__ __device__ inline void attention_forward_row(const attention_forward_args<T>& a, std::int64_t r,
                                                      T neg_inf) {
  const attention_args<T>& b = a.block;
  const std::int64_t dim = b.head_dim, hq = b.q_heads, hk = b.kv_heads;
  const std::int64_t i = r / hq, g = (r % hq) / (hq / hk);
  const T* q = b.q + r * dim;
  T* o = a.out + r * dim;
  for (std::int64_t e = 0; e < dim; ++e) o[e] = 0;
  T m = neg_inf;
  for (std::int64_t j = 0; j < b.nk; ++j) {
    if (!attention_visible(b, i, j)) continue;
    const T s = b.scale * attention_dot(q, b.k + (j * hk + g) * dim, dim);
    if (s > m) m = s;
  }
  if (m == neg_inf) {  // no visible key (or every score -inf): the documented empty row
    a.lse[r] = neg_inf;
    return;
  }
  T z = 0;
  for (std::int64_t j = 0; j < b.nk; ++j) {
    if (!attention_visible(b, i, j)) continue;
    const std::int64_t c = (j * hk + g) * dim;
    const T s = b.scale * attention_dot(q, b.k + c, dim);
    if (s == neg_inf) continue;
    const T p = attention_exp(s - m);
    z += p;
    const T* v = b.v + c;
    for (std::int64_t e = 0; e < dim; ++e) o[e] += p * v[e];
  }
  for (std::int64_t e = 0; e < dim; ++e) o[e] /= z;
  a.lse[r] = m + attention_log(z);
}

// Backward dq of query row r = i * q_heads + h.
template <class T>
__host__ __device__ inline void attention_backward_dq_row(const attention_backward_args<T>& a, std::int64_t r,
                                                          T neg_inf) {
  const attention_args<T>& b = a.block;
  const T l = a.lse[r];
  if (l == neg_inf) return;
  const T dl = a.delta[r];
  const std::int64_t dim = b.head_dim, hq = b.q_heads, hk = b.kv_heads;
  const std::int64_t i = r / hq, g = (r % hq) / (hq / hk);
  const T* q = b.q + r * dim;
  const T* dout = a.dout + r * dim;
  T* dq = a.dq + r * dim;
  for (std::int64_t j = 0; j < b.nk; ++j) {
    if (!attention_visible(b, i, j)) continue;
    const std::int64_t c = (j * hk + g) * dim;
    const T* k = b.k + c;
    const T p = attention_exp(b.scale * attention_dot(q, k, dim) - l);
    const T ds = p * (attention_dot(dout, b.v + c, dim) - dl);
    for (std::int64_t e = 0; e < dim; ++e) dq[e] += b.scale * ds * k[e];
  }
}

// Backward dk, dv of key row c = j * kv_heads + g.
template <class T>
__host__ __device__ inline void attention_backward_dkv_row(const attention_backward_args<T>& a,
                                                           std::int64_t c, T neg_inf) {
  const attention_args<T>& b = a.block;
  const std::int64_t dim = b.head_dim, hq = b.q_heads, hk = b.kv_heads, group = hq / hk;
  const std::int64_t j = c / hk, g = c % hk;
  const T* k = b.k + c * dim;
  const T* v = b.v + c * dim;
  T* dk = a.dk + c * dim;
  T* dv = a.dv + c * dim;
  for (std::int64_t i = 0; i < b.nq; ++i) {
    if (!attention_visible(b, i, j)) continue;
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      const std::int64_t r = i * hq + h;
      const T l = a.lse[r];
      if (l == neg_inf) continue;
      const T* q = b.q + r * dim;
      const T* dout = a.dout + r * dim;
      const T p = attention_exp(b.scale * attention_dot(q, k, dim) - l);
      const T ds = p * (attention_dot(dout, v, dim) - a.delta[r]);
      for (std::int64_t e = 0; e < dim; ++e) {
        dv[e] += p * dout[e];
        dk[e] += b.scale * ds * q[e];
      }
    }
  }
}

inline constexpr unsigned attention_block_threads = 128;

template <class T>
__global__ void attention_forward_kernel(const attention_forward_args<T> a, T neg_inf) {
  const std::int64_t rows = a.block.nq * a.block.q_heads;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += stride)
    attention_forward_row(a, r, neg_inf);
}

template <class T>
__global__ void attention_backward_dq_kernel(const attention_backward_args<T> a, T neg_inf) {
  const std::int64_t rows = a.block.nq * a.block.q_heads;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += stride)
    attention_backward_dq_row(a, r, neg_inf);
}

template <class T>
__global__ void attention_backward_dkv_kernel(const attention_backward_args<T> a, T neg_inf) {
  const std::int64_t rows = a.block.nk * a.block.kv_heads;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < rows;
       c += stride)
    attention_backward_dkv_row(a, c, neg_inf);
}

inline unsigned attention_grid(std::int64_t rows) {
  const std::int64_t blocks = (rows + attention_block_threads - 1) / attention_block_threads;
  constexpr std::int64_t most = std::int64_t{1} << 20;  // then grid-stride
  return static_cast<unsigned>(blocks < most ? blocks : most);
}

template <class T>
void attention_check_args(const attention_args<T>& b, const char* who) {
  if (b.q_heads < 1 || b.kv_heads < 1 || b.head_dim < 1 || b.q_heads % b.kv_heads != 0 || b.nq < 0 ||
      b.nk < 0)
    throw invalid_argument(
        std::string(who) + ": nq=" + std::to_string(b.nq) + ", nk=" + std::to_string(b.nk) +
        ", q_heads=" + std::to_string(b.q_heads) + ", kv_heads=" + std::to_string(b.kv_heads) +
        ", head_dim=" + std::to_string(b.head_dim) +
        "; expected nq, nk >= 0 and positive heads and head size with kv_heads dividing q_heads");
}

inline void attention_check_launch(const char* who) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw backend_error(std::string(who) + ": kernel launch failed: " + cudaGetErrorString(status) + " (" +
                            cudaGetErrorName(status) + ")",
                        static_cast<int>(status));
}

template <class T>
void launch_attention_forward(const attention_forward_args<T>& a, cudaStream_t stream) {
  const char* who = "cuda::kernels::attention_forward";
  attention_check_args(a.block, who);
  const std::int64_t rows = a.block.nq * a.block.q_heads;
  if (rows == 0) return;
  attention_forward_kernel<T>
      <<<attention_grid(rows), attention_block_threads, 0, stream>>>(a, -std::numeric_limits<T>::infinity());
  attention_check_launch(who);
}

template <class T>
void launch_attention_backward(const attention_backward_args<T>& a, cudaStream_t stream) {
  const char* who = "cuda::kernels::attention_backward";
  attention_check_args(a.block, who);
  const std::int64_t q_rows = a.block.nq * a.block.q_heads, k_rows = a.block.nk * a.block.kv_heads;
  if (q_rows == 0 || k_rows == 0) return;  // no (query, key) pair: nothing to add
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  attention_backward_dq_kernel<T><<<attention_grid(q_rows), attention_block_threads, 0, stream>>>(a, neg_inf);
  attention_check_launch(who);
  attention_backward_dkv_kernel<T>
      <<<attention_grid(k_rows), attention_block_threads, 0, stream>>>(a, neg_inf);
  attention_check_launch(who);
}

}  // namespace detail

/// Definitions of the launchers cuda/attention.hpp declares.
namespace kernels {
/// Enqueues the forward kernel of `a` on `stream`.
void attention_forward(const attention_forward_args<float>& a, cudaStream_t stream) {
  detail::launch_attention_forward(a, stream);
}
/// Enqueues the forward kernel of `a` on `stream`.
void attention_forward(const attention_forward_args<double>& a, cudaStream_t stream) {
  detail::launch_attention_forward(a, stream);
}
/// Enqueues the backward kernels of `a` on `stream`.
void attention_backward(const attention_backward_args<float>& a, cudaStream_t stream) {
  detail::launch_attention_backward(a, stream);
}
/// Enqueues the backward kernels of `a` on `stream`.
void attention_backward(const attention_backward_args<double>& a, cudaStream_t stream) {
  detail::launch_attention_backward(a, stream);
}
}  // namespace kernels

}  // namespace hetmesh::cuda
